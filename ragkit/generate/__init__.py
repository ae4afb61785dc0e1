"""Generation backends behind one small protocol (base.py); factory.py picks the backend.

Importing this package loads neither llama_cpp nor openai: the factory imports a
backend's module only when a generator of that backend is loaded."""

from ragkit.generate.base import Choice, Generation, Generator
from ragkit.generate.factory import load_generator

__all__ = ["Choice", "Generation", "Generator", "load_generator"]
