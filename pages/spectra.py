"""Spectra: inside attention, what matching saw (cross-matrix singular values) and did
(rotation angles), per layer and head; and the invariant circuits that prove nothing changed."""

import streamlit as st

from pages import common
from rotviz.plots import spectra as splots
from rotviz.plots import style

s = common.setup()
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
    spec = c[0].selectbox("Matching", ATTN_SPECS, format_func=style.nice_label, key="s_spec",
                          bind="query-params")
    layers = c[1].text_input("Layers to match (empty = all)", "", key="s_layers",
                             bind="query-params")
    submitted = st.form_submit_button("Run", type="primary", icon=":material/play_arrow:")


@st.fragment
def per_layer(heads: list[dict], font: int) -> None:
    """Layer slider over results already computed (no recomputation)."""
    idx = [h["layer"] for h in heads]
    layer = st.select_slider("Layer", options=idx, value=idx[0], key="s_layer",
                             bind="query-params") if len(idx) > 1 else idx[0]
    lay = heads[idx.index(layer)]
    common.chart(splots.singular_values(lay, font), "spectra_sv")
    common.chart(splots.rotation_angles(lay, font), "spectra_angles")


def body() -> None:
    if not common.require_pair(s):
        return
    if not common.should_run("spectra", submitted, s):
        st.info("Press **Run** to match and show the spectra.")
        return
    cfg = {**s.base(), "layers": layers.strip(), "spec": spec}
    with common.progress("Matching", 2) as step:
        step(f"matching with {style.nice_label(spec)}")
        res = common.compute("match", cfg)
        step("invariant circuits")
        circuits = common.compute("circuits", cfg) if "circuits" in common.COMPUTE else None
    common.function_badge(res["max_output_diff"], res["tolerance"])
    heads = [h for h in res["report"]["heads"] if h.get("qk_singular")]
    if not heads:
        st.warning("This option set does not rotate attention heads.")
        return
    per_layer(heads, s.font)
    figs = {}
    c = st.columns(2)
    for col, kind in zip(c, ("qk", "vo"), strict=True):
        figs[f"angles_{kind}"] = splots.angle_overview(heads, kind, s.font)
        with col:
            common.chart(figs[f"angles_{kind}"], f"spectra_overview_{kind}")
    if circuits is not None:
        show_circuits(circuits)
    from rotviz import explore

    common.export("spectra", {"page": "spectra", **cfg}, {"match": res, "circuits": circuits},
                  {"heads": explore.head_rows(res)}, figs)


def show_circuits(circuits: dict) -> None:
    st.subheader("Invariant circuits: before vs after")
    st.markdown(
        "The products W_Qᵀ W_K (which pairs of tokens attend) and W_O W_V (what a head writes) "
        "do not change under the symmetries. Their singular values for the source and the "
        "matched source coincide: proof that matching kept the function, while the anchor's "
        "spectrum shows how different the two trained models really are."
    )


common.guard(body)
