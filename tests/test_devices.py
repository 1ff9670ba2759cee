"""Devices: MPS has no float64, so the float64 work (solvers, learned maps, float64 sums) runs
on the CPU when MPS is asked for, with the same results as a CPU run; a device that is not
there is a one-line error. (No test here needs an accelerator: CI has none.)"""

from __future__ import annotations

import os
import sys

import pytest
import torch

from rotviz.analysis.planes import flat_inner
from rotviz.cli import main
from rotviz.devices import device_note, mps_available, pick_device, wide_device
from rotviz.errors import RotvizError
from rotviz.match.options import LearnOptions, MatchOptions
from rotviz.match.pipeline import match_models
from rotviz.sources.loading import load_model, to_wide

HAS_MPS = mps_available()


def test_float64_work_stays_on_cpu_and_cuda_and_leaves_mps():
    assert wide_device("cpu") == torch.device("cpu")
    assert wide_device(torch.device("cuda", 1)) == torch.device("cuda", 1)
    assert wide_device("mps") == torch.device("cpu")
    assert wide_device(torch.device("mps")) == torch.device("cpu")


def test_to_wide_is_a_float64_copy_that_leaves_its_input_alone():
    t = torch.arange(6, dtype=torch.float32).reshape(2, 3) / 3
    before = t.clone()
    w = to_wide(t)
    assert w.dtype == torch.float64 and w.device == t.device
    assert torch.equal(w, t.double())
    w += 1.0
    assert torch.equal(t, before)


def test_float64_sums_are_exact_on_float32_inputs():
    gen = torch.Generator().manual_seed(0)
    a = {"x": torch.randn(50, 40, generator=gen), "y": torch.randn(7, generator=gen)}
    b = {"x": torch.randn(50, 40, generator=gen), "y": torch.randn(7, generator=gen)}
    exact = sum(float((a[k].double() * b[k].double()).sum()) for k in a)
    assert abs(flat_inner(a, b) - exact) <= 1e-12 * abs(exact)


@pytest.mark.skipif(HAS_MPS, reason="checks the message shown without an Apple GPU")
def test_missing_mps_is_a_one_line_error(tmp_path, capsys):
    with pytest.raises(RotvizError) as e:
        pick_device("mps")
    assert "\n" not in str(e.value) and "--device auto or cpu" in str(e.value)
    out = tmp_path / "matched"
    rc = main(["match", "zoo:vit-digits-s3", "zoo:vit-digits-s6", "--out", str(out),
               "--device", "mps"])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and "MPS" in err and len(err.splitlines()) == 1
    assert not out.exists()


@pytest.mark.parametrize("options", [
    MatchOptions(heads=True, residual=True, rounds=3),
    MatchOptions(residual=True, learned=True, rounds=3,
                 learn=LearnOptions(steps=4, eval_every=2, batch_size=16, val_points=3)),
], ids=["weight", "learned"])
def test_matching_asked_for_mps_runs_in_float64_on_the_cpu(options):
    """On a machine without MPS this also shows the request never reaches MPS (moving a
    model there would fail); on a Mac the results equal the CPU's all the same. A small pair
    matches on one CPU thread whatever the caller's count (rotviz.devices.SMALL_PAIR), and
    the caller's count comes back: the second call is made with two threads, and its answer
    is the first's, bit for bit."""
    a, b = load_model("zoo:vit-digits-s3"), load_model("zoo:vit-digits-s6")
    on_cpu = match_models(a, b, options, "cpu", data="digits")
    seen: list[int] = []
    torch.set_num_threads(2)
    try:
        asked_mps = match_models(a, b, options, "mps",
                                 lambda *_: seen.append(torch.get_num_threads()), "digits")
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(1)  # the suite's count (tests/conftest.py)
    assert seen and set(seen) == {1}
    assert set(on_cpu.state) == set(asked_mps.state)
    assert all(torch.equal(on_cpu.state[k], asked_mps.state[k]) for k in on_cpu.state)
    assert asked_mps.report.max_output_diff <= 1e-4
    assert asked_mps.report.after.total < asked_mps.report.before.total


def test_the_app_says_where_matching_runs_on_mps():
    assert device_note(torch.device("cpu")) is None
    assert device_note("cuda") is None
    note = device_note(torch.device("mps"))
    assert note is not None and "CPU" in note and "float64" in note


def test_a_machine_without_gpu_nodes_is_known_without_torch(monkeypatch):
    """surely_cpu_only (no GPU device node, not macOS) gives the device picker's choices
    without importing torch (tests/test_app_compute.py checks that it imports none), and they
    are torch's own; with a GPU node present, torch is asked."""
    import glob

    from rotviz import devices

    asked = devices.device_choices(), devices.device_kind("auto"), devices.device_kind("cpu")
    if devices.surely_cpu_only():
        assert not torch.cuda.is_available() and not devices.mps_available()
        assert asked == (["auto", "cpu"], "cpu", "cpu")
    monkeypatch.setattr(glob, "glob", lambda p: ["/dev/nvidia0"] if "nvidia" in p else [])
    assert not devices.surely_cpu_only()
    assert (devices.device_choices(), devices.device_kind("auto"),
            devices.device_kind("cpu")) == asked  # torch's answer
    monkeypatch.undo()
    for device in ("cuda", "mps", "tpu"):  # the same one-line refusals either way
        if device not in asked[0]:
            with pytest.raises(RotvizError) as e:
                devices.device_kind(device)
            with pytest.raises(RotvizError) as f:
                devices.pick_device(device)
            assert str(e.value) == str(f.value)


@pytest.mark.parametrize("torch_loaded, given, want", [
    (False, None, "PASSIVE"),  # a fresh command: OpenMP's threads will sleep while they wait
    (False, "ACTIVE", "ACTIVE"),  # the user's own setting wins
    (True, None, None),  # torch already loaded (a library caller): too late, left alone
])
def test_the_command_line_sets_openmps_wait_before_torch_loads(monkeypatch, capsys,
                                                               torch_loaded, given, want):
    """rotviz.devices.CALM goes into the environment when torch has not loaded yet (OpenMP
    reads it once, then): a refused argument is enough, nothing else is imported."""
    if given is None:
        monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    else:
        monkeypatch.setenv("OMP_WAIT_POLICY", given)
    if not torch_loaded:
        monkeypatch.delitem(sys.modules, "torch")
    assert main(["--no-such-option"]) == 2
    assert ("torch" in sys.modules) == torch_loaded  # nothing loaded it again
    assert os.environ.get("OMP_WAIT_POLICY") == want
    capsys.readouterr()
