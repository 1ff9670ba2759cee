"""Animations (issue 29 item 3): the interpolation path as a plotly figure with frames
(rotviz.plots.animate), and the CLI's --animation. Each frame's data is checked against the
result and against plain computations written here. All on the default pair with few points
and few samples. GIF and MP4 are decoded back in tests/test_static_figures.py, whose browser
draws their frames too. Weight matching's rounds: tests/measures/test_rounds.py."""

from __future__ import annotations

import json
import re
from functools import cache

import numpy as np
import torch
from conftest import refused
from pairs import default_pair, default_pair_refs, digits

from rotviz import animation
from rotviz.match.endpoints import unmatched
from rotviz.measures import measurement
from rotviz.measures.barrier import curve_on
from rotviz.plots import images
from rotviz.runner import measure
from rotviz.sources.running import forward, probe_inputs


@cache
def path_result() -> dict:
    """The barrier of the pair as trained, 3 points on 40 test digits, answers on 3."""
    a, b = default_pair()
    return measure("barrier", unmatched(a, b), digits().subset(40), points=3,
                   examples=3).to_dict()


def test_the_path_frames_hold_the_curve_so_far_and_the_models_answers_at_alpha():
    d = path_result()
    a, b = default_pair()
    fig = measurement("barrier").animate(d)
    ex = d["examples"]
    assert len(fig.frames) == len(d["alphas"]) == 3 and len(ex["true"]) == 3
    x = digits().inputs[:3]
    key = next(iter(probe_inputs(a, 1)))  # the name of the model's input
    for k, frame in enumerate(fig.frames):
        alpha = d["alphas"][k]
        # the loss curve at frame k is the barrier's first k + 1 points
        assert list(frame.data[0].x) == d["alphas"][: k + 1]
        assert list(frame.data[0].y) == d["loss"][: k + 1]
        assert list(frame.data[1].y) == [d["loss"][k]]
        # the answers: those of the model at this alpha, computed plainly here
        state = {n: (1 - alpha) * a.state[n] + alpha * b.state[n] for n in a.state}
        probs = torch.softmax(forward(a, {key: x}, state).double(), -1)
        want = probs.argmax(-1)
        assert ex["pred"][k] == want.tolist()
        np.testing.assert_allclose(ex["prob"][k], probs.max(-1).values.numpy(), atol=1e-5)
        shown = [frame.data[2 + i].text[0] for i in range(3)]
        assert shown == [f"{int(p)}  p={q:.2f}" for p, q in zip(want, probs.max(-1).values,
                                                                 strict=True)]
    assert ex["true"] == digits().labels[:3].tolist()
    assert ex["images"][0] == [[round(float(v), 4) for v in row] for row in x[0, 0]]
    # a curve without examples reads as before: no `examples` key
    assert "examples" not in curve_on(unmatched(a, b), digits().subset(8), 3).to_dict()




def test_the_cli_writes_the_html_animation_and_refuses_in_one_line(capfd, ws, monkeypatch):
    from rotviz.cli import main

    a, b = default_pair_refs()
    pair = ["barrier", a, b, "--data", "digits"]
    assert main([*pair, "--match", "none", "--points", "3", "--animation", "path.html",
                 "--json", "b.json"]) == 0
    # --animation asks for what the animation needs (the record's animate_params): the
    # answers on 4 test inputs, which a barrier without --animation does not record
    ex = json.loads((ws / "b.json").read_text())["examples"]
    assert len(ex["true"]) == 4 and len(ex["pred"]) == 3
    page = (ws / "path.html").read_text()
    assert "plotly" in page and ".addFrames(" in page
    assert sorted(set(re.findall(r'"name":"(\d)"', page.replace(" ", "")))) == ["0", "1", "2"]
    refused([*pair, "--animation", "path.avi"], capfd, ws, "--animation path.avi",
            ".html, .gif or .mp4")
    refused([*pair, "--animation", "path.html"], capfd, ws, "path.html")  # exists: not ours
    refused(["rounds", a, b, "--data", "digits", "--match", "seed"], capfd, ws,
            "--match weight")  # before any model is loaded
    monkeypatch.setenv("BROWSER_PATH", str(ws / "no-such-browser"))
    refused([*pair, "--animation", "p.gif"], capfd, ws, "--animation", "Chrome or Chromium",
            "name the file .html")
    assert images.why_not() is not None and animation.why_not("html") is None
