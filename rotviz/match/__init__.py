"""Matching: move the source next to the anchor inside its symmetry class.

`options` (what to match), `report` (what was found), `layers` (the seed paper's per-layer
maps), `alternating` (with the residual stream), `datamatch` and `learned` (from data),
`engine` (which of them a choice of options runs) and `pipeline` (loaded models in, a checked
state dict out).
"""
