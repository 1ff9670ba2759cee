"""Slices at size (rotviz.stream.slices): on endpoints streamed from checkpoint folders, each
point built block by block, they give the in-memory results, in the library and through
`--max-memory 0`. (That a slice's random directions do not depend on the order the tensors
are read in: tests/measures/test_slice.py; layer-wise barriers at size:
tests/measures/test_layerwise.py.)"""

from __future__ import annotations

import numpy as np
import pytest
from pairs import assert_close, default_pair_refs, synthetic_split

from rotviz import measure
from rotviz.atsize.blocks import open_streamed
from rotviz.atsize.endpoints import streamed_endpoints
from rotviz.cli import main
from rotviz.errors import RotvizError
from rotviz.match.endpoints import match_endpoints
from rotviz.sources.loading import load_model


@pytest.mark.parametrize("fam", ["vit", "gpt2"])
def test_streamed_slice_equals_in_memory(fam, saved):
    """Loss and accuracy at every grid point to 1e-5 (relative), a plane with filter norms
    and biases zeroed, a line with layer norms and biases kept; GPT-2's head is tied."""
    path = str(saved(fam, 0))
    model = load_model(path)
    split = synthetic_split(model, 8)
    held = match_endpoints(model, model, None)
    with streamed_endpoints(open_streamed(path), open_streamed(path), None, "cpu") as ends:
        assert ends.at_size
        for opts in ({"dims": 2, "grid": 3, "seed": 3},
                     {"dims": 1, "grid": 5, "norm": "layer", "biases": "keep", "span": 0.5}):
            want = measure("slice", held, split, **opts)
            got = measure("slice", ends, split, **opts)
            for k in ("loss", "acc", "centre_loss", "centre_acc"):
                assert_close(getattr(want, k), getattr(got, k), k)
            assert_close(want.direction_norms, got.direction_norms, "direction norms")
            assert (want.cosine is None) == (got.cosine is None)
            assert want.xs == got.xs and want.ys == got.ys and got.model == path
            spread = np.ptp(np.asarray(got.loss))
            assert spread > 1e-3  # the points really moved
        with pytest.raises(RotvizError, match="--directions hessian are built from the whole") as e:
            measure("slice", ends, split, dims=1, directions="hessian")
        assert "\n" not in str(e.value)


def test_cli_slice_at_size_refuses_hessian_directions(capsys):
    """Hessian directions need the whole model: refused at size in one line. (At size
    equals in memory for the slice: tests/measures/test_every_record.py.)"""
    args = ["slice", default_pair_refs()[0], "--data", "digits", "--dims", "1", "--grid", "3",
            "--device", "cpu"]
    assert main([*args, "--directions", "hessian", "--max-memory", "0"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--directions hessian" in err and "--max-memory" in err


