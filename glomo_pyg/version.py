"""The version of glomo_pyg (its own module, so that any module can read it without
importing the package's public API)."""
__version__ = "0.10.3"
