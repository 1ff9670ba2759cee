"""Command-line sub-commands `barrier`, `plane` and `merge` (registered by rotviz.cli).

Every user error is checked before any model is loaded where possible, and is one line.
JSON and model outputs are written to a temporary path and renamed, never half-written.
"""

from __future__ import annotations

import argparse

from rotviz.cli import write_json
from rotviz.errors import RotvizError


def _common(p: argparse.ArgumentParser, match_default: str = "seed") -> None:
    p.add_argument("anchor", help="anchor model (kept fixed): a model directory or zoo:NAME")
    p.add_argument("source", help="source model, same architecture; it is matched onto the anchor")
    p.add_argument("--data", required=True, help="data reference, e.g. digits")
    p.add_argument("--split", default="test", help="split to evaluate on (default test)")
    p.add_argument("--match", default=match_default, metavar="SPEC",
                   help="none, or a comma list of ffn, attn, rescale, heads, residual, act, "
                        "learned; seed = ffn,attn,rescale; weight = seed,heads,residual "
                        f"(data-free); act and learned train on --data (default {match_default})")
    p.add_argument("--layers", default=None, help="match only these layers, e.g. 0,2-5")
    p.add_argument("--device", default="auto", help="auto, cpu, cuda or mps (default auto)")
    p.add_argument("--json", default=None, metavar="FILE", help="write the result as JSON here")


def register(sub) -> None:
    b = sub.add_parser("barrier", help="loss and accuracy on the path anchor -> matched source")
    _common(b)
    b.add_argument("--points", type=int, default=21, help="number of alphas in [0, 1] (default 21)")
    b.add_argument("--repeats", type=int, default=1,
                   help="also report mean/std over this many disjoint seeded data subsets")
    b.add_argument("--seed", type=int, default=0, help="seed of the subsets (default 0)")
    b.add_argument("--batch-size", type=int, default=512, help="evaluation batch size")
    b.set_defaults(func=cmd_barrier)

    p = sub.add_parser("plane", help="2D loss grid through anchor, source and matched source")
    _common(p)
    p.add_argument("--grid", type=int, default=21, help="grid points per axis (default 21)")
    p.add_argument("--margin", type=float, default=0.25, help="margin around the points, "
                   "as a fraction of their span (default 0.25)")
    p.add_argument("--batch-size", type=int, default=512, help="evaluation batch size")
    p.set_defaults(func=cmd_plane)

    m = sub.add_parser("merge", help="merge the matched source into the anchor and evaluate it")
    _common(m)
    m.add_argument("--method", default="simple", help="simple, fisher or regmean (default simple)")
    m.add_argument("--out", default=None, metavar="DIR", help="write the merged model here")
    m.add_argument("--weight", type=float, default=0.5,
                   help="weight of the source in [0, 1] (default 0.5)")
    m.add_argument("--stats-split", default="train",
                   help="split for Fisher / Gram statistics (default train)")
    m.add_argument("--batches", type=int, default=8, help="statistics batches (default 8)")
    m.add_argument("--batch-size", type=int, default=32, help="statistics batch size (default 32)")
    m.add_argument("--alpha", type=float, default=0.9,
                   help="RegMean scale of off-diagonal Gram entries in [0, 1] (default 0.9)")
    m.add_argument("--seed", type=int, default=0, help="seed of the statistics batches")
    m.set_defaults(func=cmd_merge)


def _load_pair(args):
    """Models, data, device and matching options, every part checked; SPEC errors come first."""
    from rotviz.ablations import n_layers
    from rotviz.data import load_split
    from rotviz.matching import parse_layers
    from rotviz.matchspec import match_options
    from rotviz.models import check_compatible, load_model, pick_device

    match_options(args.match)
    device = pick_device(args.device)
    anchor, source = load_model(args.anchor), load_model(args.source)
    check_compatible(anchor, source)
    split = load_split(args.data, args.split)
    options = match_options(args.match, parse_layers(args.layers, n_layers(anchor)))
    return anchor, source, split, device, options


