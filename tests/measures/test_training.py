"""Barriers over training (rotviz.measures.training) and, measured the same way, spawn
instability (Frankle et al., 2020): the series layouts (Trainer checkpoints, the local
Hugging Face cache, spawn folders), each step's barrier equal to `rotviz barrier`'s on that
pair, both charts on the zoo's series (children spawned at the last step: barrier 0), the
records' CLI, plots and exports. The zoo's spawn series itself: tests/measures/test_spawn.py."""

from __future__ import annotations

import json
import shutil

import pytest

from rotviz import measure
from rotviz.errors import RotvizError
from rotviz.plots.figure_style import Style
from rotviz.random_models import save_random
from tests.conftest import refused

VIT = dict(layers=2, d=32, heads=4, ffn=64, image=8, patch=2, channels=1, labels=10)
RUNS = ("zoo:vit-digits-run-a", "zoo:vit-digits-run-b")
SPAWN = "zoo:vit-digits-spawn"


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """Four tiny random ViTs (seeds 0..3) saved once."""
    root = tmp_path_factory.mktemp("tiny")
    return [save_random("vit", root / f"s{i}", seed=i, **VIT) for i in range(4)]


@pytest.fixture(scope="module")
def small():
    from rotviz.data.split import load_split

    return load_split("digits", "test", 0).subset(120)


def _copy(src, dst):
    shutil.copytree(src, dst)
    return dst


def _barrier(a, b, spec, split, points):
    """The independent computation: `rotviz barrier`'s record on the pair."""
    from rotviz.match.endpoints import match_endpoints
    from rotviz.sources.loading import load_model

    return measure("barrier", match_endpoints(load_model(a), load_model(b), spec), split,
                   points=points).barrier


def test_trainer_series_paired_by_step_with_steps_in_one_only_reported(tiny, small, tmp_path,
                                                                       capsys):
    """checkpoint-<step>/ folders paired by step (1 and 2 are common), the steps in one series
    only listed; each step's barrier equals `rotviz barrier` on that pair to 1e-9."""
    from rotviz.cli import main
    from rotviz.measures import measurement

    a, b = tmp_path / "a", tmp_path / "b"
    for s, m in ((1, 0), (2, 1), (5, 2)):
        _copy(tiny[m], a / f"checkpoint-{s}")
    for s, m in ((1, 1), (2, 3), (7, 0)):
        _copy(tiny[m], b / f"checkpoint-{s}")
    (a / "runs").mkdir()  # Trainer's other folders are not checkpoints
    r = measure("training", [str(a), str(b)], small, points=3, match=["none", "seed"])
    assert r.x == [1, 2] and r.matches == ["none", "seed"]
    assert r.extra["only_a"] == [5] and r.extra["only_b"] == [7]
    for i, (ma, mb) in enumerate(((0, 1), (1, 3))):
        for spec in ("none", "seed"):
            want = _barrier(tiny[ma], tiny[mb], spec, small, 3)
            assert abs(r.barrier[spec][i] - want) <= 1e-9, (spec, i)
    d = r.to_dict()
    rows = measurement("training").rows(d)
    assert len(rows) == 4 and rows[0]["step"] == 1 and rows[1]["match"] == "seed"
    assert rows[3]["barrier"] == r.barrier["seed"][1]

    js = tmp_path / "t.json"
    rc = main(["training", str(a), str(b), "--data", "digits", "--match", "none",
               "--points", "3", "--device", "cpu", "--json", str(js)])
    out = capsys.readouterr().out
    assert rc == 0 and "barriers over training on cpu: 2 common steps 1..2" in out
    assert f"1 step(s) only in {a} (5)" in out and f"1 step(s) only in {b} (7)" in out
    got = json.loads(js.read_text())
    assert got["matches"] == ["none"] and got["x"] == [1, 2]
    assert abs(got["barrier"]["none"][1] - _barrier(tiny[1], tiny[3], "none", _full(), 3)) \
        <= 1e-9


def _full():
    from rotviz.data.split import load_split

    return load_split("digits", "test", 0)


def test_series_refusals_are_one_line(tiny, tmp_path, capfd, ws):
    from rotviz.measures.spawn import read_spawn
    from rotviz.measures.training import read_series

    a, b = tmp_path / "a", tmp_path / "b"
    _copy(tiny[0], a / "checkpoint-1")
    _copy(tiny[1], b / "checkpoint-2")
    with pytest.raises(RotvizError, match="have no step in common"):
        measure("training", [str(a), str(b)], _full())
    with pytest.raises(RotvizError, match="holds no checkpoints"):
        read_series(str(tmp_path))
    _copy(tiny[2], a / "checkpoint-01")
    with pytest.raises(RotvizError, match="holds step 1 twice"):
        read_series(str(a))
    sp = tmp_path / "sp"
    _copy(tiny[0], sp / "spawn-3" / "a")
    with pytest.raises(RotvizError, match="has no b/ child"):
        read_spawn(str(sp))
    with pytest.raises(RotvizError, match="is no series of the zoo"):
        read_series("zoo:vit-digits-s3")
    # at size: the record's refusal, from the CLI, before anything is measured
    shutil.rmtree(a / "checkpoint-01")
    _copy(tiny[1], b / "checkpoint-1")
    refused(["training", str(a), str(b), "--data", "digits", "--max-memory", "1"], capfd, ws,
            "training is refused at size", "raise --max-memory")
    refused(["spawn", str(sp), "--data", "digits"], capfd, ws, "has no b/ child")
    refused(["training", str(a), str(b), "--data", "digits", "--match", "bogus"], capfd, ws)


