"""Merge: fuse the two models, with and without matching first."""

import streamlit as st

from pages import common
from rotviz.plots import merge as mplots
from rotviz.plots import style

s = common.setup()
st.title("Merge the two models")
st.markdown(
    "Fusing two models into one (for example averaging their weights) only works when their "
    "neurons and heads line up. Compare each fusion method on the raw pair and after matching."
)

with st.form("merge_form"):
    specs = st.multiselect("Matching before fusion", ["none", "ffn", "attn", "ffn,attn", "seed"],
                           ["none", "seed"], format_func=style.nice_label, key="g_specs",
                           bind="query-params")
    layers = st.text_input("Layers to match (empty = all)", "", key="g_layers",
                           bind="query-params")
    submitted = st.form_submit_button("Run", type="primary", icon=":material/play_arrow:")


def body() -> None:
    if not common.require_pair(s):
        return
    if not specs:
        st.warning("Pick at least one matching option.")
        return
    if not common.should_run("merge", submitted, s):
        st.info("Press **Run** to fuse the models.")
        return
    base = {**s.base(), "layers": layers.strip()}
    rows = []
    with common.progress("Fusing", len(specs)) as step:
        for sp in specs:
            step(f"average of anchor and source ({style.nice_label(sp)})")
            c = common.compute("curve", {**base, "spec": sp, "points": 3})
            rows.append({"method": "weight average", "matching": sp, "acc": c["mid_acc"],
                         "loss": c["mid_loss"], "max_output_diff": c["max_output_diff"]})
        ends = c
    refs = {"anchor": ends["acc"][0], "source": ends["acc"][-1]}
    fig = mplots.fusion_chart(rows, "acc", s.font, refs)
    common.chart(fig, "merge_chart")
    st.dataframe(rows, hide_index=True)
    common.export("merge", {"page": "merge", **base, "specs": specs}, {"rows": rows, **refs},
                  {"fusion": rows}, {"fusion": fig})


common.guard(body)
