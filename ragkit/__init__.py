"""ragkit: offline document question answering with page/section citations."""

from ragkit import _offline  # noqa: F401  (must run before any third-party import)

__version__ = "0.1.0"

__all__ = ["__version__"]
