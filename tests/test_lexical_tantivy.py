"""The lexical index on tantivy (`retrieve.lexical = "tantivy"`, ragkit/store/lexical_tantivy.py).

On the real path (the sample NDAs, the real embedder, a real Chroma store, a real process
killed with SIGKILL): it ranks as the segments index does (tantivy's BM25 has k1 = 1.2 and
one-byte lengths, bm25s's 1.5 and exact ones: the same best chunk, nearly the same top
10), a stale index is never used (documents removed and added behind its back, its writer
lock held by another writer, a kill between tantivy's commit and the state beside it), and
a document deleted and ingested again is found once, as before."""

from __future__ import annotations

import shutil
import subprocess
import sys

from conftest import CORPORA, NDA_QUERIES, ROOT, make_settings

from ragkit.embed import load_embedder
from ragkit.ingest import ingest
from ragkit.store import lexical, open_store
from ragkit.store import lexical_tantivy as lt
from ragkit.store.lexical_backend import lexical_dir, open_lexical, refresh_lexical

# the incremental BM25 test's questions, and three more
QUERIES = [
    *NDA_QUERIES,
    "information that is publicly available is not confidential",
    "non-solicitation of employees",
    "notices in writing",
]


def _open(settings):
    st = open_store(settings, load_embedder(settings), create=False)
    return st, [r.doc_id for r in st.documents()]


def _live_chunk_ids(st) -> list[str]:
    """The live chunks' ids, read from Chroma the slow way."""
    live = {r.doc_id for r in st.documents()}
    got = st.col.get(include=["metadatas"])
    return sorted(i for i, m in zip(got["ids"], got["metadatas"]) if m["doc_id"] in live)


def _assert_exact(st, ix):
    ids = _live_chunk_ids(st)
    assert sorted(ix.ids) == ids and len(set(ix.ids)) == len(ids)
    assert ix.fp == lexical.fingerprint({i.rpartition(":")[0] for i in ids})
    for q in QUERIES:
        for cid, score in ix.search(q, 10):
            assert cid in ids and score > 0, q


def test_ranks_as_the_segments_index_on_the_sample_ndas(nda_store, tmp_path):
    settings = nda_store
    tv = settings.model_copy(update={"retrieve": settings.retrieve.model_copy(update={"lexical": "tantivy"})})
    st, live = _open(settings)
    # the shared store's tantivy index, built here from nothing (removed first, so the
    # answer does not depend on which test ran before): the first refresh writes it, a
    # second finds nothing changed and writes nothing
    shutil.rmtree(lexical_dir(tv), ignore_errors=True)
    assert refresh_lexical(tv, st) is True
    assert refresh_lexical(tv, st) is False
    seg = open_lexical(settings, st, live)
    tan = open_lexical(tv, st, live)
    assert isinstance(tan, lt.TantivyIndex) and isinstance(seg, lexical.BM25Index)
    assert sorted(tan.ids) == sorted(seg.ids) == _live_chunk_ids(st)
    top1 = overlap = 0
    for q in QUERIES:
        a, b = tan.search(q, 10), seg.search(q, 10)
        assert a and b, q
        top1 += a[0][0] == b[0][0]
        overlap += len({i for i, _ in a} & {i for i, _ in b}) / len(b)
        assert [s for _, s in a] == sorted((s for _, s in a), reverse=True)
        for d in live:  # restricted to one document: the unrestricted ranking's hits of it (the filter scores 0)
            full = [h for h in tan.search(q, len(seg.ids)) if h[0].rpartition(":")[0] == d][:5]
            assert tan.search(q, 5, [d]) == full, (q, d)
    assert top1 == len(QUERIES), top1  # the same best chunk
    assert overlap / len(QUERIES) >= 0.9, overlap / len(QUERIES)  # nearly the same top 10 (9.3 of 10 here)
    assert tan.search("Manitoba", 5) and tan.search("zzzqqq unknownword", 5) == [] and tan.search("the of", 5) == []


def _corpus(tmp_path, *names):
    corpus = tmp_path / "docs"
    corpus.mkdir(exist_ok=True)
    for n in names:
        shutil.copy(CORPORA / n, corpus / n)
    return corpus


def test_a_stale_index_is_never_used(tmp_path):
    corpus = _corpus(tmp_path, "ai-osi-stack-mutual-nda.md", "bonterms-mutual-nda-v1.pdf")
    settings = make_settings(tmp_path / "store")
    ingest([corpus], settings)  # the ingest syncs the segments index only: tantivy's is behind its back
    st, live = _open(settings)
    folder = lt.index_dir(settings.store, settings.store_url, settings.collection, settings.cache_dir)
    assert lt.refresh(st, folder) is True and lt.refresh(st, folder) is False  # nothing changed: nothing written
    saved = lt._read_state(folder)
    assert saved["fingerprint"] == lexical.fingerprint(live)

    (corpus / "bonterms-mutual-nda-v1.pdf").unlink()  # one removed, one added, behind the index's back
    shutil.copy(CORPORA / "cnli_dev_019.pdf", corpus)
    ingest([corpus], settings, prune=True)
    st, live = _open(settings)
    assert {r.name for r in st.documents()} == {"ai-osi-stack-mutual-nda.md", "cnli_dev_019.pdf"}
    assert lt._read_state(folder)["fingerprint"] != lexical.fingerprint(live)  # what is on disk is stale

    # a reader that cannot write (another writer holds tantivy's lock): filtered + built in memory
    holder = lt._index(folder, create=False).writer(heap_size=lt.WRITER_HEAP, num_threads=1)
    try:
        ix = lt.open_index(st, folder, live)
        _assert_exact(st, ix)
        assert ix.search("Manitoba", 3)  # the added document is searchable at once
        gone_only = [d for d in saved["docs"] if d in live]  # only a removal: the saved index, filtered
        ix2 = lt.open_index(st, folder, gone_only)
        assert ix2.keep == set(gone_only) and {i.rpartition(":")[0] for i in ix2.ids} == set(gone_only)
        assert all(h[0].rpartition(":")[0] in gone_only for q in QUERIES for h in ix2.search(q, 10))
    finally:
        holder.rollback()
        del holder
    assert lt._read_state(folder)["opstamp"] == saved["opstamp"]  # that reader wrote nothing

    # a reader that can: brings the saved index in step (only the changed documents) and uses it
    ix = lt.open_index(st, folder, live)
    _assert_exact(st, ix)
    assert lt._read_state(folder)["fingerprint"] == lexical.fingerprint(live)
    assert ix.search("Manitoba", 3)


