"""The reranker trained on contracts that ships with ragkit (registry `legal-minilm-l12`,
ragkit/models_data/legal-reranker, trained by `ragkit tune reranker` on CUAD and ContractNLI
training documents): pinned like every other model, and on a real CUAD contract that trained
nothing (cuad-10) it ranks the gold clauses higher than the ms-marco cross-encoder, through
the product's own retrieval."""

from __future__ import annotations

import pytest
from conftest import ROOT, SHARED, assert_a_changed_byte_is_refused, make_settings

from ragkit import models

DOC = "BIOPURECORP_06_30_1999-EX-10.13-AGENCY AGREEMENT.PDF"  # the smallest of cuad-10 (16 questions with a gold clause)


def test_the_legal_reranker_is_pinned_and_a_changed_file_is_refused(tmp_path, monkeypatch):
    spec = models.REGISTRY["legal-minilm-l12"]
    assert spec.kind == "reranker" and {f for f, _ in spec.files} >= {"model.onnx", "tokenizer.json"}
    folder = models.resolve("legal-minilm-l12", "reranker", tmp_path / "cache")
    for rel, sha in spec.files:
        assert models.sha256_file(folder / rel) == sha, rel
    assert (folder / "model.onnx").stat().st_size <= 40e6  # the bound on the model's size

    # a copy as its own package with one byte changed: refused before anything loads it
    assert_a_changed_byte_is_refused("legal-minilm-l12", "reranker", tmp_path, monkeypatch)


def test_floors_belong_to_the_model_file_they_were_fitted_on(tmp_path):
    """The floors and a label model's threshold are read from the model's own folder
    (reranker.json, label_model.json) with the sha256 of the model.onnx they were fitted on:
    the shipped folder named by its path keeps them (it turned all three off before
    2026-12-07), and a model.onnx that is another file (a retrained model in a copy of the
    folder) is refused with a clear message instead of inheriting them."""
    import shutil

    from ragkit.compare.label_model import LabelModel
    from ragkit.config import load_settings
    from ragkit.errors import ConfigError
    from ragkit.rerankers.onnx import OnnxCrossEncoder

    shipped = models.resolve("legal-minilm-l12", "reranker", tmp_path / "cache")

    def load(folder):
        s = load_settings(store=tmp_path / "store", retrieve={"rerank_model": str(folder)})
        return OnnxCrossEncoder.from_settings(s)

    by_name = OnnxCrossEncoder.from_settings(load_settings(store=tmp_path / "store"))
    assert by_name.floors == load(shipped).floors and set(by_name.floors) == {"not_found", "quote", "table"}
    copy = tmp_path / "retrained"
    shutil.copytree(shipped, copy, ignore=shutil.ignore_patterns("*.sha256"))
    assert load(copy).floors == by_name.floors
    with open(copy / "model.onnx", "r+b") as f:  # another model in the same folder
        f.seek(4096)
        b = f.read(1)
        f.seek(4096)
        f.write(bytes([b[0] ^ 1]))
    with pytest.raises(ConfigError, match="not the file its floors and threshold were fitted on") as e:
        load(copy)
    assert e.value.exit_code == 2
    # the label model's threshold the same way
    labels = tmp_path / "labels"
    shutil.copytree(models.resolve("nda-label", "label-model", tmp_path / "cache"), labels,
                    ignore=shutil.ignore_patterns("*.sha256"))
    LabelModel(labels)
    shutil.copy(copy / "model.onnx", labels / "model.onnx")
    with pytest.raises(ConfigError, match="not the file its floors and threshold were fitted on"):
        LabelModel(labels)


@pytest.fixture(scope="module")
def biopure(tmp_path_factory):
    """The contract ingested once into a real store."""
    from ragkit.ingest import ingest

    settings = make_settings(tmp_path_factory.mktemp("biopure") / "store")
    rep = ingest([SHARED / "cuad-10" / "pdf" / DOC], settings)
    assert not rep.failed
    return settings


