"""Training: barriers over training and instability against the spawn step (Frankle et al.,
2020), the conserved quantities of the symmetries along a run (Zhao et al., 2023), and the
runs' paths on the loss surface of their principal directions (Li et al., 2018).

Its sections are the records of series that declare one on this page (rotviz.measures:
training, spawn, conserved, trajectory), composed by rotviz/ui/section.py with the page's
matchings and data (a record that takes no matching, conserved, gets none). They open on the
zoo's spawn series, so every chart runs out of the box; nothing computes before its Run is
pressed.
"""

from __future__ import annotations

import streamlit as st

from rotviz import app
from rotviz.app import figures
from rotviz.app.specs import SPEC_CHOICES
from rotviz.measures import Measurement
from rotviz.ui import section, sidebar

# the references each section opens on: the zoo's two runs, its spawn folder, and run a alone
# (conserved quantities; the zoo's SGD series, zoo:vit-digits-sgd, is their contrast)
REFS = {"training": {"series_a": ("Series A", "zoo:vit-digits-run-a"),
                     "series_b": ("Series B", "zoo:vit-digits-run-b")},
        "spawn": {"spawn_dir": ("Spawn folder", "zoo:vit-digits-spawn")},
        "conserved": {"series": ("Series", "zoo:vit-digits-run-a")},
        "trajectory": {"series_a": ("Series A", "zoo:vit-digits-run-a"),
                       "series_b": ("Series B (moved by the matching)",
                                    "zoo:vit-digits-run-b")}}

s = sidebar.setup()
st.title("Training: barriers, conserved quantities and paths")
st.markdown(
    "Frankle et al. (2020) asked when two runs that share their start stop ending up in "
    "different basins. **Over training**: two runs saved at the same steps, the barrier "
    "between them at each step. **Against the spawn step**: children copied from one parent "
    "run at step *k* and trained to the end in two data orders; once the barrier between "
    "them is zero, training is *stable* from *k* on. Each pair is matched (every matching "
    "you pick) and its barrier measured exactly as on the Barrier page. The defaults are the "
    "zoo's spawn series (a digits ViT); folders under the model roots work too "
    "(docs/landscape.md gives the layouts). **Conserved quantities**: what each continuous "
    "symmetry keeps fixed under gradient flow, and how far a real run (AdamW, weight decay) "
    "drifts from it; the zoo's SGD series `zoo:vit-digits-sgd` keeps them. **Trajectories**: "
    "a run's checkpoints on the loss surface of their top two principal directions, and a "
    "second run drawn on the same plane before and after matching."
)

c = st.columns([2, 1])
specs = c[0].multiselect("Matchings (one line each)", list(SPEC_CHOICES), ["none", "seed"],
                         format_func=figures.nice_label, key="t_specs", bind="query-params",
                         help="Each pair is measured once per matching.")
data = c[1].text_input("Data", "digits", key="t_data", bind="query-params",
                       help="The data the barriers are measured on (its test split).")
if not specs:
    st.warning("Pick at least one matching.")


def cfg_of(record: Measurement, values: dict, refs: list[str], spec: str | None = None
           ) -> dict:
    """A section's configuration: its references, the page's matchings and data."""
    return app.inputs_cfg({**s.base(), "data": data}, refs,
                          specs if record.inputs and record.inputs.default_specs else [], **values)


section.compose("training", s, "t", section.Hooks(cfg=cfg_of, refs=REFS, ready=bool(specs)))
