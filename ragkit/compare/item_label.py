"""The label of a checklist item for one document (Yes / No / Not mentioned, Found), scored
on the quoted clause and calibrated (`check_item`); `compare` (ragkit.compare.compare)
walks a checklist over documents with it."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ragkit.compare.checklist import ChecklistItem
from ragkit.compare.quotes import choose_quote, document_sentences, evidence, place_of
from ragkit.compare.report import Finding, renormalised
from ragkit.config import Settings
from ragkit.errors import UsageError
from ragkit.evidence.figures import unsupported_figures  # the one figure check of ask, chat, compare and serve
from ragkit.evidence.sentences import LIST_ITEM
from ragkit.ingest.changes import touching
from ragkit.paths import read_prompt
from ragkit.session import Session, settings_of

if TYPE_CHECKING:
    from ragkit.answer.ask import AskResult


def _calibrate(r, item: ChecklistItem, question: str, session: Session | Settings) -> None:
    """Contextual calibration (Zhao et al., "Calibrate Before Use", ICML 2021): a small
    model leans to one option whatever the clause says ("No" for 33 of 34 ContractNLI
    items, measured). Score the options once with a content-free clause, and divide the
    clause's probabilities by that prior. The prior is per item and model, kept by the
    session (`session.memo("compare.priors")`)."""
    from ragkit.generate.base import option_scores
    from ragkit.store import Hit

    session = Session.of(session)
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
    return renormalised({o: v - prior[o] for o, v in logprobs.items()})


def clause_prompt(prompt, item: ChecklistItem, question: str, generator, session: Session | Settings,
                  found: dict | None = None):
    """The prompt a Yes/No label is scored on in "clause" mode: the same system prompt
    and question, with the quoted clause as the only source. The label then says what
    the quote a lawyer reads says."""
    from ragkit.store import Hit

    best = choose_quote(prompt.contexts, item, session=session)
    if found is not None:
        found["quote"] = best  # check_item shows this quote: chosen once, not again
    if best is None:
        return prompt
    top, quote = best
    hit = Hit(id=top.chunk_id, text=quote, score=top.score,
              meta={"doc_name": top.doc, "doc_id": top.doc_id, "chunk_index": top.chunk_index, "section": top.section,
                    "page_start": top.page_start, "page_end": top.page_end})
    return _clause_builder(generator, session).build(question, [hit])


def _clause_builder(generator, session: Session | Settings):
    """The prompt builder for a label decided on one clause: its own instructions
    (prompts/checklist_system.txt: the answer is one option, not a cited sentence, and
    "Not mentioned" means the clause is about something else)."""
    from ragkit.retrieve.prompt import PromptBuilder

    cfg = settings_of(session).generator
    builder = PromptBuilder(generator, n_ctx=cfg.n_ctx, max_tokens=cfg.max_tokens)
    builder.system = read_prompt("checklist_system.txt").strip()
    builder.user_tail = ""
    return builder


YES_NO = ["Yes", "No", "Not mentioned"]


@dataclass
class _Label:
    """What check_item decides for one item of one document, step by step: the label and
    the model's confidence, a note for the reader, the quote with its place and evidence,
    the scores, and for a free-text item its claims and outcome."""

    label: str
    confidence: float | None = None
    note: str | None = None
    claims: list[dict] = field(default_factory=list)  # a free-text answer's claims, each tied to the sentence that supports it
    outcome: str | None = None  # a free-text answer's outcome (ragkit.answer.ask)
    quote: str | None = None
    page: int | None = None
    section: str | None = None
    evidence: dict | None = None
    scores: dict = field(default_factory=dict)
    closest: str | None = None
    generated: bool = True  # the label's prompt was prefilled by the generator (False: the label model decided)
    decided_by: str | None = None
    probabilities: dict = field(default_factory=dict)


def check_item(doc: str, item: ChecklistItem, session: Session | Settings) -> tuple[Finding, "AskResult"]:
    """One checklist item asked of one document: the label (Yes / No / Not mentioned for
    a hypothesis item, Found for a free-text one), the model's confidence, and the quote.
    Used by `compare` and by the ContractNLI scoring in `ragkit eval run`."""
    session = Session.of(session)  # one session for every step below (a Settings: for this item)
    chosen: dict = {}  # the quote, when clause mode already chose it
    model = label_model_for(item, session) if item.hypothesis is not None else None
    if model is not None:
        r, decided = _model_label(doc, item, session, model)
        return _finding(decided, r), r
    if item.hypothesis is not None:
        r, decided = _hypothesis_label(doc, item, session, chosen)
    else:
        r, decided = _free_text_label(doc, item, session)
    if not r.prompt.contexts:
        raise UsageError(f"{doc} could not be represented in the prompt", hint="raise generator.n_ctx")
    _quote(decided, r, item, session, chosen)
    if item.hypothesis is not None and not r.abstained and (r.choice is not None or not generator_decides(session.settings.compare)):
        _label_on_evidence(decided, r, item, session)
    return _finding(decided, r), r


def label_model_for(item: ChecklistItem, session: Session):
    """The label model that decides this item (compare.label_model: "auto" the checklist's,
    "off" none, else that model), loaded once per session; None: the wording and the
    generator decide."""
    from ragkit.compare.label_model import load_label_model

    chosen = session.settings.compare.label_model
    name = item.label_model if chosen == "auto" else (None if chosen == "off" else chosen)
    if not name:
        return None
    models = session.memo("compare.label_models")
    if name not in models:
        models[name] = load_label_model(name, session)
    return models[name]


def _model_label(doc: str, item: ChecklistItem, session: Session, model) -> tuple["AskResult", _Label]:
    """A hypothesis item labelled by the label model (ragkit.compare.label_model): the
    document retrieved as `ask` retrieves it (its contexts name the document), then the
    model reads the document's sentences nearest the hypothesis; the label rests on the one
    most likely about the item, which is the quote (for Not mentioned: the closest clause).
    The generator decides nothing and nothing is prefilled."""
    from ragkit.answer.ask import AskResult
    from ragkit.compare.label_model import candidates, hypothesis_of, probability_line
    from ragkit.retrieve.pipeline import retrieve

    t0 = time.perf_counter()
    r = AskResult.from_retrieval(retrieve(item.question, session, [doc], contract_text=True))  # tokens counted by the vocabulary alone
    if not r.prompt.contexts:
        raise UsageError(f"{doc} could not be represented in the prompt", hint="raise generator.n_ctx")
    t1 = time.perf_counter()
    if session.settings.compare.words_first and (words := _words_decide(item, r, session)) is not None:
        r.answer = words.label
        r.timings.update({"label_s": time.perf_counter() - t1, "total_s": time.perf_counter() - t0})
        return r, words
    hyp = hypothesis_of(item, model)
    d = model.decide(hyp, candidates(hyp, r.prompt.contexts, session, model.candidates))
    decided = _Label(d.checklist_label, confidence=d.confidence, generated=False)
    decided.scores = {lab: round(math.log(max(d.probabilities[k], 1e-9)), 4)
                      for k, lab in (("Entailment", "Yes"), ("Contradiction", "No"), ("NotMentioned", "Not mentioned"))}
    decided.decided_by = f"label model {model.name}"
    decided.probabilities = {lab: round(d.probabilities[k] if k != "NotMentioned" else 1.0 - d.about, 3)
                             for k, lab in (("Entailment", "Yes"), ("Contradiction", "No"), ("NotMentioned", "Not mentioned"))}
    unit = d.evidence.unit if d.evidence is not None else None
    if d.label == "NotMentioned":
        decided.closest = unit
    else:
        decided.quote = unit
        decided.page, decided.section = place_of(d.evidence.hit)
        decided.evidence = evidence(item, r.prompt.contexts, unit, session)
    if d.low_confidence:
        # a reader must see it: the cell shows the note
        decided.note = f"low confidence ({probability_line(d)}): read the {'quote' if unit and decided.quote else 'document'}"
    r.answer = decided.label
    r.timings.update({"label_s": time.perf_counter() - t1, "total_s": time.perf_counter() - t0})
    return r, decided


def _words_decide(item: ChecklistItem, r, session: Session) -> _Label | None:
    """compare.words_first: the checklist's words that decide before the label model (chosen
    on the documents that trained nothing, eval/README.md): a sentence that says the item's
    contrary in so many words (No), no sentence that names its terms, and a words_only item
    without its words (Not mentioned). Its affirming words decide nothing (with them the model
    did worse there); a sentence holding them leaves the item to the model, as it leaves the
    contrary unread without one. None: the model decides."""
    topical, yes, cue = _wording(item, r.prompt.contexts, session)
    if yes is not None:
        return None
    decided = _Label("Not mentioned", generated=False)
    if cue is not None:
        _said_in_so_many_words(decided, "No", cue, item, r, session)
        decided.note = f"No: the document says “{cue[2]}”, the opposite of the item"
        return decided
    if (item.terms and not topical) or item.words_only:
        decided.decided_by = "wording"
        decided.note = _names_no_term(item) if item.terms and not topical else _says_no_words(item)
        return decided
    return None


def _hypothesis_label(doc: str, item: ChecklistItem, session: Session, chosen: dict) -> tuple["AskResult", _Label]:
    """A hypothesis item's label: the option the model scores highest (not parsed from
    free text), decided on the quoted clause alone or on the whole context
    (compare.label_context), rescored and calibrated as compare says."""
    from ragkit.answer.ask import ask_choice

    cs = session.settings.compare
    q = f"{item.question} Answer with exactly one of: Yes, No, Not mentioned."
    narrow = (lambda p, gen: clause_prompt(p, item, q, gen, session, chosen)) if cs.label_context == "clause" else None
    r = ask_choice(q, YES_NO, session, [doc], narrow=narrow, score=generator_decides(cs), contract_text=True)
    confidence = None
    note = None
    if r.choice is not None and r.choice.scored:
        if r.choice.token_logprobs and r.choice.score != cs.option_score:
            _rescore(r, cs.option_score)
        if cs.calibrate and narrow is not None:
            _calibrate(r, item, q, session)
        confidence = round(r.choice.confidence, 3)
    if r.choice is not None and r.choice.note:
        note = r.choice.note  # e.g. the engine gave no log-probabilities: the label was read from a short answer
    label = "Not mentioned" if r.abstained else (r.answer or "Unclear")
    # nothing prefilled when the generator was not run (abstained, or generator_decides is False)
    return r, _Label(label, confidence=confidence, note=note, decided_by="evidence" if r.abstained else "generator",
                     generated=r.choice is not None)


def generator_decides(cs) -> bool:
    """Whether the generator's answer can change a hypothesis label: the model decides Not
    mentioned (compare.not_mentioned "model"), its No has a threshold
    (compare.no_min_confidence), or its written answer may decide (compare.text_labels).
    Otherwise (the default) an on-point quote with no contrary wording is Yes whatever it
    scores, so it is not run (the labels and quotes are the same: 51 items of 3 held-out
    ContractNLI NDAs, 2026-12-06; one NDA of 17 items 43.0 -> 18.5 s on 2 cores with the
    default 0.5B, `eval/bench_checklist.py --docs`, eval/README.md)."""
    return cs.not_mentioned == "model" or cs.no_min_confidence is not None or cs.text_labels


def _rescore(r, option_score: str) -> None:
    """The options scored from their token log-probabilities as compare.option_score says,
    and the option chosen again on those scores."""
    from ragkit.generate.base import option_scores

    r.choice.logprobs = option_scores(r.choice.token_logprobs, option_score)
    r.choice.score = option_score
    r.choice.option = r.answer = max(r.choice.logprobs, key=r.choice.logprobs.get)


def _free_text_label(doc: str, item: ChecklistItem, session: Session) -> tuple["AskResult", _Label]:
    """A free-text item's label (Found, or Not mentioned when ask found nothing), its
    claims and outcome, and a note when the answer is unverified or names figures the
    document lacks."""
    from ragkit.answer.ask import ask
    from ragkit.answer.citations import is_abstention

    r = ask(item.question, session, [doc], contract_text=True)
    outcome = r.outcome
    note = None
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
    return r, _Label(label, note=note, claims=claims, outcome=outcome, decided_by="answer")


def _quote(decided: _Label, r, item: ChecklistItem, session: Session, chosen: dict) -> None:
    """The quote: the clause of this document that matches the checklist item best (chosen
    from the sources, not from the model's citation: a small model often cites the wrong
    block), its page and section, and its evidence."""
    found = chosen["quote"] if "quote" in chosen else choose_quote(r.prompt.contexts, item, session=session)
    top, quote = found if found else (None, None)
    decided.quote = quote
    decided.evidence = evidence(item, r.prompt.contexts, quote, session)
    decided.page, decided.section = (top.page_start, top.section) if top else (None, None)


def _label_on_evidence(decided: _Label, r, item: ChecklistItem, session: Session) -> None:
    """A hypothesis item's label as the document's own sentences decide it: its wording
    that grants or denies the item in so many words, then (compare.not_mentioned
    "evidence") no sentence that names the item or no passage on point, and else the
    model's choice between Yes and No."""
    cs = session.settings.compare
    evidence_decides = cs.not_mentioned == "evidence"
    topical, yes, cue = _wording(item, r.prompt.contexts, session) if evidence_decides else ([], None, None)
    if yes is not None:
        # the document grants what the item asks in so many words ("may disclose ... to its
        # attorneys"): Yes, and that sentence is the quote, whatever the model scored
        _said_in_so_many_words(decided, "Yes", yes, item, r, session)
        decided.note = f"Yes: the document says “{yes[2]}”"
    elif cue is not None:
        # the document says the opposite in so many words ("whether or not marked"):
        # No, and that sentence is the quote, whatever the model scored
        _said_in_so_many_words(decided, "No", cue, item, r, session)
        decided.note = f"No: the document says “{cue[2]}”, the opposite of the item"
    elif evidence_decides and item.terms and not topical:
        # no sentence of the document names the item ("reverse engineer", "decompile"):
        # Not mentioned, whatever the nearest passage scores
        _not_mentioned(decided)
        decided.note = _names_no_term(item)
    elif evidence_decides and item.words_only:
        # an item only its words decide: neither its affirming nor its contrary wording is there
        _not_mentioned(decided)
        decided.note = _says_no_words(item)
    elif evidence_decides and not on_point(decided.evidence, cs):
        # no passage of the document is about the item: Not mentioned, whatever the
        # model says of the nearest one (it answers Yes or No about whatever it is shown)
        _not_mentioned(decided)
    elif r.choice is None:
        # the generator was not run (generator_decides): on point, nothing says the opposite
        decided.label, decided.confidence, decided.scores, decided.decided_by = "Yes", None, {}, "evidence"
    elif r.choice.scored:
        _yes_or_no(decided, r, cs)
    elif not cs.text_labels:
        _evidence_only(decided, cs)


