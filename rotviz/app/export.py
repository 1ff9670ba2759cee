"""What the app's export buttons write: JSON, CSV, standalone figures and a whole run as a
zip, with the library versions that produced it, so a downloaded result can be read and
reproduced without the app.
"""

from __future__ import annotations

import csv
import io
import json
import math
import platform
import zipfile
from collections.abc import Mapping, Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from rotviz.app.cache import config_hash


def versions() -> dict[str, str]:
    """Versions of python and the libraries a result depends on."""
    import importlib.metadata as md

    out = {"python": platform.python_version(), "platform": platform.platform()}
    libs = ("rotviz", "torch", "transformers", "timm", "numpy", "scipy", "plotly", "streamlit")
    for name in libs:
        try:
            out[name] = md.version(name)
        except md.PackageNotFoundError:
            if name == "rotviz":
                from rotviz.version import __version__

                out[name] = __version__
    return out


def jsonable(obj: Any) -> Any:
    """Plain JSON types for numpy arrays, tensors, dataclasses and paths; NaN/Inf as null."""
    import dataclasses

    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return jsonable(dataclasses.asdict(obj))
    if isinstance(obj, Mapping):
        return {str(k): jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [jsonable(x) for x in obj]
    if hasattr(obj, "tolist"):  # numpy arrays and scalars, torch tensors
        return jsonable(obj.tolist())
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, Path):
        return str(obj)
    return obj


def to_json(obj: Any) -> str:
    """Strict JSON, as the command line's `--json` (rotviz.outputs.write_json_file):
    `jsonable` has made every non-finite number null, and allow_nan=False keeps it so."""
    return json.dumps(jsonable(obj), indent=2, sort_keys=False, allow_nan=False)


def rows_to_csv(rows: Sequence[Mapping[str, Any]]) -> str:
    """A table (list of flat dicts) as CSV; columns in first-seen order."""
    cols: list[str] = []
    for r in rows:
        cols.extend(k for k in r if k not in cols)
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=cols, lineterminator="\n")
    w.writeheader()
    for r in rows:
        w.writerow({k: jsonable(v) for k, v in r.items()})
    return buf.getvalue()


def figure_html(fig: Any) -> str:
    """A self-contained HTML page of a plotly figure (plotly.js inlined: works offline)."""
    from rotviz.plots.images import html

    return html(fig)


def static_formats() -> tuple[str, ...]:
    """('png', 'svg', 'pdf') where kaleido and a Chrome or Chromium are installed, else ()
    (rotviz.plots.images)."""
    from rotviz.plots.images import available

    return available()


def figure_image(fig: Any, fmt: str) -> bytes:
    """PNG, SVG or PDF bytes of a figure (rotviz.plots.images), or a one-line error saying what is
    missing."""
    from rotviz.plots.images import render

    return render([fig], fmt)[0]


def animation_formats() -> tuple[str, ...]:
    """The animation files this machine can write: html always, gif and mp4 where kaleido, a
    Chromium, imageio and imageio-ffmpeg are installed (rotviz.animation)."""
    from rotviz.animation import FORMATS, why_not

    return tuple(f for f in FORMATS if why_not(f) is None)


def animation_file(fig: Any, fmt: str) -> bytes:
    """An animated figure as HTML, GIF or MP4 bytes (rotviz.animation), or a one-line error
    saying what is missing."""
    from rotviz.animation import render

    return render(fig, fmt)


def measurement_animation(name: str, result: Mapping[str, Any]) -> Any:
    """The animated figure a registered measurement's record makes of its result, or None
    when the record does not animate (`Measurement.animate`)."""
    from rotviz.measures import measurement

    record = measurement(name)
    return record.animate(result) if record.animate else None


def measurement_files(name: str, result: Mapping[str, Any], style: Any = None
                      ) -> tuple[dict[str, list[dict]], dict[str, Any]]:
    """The tables and figures a registered measurement's record makes of its result (as
    plain data, `rotviz.app.run(name, ...)`), its figure drawn in the page's `style`
    (rotviz.plots.figure_style.Style; None: the default): what its export holds besides the
    JSON."""
    from rotviz.measures import measurement

    record = measurement(name)
    tables = {name: record.rows(result)} if record.rows else {}
    figures = {name: record.figure(result, style)} if record.plot else {}
    return tables, figures


def measurement_zip(name: str, config: Mapping[str, Any], result: Mapping[str, Any],
                    images: bool = True) -> bytes:
    """A measurement's whole run as a zip (`run_zip`), its table and figure from its record."""
    tables, figures = measurement_files(name, result)
    anim = measurement_animation(name, result)
    return run_zip(config, {name: result}, tables, figures, images,
                   {name: anim} if anim is not None else None)


def run_zip(
    config: Mapping[str, Any],
    results: Mapping[str, Any],
    tables: Mapping[str, Sequence[Mapping[str, Any]]] | None = None,
    figures: Mapping[str, Any] | None = None,
    images: bool = True,
    animations: Mapping[str, Any] | None = None,
) -> bytes:
    """A whole run as a zip: config.json, versions.json, results.json, tables as CSV, figures
    as HTML, and as PNG (`images`, where kaleido and a Chromium are installed: rotviz.plots.images),
    and animated figures as HTML that plays offline (a GIF or MP4 is a download of its own:
    drawing every frame takes a second or more each)."""
    buf = io.BytesIO()
    stamp = datetime.now(timezone.utc).isoformat(timespec="seconds")
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr("config.json", to_json({"config": config, "hash": config_hash(config),
                                           "exported": stamp}))
        z.writestr("versions.json", to_json(versions()))
        z.writestr("results.json", to_json(results))
        for name, rows in (tables or {}).items():
            z.writestr(f"tables/{name}.csv", rows_to_csv(rows))
        figures = dict(figures or {})
        for name, fig in figures.items():
            z.writestr(f"figures/{name}.html", figure_html(fig))
        for name, fig in (animations or {}).items():
            z.writestr(f"animations/{name}.html", animation_file(fig, "html"))
        if images and figures and static_formats():  # all drawn in one browser
            from rotviz.plots.images import render

            for name, png in zip(figures, render(list(figures.values()), "png"), strict=True):
                z.writestr(f"figures/{name}.png", png)
    return buf.getvalue()
