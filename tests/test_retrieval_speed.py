"""The fast paths of retrieval give the same answers as the slow ones (speed itself is
measured by eval/bench_retrieval.py, not here).

Real documents, the real embedder and a real Chroma store: the per-document sidecars
hold exactly what Chroma holds; a query restricted to one document (a dot product over its
sidecar) returns the unrestricted search's hits of that document; texts fetched from the
sidecars equal Chroma's; a store without sidecars (written before they existed) answers
the same and gets them built; removing a document removes its sidecar."""

from __future__ import annotations

import shutil

import numpy as np
import pytest
from conftest import CORPORA, make_settings

from ragkit.embed import load_embedder
from ragkit.ingest import ingest
from ragkit.retrieve.search import hybrid_search
from ragkit.store import lexical, open_store

QUESTIONS = [
    "How long does the confidentiality obligation last?",
    "Which law governs the agreement?",
    "May the recipient disclose information to its employees?",
    "What happens to confidential information when the agreement ends?",
]


@pytest.fixture(scope="module")
def store3(tmp_path_factory):
    corpus = tmp_path_factory.mktemp("speed") / "docs"
    corpus.mkdir()
    for name in ["ai-osi-stack-mutual-nda.md", "cnli_dev_019.pdf", "common-paper-mutual-nda-v1-standard-terms.md"]:
        shutil.copy(CORPORA / name, corpus / name)
    settings = make_settings(tmp_path_factory.mktemp("speedstore") / "s")
    report = ingest([corpus], settings)
    assert report.failed == [] and report.added == 3
    return settings, corpus


def _chroma_doc(st, doc_id):
    got = st.col.get(where={"doc_id": doc_id}, include=["embeddings", "documents", "metadatas"])
    order = sorted(range(len(got["ids"])), key=lambda i: got["metadatas"][i]["chunk_index"])
    return ([got["ids"][i] for i in order], np.asarray(got["embeddings"])[order],
            [got["documents"][i] for i in order], [got["metadatas"][i] for i in order])


def test_sidecars_hold_what_chroma_holds(store3):
    settings, _ = store3
    st = open_store(settings, load_embedder(settings), create=False)
    for r in st.documents():
        ids, vecs, texts, metas = _chroma_doc(st, r.doc_id)
        assert len(ids) == r.n_chunks == st.sidecars.count(r.doc_id)
        side_ids, side_vecs = st.sidecars.vectors(r.doc_id)
        assert side_ids == ids
        unit = vecs / np.linalg.norm(vecs, axis=1, keepdims=True)
        assert np.allclose(side_vecs, unit, atol=1e-6)
        hits = st.sidecars.hits(r.doc_id)
        assert [h.text for h in hits] == texts and [h.meta for h in hits] == metas
        # the texts a search fetches are Chroma's, for any subset of chunks
        some = ids[::3]
        fetched = st.hits(some)
        assert {i: (h.text, h.meta) for i, h in fetched.items()} == {i: (t, m) for i, t, m in zip(ids, texts, metas) if i in some}


def test_one_document_search_is_the_unrestricted_search_filtered(store3):
    settings, _ = store3
    emb = load_embedder(settings)
    st = open_store(settings, emb, create=False)
    records = st.documents()
    folder = lexical.index_dir(settings.store, None, settings.collection, settings.cache_dir)
    index = lexical.open_index(st, folder, [r.doc_id for r in records])
    got = st.col.get(include=["embeddings"])
    all_ids = list(got["ids"])
    allv = np.asarray(got["embeddings"])
    allv = allv / np.linalg.norm(allv, axis=1, keepdims=True)
    for q in QUESTIONS:
        qv = emb.embed_query(q)
        exact = allv @ (np.asarray(qv) / np.linalg.norm(qv))  # every chunk, ranked exactly
        ranked = [all_ids[i] for i in np.argsort(-exact, kind="stable")]
        chroma = st.col.query(query_embeddings=[qv], n_results=len(all_ids), include=["distances"])["ids"][0]
        for r in records:
            want = [i for i in ranked if i.startswith(r.doc_id + ":")][:5]
            hits = st.query_ids(qv, 5, [r.doc_id])  # the sidecar path
            assert [i for i, _ in hits] == want, (q, r.name)
            assert [s for _, s in hits] == pytest.approx([float(exact[all_ids.index(i)]) for i in want], abs=1e-5)
            assert [i for i in chroma if i.startswith(r.doc_id + ":")][:5] == want  # Chroma agrees
            full = [i for i, _ in index.search(q, len(all_ids)) if i.startswith(r.doc_id + ":")][:5]
            assert [i for i, _ in index.search(q, 5, [r.doc_id])] == full
            one = hybrid_search(st, q, qv, [r], 8, lexical=index)
            dense8 = [i for i in ranked if i.startswith(r.doc_id + ":")][:8]
            lex8 = [i for i, _ in index.search(q, len(all_ids)) if i.startswith(r.doc_id + ":")][:8]
            assert [h.id for h in one] == [i for i, _ in lexical.rrf([dense8, lex8])][:8]