def _evidence_only(decided: _Label, cs) -> None:
    """A generator that cannot score the options (no log-probabilities) does not decide the
    label from its written answer (unless compare.text_labels): on point, the label is the
    evidence's Yes, as for a scoring model without a No threshold; the note says why."""
    said = decided.label
    decided.decided_by = "evidence"
    decided.label, decided.confidence, decided.scores = ("Yes" if cs.not_mentioned == "evidence" else "Unclear"), None, {}
    decided.note = (f"the generator cannot score the options, so its answer ({said}) does not decide the label; "
                    "set compare.text_labels = true to let it")


def _names_no_term(item: ChecklistItem) -> str:
    """The note of an item no sentence of the document names."""
    return "Not mentioned: no sentence of the document names " + ", ".join(f"“{t}”" for t in item.terms[:4]) + \
        (" …" if len(item.terms) > 4 else "")


def _says_no_words(item: ChecklistItem) -> str:
    """The note of a words_only item whose affirming and contrary wording are both absent."""
    said = [*item.affirm[:2], *item.contrary[:2]]
    return "Not mentioned: no sentence of the document says " + " or ".join(f"“{t}”" for t in said) + " or the like"


def _wording(item: ChecklistItem, contexts, session: Session):
    """(the document's sentences that name the item, the first that affirms it, the first
    that says its contrary): one permission answers an item that asks whether something
    is allowed at all, so the affirming wording is read first and, when found, no
    contrary is looked for."""
    sentences = _whole_sentences(document_sentences(contexts, session))
    topical = [(u, h) for u, h in sentences if item.names_item(u)] if item.terms else []
    yes = next(((u, h, w) for u, h in topical if (w := item.affirm_in(u))), None) if item.affirm else None
    cue = next(((u, h, w) for u, h in topical if (w := item.contrary_in(u))), None) if item.contrary and not yes else None
    return topical, yes, cue


