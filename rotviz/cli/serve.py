"""Command-line sub-command `serve`: launch the Streamlit app (registered by rotviz.cli).

    rotviz serve [--port 8501] [--address localhost] [--roots DIR ...] [--print-command]

The app only offers models from the zoo and from folders under the model roots
(ROTVIZ_MODEL_ROOTS; `--roots` sets it for this launch).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from rotviz.cli.args import bounded
from rotviz.errors import RotvizError
from rotviz.limits import PORT


def register(sub, wanted: Callable[[str], bool] = lambda name: True) -> None:
    if not wanted("serve"):
        return
    s = sub.add_parser("serve", help="launch the interactive app (Streamlit) in the browser")
    s.add_argument("--port", type=bounded(PORT), default=8501,
                   help="port to listen on (default 8501)")
    s.add_argument("--address", default="localhost",
                   help="address to bind (default localhost; 0.0.0.0 serves the network)")
    s.add_argument("--roots", nargs="+", default=None, metavar="DIR",
                   help="folders the app may load models from (default: ROTVIZ_MODEL_ROOTS, "
                        "else the zoo's folders)")
    s.add_argument("--print-command", action="store_true",
                   help="print the streamlit command line and exit")
    s.set_defaults(func=cmd_serve)


def serve_command(port: int = 8501, address: str = "localhost") -> list[str]:
    """The streamlit command line that runs the app: `python -m streamlit run` on the
    package's launcher (rotviz/ui/app.py), with the app's settings (rotviz.ui.options: a run
    from a wheel has no .streamlit/config.toml beside it), then the port and address."""
    from rotviz.ui.options import flags

    PORT.check(port)
    app = Path(__file__).resolve().parent.parent / "ui" / "app.py"
    return [sys.executable, "-m", "streamlit", "run", str(app), *flags(),
            "--server.port", str(port), "--server.address", address]


def cmd_serve(args: argparse.Namespace) -> int:
    from rotviz.app.roots import ENV_ROOTS

    cmd = serve_command(args.port, args.address)
    env = dict(os.environ)
    if args.roots:
        bad = [repr(r) for r in args.roots if not r.strip() or not Path(r).expanduser().is_dir()]
        if bad:
            raise RotvizError(f"--roots: no folder at {', '.join(bad)}")
        env[ENV_ROOTS] = os.pathsep.join(str(Path(r).expanduser().resolve()) for r in args.roots)
    if args.print_command:
        print(" ".join(cmd))
        return 0
    print(f"rotviz: serving the app on http://{args.address}:{args.port} (Ctrl-C stops it)",
          file=sys.stderr)
    try:
        # streamlit runs in a child process (this one never imports it), in the user's own
        # working folder: the app finds its files by the package's paths.
        return subprocess.call(cmd, cwd=None, env=env)
    except KeyboardInterrupt:
        return 0
