"""`ask`: retrieve -> budgeted prompt -> local generation -> answer with citations.

Usable from Python:

    from ragkit.config import load_settings
    from ragkit.ask import ask
    result = ask("How long does confidentiality last?", load_settings(), docs=["nda.pdf"])
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable

from ragkit.config import Settings
from ragkit.embed import load_embedder
from ragkit.errors import StoreError, UsageError
from ragkit.generate import Choice, Generation, load_generator
from ragkit.store import open_store
from ragkit.retrieve.citations import Citation, extract, is_abstention
from ragkit.retrieve.prompt import Prompt, PromptBuilder
from ragkit.retrieve.search import hybrid_search, rerank, resolve_docs

ABSTAIN_TEXT = "The documents do not say."


@dataclass
class AskResult:
    question: str
    prompt: Prompt
    answer: str = ""
    citations: list[Citation] = field(default_factory=list)
    invalid_citations: list[int] = field(default_factory=list)
    abstained: bool = False
    abstain_reason: str | None = None
    generation: Generation | None = None
    timings: dict[str, float] = field(default_factory=dict)
    choice: Choice | None = None  # set by ask_choice

    def to_json(self) -> dict:
        g = self.generation or Generation()
        return {
            "answer": self.answer,
            "citations": [c.to_json() for c in self.citations],
            "invalid_citations": self.invalid_citations,
            "abstained": self.abstained,
            "abstain_reason": self.abstain_reason,
            "usage": {
                "prompt_tokens": len(self.prompt.ids),
                "completion_tokens": g.completion_tokens,
                "cached_tokens": g.cached_tokens,
            },
            "timings": {k: round(v, 4) for k, v in self.timings.items()},
            "mode": self.prompt.mode,
            "contexts": [c.to_json() for c in self.prompt.contexts],
        }

    def dry_run_json(self) -> dict:
        p = self.prompt
        return {
            "prompt": p.text,
            "prompt_tokens": len(p.ids),
            "n_ctx": p.n_ctx,
            "max_tokens": p.max_tokens,
            "budget": p.budget,
            "prefix_tokens": p.prefix_tokens,
            "mode": p.mode,
            "dropped": p.dropped,
            "best_similarity": p.best_similarity,
            "contexts": [
                {"n": c.n, "doc": c.doc, "page": c.page_start, "section": c.section, "text": c.text, "tokens": c.tokens}
                for c in p.contexts
            ],
        }


def build_prompt(question: str, settings: Settings, docs: list[str] | None = None, *, generator=None) -> tuple[Prompt, dict]:
    t0 = time.perf_counter()
    embedder = load_embedder(settings)
    store = open_store(settings, embedder, create=False)
    rs = settings.retrieve
    qvec = embedder.embed_query(question) if rs.mode in ("hybrid", "dense") else None
    # Optimistic read: a writer commits a document by replacing its record, then deletes
    # the old version's chunks. If the records changed while we read, read again, so
    # the sources come from one version of each document (the old or the new, never a mix).
    for _attempt in range(5):
        records = store.documents()
        if not records:
            raise StoreError(f"the store at {settings.store_url or settings.store} holds no documents", hint="run `ragkit ingest PATH` first")
        selected = resolve_docs(records, docs or [])
        lexical = None
        if rs.mode in ("hybrid", "bm25"):
            from ragkit.retrieve import bm25

            folder = bm25.index_dir(settings.store, settings.store_url, settings.collection, settings.cache_dir)
            lexical = bm25.open_index(store, folder, [r.doc_id for r in records])
        cands = hybrid_search(
            store, question, qvec, selected, rs.candidates, mode=rs.mode, lexical=lexical, rrf_k=rs.rrf_k, per_doc=bool(docs),
            all_docs=not docs, bm25_weight=rs.bm25_weight,
        )
        whole = store.chunks(sorted({d.doc_id for d in selected})) if docs else None
        if [(r.key, r.doc_id) for r in store.documents()] == [(r.key, r.doc_id) for r in records]:
            break
    best_similarity = None
    if qvec is not None:
        top = store.query(qvec, 1, sorted({d.doc_id for d in selected}), all_live=not docs)
        best_similarity = top[0].score if top else 0.0
    if rs.reranker:
        cands = rerank(question, cands, rs.reranker, rs.rerank_candidates)
    t1 = time.perf_counter()
    gen = generator or load_generator(settings, vocab_only=True)
    builder = PromptBuilder(gen, n_ctx=settings.generator.n_ctx, max_tokens=settings.generator.max_tokens)
    several = bool(docs) and len(selected) > 1
    if several:
        # several named documents: the best passage of each first, then the next of each,
        # so every document is represented; and the answer is laid out per document
        cands = _round_robin(cands)
        question = f"{question}\n(Answer for each document in turn, naming it, then say how they differ.)"
    prompt = builder.build(question, cands[: max(rs.top_k, 1) * 4], whole=whole, doc_order=[d.doc_id for d in selected])
    if prompt.mode == "retrieved":
        # keep at most top_k sources: every token of prefill costs time
        prompt = _limit(builder, question, prompt, max(rs.top_k, len(selected)) if several else rs.top_k, each_doc=several)
    if several:
        have = {c.doc_id for c in prompt.contexts}
        missing = [d.name for d in selected if d.doc_id not in have]
        if missing:
            raise UsageError(f"{', '.join(missing)} could not be represented in the prompt with the others",
                             hint="raise generator.n_ctx, or name fewer documents per question")
    t2 = time.perf_counter()
    prompt.best_similarity = best_similarity
    return prompt, {"retrieve_s": t1 - t0, "prompt_s": t2 - t1}


def _round_robin(hits: list) -> list:
    by_doc: dict[str, list] = {}
    for h in hits:
        by_doc.setdefault(h.meta.get("doc_id", ""), []).append(h)
    out = []
    for i in range(max((len(v) for v in by_doc.values()), default=0)):
        out += [v[i] for v in by_doc.values() if i < len(v)]
    return out


def _limit(builder: PromptBuilder, question: str, prompt: Prompt, k: int, *, each_doc: bool = False) -> Prompt:
    if len(prompt.contexts) <= k:
        return prompt
    from ragkit.store import Hit

    ranked = sorted(prompt.contexts, key=lambda c: -c.score)
    # named documents: the best source of each first, then the best of the rest
    firsts = list({c.doc_id: c for c in reversed(ranked)}.values())[:k] if each_doc else []
    best = firsts + [c for c in ranked if c not in firsts][: k - len(firsts)]
    hits = [
        Hit(id=c.chunk_id, text=c.text, score=c.score,
            meta={"doc_name": c.doc, "doc_id": c.doc_id, "chunk_index": c.chunk_index, "section": c.section,
                  "page_start": c.page_start, "page_end": c.page_end})
        for c in best
    ]
    order = list(dict.fromkeys(c.doc_id for c in prompt.contexts))
    return builder.build(question, hits, doc_order=order)


def _load_checked(settings: Settings):
    if settings.generator.backend == "llama_cpp" and (
        settings.profile == "kimi-k2" or settings.generator.tensor_overrides or settings.generator.n_gpu_layers
    ):
        # A plan that cannot fit would thrash the disk for an hour: refuse up front.
        from ragkit.generate.doctor import check_fit

        check_fit(settings)
    return load_generator(settings)


def ask(
    question: str,
    settings: Settings,
    docs: list[str] | None = None,
    *,
    dry_run: bool = False,
    on_text: Callable[[str], None] | None = None,
) -> AskResult:
    generator = None if dry_run else _load_checked(settings)
    t0 = time.perf_counter()
    prompt, timings = build_prompt(question, settings, docs, generator=generator)
    result = AskResult(question=question, prompt=prompt, timings=timings)
    if dry_run:
        return result
    if abstain_if_irrelevant(result, settings, t0, on_text):
        return result
    gen = generator.generate(prompt.ids, max_tokens=settings.generator.max_tokens, on_text=on_text)
    finish(result, gen, t0)
    return result


def abstain_if_irrelevant(result: AskResult, settings: Settings, t0: float, on_text: Callable[[str], None] | None = None) -> bool:
    """When nothing in the documents is about the question, answer "The documents do not
    say." without generating, instead of letting a small model invent an answer
    (measured: unanswerable questions scored 0.16-0.29 against the sample NDAs,
    answerable ones 0.39-0.70). Returns whether it abstained."""
    gate = settings.retrieve.abstain_below
    best = result.prompt.best_similarity
    if not (gate > 0 and best is not None and best < gate):
        return False
    result.answer = ABSTAIN_TEXT
    result.abstained = True
    result.abstain_reason = f"no source is relevant (best similarity {best:.2f} < {gate:.2f})"
    result.generation = Generation(prompt_tokens=len(result.prompt.ids))
    result.timings.update({"generate_s": 0.0, "ttft_s": 0.0, "total_s": time.perf_counter() - t0})
    if on_text is not None:
        on_text(result.answer)
    return True


def finish(result: AskResult, gen: Generation, t0: float) -> None:
    """Fill a result from a generation: answer, checked citations, abstention, timings."""
    result.generation = gen
    result.answer = gen.text.strip()
    result.citations, result.invalid_citations = extract(result.answer, result.prompt.contexts)
    result.abstained = is_abstention(result.answer)
    result.timings["generate_s"] = gen.total_s
    result.timings["ttft_s"] = gen.ttft_s
    result.timings["total_s"] = time.perf_counter() - t0


def match_option(text: str, options: list[str]) -> str | None:
    """The option a short free-text answer starts with ("**Yes.** The agreement..." ->
    "Yes"); the longest option wins ("Not mentioned" before "No"). None when the answer
    starts with none of them, or names two ("Yes, No or Not mentioned")."""
    import re

    low = re.sub(r"^[\W_]+", "", text.strip().lower())
    hits = [o for o in sorted(options, key=len, reverse=True) if re.match(re.escape(o.lower()) + r"\b", low)]
    if not hits:
        return None
    rest = low[len(hits[0]):][:30]
    if any(re.search(r"\b" + re.escape(o.lower()) + r"\b", rest) for o in options if o != hits[0]):
        return None
    return hits[0]


def ask_choice(
    question: str,
    options: list[str],
    settings: Settings,
    docs: list[str] | None = None,
    *,
    narrow: Callable[[Prompt, object], Prompt] | None = None,
) -> AskResult:
    """Answer with one of `options` (Yes / No / Not mentioned for a checklist item),
    scored by the generator when it can (`choose`: the options' own probabilities, no
    sampling), otherwise read from a short generated answer. The prompt is the one `ask`
    builds, so documents-first prefixes are shared with `ask` and across questions.
    `result.answer` is the option (empty when a free-text answer named none), or the
    abstention text when no source is relevant to the question.

    `narrow(prompt, generator)`, when given, turns the retrieval prompt into the one the
    options are scored on (compare: the quoted clause alone); `result.prompt` stays the
    retrieval prompt, the tokens and cache figures are the scored prompt's."""
    generator = _load_checked(settings)
    t0 = time.perf_counter()
    prompt, timings = build_prompt(question, settings, docs, generator=generator)
    result = AskResult(question=question, prompt=prompt, timings=timings)
    if abstain_if_irrelevant(result, settings, t0):
        return result
    scored = narrow(prompt, generator) if narrow is not None else prompt
    if hasattr(generator, "choose"):
        ch = generator.choose(scored.ids, options)
        gen = Generation(text=ch.option, prompt_tokens=ch.prompt_tokens, cached_tokens=ch.cached_tokens,
                         ttft_s=ch.ttft_s, total_s=ch.total_s, finish_reason="choice")
    else:
        gen = generator.generate(scored.ids, max_tokens=8)
        picked = match_option(gen.text, options)
        ch = Choice(option=picked or "", logprobs={o: (0.0 if o == picked else float("-inf")) for o in options},
                    prompt_tokens=gen.prompt_tokens, cached_tokens=gen.cached_tokens, ttft_s=gen.ttft_s,
                    total_s=gen.total_s, scored=False)
    result.choice = ch
    result.generation = gen
    result.answer = ch.option
    result.timings.update({"generate_s": gen.total_s, "ttft_s": gen.ttft_s, "total_s": time.perf_counter() - t0})
    return result
