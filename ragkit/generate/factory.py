"""Backend selection: `generator.backend` -> the class that implements the Generator
protocol (ragkit.generate.base). The protocol module imports none of its
implementations; this registry names them as "module:Class" strings and imports the one
asked for only when a generator is loaded, so `import ragkit.generate` loads neither
llama_cpp nor openai."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ragkit.config import Settings
    from ragkit.generate.base import Generator

# backend name -> "module:Class"; the class has `from_settings(settings, *, vocab_only)`
BACKENDS: dict[str, str] = {
    "llama_cpp": "ragkit.generate.llama:LlamaCppGenerator",
    "openai": "ragkit.generate.openai_compat:OpenAICompatGenerator",
    "function": "ragkit.generate.python_function:FunctionGenerator",  # a Python function, no weights (logic tests)
}


def backend_class(name: str) -> type:
    """The generator class registered for a backend name (imported now, not before)."""
    from ragkit.backends import import_target

    return import_target(BACKENDS, name, what="generator backend", setting="generator.backend")


def load_generator(settings: "Settings", *, vocab_only: bool = False) -> "Generator":
    """The generator for `settings.generator.backend`. With `vocab_only`, only what is
    needed to tokenize (for budgeting and dry runs)."""
    return backend_class(settings.generator.backend).from_settings(settings, vocab_only=vocab_only)
