"""The `rotviz` command line. Every user error is one line on stderr and exit code 2."""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

from rotviz.errors import RotvizError


def _bool_flag(p: argparse.ArgumentParser, name: str, help: str) -> None:
    p.add_argument(f"--{name}", action=argparse.BooleanOptionalAction, default=True, help=help)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="rotviz", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    m = sub.add_parser("match", help="move SOURCE next to ANCHOR inside its symmetry class")
    m.add_argument("anchor", help="anchor model: a save_pretrained directory or zoo:NAME")
    m.add_argument("source", help="source model, same architecture")
    m.add_argument("--out", required=True, help="directory for the matched source (safetensors)")
    _bool_flag(m, "ffn", "match FFN neurons by permutation (default on)")
    _bool_flag(m, "attn", "match attention heads by Q-K and V-O rotations (default on)")
    _bool_flag(m, "rescale", "rescale Q-K and V-O per head (default on)")
    m.add_argument("--heads", action=argparse.BooleanOptionalAction, default=False,
                   help="permute heads by linear assignment before rotating them; needs --attn "
                        "(default off: the seed paper's method)")
    m.add_argument("--residual", action=argparse.BooleanOptionalAction, default=False,
                   help="also map the residual stream (rotation, centred rotation or "
                        "permutation, as the architecture allows), alternated with the others")
    m.add_argument("--residual-group", default="auto",
                   help="auto (the architecture's group), or a subgroup: permutation, centred")
    m.add_argument("--rounds", type=int, default=50,
                   help="with --residual: at most this many alternation rounds per phase "
                        "(default 50; each round costs about one seed matching on large "
                        "models, and fewer rounds leave a higher barrier: bench/rounds.py)")
    m.add_argument("--tol", type=float, default=1e-6,
                   help="with --residual: stop when a round gains less than this fraction of "
                        "the starting squared distance (default 1e-6)")
    m.add_argument("--ffn-backoff", action="store_true",
                   help="with --residual: after an FFN solve that moves no unit, hold the FFN "
                        "maps for 1, 2, 4, ... rounds while the others re-solve (rounds about "
                        "2.7x as fast on a LLaMA-1B-size pair; reaches another local "
                        "optimum)")
    m.add_argument("--act", action="store_true",
                   help="FFN and residual maps from activations on --data (training split)")
    m.add_argument("--learned", action="store_true",
                   help="then tune the rotations on --data so the path has no barrier")
    m.add_argument("--steps", type=int, default=300, help="learned matching steps (default 300)")
    m.add_argument("--data", default=None, help="data reference for --act / --learned")
    m.add_argument("--layers", default=None, help="layer subset, e.g. 0,2-5 (default: all)")
    m.add_argument("--report", default=None, help="write the full report as JSON here")
    m.add_argument("--device", default="auto", help="auto, cpu, cuda or mps (default auto)")
    m.set_defaults(func=cmd_match)
    for register in _extra_commands():
        register(sub)
    return parser


def _extra_commands():
    """Sub-commands contributed by other modules (zoo, eval, landscape, ...), if present."""
    import importlib

    out = []
    for mod in ("rotviz.cli_zoo", "rotviz.cli_landscape", "rotviz.cli_serve"):
        try:
            out.append(importlib.import_module(mod).register)
        except ModuleNotFoundError as e:
            if e.name != mod:
                raise
    return out


def cmd_match(args: argparse.Namespace) -> int:
    from rotviz.alternating import ended_by_cap
    from rotviz.matching import LearnOptions, MatchOptions, parse_layers
    from rotviz.models import load_model, pick_device, save_model, wide_device
    from rotviz.pipeline import match_models, stored_check_words

    if (args.act or args.learned) and not args.data:
        raise RotvizError("--act and --learned learn from data: add --data, e.g. --data digits")
    if args.steps < 1:
        raise RotvizError(f"--steps must be at least 1, got {args.steps}")
    if args.ffn_backoff and not args.residual:
        raise RotvizError("--ffn-backoff holds FFN maps between rounds of the residual "
                          "alternation: add --residual, or drop --ffn-backoff")
    device = pick_device(args.device)
    anchor = load_model(args.anchor)
    source = load_model(args.source)
    layers = parse_layers(args.layers, _n_layers(anchor))
    options = MatchOptions(args.ffn, args.attn, args.rescale, layers, heads=args.heads,
                           residual=args.residual, residual_group=args.residual_group,
                           rounds=args.rounds, tol=args.tol, ffn_backoff=args.ffn_backoff,
                           act=args.act, learned=args.learned,
                           learn=LearnOptions(steps=args.steps))
    out = match_models(anchor, source, options, device, data=args.data)
    rep = out.report
    if not out.preserved:
        raise RotvizError(f"{out.failure}; nothing written. Please report this as a bug.")
    report_json = json.dumps(rep.to_dict(), indent=2)
    save_model(source, out.state, args.out)
    if args.report:
        Path(args.report).parent.mkdir(parents=True, exist_ok=True)
        Path(args.report).write_text(report_json)
    rounds = ""
    if rep.residual and "rounds" in rep.residual:
        held = rep.residual.get("ffn_held", 0)
        capped = ended_by_cap(rep.residual)
        rounds = (f" ({rep.residual['rounds']} alternation rounds"
                  f"{f', {held} holding the FFN maps' if options.ffn_backoff else ''}"
                  f"{'; ended by --rounds, still gaining more than --tol' if capped else ''})")
    ran_on = wide_device(device)  # MPS has no float64: the solvers run on the CPU
    where = f"{ran_on}" + (f" ({device} has no float64)" if ran_on != device else "")
    print(
        f"matched [{options.label}] on {where}: "
        f"distance {rep.before.total:.4f} -> {rep.after.total:.4f} "
        f"in {rep.seconds:.2f} s{rounds}; max output difference {rep.max_output_diff:.2e}"
        f"{stored_check_words(rep)}; wrote {args.out}"
    )
    return 0


def write_json(path: str | os.PathLike, obj) -> None:
    """Write JSON atomically: a temporary file beside `path`, then a rename."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(obj, f, indent=2)
            f.write("\n")
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def _n_layers(loaded) -> int:
    from rotviz.view import resolve_layout

    return len(resolve_layout(loaded.spec, loaded.state).blocks)


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except RotvizError as e:
        print(f"rotviz: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("rotviz: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
