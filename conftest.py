"""Loaded by pytest before tests/conftest.py, and before any test module or rotviz module is
imported: keep compiled test modules (pytest's assertion rewriting) and rotviz's bytecode
between runs and processes even where PYTHONDONTWRITEBYTECODE is set, as on the CI machines.
Otherwise each pytest-xdist worker rewrites every test module again (about 11 s of its
collection) and each subprocess compiles rotviz again."""

import sys

sys.dont_write_bytecode = False
