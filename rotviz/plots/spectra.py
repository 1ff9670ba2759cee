"""What matching saw and did inside attention: cross-matrix spectra and rotation angles."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from rotviz.plots import style

PAIRS = (("qk", "query-key (Q-K)"), ("vo", "value-output (V-O)"))
RANK = "singular value rank (1 = largest)"


def _two_panels() -> go.Figure:
    titles = [p[1] for p in PAIRS]
    return make_subplots(rows=1, cols=2, subplot_titles=titles, horizontal_spacing=0.1)


def singular_values(layer: Mapping, font_size: int = 14) -> go.Figure:
    """Per head, the singular values of the Q-K and V-O cross matrices of one layer.

    Their sum is what the Procrustes rotation gains: a flat, high spectrum means the two
    heads agree once rotated; a steep one means they share only a few directions.
    """
    fig = _two_panels()
    for col, (kind, _) in enumerate(PAIRS, start=1):
        for h, sv in enumerate(layer.get(f"{kind}_singular") or []):
            fig.add_scatter(
                x=list(range(1, len(sv) + 1)), y=[float(s) for s in sv], mode="lines+markers",
                name=f"head {h}", legendgroup=f"h{h}", showlegend=col == 1,
                line={"color": style.color(h), "dash": style.dash(h)},
                marker={"symbol": style.marker(h), "size": 6},
                hovertemplate=f"head {h}, #%{{x}}: %{{y:.3f}}<extra>{kind.upper()}</extra>",
                row=1, col=col,
            )
        fig.update_xaxes(title_text=RANK, row=1, col=col)
        fig.update_yaxes(title_text=style.SINGULAR, row=1, col=col)
    title = f"Layer {layer.get('layer', '?')}: singular values of the cross matrices, per head"
    return style.finish(fig, title, RANK, style.SINGULAR, "head", font_size)


def rotation_angles(layer: Mapping, font_size: int = 14) -> go.Figure:
    """Per head, the eigen-angles of the rotation matching applied (0° = left alone)."""
    fig = _two_panels()
    for col, (kind, _) in enumerate(PAIRS, start=1):
        angles = layer.get(f"{kind}_angles") or []
        dets = layer.get(f"{kind}_det") or [1.0] * len(angles)
        for h, ang in enumerate(angles):
            refl = float(dets[h]) < 0
            fig.add_scatter(
                x=[h] * len(ang), y=[float(a) for a in ang], mode="markers",
                name=f"head {h}", legendgroup=f"h{h}", showlegend=col == 1,
                marker={"symbol": "x" if refl else style.marker(h), "size": 9,
                        "color": style.color(h), "opacity": 0.8},
                hovertemplate=(f"head {h}: %{{y:.1f}}°" + (" (reflection)" if refl else "")
                               + f"<extra>{kind.upper()}</extra>"),
                row=1, col=col,
            )
        fig.update_xaxes(title_text=style.HEAD, dtick=1, row=1, col=col)
        fig.update_yaxes(title_text=style.ANGLE, range=[-5, 185], row=1, col=col)
    title = f"Layer {layer.get('layer', '?')}: rotation angles matching applied (× = reflection)"
    return style.finish(fig, title, style.HEAD, style.ANGLE, "head", font_size)


def angle_overview(layers: Sequence[Mapping], kind: str = "qk", font_size: int = 14) -> go.Figure:
    """Mean rotation angle per layer and head: where matching had to turn heads the most."""
    rows = [lay for lay in layers if lay.get(f"{kind}_angles")]
    z = [[float(np.mean(a)) for a in lay[f"{kind}_angles"]] for lay in rows]
    n_heads = max((len(r) for r in z), default=0)
    fig = go.Figure(go.Heatmap(
        z=z, x=list(range(n_heads)), y=[str(lay["layer"]) for lay in rows],
        colorscale=style.SEQUENTIAL, zmin=0, zmax=180, name="mean angle",
        colorbar={"title": {"text": "mean angle (degrees)", "side": "right"}},
        hovertemplate="layer %{y}, head %{x}: %{z:.1f}°<extra></extra>",
    ))
    fig.update_xaxes(dtick=1)
    title = f"{kind[0].upper()}-{kind[1].upper()}: mean rotation angle per layer and head"
    return style.finish(fig, title, style.HEAD, "layer (block index)", None, font_size,
                        legend=False)


def circuit_spectra(
    series: Mapping[str, Sequence[float]],
    title: str,
    font_size: int = 14,
    y_label: str = "singular value of the circuit matrix (unitless, log scale)",
) -> go.Figure:
    """Singular values of an invariant circuit (W_Qᵀ W_K or W_O W_V) for several models.

    These circuits do not change under the symmetries, so the source's curve and the matched
    source's curve coincide: the visible proof that matching kept the function.
    """
    fig = go.Figure()
    # Curves that coincide (source and matched source) must both stay visible: earlier ones
    # are drawn wide with open markers, later ones thin on top.
    n = len(series)
    for i, (name, sv) in enumerate(series.items()):
        fig.add_scatter(
            x=list(range(1, len(sv) + 1)), y=[float(s) for s in sv], mode="lines+markers",
            name=name,
            line={"color": style.color(i), "dash": style.dash(i), "width": 1.5 + 2 * (n - 1 - i)},
            marker={"symbol": style.marker(i) + ("-open" if i < n - 1 else ""),
                    "size": 6 + 4 * (n - 1 - i), "line": {"width": 2}},
            hovertemplate=f"{name} #%{{x}}: %{{y:.4g}}<extra></extra>",
        )
    style.log_axis(fig)
    return style.finish(fig, title, RANK, y_label, "model", font_size)
