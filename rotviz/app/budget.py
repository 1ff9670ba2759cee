"""A pair larger than the app's memory budget: whether a configuration runs at size (its
need from the safetensors headers against the budget), the checks a page makes of such a pair
without loading it, and a model's size and residual refusal read from its headers.

Importing this module imports nothing heavy: each function imports what it needs.
"""

from __future__ import annotations

from rotviz.app import summaries
from rotviz.app.resources import Resources, load_test_split
from rotviz.errors import RotvizError


def gb(n: int | None) -> str:
    """Bytes in words: GB from 0.1 GB up, MB below."""
    if n is None:
        return "an unknown amount"
    return f"{n / 1e9:.2f} GB" if n >= 1e8 else f"{n / 1e6:.1f} MB"


def check_pair_at_size(res: Resources, cfg: dict, loss: bool = True) -> None:
    """`check_pair` for a pair read block by block: both folders opened for streaming (their
    headers and configs checked as the command line checks them), matchable, and the data
    read as the anchor reads it, with no weights loaded (not read where `needs_data` says
    so: no `loss` and a head no loss scores)."""
    from rotviz.atsize.blocks import open_streamed
    from rotviz.atsize.points import sized_loaded
    from rotviz.data.reading import check_fits
    from rotviz.sources.pairs import check_compatible

    a = open_streamed(cfg["anchor"], res.confined())
    b = open_streamed(cfg["source"], res.confined())
    check_compatible(a, b)  # type: ignore[arg-type]  # duck-typed: meta state
    skeleton = sized_loaded(a)
    if not loss and not all(summaries.is_scored(m) for m in (a, b)):  # reads config only
        return  # a pair no loss scores, on a page that needs none: no data to check
    check_fits(skeleton, load_test_split(cfg["data"], int(cfg.get("seed", 0)),
                                         int(cfg.get("n_eval", 0)), skeleton, res.confined()))


def at_size(res: Resources, cfg: dict) -> tuple[bool, int | None, int | None]:
    """Whether the configuration's models must be read block by block: (at size, what
    holding them needs, the budget), in bytes. The budget is `max_memory` (bytes; absent or
    0: what the machine has free now), and the need is the command line's estimate from the
    safetensors headers (rotviz.atsize.need.pair_bytes_in_memory); one model (`ref`)
    needs half its pair. A folder without safetensors cannot stream and is never at size."""
    from rotviz.atsize.need import pair_bytes_in_memory
    from rotviz.memory import available_memory

    one = cfg.get("ref")
    anchor, source = (one, one) if one else (cfg.get("anchor"), cfg.get("source"))
    if not anchor or not source:
        return False, None, None
    limit = int(cfg.get("max_memory") or 0) or available_memory()
    need = pair_bytes_in_memory(anchor, source, res.confined())
    if need is not None and one:
        need //= 2
    return need is not None and limit is not None and need > limit, need, limit


def params_in(res: Resources, ref: str) -> int:
    """The parameters of model `ref`, from its safetensors headers when it has them (nothing
    loaded: a model larger than memory is counted too), else from the loaded model."""
    from rotviz.sources.checkpoint import Checkpoint
    from rotviz.sources.loading import resolve_ref

    try:
        checkpoint = Checkpoint(resolve_ref(ref, res.confined()), res.confined())
    except RotvizError:
        return summaries.n_params(res.load_eval(ref))
    total = 0
    for e in checkpoint.entries.values():
        n = 1
        for d in e.shape:
            n *= d
        total += n
    return total


def residual_why(res: Resources, ref: str, sized: bool = False) -> str | None:
    """Why this model's residual stream cannot be matched (a tied output head, ...), or None;
    at size, asked of the model's skeleton (no weights read)."""
    if not sized:
        return summaries.residual_unsupported(res.load_eval(ref))
    from rotviz.atsize.blocks import open_streamed
    from rotviz.atsize.points import sized_loaded
    from rotviz.heads import residual_refusal
    from rotviz.symmetry.residual import unsupported
    from rotviz.symmetry.view import read_view

    skeleton = sized_loaded(open_streamed(ref, res.confined()))  # weights on meta: no data
    return residual_refusal(skeleton.config) or \
        unsupported(read_view(skeleton.spec, skeleton.config, skeleton.state))