def test_search_over_every_document_runs_dense_beside_lexical_and_fuses_the_same(store3):
    """Over all live documents the dense search runs in the store's search thread while the
    lexical one runs in the caller's: the fused candidates are those of the two rankings made
    one after the other, with the store's own texts."""
    import threading

    settings, _ = store3
    emb = load_embedder(settings)
    st = open_store(settings, emb, create=False)
    records = st.documents()
    live = [r.doc_id for r in records]
    folder = lexical.index_dir(settings.store, None, settings.collection, settings.cache_dir)
    index = lexical.open_index(st, folder, live)
    seen: list[str] = []
    real = st.query_ids

    def query_ids(*a, **kw):
        seen.append(threading.current_thread().name)
        return real(*a, **kw)

    st.query_ids = query_ids
    for q in QUESTIONS:
        qv = emb.embed_query(q)
        got = hybrid_search(st, q, qv, records, 12, lexical=index, all_docs=True)
        dense = [i for i, _ in real(qv, 12, live, all_live=True)]
        lex = [i for i, _ in index.search(q, 12)]
        want = [i for i, _ in lexical.rrf([dense, lex])][:12]
        assert [h.id for h in got] == want, q
        texts = st.hits(want)
        assert [h.text for h in got] == [texts[i].text for i in want]
    assert seen and all(n.startswith("ragkit-search") for n in seen)  # not the caller's thread
    one = hybrid_search(st, QUESTIONS[0], emb.embed_query(QUESTIONS[0]), records[:1], 5, lexical=index)
    assert one and seen[-1] == threading.current_thread().name  # one document: no hand-off


def test_a_store_without_sidecars_answers_the_same_and_gets_them(store3, tmp_path):
    settings, _ = store3
    emb = load_embedder(settings)
    copy = tmp_path / "old"
    shutil.copytree(settings.store, copy)
    old_settings = settings.model_copy(update={"store": copy})
    st_new = open_store(settings, emb, create=False)
    shutil.rmtree(copy / "sidecars")  # as written before sidecars existed
    st = open_store(old_settings, emb, create=False)
    records = st.documents()
    r = records[0]
    qv = emb.embed_query(QUESTIONS[0])
    assert st.sidecars.count(r.doc_id) is None
    slow = st.query(qv, 5, [r.doc_id])  # no sidecar, no expected count: Chroma's filtered search
    fast = st_new.query(qv, 5, [r.doc_id])
    assert [h.id for h in slow] == [h.id for h in fast] and [h.text for h in slow] == [h.text for h in fast]
    assert st.sidecars.count(r.doc_id) is None
    built = st.query(qv, 5, [r.doc_id], expect={r.doc_id: r.n_chunks})  # with the record's count: built from Chroma
    assert st.sidecars.count(r.doc_id) == r.n_chunks
    assert [(h.id, h.text, h.meta) for h in built] == [(h.id, h.text, h.meta) for h in fast]
    # a count that does not match what Chroma holds (a write in progress) builds nothing
    assert not st.ensure_sidecar(records[1].doc_id, records[1].n_chunks + 1)
    assert st.sidecars.count(records[1].doc_id) is None


def _private_copy(store3, tmp_path):
    """A copy of the module's store for a test that writes to it: (settings, embedder, store)."""
    settings, _ = store3
    emb = load_embedder(settings)
    copy = tmp_path / "store"
    shutil.copytree(settings.store, copy)
    s2 = settings.model_copy(update={"store": copy})
    return s2, emb, open_store(s2, emb, create=False)


def test_removing_a_document_removes_its_sidecar(store3, tmp_path):
    _, _, st = _private_copy(store3, tmp_path)
    victim = st.documents()[0]
    assert st.sidecars.count(victim.doc_id) == victim.n_chunks
    st.remove_document(victim.key)
    assert st.sidecars.count(victim.doc_id) is None and victim.doc_id not in st.sidecars.doc_ids()
    assert st.col.get(where={"doc_id": victim.doc_id}, include=[])["ids"] == []


def test_record_list_follows_every_change_made_by_another_process(store3, tmp_path):
    """`documents()` is kept per store version (retrieve reads it twice per question; read
    in full it cost 239 ms at 5,000 documents, under load). The cache must never outlive a
    change: a document added and another removed by a separate `ragkit` process, and one
    removed through a second store object, are seen at the next call."""
    import subprocess
    import sys

    from conftest import ROOT

    s2, emb, st = _private_copy(store3, tmp_path)
    copy = s2.store
    before = st.documents()
    assert st._version() is not None and st.documents() == before  # cached, and equal
    extra = tmp_path / "extra"
    extra.mkdir()
    shutil.copy(CORPORA / "cnli_dev_411.pdf", extra / "cnli_dev_411.pdf")
    cli = [sys.executable, "-m", "ragkit.cli"]
    r = subprocess.run(cli + ["ingest", str(extra), "--store", str(copy), "--json"], cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-2000:]
    after = st.documents()
    assert {d.name for d in after} == {d.name for d in before} | {"cnli_dev_411.pdf"}
    victim = before[0]
    r = subprocess.run(cli + ["docs", "rm", victim.name, "--store", str(copy), "--json"], cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-2000:]
    assert victim.key not in {d.key for d in st.documents()}
    # within this process too: a removal through another store object of the same store
    other = open_store(s2, emb, create=False)
    other.remove_document(st.documents()[0].key)
    assert len(st.documents()) == len(before) - 1
