"""The incremental lexical index: segments per ingest, global statistics at query time.

On the real path (real documents, the real embedder, a real Chroma store, the real CLI
killed with SIGKILL): after every add, replace and remove the index equals one built from
scratch over the live chunks (and bm25s's own scores), an ingest writes a new segment and
leaves the old ones alone, a stale index is never used (a kill between the commit and the
index update, a kill between the chunk write and the commit), and readers searching
during writes only ever see live chunks."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import threading

import numpy as np
import pytest
from conftest import CORPORA, ROOT, make_settings
from conftest import NDA_QUERIES as QUERIES

from ragkit.embed import load_embedder
from ragkit.ingest import ingest
from ragkit.store import lexical, open_store


def _open(settings):
    st = open_store(settings, load_embedder(settings), create=False)
    return st, lexical.index_dir(settings.store, settings.store_url, settings.collection, settings.cache_dir)


def _live_chunks(st):
    """(ids, indexed texts, doc_ids) of the live chunks, read from Chroma the slow way."""
    live = {r.doc_id for r in st.documents()}
    got = st.col.get(include=["documents", "metadatas"])
    rows = sorted((i, lexical.index_text(t, m), m["doc_id"]) for i, t, m in zip(got["ids"], got["documents"], got["metadatas"])
                  if m["doc_id"] in live)
    return [r[0] for r in rows], [r[1] for r in rows], [r[2] for r in rows]


def _assert_equals_scratch(st, ix):
    """The index answers every query as an index built from scratch over the live chunks,
    and its scores are bm25s's ("lucene" BM25, the defaults) over the same tokens."""
    import bm25s

    ids, texts, doc_ids = _live_chunks(st)
    assert sorted(ix.ids) == ids
    assert ix.fp == lexical.fingerprint(doc_ids)
    scratch = lexical.BM25Index.build(ids, texts, doc_ids)
    ref = bm25s.BM25()
    ref.index([lexical.tokenize(t) for t in texts], show_progress=False)
    for q in QUERIES:
        got, want = ix.search(q, 10), scratch.search(q, 10)
        assert [i for i, _ in got] == [i for i, _ in want], q
        assert np.allclose([s for _, s in got], [s for _, s in want], rtol=1e-5), q
        qt = [t for t in lexical.tokenize(q) if t in ref.vocab_dict]
        if qt:
            res, sc = ref.retrieve([qt], k=len(ids), show_progress=False, n_threads=1)
            theirs = {ids[int(i)]: float(s) for i, s in zip(res[0], sc[0]) if s > 0}
            assert len(theirs) >= len(got)
            for i, s in got:
                assert s == pytest.approx(theirs[i], rel=1e-4), (q, i)
        for d in sorted(set(doc_ids)):  # restricted to one document: the unrestricted ranking's hits of it
            full = [h for h in ix.search(q, len(ids)) if h[0].rpartition(":")[0] == d][:5]
            one = ix.search(q, 5, [d])
            assert [i for i, _ in one] == [i for i, _ in full], (q, d)


def _segments(folder):
    return [e["name"] for e in json.loads((folder / "manifest.json").read_text())["segments"]]


def test_add_replace_remove_equal_a_from_scratch_index(tmp_path):
    corpus = tmp_path / "docs"
    corpus.mkdir()
    for name in ["ai-osi-stack-mutual-nda.md", "cnli_dev_019.pdf"]:
        shutil.copy(CORPORA / name, corpus / name)
    settings = make_settings(tmp_path / "store")
    ingest([corpus], settings)
    st, folder = _open(settings)
    _assert_equals_scratch(st, lexical.BM25Index.load(folder))
    first = _segments(folder)

    # add: a new segment; the old one is not rewritten
    shutil.copy(CORPORA / "common-paper-mutual-nda-v1-standard-terms.md", corpus)
    before = {p.name: p.stat().st_mtime_ns for p in (folder / first[0]).iterdir()}
    ingest([corpus], settings)
    st, folder = _open(settings)
    assert _segments(folder)[: len(first)] == first and len(_segments(folder)) == len(first) + 1
    assert {p.name: p.stat().st_mtime_ns for p in (folder / first[0]).iterdir()} == before
    _assert_equals_scratch(st, lexical.BM25Index.load(folder))

    # replace: the old version's rows stop counting, the new version's count
    md = corpus / "ai-osi-stack-mutual-nda.md"
    md.write_text(md.read_text().replace("three (3) years", "seven (7) years"))
    ingest([corpus], settings)
    st, folder = _open(settings)
    ix = lexical.BM25Index.load(folder)
    _assert_equals_scratch(st, ix)
    top = ix.search("seven years", 3)
    assert top and "seven (7) years" in st.col.get(ids=[top[0][0]])["documents"][0]

    # remove
    (corpus / "cnli_dev_019.pdf").unlink()
    ingest([corpus], settings, prune=True)
    st, folder = _open(settings)
    ix = lexical.BM25Index.load(folder)
    _assert_equals_scratch(st, ix)
    assert ix.search("Manitoba", 5) == []

    # removed, then ingested again: the same content, indexed again, equal again
    shutil.copy(CORPORA / "cnli_dev_019.pdf", corpus)
    ingest([corpus], settings)
    st, folder = _open(settings)
    _assert_equals_scratch(st, lexical.BM25Index.load(folder))


