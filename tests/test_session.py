"""The Session: what the pipeline loads, loaded once per Session and passed down, and held
by nothing else. Real embedder, reranker, store and llama.cpp generator (the sample NDAs)."""

from __future__ import annotations

import gc
import weakref

import pytest

BONTERMS = "bonterms-mutual-nda-v1.pdf"
QUESTION = "How long do the confidentiality obligations survive?"


@pytest.fixture(scope="module")
def session(nda_store):
    from ragkit.session import Session

    return Session(nda_store)


def test_one_session_loads_each_part_once_for_every_question(session):
    from ragkit.answer.ask import ask
    from ragkit.compare import check_item, load_checklist

    a = ask(QUESTION, session, [BONTERMS])
    parts = (session.embedder, session.store, session.reranker, session.generator)
    assert all(p is not None for p in parts)
    b = ask("Which law governs the agreement?", session, [BONTERMS])
    item = next(i for i in load_checklist("nda")[1] if i.id == "term")
    check_item(BONTERMS, item, session)
    assert (session.embedder, session.store, session.reranker, session.generator) == parts
    assert a.prompt.contexts and b.prompt.contexts


def test_the_sessions_embedder_embeds_a_text_once(session):
    """The claim check, the passages and the checklist read the same sentences: the second
    reading costs no model call (the memo is the session's, not a module's)."""
    inner = session.embedder.inner
    calls: list[int] = []
    real = inner.embed_documents

    def counting(texts, progress=None):
        calls.append(len(texts))
        return real(texts)

    inner.embed_documents = counting  # an instance attribute: the real method runs underneath
    try:
        texts = ["Recipient may retain Confidential Information in backup systems.", "This Agreement is governed by Delaware law."]
        first = session.embedder.embed_documents(texts)
        again = session.embedder.embed_documents(list(reversed(texts)) + texts)
    finally:
        del inner.embed_documents
    assert calls == [2]
    assert again[0] == first[1] and again[2] == first[0] and len(first[0]) == inner.dim
    # what is remembered is the model's vector, kept as float32 (not a list of Python floats)
    import numpy as np

    direct = np.asarray(real(texts), dtype=np.float64)
    assert np.abs(np.asarray(first) - direct).max() < 1e-6
    kept = session.embedder._docs[texts[0]]
    assert kept.dtype == np.float32 and kept.shape == (inner.dim,)


def test_nothing_outside_a_session_keeps_what_it_loaded(nda_store):
    """A call given plain Settings gets a Session for that call; once it returns, the
    generator and the embedder it loaded are freed: no module-level cache holds them."""
    from ragkit.answer.ask import ask
    from ragkit.session import Session

    s = Session(nda_store)
    ask(QUESTION, s, [BONTERMS])
    refs = [weakref.ref(s.generator), weakref.ref(s.embedder.inner), weakref.ref(s.store)]
    del s
    gc.collect()
    assert [r() for r in refs] == [None, None, None]


def test_a_variant_shares_what_its_settings_did_not_change(session, nda_store):
    """A request's own budget (serve's search route, mcp's) keeps the loaded models."""
    session.generator  # loaded
    sized = nda_store.model_copy(update={"retrieve": nda_store.retrieve.model_copy(update={"top_k": 3})})
    v = session.with_settings(sized)
    assert v.settings.retrieve.top_k == 3
    assert v.embedder is session.embedder and v.store is session.store and v.generator is session.generator
    other = nda_store.model_copy(update={"embed": nda_store.embed.model_copy(update={"backend": "hash"})})
    w = session.with_settings(other)
    assert w.embedder is not session.embedder and w.embedder.name != session.embedder.name


def test_serve_answers_through_its_one_session(nda_store):
    """The store serve lists documents from is the one `ask` reads (no second store)."""
    from ragkit.serve.state import ServeState

    state = ServeState(nda_store)
    docs = state.documents()
    assert docs and state.store() is state.session.store
    state.invalidate()
    assert state.store() is not None and state.store() is state.session.store
