"""rotviz.memory.mapped_alone: within it, a freed tensor of a few MB goes back to the system
at once, where glibc's heap would keep it until the next trim; after it, glibc's heap serves
such tensors again (module docstring)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# In a fresh process (the test process may have set the threshold already): the resident MB
# that freeing an 8 MB tensor gives back, after a 20 MB tensor was freed (glibc then raises
# its mmap threshold to 20 MB, so the 8 MB come from the heap) and with a small tensor
# allocated after it; as glibc does it, within mapped_alone(), and after it.
PROBE = """
import json, torch
from rotviz.memory import mapped_alone, resident_now

def given_back():
    big = torch.ones(5_000_000)
    del big
    x = torch.ones(2_000_000)
    pin = torch.ones(50_000)
    before = resident_now()
    del x
    return (before - resident_now()) / 1e6, pin

plain = given_back()[0]
with mapped_alone():
    within = given_back()[0]
print(json.dumps({"plain": plain, "within": within, "after": given_back()[0]}))
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's allocator, /proc")
def test_mapped_alone_gives_mid_sized_tensors_back_within_only():
    out = subprocess.run([sys.executable, "-c", PROBE], cwd=ROOT, capture_output=True,
                         text=True, check=True)
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["plain"] < 1.0  # the premise: the heap keeps the freed 8 MB
    assert got["within"] > 7.9  # all 8 MB back at once
    assert got["after"] < 1.0  # and the heap's way again after it
