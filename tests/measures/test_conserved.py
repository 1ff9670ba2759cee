"""`rotviz conserved`: tiny models trained here by plain full-batch gradient descent keep every
symmetry's conserved quantity (drift under 1% of its scale); with weight decay lambda each
shrinks as exp(-2 lambda t), t = step * lr (within 5%); a short series and mixed
architectures are refused in one line, exit 2; the zoo's SGD series keeps its quantities where
its AdamW run does not."""

from __future__ import annotations

import json
import math

import pytest
import torch
import torch.nn.functional as F

from rotviz import measure
from rotviz.arch import spec_named
from rotviz.cli import main
from rotviz.errors import RotvizError
from rotviz.random_models import random_model
from rotviz.sources.adapters import source_of

TINY = dict(layers=2, d=32, heads=4, ffn=64)
LR = 0.01


def _model(family: str):
    """A tiny random model: a ViT whose FFN is ReLU (Q-K, V-O and unit scales), or a llama
    with grouped-query attention, rotary embeddings and a gated FFN."""
    if family == "vit-relu":
        gelu, config = random_model("vit", 0, **TINY)
        config["hidden_act"] = "relu"
        model, _ = source_of(spec_named("vit")).build(config, spec_named("vit"))
        model.load_state_dict(gelu.state_dict())
        return "vit", model, config
    model, config = random_model("llama", 0, **TINY, kv_heads=2)
    return "llama", model, config


def _loss(family: str, model, gen: torch.Generator) -> torch.Tensor:
    """A fixed full batch: random images and labels, or random tokens (next-token loss)."""
    if family == "vit":
        x = torch.randn(16, 1, 8, 8, generator=gen)
        y = torch.randint(0, 5, (16,), generator=gen)
        return F.cross_entropy(model(pixel_values=x).logits, y)
    ids = torch.randint(0, 61, (8, 12), generator=gen)
    logits = model(input_ids=ids).logits[:, :-1]
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1))


def train_series(root, kind: str, steps: list[int], weight_decay: float = 0.0):
    """Full-batch gradient descent (torch SGD, no momentum; weight decay as L2, so the flow
    is d theta/dt = -grad L - lambda theta), a checkpoint-<step>/ at each of `steps`."""
    family, model, config = _model(kind)
    model.train()
    model.requires_grad_(True)
    opt = torch.optim.SGD(model.parameters(), lr=LR, weight_decay=weight_decay)
    source = source_of(spec_named(family))
    losses = []
    for step in range(steps[-1] + 1):
        if step in steps:
            source.save_module(model.eval(), config, root / f"checkpoint-{step}")
            model.train()
        if step == steps[-1]:
            break
        opt.zero_grad()
        loss = _loss(family, model, torch.Generator().manual_seed(0))
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return root, losses


@pytest.mark.parametrize("kind", ["vit-relu", "llama"])
def test_gradient_descent_keeps_every_quantity(kind, tmp_path):
    root, losses = train_series(tmp_path / kind, kind, [0, 20, 40, 60])
    assert losses[-1] < losses[0] - 0.05  # it trains
    r = measure("conserved", [str(root)], None).to_dict()
    assert r["conserved"] == {"qk": True, "vo": True, "ffn": True}
    assert r["steps"] == r["values_steps"] == [0, 20, 40, 60]
    drifts = [x for k in ("qk", "vo") for b in r["drift"][k] for g in b for x in g]
    drifts += [x for b in r["drift_max"]["ffn"] for x in b]
    assert len(drifts) == 4 * (2 * 2 * (4 if kind == "vit-relu" else 2) + 2)
    assert max(drifts) < 0.01, max(drifts)
    for k in ("qk", "vo", "ffn"):
        assert r["summary"][k]["max"][-1] < 0.01
        assert r["summary"][k]["median"][0] == 0.0
    if kind == "llama":  # rotary: the 4 pairs' traces of a head of 8 (no free dims)
        assert len(r["values"]["qk"][0][0][0]) == 4
        assert len(r["values"]["vo"][0][0][0]) == 64