_KILL = """
import os, signal, sys
from pathlib import Path
from ragkit.config import load_settings
from ragkit.embed import load_embedder
from ragkit.store import open_store, lexical_tantivy as lt
s = load_settings(store=Path(sys.argv[1]), generator={"n_ctx": 2048, "max_tokens": 96})
st = open_store(s, load_embedder(s), create=False)
lt._write_state = lambda *a, **k: os.kill(os.getpid(), signal.SIGKILL)  # after tantivy's commit, before the state
lt.refresh(st, Path(sys.argv[2]))
"""


def test_a_kill_between_the_commit_and_the_state_leaves_a_reader_correct(tmp_path):
    corpus = _corpus(tmp_path, "ai-osi-stack-mutual-nda.md")
    settings = make_settings(tmp_path / "store")
    ingest([corpus], settings)
    st, live = _open(settings)
    folder = lt.index_dir(settings.store, settings.store_url, settings.collection, settings.cache_dir)
    lt.refresh(st, folder)
    before = lt._read_state(folder)

    shutil.copy(CORPORA / "cnli_dev_019.pdf", corpus)
    ingest([corpus], settings)
    proc = subprocess.run([sys.executable, "-c", _KILL, str(settings.store), str(folder)], cwd=ROOT,
                          capture_output=True, text=True)
    assert proc.returncode == -9, proc.stderr[-2000:]
    assert lt._read_state(folder) == before and lt._committed_opstamp(folder) != before["opstamp"]  # torn

    st, live = _open(settings)
    view = lt._view(folder)  # the state is not trusted: the commit's own documents are counted
    assert view.docs == set(live) != set(before["docs"])
    ix = lt.open_index(st, folder, live)
    _assert_exact(st, ix)
    assert ix.search("Manitoba", 3)

    (corpus / "cnli_dev_019.pdf").unlink()  # and the document the torn commit added, removed
    ingest([corpus], settings, prune=True)
    st, live = _open(settings)
    ix = lt.open_index(st, folder, live)
    _assert_exact(st, ix)
    assert not ix.search("Manitoba", 3)
    assert lt._read_state(folder)["opstamp"] == lt._committed_opstamp(folder)  # in step again


def test_delete_and_add_again(tmp_path):
    corpus = _corpus(tmp_path, "ai-osi-stack-mutual-nda.md", "cnli_dev_019.pdf")
    settings = make_settings(tmp_path / "store")
    tv = settings.model_copy(update={"retrieve": settings.retrieve.model_copy(update={"lexical": "tantivy"})})
    ingest([corpus], settings)
    st, live = _open(settings)
    assert refresh_lexical(tv, st) is True  # the ingest synced the segments index only: tantivy's is built here
    ix = open_lexical(tv, st, live)
    _assert_exact(st, ix)
    n_before = len(ix.ids)
    hit = ix.search("Manitoba", 3)
    assert hit

    kept = tmp_path / "kept.pdf"
    shutil.move(corpus / "cnli_dev_019.pdf", kept)
    ingest([corpus], settings, prune=True)
    st, live = _open(settings)
    assert refresh_lexical(tv, st) is True  # the writer's sync: a delete by doc_id
    ix = open_lexical(tv, st, live)
    _assert_exact(st, ix)
    assert not ix.search("Manitoba", 3)

    shutil.move(kept, corpus / "cnli_dev_019.pdf")
    ingest([corpus], settings)
    st, live = _open(settings)
    assert refresh_lexical(tv, st) is True
    ix = open_lexical(tv, st, live)
    _assert_exact(st, ix)
    # found once, as before (the scores may move a little: a deleted row counts in tantivy's statistics until merged)
    assert len(ix.ids) == n_before and [i for i, _ in ix.search("Manitoba", 3)] == [i for i, _ in hit]


def test_a_reader_with_no_saved_index_builds_one_once(tmp_path):
    """A Chroma-server reader's cache dir starts empty: the first open builds the index
    there, later ones use it and write nothing."""
    corpus = _corpus(tmp_path, "ai-osi-stack-mutual-nda.md")
    settings = make_settings(tmp_path / "store")
    ingest([corpus], settings)
    st, live = _open(settings)
    cache = tmp_path / "cache" / "lexical-tantivy" / "http___server_ragkit"
    assert lexical_dir(settings.model_copy(update={"store_url": "http://server", "cache_dir": tmp_path / "cache"}),
                       "tantivy").parent == cache.parent
    ix = lt.open_index(st, cache, live)
    _assert_exact(st, ix)
    state = lt._read_state(cache)
    assert state["fingerprint"] == lexical.fingerprint(live)
    _assert_exact(st, lt.open_index(st, cache, live))  # a fresh process's open (no memo)
    assert lt._read_state(cache) == state  # not built again
    memo: dict = {}
    assert lt.open_index(st, cache, live, memo=memo) is lt.open_index(st, cache, live, memo=memo)  # a Session's
