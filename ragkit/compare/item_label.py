"""The label of a checklist item for one document (Yes / No / Not mentioned, Found), scored
on the quoted clause and calibrated, and `compare`, which walks a checklist over documents."""

from __future__ import annotations

import math
import time
from typing import TYPE_CHECKING, Callable

from ragkit.answer.numbers import unsupported_figures  # the one figure check of ask, chat, compare and serve
from ragkit.compare.checklist import ChecklistItem, load_checklist
from ragkit.compare.quotes import _best_quote, _document_sentences, _where, evidence
from ragkit.compare.report import Comparison, Finding, Row, _renormalised, agree_on_same_quotes
from ragkit.config import Settings
from ragkit.errors import UsageError
from ragkit.paths import read_prompt
from ragkit.session import Session, settings_of

if TYPE_CHECKING:
    from ragkit.answer.ask import AskResult


def _calibrate(r, item: ChecklistItem, question: str, settings: Session | Settings) -> None:
    """Contextual calibration (Zhao et al., "Calibrate Before Use", ICML 2021): a small
    model leans to one option whatever the clause says ("No" for 33 of 34 ContractNLI
    items, measured). Score the options once with a content-free clause, and divide the
    clause's probabilities by that prior. The prior is per item and model, kept by the
    session (`session.memo("compare.priors")`)."""
    from ragkit.generate.base import option_scores
    from ragkit.store import Hit

    session = Session.of(settings)
    gen = session.generator
    priors = session.memo("compare.priors")
    key = (item.id, question, session.settings.generator.model_dump_json())
    if key not in priors:
        builder = _clause_builder(gen, session)
        empty = Hit(id="-", text="N/A", score=0.0, meta={"doc_name": "-", "doc_id": "-", "chunk_index": 0, "section": None,
                                                         "page_start": None, "page_end": None})
        priors[key] = gen.choose(builder.build(question, [empty]).ids, list(r.choice.logprobs), score=r.choice.score).token_logprobs
    r.choice.logprobs = calibrated(r.choice.logprobs, option_scores(priors[key], r.choice.score))
    r.choice.option = max(r.choice.logprobs, key=r.choice.logprobs.get)
    r.answer = r.choice.option
    if r.generation is not None:
        r.generation.text = r.choice.option



def on_point(ev: dict, cs) -> bool:
    """Whether the quote is about the checklist item, from `evidence`: the item's
    hypothesis, read as a claim by the shared claims mechanism, is supported by the quote
    (`compare.on_point_support`), its cosine stands `compare.on_point_z` deviations above
    the document's other sentences, and it holds `compare.on_point_coverage` of the
    item's (idf-weighted) content words."""
    if ev.get("z") is None:
        return True  # a one-sentence source: nothing to calibrate on, the model decides
    return (ev["z"] >= cs.on_point_z and (ev.get("coverage") or 0.0) >= cs.on_point_coverage
            and (ev.get("support") or 0.0) >= cs.on_point_support)


def calibrated(logprobs: dict[str, float], prior: dict[str, float]) -> dict[str, float]:
    """The options' log-probabilities divided by the prior, renormalised."""
    return _renormalised({o: v - prior[o] for o, v in logprobs.items()})


def clause_prompt(prompt, item: ChecklistItem, question: str, generator, settings: Session | Settings,
                  found: dict | None = None):
    """The prompt a Yes/No label is scored on in "clause" mode: the same system prompt
    and question, with the quoted clause as the only source. The label then says what
    the quote a lawyer reads says."""
    from ragkit.store import Hit

    best = _best_quote(prompt.contexts, item, settings=settings)
    if found is not None:
        found["quote"] = best  # check_item shows this quote: chosen once, not again
    if best is None:
        return prompt
    top, quote = best
    hit = Hit(id=top.chunk_id, text=quote, score=top.score,
              meta={"doc_name": top.doc, "doc_id": top.doc_id, "chunk_index": top.chunk_index, "section": top.section,
                    "page_start": top.page_start, "page_end": top.page_end})
    return _clause_builder(generator, settings).build(question, [hit])


def _clause_builder(generator, settings: Session | Settings):
    """The prompt builder for a label decided on one clause: its own instructions
    (prompts/checklist_system.txt: the answer is one option, not a cited sentence, and
    "Not mentioned" means the clause is about something else)."""
    from ragkit.retrieve.prompt import PromptBuilder

    cfg = settings_of(settings).generator
    builder = PromptBuilder(generator, n_ctx=cfg.n_ctx, max_tokens=cfg.max_tokens)
    builder.system = read_prompt("checklist_system.txt").strip()
    builder.user_tail = ""
    return builder


