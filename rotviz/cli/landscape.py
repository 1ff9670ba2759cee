"""Command-line sub-commands `barrier`, `plane` and `merge` (registered by rotviz.cli).

Every user error is checked before any model is loaded where possible, and is one line.
JSON and model outputs are written to a temporary path and renamed, never half-written.
"""

from __future__ import annotations

import argparse
from contextlib import contextmanager

from rotviz.cli.args import (
    add_max_memory,
    add_overwrite,
    add_reading,
    beyond_memory,
    bounded,
    layers_text,
    needs,
    reading,
)
from rotviz.errors import RotvizError
from rotviz.limits import (
    ALPHA,
    BATCH_SIZE,
    BATCHES,
    GRID,
    MARGIN,
    POINTS,
    REPEATS,
    SEED,
    WEIGHT,
)


def _common(p: argparse.ArgumentParser, match_default: str = "seed") -> None:
    p.add_argument("anchor", help="anchor model (kept fixed): a model directory or zoo:NAME")
    p.add_argument("source", help="source model, same architecture; it is matched onto the anchor")
    p.add_argument("--data", required=True,
                   help="data reference: digits, pystdlib, text:FILE, csv:FILE, tsv:FILE, "
                        "jsonl:FILE, conll:FILE, hf:DIR, imagefolder:DIR or cifar10:DIR")
    p.add_argument("--split", default="test", help="split to evaluate on (default test)")
    add_reading(p)
    p.add_argument("--match", default=match_default, metavar="SPEC",
                   help="none, or a comma list of ffn, attn, rescale, heads, residual, act, "
                        "learned; seed = ffn,attn,rescale; weight = seed,heads,residual "
                        f"(data-free); act and learned train on --data (default {match_default})")
    p.add_argument("--layers", type=layers_text, default=None,
                   help="match only these layers, e.g. 0,2-5")
    p.add_argument("--device", default="auto", help="auto, cpu, cuda or mps (default auto)")
    p.add_argument("--json", default=None, metavar="FILE",
                   help="also write the result as JSON to this new file")
    add_overwrite(p)


def register(sub) -> None:
    b = sub.add_parser("barrier", help="loss and accuracy on the path anchor -> matched source")
    _common(b)
    b.add_argument("--points", type=bounded(POINTS), default=21,
                   help=f"number of alphas in [0, 1] (default 21, {POINTS.text})")
    b.add_argument("--repeats", type=bounded(REPEATS), default=1,
                   help="also report mean/std over this many disjoint seeded data subsets "
                        f"({REPEATS.text})")
    b.add_argument("--seed", type=bounded(SEED), default=None,
                   help="with --repeats: seed of the subsets (default 0)")
    b.add_argument("--batch-size", type=bounded(BATCH_SIZE), default=512,
                   help=f"evaluation batch size (default 512, {BATCH_SIZE.text})")
    add_max_memory(b, "run", "matched streamed and evaluated with both checkpoints held as "
                   "stored, each point built block by block", "always does")
    b.set_defaults(func=cmd_barrier)

    p = sub.add_parser("plane", help="2D loss grid through anchor, source and matched source")
    _common(p)
    p.add_argument("--grid", type=bounded(GRID), default=21,
                   help=f"grid points per axis (default 21, {GRID.text})")
    p.add_argument("--margin", type=bounded(MARGIN), default=0.25,
                   help="margin around the points, as a fraction of their span (default 0.25, "
                        f"{MARGIN.text})")
    p.add_argument("--batch-size", type=bounded(BATCH_SIZE), default=512,
                   help=f"evaluation batch size (default 512, {BATCH_SIZE.text})")
    add_max_memory(p, "run", "matched streamed and the plane evaluated with the three "
                   "checkpoints held as stored, each grid point built block by block",
                   "always does")
    p.set_defaults(func=cmd_plane)

    m = sub.add_parser("merge", help="merge the matched source into the anchor and evaluate it")
    _common(m)
    m.add_argument("--method", default="simple", help="simple, fisher or regmean (default simple)")
    m.add_argument("--out", default=None, metavar="DIR",
                   help="write the merged model to this new folder")
    m.add_argument("--weight", type=bounded(WEIGHT), default=0.5,
                   help="weight of the source in [0, 1] (default 0.5)")
    m.add_argument("--stats-split", default=None,
                   help="fisher and regmean: split for Fisher / Gram statistics (default train)")
    m.add_argument("--batches", type=bounded(BATCHES), default=None,
                   help=f"fisher and regmean: statistics batches (default 8, {BATCHES.text})")
    m.add_argument("--batch-size", type=bounded(BATCH_SIZE), default=None,
                   help="fisher and regmean: statistics batch size (default 32)")
    m.add_argument("--alpha", type=bounded(ALPHA), default=None,
                   help="regmean: scale of off-diagonal Gram entries in [0, 1] (default 0.9)")
    m.add_argument("--seed", type=bounded(SEED), default=None,
                   help="fisher and regmean: seed of the statistics batches (default 0)")
    add_max_memory(m, "run", "matched streamed, and the simple merge built, evaluated and "
                   "written block by block", "always does")
    m.set_defaults(func=cmd_merge)


