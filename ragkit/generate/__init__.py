"""Generation backends behind one small protocol."""

from ragkit.generate.base import Generation, Generator, load_generator

__all__ = ["Generation", "Generator", "load_generator"]
