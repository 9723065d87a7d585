"""rayaccel's version (pyproject.toml's ``version``), importable from any layer without the public surface."""

__version__ = "0.1.0"