def _outputs(args, command: str, out_dir: str | None = None):
    """The command's outputs, checked before any model is loaded (rotviz.outputs)."""
    from rotviz.cli.args import guard_inputs
    from rotviz.outputs import Outputs

    outputs = Outputs(command)
    guard_inputs(outputs, [args.anchor, args.source], args.data)
    folder = outputs.add(out_dir, "--out", folder=True, overwrite=args.overwrite)
    js = outputs.add(args.json, "--json", folder=False, overwrite=args.overwrite)
    return outputs, folder, js


def _write(outputs, folder, js, result: dict, command: str, model=None) -> None:
    """Write the JSON result and the model (template, state) as one transaction."""
    from rotviz.models import write_model
    from rotviz.outputs import write_json_file

    if not outputs.items:
        return
    with outputs.write() as tmp:
        if folder is not None:
            write_model(*model, tmp[folder])
        if js is not None:
            write_json_file(tmp[js], result, command)


def _load_pair(args):
    """Models, data, device and matching options, every part checked; SPEC errors come first."""
    from rotviz.analysis.ablations import n_layers
    from rotviz.devices import device_for, pick_device
    from rotviz.evaluation import split_for
    from rotviz.match.options import parse_layers
    from rotviz.match.selection import match_options
    from rotviz.models import check_compatible, load_model

    match_options(args.match)
    columns, seq_len = reading(args, args.data)
    device = device_for(pick_device(args.device))  # torchrun: each its local GPU
    anchor, source = load_model(args.anchor), load_model(args.source)
    check_compatible(anchor, source)
    split = split_for(anchor, args.data, args.split, seq_len=seq_len, columns=columns)
    options = match_options(args.match, parse_layers(args.layers, n_layers(anchor)))
    return anchor, source, split, device, options


@contextmanager
def _processes(device):
    """The torchrun process group (one process without torchrun), left at the end."""
    from rotviz import dist

    group = dist.init(device)
    try:
        yield group
    finally:
        dist.finish()


def _label(match: str, layers: list[int] | None) -> str:
    return match if layers is None else f"{match}, layers {','.join(map(str, layers))}"


def _at_size(args) -> bool:
    """Whether the pair must be matched streamed and evaluated block by block."""
    return beyond_memory(args)[0]


