"""Retrieval behind one call: question, documents and budget -> ranked candidates -> prompt.

`ask`, `chat`, `compare` and `eval` all compose `retrieve`; none of them reaches into
the store, the lexical index or the prompt budget on its own.

    from ragkit.retrieve import retrieve
    r = retrieve("Which law governs?", session, docs=["nda.pdf"])   # a ragkit.session.Session (or Settings)
    r.prompt.ids, r.prompt.contexts, r.abstain_reason, r.timings
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import TYPE_CHECKING

from ragkit.config import Settings
from ragkit.errors import StoreError, UsageError
from ragkit.retrieve.prompt import Prompt, PromptBuilder
from ragkit.retrieve.query import is_extractive
from ragkit.retrieve.search import hybrid_search, resolve_docs
from ragkit.store import DocRecord, Hit

if TYPE_CHECKING:
    from ragkit.retrieve.rerank import RerankInfo
    from ragkit.session import Session


@dataclass
class Retrieval:
    question: str
    prompt: Prompt
    docs: list[DocRecord] = field(default_factory=list)  # the documents searched (named, or all)
    abstain_reason: str | None = None  # set when no source is relevant to the question
    timings: dict[str, float] = field(default_factory=dict)  # retrieve_s, prompt_s (rerank_s, rerank_cpu_s when it ran)
    rerank: "RerankInfo | None" = None  # the cross-encoder stage: backend, pool, best score, cost
    # chunk ids in each stage's order ("first_stage": hybrid search and the sentence ranking,
    # the order the reranker's pool is cut from; "reranked": after the cross-encoder), for
    # measuring where evidence is lost (eval/bench_ranking.py --lost-where)
    orders: dict[str, list[str]] = field(default_factory=dict)
    # the candidates in their final order (after the reranker), with their metadata: what a
    # review reads its findings from (the reranker's unit scores name chunks by id)
    ranked: list[Hit] = field(default_factory=list)
    # a question over the store that named documents (ragkit/retrieve/route.py): the names that
    # chose them (`docs` holds the documents); empty when the whole store was searched or docs were named
    routed: list[str] = field(default_factory=list)


def retrieve(question: str, session: "Session | Settings", docs: list[str] | None = None, *, generator=None,
             context: str | None = None, context_reserve: int = 0, contract_text: bool = False) -> Retrieval:
    """Rank the sources for `question` (restricted to `docs` when named) and pack them into
    a prompt within the generator's budget, with the session's embedder, store, lexical
    index and reranker (a Settings gets a Session for this call). `generator` supplies the
    tokenizer and chat template; without one, the session's (its vocabulary only when the
    generator is not loaded).

    `context` (earlier turns of a conversation, plain text) goes into the prompt after the
    sources and before the question; it is not searched with. `context_reserve` prompt
    tokens are set aside for it whether or not it is given, so a first question and its
    follow-ups pack the same sources (and share their KV-cached prefix).

    `contract_text`: the documents' own words only, reviewers' comments (a Word file's
    comments, ingest's kind "comment") left out: for a checklist, which reads the contract."""
    from ragkit.retrieve.query import search_query
    from ragkit.session import Session

    t0 = time.perf_counter()
    session = Session.of(session)
    # first: a reranker whose pinned files do not match is refused before anything loads
    reranker = session.reranker
    embedder = session.embedder
    store = session.store
    rs = session.settings.retrieve
    searched = question if rs.search_instructions else search_query(question)  # less its answer-format sentences
    qvec = embedder.embed_query(searched) if rs.mode in ("hybrid", "dense") else None
    selected, cands, whole, routed = _search(session, store, question, searched, qvec, docs)
    named = whole is not None  # named documents, or those a question over the store names
    if contract_text:
        cands = [h for h in cands if h.meta.get("kind") != "comment"]
        whole = [h for h in whole if h.meta.get("kind") != "comment"] if whole is not None else None
    best_similarity, calibration = _similarity_gate(session, store, embedder, qvec, selected, all_live=not named)
    notes: dict = {}
    kinds = _kind_lane(session, qvec, selected) if named and rs.kinds_lane > 0 and reranker is not None else []
    cands = rank_stages(searched, qvec, cands, whole, embedder, session.settings, reranker=reranker, notes=notes,
                        kinds=kinds)
    rinfo = notes.get("rerank")
    # the statement lane runs only where its tables can go (a prompt of retrieved sources)
    # (over the store: the filing of the best-ranked source, read whole only if the lane fires)
    filing = (lambda: whole) if named else partial(_best_filing, store, cands, selected)
    lane = partial(_statement_lane, question, filing, reranker if rs.rerank_pool > 0 else None, rs.statements)
    t1 = time.perf_counter()
    builder = PromptBuilder(generator if generator is not None else session.tokenizer,
                            n_ctx=session.settings.generator.n_ctx, max_tokens=session.settings.generator.max_tokens)
    prompt = _pack(builder, question, cands, whole, selected, rs, named=named, rerank=rinfo, statements=lane,
                   extra={"context": context, "reserve": context_reserve})
    t2 = time.perf_counter()
    prompt.best_similarity = best_similarity
    timings = {"retrieve_s": t1 - t0, "prompt_s": t2 - t1}
    if rinfo is not None:
        timings.update(rerank_s=rinfo.wall_s, rerank_cpu_s=rinfo.cpu_s)
    why = _abstain_why(prompt, session.settings, calibration, rinfo)
    return Retrieval(question=question, prompt=prompt, docs=selected, abstain_reason=why, timings=timings, rerank=rinfo,
                     orders=notes.get("orders", {}), ranked=cands, routed=routed)


def _search(session: "Session", store, question: str, searched: str, qvec, docs: list[str] | None) -> tuple:
    """The documents searched (`docs` when named, else those the question names by who or
    what they are, else all), the hybrid search's candidates and, for named or routed
    documents, every chunk of them, read from one consistent state of the store and named by
    a record that holds them now; and the names that routed (empty when none did)."""
    settings = session.settings
    rs = settings.retrieve

    def search(records: list[DocRecord]):
        if not records:
            raise StoreError(f"the store at {settings.store_url or settings.store} holds no documents",
                             hint="run `ragkit ingest PATH` first")
        selected = resolve_docs(records, docs or [])
        routed: list[str] = []
        if not docs and rs.route:
            from ragkit.retrieve.route import openings, route

            chosen, routed = route(question, records, openings(session, records))
            selected = chosen or selected
        # routed documents are searched as named ones, each represented (searching several as the
        # store is, within them, was measured: SEC tuning half 0.941 -> 0.882, eval/README.md "Routing")
        named = bool(docs) or bool(routed)
        lexical = None
        if rs.mode in ("hybrid", "bm25"):
            from ragkit.store.lexical_backend import open_lexical

            lexical = open_lexical(settings, store, [r.doc_id for r in records], memo=session.memo("lexical"))
        cands = hybrid_search(
            store, searched, qvec, selected, rs.candidates, mode=rs.mode, lexical=lexical, rrf_k=rs.rrf_k,
            per_doc=named, all_docs=not named, bm25_weight=rs.bm25_weight,
        )
        whole = store.chunks(sorted({d.doc_id for d in selected})) if named else None
        return selected, cands, whole, routed

    selected, cands, whole, routed = store.read_consistent(search)
    return selected, name_hits(cands, selected), (name_hits(whole, selected) if whole is not None else None), routed


def _kind_lane(session: "Session", qvec, selected: list[DocRecord]) -> list[str]:
    """The kind lane's chunk ids (ragkit/retrieve/kinds.py): when the question asks for a clause
    kind the kinds model knows, the `kinds_lane` chunks of each named document the model rates
    highest for it, read from the vectors the store holds (the model's own embedder's only)."""
    from ragkit.retrieve.kinds import kind_asked, kind_lane, session_kinds_model

    rs = session.settings.retrieve
    model = session_kinds_model(session)
    if model is None or qvec is None or session.embedder.name != model.embedder:  # its weights read that space only
        return []
    kind, similarity = kind_asked(model, qvec, session)
    if kind is None or similarity < rs.kinds_min_similarity:
        return []
    out: list[str] = []
    for rec in selected:
        got = session.store.vectors(rec.doc_id, rec.n_chunks)
        if got is not None:
            out += kind_lane(model, kind, got[0], got[1], rs.kinds_lane)
    return out


def _similarity_gate(session: "Session", store, embedder, qvec, selected: list[DocRecord], *,
                     all_live: bool) -> tuple:
    """What the similarity gate reads (`abstain_reason`): the best cosine of any chunk of
    the searched documents, and their calibration when `retrieve.abstain_margin` is on;
    (None, None) without a query vector (bm25 mode)."""
    if qvec is None:
        return None, None
    doc_ids = sorted({d.doc_id for d in selected})
    top = store.query(qvec, 1, doc_ids, all_live=all_live)
    best_similarity = top[0].score if top else 0.0
    calibration = None
    if session.settings.retrieve.abstain_margin > 0:
        from ragkit.retrieve.abstain import calibrate

        calibration = calibrate(store, embedder, doc_ids, all_live=all_live, memo=session.memo("calibration"))
    return best_similarity, calibration


def _pack(builder: PromptBuilder, question: str, cands: list[Hit], whole: list[Hit] | None,
          selected: list[DocRecord], rs, *, named: bool, rerank: "RerankInfo | None", extra: dict,
          statements: Callable[[], list[Hit]] | None = None) -> Prompt:
    """The ranked candidates packed into the prompt: at most `retrieve.top_k` sources (each
    of several named documents represented), the table lane's table beside them, the
    statement lane's tables (`statements()`, called only for a prompt of retrieved sources) in
    place of the lowest-scored of them. `rs`:
    the retrieve settings; `extra`: the conversation context and its reserve."""
    several = named and len(selected) > 1
    asked = question
    if several:
        # several named documents: the best passage of each first, then the next of each,
        # so every document is represented; and the answer is laid out per document
        cands = round_robin(cands)
        asked = f"{question}\n(Answer for each document in turn, naming it, then say how they differ.)"
    doc_order = [d.doc_id for d in selected]
    packed = cands[: max(rs.top_k, 1) * 4]
    if rs.pack == "units" and rerank is not None and rerank.units and not is_extractive(question):
        # (a question asking for the clause is answered by quoting it, not generated: no
        # prefill to save, and its quote is chosen from the whole chunks)
        from ragkit.retrieve.packing import pack_units
        from ragkit.retrieve.rank import OPENING_CHUNKS, asks_for_opening

        # a question about the title, parties or date reads the opening whole (opening_first put it first)
        opening = ({h.id for h in packed if int(h.meta.get("chunk_index", OPENING_CHUNKS)) < OPENING_CHUNKS}
                   if named and rs.opening_first and asks_for_opening(question) else set())
        packed = pack_units(packed, rerank.units, margin=rs.pack_margin, per_chunk=rs.pack_per_chunk,
                           clause_words=rs.pack_clause_words, drop=rs.pack_drop, min_sources=rs.pack_min_sources,
                           opening=rs.pack_opening, keep_share=rs.pack_keep_share, whole=opening)
    prompt = builder.build(asked, packed, whole=whole, doc_order=doc_order, whole_max=rs.whole_max_tokens, **extra)
    if prompt.mode == "retrieved":
        # keep at most top_k sources: every token of prefill costs time
        prompt = _limit(builder, asked, prompt, max(rs.top_k, len(selected)) if several else rs.top_k, each_doc=several,
                        **extra)
    if prompt.mode == "retrieved" and rerank is not None and rerank.tables:
        prompt = _with_table(builder, asked, prompt, cands, rerank, rerank.floor(rs.rerank_table_floor, "table"), doc_order, extra)
    tables = statements() if prompt.mode == "retrieved" and statements is not None else []
    if tables:
        prompt = _with_statements(builder, asked, prompt, tables, doc_order, extra)
    if several:
        _check_every_doc(prompt, selected)
    elif not named and rs.per_document == "together" and len({c.doc_id for c in prompt.contexts}) > 1:
        # a question over the store answered from several documents: which document says what
        asked = f"{question}\n{TOGETHER_NOTE}"
        prompt = builder.build(asked, [_hit_of(c) for c in prompt.contexts], **extra)
    return prompt


# what a question over the store is asked with when its sources come from several documents
# and one prompt answers for all of them (retrieve.per_document = "together")
TOGETHER_NOTE = ("(The sources come from several documents: answer for each document in turn, naming it; "
                 "never say of one document what another says.)")


def _with_table(builder: PromptBuilder, asked: str, prompt: Prompt, cands: list[Hit], rerank: "RerankInfo",
                floor: float | None, doc_order: list[str], extra: dict) -> Prompt:
    """The table lane's best table not yet in the prompt joins it beside the top_k sources:
    a statement table scores below the prose that names the same metric, so fusion alone
    rarely lifts it (SEC figure's page in the prompt 0.927 -> 0.951 on the held-out half);
    only when its cross-encoder score reaches `floor` (retrieve.rerank_table_floor)."""
    have = {c.chunk_id for c in prompt.contexts}
    want = next((t for t in rerank.tables if t not in have), None)
    if want is not None and floor is not None and rerank.scores[want] < floor:
        want = None  # the best table left reads as off the question: no tokens spent on it
    table = next((h for h in cands if h.id == want), None) if want else None
    if table is None:
        return prompt
    # packed last: the first source dropped if the budget is short
    last = min((c.score for c in prompt.contexts), default=0.0)
    hits = [_hit_of(c) for c in prompt.contexts] + [Hit(id=table.id, text=table.text, meta=table.meta, score=last)]
    return builder.build(asked, hits, doc_order=doc_order, **extra)


def _statement_lane(question: str, filing: Callable[[], list[Hit]], reranker, most: int) -> list[Hit]:
    """The statement lane's table chunks for `question`: the best chunk of each statement it
    names or implies (ragkit/retrieve/statements.py), read from `filing()`, every chunk of the
    named documents (over the store: of the best source's filing), called only if the lane fires."""
    if most <= 0:
        return []
    from ragkit.retrieve import statements as lane

    kinds = lane.asked(question, most)
    return lane.chosen(question, lane.statements(filing(), kinds), reranker) if kinds else []


def _best_filing(store, ranked: list[Hit], selected: list[DocRecord]) -> list[Hit]:
    """Every chunk of the document of the best-ranked candidate: where a question over the
    store looks for the statement it asks about. A question about one company's figures
    names the company, and its best source is that company's filing far more often than it
    is the statement (financebench-dev over all 15 filings, tuning half: the own filing's
    source first for 0.600, the gold page in the prompt 0.333 without the lane;
    eval/README.md "The statement lane")."""
    if not ranked:
        return []
    doc_id = ranked[0].meta.get("doc_id")
    return name_hits(store.chunks([doc_id]), selected) if doc_id else []


def _with_statements(builder: PromptBuilder, asked: str, prompt: Prompt, tables: list[Hit], doc_order: list[str],
                     extra: dict) -> Prompt:
    """The statement lane's tables not yet in the prompt join it in place of its lowest-scored
    sources, packed last (the first source dropped if the budget is short)."""
    have = {c.chunk_id for c in prompt.contexts}
    new = [h for h in tables if h.id not in have]
    if not new:
        return prompt
    last = min((c.score for c in prompt.contexts), default=0.0)
    # each takes the place of the lowest-scored source: the same count of sources, and few more
    # tokens (financebench tuning half: the gold page in the prompt the same, 0.867, at 2,071
    # prompt tokens against 2,195 packed beside them; 2,005 without the lane)
    # (a source that is its document's last is kept: every named document stays represented)
    kept = sorted(prompt.contexts, key=lambda c: -c.score)
    for _ in new:
        count: dict[str, int] = {}
        for c in kept:
            count[c.doc_id] = count.get(c.doc_id, 0) + 1
        drop = next((c for c in reversed(kept) if count[c.doc_id] > 1), None)
        if drop is None:
            break
        kept.remove(drop)
    hits = [_hit_of(c) for c in kept] + [Hit(id=h.id, text=h.text, meta=h.meta, score=last) for h in new]
    return builder.build(asked, hits, doc_order=doc_order, **extra)


def document_prompts(retrieval: Retrieval, generator, settings: Settings, *, most: int) -> list[Prompt]:
    """A question over the store whose sources come from several documents, as one prompt
    per document (at most `most`, the document of the best-scored source first): each holds
    that document's sources of `retrieval.prompt`, numbered as there, so each document's
    answer is generated and checked against its own sources alone. Empty when the sources
    come from one document."""
    contexts = retrieval.prompt.contexts
    docs = list(dict.fromkeys(c.doc_id for c in sorted(contexts, key=lambda c: -c.score)))
    if len(docs) < 2:
        return []
    builder = PromptBuilder(generator, n_ctx=settings.generator.n_ctx, max_tokens=settings.generator.max_tokens)
    numbers = {c.chunk_id: c.n for c in contexts}
    out = []
    for d in docs[:most]:
        hits = [_hit_of(c) for c in contexts if c.doc_id == d]
        out.append(builder.build(retrieval.question, hits, doc_order=[d], numbers=numbers))
    return out


def _check_every_doc(prompt: Prompt, selected: list[DocRecord]) -> None:
    """Several named documents: each of them must have a source in the prompt."""
    have = {c.doc_id for c in prompt.contexts}
    missing = [d.name for d in selected if d.doc_id not in have]
    if missing:
        raise UsageError(f"{', '.join(missing)} could not be represented in the prompt with the others",
                         hint="raise generator.n_ctx, or name fewer documents per question")


def _abstain_why(prompt: Prompt, settings: Settings, calibration, rerank: "RerankInfo | None") -> str | None:
    """Why to abstain: the similarity gate first (`abstain_reason`), then the reranker's
    not_found floor on the best score of its pool (RerankInfo.best)."""
    why = abstain_reason(prompt, settings, calibration)
    if why is None and rerank is not None:
        from ragkit.retrieve.abstain import reranker_reason

        why = reranker_reason(rerank.best, rerank.floor(settings.retrieve.rerank_abstain_below, "not_found"))
    return why


def rank_stages(question: str, qvec, cands: list[Hit], whole: list[Hit] | None, embedder, settings: Settings, *,
                reranker=None, notes: dict | None = None, kinds: list[str] | None = None) -> list[Hit]:
    """The ranking stages after hybrid search (ragkit/retrieve/rank.py): the best sentence
    or heading of each candidate (over every chunk of the named documents when they are
    small enough), then the cross-encoder over the first `rerank_pool` of that order fused
    with it (ragkit/retrieve/rerank.py; its RerankInfo goes to `notes["rerank"]`), then the
    opening rule, then near-duplicates dropped. `kinds`: the kind lane's chunk ids (of the
    named documents, `whole`), best first: those outside the pool join it, and with
    `kinds_weight` their order is fused with the others after the cross-encoder."""
    from ragkit.retrieve import rank

    rs = settings.retrieve
    if rs.unit_rank and cands:
        pool = whole if (whole is not None and len(whole) <= rs.unit_pool_max) else cands
        cands = rank.unit_rank(question, qvec, cands, pool, embedder, dense_weight=rs.unit_dense_weight,
                               lexical_weight=rs.unit_lexical_weight, hybrid_weight=rs.unit_hybrid_weight,
                               heading_weight=rs.unit_heading_weight, rrf_k=rs.rrf_k)
    if notes is not None:
        notes.setdefault("orders", {})["first_stage"] = [h.id for h in cands]
    if reranker is not None and cands and rs.rerank_pool > 0:
        from ragkit.retrieve.rerank import fuse_lane, rerank_hits

        pool = rs.rerank_pool
        kinds = list(dict.fromkeys(kinds or []))
        if kinds and whole is not None:  # the kind lane's chunks join the pool, right after its first `pool`
            by_id = {h.id: h for h in whole}
            head = {h.id for h in cands[:pool]}
            extra = [by_id[i] for i in kinds if i in by_id and i not in head]
            taken = {h.id for h in extra}
            cands = cands[:pool] + extra + [h for h in cands[pool:] if h.id not in taken]
            pool += len(extra)
            if notes is not None:
                notes["orders"]["kinds"] = list(kinds)
        cands, info = rerank_hits(question, cands, reranker, pool=pool, weight=rs.rerank_weight, k=rs.rrf_k,
                                  budget_s=rs.rerank_budget_s, by_units=rs.rerank_units,
                                  tables=rs.rerank_tables if whole is not None else 0,
                                  added={h.id for h in cands[rs.rerank_pool:pool]})
        if kinds and rs.kinds_weight > 0:
            cands = fuse_lane(cands, kinds, rs.kinds_weight, rs.rrf_k)
        if notes is not None:
            notes["rerank"] = info
            notes["orders"]["reranked"] = [h.id for h in cands]
    if rs.opening_first and whole is not None:
        cands = rank.opening_first(question, cands, whole)
    if rs.dedupe > 0:
        cands, _ = rank.drop_near_duplicates(cands, rs.dedupe)
    return cands


def name_hits(hits: list[Hit], records: list[DocRecord]) -> list[Hit]:
    """Name each hit by a document record that holds it now. Chunks are stored once per
    content (doc_id), so the same file ingested under a second path shares the first
    path's chunks, whose `doc_name` is the first file's; a citation must name a file the
    store has (the one asked for, or any live holder once the first is removed)."""
    holders: dict[str, list[str]] = {}
    for r in records:
        holders.setdefault(r.doc_id, []).append(r.name)
    out = []
    for h in hits:
        names = holders.get(h.meta.get("doc_id", ""))
        if names and h.meta.get("doc_name") not in names:
            h = Hit(id=h.id, text=h.text, score=h.score, meta={**h.meta, "doc_name": names[0]})
        out.append(h)
    return out


def abstain_reason(prompt: Prompt, settings: Settings, calibration=None) -> str | None:
    """Why to answer "The documents do not say." without generating, or None.

    When nothing in the documents is about the question, a small model invents an answer.
    A cosine threshold does not carry across embedders (MiniLM and e5 score in different
    ranges), so the gate reads the best source's score against what the same documents
    score, with the same embedder, for questions about nothing in them
    (`ragkit.retrieve.abstain.calibrate`): below `retrieve.abstain_margin` standard
    deviations above their mean, ragkit abstains. `retrieve.abstain_below` adds an
    absolute floor (off by default)."""
    rs = settings.retrieve
    best = prompt.best_similarity
    if best is None:
        return None
    if calibration is not None and rs.abstain_margin > 0:
        margin = calibration.margin(best)
        if margin < rs.abstain_margin:
            return (f"no source is relevant (best similarity {best:.2f} is {margin:.1f} sd above unrelated questions' "
                    f"{calibration.mean:.2f}, under {rs.abstain_margin:g})")
    if rs.abstain_below > 0 and best < rs.abstain_below:
        return f"no source is relevant (best similarity {best:.2f} < {rs.abstain_below:.2f})"
    return None


def round_robin(hits: list[Hit]) -> list[Hit]:
    """Interleave hits by document, keeping each document's own order."""
    by_doc: dict[str, list[Hit]] = {}
    for h in hits:
        by_doc.setdefault(h.meta.get("doc_id", ""), []).append(h)
    out: list[Hit] = []
    for i in range(max((len(v) for v in by_doc.values()), default=0)):
        out += [v[i] for v in by_doc.values() if i < len(v)]
    return out


def _hit_of(c) -> Hit:
    """A prompt source back as a candidate (to rebuild a prompt from some of its sources)."""
    from ragkit.ingest import changes as tracked

    return Hit(id=c.chunk_id, text=c.text, score=c.score,
               meta={"doc_name": c.doc, "doc_id": c.doc_id, "chunk_index": c.chunk_index, "section": c.section,
                     "page_start": c.page_start, "page_end": c.page_end, "kind": c.kind,
                     "changes": tracked.dumps(c.changes) if c.changes else None, "excerpt": c.excerpt})


def _limit(builder: PromptBuilder, question: str, prompt: Prompt, k: int, *, each_doc: bool = False,
           context: str | None = None, reserve: int = 0) -> Prompt:
    if len(prompt.contexts) <= k:
        return prompt
    ranked = sorted(prompt.contexts, key=lambda c: -c.score)
    # named documents: the best source of each first, then the best of the rest
    firsts = list({c.doc_id: c for c in reversed(ranked)}.values())[:k] if each_doc else []
    best = firsts + [c for c in ranked if c not in firsts][: k - len(firsts)]
    hits = [_hit_of(c) for c in best]
    order = list(dict.fromkeys(c.doc_id for c in prompt.contexts))
    return builder.build(question, hits, doc_order=order, context=context, reserve=reserve)
