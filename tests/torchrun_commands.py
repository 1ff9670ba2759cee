"""Several rotviz commands in one torchrun launch (a test helper, run as a script by torchrun).

    python -m torch.distributed.run --standalone --nproc-per-node=2 tests/torchrun_commands.py \
        barrier A B --data digits --json one.json --then slice A --data digits --json two.json

Each launch costs about 20 s of imports on a 2-core machine (torch and transformers in every
process); the commands here share one. The process group stays up between them (rotviz's
`dist.finish` is held back until the last one), as it would for one long command. Exits with
the first failing command's code.
"""

from __future__ import annotations

import sys

import rotviz.dist as dist
from rotviz.cli import main


def commands(argv: list[str]) -> list[list[str]]:
    """`argv` cut at each "--then"."""
    out: list[list[str]] = [[]]
    for word in argv:
        if word == "--then":
            out.append([])
        else:
            out[-1].append(word)
    return [c for c in out if c]


def run(argv: list[str]) -> int:
    """The commands in turn. A failing one ends the process with its code and the process
    group left up, as that command alone would end: leaving the group (destroying it) would
    wait for the peer still inside the failed command's collective, and torchrun, seeing this
    rank exit, stops that peer."""
    finish = dist.finish
    dist.finish = lambda: None
    try:
        for args in commands(argv):
            code = main(args)
            if code:
                return code
    finally:
        dist.finish = finish
    finish()
    return 0


if __name__ == "__main__":
    sys.exit(run(sys.argv[1:]))
