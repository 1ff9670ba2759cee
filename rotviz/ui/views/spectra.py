"""Spectra: inside attention, what matching saw (cross-matrix singular values) and did
(rotation angles), per layer and head; and the invariant circuits that prove nothing changed."""

import streamlit as st

from rotviz import app
from rotviz.app import figures
from rotviz.app.summaries import head_rows
from rotviz.limits import MAX_LAYERS_TEXT
from rotviz.plots.figure_style import Style
from rotviz.ui import run, runtime, show, sidebar

s = sidebar.setup()
st.title("Attention spectra")
st.markdown(
    "For each head, matching builds a small *cross matrix* from the two models' query and key "
    "weights (Q-K), and one from the value and output weights (V-O), and rotates the source's "
    "head by the orthogonal factor of that matrix. Large, flat singular values mean the two "
    "heads agree well once rotated; the angles say how far each head had to turn."
)
ATTN_SPECS = ("seed", "ffn,attn", "attn")

with st.form("spectra_form"):
    c = st.columns(2)
    spec = c[0].selectbox("Matching", ATTN_SPECS, format_func=figures.nice_label, key="s_spec",
                          bind="query-params")
    layers = c[1].text_input("Layers to match (empty = all)", "", key="s_layers",
                             max_chars=MAX_LAYERS_TEXT, bind="query-params")
    submitted = st.form_submit_button("Run", type="primary", icon=":material/play_arrow:")


@st.fragment
def per_layer(heads: list[dict], circuits: dict, style: Style) -> None:
    """Layer slider and head picker over results already computed (no recomputation)."""
    idx = [h["layer"] for h in heads]
    c = st.columns([3, 1])
    with c[0]:
        layer = st.select_slider("Layer", options=idx, value=idx[0], key="s_layer",
                                 bind="query-params") if len(idx) > 1 else idx[0]
    lay = heads[idx.index(layer)]
    n_heads = len(lay["qk_singular"])
    head = c[1].selectbox("Head (invariant circuits)", list(range(n_heads)), key="s_head",
                          bind="query-params")
    show.chart(figures.singular_values(lay, style), "spectra_sv")
    show.chart(figures.rotation_angles(lay, style), "spectra_angles")
    st.subheader("Invariant circuits: before vs after")
    st.markdown(
        "The products W_Qᵀ W_K (which tokens attend to which) and W_O W_V (what a head writes "
        "back) do not change under the symmetries. For the source and the matched source their "
        "singular values coincide: proof that matching kept the function. The anchor's "
        "spectrum shows how different the two trained models really are."
    )
    by_layer = {c["layer"]: c for c in circuits["layers"]}
    cl = by_layer.get(layer)
    if cl is None:
        st.info("This layer was not part of the computation.")
        return
    cols = st.columns(2)
    for col, kind, title in zip(cols, ("qk", "vo"), ("Q-K circuit W_Qᵀ W_K", "V-O circuit W_O W_V"),
                                strict=True):
        series = {"anchor": cl[f"anchor_{kind}"][head], "source": cl[f"source_{kind}"][head]}
        if cl.get(f"matched_{kind}"):
            series["matched source"] = cl[f"matched_{kind}"][head]
        with col:
            show.chart(figures.circuit_spectra(series, f"{title}, layer {layer}, head {head}",
                                                 style), f"spectra_circuit_{kind}")


def body() -> None:
    if not run.require_pair(s, loss=False):  # the weights only: any head, or none
        return
    if not run.should_run("spectra", submitted, s):
        st.info("Press **Run** to match and show the spectra.")
        return
    cfg = app.measure_cfg(s.base(), spec, layers)
    with show.progress("Matching", 2) as step:
        step(f"matching with {figures.nice_label(spec)}")
        res = runtime.compute("match", cfg)
        step("cross matrices and invariant circuits")
        circuits = runtime.compute("spectra", cfg)
    show.function_badge(res["max_output_diff"], res["tolerance"])
    change = circuits.get("max_circuit_change")
    if change is not None:
        ok = change <= 1e-4
        st.badge(f"invariant circuits {'unchanged' if ok else 'CHANGED'}: largest relative change "
                 f"of a circuit singular value, source → matched source: {change:.1e}",
                 color="green" if ok else "red",
                 icon=":material/check_circle:" if ok else ":material/cancel:")
    heads = [h for h in res["report"]["heads"] if h.get("qk_singular")]
    if not heads:
        st.warning("This option set does not rotate attention heads.")
        return
    per_layer(heads, circuits, s.style())
    st.subheader("All layers at a glance")
    figs = {}
    for lay in heads:  # every layer's figures go into the export, not only the one shown
        figs[f"singular_values_layer{lay['layer']}"] = figures.singular_values(lay, s.style())
        figs[f"rotation_angles_layer{lay['layer']}"] = figures.rotation_angles(lay, s.style())
    c = st.columns(2)
    for col, kind in zip(c, ("qk", "vo"), strict=True):
        figs[f"angles_{kind}"] = figures.angle_overview(heads, kind, s.style())
        with col:
            show.chart(figs[f"angles_{kind}"], f"spectra_overview_{kind}")
    circuit_rows = [
        {"layer": lay["layer"], "head": h, "circuit": kind, "model": who, "singular_values": sv}
        for lay in circuits["layers"] for kind in ("qk", "vo")
        for who in ("anchor", "source", "matched")
        for h, sv in enumerate(lay.get(f"{who}_{kind}") or [])
    ]
    show.export("spectra", {"page": "spectra", **cfg}, {"match": res, "circuits": circuits},
                  {"heads": head_rows(res), "circuits": circuit_rows}, figs)


run.guard(body)
