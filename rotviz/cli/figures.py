"""`rotviz figures --out DIR`: the paper-figure gallery (rotviz.gallery) reproduced on a
pair, by default the zoo's, each figure beside its data and the commands that remake it, and
one report.html. Generated from the gallery's records: a registered entry is one more figure
and one more `--only` name."""

from __future__ import annotations

import argparse
from collections.abc import Callable

from rotviz.cli.args import add_overwrite
from rotviz.errors import RotvizError

# the PNGs' size in CSS pixels: wide enough for a horizontal legend of three matchings with
# their barriers on one line (the figures' own 700 cut the third off)
PNG_WIDTH, PNG_HEIGHT = 900, 560


def register(sub, wanted: Callable[[str], bool] = lambda name: True) -> None:
    if not wanted("figures"):
        return
    from rotviz import zoo_registry
    from rotviz.gallery import entries

    anchor, source = zoo_registry.default_pair()
    names = ", ".join(e.name for e in entries())
    what = ("the papers' figures (the seed paper's Figures 4-6 and Table 1, the GLMC paper's "
            "learned-matching barrier) reproduced on a pair, each beside its data and commands, "
            "and one report.html")
    p = sub.add_parser("figures", help=what, description=what)
    p.add_argument("--out", required=True, metavar="DIR",
                   help="new folder for the figures (NAME.html, NAME.png), their data "
                        "(NAME.csv, NAME.json), commands (NAME.command.txt) and report.html")
    p.add_argument("--only", default=None, metavar="NAME[,NAME]",
                   help=f"make only these figures, a comma list of {names} (default all)")
    p.add_argument("--anchor", default=anchor, help=f"anchor model (default {anchor})")
    p.add_argument("--source", default=source, help=f"source model (default {source})")
    p.add_argument("--data", default="digits",
                   help="the data the pair reads; figures use its test split, learned matching "
                        "and merge statistics its train split (default digits)")
    p.add_argument("--no-png", action="store_true",
                   help="write no NAME.png (PNG needs kaleido and a Chrome or Chromium)")
    p.add_argument("--device", default="auto", help="auto, cpu, cuda or mps (default auto)")
    add_overwrite(p)
    p.set_defaults(func=cmd_figures)


def remake_command(args: argparse.Namespace) -> Callable:
    """(entry) -> the exact command line that makes that entry's figure, data and commands
    again, into a new folder, on the same pair and data."""

    def line(e) -> str:
        png = " --no-png" if args.no_png else ""
        return (f"rotviz figures --out figures-{e.name} --only {e.name} --anchor {args.anchor} "
                f"--source {args.source} --data {args.data}{png}")

    return line


def cmd_figures(args: argparse.Namespace) -> int:
    """Check the names, the folder and the PNG renderer, then make every figure, draw the
    PNGs in one browser, and write the folder as one transaction."""
    from rotviz.cli.args import guard_inputs
    from rotviz.devices import device_for, pick_device
    from rotviz.gallery import Pair, select
    from rotviz.gallery.make import make, write
    from rotviz.outputs import Outputs
    from rotviz.plots import images

    selected = select(args.only)  # an unknown or empty --only: one line, first
    outputs = Outputs("figures")
    guard_inputs(outputs, [args.anchor, args.source], args.data)
    out = outputs.add(args.out, "--out", folder=True, overwrite=args.overwrite)
    if not args.no_png:
        why = images.why_not()
        if why:
            raise RotvizError(f"rotviz figures also draws each figure as PNG, and {why}; or "
                              "add --no-png")
    pair = Pair(args.anchor, args.source, args.data)
    device = device_for(pick_device(args.device))
    made = make(selected, pair, device, say=lambda line: print(line, flush=True))
    pngs = None
    if not args.no_png:
        print(f"drawing {len(made)} PNG(s) in one browser", flush=True)
        pngs = images.render([m.figure for m in made], "png", PNG_WIDTH, PNG_HEIGHT)
    with outputs.write() as tmp:
        write(tmp[out], made, pair, pngs, remake_command(args))
    said = ", ".join(f"{m.entry.name} ({m.seconds:.1f} s)" for m in made)
    print(f"figures: {said}; wrote {len(made)} figure(s) and report.html to {args.out}")
    return 0
