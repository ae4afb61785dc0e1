"""`ragkit tune reranker` on the real path: three real CUAD training contracts ingested by
the product, their pools retrieved by the product's retrieval, the cross-encoder trained
with sentence-transformers' trainer and exported to INT8 ONNX; the model it writes has
learned (it ranks its training pools' gold passages higher than the model it started
from), is pinned in its card, and loads as `retrieve.rerank_model` to rerank a real
retrieval. Bad input is named with the reason."""

from __future__ import annotations

import csv
import json
import shutil
from pathlib import Path

import pytest
from conftest import SHARED, make_settings
from typer.testing import CliRunner

pytestmark = pytest.mark.complete

CUAD = SHARED / "cuad-train"


def _small_cuad(folder: Path, n: int) -> Path:
    """The `n` shortest contracts of cuad-train's master_clauses.csv, with their texts in
    txt/ beside the copy (the layout `read_cuad` reads)."""
    csv.field_size_limit(1 << 30)
    with open(CUAD / "master_clauses.csv", encoding="utf-8", newline="") as f:
        reader = csv.DictReader(f)
        rows, fields = list(reader), reader.fieldnames
    rows = sorted(rows, key=lambda r: (CUAD / "txt" / r["txt_file"]).stat().st_size)[:n]
    (folder / "txt").mkdir(parents=True)
    for r in rows:
        shutil.copy(CUAD / "txt" / r["txt_file"], folder / "txt" / r["txt_file"])
    path = folder / "master_clauses.csv"
    with open(path, "w", encoding="utf-8", newline="") as f:
        w = csv.DictWriter(f, fieldnames=fields)
        w.writeheader()
        w.writerows(rows)
    return path


def test_tune_reranker_writes_a_model_that_learned_pinned_and_loadable(tmp_path):
    from ragkit.cli import app
    from ragkit.models import resolve, sha256_file
    from ragkit.rerankers.onnx import OnnxCrossEncoder
    from ragkit.retrieve import retrieve
    from ragkit.session import Session
    from ragkit.tune.reranker import load_mined, ranking_figures

    src = _small_cuad(tmp_path / "cuad", 3)
    out = tmp_path / "model"
    res = CliRunner().invoke(app, ["tune", "reranker", str(src), "--out", str(out), "--per-doc", "4", "--negatives", "4",
                                   "--held-share", "0.34", "--epochs", "2", "--lr", "1e-4", "--json"])
    assert res.exit_code == 0, res.output
    card = json.loads(res.stdout)  # --json: stdout holds the card alone (the training log goes to stderr)
    assert card["documents"] == 3 and card["train_documents"] == 2 and len(card["held_documents"]) == 1
    assert card["positive_pairs"] > 0 and card["pairs"] > card["positive_pairs"]
    for f in ("model.onnx", "tokenizer.json", "reranker.json"):
        assert card["files"][f] == sha256_file(out / f), f
    assert "ragkit tune reranker" in (out / "MODEL_CARD.md").read_text() and "CUAD" in (out / "MODEL_CARD.md").read_text()
    assert "trained" in card["held_out"] and "start" in card["held_out"]

    # it learned: on the pools it trained on, the gold passages come earlier than with the model it started from
    mined = [m for m in load_mined(next((out / "work").glob("mined-*.jsonl"))) if m.doc not in card["held_documents"]]
    start = OnnxCrossEncoder(resolve("ms-marco-minilm-l12", "reranker", tmp_path / "cache"))
    trained = OnnxCrossEncoder(out, max_length=256)
    before, after = ranking_figures(start, mined), ranking_figures(trained, mined)
    assert after["questions"] == before["questions"] > 0
    assert after["mrr"] > before["mrr"], (before, after)

    # it loads as retrieve.rerank_model (a folder) and reranks a real retrieval over the work store
    settings = make_settings(out / "work" / "store")
    settings = settings.model_copy(update={"retrieve": settings.retrieve.model_copy(update={"rerank_model": str(out)})})
    session = Session(settings)
    doc = card["held_documents"][0]
    r = retrieve("Which state's law governs this agreement?", session, docs=[doc])
    assert r.rerank is not None and r.rerank.backend == f"onnx:{out.name}" and r.rerank.scored > 0
    assert session.reranker.max_length == 256  # the length it was trained at, from reranker.json
    session.close()

    # a file that is not a labelled set is named, with the reason, exit 2
    bad = tmp_path / "bad.csv"
    bad.write_text("a,b\n1,2\n")
    res = CliRunner().invoke(app, ["tune", "reranker", str(bad), "--out", str(tmp_path / "m2")])
    assert res.exit_code == 2 and "bad.csv" in res.output and "master_clauses" in res.output, res.output
    assert "Traceback" not in res.output
