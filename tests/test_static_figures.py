"""Static figures out of the box: PNG, SVG and PDF drawn by kaleido in the system Chromium
that set-up installs (rotviz.plots.images), and `--figure FILE` on every measurement that draws its
result. One browser draws all three formats here; the ladder's CLI test draws its SVG."""

from __future__ import annotations

import io
import struct
import xml.etree.ElementTree as ET

import pytest
from conftest import refused

from rotviz.plots import images

needs_browser = pytest.mark.skipif(images.why_not() is not None,
                                   reason=str(images.why_not()))


def _figure():
    import plotly.graph_objects as go

    from rotviz.plots.style import OKABE_ITO

    fig = go.Figure(go.Scatter(x=[0, 1, 2], y=[2.0, 0.5, 1.5], mode="lines",
                               line={"color": OKABE_ITO[1], "width": 8}, name="curve"))
    fig.update_layout(title="A drawn figure", xaxis_title="alpha", yaxis_title="loss (nats)",
                      template="plotly_white")
    return fig, OKABE_ITO[1]


def _animated():
    """An animated figure of three frames (weight matching's rounds, drawn from numbers made
    up here: what is tested is the export)."""
    from rotviz.measures.rounds import rounds_animation
    from rotviz.plots.animate import frame_figure

    d = {"alphas": [0.0, 0.5, 1.0], "rounds": [
        {"phase": 0, "round": r, "distance": 10.0 - r, "barrier": 2.0 - 0.5 * r,
         "loss": [0.2, 2.2 - 0.5 * r, 0.2], "mid_acc": 0.5} for r in range(3)]}
    fig = rounds_animation(d)
    return [frame_figure(fig, k) for k in range(len(fig.frames))]


@needs_browser
def test_png_svg_and_pdf_are_drawn_at_the_asked_size_in_one_browser(tmp_path):
    """Also the frames of an animation, in the same browser, then encoded as GIF and MP4
    (rotviz.animation) and decoded back: frame count, size, first and last frames differ."""
    from PIL import Image

    fig, colour = _figure()
    stills = _animated()
    png, svg, pdf, *frames = images.draw([(fig, "png"), (fig, "svg"), (fig, "pdf")]
                                         + [(f, "png") for f in stills], width=400,
                                         height=300, scale=2)
    # PNG: the header's size is the asked size times the scale, and the curve's colour is drawn
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    assert struct.unpack(">II", png[16:24]) == (800, 600)
    pixels = Image.open(io.BytesIO(png)).convert("RGB")
    want = tuple(int(colour.lstrip("#")[i:i + 2], 16) for i in (0, 2, 4))
    assert pixels.getcolors(1 << 20) is not None
    found = {c for _, c in pixels.getcolors(1 << 20)}
    assert want in found, (want, sorted(found)[:5])
    # SVG: a well-formed document of the asked size, with the title and axis titles as text
    root = ET.fromstring(svg)
    assert (root.get("width"), root.get("height")) == ("800", "600")  # scaled too
    text = " ".join(t.text or "" for t in root.iter() if t.tag.endswith("text"))
    for words in ("A drawn figure", "alpha", "loss (nats)"):
        assert words in text
    # PDF: one page of 800 x 600 CSS pixels, 600 x 450 points (a point is 4/3 of a pixel)
    assert pdf.startswith(b"%PDF-") and pdf.rstrip().endswith(b"%%EOF")
    assert b"/MediaBox [0 0 600 450]" in pdf
    _gif_and_mp4(frames, tmp_path)


def _gif_and_mp4(frames: list[bytes], tmp_path) -> None:
    import imageio.v3 as iio
    import imageio_ffmpeg
    import numpy as np

    from rotviz import animation

    assert len(frames) == 3
    gif = iio.imread(animation.encode(frames, "gif", fps=5), index=None, extension=".gif")
    assert gif.shape[:3] == (3, 600, 800)
    assert np.abs(gif[0].astype(int) - gif[-1].astype(int)).max() > 0
    path = tmp_path / "a.mp4"
    path.write_bytes(animation.encode(frames, "mp4", fps=5))
    reader = imageio_ffmpeg.read_frames(str(path))
    meta = next(reader)
    decoded = [np.frombuffer(f, np.uint8).reshape(600, 800, 3) for f in reader]
    assert tuple(meta["size"]) == (800, 600) and len(decoded) == 3
    assert meta["fps"] == 5
    assert np.abs(decoded[0].astype(int) - decoded[-1].astype(int)).max() > 30


def test_a_figure_format_is_checked_before_any_work(capfd, ws, monkeypatch):
    pair = ["barrier", "zoo:vit-digits-s3", "zoo:vit-digits-s6", "--data", "digits"]
    refused([*pair, "--figure", "b.jpg"], capfd, ws, "--figure b.jpg", ".png, .svg or .pdf")
    monkeypatch.setenv("BROWSER_PATH", str(ws / "no-such-browser"))
    refused([*pair, "--figure", "b.png"], capfd, ws, "--figure", "Chrome or Chromium",
            "name the file .html")
    refused(["ladder", "zoo:vit-digits-s3", "zoo:vit-digits-s6", "--data", "digits",
             "--figure", "l.pdf"], capfd, ws, "Chrome or Chromium")
    # HTML needs no browser
    assert images.format_of("b.HTML") == "html"
    images.check_format("html")


def test_kaleidos_start_up_race_is_retried_and_nothing_else(monkeypatch):
    """kaleido's tab may evaluate in the page it opened with, before its own script (then
    `kaleido_scopes is not defined`): the drawing runs again in a fresh browser, up to
    UNREADY_TRIES times; any other error is raised at once."""
    calls = []

    def flaky(coro, fail=(images.UNREADY, images.UNREADY)):
        coro.close()  # the drawing itself is not what is tested here
        calls.append(1)
        if len(calls) <= len(fail):
            raise RuntimeError(f"ReferenceError: {fail[len(calls) - 1]} at <anonymous>:1:26")
        return [b"png"]

    monkeypatch.setattr(images, "why_not", lambda: None)
    monkeypatch.setattr(images, "_run", flaky)
    assert images.render(["fig"]) == [b"png"] and len(calls) == 3
    calls.clear()
    monkeypatch.setattr(images, "_run", lambda coro: flaky(coro, ("x is not defined",)))
    with pytest.raises(RuntimeError, match="x is not defined"):
        images.render(["fig"])
    assert len(calls) == 1
    calls.clear()
    monkeypatch.setattr(images, "_run", lambda coro: flaky(coro, (images.UNREADY,) * 3))
    with pytest.raises(RuntimeError, match=images.UNREADY):
        images.render(["fig"])
    assert len(calls) == images.UNREADY_TRIES
