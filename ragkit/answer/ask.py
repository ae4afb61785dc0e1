"""`ask`: retrieve -> budgeted prompt -> local generation -> answer with citations.

Usable from Python:

    from ragkit.config import load_settings
    from ragkit.answer.ask import ask
    from ragkit.session import Session
    session = Session(load_settings())            # loads each part once, on first use
    result = ask("How long does confidentiality last?", session, docs=["nda.pdf"])
    result.outcome   # "supported" | "unverified" | "not_found"

Every answer ends in one of three outcomes, never conflated:

- **supported**: the model's answer, with each claim tied to the source sentence that
  supports it (`ragkit.answer.claims`); a question that asks for the clause itself
  ("Which part of this contract concerns X? Quote it.") is answered by quoting the best
  sentences of the sources, not by generation (`answer_kind` "quoted"), when the reranker
  finds the sources on point (its best score at its quote floor, `retrieve.quote_floor`).
- **unverified**: a claim of the model's answer is not supported (or the model said the
  documents do not say; or a question asking for the clause scores under the quote floor)
  while the sources hold passages on point: the answer is "Not
  verified against the sources." and those passages, quoted with document, page and
  section (`passages`); the model's text is kept in `model_answer`, marked as unverified.
- **not_found**: the evidence says the documents lack it (the store-calibrated retrieval
  gate, no sentence naming the question's key terms, or no passage above the relevance
  floor, `ragkit.answer.passages`): "The documents do not say.", citing nothing.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable

from ragkit.answer.citations import Citation, extract, is_abstention
from ragkit.answer.claims import Claim
from ragkit.answer.passages import Found, Passage
from ragkit.config import Settings
from ragkit.generate import Choice, Generation
from ragkit.retrieve import Retrieval, retrieve
from ragkit.retrieve.prompt import Prompt
from ragkit.session import Session

ABSTAIN_TEXT = "The documents do not say."
UNVERIFIED_TEXT = "Not verified against the sources."
UNVERIFIED_HEAD = UNVERIFIED_TEXT + " The passages that answer the question best:"
OUTCOMES = ("supported", "unverified", "not_found")


@dataclass
class DocumentAnswer:
    """What one document says, when a question over the store is answered document by
    document (`retrieve.per_document`): its answer, generated and checked against its own
    sources alone, with its outcome, claims, citations and passages."""

    doc: str
    doc_id: str
    outcome: str
    answer: str
    claims: list[Claim] = field(default_factory=list)
    citations: list[Citation] = field(default_factory=list)
    passages: list[Passage] = field(default_factory=list)
    reason: str | None = None  # why it is not supported (unverified or not_found)
    model_answer: str | None = None

    def to_json(self) -> dict:
        return {"doc": self.doc, "outcome": self.outcome, "answer": self.answer, "reason": self.reason,
                "model_answer": self.model_answer, "claims": [c.to_json() for c in self.claims],
                "citations": [c.to_json() for c in self.citations], "passages": [p.to_json() for p in self.passages]}


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
    claims: list[Claim] = field(default_factory=list)  # the answer's claims, each tied to its source sentence(s)
    unsupported_answer: str | None = None  # the generated answer when no claim of it was supported (then replaced)
    outcome: str = "supported"  # supported | unverified | not_found (see the module's doc)
    passages: list[Passage] = field(default_factory=list)  # unverified, or a quoted answer: the passages shown
    model_answer: str | None = None  # the model's own text when the answer shown is not it (unverified, not_found)
    # "quoted": answered by quoting the sources (a question asking for the clause); "changes":
    # the documents' unaccepted tracked changes listed (a question about what was struck or inserted)
    answer_kind: str = "generated"
    unverified_reason: str | None = None  # why the model's answer is not verified (outcome unverified)
    findings: list[DocumentAnswer] = field(default_factory=list)  # a question over several documents: one per document
    # a question over the store that named documents by who they are (ragkit/retrieve/route.py):
    # the documents searched and the question's names that chose them
    routed: dict[str, list[str]] = field(default_factory=dict)

    @classmethod
    def from_retrieval(cls, r: Retrieval) -> "AskResult":
        routed = {"documents": [d.name for d in r.docs], "names": list(r.routed)} if r.routed else {}
        return cls(question=r.question, prompt=r.prompt, timings=dict(r.timings), routed=routed)

    def source_notes(self, c: Citation) -> list[str]:
        """A citation's notes (`Context.notes_for`): a reviewer's comment, unaccepted changes."""
        ctx = next((x for x in self.prompt.contexts if x.n == c.n), None)
        return ctx.notes_for(c.quote) if ctx is not None else []

    def to_json(self) -> dict:
        g = self.generation or Generation()
        return {
            "answer": self.answer,
            "citations": [{**c.to_json(), "notes": self.source_notes(c)} for c in self.citations],
            "invalid_citations": self.invalid_citations,
            "claims": [c.to_json() for c in self.claims],
            "outcome": self.outcome,
            "answer_kind": self.answer_kind,
            "passages": [p.to_json() for p in self.passages],
            "model_answer": self.model_answer,
            "unverified_reason": self.unverified_reason,
            "findings": [f.to_json() for f in self.findings],
            "routed": self.routed or None,
            # kept for compatibility: abstained is true for not_found only
            "abstained": self.abstained,
            "abstain_reason": self.abstain_reason,
            "unsupported_answer": self.unsupported_answer,
            "usage": {
                # answered document by document: every prompt prefilled, not the shared one
                "prompt_tokens": g.prompt_tokens if self.findings else len(self.prompt.ids),
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


def ask(
    question: str,
    session: Session | Settings,
    docs: list[str] | None = None,
    *,
    dry_run: bool = False,
    on_text: Callable[[str], None] | None = None,
    context: str | None = None,
    context_reserve: int = 0,
    max_tokens: int | None = None,
    generator=None,
    contract_text: bool = False,
) -> AskResult:
    """Answer `question` from the documents (all, or those named in `docs`).

    The steps, in order: retrieve (`ragkit.retrieve.retrieve`: candidates -> prompt);
    answer without generating when retrieval refuses or the question asks for the clause
    itself (`answer_without_generating`); generate; check the answer (`check_answer`:
    citations, claims, whether they answer the question, the passages on point); and the
    outcome, decided in one place (`decide_outcome`).

    `on_text` receives the answer as it is generated; an exception it raises stops the
    generation and propagates. `context` is earlier conversation (plain text) placed in
    the prompt before the question, not searched with; `context_reserve` prompt tokens are
    kept for it either way (see `ragkit.retrieve.retrieve`). `max_tokens` caps this
    answer below `generator.max_tokens` (the prompt budget stays that of the settings, so
    the cached prefix does not change). `generator`: an already loaded one to use (else
    the session's). `contract_text`: reviewers' comments left out (`ragkit.retrieve.retrieve`).
    A Settings gets a Session for this call."""
    session = Session.of(session)
    if generator is None and not dry_run:
        generator = session.generator
    t0 = time.perf_counter()
    r = retrieve(question, session, docs, generator=generator, context=context, context_reserve=context_reserve,
                 contract_text=contract_text)
    result = AskResult.from_retrieval(r)
    if dry_run:
        return result
    if answer_without_generating(result, r, t0, session, on_text):
        return result
    cap = session.settings.generator.max_tokens
    limit = cap if max_tokens is None else max(1, min(max_tokens, cap))
    if not docs and session.settings.retrieve.per_document == "each" and answer_per_document(
            result, r, session, generator, limit, t0, on_text):
        return result
    gen = generator.generate(r.prompt.ids, max_tokens=limit, on_text=on_text)
    finish(result, gen, t0, session)
    return result


def answer_per_document(result: AskResult, r: Retrieval, session: Session, generator, limit: int, t0: float,
                        on_text: Callable[[str], None] | None = None) -> bool:
    """A question that names no document, whose sources come from several: one short
    answer per document (`ragkit.retrieve.pipeline.document_prompts`), each generated and
    checked against that document's sources alone (`finish`), so no claim about one
    document rests on another's sentence. The answer names each document before what it
    says; the documents whose sources hold nothing on point are named after them. The
    outcome: supported when every document answered is, unverified when one is not, and
    not_found when none holds anything on point. Returns whether it answered (False: the
    sources come from one document)."""
    from ragkit.retrieve.pipeline import document_prompts

    prompts = document_prompts(r, generator, session.settings, most=session.settings.retrieve.per_document_max)
    if not prompts:
        return False
    gens: list[Generation] = []
    for i, prompt in enumerate(prompts):
        doc = prompt.contexts[0].doc
        if on_text is not None:
            on_text(("\n\n" if i else "") + f"{doc}: ")
        part = AskResult(question=result.question, prompt=prompt)
        gen = generator.generate(prompt.ids, max_tokens=limit, on_text=on_text)
        finish(part, gen, t0, session)
        gens.append(gen)
        for c in part.claims:
            c.doc = doc
        result.findings.append(DocumentAnswer(
            doc=doc, doc_id=prompt.contexts[0].doc_id, outcome=part.outcome, answer=display_text(part),
            claims=part.claims, citations=part.citations, passages=part.passages,
            reason=part.unverified_reason or part.abstain_reason, model_answer=part.model_answer))
    shown = [f for f in result.findings if f.outcome != "not_found"]
    silent = [f.doc for f in result.findings if f.outcome == "not_found"]
    lines = [f"{f.doc}: {f.answer}" for f in shown]
    if silent and shown:
        lines.append("Nothing on point among the sources of " + ", ".join(silent) + ".")
    result.claims = [c for f in result.findings for c in f.claims]
    result.citations = [c for f in shown for c in f.citations]
    result.passages = [p for f in shown for p in f.passages]
    if not shown:
        _not_found(result, "; ".join(f"{f.doc}: {f.reason}" for f in result.findings))
    else:
        result.answer = "\n\n".join(lines)
        unverified = [f for f in shown if f.outcome == "unverified"]
        result.outcome = "unverified" if unverified else "supported"
        if unverified:
            result.unverified_reason = "; ".join(f"{f.doc}: {f.reason}" for f in unverified)
    result.answer_kind = "per_document"
    result.generation = Generation(
        text=result.answer, prompt_tokens=sum(g.prompt_tokens for g in gens),
        completion_tokens=sum(g.completion_tokens for g in gens), cached_tokens=sum(g.cached_tokens for g in gens),
        ttft_s=gens[0].ttft_s, total_s=sum(g.total_s for g in gens), finish_reason=gens[-1].finish_reason)
    result.timings.update({"generate_s": result.generation.total_s, "ttft_s": gens[0].ttft_s,
                           "total_s": time.perf_counter() - t0})
    return True


@dataclass
class Evidence:
    """What the steps before the outcome found, read by `decide_outcome` alone.

    `refused`: retrieval's reason to refuse (nothing relevant: not_found, nothing generated).
    `quoted`: the question asks for the clause itself, answered by quoting `found`.
    Otherwise the answer is the model's: `why` says why it is not verified (None: it is),
    `found` holds the passages on point (None: not looked for, the answer was not checked),
    `model_abstained` whether the model said the documents do not say."""

    refused: str | None = None
    quoted: bool = False
    why: str | None = None
    found: Found | None = None
    model_abstained: bool = False


def answer_without_generating(result: AskResult, r: Retrieval, t0: float, session: Session,
                              on_text: Callable[[str], None] | None = None) -> bool:
    """Answer before generating, when the answer cannot be the model's: retrieval found
    nothing relevant (`abstain_if_irrelevant`) or the question asks for the clause itself
    (`answer_by_quoting`). Returns whether it answered."""
    return (answer_tracked_changes(result, r, t0, session, on_text) or abstain_if_irrelevant(result, r, t0, on_text)
            or answer_by_quoting(result, r, t0, session, on_text))


def answer_tracked_changes(result: AskResult, r: Retrieval, t0: float, session: Session,
                           on_text: Callable[[str], None] | None = None) -> bool:
    """A question about the unaccepted tracked changes of the documents searched ("What did
    the other side strike?": `ragkit.answer.redline`) is answered by listing them, each with
    its author, day and clause, without generating: the struck words are in no sentence of
    the text, so a model could only guess and the checks would call the documents silent.
    Returns whether it answered (only when a document searched carries such changes)."""
    from ragkit.answer import redline
    from ragkit.answer.citations import best_quote

    changed = [d for d in r.docs if d.tracked_changes]
    if not changed or not redline.asks_about_changes(result.question):
        return False
    hits = session.store.chunks(sorted({d.doc_id for d in changed}))
    text, shown = redline.listing(result.question, changed, hits)
    by_id = {c.chunk_id: c for c in result.prompt.contexts}
    cites: dict[int, Citation] = {}
    for h, change in shown:
        ctx = by_id.get(h.id)
        if ctx is not None and ctx.n not in cites:
            cites[ctx.n] = Citation(ctx.n, ctx.doc, ctx.page_start, ctx.section,
                                    best_quote(ctx.text, f"{change.before} {change.text} {change.after}"), inferred=True)
    result.answer, result.answer_kind, result.outcome = text, "changes", "supported"
    result.citations = [cites[n] for n in sorted(cites)]
    result.generation = Generation(prompt_tokens=len(result.prompt.ids))
    result.timings.update({"generate_s": 0.0, "ttft_s": 0.0, "total_s": time.perf_counter() - t0})
    if on_text is not None:
        on_text(result.answer)
    return True


def abstain_if_irrelevant(result: AskResult, r: Retrieval, t0: float, on_text: Callable[[str], None] | None = None) -> bool:
    """Answer "The documents do not say." without generating when retrieval found nothing
    relevant (`Retrieval.abstain_reason`). Returns whether it abstained."""
    if r.abstain_reason is None:
        return False
    _answered_without_generating(result, Evidence(refused=r.abstain_reason), t0, on_text)
    return True


def answer_by_quoting(result: AskResult, r: Retrieval, t0: float, session: Session,
                      on_text: Callable[[str], None] | None = None) -> bool:
    """A question that asks for the clause itself ("Which part of this contract concerns X?
    Quote it.", "Highlight the parts ...": `ragkit.retrieve.query.is_extractive`) is
    answered by quoting the sources' best passages, without generating (a small model
    restates such a question instead of quoting). not_found when no passage is on point.
    Returns whether it answered (off with `retrieve.extractive = false`)."""
    from ragkit.retrieve.query import is_extractive

    if not session.settings.retrieve.extractive or not is_extractive(result.question):
        return False
    why = None
    if r.rerank is not None:
        # a quote is the answer only when the reranker finds the sources on point: under its
        # quote floor the closest passages are shown as not verified (eval/README.md "Reranker")
        floor = r.rerank.floor(session.settings.retrieve.quote_floor, "quote")
        if floor is not None and r.rerank.best is not None and r.rerank.best < floor:
            why = (f"no passage is clearly on point (the reranker's best score {r.rerank.best:.2f} is under its quote "
                   f"floor {floor:g})")
    _answered_without_generating(result, Evidence(quoted=True, why=why, found=passages_on_point(result, session)), t0,
                                 on_text)
    return True


def _answered_without_generating(result: AskResult, evidence: Evidence, t0: float,
                                 on_text: Callable[[str], None] | None) -> None:
    result.generation = Generation(prompt_tokens=len(result.prompt.ids))
    decide_outcome(result, evidence)
    result.timings.update({"generate_s": 0.0, "ttft_s": 0.0, "total_s": time.perf_counter() - t0})
    if on_text is not None:
        on_text(result.answer)


def finish(result: AskResult, gen: Generation, t0: float, session: Session | Settings | None = None) -> None:
    """Fill a result from a generation: the answer and its checked citations, then (with a
    session or settings: the store's embedder reads them) the checks of `check_answer`,
    then the outcome (`decide_outcome`), and the timings. Without a session nothing is
    checked: the outcome is the model's (not_found when it said the documents do not say)."""
    result.generation = gen
    result.answer = gen.text.strip()
    result.citations, result.invalid_citations = extract(result.answer, result.prompt.contexts)
    result.timings["generate_s"] = gen.total_s
    result.timings["ttft_s"] = gen.ttft_s
    if session is None:
        abstained = is_abstention(result.answer)
        evidence = Evidence(model_abstained=abstained, why="the model said the documents do not say" if abstained else None)
    else:
        evidence = check_answer(result, Session.of(session))
    decide_outcome(result, evidence)
    result.timings["total_s"] = time.perf_counter() - t0


def check_answer(result: AskResult, session: Session) -> Evidence:
    """The checks of a generated answer, in order: did the model say the documents do not
    say; its claims, each tied to the source sentence that supports it (`attach_claims`);
    whether the supported ones answer the question (`unverified_reason`); and, when the
    answer is not verified, the passages on point that the reader is shown instead."""
    abstained = is_abstention(result.answer)
    t1 = time.perf_counter()
    if not abstained:
        attach_claims(result, session)
    result.timings["claims_s"] = time.perf_counter() - t1
    why = unverified_reason(result, session, abstained)
    found = passages_on_point(result, session) if why is not None else None
    return Evidence(why=why, found=found, model_abstained=abstained)


def attach_claims(result: AskResult, session: Session) -> None:
    """Split the answer into claims and tie each to the source sentence that supports it
    (`ragkit.answer.claims`), read by the session's embedder."""
    from ragkit.answer.claims import attribute

    result.claims = attribute(result.answer, result.prompt.contexts, session.embedder, question=result.question)


def unverified_reason(result: AskResult, session: Session, model_abstained: bool) -> str | None:
    """Why a generated answer is not verified, or None when it is: each claim of it is
    supported by a source sentence, and they answer the question. A small model asked about
    something the documents lack writes a plausible clause, and asked about something
    they hold it may still write the wrong one, or say they are silent: the reader is told
    which, from the evidence. With `retrieve.abstain_unsupported = false` an answer the
    model gave is kept as verified."""
    if not model_abstained and not session.settings.retrieve.abstain_unsupported:
        return None
    held = [c for c in result.claims if c.supported]
    if model_abstained:
        return "the model said the documents do not say"
    if held and responsive(result.question, held, result.prompt.contexts):
        loose = len(result.claims) - len(held)
        if not loose:
            return None
        # an answer is supported only when each of its claims is: one invented claim beside
        # supported ones ("A breach carries a $50,000 penalty.") makes it unverified, named
        return (f"{loose} of {len(result.claims)} claims of the answer {'is' if loose == 1 else 'are'} not supported "
                "by a source sentence")
    if held:
        return "the supported claims do not answer the question (their sentences name none of its key words)"
    if result.claims:
        return f"no claim of the answer is supported by a source sentence ({len(result.claims)} checked)"
    return "the answer makes no claim a source sentence could support"


def passages_on_point(result: AskResult, session: Session) -> Found:
    """The sources' passages on point for the question (`ragkit.answer.passages.best_passages`), timed."""
    from ragkit.answer.passages import best_passages

    t1 = time.perf_counter()
    rs = session.settings.retrieve
    found = best_passages(result.question, result.prompt.contexts, session.embedder, relevance_min=rs.relevance_min,
                          reranker=session.reranker if rs.passages_by == "reranker" else None)
    result.timings["passages_s"] = time.perf_counter() - t1
    return found


def decide_outcome(result: AskResult, evidence: Evidence) -> None:
    """The one place an answer's outcome is decided (see the module's doc), from what the
    steps before found:

    - retrieval refused -> not_found;
    - a question asking for the clause -> supported, the passages quoted; the reranker's best
      score under its quote floor -> unverified, the closest passages shown; none on point -> not_found;
    - the model's answer verified (each of its claims supported) -> supported;
    - not verified, passages on point -> unverified: the passages are the answer, the
      model's text kept and marked; none -> not_found."""
    from ragkit.answer.passages import quoted_answer

    if evidence.refused is not None:
        _not_found(result, evidence.refused)
        return
    found = evidence.found
    if evidence.quoted:
        result.answer_kind = "quoted"
        if found is not None and found.passages and evidence.why is not None:
            _unverified(result, evidence.why, found.passages)
        elif found is not None and found.passages:
            result.outcome = "supported"
            result.passages = found.passages
            result.answer = quoted_answer(found.passages)
            result.citations = _passage_citations(found.passages)
        else:
            _not_found(result, (found.not_found if found is not None else None) or "no passage is on point")
        return
    if evidence.why is None:
        result.outcome = "supported"
        return
    if found is None:  # not checked: the model's own refusal stands
        _not_found(result, evidence.why)
        return
    result.model_answer = result.answer
    if not evidence.model_abstained:
        result.unsupported_answer = result.answer
    if found.passages:
        _unverified(result, evidence.why, found.passages)
    else:
        _not_found(result, f"{evidence.why}, and {found.not_found or 'no passage is on point'}")


def _unverified(result: AskResult, why: str, passages: list[Passage]) -> None:
    from ragkit.answer.passages import quoted_answer

    result.outcome = "unverified"
    result.unverified_reason = why
    result.passages = passages
    result.answer = quoted_answer(passages, head=UNVERIFIED_HEAD)
    result.citations = _passage_citations(passages)
    result.abstained, result.abstain_reason = False, None


def _passage_citations(passages: list[Passage]) -> list[Citation]:
    # chosen by ragkit, not marked by the model: `inferred`
    seen: dict[int, Citation] = {}
    for p in passages:
        seen.setdefault(p.n, Citation(p.n, p.doc, p.page, p.section, p.quote, inferred=True))
    return [seen[n] for n in sorted(seen)]


def _not_found(result: AskResult, reason: str) -> None:
    result.outcome = "not_found"
    result.answer = ABSTAIN_TEXT
    result.abstained = True
    result.abstain_reason = reason
    result.citations = []  # a not_found answer cites no source
    result.passages = []


NOT_SUPPORTED_NOTE = "Not supported by the sources: "


def display_text(result: AskResult, show_model: bool = True) -> str:
    """The answer as a reader is shown it (before any list of sources), the same in a
    terminal, a non-streamed and a streamed `ragkit serve` answer (a stream's text is its
    beginning): supported -> the answer; unverified -> the model's text (when
    `show_model` and it is an answer, not "The documents do not say.") then "Not verified
    against the sources." and the passages; not_found -> the model's text when it made
    claims, then "Not supported by the sources: The documents do not say."."""
    model = result.model_answer if show_model else None
    if model and is_abstention(model):
        model = None  # the model's refusal is not shown: the outcome says what the sources hold
    if result.outcome == "unverified":
        return (f"{model}\n\n" if model else "") + unsupported_note(result) + result.answer
    scope = f"\n\n{routed_note(result)}" if result.outcome == "not_found" and result.routed else ""
    if result.outcome == "not_found" and model:
        return f"{model}\n\n{NOT_SUPPORTED_NOTE}{ABSTAIN_TEXT}{scope}"
    return result.answer + scope


def routed_note(result: AskResult) -> str:
    """Which documents a routed question searched, and why: a not_found answer speaks for
    them, not for the store ("" when the question was not routed)."""
    if not result.routed:
        return ""
    return (f"Searched {', '.join(result.routed['documents'])} only: the question names "
            f"{', '.join(result.routed['names'])} (name a document with --doc, or set retrieve.route "
            f"= false, to search otherwise).")


def unsupported_note(result: AskResult) -> str:
    """When some claims of an unverified answer are supported and others not, the ones no
    source sentence supports, named: "Not supported by the sources: “...”.", else ""."""
    loose = [c.text for c in result.claims if not c.supported]
    if not loose or len(loose) == len(result.claims) or result.findings:  # per document: each finding says its own
        return ""
    return NOT_SUPPORTED_NOTE + " ".join(f"\u201c{t.strip()}\u201d" for t in loose) + "\n\n"


class StreamGate:
    """What of a streamed answer to show as it comes, so that the stream ends as
    `display_text` reads: the text is held while it may be the abstention sentence ("The
    documents do not say." is shown only once the sources say so), leading whitespace is
    dropped and trailing whitespace held (the answer is stripped), and with `hold_all`
    nothing is shown before the answer is checked.

        gate = StreamGate()
        send(gate.feed(piece))                   # for each generated piece
        send(gate.finish(display_text(result)))  # the rest, once the outcome is known
    """

    def __init__(self, hold_all: bool = False):
        self.hold_all = hold_all
        self.text = ""
        self.sent = 0

    def feed(self, piece: str) -> str:
        self.text = (self.text + piece).lstrip() if not self.sent else self.text + piece
        if self.hold_all or not self.text:
            return ""
        if not self.sent:
            low = " ".join(self.text.lower().split())
            if low.startswith(ABSTAIN_TEXT.lower()[:-1]) or ABSTAIN_TEXT.lower().startswith(low):
                return ""  # may be, or is, the abstention sentence
        body = self.text.rstrip()
        out, self.sent = body[self.sent:], len(body)
        return out

    def finish(self, full: str) -> str:
        """The rest of `full` after what was shown (all of it, after a blank line, in the
        unexpected case that what was shown is not its beginning)."""
        shown = self.text[: self.sent]
        if full.startswith(shown):
            return full[len(shown):]
        return "\n\n" + full


def responsive(question: str, claims: list[Claim], contexts) -> bool:
    """Whether a supported claim answers the question: its source sentence (or section
    heading) names one of the question's key words (`ragkit.answer.passages.key_terms`).
    A small model asked which law governs may copy the counterparts sentence: supported,
    and no answer."""
    from ragkit.answer.passages import key_terms
    from ragkit.evidence.words import words

    want = key_terms(question, contexts)
    if not want:
        return True
    return any(want & words(f"{s.quote} {s.section or ''}") for c in claims for s in c.citations)


def ask_choice(
    question: str,
    options: list[str],
    session: Session | Settings,
    docs: list[str] | None = None,
    *,
    narrow: Callable[[Prompt, object], Prompt] | None = None,
    score: bool = True,
    contract_text: bool = False,
) -> AskResult:
    """Answer with one of `options` (Yes / No / Not mentioned for a checklist item),
    scored by the generator when it can (`choose`: the options' own probabilities, no
    sampling), otherwise read from a short generated answer. The prompt is the one `ask`
    builds, so documents-first prefixes are shared with `ask` and across questions.
    `result.answer` is the option (empty when a free-text answer named none), or the
    abstention text when no source is relevant to the question.

    `narrow(prompt, generator)`, when given, turns the retrieval prompt into the one the
    options are scored on (compare: the quoted clause alone); `result.prompt` stays the
    retrieval prompt, the tokens and cache figures are the scored prompt's.

    `score=False`: retrieval and the relevance gate only (`result.choice` stays None, the
    generator is neither loaded nor run): for a caller whose decision the options' scores
    cannot change (compare's default rule). `contract_text`: as `ask`'s."""
    session = Session.of(session)
    generator = session.generator if score else None
    t0 = time.perf_counter()
    r = retrieve(question, session, docs, generator=generator, contract_text=contract_text)
    result = AskResult.from_retrieval(r)
    if abstain_if_irrelevant(result, r, t0) or not score:
        result.timings.setdefault("total_s", time.perf_counter() - t0)
        return result
    prompt = r.prompt
    scored = narrow(prompt, generator) if narrow is not None else prompt
    if hasattr(generator, "choose"):
        ch = generator.choose(scored.ids, options)
        gen = Generation(text=ch.option, prompt_tokens=ch.prompt_tokens, cached_tokens=ch.cached_tokens,
                         ttft_s=ch.ttft_s, total_s=ch.total_s, finish_reason="choice")
    else:
        from ragkit.generate.base import choose_by_text

        ch = choose_by_text(generator, scored.ids, options)
        gen = Generation(text=ch.option, prompt_tokens=ch.prompt_tokens, cached_tokens=ch.cached_tokens,
                         ttft_s=ch.ttft_s, total_s=ch.total_s, finish_reason="stop")
    result.choice = ch
    result.generation = gen
    result.answer = ch.option
    result.timings.update({"generate_s": gen.total_s, "ttft_s": gen.ttft_s, "total_s": time.perf_counter() - t0})
    return result