@contextmanager
def _sized_pair(args):
    """For a pair too large for memory: the source matched streamed into a temporary folder
    (rotviz.stream.match; the source itself with --match none), and what the sized
    evaluations need. Yields (group, anchor, matched folder, split, device, options, match
    info on rank 0); the folder is removed at the end."""
    import tempfile
    from pathlib import Path

    from rotviz.analysis.landscape import MatchInfo
    from rotviz.devices import device_for, pick_device
    from rotviz.evaluation import split_for
    from rotviz.match.options import parse_layers
    from rotviz.match.pipeline import Matched
    from rotviz.match.selection import label_of, match_options
    from rotviz.models import check_compatible
    from rotviz.stream.blocks import open_streamed, streamed_distance, streaming_refusal
    from rotviz.stream.match import match_streamed
    from rotviz.stream.sized import sized_loaded

    match_options(args.match)
    columns, seq_len = reading(args, args.data)
    device = device_for(pick_device(args.device))
    anchor, source = open_streamed(args.anchor), open_streamed(args.source)
    check_compatible(anchor, source)  # type: ignore[arg-type]  # duck-typed: meta state
    options = match_options(args.match, parse_layers(args.layers, source.dims.n_layers))
    why = None if options is None else streaming_refusal(options)
    if why:
        raise RotvizError(f"the pair is evaluated block by block (--max-memory), and {why}; "
                          "raise --max-memory or drop that option")
    split = split_for(sized_loaded(anchor), args.data, args.split, seq_len=seq_len,
                      columns=columns)
    with _processes(device) as group, tempfile.TemporaryDirectory(
            prefix="rotviz-matched-") as tmp:
        matched, info = args.source, None
        if options is not None:
            folder = Path(tmp) / "matched"
            if group.main:
                folder.mkdir()
            rep = match_streamed(anchor, source, folder if group.main else None, options,
                                 device, group=group)
            matched = group.share(str(folder))  # rank 0's folder, read by every rank
            if rep is not None:
                failure = Matched({}, rep).failure
                if failure:
                    raise RotvizError(f"{failure}; please report this as a bug")
                info = MatchInfo(label_of(options), rep.before.total, rep.after.total,
                                 rep.max_output_diff, rep.seconds, rep.before.to_dict(),
                                 rep.after.to_dict())
        elif group.main:
            d = streamed_distance(anchor, source)
            info = MatchInfo("none", d.total, d.total, 0.0, 0.0, d.to_dict(), d.to_dict())
        yield group, anchor, matched, split, device, options, info


def _sized_curve(args):
    """The barrier of a pair too large for memory: matched streamed, then evaluated with both
    checkpoints held as stored, each point of the path built block by block
    (rotviz.stream.sized). Rank 0 returns the curve."""
    from rotviz.analysis.landscape import layers_of
    from rotviz.stream.sized import sized_curve

    with _sized_pair(args) as (group, anchor, matched, split, device, options, info):
        c = sized_curve(args.anchor, matched, split, args.points, device, args.batch_size,
                        repeats=args.repeats, seed=args.seed or 0, group=group,
                        match_info=info, layers=layers_of(options))
    if c is not None:
        c.source = args.source
    return c


def cmd_barrier(args: argparse.Namespace) -> int:
    from rotviz.analysis.landscape import interpolate

    needs("--seed", args.seed is not None, "--repeats N with N >= 2 (it seeds the subsets)",
          args.repeats > 1)
    outputs, _, js = _outputs(args, "barrier")
    sized = _at_size(args)
    if sized:
        c = _sized_curve(args)
    else:
        anchor, source, split, device, options = _load_pair(args)
        with _processes(device) as group:
            c = interpolate(anchor, source, split, options, args.points, device,
                            repeats=args.repeats, seed=args.seed or 0,
                            batch_size=args.batch_size, group=group)
    if c is None:  # under torchrun, a rank other than 0: rank 0 writes and reports
        return 0
    _write(outputs, None, js, c.to_dict(), "barrier")
    how = " (at size: streamed, each point built block by block)" if sized else ""
    spread = f" (mean {c.barrier_mean:.4f} +- {c.barrier_std:.4f} over {c.repeats} subsets)" \
        if c.repeats > 1 else ""
    print(f"barrier [{_label(c.match, c.layers)}] on {c.device}{how}: {c.barrier:.4f}{spread}, "
          f"loss range "
          f"{c.loss_range:.4f}, accuracy at alpha 0.5 {c.mid_acc:.4f}; endpoint losses "
          f"{c.loss[0]:.4f} / {c.loss[-1]:.4f}; "
          f"distance {c.distance_before:.3f} -> {c.distance_after:.3f}; {len(c.alphas)} points "
          f"on {c.n} {c.split} samples in {c.seconds:.2f} s")
    return 0