def test_hf_cache_revisions_read_offline(tiny, small, tmp_path, monkeypatch):
    """ORG/NAME (or hf-cache:ORG/NAME): refs/step<N> name commits whose snapshots are model
    folders (the local cache as huggingface_hub lays it out); other refs are not steps.
    ORG/NAME@step10,step0 takes those revisions only, each the snapshot the model reference
    ORG/NAME@step<N> resolves to."""
    from rotviz.measures.training import read_series
    from rotviz.sources.loading import resolve_ref

    cache = tmp_path / "hub"
    repo = cache / "models--org--run"
    for step, m in ((0, 0), (10, 1)):
        commit = f"{step:040x}"
        (repo / "refs").mkdir(parents=True, exist_ok=True)
        (repo / "refs" / f"step{step}").write_text(commit)
        _copy(tiny[m], repo / "snapshots" / commit)
    (repo / "refs" / "main").write_text("f" * 40)
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    s = read_series("hf-cache:org/run")
    assert sorted(s.steps) == [0, 10]
    assert s.steps[10] == repo / "snapshots" / f"{10:040x}" == resolve_ref("org/run@step10")
    assert read_series("org/run").steps == read_series("org/run@step10,step0").steps == s.steps
    assert list(read_series("org/run@step10").steps) == [10]
    r = measure("training", ["org/run", "hf-cache:org/run"], small, points=3, match=["none"])
    assert r.x == [0, 10] and r.barrier["none"] == [0.0, 0.0]  # a run against itself
    with pytest.raises(RotvizError, match="never downloads"):
        read_series("hf-cache:org/absent")
    with pytest.raises(RotvizError, match="is not hf-cache:ORG/NAME"):
        read_series("hf-cache:../x")
    with pytest.raises(RotvizError, match="revision 'main', which is no step"):
        read_series("org/run@step0,main")
    with pytest.raises(RotvizError, match=r"holds the revisions main, step0, step10 but not "
                                          "step5"):
        read_series("org/run@step5")
    (repo / "refs" / "step20").write_text("e" * 40)
    with pytest.raises(RotvizError, match="names snapshot eeeeeeeeeeee, which it does not "
                                          "hold"):
        read_series("org/run")





def test_both_charts_run_on_the_zoo_series(small):
    """Spawn instability: children spawned at the last step have barrier exactly 0 without
    matching (the same weights) and 0 to float rounding with it; a spawn step's value is
    `rotviz barrier`'s on that pair to 1e-9. Over training: step 0 is the shared start
    (barrier exactly 0), and the last step is spawn-0's pair."""
    from rotviz import zoo_registry as zoo
    from rotviz.measures import measurement
    from rotviz.plots import style

    sp = measure("spawn", [SPAWN], small, points=3, match=["none", "seed"])
    assert sp.x == [0, 16, 64, 304]
    assert sp.barrier["none"][-1] == 0.0
    # matching identical models rotates them by float32 rounding (distance ~1e-6)
    assert 0.0 <= sp.barrier["seed"][-1] <= 1e-7
    assert sp.barrier["none"][0] > 0.05  # children spawned at 0 land apart
    root = zoo.collection_path("vit-digits-spawn")
    want = _barrier(root / "spawn-16/a", root / "spawn-16/b", "seed", small, 3)
    assert abs(sp.barrier["seed"][1] - want) <= 1e-9

    tr = measure("training", list(RUNS), small, points=3, match=["none"])
    assert tr.x == [0, 16, 64, 160, 304] and tr.extra["only_a"] == tr.extra["only_b"] == []
    assert tr.barrier["none"][0] == 0.0
    assert tr.barrier["none"][-1] == sp.barrier["none"][0]  # the same pair, measured alike

    for name, r, x in (("training", tr, "training step"), ("spawn", sp, "spawn step k")):
        fig = measurement(name).plot(r.to_dict(), Style())
        assert fig.layout.title.text and fig.layout.xaxis.title.text.startswith(x)
        assert "nats" in fig.layout.yaxis.title.text
        assert [t.name for t in fig.data] == [style.nice_label(m) for m in r.matches]
        assert fig.data[0].line.color in style.OKABE_ITO
        assert list(fig.data[0].y) == r.barrier[r.matches[0]]




def test_two_points_are_refused_before_any_folder_is_read(capfd, ws):
    """A barrier from the endpoints alone is 0: training and spawn take at least 3 points,
    refused by the path's one bound
    (models that do not exist: a refusal after loading would name them instead)."""
    for argv in (["training", "nosuch-a", "nosuch-b"], ["spawn", "nosuch"]):
        refused([*argv, "--data", "digits", "--points", "2"], capfd, ws,
                "--points must be an integer from 3 to 1001, got 2")
