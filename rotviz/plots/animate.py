"""Animated figures: plotly figures with frames, a play button and a slider (they play in the
app and in an HTML file), and each frame as a figure of its own (`frame_figure`: what GIF and
MP4 export draws, rotviz.animation).

- `path_animation`: the straight path from the anchor to the (matched) source as alpha
  moves: the loss curve grows point by point, beside the model's answers on a few fixed test
  inputs (images drawn as they are, text as its last characters);
- weight matching round by round (rotviz.measures.rounds) builds on `controls` and
  `padded_range`.

Every trace a frame changes is listed in the frame's `traces`; the others stay as drawn.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from rotviz.plots import style
from rotviz.plots.paths import path_title

RIGHT, WRONG = style.OKABE_ITO[2], style.OKABE_ITO[4]  # bluish green, vermillion
FRAME_MS = 400  # the play button's time per frame (the exports choose their own rate)


def padded_range(values: Sequence[float], pad: float = 0.08) -> list[float]:
    """An axis range over every frame's values (fixed while the frames play), with room."""
    lo, hi = float(np.min(values)), float(np.max(values))
    span = hi - lo or max(abs(hi), 1.0) * 0.1
    return [lo - pad * span, hi + pad * span]


def controls(fig: go.Figure, labels: Sequence[str], prefix: str) -> None:
    """A play/pause button and a slider with one step per frame (named by `labels`)."""
    play = {"frame": {"duration": FRAME_MS, "redraw": True}, "fromcurrent": True,
            "transition": {"duration": 0}}
    pause = {"frame": {"duration": 0, "redraw": False}, "mode": "immediate",
             "transition": {"duration": 0}}
    fig.update_layout(
        updatemenus=[{"type": "buttons", "direction": "left", "x": 0.0, "y": -0.12,
                      "xanchor": "left", "yanchor": "top", "showactive": False,
                      "buttons": [{"label": "▶ play", "method": "animate", "args": [None, play]},
                                  {"label": "❚❚ pause", "method": "animate",
                                   "args": [[None], pause]}]}],
        sliders=[{"active": 0, "x": 0.18, "len": 0.82, "y": -0.08, "yanchor": "top",
                  "currentvalue": {"prefix": prefix},
                  "steps": [{"label": lab, "method": "animate",
                             "args": [[str(k)], {**pause, "frame": {"duration": 0,
                                                                     "redraw": True}}]}
                            for k, lab in enumerate(labels)]}])


def frame_figure(fig: go.Figure, k: int) -> go.Figure:
    """Frame `k` of an animated figure as a still figure: the frame's traces put in place, the
    slider at `k`, no play button and no frames (what a GIF or MP4 frame is drawn from)."""
    still = go.Figure(data=fig.data, layout=fig.layout)  # not the frames: n copies of n
    frame = fig.frames[k]
    for i, tr in zip(frame.traces, frame.data, strict=True):
        still.data[i].update(tr.to_plotly_json())
    still.layout.updatemenus = ()
    if still.layout.sliders:
        still.layout.sliders[0].active = k
    return still


# ---- the path ----------------------------------------------------------------------------------


def _answer_text(ex: Mapping, j: int, i: int) -> tuple[str, str]:
    """What example `i` is answered at alpha index `j`, and the colour (right or wrong)."""
    name, prob = ex["pred_names"][j][i], ex["prob"][j][i]
    ok = ex["pred"][j][i] == ex["true"][i]
    return f"{name}  p={prob:.2f}", RIGHT if ok else WRONG


