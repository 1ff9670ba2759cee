"""Points of parameter space evaluated at size: models held in their stored dtype, and each
point built one block at a time while the anchor's module (on meta) runs.

Every block's weights (a weighted sum of the models', (1 - alpha) anchor + alpha source for
a path, in float32) are built just before the block runs and dropped after it
(rotviz.atsize.runtime); embeddings and output heads likewise, the small tensors outside the
blocks when the point starts. Logits are bounded per batch as everywhere
(rotviz.evaluation.fit_batch). What is built from these points: rotviz.atsize.landscape
(curves and planes), rotviz.atsize.merge (merges), rotviz.atsize.slice (slices), and the
layer-wise barriers at size of their record.
"""


from __future__ import annotations

import os

import torch

from rotviz.atsize.blocks import Streamed, open_streamed
from rotviz.atsize.runtime import build_meta
from rotviz.data.split import Split
from rotviz.devices import wide_device
from rotviz.evaluation import Evaluator, check_split
from rotviz.memory import release
from rotviz.sources.loading import Loaded, read_config
from rotviz.sources.pairs import check_compatible

Tensor = torch.Tensor


def sized_loaded(model: Streamed) -> Loaded:
    """A `Loaded` of `model` whose module has no weights (meta parameters): what data
    reading and evaluation ask of a model (its config, tokenizer, image shape) without the
    model in memory."""
    module, _ = build_meta(model.spec, read_config(model.path), model.stored_dtype)
    return Loaded(model.ref, model.path, model.config, model.spec, module,
                  dict(module.state_dict()), {})


class Opened:
    """Checkpoints of one architecture opened at size (headers only), and the anchor's
    module (on meta) with its evaluator on a split: a point runs block by block, its tensors
    given as each block needs them, and nothing is held between points."""

    def __init__(self, refs: list[str | os.PathLike | Streamed], split: Split,
                 device: str | torch.device = "cpu", batch_size: int = 512):
        check_split(split)
        # a model the caller has opened already (the runner's anchor) is not opened again
        self.models = [r if isinstance(r, Streamed) else open_streamed(r) for r in refs]
        for m in self.models[1:]:
            check_compatible(self.models[0], m)  # type: ignore[arg-type]  # duck-typed
        self.device = torch.device(wide_device(device))
        self.keys = self.models[0].keys  # old-format buffers left out (rotviz.sources.legacy)
        loaded = sized_loaded(self.models[0])
        self.ev = Evaluator(loaded, split, self.device, batch_size)
        self.module = self.ev.module  # the module evaluations run (rotviz.evaluation)

    def read(self, k: int, names) -> dict[str, Tensor]:
        """Model k's named tensors, floating ones in float32 (cast as they are read, so a
        tensor is never whole in two dtypes), on the device."""
        return float32(self.models[k].checkpoint.read(names, torch.float32), self.device)

    def run(self, rest, provider) -> tuple:
        """`Evaluator.per_sample`'s arrays and scores of the point whose tensors outside the
        blocks `rest(names)` gives and whose block k's tensors `provider(k)` gives, built as
        each is needed (checkpoint names, float32)."""
        runner = self.models[0].runner(self.module, rest, provider)
        try:
            scored: list[dict[str, float]] = []
            return self.ev.per_sample({}, scored), scored[0]
        finally:
            runner.close()
            release()

    def scores(self, tensors) -> tuple[float, float, dict[str, float]]:
        """Loss, accuracy and the task's scores of the point whose named tensors
        `tensors(names)` gives."""
        per, scores = self.run(tensors, lambda k: tensors(self.models[0].block_keys[k]))
        return float(per[0].sum() / per[2].sum()), float(per[1].sum() / per[2].sum()), scores


class Held(Opened):
    """Checkpoints of one architecture held as stored on the device, each point a weighted
    sum of them built block by block while the anchor's module (on meta) runs on a split."""

    def __init__(self, refs: list[str | os.PathLike], split: Split,
                 device: str | torch.device = "cpu", batch_size: int = 512):
        super().__init__(refs, split, device, batch_size)
        self.tensors = [{k: v.to(self.device) for k, v in m.checkpoint.read(self.keys).items()}
                        for m in self.models]
        self.held_bytes = sum(t.numel() * t.element_size()
                              for ts in self.tensors for t in ts.values())

    def mix(self, coeffs: tuple[float, ...], names) -> dict[str, Tensor]:
        """The named tensors of sum_k coeffs[k] model_k, in float32. Two models at
        (1 - alpha, alpha) are lerped, as the in-memory path does."""
        out = {}
        for n in names:
            ts = [t[n] for t in self.tensors]
            if not ts[0].is_floating_point():
                out[n] = ts[0]
            elif len(ts) == 2 and abs(coeffs[0] + coeffs[1] - 1.0) < 1e-15:
                out[n] = torch.lerp(ts[0].float(), ts[1].float(), coeffs[1])
            else:
                acc = coeffs[0] * ts[0].float()
                for c, t in zip(coeffs[1:], ts[1:], strict=True):
                    acc.add_(t.float(), alpha=c)
                out[n] = acc
        return out

    def evaluate(self, coeffs: tuple[float, ...]) -> tuple:
        """`Evaluator.per_sample`'s arrays and scores at that point."""
        return self.run(lambda ns: self.mix(coeffs, ns),
                        lambda k: self.mix(coeffs, self.models[0].block_keys[k]))

    def loss_acc(self, coeffs: tuple[float, ...]) -> tuple[float, float, dict[str, float]]:
        """Loss, accuracy and the task's scores at that point."""
        per, scores = self.evaluate(coeffs)
        return float(per[0].sum() / per[2].sum()), float(per[1].sum() / per[2].sum()), scores


def float32(tensors: dict[str, Tensor], device: torch.device) -> dict[str, Tensor]:
    """Floating tensors in float32, all on `device`."""
    return {n: (t.float() if t.is_floating_point() else t).to(device)
            for n, t in tensors.items()}