@pytest.mark.complete
def test_on_a_held_out_contract_the_legal_reranker_ranks_gold_clauses_above_ms_marco(biopure):
    """Each question of the CUAD set on this contract retrieved by the product with one
    reranker, then the other; the rank of the first source holding the gold clause (the
    eval's own test) is compared question by question."""
    from ragkit.eval.metrics_text import quote_matches_evidence
    from ragkit.eval.sets import load_set
    from ragkit.retrieve import retrieve
    from ragkit.session import Session

    settings = biopure
    items = [i for i in load_set(ROOT / "eval/sets/cuad.jsonl") if i.doc == DOC and i.evidence]
    assert len(items) == 16

    def ranks(model: str) -> tuple[list[int], list[int]]:
        """Per question, the rank of the first source holding the gold clause in the
        reranker's own order of the pool it scored, and in the prompt's fused order."""
        # the kind lane off: the two cross-encoders compared over the same first-stage pool
        s = settings.model_copy(update={"retrieve": settings.retrieve.model_copy(update={"rerank_model": model,
                                                                                        "kinds_lane": 0})})
        session = Session(s)
        text = {h.id: h.text for h in session.store.chunks([d.doc_id for d in session.store.documents()])}
        own, fused = [], []
        for it in items:
            r = retrieve(it.question, session, docs=[DOC])
            assert r.rerank is not None and r.rerank.backend == f"onnx:{model}"
            spans = list(it.evidence_all) or [it.evidence]
            scored = sorted((i for i in r.rerank.scores if i not in r.rerank.tables), key=lambda i: -r.rerank.scores[i])
            own.append(next((n for n, i in enumerate(scored, 1) if quote_matches_evidence(text[i], spans)), 99))
            ranked = sorted(r.prompt.contexts, key=lambda c: (-c.score, c.n))
            fused.append(next((n for n, c in enumerate(ranked, 1) if quote_matches_evidence(c.text, spans)), 99))
        session.close()
        return own, fused

    mrr = lambda rs: sum(1 / r for r in rs) / len(rs)  # noqa: E731
    (own_old, fused_old), (own_new, fused_new) = ranks("ms-marco-minilm-l12"), ranks("legal-minilm-l12")
    # the model: the gold clause earlier in its own order of the pool
    assert sum(r == 1 for r in own_new) > sum(r == 1 for r in own_old) and mrr(own_new) > mrr(own_old), (own_old, own_new)
    # the prompt's order (fused with the hybrid ranking): no worse
    assert mrr(fused_new) >= mrr(fused_old), (fused_old, fused_new)


def _cuad_item(category: str):
    from ragkit.eval.sets import load_set

    (item,) = [i for i in load_set(ROOT / "eval/sets/cuad.jsonl") if i.doc == DOC and f"concerns {category} (" in i.question]
    return item


@pytest.mark.complete
def test_the_legal_floors_refuse_quote_or_doubt_a_contract_question_by_its_score(biopure):
    """The legal reranker's floors (its reranker.json's `floors`, fitted on the CUAD and ContractNLI
    tuning halves; this contract is in neither's tuning half) decide three CUAD questions
    on this contract, asked through `ask` (a question asking for the clause is answered by
    quoting, nothing generated):
    - Non-Disparagement, which the contract lacks: the pool's best score is under the
      not_found floor: not_found, with the reranker's reason;
    - Most Favored Nation, which it lacks too: over that floor, under the quote floor:
      unverified, the closest passages shown, not a supported quote;
    - Governing Law, which it holds: over both, a supported quote holding the gold clause.
    With the floors off, the two questions it lacks come back as supported quotes."""
    from ragkit.answer.ask import ask
    from ragkit.eval.metrics_text import quote_matches_evidence
    from ragkit.rerankers.onnx import OnnxCrossEncoder
    from ragkit.session import Session

    # the kind lane off: the floors were fitted on the first stage's pool and this test pins their
    # three outcomes (with the lane, its chunks change the passages a quote is chosen from: Most
    # Favored Nation, which this contract lacks, then ends not_found rather than unverified)
    biopure = biopure.model_copy(update={"retrieve": biopure.retrieve.model_copy(update={"kinds_lane": 0})})
    session = Session(biopure)
    floors = OnnxCrossEncoder.from_settings(biopure).floors  # the model file's own (its reranker.json)
    lacks, doubt, holds = _cuad_item("Non-Disparagement"), _cuad_item("Most Favored Nation"), _cuad_item("Governing Law")
    assert not lacks.answerable and not doubt.answerable and holds.answerable
    r = ask(lacks.question, session, docs=[DOC])
    assert r.outcome == "not_found" and "reranker's best score" in r.abstain_reason, (r.outcome, r.abstain_reason)
    assert f"under {floors['not_found']:g}" in r.abstain_reason, r.abstain_reason
    assert r.citations == [] and r.passages == []
    r = ask(doubt.question, session, docs=[DOC])
    assert r.outcome == "unverified" and r.answer_kind == "quoted", (r.outcome, r.unverified_reason)
    assert f"quote floor {floors['quote']:g}" in r.unverified_reason and r.passages
    assert r.answer.startswith("Not verified against the sources.")
    r = ask(holds.question, session, docs=[DOC])
    assert r.outcome == "supported" and r.answer_kind == "quoted", (r.outcome, r.unverified_reason, r.abstain_reason)
    assert any(quote_matches_evidence(p.quote, list(holds.evidence_all) or [holds.evidence]) for p in r.passages), (
        [p.quote for p in r.passages], holds.evidence)
    session.close()

    rs = biopure.retrieve.model_copy(update={"rerank_abstain_below": "off", "quote_floor": "off", "abstain_margin": 0.0})
    off = Session(biopure.model_copy(update={"retrieve": rs}))
    assert [ask(i.question, off, docs=[DOC]).outcome for i in (lacks, doubt)] == ["supported", "supported"]
    off.close()
