"""Record the squared canonical distance at which weight matching ended under the stopping
rule before `stall` (MatchOptions(stall=0): only `tol` and `rounds`), on the tiny pairs of
tests/test_residual.py (seeds 0 and 1, heads on for the families of tests/data/plain_rounds.json,
as that test matches them) and on the default pair (weight matching, heads on). The tests
check that the default rule ends within 0.5% of these distances.

    PYTHONPATH=. .venv/bin/python tests/old_rule.py   # re-record tests/data/old_rule.json
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
FILE = HERE / "data" / "old_rule.json"


def record() -> dict[str, float]:
    sys.path.insert(0, str(HERE))
    from conftest import TINY
    from pairs import default_pair

    from rotviz.arch import FAMILIES, family_module
    from rotviz.match.options import MatchOptions
    from rotviz.match.pipeline import match_models
    from rotviz.random_models import save_random
    from rotviz.sources.loading import load_model

    plain = json.loads((HERE / "data" / "plain_rounds.json").read_text())
    out = {}
    with tempfile.TemporaryDirectory() as tmp:
        for fam in FAMILIES:
            extra = family_module(fam).UNTIED
            if extra is None:
                continue
            pair = [load_model(save_random(fam, Path(tmp) / f"{fam}-{s}", seed=s,
                                           **{**TINY, **extra})) for s in (0, 1)]
            options = MatchOptions(heads=fam in plain, residual=True, stall=0.0)
            out[fam] = match_models(*pair, options).report.residual["objective"][-1]
    res = match_models(*default_pair(), MatchOptions(heads=True, residual=True, stall=0.0),
                       "cpu").report.residual
    out["default pair"] = res["objective"][-1]
    return out


if __name__ == "__main__":
    import torch

    torch.set_num_threads(1)
    FILE.write_text(json.dumps(record(), indent=1) + "\n")
    print(FILE.read_text())
