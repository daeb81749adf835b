"""tierlocal: what fits on one GPU, and how to serve it."""

__version__ = "0.1.0"
