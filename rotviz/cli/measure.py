"""One sub-command per registered measurement (rotviz.measures), generated from its record:
`barrier`, `plane`, `merge`, `distances`, `spectra`, and whatever a plug-in registers.
A record whose `inputs` are series or a spawn folder (training, spawn) takes those as its
positional arguments and `--match SPEC` once per matching; one of N models (many) takes
them all as its last positional argument and one `--match SPEC`.

Every command takes the pair, `--match SPEC` and `--layers`, the device and `--json`; those
that evaluate take `--data`, `--split` and the reading options; those that write a model take
`--out`; each then takes its record's parameters, bounded by rotviz.limits. Every user error
is checked before any model is loaded where possible, and is one line. Outputs are written to
a temporary path and renamed, never half-written. The record itself runs through the one
runner (rotviz.runner), as the library and the app run it: this module keeps the command
line's own part (argparse, the outputs, torchrun's processes, the progress line).
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from contextlib import contextmanager

from rotviz.cli.args import (
    add_max_memory,
    add_overwrite,
    add_reading,
    beyond_memory,
    layers_text,
    reading,
)
from rotviz.errors import RotvizError
from rotviz.match.options import MATCH_PARAMS
from rotviz.measures import Measurement, measurements
from rotviz.params import Param
from rotviz.sources import hf_cache


def _param_type(p: Param):
    """An argparse type that parses and checks one parameter (its bound or choices)."""

    def parse(text: str):
        try:
            return p.parse(text)
        except RotvizError as e:
            raise argparse.ArgumentTypeError(str(e)) from None

    parse.__name__ = p.flag
    if p.bound is not None:
        parse.bound = p.bound  # type: ignore[attr-defined]  # tests read the bound back
    return parse


def add_params(parser: argparse.ArgumentParser, params: tuple[Param, ...]) -> None:
    """One option per parameter; its default is None, so that the command knows what was
    given (the record's defaults fill the rest). A yes/no choice is also a switch: the flag
    alone means yes (`--repair`, `--learn`), as a user of any other tool would type it."""
    for p in params:
        metavar = "NAME" if p.choices else (p.metavar or None)
        switch = {"nargs": "?", "const": "yes"} if set(p.choices) == {"yes", "no"} else {}
        parser.add_argument(p.flag, dest=p.name, type=_param_type(p), default=None,
                            metavar=metavar, help=p.help, **switch)


def register(sub, wanted: Callable[[str], bool] = lambda name: True) -> None:
    """A sub-command for every registered measurement (that `wanted` names)."""
    for m in measurements():
        if not wanted(m.name):
            continue
        p = sub.add_parser(m.name, help=m.describe(), description=m.describe())
        if m.inputs is not None:
            _inputs_parser(p, m)
            continue
        if m.pair:
            p.add_argument("anchor",
                           help=f"anchor model (kept fixed): {hf_cache.MODEL_HELP}")
            p.add_argument("source",
                           help="source model, same architecture; it is matched onto the anchor")
        else:
            p.add_argument("model", help=f"the model: {hf_cache.MODEL_HELP}")
        if m.data:
            p.add_argument("--data", required=True,
                           help="data reference: digits, pystdlib, text:FILE, csv:FILE, "
                                "tsv:FILE, jsonl:FILE, conll:FILE, hf:DIR, imagefolder:DIR or "
                                "cifar10:DIR")
            p.add_argument("--split", default="test", help="split to evaluate on (default test)")
            add_reading(p)
        else:
            p.add_argument("--data", default=None,
                           help="with --match act or learned: the data to learn from")
            add_reading(p)
        if not m.pair and m.source is not None:
            p.add_argument("--source", default=None, metavar="MODEL",
                           help=f"a second model of the same architecture ({hf_cache.MODEL_HELP}), "
                                "matched onto the model with --match; only for "
                                f"{m.source_use or 'the options that use it'}")
        if m.pair or m.source is not None:
            with_source = "" if m.pair else " (with --source)"
            p.add_argument("--match", default=m.match_default if m.pair else None,
                           metavar="SPEC",
                           help="none, or a comma list of ffn, attn, rescale, heads, residual, "
                                "act, learned; seed = ffn,attn,rescale; weight = "
                                "seed,heads,residual (data-free); act and learned train on "
                                f"--data (default {m.match_default}){with_source}")
            p.add_argument("--layers", type=layers_text, default=None,
                           help=f"match only these layers, e.g. 0,2-5{with_source}")
            add_params(p, MATCH_PARAMS)  # the matching's own options (--time-limit)
        else:
            p.set_defaults(match="none", layers=None, time_limit=None)
        p.add_argument("--device", default="auto", help="auto, cpu, cuda or mps (default auto)")
        if m.writes_model:
            p.add_argument("--out", default=None, metavar="DIR",
                           help="write the model the command makes (the merge, the "
                                "teleported model) to this new folder")
        p.add_argument("--json", default=None, metavar="FILE",
                       help="also write the result as JSON to this new file")
        _figure_option(p, m)
        _animation_option(p, m)
        for f in m.files:
            p.add_argument(f.flag, dest=_dest(f), default=None, metavar="FILE", help=f.help)
        add_overwrite(p)
        add_params(p, m.parameters())
        if m.at_size is not None:
            add_max_memory(p, "run", m.at_size_help, "always does")
        else:
            add_max_memory(p, "run", f"refused ({m.why_not_at_size()})", "is refused too")
        p.set_defaults(func=lambda args, m=m: run_command(m, args))


def _figure_option(p: argparse.ArgumentParser, m: Measurement) -> None:
    """--figure FILE, for a record that draws its result (`Measurement.plot`)."""
    if m.plot is not None:
        p.add_argument("--figure", default=None, metavar="FILE",
                       help="also draw the result into this new file: .html (interactive, "
                            "opens offline), .png, .svg or .pdf (kaleido and Chromium)")
    else:
        p.set_defaults(figure=None)


def _animation_option(p: argparse.ArgumentParser, m: Measurement) -> None:
    """--animation FILE, for a record that animates its result (`Measurement.animate`)."""
    if m.animate is not None:
        p.add_argument("--animation", default=None, metavar="FILE",
                       help="also write the result's animation into this new file: .html "
                            "(plays offline), .gif or .mp4 (for slides; kaleido and Chromium "
                            "draw the frames)")
    else:
        p.set_defaults(animation=None)


def _drawing_output(outputs, args, name: str, module: str, check: str):
    """(the output of --figure or --animation (`name`), its format), checked before any
    work by `module`'s format_of and `check`, or None where it is not given."""
    import importlib

    path = getattr(args, name, None)
    if path is None:
        return None
    drawing = importlib.import_module(module)
    fmt = drawing.format_of(path)
    getattr(drawing, check)(fmt)
    return outputs.add(path, f"--{name}", folder=False, overwrite=args.overwrite), fmt


def _check_drawings(outputs, args) -> None:
    """--figure's and --animation's outputs, checked before any work, kept on `args` for
    `_write_drawings`."""
    args.figure_output = _drawing_output(outputs, args, "figure", "rotviz.plots.images",
                                         "check_format")
    args.animation_output = _drawing_output(outputs, args, "animation", "rotviz.animation",
                                            "check")


def _write_drawings(m: Measurement, tmp, args, result) -> None:
    """The record's figure (--figure) and animation (--animation) of `result`, either may
    be absent, into their outputs' temporary siblings."""
    if args.figure_output is not None:
        from rotviz.plots.images import write

        (item, fmt) = args.figure_output
        write(tmp[item], m.figure(result), fmt)
    if args.animation_output is not None:
        from rotviz.animation import write as write_animation

        (item, fmt) = args.animation_output
        write_animation(tmp[item], m.animate(result.to_dict()), fmt)


def _dest(f) -> str:
    """The argparse name of a record's further file (--mergekit-config: mergekit_config)."""
    return f.flag.lstrip("-").replace("-", "_")


def _files_given(m: Measurement, args) -> list:
    """The record's further files (`Measurement.files`) whose option was given."""
    return [f for f in m.files if getattr(args, _dest(f), None) is not None]


def _inputs_parser(p: argparse.ArgumentParser, m: Measurement) -> None:
    """A record that takes series or a spawn folder (`Measurement.inputs`): its positional
    arguments, --data, --match once per matching, and the rest as for a pair."""
    assert m.inputs is not None
    for i, (name, text) in enumerate(m.inputs.args):
        last = i == len(m.inputs.args) - 1
        p.add_argument(name, help=text, nargs="+" if last and m.inputs.least else None)
    if m.data:  # a record of the weights alone (conserved) takes no data
        p.add_argument("--data", required=True,
                       help="data reference: digits, pystdlib, text:FILE, csv:FILE, tsv:FILE, "
                            "jsonl:FILE, conll:FILE, hf:DIR, imagefolder:DIR or cifar10:DIR")
        p.add_argument("--split", default="test", help="split to evaluate on (default test)")
        add_reading(p)
    default = " and ".join(m.inputs.default_specs)
    if not m.inputs.default_specs:
        p.set_defaults(match=None)
    elif m.inputs.one_spec:
        p.add_argument("--match", action="append", default=None, metavar="SPEC",
                       help="the matching that aligns the models (once): a comma list of ffn, "
                            "attn, rescale, heads, residual, act, learned; seed = "
                            "ffn,attn,rescale; weight = seed,heads,residual (data-free) "
                            f"(default {default})")
    else:
        what = m.inputs.spec_help or "a matching to measure each pair with, once per matching"
        if m.inputs.spec_help:
            default = ", ".join(m.inputs.default_specs)
        p.add_argument("--match", action="append", default=None, metavar="SPEC",
                       help=f"{what}: none, or a comma list of ffn, attn, rescale, heads, "
                            "residual, act, learned; seed = ffn,attn,rescale, weight = "
                            f"seed,heads,residual (default {default})")
    if m.inputs.default_specs:  # a record that matches: its matchings take the limit too
        add_params(p, MATCH_PARAMS)
    else:
        p.set_defaults(time_limit=None)
    p.add_argument("--device", default="auto", help="auto, cpu, cuda or mps (default auto)")
    p.add_argument("--json", default=None, metavar="FILE",
                   help="also write the result as JSON to this new file")
    _figure_option(p, m)
    _animation_option(p, m)
    add_overwrite(p)
    add_params(p, m.parameters())
    add_max_memory(p, "run", f"refused ({m.why_not_at_size()})", "is refused too")
    p.set_defaults(func=lambda args, m=m: run_inputs_command(m, args))


def run_inputs_command(m: Measurement, args: argparse.Namespace) -> int:
    """Read the inputs, check the outputs, run the record through the one runner
    (rotviz.runner.run_inputs), write the JSON and drawings, say the result in a line; at
    size (a pair larger than --max-memory), the record's refusal in one line."""
    from rotviz import runner
    from rotviz.cli.args import guard_inputs
    from rotviz.confine import ANYWHERE
    from rotviz.data.reading import split_for
    from rotviz.devices import device_for, pick_device
    from rotviz.match.options import limited_specs
    from rotviz.match.selection import match_options
    from rotviz.outputs import Outputs, write_json_file

    assert m.inputs is not None
    given = {p.name: getattr(args, p.name) for p in m.parameters()}
    m.values(given)  # a bad value first, before any file is read
    refs: tuple[str, ...] = ()
    for name, _ in m.inputs.args:  # the last may hold several references (Inputs.least)
        got = getattr(args, name)
        refs += tuple(got) if isinstance(got, list) else (got,)
    inputs = m.inputs.read(refs, args.match, ANYWHERE)  # SPECs and folders: one line each
    limited_specs([match_options(s) for s in args.match or m.inputs.default_specs],
                  args.time_limit)
    first = inputs.first_pair()
    outputs = Outputs(m.name)
    further = [given[n] for n in m.models if given.get(n)]  # a merge's base: an input too
    data = args.data if m.data else None
    guard_inputs(outputs, [r for r in (*refs, *further) if ":" not in r]
                 + [str(p) for p in first], data)
    js = outputs.add(args.json, "--json", folder=False, overwrite=args.overwrite)
    _check_drawings(outputs, args)
    args.anchor, args.source = map(str, first)
    columns, seq_len = reading(args, data) if m.data else (None, None)

    def split_of(folder):
        return split_for(_load_eval(str(folder)), args.data, args.split, seq_len=seq_len,
                         columns=columns)

    result = runner.run_inputs(m, inputs, given, split_of, device_for(pick_device(args.device)),
                               _progress(m, _Main()), sized=beyond_memory(args)[0],
                               words=runner.CLI, time_limit=args.time_limit)
    if outputs.items:
        with outputs.write() as tmp:
            if js is not None:
                write_json_file(tmp[js], result.to_dict(), m.name)
            _write_drawings(m, tmp, args, result)
    if m.summary is not None:
        print(m.summary(result, ""))
    return 0


class _Main:
    """One process, the main one (the progress line's group outside torchrun)."""

    main = True


def _outputs(m: Measurement, args):
    """The command's outputs, checked before any model is loaded (rotviz.outputs)."""
    from rotviz.cli.args import guard_inputs
    from rotviz.outputs import Outputs

    outputs = Outputs(m.name)
    further = [getattr(args, n) for n in m.models if getattr(args, n, None)]
    guard_inputs(outputs, [args.anchor, args.source, *further], args.data)
    folder = outputs.add(getattr(args, "out", None), "--out", folder=True,
                         overwrite=args.overwrite)
    js = outputs.add(args.json, "--json", folder=False, overwrite=args.overwrite)
    _check_drawings(outputs, args)
    files = []
    for f in _files_given(m, args):  # the file, then the folders written beside it
        f.check_name(getattr(args, _dest(f)))
        item = outputs.add(getattr(args, _dest(f)), f.flag, folder=False,
                           overwrite=args.overwrite)
        beside = tuple(outputs.add(d, f"{f.flag}'s folder", folder=True,
                                   overwrite=args.overwrite) for d in f.folders(item.path))
        files.append((f, item, beside))
    return outputs, folder, js, files


@contextmanager
def _processes(device):
    """The torchrun process group (one process without torchrun), left at the end."""
    from rotviz import dist

    group = dist.init(device)
    try:
        yield group
    finally:
        dist.finish()


def _progress(m: Measurement, group):
    """A progress line on stdout for the records that ask for one (rank 0 only)."""
    if not m.progress or not group.main:
        return None

    def show(done: int, total: int, _msg: str) -> None:
        if done == total or done % max(1, total // 10) == 0:
            print(f"\r  {done}/{total}", end="\n" if done == total else "", flush=True)

    return show


def run_command(m: Measurement, args: argparse.Namespace) -> int:
    """Check the command's own options and outputs, then run the record through the one
    runner (rotviz.runner.run: values, the record's checks, memory or at size, matching,
    the run) with the CLI's loading, torchrun group and outputs; say the result in a line."""
    from rotviz import runner
    from rotviz.data.reading import split_for
    from rotviz.devices import device_for, pick_device
    from rotviz.match.options import limited
    from rotviz.match.selection import match_options

    given = {p.name: getattr(args, p.name) for p in m.parameters()}
    if getattr(args, "animation", None) is not None:  # what the animation needs, unless given
        given |= {k: v for k, v in m.animate_params.items() if given.get(k) is None}
    values = m.values(given)
    for f in _files_given(m, args):  # a value the further file cannot express: refused first
        if f.check is not None:
            f.check(values)
    if m.writes_model and values.get("evaluate") == "no" and args.out is None:
        raise RotvizError("--evaluate no only makes the model and writes it: give --out DIR, "
                          "or drop --evaluate no")
    if not m.pair:  # one model: the endpoints are it, twice, unmatched (or with --source)
        _one_model(m, args, values)
    options = limited(match_options(args.match), args.time_limit)  # SPEC errors come first
    if m.data is False and options is not None and options.needs_data and args.data is None:
        raise RotvizError("--match act and learned learn from data: add --data, e.g. "
                          "--data digits")
    outputs, folder, js, files = _outputs(m, args)
    sized = beyond_memory(args)[0]
    for f in _files_given(m, args) if sized and not m.writes_model else ():
        raise RotvizError(f"the pair is evaluated block by block (--max-memory), and {f.flag} "
                          "is written from memory only; raise --max-memory")
    columns, seq_len = reading(args, args.data)

    def split(model):
        if args.data is None:
            return None
        return split_for(model, args.data, getattr(args, "split", "train"), seq_len=seq_len,
                         columns=columns)

    def write(ends, result, ctx) -> None:
        if sized and m.writes_model:  # into the temporary folder `out` gave the record
            _write_outputs(m, args, ends, result, values, _open[0], js, files)
        elif outputs.items:
            with outputs.write() as tmp:
                if folder is not None:
                    from dataclasses import replace

                    from rotviz.sources.writing import write_model

                    if not result.state:  # ZipIt!'s partial zip: each model keeps its tail
                        raise RotvizError("this merge keeps each model's later blocks and "
                                          "head (a partial zip), so it is no single model "
                                          "to write; drop --out, or zip every block "
                                          "(--zip-layers -1)")

                    own = getattr(result, "config", None)  # a stacked model's (passthrough)
                    write_model(ends.anchor if own is None else replace(ends.anchor, config=own),
                                result.state, tmp[folder])
                _write_outputs(m, args, ends, result, values, tmp, js, files)

    _open: list = []

    @contextmanager
    def out():
        if not (sized and m.writes_model):
            yield None
            return
        with outputs.write() as tmp:
            _open.append(tmp)
            yield tmp[folder] if folder is not None else None

    # The pair is evaluated as the app does: in plain torch where that computes the same
    # logits (rotviz.sources.plain_torch: no transformers import, seconds less). A model written
    # from it (--out) is what transformers writes (write_model: rotviz.sources.plain where those
    # files are known, else through transformers); a record's further files take the
    # transformers modules.
    host = runner.Host(device_for(pick_device(args.device)),  # torchrun: each its local GPU
                       load=_load_full if files else _load_eval, split=split,
                       processes=_processes, progress=_progress(m, _Main()), write=write,
                       out=out, words=runner.CLI)
    pair = runner.Pair(args.anchor, args.source, args.match, args.layers,
                       getattr(args, "second", True), sized, args.time_limit)
    result = runner.run(m, pair, given, host)
    if result is None:  # under torchrun, a rank other than 0: rank 0 writes and reports
        return 0
    if m.summary is not None:
        line = m.summary(result, m.at_size_how if sized else "")
        out_dir = getattr(args, "out", None)
        print(f"{line}; wrote {out_dir}" if out_dir else line)
    return 0


def _write_outputs(m: Measurement, args, ends, result, values: dict, tmp, js, files) -> None:
    """--json, the drawings and a record's further files (`Measurement.files`) of `result`
    into the outputs' temporary siblings `tmp`."""
    from rotviz.outputs import write_json_file

    if js is not None:
        write_json_file(tmp[js], _json(m, result, args), m.name)
    _write_drawings(m, tmp, args, result)
    for f, item, beside in files:
        f.write(ends, result, values, tmp[item], tuple(tmp[d] for d in beside),
                (item.path, tuple(d.path for d in beside)))


def _one_model(m: Measurement, args, values: dict) -> None:
    """A one-model record's endpoints: the model twice, unmatched; or, for a record that
    takes a second model, the model and `--source` matched with `--match` (default the
    record's), refused in one line where the values need a second model and none is given,
    or where one is given that nothing uses."""
    second = getattr(args, "source", None)
    args.anchor, args.source = args.model, second or args.model
    args.second = second is not None
    if m.source is None:
        return
    why = m.source(values)
    if second is None:
        if why:
            raise RotvizError(f"{why} needs a second model: add --source MODEL")
        for flag, v in (("--match", args.match), ("--layers", args.layers),
                        ("--time-limit", args.time_limit)):
            if v is not None:
                raise RotvizError(f"{flag} matches a second model: add --source MODEL, or "
                                  f"drop {flag}")
        args.match = "none"
        return
    if not why:
        raise RotvizError(f"--source is used only with {m.source_use or 'other options'}"
                          ": add one, or drop --source")
    if _same_model(args.model, second):
        raise RotvizError(f"--source '{second}' is the model itself; {why} needs a different "
                          "model of the same architecture")
    if args.match is None:
        args.match = m.match_default


def _same_model(a: str, b: str) -> bool:
    """Whether two model references name one model (the same folder once resolved): a
    reference that does not resolve is left to the loader, which says what is wrong."""
    from rotviz.sources.loading import resolve_ref

    if a == b:
        return True
    try:
        return resolve_ref(a).resolve() == resolve_ref(b).resolve()
    except (RotvizError, OSError):
        return False


def _load_eval(ref: str):
    from rotviz.sources.plain_torch import load_for_eval

    return load_for_eval(ref)


def _load_full(ref: str):
    from rotviz.sources.loading import load_model

    return load_model(ref)


def _json(m: Measurement, result, args) -> dict:
    d = result.to_dict()
    return d | {"out": args.out} if m.writes_model else d