def _whole_sentences(units: list[tuple[str, object]]) -> list[tuple[str, object]]:
    """The document's units as the words read them: a list item that continues the unit
    before it (which ends in no full stop or semicolon: "... which (a) Discloser identifies to Recipient
    as confidential or" / "(b) should be reasonably understood as confidential ...") is read
    with it, as one sentence ("LEAD … (b) ..."), so wording split across the list is seen
    whole; the lead-in is also read alone, as before."""
    out = []
    lead = None
    for u, h in units:
        if lead is not None and LIST_ITEM.match(u):
            out.append((f"{lead if len(lead) <= 160 else '…' + lead[-159:]} … {u}", h))  # as with_lead_in quotes it
            continue
        out.append((u, h))
        lead = u if not u.rstrip(" \"'”’)]").endswith((".", "!", "?", ";")) else None
    return out


def _said_in_so_many_words(decided: _Label, label: str, sentence: tuple, item: ChecklistItem, r, session: Session) -> None:
    """`label` because the document says so in `sentence` (its text, its hit, the
    words): that sentence is the quote, with its place and evidence; no confidence or
    scores (the model did not decide)."""
    decided.label, decided.quote, decided.confidence, decided.scores = label, sentence[0], None, {}
    decided.decided_by = "wording"
    decided.page, decided.section = place_of(sentence[1])
    decided.evidence = evidence(item, r.prompt.contexts, decided.quote, session)


