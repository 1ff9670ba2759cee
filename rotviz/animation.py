"""Animations as files: HTML (the plotly figure with its frames, plotly.js inlined: it plays
offline), GIF and MP4 (for slides).

A GIF or MP4 frame is the animated figure at that frame (rotviz.plots.animate.frame_figure),
drawn as a PNG by `rotviz.plots.images.render`, every frame in one browser; imageio writes the GIF
(through Pillow) and imageio-ffmpeg's own ffmpeg binary, bundled in its wheel, encodes the
MP4 (H.264, yuv420p: what slide software plays). Nothing is downloaded: imageio-ffmpeg uses
the binary inside the package (or IMAGEIO_FFMPEG_EXE), and kaleido the installed Chromium.
"""

from __future__ import annotations

import io
import os
import tempfile
from collections.abc import Sequence
from typing import Any

from rotviz.errors import RotvizError
from rotviz.limits import FPS, FRAME_PIXELS

FORMATS = ("html", "gif", "mp4")
WIDTH, HEIGHT, RATE = 800, 500, 4  # a GIF or MP4's default frame size (pixels) and rate


def format_of(path: str | os.PathLike, flag: str = "--animation") -> str:
    """The animation format a file name asks for by its suffix, or a one-line error."""
    name = os.fspath(path)
    suffix = name.rsplit(".", 1)[-1].lower() if "." in name else ""
    if suffix in FORMATS:
        return suffix
    raise RotvizError(f"{flag} {name}: name the file .html, .gif or .mp4")


def why_not(fmt: str) -> str | None:
    """Why `fmt` cannot be written here (one line), or None when it can."""
    if fmt == "html":
        return None
    from rotviz.plots import images

    why = images.why_not()
    if why:
        return why.replace("static images", "GIF and MP4 frames")
    try:
        import imageio.v3  # noqa: F401
    except ImportError:
        return "GIF and MP4 need imageio (pip install 'rotviz[figures]')"
    if fmt == "mp4":
        try:
            import imageio_ffmpeg

            imageio_ffmpeg.get_ffmpeg_exe()
        except Exception:  # not installed, or its binary missing: it never downloads one
            return "MP4 needs imageio-ffmpeg with its bundled ffmpeg (pip install " \
                   "'rotviz[figures]')"
    return None


def check(fmt: str, width: int = WIDTH, height: int = HEIGHT, fps: int = RATE,
          flag: str = "--animation") -> None:
    """Refuse, in one line and before any work, what cannot be written: an unknown format,
    a missing browser or encoder, a frame size or rate out of bounds, an MP4 of odd size
    (H.264's yuv420p halves the colour planes)."""
    if fmt not in FORMATS:
        raise RotvizError(f"{flag}: no animation format '{fmt}'; use {', '.join(FORMATS)}")
    why = why_not(fmt)
    if why:
        raise RotvizError(f"{flag}: {why}, or name the file .html")
    for v in (width, height):
        FRAME_PIXELS.check(v)
    FPS.check(fps)
    if fmt == "mp4" and (width % 2 or height % 2):
        raise RotvizError(f"{flag}: an MP4 frame needs an even width and height, got "
                          f"{width} x {height}")


def frames(figure: Any, width: int = WIDTH, height: int = HEIGHT) -> list[bytes]:
    """Each frame of an animated figure as PNG bytes, `width` x `height` pixels, all drawn
    in one browser."""
    from rotviz.plots import images
    from rotviz.plots.animate import frame_figure

    if not figure.frames:
        raise RotvizError("the figure has no frames to animate")
    stills = [frame_figure(figure, k) for k in range(len(figure.frames))]
    return images.render(stills, "png", width, height)


def _arrays(pngs: Sequence[bytes]) -> list:
    import imageio.v3 as iio

    return [iio.imread(p)[..., :3] for p in pngs]  # RGB: the figures' background is opaque


def encode(pngs: Sequence[bytes], fmt: str, fps: int = RATE) -> bytes:
    """PNG frames as one GIF (looping) or MP4 file's bytes."""
    arrays = _arrays(pngs)
    if fmt == "gif":
        import imageio.v3 as iio

        buf = io.BytesIO()
        iio.imwrite(buf, arrays, extension=".gif", duration=int(1000 / fps), loop=0)
        return buf.getvalue()
    if fmt != "mp4":
        raise RotvizError(f"no video format '{fmt}'; use gif or mp4")
    import imageio_ffmpeg

    h, w = arrays[0].shape[:2]
    with tempfile.TemporaryDirectory(prefix="rotviz-mp4-") as tmp:
        path = os.path.join(tmp, "out.mp4")
        writer = imageio_ffmpeg.write_frames(path, (w, h), fps=fps, codec="libx264",
                                             pix_fmt_out="yuv420p", macro_block_size=1,
                                             ffmpeg_log_level="error")
        writer.send(None)  # start ffmpeg
        for a in arrays:
            writer.send(a.tobytes())
        writer.close()
        from rotviz.confine import ANYWHERE

        return ANYWHERE.read_bytes(path)  # ffmpeg's own output, read through the one door


def html(figure: Any) -> str:
    """A self-contained page of an animated figure: plotly.js inlined, so it plays offline."""
    return figure.to_html(include_plotlyjs=True, full_html=True, auto_play=False)


def render(figure: Any, fmt: str, width: int = WIDTH, height: int = HEIGHT,
           fps: int = RATE) -> bytes:
    """An animated figure as the bytes of an `fmt` file (html, gif or mp4)."""
    check(fmt, width, height, fps, "render")
    if fmt == "html":
        return html(figure).encode("utf-8")
    return encode(frames(figure, width, height), fmt, fps)


def write(path: str | os.PathLike, figure: Any, fmt: str, width: int = WIDTH,
          height: int = HEIGHT, fps: int = RATE) -> None:
    """An animated figure as `fmt` to the new file `path` (a temporary sibling: rotviz.outputs
    renames it into place)."""
    data = render(figure, fmt, width, height, fps)
    with open(path, "xb") as f:
        f.write(data)