YES_NO = ["Yes", "No", "Not mentioned"]


def check_item(doc: str, item: ChecklistItem, settings: Session | Settings) -> tuple[Finding, "AskResult"]:
    """One checklist item asked of one document: the label (Yes / No / Not mentioned for
    a hypothesis item, Found for a free-text one), the model's confidence, and the quote.
    Used by `compare` and by the ContractNLI scoring in `ragkit eval run`."""
    from ragkit.answer.ask import ask, ask_choice
    from ragkit.generate.base import option_scores

    settings = Session.of(settings)  # one session for every step below (a Settings: for this item)
    cs = settings.settings.compare
    confidence = None
    note = None
    claims: list[dict] = []  # a free-text answer's claims, each tied to the sentence that supports it
    outcome = None  # a free-text answer's outcome (ragkit.answer.ask)
    chosen: dict = {}  # the quote, when clause mode already chose it
    if item.hypothesis is not None:
        # the label is the option the model scores highest, not parsed from free text;
        # decided on the quoted clause alone, or on the whole context (label_context)
        q = f"{item.question} Answer with exactly one of: Yes, No, Not mentioned."
        narrow = (lambda p, gen: clause_prompt(p, item, q, gen, settings, chosen)) if cs.label_context == "clause" else None
        r = ask_choice(q, YES_NO, settings, [doc], narrow=narrow)
        if r.choice is not None and r.choice.scored:
            if r.choice.token_logprobs and r.choice.score != cs.option_score:
                r.choice.logprobs = option_scores(r.choice.token_logprobs, cs.option_score)
                r.choice.score = cs.option_score
                r.choice.option = r.answer = max(r.choice.logprobs, key=r.choice.logprobs.get)
            if cs.calibrate and narrow is not None:
                _calibrate(r, item, q, settings)
            confidence = round(r.choice.confidence, 3)
        if r.choice is not None and r.choice.note:
            note = r.choice.note  # e.g. the engine gave no log-probabilities: the label was read from a short answer
        label = "Not mentioned" if r.abstained else (r.answer or "Unclear")
    else:
        from ragkit.answer.citations import is_abstention

        r = ask(item.question, settings, [doc])
        outcome = r.outcome
        if outcome == "unverified":
            # no claim of the model's answer holds ("1 year" where the contract leaves the
            # term to its cover page), or the model said the document is silent, while the
            # document has passages on point: the clause is there, and its quote is what
            # the reader relies on
            if r.model_answer and not is_abstention(r.model_answer):
                r.answer = r.model_answer
            note = "not verified against the document: no claim of the model's answer is supported; rely on the quote"
        label = "Not mentioned" if outcome == "not_found" else "Found"
        # the model's own text, when it is an answer: its figures the document lacks are noted
        said = r.model_answer if outcome == "unverified" else (r.answer if r.answer_kind == "generated" else None)
        bad = unsupported_figures(said, r.prompt.contexts) if label == "Found" and said and not is_abstention(said) else []
        claims = [c.to_json() for c in r.claims] if label == "Found" else []
        if bad:
            note = f"the answer names {', '.join(bad)}, which the document does not contain: rely on the quote"
    if not r.prompt.contexts:
        raise UsageError(f"{doc} could not be represented in the prompt", hint="raise generator.n_ctx")
    g = r.generation
    # the quote: the clause of this document that matches the checklist item best (chosen
    # from the sources, not from the model's citation: a small model often cites the
    # wrong block)
    found = chosen["quote"] if "quote" in chosen else _best_quote(r.prompt.contexts, item, settings=settings)
    top, quote = found if found else (None, None)
    ev = evidence(item, r.prompt.contexts, quote, settings)
    scores: dict = {}
    closest = None
    page, section = (top.page_start, top.section) if top else (None, None)
    if item.hypothesis is not None and r.choice is not None and not r.abstained and cs.not_mentioned == "evidence":
        topical = [(u, h) for u, h in _document_sentences(r.prompt.contexts, settings) if item.names_item(u)] if item.terms else []
        # one permission answers an item that asks whether something is allowed at all: read first
        yes = next(((u, h, w) for u, h in topical if (w := item.affirm_in(u))), None) if item.affirm else None
        cue = next(((u, h, w) for u, h in topical if (w := item.contrary_in(u))), None) if item.contrary and not yes else None
    else:
        topical, cue, yes = [], None, None
    if item.hypothesis is not None and r.choice is not None and not r.abstained:
        if yes is not None:
            # the document grants what the item asks in so many words ("may disclose ... to its
            # attorneys"): Yes, and that sentence is the quote, whatever the model scored
            label, quote, confidence, scores = "Yes", yes[0], None, {}
            page, section = _where(yes[1])
            note = f"Yes: the document says “{yes[2]}”"
            ev = evidence(item, r.prompt.contexts, quote, settings)
        elif cue is not None:
            # the document says the opposite in so many words ("whether or not marked"):
            # No, and that sentence is the quote, whatever the model scored
            label, quote, confidence, scores = "No", cue[0], None, {}
            page, section = _where(cue[1])
            note = f"No: the document says “{cue[2]}”, the opposite of the item"
            ev = evidence(item, r.prompt.contexts, quote, settings)
        elif cs.not_mentioned == "evidence" and item.terms and not topical:
            # no sentence of the document names the item ("reverse engineer", "decompile"):
            # Not mentioned, whatever the nearest passage scores
            label, closest, quote, top, confidence = "Not mentioned", quote, None, None, None
            page = section = None
            note = "Not mentioned: no sentence of the document names " + ", ".join(f"“{t}”" for t in item.terms[:4]) + (" …" if len(item.terms) > 4 else "")
        elif cs.not_mentioned == "evidence" and item.words_only:
            # an item only its words decide: neither its affirming nor its contrary wording is there
            label, closest, quote, top, confidence = "Not mentioned", quote, None, None, None
            page = section = None
            said = [*item.affirm[:2], *item.contrary[:2]]
            note = "Not mentioned: no sentence of the document says " + " or ".join(f"“{t}”" for t in said) + " or the like"
        elif cs.not_mentioned == "evidence" and not on_point(ev, cs):
            # no passage of the document is about the item: Not mentioned, whatever the
            # model says of the nearest one (it answers Yes or No about whatever it is shown)
            label, closest, quote, top, confidence = "Not mentioned", quote, None, None, None
            page = section = None
        elif r.choice.scored:
            scores = dict(r.choice.logprobs)
            if cs.not_mentioned == "evidence":  # on point: the model chooses between Yes and No
                scores = _renormalised({o: v for o, v in scores.items() if o != "Not mentioned"})
                no_min = cs.no_min_confidence
                label = "No" if no_min is not None and math.exp(scores["No"]) >= no_min else "Yes"
                # without a No threshold the Yes says "on point, no contrary wording", not the
                # model's probability (its scores stay in the JSON)
                confidence = round(math.exp(scores[label]), 3) if no_min is not None else None
    finding = Finding(
        doc=r.prompt.contexts[0].doc,
        label=label,
        answer=r.answer,
        quote=quote,
        page=page,
        section=section,
        path=None,
        prompt_tokens=g.prompt_tokens if g and g.prompt_tokens else len(r.prompt.ids),  # the prompt actually scored
        cached_tokens=g.cached_tokens if g else 0,
        seconds=r.timings.get("total_s", 0.0),
        confidence=confidence,
        note=note,
        evidence=ev,
        scores=scores,
        closest=closest,
        claims=claims,
        outcome=outcome,
    )
    return finding, r


