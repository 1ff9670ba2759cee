"""The version of rotviz, in a leaf module so that anything may read it."""

__version__ = "0.1.0"
