"""The plain alternation's results on the tiny test pairs, pinned for tests/test_residual.py:
weight matching (`MatchOptions(heads=True, residual=True)`) with `plain_rounds=True`, the
alternation as it was before joint steps on rotation streams (at most 50 rounds per phase, tol
1e-6), on the pairs the `stream_model` fixture loads (seeds 0 and 1, float32, the sizes of
tests/conftest.py's TINY and each family's UNTIED options). The test checks that the default
alternation ends no higher; computing the plain rounds there would cost about 1 s a family.

    PYTHONPATH=. .venv/bin/python tests/plain_rounds.py   # re-record tests/data/plain_rounds.json
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

FILE = Path(__file__).resolve().parent / "data" / "plain_rounds.json"
FAMILIES = ("llama", "qwen2", "gpt-neox", "bert")  # rotation streams, and one permutation stream


def record() -> dict[str, float]:
    """The plain rounds' squared canonical distance after weight matching, per family."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from conftest import TINY, view_of

    from rotviz.arch import family_module
    from rotviz.match.engine import match
    from rotviz.match.options import MatchOptions
    from rotviz.random_models import save_random
    from rotviz.sources.loading import load_model

    out = {}
    with tempfile.TemporaryDirectory() as tmp:
        for fam in FAMILIES:
            extra = family_module(fam).UNTIED or {}
            pair = [view_of(load_model(save_random(fam, Path(tmp) / f"{fam}-{s}", seed=s,
                                                   **{**TINY, **extra})))
                    for s in (0, 1)]
            res = match(*pair, MatchOptions(heads=True, residual=True, plain_rounds=True))
            out[fam] = res.report.residual["objective"][-1]
    return out


if __name__ == "__main__":
    import torch

    torch.set_num_threads(1)
    FILE.write_text(json.dumps(record(), indent=1) + "\n")
    print(FILE.read_text())