def path_animation(d: Mapping, font_size: int = 14, width: int = 900) -> go.Figure:
    """The path's animation from a barrier result (`Curve.to_dict()`): frame k holds the loss
    at the first k + 1 alphas and the answers on the fixed inputs (`examples`) at alpha k."""
    alphas, loss = [float(a) for a in d["alphas"]], [float(v) for v in d["loss"]]
    ex = d.get("examples") or {}
    k_ex = len(ex.get("true", []))
    images = bool(ex.get("images"))
    if k_ex and images:
        fig = make_subplots(rows=2, cols=k_ex, row_heights=[0.62, 0.38], vertical_spacing=0.16,
                            specs=[[{"colspan": k_ex}] + [None] * (k_ex - 1),
                                   [{} for _ in range(k_ex)]])
    elif k_ex:
        fig = make_subplots(rows=1, cols=2, column_widths=[0.6, 0.4], horizontal_spacing=0.08)
    else:
        fig = make_subplots(rows=1, cols=1)
    name = style.nice_label(str(d.get("match", "")))
    fig.add_scatter(x=alphas[:1], y=loss[:1], mode="lines+markers", name=f"test loss ({name})",
                    line={"color": style.color(3), "width": 2.5},
                    marker={"symbol": style.marker(0), "size": 7}, row=1, col=1)
    fig.add_scatter(x=alphas[:1], y=loss[:1], mode="markers", name="the model at α",
                    marker={"color": style.color(4), "symbol": "diamond", "size": 14,
                            "line": {"color": "#000000", "width": 1}}, row=1, col=1)
    fig.update_xaxes(range=[-0.03, 1.03], title_text=style.ALPHA, row=1, col=1)
    fig.update_yaxes(range=padded_range(loss), title_text=style.LOSS, row=1, col=1)
    moving = [0, 1]
    if k_ex and images:
        for i, img in enumerate(ex["images"]):
            fig.add_heatmap(z=img, colorscale="Greys", showscale=False, hoverinfo="skip",
                            row=2, col=i + 1)
        for i in range(k_ex):
            text, colour = _answer_text(ex, 0, i)
            n = len(ex["images"][i])
            fig.add_scatter(x=[(n - 1) / 2], y=[n + 0.6], mode="text", text=[text],
                            textfont={"color": colour, "size": font_size}, showlegend=False,
                            cliponaxis=False, hoverinfo="skip", row=2, col=i + 1)
            fig.update_xaxes(visible=False, row=2, col=i + 1)
            fig.update_yaxes(visible=False, autorange=False, range=[n + 1.4, -0.6],
                             row=2, col=i + 1)
            fig.add_annotation(text=f"true {ex['true_names'][i]}", showarrow=False,
                               xref=f"x{i + 2} domain", yref=f"y{i + 2} domain", x=0.5, y=1.12,
                               font={"size": font_size - 2})
        moving += list(range(2 + k_ex, 2 + 2 * k_ex))
    elif k_ex:
        ys = list(range(k_ex))[::-1]
        fig.add_scatter(x=[0.0] * k_ex, y=ys, mode="text", textposition="middle right",
                        text=[f"…{t!r}  (true {n})" for t, n in zip(ex["texts"], ex["true_names"],
                                                                       strict=True)],
                        showlegend=False, hoverinfo="skip", cliponaxis=False, row=1, col=2)
        texts = [_answer_text(ex, 0, i) for i in range(k_ex)]
        fig.add_scatter(x=[0.0] * k_ex, y=[y - 0.35 for y in ys], mode="text",
                        textposition="middle right", text=[t for t, _ in texts],
                        textfont={"color": [c for _, c in texts]}, showlegend=False,
                        hoverinfo="skip", cliponaxis=False, row=1, col=2)
        fig.update_xaxes(visible=False, range=[0, 1], row=1, col=2)
        fig.update_yaxes(visible=False, range=[-1, k_ex], row=1, col=2)
        moving.append(3)
    frames = []
    for j in range(len(alphas)):
        data = [go.Scatter(x=alphas[: j + 1], y=loss[: j + 1]),
                go.Scatter(x=[alphas[j]], y=[loss[j]])]
        if k_ex and images:
            for i in range(k_ex):
                text, colour = _answer_text(ex, j, i)
                data.append(go.Scatter(text=[text], textfont={"color": colour}))
        elif k_ex:
            texts = [_answer_text(ex, j, i) for i in range(k_ex)]
            data.append(go.Scatter(text=[t for t, _ in texts],
                                   textfont={"color": [c for _, c in texts]}))
        frames.append(go.Frame(name=str(j), data=data, traces=moving))
    fig.frames = frames
    what = path_title("Loss and answers", [str(d.get("match", ""))])
    style.finish(fig, what, style.ALPHA, style.LOSS, "", font_size,
                 height=620 if images else 480)
    fig.update_layout(width=width, legend={"orientation": "h", "x": 0, "y": 1.02,
                                           "yanchor": "bottom"},
                      margin={"l": 70, "r": 30, "t": 110, "b": 120})
    controls(fig, [f"{a:.2f}" for a in alphas], "α = ")
    return fig


# ---- the rounds --------------------------------------------------------------------------------
