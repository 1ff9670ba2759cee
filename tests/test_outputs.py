"""rotviz never loses a user's files. Each numbered case (the reports that led to these
tests) runs its exact command and asserts exit code 2, exactly one stderr line with no
traceback, and a workspace unchanged byte for byte (nothing created, nothing removed). Then
outputs as transactions: --overwrite only on rotviz's own output, interrupts leave nothing
behind, the umask is followed.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import stat
import subprocess
import time
from pathlib import Path

import forkserver
import pytest
from conftest import ZOO, refused, snapshot

from rotviz import outputs
from rotviz.app import roots as app_roots
from rotviz.cli import main
from rotviz.errors import RotvizError

ROOT = Path(__file__).resolve().parents[1]
A, B = "zoo:vit-digits-s3", "zoo:vit-digits-s6"


# ---- 1. --out onto an existing folder ---------------------------------------------------------


@pytest.mark.parametrize("cmd", ["match", "merge"])
@pytest.mark.parametrize("out", [".", "{ws}", "..", "/", "full", "sub/.."])
def test_item1_out_onto_an_existing_folder_is_refused(ws, capfd, cmd, out):
    argv = [cmd, A, B, "--out", out.format(ws=ws)]
    argv += ["--data", "digits"] if cmd == "merge" else []
    refused(argv, capfd, ws, "--out")


@pytest.mark.parametrize("out", [".", "{ws}", "/"])
def test_item1_overwrite_never_takes_the_current_folder(ws, capfd, out):
    refused(["match", A, B, "--out", out.format(ws=ws), "--overwrite"], capfd, ws,
            "current folder")


# ---- 2. side outputs checked with the model ---------------------------------------------------


def test_item2_bad_report_leaves_no_model_folder(ws, capfd):
    refused(["match", A, B, "--out", str(ws.parent / "o"), "--report", "/proc/x/r.json"], capfd,
            ws, "--report")


def test_item2_merge_json_onto_a_folder(ws, capfd):
    refused(["merge", A, B, "--data", "digits", "--out", str(ws.parent / "o"), "--json", "/tmp"],
            capfd, ws, "--json", "is a folder")


def test_item2_eval_json_checked_before_it_prints(ws, capfd):
    refused(["eval", A, "--data", "digits", "--json", "/proc/x/e.json"], capfd, ws, "--json")


# ---- 3. bad output paths, before any computation ----------------------------------------------


@pytest.fixture
def no_work(monkeypatch):
    """Make any model loading or training fail loudly: a refusal must come before them."""
    import rotviz.sources.loading
    import rotviz.zoo.train

    def boom(*a, **k):
        raise AssertionError("work started before the output paths were checked")

    monkeypatch.setattr(rotviz.sources.loading, "load_model", boom)
    monkeypatch.setattr(rotviz.zoo.train, "train", boom)


@pytest.mark.parametrize(("out", "fragment"), [
    ("/proc/x", "cannot be written"), ("f.txt", "is a file"),
    ("f.txt/sub", "which is a file"), ("link", "symbolic link")])
def test_item3_bad_out_paths_are_caught_before_any_work(ws, capfd, no_work, out, fragment):
    refused(["match", A, B, "--out", out], capfd, ws, fragment)
    refused(["merge", A, B, "--data", "digits", "--out", out], capfd, ws, fragment)


def test_item3_zoo_build_out_file_fails_before_training(ws, capfd, no_work):
    refused(["zoo", "build", "vit-digits-ft-b", "--out", "f.txt"], capfd, ws, "which is a file")
    (ws / "full" / "vit-digits-ft-b").mkdir()  # a NAME folder holding a user's file
    (ws / "full" / "vit-digits-ft-b" / "x").write_text("x")
    refused(["zoo", "build", "vit-digits-ft-b", "--out", "full", "--overwrite"], capfd, ws,
            "was not written by rotviz")


# ---- 4. --layers bounded without expanding ----------------------------------------------------


@pytest.mark.parametrize("layers", ["0-99999999999", "0-5000000", "9" * 150, "0-" + "9" * 190])
def test_item4_huge_layer_ranges_are_one_short_line(ws, capfd, layers):
    line = refused(["match", A, B, "--out", "o", "--layers", layers], capfd, ws, "--layers")
    assert "out of range: the model has 4 layers (0-3)" in line and layers[:30] in line
    assert len(line) < 400


def test_item4_layers_longer_than_the_bound(ws, capfd):
    line = refused(["match", A, B, "--out", "o", "--layers", "0," * 150], capfd, ws)
    assert "longer than 200 characters" in line and len(line) < 300


def test_item4_app_url_with_a_huge_layer_range_answers_at_once():
    from test_app import app, figures, texts

    at = app("barrier", b_layers="0-200000")  # froze the tab for > 200 s
    shown = texts(at)
    assert "'0-200000' is out of range: the model has 4 layers" in shown and not figures(at)
    assert len(shown) < 20_000  # the message quotes the input, not a list of 200001 indices


# ---- 5. --margin nan, --points huge -----------------------------------------------------------


@pytest.mark.parametrize(("cmd", "flag", "value"), [
    ("plane", "--margin", "nan"), ("plane", "--margin", "inf"), ("plane", "--margin", "-0.1"),
    ("barrier", "--points", "100000000"), ("plane", "--grid", "100000")])
def test_item5_non_finite_and_huge_numbers(ws, capfd, no_work, cmd, flag, value):
    refused([cmd, A, B, "--data", "digits", flag, value], capfd, ws, flag, value)


# ---- 7. smaller leaks of the one-line rule ----------------------------------------------------


def test_item7_legacy_pickle_adds_no_warning_line(ws, capfd):
    import torch
    from safetensors.torch import load_file

    bad = ws.parent / "legacy"
    bad.mkdir()
    (bad / "config.json").write_text((ZOO / "vit-digits-s6" / "config.json").read_text())
    state = load_file(str(ZOO / "vit-digits-s6" / "model.safetensors"))
    key = next(iter(state))
    state[key] = state[key][:1]  # a legacy pickle whose shapes do not fit: refused
    torch.save(state, bad / "pytorch_model.bin", _use_new_zipfile_serialization=False)
    refused(["match", A, str(bad), "--out", "o"], capfd, ws, "cannot read the weights")
    refused(["eval", str(bad), "--data", "digits"], capfd, ws)


def test_item7_huge_images_are_refused_from_their_header(ws, capfd, monkeypatch):
    from PIL import Image

    folder = ws.parent / "imgs"
    for c in ("a", "b"):
        (folder / c).mkdir(parents=True)
        # one column of pixels above the bound (4096 x 4096): a 12000 x 12000 image took 2 s to
        # write, and the refusal, from the header before any decoding, is the same
        Image.new("L", (4097, 4096)).save(folder / c / "x.png")

    def no_decode(self, *a, **k):
        raise AssertionError("a huge image was decoded")

    monkeypatch.setattr(Image.Image, "load", no_decode)
    monkeypatch.setattr("PIL.ImageFile.ImageFile.load", no_decode)
    line = refused(["eval", A, "--data", f"imagefolder:{folder}"], capfd, ws, "4097x4096")
    assert "16,777,216 pixels per image" in line


def test_item7_options_that_need_another(ws, capfd, no_work):
    refused(["match", A, B, "--out", "o", "--residual-group", "banana"], capfd, ws,
            "--residual-group needs --residual")
    refused(["match", A, B, "--out", "o", "--residual", "--residual-group", "banana"], capfd, ws,
            "unknown --residual-group 'banana'")
    for extra in (["--rounds", "3"], ["--tol", "0"], ["--ffn-backoff"]):
        refused(["match", A, B, "--out", "o", *extra], capfd, ws, "needs --residual")
    refused(["match", A, B, "--out", "o", "--steps", "5"], capfd, ws, "--steps needs --learned")
    refused(["match", A, B, "--out", "o", "--data", "digits"], capfd, ws, "--data needs --act")
    refused(["match", A, B, "--out", "o", "--heads", "--no-attn"], capfd, ws,
            "--heads needs --attn")
    refused(["barrier", A, B, "--data", "digits", "--seed", "3"], capfd, ws,
            "--seed needs --repeats")
    for extra in (["--alpha", "0.5"], ["--batches", "2"], ["--stats-split", "val"],
                  ["--seed", "1"], ["--batch-size", "8"]):
        refused(["merge", A, B, "--data", "digits", *extra], capfd, ws, extra[0], "needs --method")
    refused(["merge", A, B, "--data", "digits", "--method", "fisher", "--alpha", "0.5"], capfd, ws,
            "--alpha needs --method regmean")


@pytest.mark.parametrize("mask", [0o022, 0o027])
def test_item7_outputs_follow_the_umask(ws, capfd, mask):
    old = os.umask(mask)
    try:
        assert main(["match", A, B, "--out", "o", "--report", "r.json", "--no-attn"]) == 0
        assert main(["eval", A, "--data", "digits", "--json", "e.json"]) == 0
    finally:
        os.umask(old)
    capfd.readouterr()
    assert stat.S_IMODE((ws / "o").stat().st_mode) == 0o777 & ~mask
    files = [*(ws / "o").iterdir(), ws / "r.json", ws / "e.json"]
    assert {stat.S_IMODE(f.stat().st_mode) for f in files} == {0o666 & ~mask}


def test_item7_app_refuses_a_file_that_links_out_of_the_roots(tmp_path):
    root, outside = tmp_path / "root", tmp_path / "outside"
    (root / "m").mkdir(parents=True)
    outside.mkdir()
    for f in ("config.json", "model.safetensors"):
        (outside / f).write_bytes((ZOO / "vit-digits-s3" / f).read_bytes())
    (root / "m" / "config.json").write_bytes((outside / "config.json").read_bytes())
    (root / "m" / "model.safetensors").symlink_to(outside / "model.safetensors")
    roots = [root.resolve()]
    assert app_roots.discover(roots) == []  # not offered either
    with pytest.raises(RotvizError, match="model.safetensors' leads to .*outside the model roots"):
        app_roots.resolve_choice(str(root / "m"), roots)
    (root / "m" / "model.safetensors").unlink()  # a real file: fine
    (root / "m" / "model.safetensors").write_bytes((outside / "model.safetensors").read_bytes())
    assert app_roots.resolve_choice(str(root / "m"), roots) == str((root / "m").resolve())
    assert app_roots.discover(roots) == [str(root / "m")]


# ---- outputs as transactions ------------------------------------------------------------------


def test_overwrite_replaces_a_previous_rotviz_output_only(ws, capfd):
    assert main(["match", A, B, "--out", "o", "--report", "r.json", "--no-attn"]) == 0
    first = snapshot(ws / "o")
    marker = json.loads((ws / "o" / outputs.MARKER).read_text())
    assert marker["command"] == "match"
    assert set(marker["files"]) == {p.name for p in (ws / "o").iterdir()} - {outputs.MARKER}
    assert json.loads((ws / "r.json").read_text())["rotviz"]["command"] == "match"
    refused(["match", A, B, "--out", "o"], capfd, ws, "add --overwrite")
    refused(["match", A, B, "--out", "o2", "--report", "r.json"], capfd, ws, "already exists")
    assert main(["match", A, B, "--out", "o", "--report", "r.json", "--overwrite"]) == 0
    assert snapshot(ws / "o").keys() == first.keys()  # all attention maps on now: new weights
    assert snapshot(ws / "o") != first
    assert sorted(p.name for p in ws.parent.iterdir()) == ["in"]  # no temporary left
    # a user's file inside a rotviz output: --overwrite refuses, the file survives
    (ws / "o" / "notes.txt").write_text("mine")
    refused(["match", A, B, "--out", "o", "--overwrite"], capfd, ws, "notes.txt")
    # folders and files rotviz did not write
    refused(["match", A, B, "--out", "full", "--overwrite"], capfd, ws, "not written by rotviz")
    refused(["match", A, B, "--out", "o3", "--report", "a.txt", "--overwrite"], capfd, ws,
            "--report 'a.txt' was not written by rotviz")
    (ws / "x.json").write_text('{"loss": 1}')  # JSON, but not rotviz's
    refused(["eval", A, "--data", "digits", "--json", "x.json", "--overwrite"], capfd, ws,
            "not written by rotviz")
    capfd.readouterr()


def test_an_empty_out_folder_and_new_parents_are_fine(ws, capfd):
    """A folder output's missing parents are made; a file output's folder must exist (issue
    43: a typo in --json's folder is refused, not made into a new tree)."""
    (ws / "empty").mkdir()
    assert main(["match", A, B, "--out", "empty", "--no-attn"]) == 0
    refused(["match", A, B, "--out", "new/deep/o", "--report", "new/r.json", "--no-attn"],
            capfd, ws, "--report 'new/r.json' lies in '")
    assert not (ws / "new").exists()
    assert main(["match", A, B, "--out", "new/deep/o", "--report", "r.json",
                 "--no-attn"]) == 0
    assert (ws / "empty" / "config.json").is_file() and (ws / "new" / "deep" / "o").is_dir()
    assert (ws / "r.json").is_file()
    refused(["match", A, B, "--out", "p", "--report", "p/r.json"], capfd, ws, "lies inside")
    capfd.readouterr()


def test_a_failure_while_writing_leaves_nothing(ws, capfd, monkeypatch):
    """An error or Ctrl-C half-way through writing: no output, no temporary, no new parents,
    and an earlier output that --overwrite was replacing stays whole."""
    import rotviz.sources.writing

    assert main(["match", A, B, "--out", "o", "--no-attn"]) == 0
    before = snapshot(ws.parent)
    real = rotviz.sources.writing.write_model

    for exc in (KeyboardInterrupt, OSError):
        def half(template, state, folder, extra_files=None, exc=exc):
            real(template, state, folder, extra_files)
            raise exc("stopped half-way")

        monkeypatch.setattr(rotviz.sources.writing, "write_model", half)
        capfd.readouterr()
        rc = main(["match", A, B, "--out", "o", "--overwrite"])
        assert rc == (130 if exc is KeyboardInterrupt else 2)
        rc = main(["match", A, B, "--out", "deep/new/o", "--report", "r.json"])
        assert rc == (130 if exc is KeyboardInterrupt else 2)
        err = capfd.readouterr().err
        assert "Traceback" not in err
        assert snapshot(ws.parent) == before


# ---- Ctrl-C in a real process -----------------------------------------------------------------


# What the commands use, imported once by the fork server (tests/forkserver.py): torch,
# transformers, timm, scipy, about 10 s of CPU in each fresh interpreter.
IMPORTS = """
import torch, transformers, timm, scipy.optimize  # noqa: F401
import rotviz.cli, rotviz.match.pipeline, rotviz.analysis.paths, rotviz.analysis.fusion
import rotviz.zoo.train, rotviz.match.datamatch  # noqa: F401
"""


def _interrupt(server: subprocess.Popen, argv: list[str], cwd: Path, logs: Path,
               delays: tuple[float, ...]) -> None:
    """Run the command in a process of its own and send it SIGINT `delay` seconds into it;
    the shortest delay that still finds it working is used."""
    for k, delay in enumerate(delays):
        out, err = logs / f"{k}.out", logs / f"{k}.err"
        pid = forkserver.send(server, {"argv": argv, "cwd": str(cwd), "out": str(out),
                                       "err": str(err)})
        time.sleep(delay)
        with contextlib.suppress(ProcessLookupError):  # it may have ended and been waited for
            os.kill(pid, signal.SIGINT)
        rc = forkserver.exit_code(server)
        text = err.read_text()
        if rc == 130:
            assert "rotviz: interrupted; nothing was written" in text and "Traceback" not in text
            return
        # finished before the signal: try an earlier one. -SIGINT: the command had returned
        # (it catches the interrupt while it runs, exit 130) and the signal met the
        # interpreter on its way out, with the outputs in place
        assert rc in (0, -signal.SIGINT), text
        for p in cwd.iterdir():
            if p.name not in ("a.txt", "sub", "f.txt", "full", "link"):
                subprocess.run(["rm", "-rf", str(p)], check=True)
    raise AssertionError("the command always finished before the interrupt")


# The two writers a command can use: rotviz.outputs (match, merge and every measurement write a
# folder and files through it; match's learned training is long enough to interrupt) and the
# zoo's builder; merge, the same writer as match, was dropped to keep the suite within its
# time. Both commands in one test, served by one interpreter (two tests would each start one),
# each followed by a full rerun in this process.
def test_sigint_leaves_no_output_and_a_rerun_succeeds(ws, capfd, tmp_path_factory):
    commands = {
        "match": ["match", A, B, "--out", "o", "--report", "r.json", "--learned", "--data",
                  "digits", "--steps", "30"],
        "zoo-build": ["zoo", "build", "vit-digits-s6-ft", "--out", "o"],
    }
    logs = tmp_path_factory.mktemp("sigint-logs")  # outside the workspace snapshot below
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    with forkserver.serving(IMPORTS, env, ws) as server:
        for name, argv in commands.items():
            before = snapshot(ws.parent, ZOO)
            (logs / name).mkdir()
            _interrupt(server, argv, ws, logs / name, (2.0, 0.8, 0.3, 0.05))
            assert snapshot(ws.parent, ZOO) == before, name  # no output, no temporary folder
            capfd.readouterr()
            assert main(argv) == 0, (name, capfd.readouterr().err)
            assert (ws / "o" / outputs.MARKER).is_file() or (ws / "o" / "vit-digits-s6-ft").is_dir()
            assert not [p for p in ws.rglob("*") if p.name.startswith(".rotviz-")], name
            for p in ("o", "r.json"):  # the next command starts from the same workspace
                subprocess.run(["rm", "-rf", str(ws / p)], check=True)


def test_an_interrupt_while_the_commands_load_is_one_line(monkeypatch, capsys):
    """An interrupt that comes before the command runs (while its modules load, as on a busy
    machine right after the interpreter starts) is the same one line and exit 130, not a
    traceback."""
    import rotviz.cli as cli

    def loading(*_):
        raise KeyboardInterrupt

    monkeypatch.setattr(cli, "build_parser", loading)
    assert cli.main(["match", "a", "b", "--out", "o"]) == 130
    assert capsys.readouterr().err == "rotviz: interrupted; nothing was written\n"


# ---- outputs never touch inputs ---------------------------------------------------------------


def test_out_onto_its_own_source_is_refused_even_with_overwrite(ws, capfd, no_work):
    """`match A B --out B --overwrite` would replace the source (a zoo model lost its card)."""
    line = refused(["match", A, B, "--out", str(ZOO / B[4:]), "--overwrite"], capfd, ws,
                   "--out", "is the input model", "even with --overwrite")
    assert str((ZOO / B[4:]).resolve()) in line


@pytest.mark.parametrize(("argv", "fragments"), [
    (["match", A, B, "--out", "o", "--report", str(ZOO / B[4:] / "r.json")],
     ("--report", "r.json' lies inside the input model '{zoo}'")),
    (["match", A, B, "--out", str(ZOO.parent)], ("--out '{assets}' holds the input model",)),
    (["barrier", A, B, "--data", "imagefolder:sub", "--json", "sub/x.json"],
     ("--json", "x.json' lies inside the input data '{ws}/sub'")),
    (["eval", A, "--data", "text:a.txt", "--json", "a.txt", "--overwrite"],
     ("--json", "a.txt' is the input data '{ws}/a.txt'")),
    (["merge", A, B, "--data", "digits", "--out", str(ZOO / A[4:] / "m")],
     ("--out '{zoo_a}/m' lies inside the input model",)),
], ids=["report-in-source", "out-holds-models", "json-in-data", "json-is-data",
        "merge-in-anchor"])
def test_outputs_apart_from_inputs(ws, capfd, no_work, argv, fragments):
    where = dict(zoo=(ZOO / B[4:]).resolve(), zoo_a=ZOO / A[4:], assets=ZOO.parent,
                 ws=ws.resolve())
    refused(argv, capfd, ws, *(f.format(**where) for f in fragments))


def test_an_earlier_output_given_as_input_is_not_overwritten(ws, capfd):
    """An earlier rotviz output may be replaced with --overwrite, but not while it is an input
    of the command: `match A o --out o --overwrite` is refused, o unchanged."""
    assert main(["match", A, B, "--out", "o"]) == 0
    refused(["match", A, "o", "--out", "o", "--overwrite"], capfd, ws, "o' is the input model")
    refused(["match", A, "o", "--out", str(ws / "o"), "--report", "o/r.json"], capfd, ws,
            "is the input model")
    assert main(["match", A, "o", "--out", "o2"]) == 0  # apart, it still works


def test_a_full_disk_while_safetensors_writes_is_one_line(ws, capfd, monkeypatch):
    """safetensors reports a full disk as its own error type with a Rust debug string (20
    lines of traceback before): one line with the OS's words, nothing left behind. The disk
    is made full where transformers calls safetensors' writer and where rotviz's own writer
    of the folders transformers would write (rotviz.sources.plain) calls it."""
    import safetensors.torch
    import transformers.modeling_utils as mu
    from safetensors import SafetensorError

    def full(*a, **k):
        raise SafetensorError('Error while serializing: IoError(Os { code: 28, kind: '
                              'StorageFull, message: "No space left on device" })')

    monkeypatch.setattr(mu, "safe_save_file", full)
    monkeypatch.setattr(safetensors.torch, "save_file", full)
    line = refused(["match", A, B, "--out", "o"], capfd, ws, "writing the outputs failed")
    assert line == ("rotviz: error: writing the outputs failed: No space left on device; "
                    "nothing was written")
    refused(["merge", A, B, "--data", "digits", "--out", "m", "--json", "m.json"], capfd, ws,
            "No space left on device")
