"""A server for the tests that send real signals to real commands (tests/test_outputs.py,
tests/test_streaming.py). It imports what the commands use once (torch, transformers, ...:
seconds of CPU in each fresh interpreter), then runs each command it is sent in a process of
its own, forked from it: the signal lands on the command's process, which exits and is waited
for as a fresh interpreter's would be.

Protocol: a line of JSON in, {"argv", "err", and optionally "out" and "cwd"} (stdout goes to
/dev/null without "out"); the command's pid, then its exit code (os.waitstatus_to_exitcode:
-2 for a process that SIGINT ended) out.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

CODE = """
import json, os, signal, sys
IMPORTS
print("ready", flush=True)
for line in sys.stdin:
    job = json.loads(line)
    pid = os.fork()
    if pid == 0:  # the command's process: never back into this loop
        rc = 1
        try:
            if job.get("cwd"):
                os.chdir(job["cwd"])
            for fd, name, flags in ((0, os.devnull, os.O_RDONLY),
                                    (1, job.get("out") or os.devnull,
                                     os.O_WRONLY | os.O_CREAT | os.O_TRUNC),
                                    (2, job["err"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC)):
                os.dup2(os.open(name, flags, 0o600), fd)
            rc = rotviz.cli.main(job["argv"])
            sys.stdout.flush(), sys.stderr.flush()
        except KeyboardInterrupt:  # the command had returned: end as the interpreter would
            signal.signal(signal.SIGINT, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGINT)
        finally:
            os._exit(rc)
    print(pid, flush=True)
    print(os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]), flush=True)
"""


def _default_sigint() -> None:
    """SIGINT as a terminal leaves it (Python then raises KeyboardInterrupt), even where pytest
    itself started with it ignored (nohup, a background job), which children inherit."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@contextmanager
def serving(imports: str, env: dict[str, str], cwd: Path | None = None
            ) -> Iterator[subprocess.Popen]:
    """The server, once it has imported `imports` (Python lines; rotviz.cli among them) and
    said it is ready; told to end (its stdin closed) and waited for on leaving."""
    server = subprocess.Popen([sys.executable, "-c", CODE.replace("IMPORTS", imports)],
                              cwd=cwd, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              text=True, preexec_fn=_default_sigint)
    try:
        assert server.stdout.readline().strip() == "ready"
        yield server
    finally:
        server.stdin.close()
        server.wait(timeout=60)


def send(server: subprocess.Popen, job: dict) -> int:
    """Start a command (see the protocol above); its pid."""
    server.stdin.write(json.dumps(job) + "\n")
    server.stdin.flush()
    return int(server.stdout.readline())


def exit_code(server: subprocess.Popen) -> int:
    """The exit code of the command last sent, once it has ended."""
    return int(server.stdout.readline())
