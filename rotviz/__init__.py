"""rotviz: see, teach and use the parameter-space symmetries of transformers."""

__version__ = "0.1.0"
