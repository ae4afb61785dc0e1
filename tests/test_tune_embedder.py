"""`ragkit tune embedder` on the real path: three real CUAD training contracts chunked as
ingest chunks them, MiniLM fine-tuned by sentence-transformers' trainer on their gold
clauses against BM25 hard negatives; the model it writes has learned (it ranks its training
questions' gold chunks higher than MiniLM), and loads as `embed.model` to ingest and
retrieve a real document. Bad input is named with the reason."""

from __future__ import annotations

import json

import pytest
from conftest import CORPORA, make_settings
from test_tune_reranker import _small_cuad
from typer.testing import CliRunner

pytestmark = pytest.mark.complete


def test_tune_embedder_writes_a_model_that_learned_and_loads_as_the_embedder(tmp_path):
    from sentence_transformers import SentenceTransformer

    from ragkit.cli import app
    from ragkit.ingest import ingest
    from ragkit.models import resolve
    from ragkit.retrieve import retrieve
    from ragkit.session import Session
    from ragkit.tune.embedder import chunk_texts, triplets
    from ragkit.tune.reranker import read_queries

    src = _small_cuad(tmp_path / "cuad", 3)
    out = tmp_path / "emb"
    res = CliRunner().invoke(app, ["tune", "embedder", str(src), "--out", str(out), "--per-doc", "8",
                                   "--held-share", "0.34", "--epochs", "3", "--lr", "1e-4", "--batch-size", "8", "--json"])
    assert res.exit_code == 0, res.output
    card = json.loads(res.stdout)  # --json: stdout holds the card alone (the training log goes to stderr)
    assert card["documents"] == {"train": 2, "held_out": 1} and card["training_questions"] > 0
    assert set(card["held_out_figures"]) == {"base", "trained"}
    assert (out / "model" / "config.json").is_file() and (out / "training.json").is_file()
    # the files ragkit ships (INT8 ONNX, its tokenizer, the card), pinned by the card, close to the fp32 model
    ship = card["shipped"]
    assert set(ship["files"]) == {"model.onnx", "tokenizer.json"} and (out / "MODEL_CARD.md").is_file()
    assert ship["files"]["model.onnx"] in (out / "MODEL_CARD.md").read_text()
    assert ship["size_mb"] <= 40 and ship["cosine_to_fp32"]["mean"] > 0.98, ship
    assert set(ship["held_out_figures"]) >= {"top10", "rank1", "mrr"}

    # it learned: on its own training triplets the gold chunk stands further above the hard
    # negative than with MiniLM (the three shortest contracts are too short for ranks to move)
    qs = read_queries(src)
    session = Session(make_settings(out / "work" / "store"))
    chunks = chunk_texts(qs.texts, out / "work", session)
    held = set(card["held_out_docs"])
    data = triplets([q for q in qs.queries if q.doc not in held], chunks, 24)
    assert len(data) == card["training_questions"]
    margin = {}
    for label, folder in (("base", resolve("minilm", "embedder", tmp_path / "cache")), ("trained", out / "model")):
        m = SentenceTransformer(str(folder), device="cpu", local_files_only=True)
        q, p, n = (m.encode([t[k] for t in data], normalize_embeddings=True) for k in range(3))
        margin[label] = float(((q * p).sum(1) - (q * n).sum(1)).mean())
    assert margin["trained"] > margin["base"] + 0.05, margin
    session.close()

    # it loads as embed.model: a real NDA ingested into a new store and a question retrieved from it
    settings = make_settings(tmp_path / "store")
    settings = settings.model_copy(update={"embed": settings.embed.model_copy(update={"model": str(out / "model")})})
    rep = ingest([CORPORA / "cnli_dev_019.pdf"], settings)
    assert not rep.failed and rep.chunks > 0
    r = retrieve("Which state's law governs this agreement?", settings, docs=["cnli_dev_019.pdf"])
    assert r.prompt.contexts


def test_tune_embedder_names_a_set_without_texts(tmp_path):
    from ragkit.cli import app

    bad = tmp_path / "set.jsonl"
    bad.write_text(json.dumps({"id": "q", "question": "Which law governs?", "doc": "a.pdf", "evidence": "Delaware"}) + "\n")
    res = CliRunner().invoke(app, ["tune", "embedder", str(bad), "--out", str(tmp_path / "o")])
    assert res.exit_code != 0 and "master_clauses.csv" in res.output and "Traceback" not in res.output
