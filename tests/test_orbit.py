"""rotviz.analysis.orbit: a random coordinate keeps the function, and the derivative of the
action at the identity is tangents.py's tangent, on tiny random models of every kind of
attention (plain, RoPE, partial RoPE, grouped-query, q/k norms) and FFN (gated, ReLU)."""

from __future__ import annotations

import json
from collections.abc import Callable

import pytest
import torch

from rotviz.analysis.orbit import Orbit, compose, conditions, parse_groups
from rotviz.analysis.tangents import ffn_has_scales, generators, tangents
from rotviz.errors import RotvizError
from rotviz.sources.loading import Loaded, load_model
from rotviz.sources.running import forward, probe_inputs
from rotviz.symmetry.view import read_view

# plain (gpt2, vit), RoPE + grouped-query + gated FFN (llama), partial RoPE (gpt-neox),
# per-head q/k norms (qwen3)
FAMILIES = ("gpt2", "vit", "llama", "gpt-neox", "qwen3")


@pytest.fixture(scope="module")
def relu(saved, tmp_path_factory) -> Callable:
    """A tiny gpt2 whose FFN is ReLU (its config edited), in float32 or float64."""
    import shutil

    folder = tmp_path_factory.mktemp("relu") / "gpt2-relu"
    shutil.copytree(saved("gpt2"), folder)
    cfg = json.loads((folder / "config.json").read_text())
    cfg["activation_function"] = "relu"
    (folder / "config.json").write_text(json.dumps(cfg))
    return lambda dtype=None: load_model(folder, dtype=dtype)


def _model(name: str, loaded, relu, dtype=None) -> Loaded:
    return relu(dtype) if name == "relu" else loaded(name, dtype=dtype)


def _groups(model: Loaded) -> tuple[str, ...]:
    view = read_view(model.spec, model.config, model.state)
    return ("qk", "vo", "ffn-scale") if ffn_has_scales(view.blocks[0].ffn) else ("qk", "vo")


def _random(orbit: Orbit, norm: float, seed: int = 0) -> dict:
    z = orbit.flat(orbit.zeros())
    v = torch.randn(z.numel(), generator=torch.Generator().manual_seed(seed), dtype=z.dtype)
    return orbit.unflat(v * norm / v.norm())


@pytest.mark.parametrize("name", [*FAMILIES, "relu"])
@pytest.mark.parametrize("dtype,tol", [(None, 1e-4), (torch.float64, 1e-10)])
def test_a_random_coordinate_keeps_the_logits(name, dtype, tol, loaded, relu):
    model = _model(name, loaded, relu, dtype)
    orbit = Orbit.of(model, _groups(model))
    moved = orbit.act(_random(orbit, 0.3), model.state)
    assert any(not torch.equal(moved[k], model.state[k]) for k in moved)
    x = probe_inputs(model, 4, 0)
    a, b = (forward(model, x, s, every=True).double() for s in (model.state, moved))
    assert float((a - b).abs().max() / a.abs().max()) < tol
    assert all(moved[k].dtype == model.state[k].dtype for k in moved)


@pytest.mark.parametrize("name", [*FAMILIES, "relu"])
def test_the_derivative_at_zero_is_the_tangent(name, loaded, relu):
    model = _model(name, loaded, relu, torch.float64)
    orbit = Orbit.of(model, _groups(model))
    names, t, gens = tangents(model, None, generators(
        read_view(model.spec, model.config, model.state), residual=False))
    assert orbit.dimension() == len(gens) == t.shape[0]
    u = orbit.flat(_random(orbit, 1.0, seed=1))

    def moved(v):
        st = orbit.act(orbit.unflat(v), model.state)
        return torch.cat([st[n].reshape(-1) for n in names])

    _, jvp = torch.autograd.functional.jvp(moved, torch.zeros_like(u), u)
    want = u @ t
    assert float((jvp - want).abs().max()) < 1e-6 * float(want.abs().max())
    # the pullback is its transpose: <pullback(w), u> = <w, T^T u> for a cotangent w
    w = torch.randn(t.shape[1], generator=torch.Generator().manual_seed(2), dtype=t.dtype)
    sizes = [model.state[n].numel() for n in names]
    cot = {n: p.reshape(model.state[n].shape)
           for n, p in zip(names, torch.split(w, sizes), strict=True)}
    back = orbit.flat(orbit.pullback(model.state, cot))
    assert float(back @ u) == pytest.approx(float(w @ want), rel=1e-8)


def test_state_is_never_mutated_and_elements_compose(loaded):
    model = loaded("llama", dtype=torch.float64)
    before = {k: v.clone() for k, v in model.state.items()}
    orbit = Orbit.of(model)
    c1, c2 = _random(orbit, 0.2, 1), _random(orbit, 0.2, 2)
    once = orbit.act(c2, orbit.act(c1, model.state))
    from rotviz.analysis.orbit import act_element

    both = act_element(model, compose(orbit.transforms(c1), orbit.transforms(c2)))
    assert all(torch.equal(before[k], model.state[k]) for k in before)
    assert max(float((once[k] - both[k]).abs().max()) for k in once) < 1e-10
    rows = conditions(orbit.transforms(c1))
    assert len(rows) == 2 and len(rows[0]["qk"]) == model.config["num_key_value_heads"]
    assert all(x >= 1.0 for r in rows for v in r.values() for x in v)


def test_refusals_are_one_line(loaded):
    with pytest.raises(RotvizError, match="gelu.*--group qk,vo") as e:
        Orbit.of(loaded("vit"), ("qk", "vo", "ffn-scale"))
    assert "\n" not in str(e.value)
    with pytest.raises(RotvizError, match="unknown symmetry group rot"):
        parse_groups("qk,rot")
    assert parse_groups("vo, qk") == ("qk", "vo")



