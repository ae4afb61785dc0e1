"""The Session: what the pipeline loads, loaded once per Session and passed down, and held
by nothing else. Real embedder, reranker, store and llama.cpp generator (the sample NDAs)."""

from __future__ import annotations

import gc
import weakref
from collections import Counter

import pytest

BONTERMS = "bonterms-mutual-nda-v1.pdf"
QUESTION = "How long do the confidentiality obligations survive?"


@pytest.fixture(scope="module")
def session(nda_store):
    from ragkit.session import Session

    return Session(nda_store)


@pytest.fixture
def loads(monkeypatch):
    """How many times each part is loaded while the test runs: the real loaders, counted
    ("generator-vocab": a tokenizer-only load of the generator's vocabulary)."""
    import ragkit.embed.factory as embed_factory
    import ragkit.generate as generate
    import ragkit.rerankers as rerankers
    import ragkit.store as store

    n: Counter = Counter()

    def counted(part, real):
        def load(*args, **kwargs):
            n[part + ("-vocab" if kwargs.get("vocab_only") else "")] += 1
            return real(*args, **kwargs)
        return load

    monkeypatch.setattr(embed_factory, "_make", counted("embedder", embed_factory._make))
    monkeypatch.setattr(rerankers, "load_reranker", counted("reranker", rerankers.load_reranker))
    monkeypatch.setattr(generate, "load_generator", counted("generator", generate.load_generator))
    monkeypatch.setattr(store, "open_store", counted("store", store.open_store))
    return n


def _with(settings, **retrieve):
    return settings.model_copy(update={"retrieve": settings.retrieve.model_copy(update=retrieve)})


def test_one_session_loads_each_part_once_for_every_question(nda_store, loads):
    """Two questions and a checklist item through one (new) Session: each part is loaded
    once, and the session still holds those very objects afterwards."""
    from ragkit.answer.ask import ask
    from ragkit.compare import check_item, load_checklist
    from ragkit.session import Session

    s = Session(nda_store)
    a = ask(QUESTION, s, [BONTERMS])
    parts = (s.embedder.inner, s.store, s.reranker, s.generator)
    assert all(p is not None for p in parts)
    b = ask("Which law governs the agreement?", s, [BONTERMS])
    item = next(i for i in load_checklist("nda")[1] if i.id == "term")
    check_item(BONTERMS, item, s)
    assert {k: v for k, v in loads.items() if k != "generator-vocab"} == \
        {"embedder": 1, "store": 1, "reranker": 1, "generator": 1}, loads
    assert loads["generator-vocab"] <= 1  # the first prompt may count tokens before the model loads
    now = (s.embedder.inner, s.store, s.reranker, s.generator)
    assert all(x is y for x, y in zip(now, parts))
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


@pytest.mark.complete
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
    from ragkit.serve.server_state import ServeState

    state = ServeState(nda_store)
    docs = state.documents()
    assert docs and state.store() is state.session.store
    state.invalidate()
    assert state.store() is not None and state.store() is state.session.store


def test_a_variant_with_another_n_ctx_shares_all_but_the_generator(session, nda_store, loads):
    """A request's own context size (mcp's search budget): the embedder, store, reranker
    and the vocabulary are the parent's; the generator is not (another n_ctx is another
    llama.cpp context), and nothing is loaded to make the variant."""
    parts = (session.embedder, session.store, session.reranker)
    g = session.generator
    before = dict(loads)
    sized = nda_store.model_copy(update={"generator": nda_store.generator.model_copy(update={"n_ctx": 1024})})
    v = session.with_settings(sized)
    assert (v.embedder, v.store, v.reranker) == parts and all(x is y for x, y in zip((v.embedder, v.store, v.reranker), parts))
    assert not v.has_generator  # its own, loaded only if it generates
    assert v.tokenizer is g  # the same vocabulary and chat template: counted with the loaded model
    assert dict(loads) == before, loads


def test_a_variant_with_another_rerank_pool_gets_the_reranker_it_needs(nda_store, loads):
    """A parent that reranks nothing (pool 0, no reranker) hands a variant with a pool the
    cross-encoder it needs, loaded once in the parent for every such variant; a variant with
    pool 0 of a reranking parent reranks nothing, and the parent keeps its own."""
    from ragkit.rerankers.onnx import OnnxCrossEncoder
    from ragkit.session import Session

    off = Session(_with(nda_store, rerank_pool=0))
    assert off.reranker is None
    on = off.with_settings(_with(nda_store, rerank_pool=24))
    ce = on.reranker
    assert isinstance(ce, OnnxCrossEncoder)
    again = off.with_settings(_with(nda_store, rerank_pool=12, top_k=3))
    assert again.reranker is ce and loads["reranker"] == 1  # loaded once, in the parent
    assert off.reranker is None  # the parent itself still reranks nothing

    parent = Session(_with(nda_store, rerank_pool=24))
    none = parent.with_settings(_with(nda_store, rerank_pool=0))
    assert none.reranker is None
    assert parent.reranker is not None and loads["reranker"] == 2


def test_variants_share_the_reranker_the_parent_loads_when_they_first_need_it(nda_store, loads):
    """The parent had not reranked yet when its variants were made (every mcp `search` is a
    variant of the server's session): the first variant's use loads it in the parent, and the
    parent and every later variant use that one."""
    from ragkit.serve.mcp_tools import RagkitTools
    from ragkit.serve.server_state import ServeState
    from ragkit.session import Session

    parent = Session(nda_store)
    a = parent.with_settings(_with(nda_store, top_k=3))
    b = parent.with_settings(_with(nda_store, top_k=5))
    ce = a.reranker
    assert ce is not None and b.reranker is ce and parent.reranker is ce
    assert loads["reranker"] == 1

    # mcp's search, twice, on the server's session: one cross-encoder
    state = ServeState(nda_store)
    tools = RagkitTools(state)
    state.load()
    for q in (QUESTION, "Which law governs the agreement?"):
        assert tools.search(q, [BONTERMS], max_tokens=600).passages
    assert state.session.reranker is not None and loads["reranker"] == 2  # the server's, loaded by the first search


def test_a_variant_with_another_reranker_loads_its_own(session, nda_store, loads):
    """Another cross-encoder setting (here its thread count; or rerank off) is not the
    parent's reranker: the variant loads its own (or none) and the parent keeps its."""
    mine = session.reranker
    n = loads["reranker"]
    other = session.with_settings(_with(nda_store, rerank_threads=nda_store.retrieve.rerank_threads + 1))
    assert other.reranker is not None and other.reranker is not mine and loads["reranker"] == n + 1
    off = session.with_settings(_with(nda_store, rerank="off"))
    assert off.reranker is None and session.reranker is mine
    assert other.embedder is session.embedder and other.store is session.store  # the rest is shared


def test_closing_a_variant_leaves_the_parents_generator(session, nda_store):
    """A variant that shares the parent's generator lets go of it on close(); only the
    session that loaded a generator frees it (the llama.cpp model of the whole server)."""
    g = session.generator
    closed: list[object] = []
    g.close = lambda: closed.append(g)  # an instance attribute: counts the calls, frees nothing
    try:
        v = session.with_settings(_with(nda_store, top_k=3))
        assert v.generator is g
        v.close()
        assert closed == [] and session.has_generator and session.generator is g
    finally:
        del g.close
