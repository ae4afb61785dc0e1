"""Generation backends behind one small protocol."""

from ragkit.generate.base import Choice, Generation, Generator, load_generator

__all__ = ["Choice", "Generation", "Generator", "load_generator"]