def _label(match: str, layers: list[int] | None) -> str:
    return match if layers is None else f"{match}, layers {','.join(map(str, layers))}"


def cmd_barrier(args: argparse.Namespace) -> int:
    from rotviz.landscape import check_points, interpolate

    check_points(args.points)
    if args.repeats < 1:
        raise RotvizError(f"--repeats must be >= 1, got {args.repeats}")
    anchor, source, split, device, options = _load_pair(args)
    c = interpolate(anchor, source, split, options, args.points, device, repeats=args.repeats,
                    seed=args.seed, batch_size=args.batch_size)
    if args.json:
        write_json(args.json, c.to_dict())
    spread = f" (mean {c.barrier_mean:.4f} +- {c.barrier_std:.4f} over {c.repeats} subsets)" \
        if c.repeats > 1 else ""
    print(f"barrier [{_label(c.match, c.layers)}] on {c.device}: {c.barrier:.4f}{spread}, "
          f"loss range "
          f"{c.loss_range:.4f}, accuracy at alpha 0.5 {c.mid_acc:.4f}; endpoint losses "
          f"{c.loss[0]:.4f} / {c.loss[-1]:.4f}; "
          f"distance {c.distance_before:.3f} -> {c.distance_after:.3f}; {len(c.alphas)} points "
          f"on {c.n} {c.split} samples in {c.seconds:.2f} s")
    return 0


def cmd_plane(args: argparse.Namespace) -> int:
    from rotviz.landscape import loss_plane

    if args.grid < 3:
        raise RotvizError(f"--grid must be >= 3, got {args.grid}")
    if args.margin < 0:
        raise RotvizError(f"--margin must be >= 0, got {args.margin}")
    anchor, source, split, device, options = _load_pair(args)

    def show(done: int, total: int, _msg: str) -> None:
        if done == total or done % max(1, total // 10) == 0:
            print(f"\r  {done}/{total}", end="\n" if done == total else "", flush=True)

    pl = loss_plane(anchor, source, split, options, args.grid, args.margin, device,
                    progress=show, batch_size=args.batch_size)
    if args.json:
        write_json(args.json, pl.to_dict())
    pts = ", ".join(f"{k} {pl.point_loss[k]:.3f}" for k in pl.points)
    print(f"plane [{_label(pl.match, pl.layers)}] {pl.grid}x{pl.grid} on {pl.device}: "
          f"losses {pts}; "
          f"|AB| {pl.distance_ab:.3f}, |AB'| {pl.distance_ab_matched:.3f}; {pl.seconds:.1f} s")
    return 0


def cmd_merge(args: argparse.Namespace) -> int:
    from rotviz.data import load_split
    from rotviz.fusion import check_method, check_weight, merge
    from rotviz.models import save_model

    method = check_method(args.method)
    check_weight(args.weight)
    if not 0.0 <= args.alpha <= 1.0:
        raise RotvizError(f"--alpha must be in [0, 1], got {args.alpha}")
    if args.batches < 1 or args.batch_size < 1:
        raise RotvizError("--batches and --batch-size must be >= 1")
    anchor, source, split, device, options = _load_pair(args)
    stats = load_split(args.data, args.stats_split) if method != "simple" else None
    r = merge(anchor, source, method, options, split, stats, args.weight, args.batches,
              args.batch_size, args.alpha, device, args.seed)
    if args.out:
        save_model(anchor, r.state, args.out)
    if args.json:
        write_json(args.json, r.to_dict() | {"out": args.out})
    wrote = f"; wrote {args.out}" if args.out else ""
    print(f"merged [{r.method}, match {_label(r.match, r.layers)}, weight {r.weight:g}] on "
          f"{r.device}: accuracy "
          f"{r.acc:.4f} (loss {r.loss:.4f}); anchor {r.anchor_acc:.4f}, source {r.source_acc:.4f}; "
          f"{r.seconds:.2f} s{wrote}")
    return 0
