"""The Streamlit app, headless (streamlit.testing.v1.AppTest), and its library-side helpers.

The pages run on the default pair (the zoo's, or two tiny random ViTs when the zoo is not
installed) on the CPU, on a 100-example subset of the test split to stay fast. The tests
read numbers out of the charts and compare them with the library's own results.
"""

from __future__ import annotations

import base64
import io
import json
import os
import subprocess
import sys
import threading
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import app_roots_with

from rotviz.app import cache as app_cache
from rotviz.app import demos, summaries
from rotviz.app import export as app_export
from rotviz.app import roots as app_roots
from rotviz.app import specs as app_specs
from rotviz.devices import device_badge, device_summary
from rotviz.errors import RotvizError
from rotviz.random_models import save_random

REPO = Path(__file__).resolve().parent.parent
APP = str(REPO / "rotviz/ui/main.py")  # rotviz/ui/app.py (and the checkout's app.py) serve it
# the Barrier page's charts on its default options (no matching among them)
LOSS_TITLE = "Loss along the straight path from anchor to source, with and without matching"
ACC_TITLE = "Accuracy along the straight path from anchor to source, with and without matching"
N_EVAL = 100
VIT = dict(layers=2, d=32, heads=4, ffn=64, image=8, patch=2, channels=1, labels=10)


# ---- fixtures ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def roots(tmp_path_factory):
    """Model roots for the app: the zoo when it has a default pair, plus a folder holding a
    pair of tiny random ViTs and a model of another shape (for the mismatch test)."""
    root = tmp_path_factory.mktemp("roots")
    for seed in (0, 1):
        save_random("vit", root / f"vit-s{seed}", seed=seed, **VIT)
    save_random("vit", root / "vit-wide", seed=2, **{**VIT, "d": 48})
    with app_roots_with(root):
        yield root


@pytest.fixture(scope="module")
def pair(roots) -> tuple[str, str]:
    """The pair the app opens on."""
    try:
        return app_roots.default_pair([roots])
    except RotvizError:
        pytest.skip("no model pair")


def app(page: str | None = None, **params):
    from streamlit.testing.v1 import AppTest

    at = AppTest.from_file(APP, default_timeout=120)
    at.query_params["n"] = str(N_EVAL)
    for k, v in params.items():
        at.query_params[k] = v
    if page:
        at.switch_page(f"views/{page}.py")
    at.run()
    assert not at.exception, [e.message for e in at.exception]
    return at


def figures(at) -> dict[str, dict]:
    """Every plotly chart on the page as its figure JSON, by title."""
    out = {}
    for el in at.get("plotly_chart"):
        fig = json.loads(el.proto.spec)
        out[fig["layout"]["title"]["text"]] = fig
    return out


def numbers(values) -> list[float]:
    """Plotly arrays arrive as lists or as base64 typed arrays ({'dtype', 'bdata'})."""
    if isinstance(values, dict) and "bdata" in values:
        return np.frombuffer(base64.b64decode(values["bdata"]), dtype=values["dtype"]).tolist()
    return [float(v) for v in values]


def texts(at) -> str:
    parts = [m.value for m in at.markdown] + [e.value for e in at.error]
    for kind in (at.info, at.warning, at.success):
        parts += [x.value for x in kind]
    return "\n".join(str(p) for p in parts)


# ---- library-side helpers -------------------------------------------------------------------


