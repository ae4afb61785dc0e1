"""Layout of ragkit.rerankers, shaped as ragkit.embed and ragkit.generate: the protocol module
imports none of its implementations, the factory's BACKENDS table names one class per engine
(each makes itself from the settings), importing the package loads no engine, and
`retrieve.rerank` picks the backend through the table."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from test_generate_layout import _imported_modules

ROOT = Path(__file__).resolve().parents[1]


def test_base_imports_no_implementation():
    from ragkit.rerankers.factory import BACKENDS

    implementations = {target.partition(":")[0] for target in BACKENDS.values()}
    assert implementations == {"ragkit.rerankers.onnx", "ragkit.rerankers.crossencoder", "ragkit.rerankers.openai"}
    imported = _imported_modules(ROOT / "ragkit" / "rerankers" / "base.py")
    assert not {m for m in imported if m.startswith("ragkit.rerankers")}, sorted(imported)
    assert not {m for m in imported if m.split(".")[0] in ("onnxruntime", "openai", "sentence_transformers", "torch")}


def test_package_import_is_lazy():
    code = (
        "import sys\n"
        "from ragkit.rerankers import load_reranker, Reranker, RerankerError, BACKENDS\n"
        "print(sorted(m for m in ('onnxruntime', 'openai', 'torch', 'sentence_transformers', 'ragkit.rerankers.onnx',"
        " 'ragkit.rerankers.openai', 'ragkit.rerankers.crossencoder') if m in sys.modules))\n"
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "[]", res.stdout


def test_every_backend_resolves_to_a_reranker_class():
    from ragkit.rerankers.factory import BACKENDS, backend_class

    for name in BACKENDS:
        cls = backend_class(name)
        assert callable(getattr(cls, "from_settings", None)) and callable(getattr(cls, "score", None)), name


def test_unknown_backend_is_a_config_error():
    from ragkit.errors import ConfigError
    from ragkit.rerankers.factory import backend_class

    with pytest.raises(ConfigError, match="unknown reranker backend 'colbert'.*crossencoder, onnx, openai"):
        backend_class("colbert")


def test_settings_pick_the_backend_through_the_table(monkeypatch, tmp_path):
    """The real default (the registry's legal-minilm-l12, ONNX) and off; then, with a FAKE
    backend (unit test: a stand-in class in the table), that load_reranker builds whatever
    the table names for the configured engine."""
    import types

    import ragkit.rerankers.factory as factory
    from ragkit.config import load_settings

    default = factory.load_reranker(load_settings())
    assert type(default).__name__ == "OnnxCrossEncoder" and default.name == "onnx:legal-minilm-l12"
    assert factory.load_reranker(load_settings(retrieve={"rerank": "off"})) is None
    assert factory.backend_of(load_settings(retrieve={"rerank_base_url": "http://127.0.0.1:9/v1"})) == "openai"
    assert factory.backend_of(load_settings(retrieve={"reranker": str(tmp_path)})) == "crossencoder"

    mod = types.ModuleType("ragkit_test_fake_reranker")

    class Fake:
        name = "fake"

        @classmethod
        def from_settings(cls, settings):
            return ("built", settings.retrieve.reranker)

    mod.Fake = Fake
    monkeypatch.setitem(sys.modules, "ragkit_test_fake_reranker", mod)
    monkeypatch.setitem(factory.BACKENDS, "crossencoder", "ragkit_test_fake_reranker:Fake")
    assert factory.load_reranker(load_settings(retrieve={"reranker": str(tmp_path)})) == ("built", str(tmp_path))