def test_merges_keep_the_results(tmp_path):
    """Many small segments merge (a log-structured merge over their postings, nothing
    tokenized again), with documents dropped on the way; the answers do not change."""
    texts = []
    for p in sorted(CORPORA.glob("*.md")):
        texts += [t for t in p.read_text().split("\n") if len(t.split()) > 5]
    docs = [(f"doc{d:02d}", [f"doc{d:02d}:{i:05d}" for i in range(2)], texts[2 * d : 2 * d + 2]) for d in range(len(texts) // 2)]
    assert len(docs) >= lexical.MERGE_FACTOR + 2
    segs = [lexical.Segment.build([d]) for d in docs]
    dropped = {docs[1][0], docs[5][0]}
    lv = {s.name: set(s.doc_ids) - dropped for s in segs}
    lv = {k: v for k, v in lv.items() if v}
    segs = [s for s in segs if s.name in lv]
    unmerged = lexical.BM25Index(segs, lv)
    msegs, mlv = lexical._merge_policy(segs, lv)
    merged = lexical.BM25Index(msegs, mlv)
    assert len(msegs) < len(segs)
    assert sorted(merged.ids) == sorted(unmerged.ids) and dropped.isdisjoint({i.split(":")[0] for i in merged.ids})
    for q in QUERIES:
        a, b = merged.search(q, 8), unmerged.search(q, 8)
        assert [i for i, _ in a] == [i for i, _ in b] and np.allclose([s for _, s in a], [s for _, s in b])
    # and the merged segment round-trips through its files
    for s in msegs:
        s.save(tmp_path)
    loaded = lexical.BM25Index([lexical.Segment.load(tmp_path / s.name) for s in msegs], mlv)
    for q in QUERIES:
        assert loaded.search(q, 8) == merged.search(q, 8)


_KILL_AT = """
import os, signal, sys
from pathlib import Path
import ragkit.ingest.pipeline as p
from ragkit.store import ChromaStore
from ragkit.config import load_settings
where = sys.argv[1]
if where == "index":  # after every commit, before the lexical index is updated
    p.sync_lexical_index = lambda store, settings: os.kill(os.getpid(), signal.SIGKILL)
else:  # after the chunks are written (and their sidecar), before the document's record
    ChromaStore.commit_document = lambda self, record: os.kill(os.getpid(), signal.SIGKILL)
p.ingest([Path(sys.argv[2])], load_settings(store=Path(sys.argv[3]), generator={"n_ctx": 2048, "max_tokens": 96}))
"""


def _killed_ingest(where: str, doc, store) -> None:
    proc = subprocess.run([sys.executable, "-c", _KILL_AT, where, str(doc), str(store)], cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == -9, proc.stderr[-2000:]


@pytest.mark.complete
def test_a_kill_between_commit_and_index_update_never_serves_a_stale_index(tmp_path):
    corpus = tmp_path / "docs"
    corpus.mkdir()
    shutil.copy(CORPORA / "ai-osi-stack-mutual-nda.md", corpus)
    settings = make_settings(tmp_path / "store")
    ingest([corpus], settings)
    st, folder = _open(settings)
    saved_fp = lexical.BM25Index.load(folder).fp

    new = corpus / "cnli_dev_019.pdf"
    shutil.copy(CORPORA / new.name, new)
    _killed_ingest("index", new, settings.store)  # SIGKILL: committed, the index not updated
    st, folder = _open(settings)
    live = [r.doc_id for r in st.documents()]
    assert {r.name for r in st.documents()} == {"ai-osi-stack-mutual-nda.md", "cnli_dev_019.pdf"}
    assert lexical.BM25Index.load(folder).fp == saved_fp != lexical.fingerprint(live)  # what is on disk is stale
    ix = lexical.open_index(st, folder, live)  # ... and is not what a reader uses
    _assert_equals_scratch(st, ix)
    assert ix.search("Manitoba", 3)  # the committed document is searchable at once

    report = ingest([corpus], settings)  # nothing to ingest: the index is brought up to date
    assert report.unchanged == 2 and report.added == 0
    st, folder = _open(settings)
    _assert_equals_scratch(st, lexical.BM25Index.load(folder))


@pytest.mark.complete
def test_a_kill_between_chunk_write_and_commit_leaves_nothing_behind(tmp_path):
    corpus = tmp_path / "docs"
    corpus.mkdir()
    shutil.copy(CORPORA / "ai-osi-stack-mutual-nda.md", corpus)
    settings = make_settings(tmp_path / "store")
    ingest([corpus], settings)
    new = tmp_path / "cnli_dev_019.pdf"
    shutil.copy(CORPORA / new.name, new)
    _killed_ingest("commit", new, settings.store)  # SIGKILL: chunks and sidecar written, no record
    st, folder = _open(settings)
    live = {r.doc_id for r in st.documents()}
    orphans = {m["doc_id"] for m in st.col.get(include=["metadatas"])["metadatas"]} - live
    assert len(orphans) == 1 and st.sidecars.doc_ids() - live == orphans  # the crash left them ...
    ix = lexical.open_index(st, folder, sorted(live))
    assert not any(i.rpartition(":")[0] in orphans for i in ix.ids)  # ... invisible to readers
    ingest([corpus], settings)  # the next writer's gc removes them (from its journal, no full scan)
    st, folder = _open(settings)
    assert {m["doc_id"] for m in st.col.get(include=["metadatas"])["metadatas"]} == live
    assert st.sidecars.doc_ids() == live
    _assert_equals_scratch(st, lexical.BM25Index.load(folder))


def test_readers_during_writes_see_only_live_chunks(tmp_path):
    corpus = tmp_path / "docs"
    corpus.mkdir()
    shutil.copy(CORPORA / "ai-osi-stack-mutual-nda.md", corpus)
    settings = make_settings(tmp_path / "store")
    ingest([corpus], settings)
    stop = threading.Event()
    seen: list[int] = []
    errors: list[str] = []

    def reader():
        st, folder = _open(settings)
        while not stop.is_set():
            try:
                def read(records):
                    live = [r.doc_id for r in records]
                    ix = lexical.open_index(st, folder, live)
                    return set(live), [i for q in QUERIES for i, _ in ix.search(q, 20)], ix.fp == lexical.fingerprint(live)

                live, hits, fp_ok = st.read_consistent(read)
                if live == {r.doc_id for r in st.documents()}:  # one version throughout
                    bad = [i for i in hits if i.rpartition(":")[0] not in live]
                    if bad or not fp_ok:
                        errors.append(f"stale: {bad[:3]} fp_ok={fp_ok}")
                seen.append(len(hits))
            except Exception as exc:  # noqa: BLE001 - the test reports any failure of a reader
                errors.append(repr(exc))

    t = threading.Thread(target=reader, daemon=True)
    t.start()
    try:
        shutil.copy(CORPORA / "cnli_dev_019.pdf", corpus)
        ingest([corpus], settings)
        md = corpus / "ai-osi-stack-mutual-nda.md"
        md.write_text(md.read_text().replace("three (3) years", "seven (7) years"))
        ingest([corpus], settings)
        (corpus / "cnli_dev_019.pdf").unlink()
        ingest([corpus], settings, prune=True)
    finally:
        stop.set()
        t.join(60)
    assert errors == [] and len(seen) >= 3, (errors[:5], len(seen))
