"""The version of rotviz, in a leaf module so that anything may read it: the one source of
it (pyproject.toml reads it for the package's metadata, `rotviz --version` prints it, and
every written result records it). CHANGELOG.md says what each version changed."""

__version__ = "0.1.0"