def cmd_plane(args: argparse.Namespace) -> int:
    from rotviz.analysis.landscape import loss_plane

    outputs, _, js = _outputs(args, "plane")

    def show(done: int, total: int, _msg: str) -> None:
        if done == total or done % max(1, total // 10) == 0:
            print(f"\r  {done}/{total}", end="\n" if done == total else "", flush=True)

    sized = _at_size(args)
    if sized:
        from rotviz.analysis.landscape import layers_of
        from rotviz.match.selection import match_options
        from rotviz.stream.sized import sized_plane

        if match_options(args.match) is None:
            raise RotvizError("a plane at size (--max-memory) needs a matched source for its "
                              "second direction: give --match (e.g. seed) or raise --max-memory")
        with _sized_pair(args) as (group, _, matched, split, device, options, info):
            pl = sized_plane(args.anchor, args.source, matched, split, args.grid, args.margin,
                             device, args.batch_size, show if group.main else None, group,
                             info, layers_of(options))
        if pl is not None:
            pl.source = args.source
    else:
        anchor, source, split, device, options = _load_pair(args)
        with _processes(device) as group:
            pl = loss_plane(anchor, source, split, options, args.grid, args.margin, device,
                            progress=show if group.main else None,
                            batch_size=args.batch_size, group=group)
    if pl is None:  # under torchrun, a rank other than 0: rank 0 writes and reports
        return 0
    _write(outputs, None, js, pl.to_dict(), "plane")
    pts = ", ".join(f"{k} {pl.point_loss[k]:.3f}" for k in pl.points)
    how = " (at size: streamed, each point built block by block)" if sized else ""
    print(f"plane [{_label(pl.match, pl.layers)}] {pl.grid}x{pl.grid} on {pl.device}{how}: "
          f"losses {pts}; "
          f"|AB| {pl.distance_ab:.3f}, |AB'| {pl.distance_ab_matched:.3f}; {pl.seconds:.1f} s")
    return 0


def cmd_merge(args: argparse.Namespace) -> int:
    from rotviz.analysis.fusion import check_method, merge
    from rotviz.data import SPLITS

    method = check_method(args.method)
    stats = method != "simple"
    for flag, value in (("--stats-split", args.stats_split), ("--batches", args.batches),
                        ("--batch-size", args.batch_size), ("--seed", args.seed)):
        needs(flag, value is not None, "--method fisher or regmean (simple takes no "
              "statistics)", stats)
    needs("--alpha", args.alpha is not None, "--method regmean", method == "regmean")
    stats_split = "train" if args.stats_split is None else args.stats_split
    if stats_split not in SPLITS:
        raise RotvizError(f"unknown --stats-split '{stats_split}': use one of {', '.join(SPLITS)}")
    outputs, folder, js = _outputs(args, "merge", args.out)
    if _at_size(args):
        return _merge_at_size(args, method, outputs, folder, js)
    anchor, source, split, device, options = _load_pair(args)
    stats_data = split.sibling(stats_split) if stats else None
    given = {k: v for k, v in (("batches", args.batches), ("batch_size", args.batch_size),
                               ("alpha", args.alpha), ("seed", args.seed)) if v is not None}
    r = merge(anchor, source, method, options, split, stats_data, args.weight, device=device,
              **given)  # what is not given keeps merge's own defaults
    _write(outputs, folder, js, r.to_dict() | {"out": args.out}, "merge", (anchor, r.state))
    _say_merged(r, args.out)
    return 0


def _merge_at_size(args, method: str, outputs, folder, js) -> int:
    """merge for a pair too large for memory: the simple average, built block by block and
    written as shards (rotviz.stream.sized.sized_merge)."""
    from rotviz.analysis.landscape import layers_of
    from rotviz.outputs import write_json_file
    from rotviz.stream.sized import sized_merge

    if method != "simple":
        raise RotvizError(f"the pair is evaluated block by block (--max-memory), and --method "
                          f"{method} needs statistics of whole models; use --method simple or "
                          "raise --max-memory")
    with _sized_pair(args) as (group, _, matched, split, device, options, info):
        if not group.main:
            return 0
        with outputs.write() as tmp:
            r = sized_merge(args.anchor, matched, split, args.weight, device,
                            folder=tmp[folder] if folder is not None else None,
                            match_info=info, layers=layers_of(options))
            r.source = args.source
            if js is not None:
                write_json_file(tmp[js], r.to_dict() | {"out": args.out}, "merge")
    _say_merged(r, args.out, " (at size: streamed, built block by block)")
    return 0


def _say_merged(r, out: str | None, how: str = "") -> None:
    wrote = f"; wrote {out}" if out else ""
    print(f"merged [{r.method}, match {_label(r.match, r.layers)}, weight {r.weight:g}] on "
          f"{r.device}{how}: accuracy "
          f"{r.acc:.4f} (loss {r.loss:.4f}); anchor {r.anchor_acc:.4f}, source {r.source_acc:.4f}; "
          f"{r.seconds:.2f} s{wrote}")