def compare(
    docs: list[str],
    settings: Session | Settings,
    checklist: str = "nda",
    *,
    items: list[str] | None = None,
    on_progress: Callable[[str, str], None] | None = None,
) -> Comparison:
    if len(docs) < 1:
        raise UsageError("compare needs at least one document")
    name, all_items = load_checklist(checklist)
    chosen = [i for i in all_items if not items or i.id in items]
    if items and len(chosen) != len(set(items)):
        missing = sorted(set(items) - {i.id for i in chosen})
        raise UsageError(f"unknown checklist item(s): {', '.join(missing)}")
    session = Session.of(settings)  # loaded once for every document and item
    settings = session.settings
    rows = [Row(i) for i in chosen]
    prefilled: dict[str, int] = {}
    t0 = time.perf_counter()
    # one document at a time, all its items in a row: they share the document prefix
    for doc in docs:
        prefilled[doc] = 0
        for row in rows:
            f, _ = check_item(doc, row.item, session)
            row.findings[doc] = f
            prefilled[doc] += f.prompt_tokens - f.cached_tokens
            if on_progress:
                on_progress(doc, row.item.id)
    for row in rows:
        agree_on_same_quotes(row, settings.compare.no_min_confidence)
    return Comparison(name, docs, rows, prefilled, time.perf_counter() - t0, settings.generator.prompt_rate_tok_s)