def test_model_roots_and_path_checks(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    b.mkdir()
    roots = app_roots.model_roots({app_roots.ENV_ROOTS: f"{a}{os.pathsep}{b}"})
    assert roots == [a.resolve(), b.resolve()]
    assert app_roots.model_roots({}) == [d.resolve() for d in app_roots.default_roots()]
    inside = a / "m"
    inside.mkdir()
    assert app_roots.check_under_roots(inside, roots) == inside.resolve()
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    for bad in (outside, a / ".." / "elsewhere", "/etc"):
        with pytest.raises(RotvizError, match="outside the model roots"):
            app_roots.check_under_roots(bad, roots)
    (a / "link").symlink_to(outside)  # a link inside a root that leads out of it
    with pytest.raises(RotvizError, match="outside the model roots"):
        app_roots.check_under_roots(a / "link", roots)
    with pytest.raises(RotvizError, match="no model folder"):
        app_roots.check_under_roots(a / "missing", roots)
    with pytest.raises(RotvizError, match="not in the zoo"):
        app_roots.resolve_choice("zoo:no-such-model", roots)


def test_discover_finds_model_folders(roots):
    found = app_roots.discover([roots])
    assert [Path(f).name for f in found] == ["vit-s0", "vit-s1", "vit-wide"]
    labels = [app_roots.model_label(f) for f in found]
    assert labels == found  # outside the checkout: full paths, unique
    assert app_roots.model_label("zoo:x") == "zoo:x"
    assert app_roots.model_label(str(Path.cwd() / "assets" / "m")) == "assets/m"


def test_default_pair_from_whatever_the_zoo_returns(monkeypatch, tmp_path):
    import sys
    import types

    import rotviz

    fake = types.ModuleType("rotviz.zoo_registry")
    loaded = types.SimpleNamespace(ref="zoo:b", state={})
    (tmp_path / "x").mkdir()
    for returned, want in (
        (("a", "b"), ("zoo:a", "zoo:b")),
        (("zoo:a", loaded), ("zoo:a", "zoo:b")),
        ((tmp_path / "x", {"name": "b"}), (str(tmp_path / "x"), "zoo:b")),
        ((types.SimpleNamespace(name="a"), "b"), ("zoo:a", "zoo:b")),
    ):
        fake.default_pair = lambda returned=returned: returned
        monkeypatch.setitem(sys.modules, "rotviz.zoo_registry", fake)
        monkeypatch.setattr(rotviz, "zoo_registry", fake, raising=False)
        assert app_roots.default_pair([tmp_path]) == want

    def broken():
        raise RotvizError("zoo files missing")

    fake.default_pair = broken
    fake.entries = lambda: []
    with pytest.raises(RotvizError, match="no model pair"):
        app_roots.default_pair([tmp_path / "x"])
    # a default pair that is not built yet: another built pair of the zoo, else the roots
    fake.default_pair = lambda: ("a", "b")
    fake.is_built = lambda name: name in ("c", "d")
    fake.entries = lambda: ["c", "d"]
    fake.path_of = lambda name: tmp_path
    fake.PAIRS = {"other": ("c", "d")}
    assert app_roots.default_pair([tmp_path]) == ("zoo:c", "zoo:d")
    fake.PAIRS = {}
    assert app_roots.default_pair([tmp_path]) == ("zoo:c", "zoo:d")  # first two found


def test_config_hash_is_stable_and_sensitive():
    a = {"anchor": "zoo:x", "points": 21, "specs": ["none", "seed"], "alpha": 0.1}
    b = {"alpha": 0.1, "specs": ("none", "seed"), "points": 21, "anchor": "zoo:x"}
    assert app_cache.config_hash(a) == app_cache.config_hash(b)
    assert app_cache.config_hash(a) != app_cache.config_hash({**a, "points": 11})
    assert len(app_cache.config_hash(a)) == 16


def test_exports_csv_json_zip():
    import plotly.graph_objects as go

    rows = [{"spec": "none", "barrier": 2.0}, {"spec": "seed", "barrier": 1.5, "extra": True}]
    assert app_export.rows_to_csv(rows).splitlines() == [
        "spec,barrier,extra", "none,2.0,", "seed,1.5,True"]
    data = {"x": np.array([1.0, float("nan")]), "t": torch.tensor([2]), "p": Path("/a")}
    assert json.loads(app_export.to_json(data)) == {"x": [1.0, None], "t": [2], "p": "/a"}
    fig = go.Figure(go.Scatter(x=[0, 1], y=[2, 3], name="curve"))
    blob = app_export.run_zip({"points": 3}, {"barrier": 1.5}, {"rows": rows}, {"fig": fig})
    z = zipfile.ZipFile(io.BytesIO(blob))
    names = set(z.namelist())
    assert {"config.json", "versions.json", "results.json", "tables/rows.csv",
            "figures/fig.html"} <= names
    cfg = json.loads(z.read("config.json"))
    assert cfg["config"] == {"points": 3} and cfg["hash"] == app_cache.config_hash({"points": 3})
    assert json.loads(z.read("versions.json"))["torch"].split("+")[0] == \
        torch.__version__.split("+")[0]
    assert json.loads(z.read("results.json")) == {"barrier": 1.5}
    assert "plotly" in z.read("figures/fig.html").decode()[:2000].lower()
    if app_export.static_formats():  # the set-up's Chromium: the figure drawn as PNG too
        assert z.read("figures/fig.png")[:8] == b"\x89PNG\r\n\x1a\n"


def test_barrier_verdict_says_what_each_matching_did():
    """The new user's pair: the seed paper's matching raised the barrier (0.514 -> 0.575)
    while weight matching lowered it; the banner says both, and never that matching lowers
    it when one raised it. The page's own text: "done in", computed or from the cache."""
    from rotviz.ui.show import done_label

    def curve(match, barrier, after):
        return {"match": match, "barrier": barrier, "distance_before": 26.72,
                "distance_after": after}

    curves = [curve("none", 0.514, 26.72), curve("seed", 0.575, 25.1),
              curve("weight", 0.043, 20.3)]
    v = summaries.barrier_verdict(curves)
    assert v["kind"] == "mixed"
    assert [(c["did"], c["before"], c["after"]) for c in v["changes"]] == [
        ("raised", 0.514, 0.575), ("lowered", 0.514, 0.043)]
    assert "FFN + attention + rescale (seed paper): **raised** it to 0.575 (+0.061); " \
           "distance 26.72 → 25.10" in v["text"]
    assert "**lowered** it to 0.043 (-0.471)" in v["text"]
    assert "lowers the barrier" not in v["text"]
    assert summaries.barrier_verdict(curves[:2])["kind"] == "raised"
    assert summaries.barrier_verdict([curves[0], curves[2]])["kind"] == "lowered"
    kept = summaries.barrier_verdict([curves[0], curve("seed", 0.5142, 26.0)])
    assert kept["changes"][0]["did"] == "kept" and "**kept** it at 0.514" in kept["text"]
    assert summaries.barrier_verdict(curves[1:]) is None  # nothing to compare with
    assert summaries.barrier_verdict(curves[:1]) is None
    assert done_label(0.12, 0, 3, "run") == \
        "Run: done in 0.1 s, all 3 from the cache (computed earlier with these settings)"
    assert done_label(12.34, 2, 1, "open") == "computed on open: done in 12.3 s, 2 computed, " \
                                             "1 from the cache"
    assert done_label(1.0, 1, 0, None) == "done in 1.0 s, 1 computed"


def test_device_badge_names_the_device():
    s = device_summary("cpu")
    assert s["kind"] == "cpu" and s["total_gib"] and s["total_gib"] > 0
    assert device_badge(s).startswith("cpu · ")


def test_learn_demo_scrambles_weights_not_outputs(roots):
    from rotviz.data.split import load_split
    from rotviz.sources.loading import load_model

    m = load_model(roots / "vit-s0")
    split = load_split("digits").subset(64)
    before = {k: v.clone() for k, v in m.state.items()}
    for kind in ("rotate", "permute", "all"):
        d = demos.learn_demo(m, split, kind, seed=3, layer=1, head=2)
        assert d["distance_scrambled"] > 1.0
        assert d["diff_scrambled"] < 1e-4 and d["probe_diff_scrambled"] < 1e-4
        assert d["distance_matched"] < 1e-4 * d["distance_scrambled"]  # planted transform undone
        assert d["diff_matched"] < 1e-4
        assert d["acc"]["original"] == d["acc"]["scrambled"] == d["acc"]["matched"]
        w = d["weights"]
        assert not np.allclose(w["original"], w["scrambled"], atol=1e-3)
        assert np.allclose(w["original"], w["matched"], atol=1e-5)
    assert all(torch.equal(before[k], m.state[k]) for k in before)  # the model was not touched


def test_model_card_symmetry_check(roots):
    from rotviz.data.split import load_split
    from rotviz.evaluation import evaluate
    from rotviz.sources.loading import load_model

    m = load_model(roots / "vit-s1")
    split = load_split("digits").subset(50)
    card = summaries.model_card(m, split)
    assert card["n_layers"] == 2 and card["d_model"] == 32 and card["n_heads"] == 4
    assert card["acc"] == evaluate(m, split)["acc"] and card["n_eval"] == 50
    assert card["check"]["passed"] and card["check"]["max_output_diff"] < 1e-4
    assert card["check"]["distance"] > 1.0


def test_match_tables_for_export(roots):
    from rotviz.match.options import MatchOptions
    from rotviz.match.pipeline import match_models
    from rotviz.sources.loading import load_model

    a, s = load_model(roots / "vit-s0"), load_model(roots / "vit-s1")
    summary = summaries.match_summary(match_models(a, s, MatchOptions()), "seed")
    assert summary["preserved"] and summary["after_total"] < summary["before_total"]
    rows = summaries.distance_rows(summary)
    layer_rows = [r for r in rows if r["group"] == "layer"]
    assert sorted(r["name"] for r in layer_rows) == ["0", "1", "rest"]
    total_after = sum(r["after"] ** 2 for r in layer_rows) ** 0.5
    assert total_after == pytest.approx(summary["after_total"], rel=1e-9)
    heads = summaries.head_rows(summary)
    assert len(heads) == 2 * 4  # layers x heads
    rep = summary["report"]["heads"][1]
    assert heads[4]["qk_singular_sum"] == pytest.approx(sum(rep["qk_singular"][0]))
    assert heads[4]["qk_scale"] == rep["qk_scale"][0] and heads[4]["layer"] == 1


def test_model_locks_serialise_shared_modules(roots):
    """Two sessions evaluating different parameter sets on one cached module at once get
    their own answers (functional_call swaps tensors on the shared module)."""
    from rotviz.sources.loading import load_model
    from rotviz.sources.running import forward, probe_inputs
    from rotviz.ui import runtime

    m = load_model(roots / "vit-s0")
    other = load_model(roots / "vit-s1").state
    x = probe_inputs(m, 8)
    want = {0: forward(m, x, m.state), 1: forward(m, x, other)}
    got: dict[int, list[bool]] = {0: [], 1: []}

    def work(i: int) -> None:
        for _ in range(15):
            with runtime.using("vit-s0"):
                y = forward(m, x, m.state if i == 0 else other)
            got[i].append(bool(torch.equal(y, want[i])))

    threads = [threading.Thread(target=work, args=(i,)) for i in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all(got[0]) and all(got[1]) and len(got[0]) == len(got[1]) == 15


def test_serve_command(capsys, tmp_path):
    from rotviz.cli import main
    from rotviz.cli.serve import serve_command

    cmd = serve_command(8600, "127.0.0.1")
    assert cmd[1:4] == ["-m", "streamlit", "run"]
    assert Path(cmd[4]) == Path(APP).with_name("app.py")  # the package's launcher
    assert "--server.port" in cmd and "8600" in cmd and "none" in cmd
    assert cmd[cmd.index("--theme.primaryColor") + 1] == "#0072B2"  # rotviz.ui.options
    assert main(["serve", "--print-command", "--port", "8600", "--roots", str(tmp_path)]) == 0
    assert "streamlit run" in capsys.readouterr().out
    assert main(["serve", "--roots", str(tmp_path / "missing")]) == 2
    assert "no folder" in capsys.readouterr().err
    with pytest.raises(RotvizError, match="port"):
        serve_command(0)


def test_serve_print_command_points_into_the_package(tmp_path):
    """`python -m rotviz serve --print-command`, run from a folder outside the checkout, names
    the package's launcher (rotviz/ui/app.py inside the installed rotviz, not a checkout's
    app.py) and carries the app's settings as flags (a wheel has no .streamlit/config.toml);
    printing it loads no streamlit."""
    import rotviz

    out = subprocess.run([sys.executable, "-m", "rotviz", "serve", "--print-command",
                          "--port", "8601"], cwd=tmp_path, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    words = out.stdout.split()
    launcher = Path(rotviz.__file__).resolve().parent / "ui" / "app.py"
    assert launcher.is_file() and str(launcher) in words
    assert words[words.index(str(launcher)) - 1] == "run"
    assert words[words.index("--theme.primaryColor") + 1] == "#0072B2"
    assert words[words.index("--server.port") + 1] == "8601"
    code = ("import sys\nfrom rotviz.cli import main\n"
            "main(['serve', '--print-command'])\n"
            "print(sorted(m for m in sys.modules if m.split('.')[0] == 'streamlit'))\n")
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "[]"


# ---- the app, headless ------------------------------------------------------------------


def test_models_page_opens_on_the_default_pair(pair):
    at = app()
    assert at.selectbox(key="anchor").value == pair[0]
    assert at.selectbox(key="source").value == pair[1]
    # in the order shown, as `rotviz barrier ANCHOR SOURCE` takes them
    assert [b.label for b in at.sidebar.selectbox][:2] == [
        "Anchor (model 1, stays fixed)", "Source (model 2, gets matched)"]
    metrics = {m.label: m.value for m in at.metric}
    assert "test accuracy" in metrics
    body = texts(at)
    assert "function preserved" in body and "can be matched" in body
    assert f"fraction of {N_EVAL} test examples" in str([m.help for m in at.metric])


def test_models_page_evaluates_light_models_then_computes_the_barrier_page_ahead(pair):
    """The Models page checks and evaluates the pair without transformers' modules
    (rotviz.sources.plain_torch where it is exact) and, once painted, computes the Barrier page's
    default curves in the background, so that page finds them ready. They are the library's numbers
    with the models' own transformers classes, bit for bit."""
    from rotviz import app as rapp
    from rotviz.data.split import load_split
    from rotviz.measures.barrier import interpolate
    from rotviz.sources.loading import load_model
    from rotviz.ui import runtime

    stores = runtime._stores()
    with runtime._WARMING, runtime._AHEAD:  # an earlier page's warm-up is over
        pass
    for store in stores.values():
        store.clear()
    seen, planned = {}, []
    real_load_eval, real_defaults = rapp.load_eval, rapp.barrier_defaults

    def load_eval(ref):
        seen[ref] = real_load_eval(ref)
        return seen[ref]

    def barrier_defaults(base, why):
        planned.append(real_defaults(base, why))
        return planned[-1]

    rapp.load_eval, rapp.barrier_defaults = load_eval, barrier_defaults
    try:
        app()
    finally:
        rapp.load_eval, rapp.barrier_defaults = real_load_eval, real_defaults
    assert set(seen) == set(pair)  # the page evaluated lighter models ...
    if all(ref.startswith("zoo:vit") for ref in pair):
        assert {type(m.model).__module__ for m in seen.values()} == {"rotviz.sources.plain_torch"}
    with runtime._WARMING, runtime._AHEAD:  # the warm-up thread (started by the page) is done
        pass
    assert not stores["models"]  # ... and never needed the full ones
    (ahead,) = planned
    assert [c["spec"] for c in ahead] == list(app_specs.DEFAULT_SPECS)
    assert {(c["anchor"], c["source"], c["params"]["points"]) for c in ahead} == {
        (*pair, rapp.BARRIER_POINTS)}
    assert all(runtime.is_cached("barrier", cfg) for cfg in ahead)
    a, b = load_model(pair[0]), load_model(pair[1])
    assert type(a.model).__module__.startswith("transformers")
    split = load_split(ahead[0]["data"], "test", 0).subset(ahead[0]["n_eval"])
    # none, and the seed paper's matching (weight matching's match is the library's:
    # test_app_compute.py; a barrier evaluates any match the same way)
    for cfg in (ahead[0], ahead[1]):
        got = runtime.compute("barrier", cfg)
        want = interpolate(a, b, split, cfg["spec"], points=cfg["params"]["points"])
        assert got["loss"] == want.loss and got["acc"] == want.acc  # bit for bit
        assert got["barrier"] == want.barrier


def test_launcher_computes_the_opening_cards_before_the_first_run(pair, monkeypatch):
    """`streamlit run app.py` serves app.py's st.App (found the way streamlit finds it), whose
    lifespan starts rotviz/ui/boot.py's thread: it computes the Models page's two cards for
    the pair the app opens on into the results cache, so the page, opened with the sidebar's
    defaults, takes both from there; the cards are the library's own (rotviz.app.run on its
    plain Resources, nothing shared). The page's own warm-up (the next page's curves, on the
    whole split) is another test's."""
    from streamlit.web.server.app_discovery import discover_asgi_app

    from rotviz import app as rapp
    from rotviz.ui import boot, run, runtime

    for launcher in (Path(APP).with_name("app.py"), REPO / "app.py"):  # package, checkout
        found = discover_asgi_app(launcher)
        assert found.is_asgi_app and found.import_string == "app:app", launcher
    with runtime._WARMING, runtime._AHEAD:  # an earlier page's warm-up is over
        pass
    runtime._stores()["results"].clear()
    thread = boot.start()
    assert thread is not None and boot.start() is None  # once per process
    boot.ready()  # the thread's imports are over
    thread.join(timeout=120)
    cfgs = [{"ref": ref, "data": app_roots.data_of(pair[0]), "seed": 0, "n_eval": 0}
            for ref in pair]
    assert all(runtime.is_cached("card", cfg) for cfg in cfgs)
    monkeypatch.setattr(run, "warm_up", lambda s: None)
    at = app(n="0")
    assert at.status[0].label.endswith(", all 2 from the cache (computed earlier with these "
                                       "settings)"), at.status[0].label
    cards = [runtime.compute("card", cfg) for cfg in cfgs]
    acc = [m.value for m in at.metric if m.label == "test accuracy"]
    assert acc == [f"{c['acc']:.3f}" for c in cards]
    assert cards[0] == rapp.run("card", rapp.Resources(), cfgs[0])
    # before its own cards, a page with nothing cached shows what the zoo cards recorded
    # for these settings (the same split): the numbers it then computes (tests/test_zoo.py)
    for cfg, card in zip(cfgs, cards, strict=True):
        rec = app_roots.recorded_card(cfg["ref"], cfg["data"], 0, 0)
        assert rec == app_roots.recorded_card(cfg["ref"], cfg["data"], 0, card["n_eval"])
        assert abs(rec["acc"] - card["acc"]) <= 1e-4 and abs(rec["loss"] - card["loss"]) <= 1e-4
        assert rec["n"] == card["n_eval"]
        for other in ({"seed": 1}, {"n_eval": 100}, {"data": "pystdlib"}):
            asked = {"data": cfg["data"], "seed": 0, "n_eval": 0, **other}
            assert app_roots.recorded_card(cfg["ref"], **asked) is None, other
    assert app_roots.recorded_card("zoo:gpt2-pystdlib-s0", "pystdlib", 0, 0) is None  # corpus
    runtime._stores()["results"].clear()
    at = app(n="0")  # computed now: this machine's numbers replace the recorded ones
    assert [m.value for m in at.metric if m.label == "test accuracy"] == acc
    assert not [m for m in at.metric if "recorded" in m.label]
    assert "zoo card** when it was built" not in " ".join(i.value for i in at.info)


def test_a_result_another_caller_computed_counts_as_from_the_cache():
    """A page that waits for a result another caller is computing (the start-up thread's
    cards) gets that result, and its progress box counts it as from the cache, not as
    computed (it used to say "2 computed")."""
    import threading
    import time

    from rotviz.app import cache
    from rotviz.ui import runtime

    cfg = {"ref": "zoo:nowhere", "data": "digits", "seed": 12345, "n_eval": 7}
    key = cache.config_hash({"kind": "card", **cache.canonical(cfg)})
    started = threading.Event()

    def slow():
        started.set()
        time.sleep(0.3)
        return {"acc": 0.5}

    other = threading.Thread(target=runtime._stores()["results"].get_or_compute,
                             args=(key, slow))
    other.start()
    started.wait(10)
    tally = {"cached": 0, "computed": 0}
    token = runtime._TALLY.set(tally)
    try:
        assert not runtime.is_cached("card", cfg)
        assert runtime.compute("card", cfg) == {"acc": 0.5}  # the other caller's, not run here
    finally:
        runtime._TALLY.reset(token)
        other.join()
    assert tally == {"cached": 1, "computed": 0}


def test_the_start_up_thread_waits_for_the_browsers_requests(monkeypatch):
    """The launcher's middleware counts the HTTP requests under way (the websocket, open for
    the whole visit, is not one): the start-up thread's wait for a quiet server (boot._quiet,
    before it imports torch) ends only once none is under way and none ended for QUIET_S."""
    import asyncio
    import threading
    import time

    from rotviz.ui import boot

    monkeypatch.setattr(boot, "QUIET_S", 0.3)
    monkeypatch.setattr(boot, "QUIET_CAP_S", 5.0)
    seen = []

    async def serve(scope, receive, send):
        seen.append(dict(boot._REQUESTS))
        await asyncio.sleep(0.3)

    mw = boot.Requests(serve)
    asyncio.run(mw({"type": "websocket"}, None, None))
    assert seen[-1]["open"] == 0
    waited = []
    asyncio.run(mw({"type": "http"}, None, None))  # a request that has just ended
    thread = threading.Thread(target=lambda: (boot._quiet(), waited.append(time.monotonic())))
    thread.start()
    asyncio.run(mw({"type": "http"}, None, None))  # and one more under way
    thread.join(timeout=10)
    assert seen[-1]["open"] == 1 and boot._REQUESTS["open"] == 0
    # the second request's end, then the quiet window
    assert waited and waited[0] >= boot._REQUESTS["last"] + 0.3 - 1e-3


def test_barrier_page_chart_holds_library_results(pair):
    from rotviz.data.split import load_split
    from rotviz.measures.barrier import interpolate
    from rotviz.sources.loading import load_model
    from rotviz.ui import runtime

    at = app("barrier", b_points="5")
    # the page checks and computes with the models as the computations take them: it never
    # loads transformers' modules (that import competed with the first curves for the CPU)
    assert not runtime._stores()["models"]
    figs = figures(at)
    # curves computed now are drawn as they come in; the final chart replaces them (the
    # third chart: the path animated)
    assert len(at.get("plotly_chart")) == len(figs) == 3
    assert "matching options so far" not in "\n".join(c.value for c in at.caption)
    loss = figs[LOSS_TITLE]
    lines = [tr for tr in loss["data"] if tr.get("showlegend", True)]
    assert len(lines) == len(app_specs.DEFAULT_SPECS)  # none, seed and weight
    assert all(len(numbers(tr["y"])) == 5 for tr in lines)
    by_name = {tr["name"].split(" (barrier")[0]: tr for tr in lines}
    none, seed = by_name["no matching"], by_name["FFN + attention + rescale (seed paper)"]
    weight = by_name["weight matching (every data-free map)"]

    a, s = load_model(pair[0]), load_model(pair[1])
    split = load_split("digits").subset(N_EVAL)
    refs = {}
    for spec, tr in (("none", none), ("seed", seed), ("weight", weight)):
        ref = refs[spec] = interpolate(a, s, split, spec, points=5)
        assert np.allclose(numbers(tr["y"]), ref.loss, rtol=1e-6, atol=1e-8)
        assert f"barrier {ref.barrier:.3f}" in tr["name"]
    assert "function preserved" in texts(at)
    # the animation plays the last matching's path (weight): frame k holds its first k + 1
    # losses and its answers on the first test inputs at alpha k
    anim = figs["Loss and answers along the straight path from anchor to matched source"]
    assert len(anim["frames"]) == 5
    for k, frame in enumerate(anim["frames"]):
        assert numbers(frame["data"][0]["y"]) == pytest.approx(refs["weight"].loss[: k + 1],
                                                               rel=1e-6, abs=1e-8)
        assert len(frame["data"]) == 2 + 4  # the curve, the point at alpha, 4 answers
    # the banner says what each matching did, from what to what
    for spec in ("seed", "weight"):
        did = "lowered" if refs[spec].barrier < refs["none"].barrier else "raised"
        assert f"**{did}** it to {refs[spec].barrier:.3f}" in texts(at), spec
    # the table fits: the SPEC column is left to the export; the barriers are the library's
    table = at.dataframe[0].value
    assert "spec" not in table.columns
    assert table["barrier"].tolist() == pytest.approx([refs[k].barrier for k in refs],
                                                      rel=1e-6)
    # a small pair computes on open, and says so
    assert any("Computed on open" in c.value for c in at.caption)
    assert at.status[0].label.startswith("Interpolating: computed on open: done in ")
    acc = figs[ACC_TITLE]
    assert len(acc["data"]) == len(app_specs.DEFAULT_SPECS)
    # the accuracy axis follows the curves
    from rotviz.plots.style import acc_range

    assert acc["layout"]["yaxis"]["range"] == pytest.approx(
        acc_range([v for r in refs.values() for v in r.acc]), abs=1e-9)
    if pair[0].startswith("zoo:"):  # acceptance: the shipped pair shows matching's effect
        assert barrier_of(seed) < barrier_of(none)
        # weight matching (every data-free map) lowers it further on the default pair
        assert barrier_of(weight) < barrier_of(seed) - 0.2
        mid = {tr["name"]: numbers(tr["y"])[2] for tr in acc["data"]}
        assert mid["weight matching (every data-free map)"] > \
            mid["FFN + attention + rescale (seed paper)"]
        assert "**raised**" not in texts(at)


def barrier_of(trace: dict) -> float:
    """The barrier of a plotted loss curve (evenly spaced α), from the chart's own numbers."""
    y = numbers(trace["y"])
    return max(v - (y[0] + (y[-1] - y[0]) * i / (len(y) - 1)) for i, v in enumerate(y))


@pytest.fixture(scope="module")
def default_pair_dirs(roots) -> tuple[str, str]:
    """The zoo's default pair as two folders, added to the model roots."""
    from tests.pairs import default_pair

    a, b = default_pair()
    os.environ[app_roots.ENV_ROOTS] += os.pathsep + str(Path(a.path).parent)
    return str(a.path), str(b.path)


def test_barrier_chart_shows_matching_lowering_the_barrier(default_pair_dirs):
    """Acceptance: in the chart data, the seed paper's matching has the lower barrier (and a
    better midpoint), on the zoo's default pair, opened as folders."""
    a, s = default_pair_dirs
    at = app("barrier", anchor_path=a, source_path=s, b_points="5",
             b_specs=["no matching", "FFN + attention + rescale (seed paper)"])
    loss = figures(at)[LOSS_TITLE]
    lines = {tr["name"].split(" (barrier")[0]: tr for tr in loss["data"]
             if tr.get("showlegend", True)}
    none, seed = lines["no matching"], lines["FFN + attention + rescale (seed paper)"]
    assert barrier_of(seed) < barrier_of(none) - 0.3
    assert f"barrier {barrier_of(seed):.3f}" in seed["name"]
    mid = {tr["name"]: numbers(tr["y"])[2] for tr in figures(at)[
        ACC_TITLE]["data"]}
    assert mid["FFN + attention + rescale (seed paper)"] > mid["no matching"]


def test_barrier_form_reruns_with_new_options(pair):
    at = app("barrier", b_points="5")
    at.multiselect(key="b_specs").set_value(["none", "seed"])
    at.slider(key="b_points").set_value(7)
    at.toggle(key="acc01").set_value(True)  # the sidebar's fixed 0-1 accuracy scale
    at.button(key="b_run").click()
    at.run()
    assert not at.exception
    # Run says that it ran, how long it took and what it computed (2 curves), and the
    # plane's own Run the same (the plane)
    assert at.status[0].label.startswith("Interpolating: Run: done in ")
    assert at.status[0].label.endswith(" s, 2 computed")
    assert [x.value for x in at.toast] == [at.status[0].label]
    at.slider(key="b_plane_grid").set_value(5)
    at.button(key="b_plane_run").click()
    at.run()
    assert not at.exception
    assert at.status[1].label.startswith("Loss plane: Run: done in ")
    assert at.status[1].label.endswith(" s, 1 computed")
    figs = figures(at)
    loss = figs[LOSS_TITLE]
    lines = [tr for tr in loss["data"] if tr.get("showlegend", True)]
    assert len(lines) == 2 and all(len(numbers(tr["y"])) == 7 for tr in lines)
    assert figs[ACC_TITLE]["layout"]["yaxis"]["range"] == [0.0, 1.02]
    plane = figs["Test loss on the plane through A, B and B'"]
    marks = {tr["text"][0] for tr in plane["data"][1:]}
    assert marks == {"A", "B", "B'", "AB", "AB'"}
    z = np.asarray(plane["data"][0]["z"], dtype=float)
    assert z.shape == (5, 5) and np.isfinite(z).all()
    # Run again with the same settings: answered from the cache, and it says so
    at.button(key="b_run").click()
    at.run()
    assert at.status[0].label.startswith("Interpolating: Run: done in ")
    assert at.status[0].label.endswith(
        " s, all 2 from the cache (computed earlier with these settings)")
    at.button(key="b_plane_run").click()
    at.run()
    assert at.status[1].label.endswith(
        " s, from the cache (computed earlier with these settings)")


def test_match_page_distances_drop(pair):
    at = app("match", m_barrier="false")
    figs = figures(at)
    per_layer = figs["Distance to the anchor per layer"]
    before, after = (numbers(tr["y"]) for tr in per_layer["data"])
    assert sum(after) < sum(before)
    ab = figs["What each matching option buys (shorter bars are better)"]["data"][0]
    dist = dict(zip(ab["y"], numbers(ab["x"]), strict=True))
    assert dist["FFN + attention + rescale (seed paper)"] < dist["no matching"]
    assert "function preserved" in texts(at)


def test_spectra_page_circuits_unchanged(pair):
    at = app("spectra")
    figs = figures(at)
    qk = next(f for t, f in figs.items() if t.startswith("Q-K circuit"))
    series = {tr["name"]: numbers(tr["y"]) for tr in qk["data"]}
    assert np.allclose(series["source"], series["matched source"], rtol=1e-4)
    assert not np.allclose(series["source"], series["anchor"], rtol=1e-2)
    assert "invariant circuits unchanged" in texts(at)
    assert any(t.startswith("Layer 0: singular values") for t in figs)


def test_merge_page_chart_holds_fusion_table(pair):
    from rotviz.analysis.fusion import fusion_table
    from rotviz.data.split import load_split
    from rotviz.sources.loading import load_model

    at = app("merge", g_methods="simple average")
    fig = figures(at)["Merged model accuracy per fusion method"]
    bars = {tr["name"]: numbers(tr["y"])[0] for tr in fig["data"] if tr["type"] == "bar"}
    a, s = load_model(pair[0]), load_model(pair[1])
    ref = fusion_table(a, s, load_split("digits").subset(N_EVAL), methods=("simple",),
                       specs=("none", "seed"))
    assert bars["no matching"] == pytest.approx(ref.acc["simple"]["none"], abs=1e-12)
    assert bars["FFN + attention + rescale (seed paper)"] == pytest.approx(
        ref.acc["simple"]["seed"], abs=1e-12)
    lines = [tr for tr in fig["data"] if tr["type"] == "scatter"]
    assert numbers(lines[0]["y"])[0] == pytest.approx(ref.anchor_acc)
    # accuracy and F1, read side by side, share one scale that follows the bars and lines
    shown = [fig, *(f for k, f in figures(at).items() if k.startswith("Merged model macro-F1"))]
    values = [v for f in shown for tr in f["data"] for v in numbers(tr["y"])]
    top = max(values)
    for f in shown:
        lo, hi = f["layout"]["yaxis"]["range"]
        assert lo == 0.0 and hi == pytest.approx(min(top + max(0.05 * (top - min(values)),
                                                                0.01), 1.02))
    assert "function preserved" in texts(at)
    # the sweep computes on its own Run only, one line per matching, the library's numbers
    assert "Merged model accuracy against weight (simple)" not in figures(at)
    at.button(key="g_merge_sweep_run").click()
    at.run()
    assert not at.exception, [e.message for e in at.exception]
    sweep = figures(at)["Merged model accuracy against weight (simple)"]
    got = {tr["name"]: numbers(tr["y"]) for tr in sweep["data"]}
    from rotviz.match.endpoints import match_endpoints
    from rotviz.measures.merge_sweep import sweep_on

    split = load_split("digits").subset(N_EVAL)
    want = sweep_on(match_endpoints(a, s, "seed"), "simple", "weight",
                    np.linspace(0, 1, 6).tolist(), split)
    assert got["FFN + attention + rescale (seed paper)"] == pytest.approx(want.acc, abs=1e-12)
    assert len(got["no matching"]) == 6 and got["no matching"][0] == pytest.approx(
        ref.anchor_acc)
    # Table 1 over every method: the one run, the others said not picked; the sweep offers
    # a weightless method only its own number, and no weight
    assert "Every method, before and after matching" in [h.value for h in at.subheader]
    assert any(c.value.startswith("Not run: Fisher") and "(not picked above)" in c.value
               for c in at.caption)
    at.selectbox(key="g_merge_sweep_method").set_value("sce").run()
    assert not at.exception, [e.message for e in at.exception]
    assert at.selectbox(key="g_merge_sweep_param_sce").options == ["SCE: share of entries "
                                                                   "selected"]
    assert "g_merge_sweep_weight" not in [w.key for w in at.slider]


def test_learn_page(pair):
    at = app("learn", l_kind="all")
    figs = figures(at)
    stages = figs["How far the weights moved from the original"]
    d = [numbers(tr["y"])[0] for tr in stages["data"]]
    assert d[0] == 0.0 and d[1] > 1.0 and d[2] < 1e-4 * d[1]
    assert texts(at).count("function preserved") >= 2


def test_mismatched_pair_and_outside_path_show_messages(pair, roots):
    at = app("match", anchor_path=str(roots / "vit-s0"), source_path=str(roots / "vit-wide"))
    assert "differ in shape" in texts(at)
    assert not figures(at)
    at = app("barrier", anchor_path="/etc")
    assert "outside the model roots" in texts(at)
    at = app("learn", data="pystdlib")  # text data for an image pair
    assert "is text data but" in texts(at) and not figures(at)
    at = app("match", m_layers="0,7")  # the default pair has 4 layers
    assert "out of range" in texts(at) and not figures(at)
    at.switch_page("views/models.py")
    at.run()
    assert not at.exception


def test_presenter_mode_hides_controls(pair):
    at = app(present="true")
    assert any(b.label == "Leave presenter mode" for b in at.button)


# ---- matching beyond the seed paper: residual, activation, learned ---------------------------


def test_result_cache_stores_only_what_finished():
    cache = app_cache.ResultCache(max_entries=2)
    assert cache.get_or_compute("a", lambda: {"x": [1]}) == {"x": [1]}
    got = cache.get_or_compute("a", lambda: pytest.fail("recomputed"))
    got["x"].append(2)  # a copy: the stored value does not change
    assert cache.get_or_compute("a", lambda: None) == {"x": [1]}

    class Interrupted(BaseException):  # like Streamlit's stop and rerun signals
        pass

    def interrupted():
        raise Interrupted

    with pytest.raises(Interrupted):
        cache.get_or_compute("b", interrupted)
    assert "b" not in cache and len(cache) == 1
    assert cache.get_or_compute("b", lambda: 2) == 2
    cache.get_or_compute("c", lambda: 3)  # beyond max_entries: the least recently used goes
    assert "a" not in cache and "b" in cache and "c" in cache
    cache.discard("b")
    cache.discard("never stored")
    assert "b" not in cache and len(cache) == 1
    shared = app_cache.ResultCache(copy=False)
    obj = object()
    assert shared.get_or_compute("k", lambda: obj) is obj
    assert shared.get_or_compute("k", lambda: None) is obj


def test_progress_detail_touches_the_page_at_a_bounded_rate():
    """Learned matching reports every step; the page is updated at most every EVERY seconds
    (each update is where Streamlit can interrupt the run) and always at a loop's end."""
    from rotviz.ui import show

    class Fake:
        def __init__(self):
            self.calls = []

        def progress(self, value, text=""):
            self.calls.append((value, text))

        def update(self, **kw):
            self.calls.append(kw)

    bar, box = Fake(), Fake()
    step = show.Steps("Matching", 2, box, bar)
    step("weight,learned")
    for k in range(1, 2001):  # a fast loop: most reports are not sent
        step.detail(k, 2000, f"step {k}")
    assert 1 <= step.updates < 200
    value, text = bar.calls[-1]
    assert box.calls[-1] == {"label": "Matching: weight,learned · step 2000 [2000/2000]"}
    assert value == pytest.approx(0.5) and text.endswith("[2000/2000]")  # unit 1 of 2, done
    step.EVERY = 0.0
    step.detail(1, 10, "slow step")  # a slow loop: every report reaches the page
    step.detail(2, 10, "slow step")
    assert step.updates >= 3


def test_spec_choices_and_residual_fallback():
    assert app_specs.spec_label("act") == "weight,act"
    assert app_specs.spec_label("ffn,attn,rescale,heads,residual,learned") == "weight,learned"
    assert app_specs.spec_label("ffn,attn,rescale,residual,learned") == "seed,residual,learned"
    assert app_specs.DEFAULT_SPECS == ("none", "seed", "weight")
    assert set(app_specs.DEFAULT_SPECS) <= set(app_specs.SPEC_CHOICES)
    assert all(app_specs.spec_label(sp) == sp for sp in app_specs.SPEC_CHOICES)
    assert not any(app_specs.learns(sp) for sp in app_specs.DEFAULT_SPECS)  # learned is opt-in
    why = "tied head"
    assert app_specs.offered(app_specs.SPEC_CHOICES, why) == [
        "none", "ffn", "attn", "ffn,attn", "seed", "seed,heads"]
    assert app_specs.offered(app_specs.SPEC_CHOICES, None) == list(app_specs.SPEC_CHOICES)
    assert app_specs.without_residual("weight") == "seed,heads"  # every data-free map left
    assert app_specs.without_residual("weight,learned") == "seed,heads,learned"
    assert app_specs.without_residual("learned") == "seed,heads,act,learned"
    assert app_specs.without_residual("residual") == "none"
    assert {"heads", "residual", "act", "learned"} <= set(app_specs.WHY_UNCHANGED)


def test_cancelled_or_interrupted_learned_matching_is_not_cached(roots):
    """A run that learned matching's cancel() stopped, or that Streamlit interrupted from the
    progress callback, leaves nothing in the app's caches; the next run computes afresh."""
    from streamlit.runtime.scriptrunner_utils.exceptions import StopException

    from rotviz import app as rapp
    from rotviz.ui import runtime

    a, s = str(roots / "vit-s0"), str(roots / "vit-s1")
    # the sidebar's time budget, below any round's seconds: the weight matching that learned
    # matching starts from stops after its first round (the rule: tests/test_alternation_stop.py),
    # where its whole alternation took 1.5 CPU-s of each of the three runs; what is checked
    # here is what a stop leaves in the caches
    cfg = {"anchor": a, "source": s, "data": "digits", "seed": 0, "n_eval": N_EVAL,
           "device": "cpu", "layers": "", "match_time": 1e-9,
           **rapp.spec_cfg("weight,learned", 6)}
    with pytest.raises(rapp.Cancelled, match="cancelled after 0 of 6 steps"):
        rapp.matched(runtime.resources(), cfg, cancel=lambda: True)
    assert cfg["learn_steps"] == 6

    def stop_at_step_3(done, total, message):
        if message.startswith("step 3"):
            raise StopException  # what Streamlit raises in a st call when the user stops

    with pytest.raises(StopException):
        runtime.compute("match", cfg, stop_at_step_3)
    assert not runtime.is_cached("match", cfg)
    seen = []
    res = runtime.compute("match", cfg, lambda d, t, m: seen.append(m))
    assert runtime.is_cached("match", cfg)
    learned = res["report"]["learned"]
    assert learned["steps"] == 6 and learned["stopped"] == "steps"
    assert [h["step"] for h in learned["history"]] == [0, 6]
    assert any(m.startswith("step 6") for m in seen)
    assert res["preserved"]


def test_stopped_page_waits_for_run(pair):
    """After the page's Stop button (its callback sets the flag), the page computes nothing
    until Run is pressed."""
    from streamlit.testing.v1 import AppTest

    at = AppTest.from_file(APP, default_timeout=120)
    at.query_params["n"] = str(N_EVAL)
    at.query_params["m_barrier"] = "false"
    at.switch_page("views/match.py")
    at.session_state["_stopped_match"] = True
    at.run()
    assert not at.exception
    assert "Stopped. Nothing from the stopped run was kept" in texts(at) and not figures(at)
    next(b for b in at.button if b.label == "Run").click().run()
    assert not at.exception and figures(at)
    assert "Stopped." not in texts(at)


def test_match_page_residual_alternation_never_goes_up(pair):
    at = app("match", m_residual="true", m_barrier="false")
    figs = figures(at)
    obj = figs["Weight matching, step by step: the distance never goes up"]
    line = numbers(obj["data"][0]["y"])
    assert len(line) >= 3 and line[-1] < line[0]
    assert all(b <= a * (1 + 1e-9) for a, b in zip(line, line[1:], strict=False))
    assert {tr["name"] for tr in obj["data"][1:]} == {
        "start (canonical forms)", "after per-layer maps (FFN, heads)", "after residual map"}
    assert obj["layout"]["yaxis"]["title"]["text"].startswith("squared distance to anchor")
    ang = numbers(figs["Residual map: eigen-angle spectrum"]["data"][0]["y"])
    metrics = {m.label: m.value for m in at.metric}
    d_model = summaries.dims_of(load_cached(pair[0]))["d_model"]
    if metrics["residual group"] == "centred":  # LayerNorm: the all-ones axis stays fixed
        assert len(ang) == d_model - 1
    assert all(0.0 <= v <= 180.0 for v in ang) and max(ang) > 1.0
    canon = float(metrics["distance between canonical forms"])
    assert canon ** 2 == pytest.approx(line[-1], rel=1e-3)
    assert "✓ never went up" in "\n".join(c.value for c in at.caption)
    assert "function preserved" in texts(at)
    assert float(metrics["distance after"]) < float(metrics["distance before"])
    # the rounds beside the match: each round's share of the gain (adding up to 100%) and
    # the distance after it, ending at the canonical distance; why it stopped, in words
    rnd = figs["Weight matching, round by round: what each round earned"]
    share, dist = (numbers(tr["y"]) for tr in rnd["data"])
    assert [tr["name"] for tr in rnd["data"]] == ["round's share of the gain (%)",
                                                  "distance after the round"]
    assert sum(share) == pytest.approx(100.0, rel=1e-6) and share[0] > 50.0
    assert dist[-1] == pytest.approx(canon, rel=1e-3)
    layout = rnd["layout"]
    assert layout["xaxis"]["title"]["text"] == "round of the alternation"
    assert layout["yaxis"]["title"]["text"] == "canonical distance to anchor (L2)"
    assert layout["yaxis2"]["title"]["text"] == "share of the total gain (%)"
    assert "Stopped (stalled)" in "\n".join(c.value for c in at.caption)


def load_cached(ref: str):
    from rotviz.ui import runtime

    return runtime.resources().load_eval(ref)


def test_match_page_learned_on_a_tiny_pair(roots):
    """Learned matching from the form, on two tiny random ViTs with a 5-step budget: the
    validation-barrier history, why it stopped, and the option in the ablation."""
    at = app("match", anchor_path=str(roots / "vit-s0"), source_path=str(roots / "vit-s1"),
             m_residual="true", m_solver="learned matching (trains)", m_steps="5",
             m_barrier="false")
    figs = figures(at)
    hist = figs["Learned matching: validation barrier while training"]
    val = next(tr for tr in hist["data"] if tr["name"].startswith("validation barrier"))
    assert numbers(val["x"]) == [0, 5]
    assert all(v >= 0 for v in numbers(val["y"]))
    metrics = {m.label: m.value for m in at.metric}
    assert metrics["steps run"] == "5"
    assert "It stopped because it ran all 5 steps" in texts(at)
    assert "Weight matching, step by step: the distance never goes up" in figs  # its start
    ab = figs["What each matching option buys (shorter bars are better)"]["data"][0]
    # the form's toggles (residual on, heads off) name seed,residual,learned
    from rotviz.plots.style import nice_label

    assert nice_label("seed,residual,learned") in ab["y"]
    assert "function preserved" in texts(at)


def test_learn_page_residual_step(pair):
    at = app("learn")
    figs = figures(at)
    stages = figs["The residual stream: how far the weights moved from the original"]
    d = dict(zip([tr["name"] for tr in stages["data"]],
                 [numbers(tr["y"])[0] for tr in stages["data"]], strict=True))
    assert d["original"] == 0.0 and d["tidied"] > 0.1 and d["stream rotated"] > 1.0
    assert d["matched back"] <= 1e-3
    metrics = {m.label: m.value for m in at.metric}
    assert float(metrics["largest logit change"]) <= 1e-4
    assert float(metrics["numbers changed by the rotation"].rstrip(" %")) > 90.0
    heat = figs["The residual stream turned: W_Q of head 0 in layer 0"]
    z = [np.asarray(tr["z"], dtype=float) for tr in heat["data"]]
    assert not np.allclose(z[1], z[2], atol=1e-3)  # rotated: every column moved
    assert np.allclose(z[0], z[3], atol=1e-4)  # matched back: the original
    assert texts(at).count("function preserved") >= 4


def gpt2_pair() -> tuple[str, str]:
    refs = app_roots.zoo_refs()
    a, b = "zoo:gpt2-pystdlib-s0", "zoo:gpt2-pystdlib-s1"
    if a not in refs or b not in refs:
        pytest.skip("the zoo's GPT-2 pair is not installed")
    return a, b


def test_gpt2_pair_residual_is_a_message(pair):
    """GPT-2's output head is tied to its embedding, so it has no residual map: the pages say
    why instead of offering it or failing."""
    a, b = gpt2_pair()
    # 8 test examples: the messages do not depend on how many the pages evaluate
    at = app("match", anchor=a, source=b, n="8", m_residual="true", m_barrier="false")
    body = texts(at)
    assert "Residual stream matching is not available for this pair" in body
    assert "tied" in body and "Result: FFN + attention + rescale (seed paper)" in \
        "\n".join(h.value for h in at.subheader)
    assert "function preserved" in body
    at = app("barrier", anchor=a, source=b, n="8", b_points="3",
             b_specs=["no matching", "weight matching (every data-free map)"])
    options = at.multiselect(key="b_specs").options
    assert "weight matching (every data-free map)" not in options and len(options) == 6
    assert "not offered for this pair" in "\n".join(c.value for c in at.caption)
    at = app("learn", anchor=a, source=b, n="8")
    assert "tied" in texts(at)
    assert "The residual stream: how far the weights moved from the original" not in figures(at)


def test_match_page_shows_the_check_in_a_half_checkpoints_dtype(roots):
    """A bfloat16 pair under the roots: the page shows both function checks, float32 and
    bfloat16 (source and matched source rounded to it and run in it), each as a badge."""
    from rotviz.random_models import random_model

    for seed in (0, 1):
        model, _ = random_model("vit", seed, dtype=torch.bfloat16, **VIT)
        model.save_pretrained(str(roots / f"vit-bf16-s{seed}"))
    at = app("match", anchor_path=str(roots / "vit-bf16-s0"),
             source_path=str(roots / "vit-bf16-s1"))
    shown = texts(at)
    badges = [line for line in shown.splitlines() if "PASS · function preserved" in line]
    assert len(badges) == 2, shown
    captions = " ".join(str(c.value) for c in at.caption)
    assert "matched source in bfloat16 (the checkpoint's dtype) vs. the model" in captions


def test_match_page_has_one_toggle_per_data_free_symmetry_of_the_registry():
    """The page keeps no list of its own: a registered map gets its toggle and caption."""
    from rotviz.symmetry.registry import SYMMETRIES

    at = app("match", m_barrier="false")
    toggles = {t.key: t for t in at.toggle}
    maps = [s for s in SYMMETRIES if not s.needs_data]
    assert {f"m_{s.name}" for s in maps} <= set(toggles)
    assert all(toggles[f"m_{s.name}"].value == s.default for s in maps)
    captions = " ".join(str(c.value) for c in at.caption)
    assert all(s.why in captions for s in maps if s.scope == "layer")
    assert toggles["m_ffn"].label == "FFN permutation"  # labels keep the registry's capitals


# ---- the Landscape page and the Barrier page's 3D plane ------------------------------------


def _framed(fig: dict) -> None:
    """A figure as the app sends it: a title, axis titles with units in brackets (the 3D
    scene's too), a legend or a colour bar with units, only the colour-blind palette."""
    from rotviz.plots import style

    safe = {c.lower() for c in style.OKABE_ITO} | {style.GREY.lower()}
    lay = fig["layout"]
    assert lay["title"]["text"]
    axes = {k: v["title"]["text"] for k, v in lay.items()
            if k.startswith(("xaxis", "yaxis")) and v.get("title", {}).get("text")}
    assert "xaxis" in axes and "yaxis" in axes, axes
    # a unit in brackets on every axis of numbers (an axis of named categories needs none)
    categorical = {"xaxis"} if any(isinstance((tr.get("x") or [0])[0], str)
                                   for tr in fig["data"]) else set()
    assert all("(" in t for k, t in axes.items() if k not in categorical), axes
    if "scene" in lay:
        assert "(" in lay["scene"]["zaxis"]["title"]["text"]
    named = [tr for tr in fig["data"] if tr.get("name")]
    assert named
    bars = [tr for tr in fig["data"] if tr.get("colorbar")]
    assert lay.get("showlegend") is True or bars
    assert all("(" in tr["colorbar"]["title"]["text"] for tr in bars)
    colours = set()
    for tr in fig["data"]:
        for part in ("line", "marker"):
            c = (tr.get(part) or {}).get("color")
            if isinstance(c, str) and c.lower() not in ("white", "black"):
                colours.add(c.lower())
    assert colours <= safe, colours - safe


@pytest.fixture(scope="module")
def tiny_pair(roots) -> tuple[str, str]:
    """The two tiny random ViTs: for pages whose sections cost seconds per model size (the
    bend's 11 x 11 plane, the Hessian, the gauge-fixed plane) and whose checks compare the
    page with the library on whatever pair it shows."""
    return str(roots / "vit-s0"), str(roots / "vit-s1")


def test_landscape_page_computes_each_section_on_run(tiny_pair):
    """First paint computes nothing; each section's Run draws its figures, whose numbers are
    the library's (the slice's grid, the Hessian's top eigenvalues, the bend's barrier). On
    the tiny pair: the bend's plane is always 11 x 11 on the split."""
    from rotviz.analysis.loss_grid import slice_at
    from rotviz.data.split import load_split
    from rotviz.match.endpoints import match_endpoints
    from rotviz.runner import measure
    from rotviz.sources.loading import load_model

    pair = tiny_pair

    at = app("landscape", anchor=pair[0], source=pair[1], l_slice_grid="5",
             l_bend_steps="5", l_bend_points="5",
             l_layerwise_points="3", l_hessian_iterations="16", l_hessian_examples="64",
             l_teleport_steps="2", l_teleport_examples="16", l_teleport_trace_probes="2",
             l_teleport_iterations="3")
    assert at.selectbox(key="anchor").value == pair[0]
    assert not figures(at)
    assert texts(at).count("Press **Run** to compute this section.") == 7
    seen: dict[str, dict] = {}
    for name in ("slice", "layerwise", "hessian", "bend", "teleport"):
        at.button(key=f"l_{name}_run").click().run()
        assert not at.exception, [e.message for e in at.exception]
        assert not at.error, [e.value for e in at.error]
        seen |= figures(at)
    titles = list(seen)
    slice_t = next(t for t in titles if t.startswith("Test loss on a random plane around"))
    bend_t = next(t for t in titles if t.startswith("Loss along a Bezier curve"))
    plane_t = "Test loss on the plane through A, B and B'"
    lw_t = next(t for t in titles if t.startswith("Layer-wise barriers"))
    hess_t = next(t for t in titles if t.startswith("Top Hessian eigenvalues of"))
    assert any(t.startswith("Teleporting ") for t in titles)
    # teleport shows its own function check (logits relative, the teleported model against
    # the original), not a pair's: the page's one-model sections matched nothing
    shown = texts(at)
    assert "PASS · function preserved · max relative logit change" in shown
    assert any("the teleported model vs. the original" in str(c.value) for c in at.caption)
    assert plane_t in titles
    for t in (slice_t, bend_t, plane_t, lw_t, hess_t):
        _framed(seen[t])

    a = load_model(pair[0])
    split = load_split("digits").subset(N_EVAL)
    ref = slice_at(a, split, 2, "random", "filter", False, 5, 1.0, 0, "cpu")
    contour = next(tr for tr in seen[slice_t]["data"] if tr["type"] == "contour")
    z = np.asarray([numbers(row) if isinstance(row, dict) else row for row in contour["z"]],
                   dtype=float)
    assert z.shape == (5, 5)
    assert np.allclose(z, np.asarray(ref.loss), rtol=1e-5, atol=1e-6)

    h = measure("hessian", match_endpoints(a, a, None), split, top=3, iterations=16,
                examples=64)
    bars = [tr for tr in seen[hess_t]["data"] if tr["type"] == "bar"]
    got = [numbers(tr["y"])[0] for tr in bars]  # the whole model's bar of each rank
    assert np.allclose(got, h.eigenvalues, rtol=1e-4)
    assert got == sorted(got, reverse=True)
    # the bend overlaid on the A/B/B' plane, its distance from the plane in the legend
    names = [tr.get("name", "") for tr in seen[plane_t]["data"]]
    assert any(n.startswith("Bezier curve (projected)") for n in names)
    assert any("off the plane" in n for n in names)
    assert "parameter units off the A/B/B' plane" in texts(at)


def test_landscape_slice_log_toggle_keeps_the_numbers(pair):
    """The log scale colours log10 of the loss; the surface's height stays the loss."""
    at = app("landscape", l_slice_grid="5")
    at.button(key="l_slice_run").click().run()
    lin = next(f for t, f in figures(at).items() if t.startswith("Test loss on a random"))
    at.toggle(key="l_slice_log").set_value(True).run()
    assert not at.exception
    log = next(f for t, f in figures(at).items() if t.startswith("Test loss on a random"))
    z = np.asarray([numbers(r) if isinstance(r, dict) else r for r in
                    next(tr for tr in lin["data"] if tr["type"] == "contour")["z"]], float)
    zl = np.asarray([numbers(r) if isinstance(r, dict) else r for r in
                     next(tr for tr in log["data"] if tr["type"] == "contour")["z"]], float)
    assert np.allclose(zl, np.log10(z), atol=1e-9)
    assert "log10" in next(tr for tr in log["data"] if tr["type"] == "contour"
                           )["colorbar"]["title"]["text"]


def _grid(trace: dict) -> np.ndarray:
    return np.asarray([numbers(r) if isinstance(r, dict) else r for r in trace["z"]], float)


def test_landscape_slice_around_b_prime_and_its_gauge_fixed_twin(pair, tiny_pair):
    """The record's new widgets reach the library: a 1D slice toward B' from the middle of
    the matched path (the page's matching) draws the library's numbers, B' marked at x = 1;
    the random plane beside the gauge-fixed plane share one colour scale, each panel the
    library's grid (1e-5), captioned. The gauge-fixed plane is drawn on the tiny random
    ViTs: its symmetry tangents cost about a minute on the zoo's ViT, seconds there, and the
    page and the library are wired the same for any ViT."""
    from rotviz.analysis.loss_grid import slice_with
    from rotviz.data.split import load_split
    from rotviz.match.endpoints import match_endpoints
    from rotviz.runner import measure
    from rotviz.sources.loading import load_model

    at = app("landscape", l_slice_grid="5", l_slice_around="path", l_slice_dims="1",
             l_slice_directions="toward", l_slice_norm="none", l_slice_biases="keep")
    at.button(key="l_slice_run").click().run()
    assert not at.exception and not at.error, [e.value for e in at.error]
    title, fig = next((t, f) for t, f in figures(at).items()
                      if t.startswith("Test loss on a toward line around"))
    assert "alpha 0.5 of the path" in title
    _framed(fig)
    a, b = load_model(pair[0]), load_model(pair[1])
    split = load_split("digits").subset(N_EVAL)
    ends = match_endpoints(a, b, "seed")
    want = measure("slice", ends, split, around="path", dims=1, grid=5,
                   directions="toward", norm="none", biases="keep")
    line = next(tr for tr in fig["data"] if tr.get("name") == "test loss")
    assert np.allclose(numbers(line["y"]), want.loss, rtol=1e-5, atol=1e-6)
    mark = next(tr for tr in fig["data"] if tr.get("name") == "B' (target)")
    assert numbers(mark["x"]) == [1.0] and numbers(mark["y"])[0] == pytest.approx(
        want.loss[-1], rel=1e-6)  # span 1: the line's last point is B' itself

    tiny = tiny_pair[0]
    at = app("landscape", anchor=tiny, source=tiny_pair[1], l_slice_grid="5")
    assert at.selectbox(key="anchor").value == tiny
    at.button(key="l_gauge_run").click().run()
    assert not at.exception and not at.error, [e.value for e in at.error]
    fig = figures(at)["Test loss on a random plane and on its gauge-fixed twin, one colour "
                      "scale"]
    _framed(fig)
    left, right = (tr for tr in fig["data"] if tr["type"] == "contour")
    assert (left["zmin"], left["zmax"]) == (right["zmin"], right["zmax"])
    a = load_model(tiny)
    ev_kw = dict(dims=2, grid=5, span=1.0, seed=0)
    plain = slice_with(a, split, directions="random", **ev_kw)
    fixed = slice_with(a, split, directions="gauge", **ev_kw)
    assert np.allclose(_grid(left), plain.loss, rtol=1e-5, atol=1e-6)
    assert np.allclose(_grid(right), fixed.loss, rtol=1e-5, atol=1e-6)
    assert np.abs(_grid(left) - _grid(right)).max() > 1e-4  # the projection changed the plane
    assert fixed.tangent_cosine <= 1e-6
    caption = " ".join(c.value for c in at.caption)
    assert "symmetry tangent at the centre removed" in caption


def test_barrier_page_plane_has_a_3d_view(pair):
    """With the plane drawn, a tab beside the contour holds the same grid as a 3D surface."""
    at = app("barrier", b_points="3", b_plane_grid="5",
             b_specs=["FFN + attention + rescale (seed paper)"])
    at.button(key="b_plane_run").click().run()
    figs = figures(at)
    flat = figs["Test loss on the plane through A, B and B'"]
    surf = figs["Test loss surface on the plane through A, B and B'"]
    _framed(surf)
    s = next(tr for tr in surf["data"] if tr["type"] == "surface")
    c = next(tr for tr in flat["data"] if tr["type"] in ("contour", "heatmap"))

    def grid(v):
        return np.asarray([numbers(r) if isinstance(r, dict) else r for r in v], float)

    assert np.allclose(grid(s["z"]), grid(c["z"]), rtol=1e-9)
    assert [t.label for t in at.tabs] == ["Contour (from above)", "3D surface (drag to turn)"]


def test_stop_reaches_a_training_measurement_and_nothing_is_cached(roots):
    """The app's cancel() reaches bend's training (Context.cancel): a stopped bend raises
    Cancelled, one line, and leaves nothing in the results cache."""
    from rotviz import app as rapp
    from rotviz.ui import runtime

    a, s = str(roots / "vit-s0"), str(roots / "vit-s1")
    base = {"anchor": a, "source": s, "data": "digits", "seed": 0, "n_eval": N_EVAL,
            "device": "cpu"}
    cfg = rapp.measure_cfg(base, "seed", steps=20, points=3)
    with pytest.raises(rapp.Cancelled, match="stopped before it finished") as e:
        runtime.compute("bend", cfg, None, lambda: True)
    assert "\n" not in str(e.value)
    assert not runtime.is_cached("bend", cfg)
    done = runtime.compute("bend", cfg, None, lambda: False)
    assert done["stopped"] == "steps" and done["steps"] == 20
    assert runtime.is_cached("bend", cfg)


def test_a_section_that_fails_says_so_once(tmp_path, monkeypatch):
    """A wheel's zoo holds the default pair only: the Training page's Run then fails on the
    spawn series, in one line, said once (in the section's failed progress box, not again
    below it), with what to do next."""
    import shutil

    from rotviz import zoo_registry as zoo

    for name in zoo.PAIRS["default"]:
        shutil.copytree(zoo.SHIPPED / name, tmp_path / name)
    monkeypatch.setenv("ROTVIZ_ZOO", str(tmp_path))
    # 4 points: a setting no other test computes (the app's result cache keys on settings)
    at = app("training", t_training_points="4")
    at.button(key="t_training_run").click().run()
    assert not at.exception, [e.message for e in at.exception]
    errors = [e.value for e in at.error]
    assert len(errors) == 1 and "not built" in errors[0], errors
    assert "rotviz zoo build vit-digits-spawn" in errors[0]
    assert any("Pick another pair or setting" in i.value for i in at.info)


def test_training_page_runs_both_charts_on_the_zoo_series(roots):
    """The Training page opens on the zoo's spawn series and computes nothing before Run;
    each Run draws its chart (framed: title, axes with units, legend, palette), whose lines
    are the library's barriers on the same split, one per matching; children spawned at the
    last step sit at 0, and an export holds the table."""
    from rotviz.data.split import load_split

    at = app("training", t_training_points="3", t_spawn_points="3")
    assert not figures(at)
    assert texts(at).count("Press **Run** to compute this section.") == 4  # + conserved, trajectory
    for name in ("training", "spawn"):
        at.button(key=f"t_{name}_run").click().run()
        assert not at.exception, [e.message for e in at.exception]
        assert not at.error, [e.value for e in at.error]
    figs = figures(at)
    over = figs["Barrier between the two runs over training"]
    spawn = figs["Instability: barrier between two children against the spawn step"]
    split = load_split("digits", "test", 0).subset(N_EVAL)
    for fig, name, refs in ((over, "training", ["zoo:vit-digits-run-a",
                                                "zoo:vit-digits-run-b"]),
                            (spawn, "spawn", ["zoo:vit-digits-spawn"])):
        _framed(fig)
        want = measure_lib(name, refs, split)
        lines = {tr["name"]: tr for tr in fig["data"]}
        assert list(lines) == ["no matching", "FFN + attention + rescale (seed paper)"]
        for tr, m in zip(lines.values(), want.matches, strict=True):
            assert numbers(tr["x"]) == want.x
            assert np.allclose(numbers(tr["y"]), want.barrier[m], rtol=1e-9, atol=1e-12)
    assert numbers(spawn["data"][0]["y"])[-1] == 0.0  # spawned at the end: the parent twice
    assert "common steps on 100 test samples." in "\n".join(str(c.value) for c in at.caption)


def test_training_page_draws_the_conserved_quantities_of_a_zoo_series(roots):
    """The conserved section opens on the zoo's run a; its Run draws the library's median
    drifts (a framed chart, log axis), every step but the first."""
    from rotviz import measure

    at = app("training", t_conserved_every="2")
    at.button(key="t_conserved_run").click().run()
    assert not at.exception, [e.message for e in at.exception]
    assert not at.error, [e.value for e in at.error]
    fig = next(f for t, f in figures(at).items() if t.startswith("Conserved quantities"))
    _framed(fig)
    want = measure("conserved", ["zoo:vit-digits-run-a"], None, every=2).to_dict()
    lines = [tr for tr in fig["data"] if tr.get("showlegend") is not False]
    assert [tr["name"] for tr in lines] == ["Q-K map (per head)", "V-O map (per head)"]
    for tr, kind in zip(lines, ("qk", "vo"), strict=True):
        assert numbers(tr["x"]) == want["steps"][1:]
        assert np.allclose(numbers(tr["y"]), want["summary"][kind]["median"][1:], rtol=1e-9)
    assert fig["layout"]["yaxis"]["type"] == "log"


def measure_lib(name: str, refs: list[str], split):
    from rotviz import measure

    return measure(name, refs, split, points=3, match=["none", "seed"])


def test_merge_page_aligns_many_models_on_run(roots):
    """The Merge page's many-models section computes nothing before Run; its Run draws the
    distance matrices (two heat maps, one colour scale) and the merged accuracy against the
    number of models, equal to the library's on the same split."""
    from rotviz import zoo_registry
    from rotviz.data.split import load_split
    from rotviz.match.many import align_many
    from rotviz.measures.many import merged_curve
    from rotviz.sources.loading import load_model

    at = app("merge", g_methods="simple average", n_rounds="1")
    assert "Many models at once" in [h.value for h in at.header]
    assert not any(t.startswith("Pairwise") for t in figures(at))
    at.button(key="n_run").click().run()
    assert not at.exception, [e.message for e in at.exception]
    assert not at.error, [e.value for e in at.error]
    figs = figures(at)
    mats = next(f for t, f in figs.items() if t.startswith("Pairwise parameter distance"))
    maps = [tr for tr in mats["data"] if tr["type"] == "heatmap"]
    assert len(maps) == 2 and {tr["coloraxis"] for tr in maps} == {"coloraxis"}
    curve = figs["Merged model's accuracy against the number of models merged"]
    _framed(curve)
    models = [load_model(f"zoo:{n}") for n in zoo_registry.SEEDS]
    split = load_split("digits", "test", 0).subset(N_EVAL)
    want = merged_curve(models, align_many(models, "seed", "barycentre", rounds=1), split)
    lines = {tr["name"]: tr for tr in curve["data"]}
    assert numbers(lines["aligned (barycentre)"]["y"]) == pytest.approx(want.acc["aligned"])
    assert numbers(lines["not aligned"]["y"]) == pytest.approx(want.acc["unaligned"])
    assert numbers(lines["aligned (barycentre)"]["x"]) == [2, 3, 4]
    z = maps[0]["z"]  # the matrix as given; row 0: the anchor's distances
    row = numbers(z)[:4] if isinstance(z, dict) else [float(v) for v in z[0]]
    assert row == pytest.approx(want.alignment.before[0], rel=1e-9)


def test_merge_page_draws_task_vectors_of_the_zoo_lineage_on_run(roots):
    """The Merge page's task-vector section opens on the zoo's lineage (a base, two
    fine-tunes), computes nothing before Run, and its Run draws the flattened cosine matrix
    and the per-layer lines, equal to the library's."""
    from rotviz import measure

    at = app("merge", g_methods="simple average")
    assert "Task vectors: how alike the fine-tunes are" in [h.value for h in at.header]
    assert at.text_input(key="g_taskvectors_base").value == "zoo:vit-digits-base"
    at.button(key="g_taskvectors_run").click().run()
    assert not at.exception, [e.message for e in at.exception]
    assert not at.error, [e.value for e in at.error]
    fig = next(f for t, f in figures(at).items() if t.startswith("Task vectors of 2"))
    want = measure("taskvectors", ["zoo:vit-digits-base", "zoo:vit-digits-ft-a",
                                   "zoo:vit-digits-ft-b"], None).to_dict()
    heat = next(tr for tr in fig["data"] if tr["type"] == "heatmap")
    z = heat["z"]
    got = numbers(z)[1] if isinstance(z, dict) else float(z[0][1])
    assert got == pytest.approx(want["cosine"][0][1], rel=1e-9)
    line = next(tr for tr in fig["data"] if tr.get("mode") == "lines+markers")
    assert numbers(line["y"]) == pytest.approx(want["pairs"][0]["per_layer"], rel=1e-9)


def test_measure_page_runs_the_ladder_a_record_of_other_inputs(roots):
    """The Measure page takes a record of other inputs (the symmetry ladder): the sidebar's
    pair, its rungs in order, nothing before Run; Run draws its figure and its table, whose
    align-to-self row reads 0.0000 and 0.0000, equal to the library's on the same split."""
    from rotviz.data.split import load_split
    from rotviz.measures.ladder import LadderPair, ladder

    a, s = str(roots / "vit-s0"), str(roots / "vit-s1")
    at = app("measure", anchor=a, source=s)
    at.selectbox(key="x_name").set_value("ladder").run()
    assert at.multiselect(key="x_ladder_specs").value == [
        "none", "ffn", "ffn,attn", "seed", "seed,heads", "weight", "act", "learned"]
    assert "Press **Run** to compute this section." in texts(at) and not figures(at)
    at.multiselect(key="x_ladder_specs").set_value(["none", "seed"])
    at.slider(key="x_ladder_points").set_value(3)
    at.button(key="FormSubmitter:measure_form-Run").click().run()
    assert not at.exception and not at.error, [e.value for e in at.error]
    _framed(figures(at)["The symmetry ladder: what each larger group of symmetries buys"])
    table = next(m.value for m in at.markdown if "align-to-self" in m.value)
    assert "| **align-to-self** | `seed` | 0.0000 | 0.0000 |" in table
    want = ladder(LadderPair.read([a, s], ["none", "seed"]),
                  load_split("digits", "test", 0).subset(N_EVAL), points=3)
    for r in want.rungs:
        assert f"| `{r['asked']}` | {r['barrier']:.4f} | {r['distance']:.4f} |" in table


def test_gallery_page_draws_a_figure_from_its_table_on_run(pair):
    """The Gallery page waits for Run; then each chosen figure is drawn from its table, as
    `rotviz figures` draws it, with its caption and the commands that make it."""
    from rotviz.gallery import entry

    at = app("gallery")
    assert not at.get("plotly_chart") and "Press **Run**" in texts(at)
    at.multiselect(key="g_names").set_value(["fig4_distances"])
    at.button[0].click().run()
    assert not at.exception, [e.message for e in at.exception]
    e = entry("fig4_distances")
    (fig,) = figures(at).values()
    assert fig["layout"]["title"]["text"] == e.title
    bars = dict(zip(fig["data"][0]["y"], numbers(fig["data"][0]["x"]), strict=True))
    assert bars["FFN + attention + rescale (seed paper)"] < bars["no matching"]
    assert e.caption in texts(at)
    code = "\n".join(c.value for c in at.code)
    assert f"rotviz distances {pair[0]} {pair[1]} --match seed" in code
