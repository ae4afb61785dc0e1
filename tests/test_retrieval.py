"""Hybrid retrieval: BM25 (bm25s) + dense (Chroma) fused by RRF, kept in sync with the store."""

from __future__ import annotations

import shutil

import pytest
from conftest import CORPORA, make_settings

from ragkit.embed import load_embedder
from ragkit.ingest import ingest
from ragkit.retrieve.search import hybrid_search, rerank, resolve_docs
from ragkit.store import lexical, open_store


def _lexical(settings):
    st = open_store(settings, load_embedder(settings), create=False)
    folder = lexical.index_dir(settings.store, settings.store_url, settings.collection, settings.cache_dir)
    return st, folder


def test_tokenizer_handles_english_and_chinese():
    toks = lexical.tokenize("The Recipient's obligations survive; 第三条 乙方应当保密")
    # stemmed: the possessive and the plural fold to the plain word's token; stopwords go
    assert set(lexical.tokenize("recipient obligation")) <= set(toks) and lexical.tokenize("the") == []
    assert {"第三", "三条", "保密"} <= set(toks)


def test_rrf_rewards_agreement():
    fused = dict(lexical.rrf([["a", "b", "c"], ["c", "a", "d"]], k=60))
    assert fused["a"] == pytest.approx(1 / 61 + 1 / 62)
    assert max(fused, key=fused.get) == "a"
    assert fused["d"] == pytest.approx(1 / 63)


def test_bm25_index_stays_in_sync_with_chroma(tmp_path):
    corpus = tmp_path / "docs"
    corpus.mkdir()
    for name in ["cnli_dev_019.pdf", "ai-osi-stack-mutual-nda.md"]:
        shutil.copy(CORPORA / name, corpus / name)
    settings = make_settings(tmp_path / "store")
    ingest([corpus], settings)

    def check():
        st, folder = _lexical(settings)
        ix = lexical.BM25Index.load(folder)
        live = {r.doc_id for r in st.documents()}
        got = st.col.get(include=["metadatas"])
        chroma_ids = sorted(i for i, m in zip(got["ids"], got["metadatas"]) if m["doc_id"] in live)
        assert ix is not None and sorted(ix.ids) == chroma_ids
        assert ix.fp == lexical.fingerprint(sorted(live))
        return st, ix

    check()
    md = corpus / "ai-osi-stack-mutual-nda.md"
    md.write_text(md.read_text().replace("three (3) years", "seven (7) years"))
    ingest([corpus], settings)
    st, ix = check()
    hits = ix.search("seven years confidentiality survive", 3)
    assert hits and "seven (7) years" in st.col.get(ids=[hits[0][0]])["documents"][0]
    assert ix.search("three (3) years survive", 5, [r.doc_id for r in st.documents() if r.name == md.name]) == [] or all(
        "three (3)" not in t for t in st.col.get(ids=[h for h, _ in ix.search("three (3) years survive", 5)])["documents"]
    )
    md.unlink()
    ingest([corpus], settings, prune=True)
    st, ix = check()
    assert {r.name for r in st.documents()} == {"cnli_dev_019.pdf"}


def test_a_stale_index_is_never_used(tmp_path):
    settings = make_settings(tmp_path / "store")
    ingest([CORPORA / "cnli_dev_019.pdf"], settings)
    st, folder = _lexical(settings)
    stale = lexical.BM25Index.build(["ghost:00000"], ["Manitoba governing law"], ["ghost"], "old-fingerprint")
    stale.save(folder)
    live = [r.doc_id for r in st.documents()]
    ix = lexical.open_index(st, folder, live)
    assert "ghost:00000" not in ix.ids and ix.ids and ix.fp == lexical.fingerprint(live)


def test_hybrid_finds_exact_terms_and_respects_doc_filter(nda_store):
    settings = nda_store
    st, folder = _lexical(settings)
    records = st.documents()
    index = lexical.open_index(st, folder, [r.doc_id for r in records])
    emb = load_embedder(settings)
    q = "Which province's laws govern the agreement? Manitoba"
    hits = hybrid_search(st, q, emb.embed_query(q), records, 8, mode="hybrid", lexical=index)
    top3 = [h.meta["doc_name"] + " :: " + h.meta.get("section", "") for h in hits[:3]]
    assert any("cnli_dev_019.pdf" in t and "Governing Law" in t for t in top3), top3
    only = resolve_docs(records, ["bonterms-mutual-nda-v1.pdf"])
    hits = hybrid_search(st, q, emb.embed_query(q), only, 8, mode="hybrid", lexical=index)
    assert hits and {h.meta["doc_name"] for h in hits} == {"bonterms-mutual-nda-v1.pdf"}
    # several named documents: each is represented
    two = resolve_docs(records, ["bonterms-mutual-nda-v1.pdf", "cnli_dev_054.docx"])
    hits = hybrid_search(st, q, emb.embed_query(q), two, 6, mode="hybrid", lexical=index, per_doc=True)
    assert [h.meta["doc_name"] for h in hits[:2]] in (["bonterms-mutual-nda-v1.pdf", "cnli_dev_054.docx"], ["cnli_dev_054.docx", "bonterms-mutual-nda-v1.pdf"])


def test_reranker_reorders_by_a_local_cross_encoder(tmp_path, nda_store):
    """A tiny random CrossEncoder built here (no cross-encoder ships weights on PyPI):
    the reranked order must be the order of its own scores."""
    from sentence_transformers import CrossEncoder
    from transformers import BertConfig, BertForSequenceClassification

    from ragkit.models import resolve

    tok_dir = resolve("minilm", "embedder", nda_store.cache_dir)
    out = tmp_path / "tiny-ce"
    cfg = BertConfig(vocab_size=30522, hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64, num_labels=1)
    BertForSequenceClassification(cfg).save_pretrained(out)
    for f in ["vocab.txt", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"]:
        shutil.copy(tok_dir / f, out / f)
    st, folder = _lexical(nda_store)
    records = st.documents()
    q = "How long does confidentiality survive?"
    index = lexical.open_index(st, folder, [r.doc_id for r in records])
    hits = hybrid_search(st, q, None, records, 10, mode="bm25", lexical=index)
    assert len(hits) >= 5
    reranked = rerank(q, hits, str(out), top=5)
    scores = CrossEncoder(str(out), device="cpu").predict([(q, h.text) for h in hits[:5]], show_progress_bar=False)
    expect = [hits[i].id for i in sorted(range(5), key=lambda i: -float(scores[i]))]
    assert [h.id for h in reranked[:5]] == expect
    assert [h.id for h in reranked[5:]] == [h.id for h in hits[5:]]