@pytest.mark.parametrize("kind", ["vit-relu", "llama"])
def test_weight_decay_shrinks_each_quantity_as_exp_minus_2_lambda_t(kind, tmp_path):
    lam = 1.0
    root, _ = train_series(tmp_path / kind, kind, [0, 25, 50, 100], weight_decay=lam)
    r = measure("conserved", [str(root)], None).to_dict()
    for i, step in enumerate(r["steps"]):
        want = math.exp(-2 * lam * step * LR)
        for k in ("qk", "vo"):
            for b, groups in enumerate(r["values"][k]):
                for g, vals in enumerate(groups):
                    v0, v = torch.tensor(vals[0]), torch.tensor(vals[i])
                    err = torch.linalg.norm(v - v0 * want) / (torch.linalg.norm(v0) * want)
                    assert err < 0.05, (k, b, g, step, float(err))
        for b, norms in enumerate(r["norm"]["ffn"]):
            assert norms[i] / norms[0] == pytest.approx(want, rel=0.05), (b, step)
    assert r["summary"]["qk"]["median"][-1] > 0.05  # moved: 1 - exp(-2) of Q, not of scale


def _refused(argv, capsys, *fragments) -> str:
    rc = main(argv)
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1, err
    for f in fragments:
        assert f in err, err
    return err


def test_a_short_series_and_mixed_architectures_are_refused(tmp_path, saved, capsys):
    import shutil

    few = tmp_path / "few"
    for step in (0, 5):
        shutil.copytree(saved("vit"), few / f"checkpoint-{step}")
    _refused(["conserved", str(few)], capsys, "2 checkpoint(s)", "at least three")
    mixed = tmp_path / "mixed"
    for step, ffn in ((0, 64), (5, 64), (9, 48)):
        shutil.copytree(saved("vit", ffn=ffn), mixed / f"checkpoint-{step}")
    _refused(["conserved", str(mixed)], capsys, "step 9", "another architecture",
             "intermediate_size")
    _refused(["conserved", str(mixed), "--every", "2"], capsys, "intermediate_size")
    three = tmp_path / "three"
    for step in (0, 5, 9):
        shutil.copytree(saved("vit"), three / f"checkpoint-{step}")
    _refused(["conserved", str(three), "--every", "5"], capsys, "--every")
    # it aligns nothing: no --match in the CLI, and the library refuses one
    _refused(["conserved", str(three), "--match", "seed"], capsys, "--match")
    with pytest.raises(RotvizError, match="aligns nothing"):
        measure("conserved", [str(three)], None, match=["seed"])


def test_the_zoo_sgd_series_keeps_what_adamw_moves(tmp_path, capsys):
    js = tmp_path / "sgd.json"
    png = tmp_path / "sgd.png"
    assert main(["conserved", "zoo:vit-digits-sgd", "--json", str(js), "--figure",
                 str(png)]) == 0
    assert "conserved quantities of zoo:vit-digits-sgd" in capsys.readouterr().out
    sgd = json.loads(js.read_text())
    assert sgd["steps"] == [0, 25, 50, 100, 200] and png.stat().st_size > 10_000
    assert sgd["conserved"]["ffn"] is False and "gelu" in sgd["what"]["ffn"]
    adam = measure("conserved", ["zoo:vit-digits-run-a"], None, every=2).to_dict()
    assert adam["steps"] == [0, 64, 304]
    # the SGD series learns (test loss 1.08 -> 0.49), its quantities stay within a few % of
    # their scale (the finite step's eta^2 term); AdamW with weight decay moves them by 25-110%
    for kind in ("qk", "vo"):
        assert sgd["summary"][kind]["median"][-1] < 0.01 < 0.1 < adam["summary"][kind]["median"][-1]
        assert sgd["summary"][kind]["max"][-1] < 0.1


def test_every_family_reads_its_quantities(family, saved, tmp_path):
    """Three copies of one random model of each family: every kind the family's symmetry has
    is measured (fused QKV, position projections, rotary, q/k norms, gated FFNs), and its
    drift is exactly 0; a kind it lacks says why."""
    import shutil

    for step in (0, 1, 2):
        shutil.copytree(saved(family), tmp_path / f"checkpoint-{step}")
    r = measure("conserved", [str(tmp_path)], None).to_dict()
    assert r["family"] == family and r["steps"] == [0, 1, 2]
    for kind, s in r["summary"].items():
        assert r["conserved"][kind] and s["max"] == [0.0, 0.0, 0.0], kind
    for kind, on in r["conserved"].items():
        assert on == (kind in r["summary"]) and (on or r["what"][kind].startswith("none"))
    assert r["conserved"]["qk"] == (family not in ("qwen3", "olmo2"))  # q/k norms: rotations
    assert r["conserved"]["vo"]