def _not_mentioned(decided: _Label) -> None:
    """Not mentioned: no quote, no place and no confidence; the quote is kept as the closest clause."""
    decided.label, decided.closest, decided.quote, decided.confidence = "Not mentioned", decided.quote, None, None
    decided.decided_by = "evidence"
    decided.page = decided.section = None


def _yes_or_no(decided: _Label, r, cs) -> None:
    """The model's scores; with compare.not_mentioned "evidence" (the quote is on point)
    the model chooses between Yes and No: No when its probability reaches
    compare.no_min_confidence."""
    scores = dict(r.choice.logprobs)
    if cs.not_mentioned == "evidence":  # on point: the model chooses between Yes and No
        scores = renormalised({o: v for o, v in scores.items() if o != "Not mentioned"})
        no_min = cs.no_min_confidence
        decided.label = "No" if no_min is not None and math.exp(scores["No"]) >= no_min else "Yes"
        # without a No threshold the Yes says "on point, no contrary wording", not the
        # model's probability (its scores stay in the JSON)
        decided.confidence = round(math.exp(scores[decided.label]), 3) if no_min is not None else None
    decided.scores = scores


def _with_changes(note: str | None, quote: str | None, contexts) -> str | None:
    """The finding's note with the unaccepted tracked changes its quote shows or stands
    beside ("“five (5)”: inserted by Counsel on 2026-12-01, not yet accepted"): a reader
    must know the words quoted are not yet agreed."""
    if not quote:
        return note
    q = " ".join(quote.split())
    holding = [c for c in contexts if q in " ".join(c.text.split())] or contexts
    seen: list[str] = []
    for c in holding:
        seen += [n for n in (t.describe() for t in touching(c.changes, quote)) if n not in seen]
    return "; ".join([note] * bool(note) + seen) or None


def _finding(decided: _Label, r) -> Finding:
    """The Finding of the label decided, with the prompt's cost and time."""
    g = r.generation
    return Finding(
        doc=r.prompt.contexts[0].doc,
        label=decided.label,
        answer=r.answer,
        quote=decided.quote,
        page=decided.page,
        section=decided.section,
        path=None,
        # the prompt actually scored (none when the label model decided: nothing was prefilled)
        prompt_tokens=(g.prompt_tokens if g and g.prompt_tokens else len(r.prompt.ids)) if decided.generated else 0,
        cached_tokens=g.cached_tokens if g else 0,
        seconds=r.timings.get("total_s", 0.0),
        confidence=decided.confidence,
        note=_with_changes(decided.note, decided.quote, r.prompt.contexts),
        evidence=decided.evidence,
        scores=decided.scores,
        closest=decided.closest,
        claims=decided.claims,
        outcome=decided.outcome,
        decided_by=decided.decided_by,
        probabilities=decided.probabilities,
    )

