"""What the methods that weigh by statistics share: the seeded batches the statistics come
from, their parameters, and the linear layers of a module.

Statistics are never taken on the test split: by default they come from the train split of
the evaluation data (`--stats-split`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from rotviz.errors import RotvizError
from rotviz.limits import BATCH_SIZE, BATCHES, SEED
from rotviz.params import Param

if TYPE_CHECKING:
    import torch
    from torch import nn

    from rotviz.data.split import Split

    Tensor = torch.Tensor
SPLITS = ("train", "val", "test")  # rotviz.data.splits.SPLITS, without importing the data layer

# The parameters every statistics-based method declares.
STATS_PARAMS = (
    Param("stats_split", "train", "split the statistics come from (default train)",
          choices=SPLITS, label="Statistics split"),
    Param("batches", 8, f"statistics batches (default 8, {BATCHES.text})", BATCHES,
          label="Statistics: batches of training examples", widget=(1, 32, 1)),
    Param("batch_size", 32, "statistics batch size (default 32)", BATCH_SIZE,
          label="Statistics batch size"),
    Param("seed", 0, "seed of the statistics batches (default 0)", SEED, label="Seed"),
)


def stats_batches(split: Split, batches: int, batch_size: int, seed: int = 0):
    """`batches` seeded batches of `batch_size` samples (fewer if the split is small)."""
    if split.n == 0:
        raise RotvizError(f"the {split.split} split of '{split.data}' is empty; use another split")
    if batches < 1 or batch_size < 1:
        raise RotvizError(
            f"--batches and --batch-size must be >= 1, got {batches} and {batch_size}"
        )
    import numpy as np
    import torch

    order = np.random.default_rng(seed).permutation(split.n)[: batches * batch_size]
    order = torch.as_tensor(order)
    for i in range(0, len(order), batch_size):
        ix = order[i : i + batch_size]
        yield split.inputs_at(ix), split.labels[ix]


def unpadded(x: dict[str, Tensor], y: Tensor):
    """Each example of a padded text batch, cut to its real tokens (labels too, when they
    are per token)."""
    import torch

    lengths = x["attention_mask"].sum(1).tolist() if "attention_mask" in x else None
    for i in range(len(y)):
        n = int(lengths[i]) if lengths is not None else None
        xi = {k: v[i, :n] for k, v in x.items()}
        yi = y[i, :n] if y.dim() == 2 and y.dtype == torch.long else y[i]
        yield xi, yi


def linear_layers(module: nn.Module) -> dict[str, tuple[nn.Module, bool]]:
    """Linear layers whose weight RegMean may solve for: name -> (module, weight is (in, out)).

    A weight shared with another parameter (tied embeddings) is left to the simple average.
    """
    from torch import nn

    owners: dict[int, int] = {}
    for _, p in module.named_parameters(remove_duplicate=False):
        owners[id(p)] = owners.get(id(p), 0) + 1
    out = {}
    for name, mod in module.named_modules():
        conv1d = type(mod).__name__ == "Conv1D" and hasattr(mod, "nf")  # GPT-2: y = x W + b
        if (isinstance(mod, nn.Linear) or conv1d) and owners.get(id(mod.weight), 0) == 1:
            out[name] = (mod, conv1d)
    return out


