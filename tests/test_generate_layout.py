"""Layout of ragkit.generate: the protocol module imports none of its implementations
(backend selection lives in ragkit.generate.factory), and importing the package loads no
engine library."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BASE = ROOT / "ragkit" / "generate" / "base.py"


def _imported_modules(path: Path) -> set[str]:
    """Every module an import statement in the file names, at any depth (function-local
    imports included), relative imports resolved against ragkit.generate."""
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                pkg = "ragkit.generate".split(".")
                base = ".".join(pkg[: len(pkg) - node.level + 1])
                mod = f"{base}.{node.module}" if node.module else base
            else:
                mod = node.module or ""
            out.add(mod)
            out.update(f"{mod}.{a.name}" for a in node.names)  # `from ragkit.generate import llama`
    return out


def test_base_imports_no_implementation():
    from ragkit.generate.factory import BACKENDS

    implementations = {target.partition(":")[0] for target in BACKENDS.values()}
    assert implementations == {"ragkit.generate.llama", "ragkit.generate.openai_compat", "ragkit.generate.python_function"}
    imported = _imported_modules(BASE)
    engines = {"llama_cpp", "openai", "httpx", "httpx2"}
    bad = {m for m in imported
           if m in implementations or m.split(".")[0] in engines or m.startswith("ragkit.generate.factory")}
    assert not bad, f"base.py imports {sorted(bad)}"
    # nor anything else of ragkit.generate: the protocol sits below every module of the package
    assert not {m for m in imported if m.startswith("ragkit.generate")}, sorted(imported)


def test_the_import_checker_sees_local_imports(tmp_path):
    """The checker must see a function-local import like the one base.py used to have."""
    p = tmp_path / "m.py"
    p.write_text("def f():\n    from ragkit.generate.llama import LlamaCppGenerator\n    from . import openai_compat\n")
    assert {"ragkit.generate.llama", "ragkit.generate.openai_compat"} <= _imported_modules(p)


def test_package_import_is_lazy_and_keeps_its_names():
    code = (
        "import sys\n"
        "from ragkit.generate import load_generator, Generation, Choice, Generator\n"
        "import ragkit.generate.factory as f\n"
        "assert load_generator is f.load_generator\n"
        "loaded = sorted(m for m in ('llama_cpp', 'openai', 'ragkit.generate.llama', 'ragkit.generate.openai_compat') if m in sys.modules)\n"
        "print(loaded)\n"
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "[]", res.stdout


def test_every_backend_resolves_to_a_generator_class():
    from ragkit.generate.factory import BACKENDS, backend_class

    for name in BACKENDS:
        cls = backend_class(name)
        assert callable(getattr(cls, "from_settings", None)), name
        for method in ("tokenize", "detokenize", "special_token_ids", "generate"):
            assert callable(getattr(cls, method, None)), (name, method)


def test_unknown_backend_is_a_config_error():
    from ragkit.errors import ConfigError
    from ragkit.generate.factory import backend_class

    with pytest.raises(ConfigError, match="unknown generator backend 'vllm'.*llama_cpp, openai"):
        backend_class("vllm")


def test_load_generator_goes_through_the_registry(monkeypatch):
    """FAKE backend (unit test): a registry entry pointing at a stand-in class shows that
    load_generator imports and builds whatever the registry names, with vocab_only."""
    import types

    import ragkit.generate.factory as factory
    from ragkit.config import load_settings

    mod = types.ModuleType("ragkit_test_fake_backend")

    class Fake:
        @classmethod
        def from_settings(cls, settings, *, vocab_only=False):
            return ("built", settings.generator.model, vocab_only)

    mod.Fake = Fake
    monkeypatch.setitem(sys.modules, "ragkit_test_fake_backend", mod)
    monkeypatch.setitem(factory.BACKENDS, "llama_cpp", "ragkit_test_fake_backend:Fake")
    assert factory.load_generator(load_settings(), vocab_only=True) == ("built", "qwen2.5-coder-0.5b", True)
