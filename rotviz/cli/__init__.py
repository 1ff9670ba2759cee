"""The `rotviz` command line. Every user error is one line on stderr and exit code 2."""

from __future__ import annotations

import argparse
import signal
import sys
import threading
import warnings
from contextlib import contextmanager
from dataclasses import replace

from rotviz.cli import figures, measure, serve, zoo
from rotviz.cli.args import (
    Parser,
    add_max_memory,
    add_overwrite,
    add_reading,
    beyond_memory,
    bounded,
    guard_inputs,
    layers_text,
    reading,
)
from rotviz.cli.measure import add_params
from rotviz.devices import calm_before_torch
from rotviz.errors import RotvizError
from rotviz.limits import (
    DEFAULT_ROUNDS,
    DEFAULT_STALL,
    DEFAULT_STEPS,
    DEFAULT_TOL,
    ROUNDS,
    STALL,
    STEPS,
    TOL,
)
from rotviz.match.options import MATCH_PARAMS
from rotviz.params import needs
from rotviz.sources import hf_cache as hub
from rotviz.symmetry.registry import SYMMETRIES
from rotviz.version import __version__


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The command line's parser. With `command` (the sub-command a command line names),
    only that sub-command is built: the whole tree (about 350 options) takes some 35 ms to
    build, on every call of `main`. A name that is no sub-command gets the whole tree, so
    argparse lists the choices exactly as before."""
    parser = Parser(prog="rotviz", description=__doc__)
    parser.add_argument("--version", action="version", version=f"rotviz {__version__}",
                        help="print rotviz's version and exit")
    sub = parser.add_subparsers(dest="command", required=True)

    def wanted(name: str) -> bool:
        return command is None or name == command

    if wanted("match"):
        _add_match(sub)
    for register in _extra_commands():
        register(sub, wanted)
    if command is not None and command not in sub.choices:
        return build_parser()
    return parser


def _add_match(sub) -> None:
    m = sub.add_parser("match", help="move SOURCE next to ANCHOR inside its symmetry class")
    m.add_argument("anchor", help=f"anchor model: {hub.MODEL_HELP}")
    m.add_argument("source", help="source model, same architecture (or a narrower FFN: "
                                  "then written in the anchor's width)")
    m.add_argument("--out", required=True,
                   help="new folder for the matched source (safetensors); see --overwrite")
    add_overwrite(m)
    m.add_argument("--also", action="append", default=None, metavar="MODEL=FOLDER",
                   help="repeatable: move MODEL, another model of the source's lineage (a "
                        "fine-tune: the source's architecture and shapes), by the very "
                        "element that matched the source, into the new FOLDER (split at the "
                        "first '='; the same output rules as --out). Each moved model's "
                        "function is checked and goes into --report's 'also' list. Not with "
                        "--learned, nor when the match runs at size (--max-memory, torchrun)")
    m.add_argument("--match", default=None, metavar="SPEC",
                   help="what to match, as the other commands say it: a comma list of ffn, "
                        "attn, rescale, heads, residual, act, learned; seed = ffn,attn,rescale; "
                        "weight = seed,heads,residual (default seed). The flags below are "
                        "sugar for it, and override it")
    for s in SYMMETRIES:  # one flag per registered symmetry (rotviz.symmetry.registry)
        needs_text = "".join(f"; needs --{r}" for r in s.requires)
        if s.needs_data:
            m.add_argument(f"--{s.name}", action="store_true", default=None,
                           help=f"{s.help}{needs_text}")
        else:
            m.add_argument(f"--{s.name}", action=argparse.BooleanOptionalAction,
                           default=None, help=f"{s.help}{needs_text} (default "
                                              f"{'on' if s.default else 'off'})")
    m.add_argument("--residual-group", default=None,
                   help="with --residual: auto (the architecture's group, the default), or a "
                        "subgroup: permutation, centred")
    m.add_argument("--rounds", type=bounded(ROUNDS), default=None,
                   help=f"with --residual: at most this many alternation rounds per phase "
                        f"(default {DEFAULT_ROUNDS}, at most {ROUNDS.hi:g}; each round costs "
                        "about one seed matching on large models, and fewer rounds leave a "
                        "higher barrier: bench/rounds.py)")
    m.add_argument("--tol", type=bounded(TOL), default=None,
                   help="with --residual: stop when a round gains less than this fraction of "
                        f"the starting squared distance (default {DEFAULT_TOL:g}, in [0, 1])")
    m.add_argument("--stall", type=bounded(STALL), default=None,
                   help="with --residual: also stop when a round gains less than this share "
                        f"of the total gain so far (default {DEFAULT_STALL:g}, in [0, 1]; 0: "
                        "only --tol and --rounds, the rule before it)")
    add_params(m, MATCH_PARAMS)  # what every command that matches takes (--time-limit)
    m.add_argument("--ffn-backoff", action="store_true",
                   help="with --residual: after an FFN solve that moves no unit, hold the FFN "
                        "maps for 1, 2, 4, ... rounds while the others re-solve (cheaper rounds "
                        "on large models, another local optimum: bench/RESULTS.md)")
    m.add_argument("--plain-rounds", action="store_true",
                   help="with --residual: the alternation as it was before joint steps on "
                        "rotation streams (per-layer maps, then one Procrustes step a round; "
                        "creeps on LLaMA-like streams: docs/solvers.md)")
    m.add_argument("--steps", type=bounded(STEPS), default=None,
                   help=f"with --learned: learned matching steps (default {DEFAULT_STEPS}, "
                        f"at most {STEPS.hi:g})")
    m.add_argument("--data", default=None, help="with --act or --learned: the data to learn from")
    add_reading(m)
    m.add_argument("--layers", type=layers_text, default=None,
                   help="layer subset, e.g. 0,2-5 (default: all)")
    m.add_argument("--report", default=None,
                   help="also write the full report as JSON to this new file")
    m.add_argument("--device", default="auto", help="auto, cpu, cuda or mps (default auto)")
    add_max_memory(m, "match", "matched at size instead, a block at a time from its "
                   "safetensors shards", "always does", ". Under torchrun the pair is always "
                   "matched at size, its blocks shared among the processes")
    m.set_defaults(func=cmd_match)


def _extra_commands():
    """The other sub-commands: zoo and eval, one per registered measurement
    (rotviz.cli.measure), figures (rotviz.cli.figures), serve. Each imports its
    heavy libraries inside its handlers, so `rotviz --help` stays fast."""
    return [zoo.register, measure.register, figures.register, serve.register]


def _selected(args: argparse.Namespace) -> None:
    """Resolve --match SPEC and the --x/--no-x flags into one boolean per symmetry on `args`:
    the SPEC (default: the registry's defaults, the seed paper's matching), then each flag
    given on top of it."""
    from rotviz.match.selection import parse_selection

    base = parse_selection(args.match) if args.match is not None else None
    if base is not None and base.is_none:
        raise RotvizError("--match none matches nothing: name what to match, e.g. --match seed")
    for s in SYMMETRIES:
        if getattr(args, s.name) is None:
            setattr(args, s.name, getattr(base, s.name) if base is not None else s.default)


def cmd_match(args: argparse.Namespace) -> int:
    from rotviz.data.reading import split_for
    from rotviz.devices import pick_device
    from rotviz.match.lineage import check_lineage, move_model
    from rotviz.match.options import LearnOptions, MatchOptions, limited, parse_layers
    from rotviz.match.pipeline import match_models, stored_check_words
    from rotviz.outputs import Outputs, write_json_file
    from rotviz.sources.loading import load_model
    from rotviz.sources.plain_torch import load_for_eval
    from rotviz.sources.writing import write_model

    _selected(args)
    if (args.act or args.learned) and not args.data:
        raise RotvizError("--act and --learned learn from data: add --data, e.g. --data digits")
    needs("--data", args.data is not None, "--act or --learned", args.act or args.learned)
    needs("--steps", args.steps is not None, "--learned", args.learned)
    for flag, given in (("--rounds", args.rounds is not None), ("--tol", args.tol is not None),
                        ("--stall", args.stall is not None),
                        ("--residual-group", args.residual_group is not None),
                        ("--ffn-backoff", args.ffn_backoff),
                        ("--plain-rounds", args.plain_rounds)):
        needs(flag, given, "--residual (it tunes the residual alternation)", args.residual)
    from rotviz.symmetry.residual import GROUPS

    if args.residual_group not in (None, "auto", *GROUPS):
        raise RotvizError(f"unknown --residual-group '{args.residual_group}': use auto, "
                          f"{', '.join(GROUPS)}")
    for s in SYMMETRIES:
        for r in s.requires:
            needs(f"--{s.name}", getattr(args, s.name), f"--{r}", getattr(args, r))
    options = MatchOptions(
        **{s.name: getattr(args, s.name) for s in SYMMETRIES},
        residual_group=args.residual_group or "auto",
        rounds=DEFAULT_ROUNDS if args.rounds is None else args.rounds,
        tol=DEFAULT_TOL if args.tol is None else args.tol, ffn_backoff=args.ffn_backoff,
        stall=DEFAULT_STALL if args.stall is None else args.stall,
        plain_rounds=args.plain_rounds,
        learn=LearnOptions(steps=DEFAULT_STEPS if args.steps is None else args.steps))
    options = limited(options, args.time_limit)
    also = [_also_pair(text) for text in args.also or []]
    if also and args.learned:
        raise RotvizError("--also moves other models by the element that matched the source, "
                          "and learned matching leaves none (it tunes its maps on the pair "
                          "itself); drop --learned or --also")
    outputs = Outputs("match")
    guard_inputs(outputs, [args.anchor, args.source, *(ref for ref, _ in also)], args.data)
    out_dir = outputs.add(args.out, "--out", folder=True, overwrite=args.overwrite)
    also_dirs = [outputs.add(out, "--also", folder=True, overwrite=args.overwrite)
                 for _, out in also]
    report_file = outputs.add(args.report, "--report", folder=False, overwrite=args.overwrite)
    columns, seq_len = reading(args, args.data)
    device = pick_device(args.device)
    if _streams(args, options):
        if also:
            raise RotvizError("--also needs the pair in memory, and this match runs at size "
                              "(--max-memory or torchrun); raise --max-memory, or move the "
                              "other models in a run that fits in memory")
        return _match_streamed(args, options, outputs, out_dir, report_file, device)
    # in plain torch where that computes the same logits (rotviz.sources.plain_torch: no
    # transformers import), as the measurement commands load their pair; written as transformers
    # writes it (write_model). Models moved along (--also) and their pair take transformers'
    # modules.
    load = load_model if also else load_for_eval
    anchor = load(args.anchor)
    source = load(args.source)
    others = [load_model(ref) for ref, _ in also]
    for other in others:  # refused before any matching
        check_lineage(source, other)
    options = replace(options, layers=parse_layers(args.layers, _n_layers(anchor)))
    data = args.data
    if data is not None:  # read the way the anchor reads it, with the reading options
        data = split_for(anchor, data, "train", seq_len=seq_len, columns=columns)
    out = match_models(anchor, source, options, device, data=data)
    rep = out.report
    if not out.preserved:
        raise RotvizError(f"{out.failure}; nothing written. Please report this as a bug.")
    if rep.widths and others:
        raise RotvizError("--also cannot move models by a narrower source's element (it embeds "
                          "the source in the anchor's width); match each fine-tune on its own")
    moved = [move_model(out, source, other, device) for other in others]
    for m in moved:
        if m.failure:
            raise RotvizError(f"{m.failure}; nothing written. Please report this as a bug.")
    template = anchor if rep.widths else source  # a narrower source, in the anchor's width
    with outputs.write() as tmp:
        write_model(template, out.state, tmp[out_dir])
        for other, m, folder in zip(others, moved, also_dirs, strict=True):
            write_model(other, m.state, tmp[folder])
        if report_file is not None:
            body = rep.to_dict()
            if also:
                body["also"] = [{**m.to_dict(), "output": str(folder.path)}
                                for m, folder in zip(moved, also_dirs, strict=True)]
            write_json_file(tmp[report_file], body, "match")
    _say_matched(args, options, rep, device)
    for (_, out_text), m in zip(also, moved, strict=True):
        print(f"moved {m.ref} by the same element: max output difference "
              f"{m.max_output_diff:.2e}{stored_check_words(m)}; wrote {out_text}")
    return 0


def _also_pair(text: str) -> tuple[str, str]:
    """--also MODEL=FOLDER, split at the first '='."""
    ref, eq, out = text.partition("=")
    if not eq or not ref.strip() or not out.strip():
        raise RotvizError(f"--also '{text}' is not MODEL=FOLDER; give the fine-tune and its new "
                          "folder, e.g. --also zoo:vit-digits-s6-ft=moved-ft")
    return ref, out


def _say_matched(args, options, rep, device, how: str = "") -> None:
    from rotviz.devices import wide_device
    from rotviz.match.alternating import ended_by_cap
    from rotviz.match.pipeline import stored_check_words

    rounds = ""
    if rep.residual and "rounds" in rep.residual:
        held = rep.residual.get("ffn_held", 0)
        capped = ended_by_cap(rep.residual)
        joint = rep.residual.get("joint_steps", 0)
        rounds = (f" ({rep.residual['rounds']} alternation rounds"
                  f"{f', {held} holding the FFN maps' if options.ffn_backoff else ''}"
                  f"{f', {joint} joint steps' if joint else ''}"
                  f"{'; ended by --rounds, still gaining more than --tol' if capped else ''})")
    ran_on = wide_device(device)  # MPS has no float64: the solvers run on the CPU
    where = f"{ran_on}" + (f" ({device} has no float64)" if ran_on != device else "")
    print(
        f"matched [{options.label}] on {where}{how}: "
        f"distance {rep.before.total:.4f} -> {rep.after.total:.4f} "
        f"in {rep.seconds:.2f} s{rounds}; max output difference {rep.max_output_diff:.2e}"
        f"{stored_check_words(rep)}; wrote {args.out}"
    )
    if rep.different_heads:  # two heads of one body: what was matched, what left alone
        print(rep.different_heads["summary"])
    if rep.residual and rep.residual.get("history"):
        from rotviz.match.alternating import summary_line

        print(summary_line(rep.residual))


def _streams(args, options) -> bool:
    """Whether this match runs at size: under torchrun, with --max-memory 0, or when the pair
    needs more than --max-memory (default: what the machine has available) in memory. A
    refusal when it must run at size and the options cannot."""
    from rotviz import dist
    from rotviz.match.at_size_checks import streaming_refusal

    launched = dist.launched()
    over, need, limit = (True, None, None) if launched else beyond_memory(args)
    if not over:
        return False
    why = streaming_refusal(options)
    if why:
        if launched:
            cause, fix = "torchrun shares a match among processes by streaming it", \
                "run it in one process"
        else:
            given = "--max-memory allows" if args.max_memory is not None else "available"
            cause = (f"the pair needs about {need / 1e9:.1f} GB in memory, more than the "
                     f"{limit / 1e9:.1f} GB {given}")
            fix = "raise --max-memory"
        raise RotvizError(f"{cause}, and {why}; {fix} or drop that option")
    return True


def _match_streamed(args, options, outputs, out_dir, report_file, device) -> int:
    from rotviz import dist
    from rotviz.atsize.blocks import open_streamed
    from rotviz.devices import device_for
    from rotviz.match.at_size import match_streamed
    from rotviz.match.options import parse_layers
    from rotviz.match.pipeline import Matched
    from rotviz.match.widths import differs_only_in_ffn, refuse_narrower
    from rotviz.outputs import write_json_file

    device = device_for(device)
    group = dist.init(device)
    try:
        anchor, source = open_streamed(args.anchor), open_streamed(args.source)
        if differs_only_in_ffn(anchor, source):
            refuse_narrower("it is embedded into the anchor's width in memory only, not block "
                            "by block (--max-memory, torchrun)", "raise --max-memory, in one "
                            "process")
        options = replace(options, layers=parse_layers(args.layers, source.dims.n_layers))
        if not group.main:
            match_streamed(anchor, source, None, options, device, group=group)
            return 0
        with outputs.write() as tmp:
            rep = match_streamed(anchor, source, tmp[out_dir], options, device, group=group)
            failure = Matched({}, rep).failure
            if failure:
                raise RotvizError(f"{failure}; nothing written. Please report this as a bug.")
            if report_file is not None:
                write_json_file(tmp[report_file], rep.to_dict(), "match")
    finally:
        dist.finish()
    how = f" (at size, a block at a time{f', {group.world} processes' if group.world > 1 else ''})"
    _say_matched(args, options, rep, device, how)
    return 0


def _n_layers(loaded) -> int:
    from rotviz.symmetry.view import resolve_layout

    return len(resolve_layout(loaded.spec, loaded.state).blocks)


class Terminated(BaseException):
    """SIGTERM (sent by `timeout`, torchrun and service managers), raised where the command
    is, so that every `finally` on the way out removes what it made, as for Ctrl-C."""


def _terminate(signum, frame) -> None:
    raise Terminated


@contextmanager
def _terminable():
    """SIGTERM raises Terminated while the command runs (main thread only: signal handlers
    can be set nowhere else), and the previous handler comes back after."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    before = signal.signal(signal.SIGTERM, _terminate)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, before)


def main(argv: list[str] | None = None) -> int:
    """Run one command; a user error is one line on stderr and exit code 2. An interrupt
    (exit 130) or SIGTERM (exit 143, 128 + 15 as a shell reports it) leaves no output and no
    temporary behind (rotviz.outputs)."""
    argv = sys.argv[1:] if argv is None else list(argv)
    calm_before_torch()
    try:  # from the start: an interrupt while the commands' modules load is one line too
        parser = build_parser(argv[0] if argv and not argv[0].startswith("-") else None)
        try:
            args = parser.parse_args(argv)
        except SystemExit as e:  # argparse: --help (0) or a one-line error (2)
            return e.code if isinstance(e.code, int) else 2
        with _terminable(), warnings.catch_warnings():
            if not sys.warnoptions:  # -W or PYTHONWARNINGS still shows them
                warnings.simplefilter("ignore")  # library warnings are no user's business
            return args.func(args)
    except RotvizError as e:
        print(f"rotviz: error: {' '.join(str(e).split())}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("rotviz: interrupted; nothing was written", file=sys.stderr)
        return 130
    except Terminated:
        print("rotviz: terminated; nothing was written", file=sys.stderr)
        return 143


if __name__ == "__main__":
    sys.exit(main())
