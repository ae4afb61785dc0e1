"""Clause comparison across contracts: a checklist walked over each document, answered
from that document only, with a quote a lawyer can check.

Documents are processed one after the other and every checklist item of a document
shares one prompt prefix (the document, whole when it fits), so from the second item
on the KV cache covers the document and only the question is prefilled.
"""

from __future__ import annotations

import html
import math
import re
import time
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Callable

from ragkit.config import Settings
from ragkit.errors import ConfigError, UsageError
from ragkit.paths import prompts_dir, read_prompt
from ragkit.retrieve.prompt import format_location
from ragkit.session import Session, settings_of

if TYPE_CHECKING:
    from ragkit.ask import AskResult

LABELS = ("Yes", "No", "Not mentioned", "Unclear", "Found")
NLI = {"Yes": "Entailment", "No": "Contradiction", "Not mentioned": "NotMentioned"}


@dataclass
class ChecklistItem:
    id: str
    title: str
    question: str
    hypothesis: str | None = None
    # words a sentence about the item names ("reverse engineer*", "decompil*"; a trailing
    # * matches any ending): a document none of whose sentences names one does not
    # mention the item, whatever the nearest passage scores
    terms: list[str] = field(default_factory=list)
    # wording that says the opposite of the hypothesis ("whether or not marked" against
    # "all Confidential Information shall be marked"): a sentence of the document that
    # holds it makes the label No, and is the quote
    contrary: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        for name in ("terms", "contrary"):
            v = getattr(self, name)
            if not (isinstance(v, list) and all(isinstance(t, str) and t.strip() for t in v)):
                raise TypeError(f"item {self.id!r}: {name} must be a list of non-empty strings")
        self._terms = term_pattern(self.terms)
        self._contrary = term_pattern(self.contrary)

    def names_item(self, text: str) -> bool:
        """Whether a sentence names one of the item's terms (True when it has none)."""
        return self._terms is None or bool(self._terms.search(text))

    def contrary_in(self, text: str) -> str | None:
        """The contrary wording the sentence holds, if any, read in its scope
        (`contrary_scope`): a prohibition the same sentence makes an exception to ("shall
        not copy ... except as reasonably necessary") and wording the sentence excludes
        ("technical information only and excludes business plans") are not contrary."""
        if self._contrary is None:
            return None
        for m in self._contrary.finditer(text):
            if contrary_scope(text, m.start(), m.end()):
                return m.group(0)
        return None


# negation and exception scope of a contrary phrase, inside its clause (up to ; or :)
_NEGATION = re.compile(r"\b(?:not|no|nor|never|neither|without)\b|n[’']t\b", re.I)
_EXCLUDES = re.compile(r"\b(?:exclud\w*|other\s+than|except(?:ing)?|apart\s+from|save\s+for|not|no|nor|never|neither)\b",
                       re.I)
# idioms with a negation word that exclude nothing ("including but not limited to")
_NOT_EXCLUDING = re.compile(r"\b(?:(?:but\s+)?(?:is\s+|are\s+)?not\s+limited\s+to|without\s+limit\w*|whether\s+or\s+not)\b",
                            re.I)
_EXCEPTION = re.compile(r"\b(?:except|excepting|unless|other\s+than|save\s+(?:as|for|that)|provided\s*,?\s*(?:however|that)|"
                        r"but\s+(?:may|can|shall\s+be\s+permitted)|to\s+the\s+extent)\b", re.I)


def contrary_scope(text: str, start: int, end: int) -> bool:
    """Whether the contrary phrase at text[start:end] says the opposite of the item in its
    clause. A phrase that is itself a prohibition ("not copy", "no copies") does not when
    the same sentence makes an exception to it after it ("shall not copy ... except as
    reasonably necessary for the Purpose": copies are allowed in some circumstances); a
    phrase that names something ("business plans") does not when its clause excludes it
    ("technical information only and excludes business plans", "other than business
    information", "does not include financial information"): the words then agree with
    the item. Clause: back to the last ";", ":" or sentence end, on to the sentence end."""
    phrase = text[start:end]
    before = re.split(r"[;:.!?]\s", text[:start])[-1]
    after = re.split(r"(?<=[.!?])\s", text[end:], maxsplit=1)[0]
    if _NEGATION.search(phrase):
        return not _EXCEPTION.search(after)
    return not _EXCLUDES.search(_NOT_EXCLUDING.sub(" ", before[-80:]))


def term_pattern(terms: list[str]) -> "re.Pattern | None":
    """One case-insensitive pattern for a list of phrases: words match whole ("copy" does
    not match "copyright"), a trailing * any ending ("decompil*"), words apart by spaces
    or hyphens ("reverse engineer*" matches "reverse-engineering"). Phrases, not regular
    expressions: a checklist is written by lawyers."""
    if not terms:
        return None
    alts = []
    for t in terms:
        words = [re.escape(w[:-1]) + r"\w*" if w.endswith("*") else re.escape(w) for w in t.split()]
        alts.append(r"\b" + r"[\s\-]+".join(words) + r"\b")
    return re.compile("|".join(alts), re.IGNORECASE)


@dataclass
class Finding:
    doc: str
    label: str  # Yes | No | Not mentioned
    answer: str
    quote: str | None
    page: int | None
    section: str | None
    path: str | None
    prompt_tokens: int = 0
    cached_tokens: int = 0
    seconds: float = 0.0
    confidence: float | None = None  # the model's probability of the label (Yes/No items)
    note: str | None = None  # a warning a reader must see (figures the document does not contain)
    evidence: dict = field(default_factory=dict)  # how well the quote matches the item (`evidence`)
    scores: dict = field(default_factory=dict)  # per option, the log-probability the label was decided on
    closest: str | None = None  # Not mentioned from the evidence: the nearest passage, not on point (not quoted)
    claims: list = field(default_factory=list)  # free-text items: the answer's claims (ragkit.retrieve.claims)
    outcome: str | None = None  # free-text items: the answer's outcome (supported | unverified | not_found, ragkit.ask)

    def to_json(self) -> dict:
        return {
            "doc": self.doc, "label": self.label, "confidence": self.confidence, "answer": self.answer, "note": self.note,
            "quote": self.quote, "page": self.page, "section": self.section, "prompt_tokens": self.prompt_tokens,
            "cached_tokens": self.cached_tokens, "evidence": self.evidence, "closest": self.closest,
            "claims": self.claims, "outcome": self.outcome,
        }


@dataclass
class Row:
    item: ChecklistItem
    findings: dict[str, Finding] = field(default_factory=dict)

    @property
    def difference(self) -> str:
        labels = {d: f.label for d, f in self.findings.items()}
        if len(set(labels.values())) > 1:
            quotes = [f.quote for f in self.findings.values()]
            if all(quotes) and all(same_substance(quotes[0], q) for q in quotes[1:]):
                # the labels disagree, the clauses do not: never tell the reader the NDAs differ
                return "uncertain: the quotes say the same, the labels differ (" + "; ".join(f"{d} {lab}" for d, lab in labels.items()) + "): read the quotes"
            return "differs: " + "; ".join(f"{d} says {lab}" for d, lab in labels.items())
        same = f"same: {next(iter(labels.values()), '-')}"
        quotes = [(d, f.quote) for d, f in self.findings.items() if f.quote]
        if len(quotes) < 2 or next(iter(labels.values()), None) != "Found":
            return same
        # a free-text clause (term, governing law): the labels say nothing, the wording does
        (d0, q0), rest = quotes[0], quotes[1:]
        parts = []
        for d, q in rest:
            changes = wording_changes(q0, q)
            if changes is None:
                parts.append(f"{d} words it differently")
            elif changes:
                parts.append(f"{d}: " + "; ".join(f"“{a}” → “{b}”" if a and b else (f"adds “{b}”" if b else f"drops “{a}”")
                                                 for a, b in changes[:4]) + (" …" if len(changes) > 4 else ""))
        if not parts:
            return f"{same}, same wording"
        return f"{same}; against {d0}, " + " | ".join(parts)


@dataclass
class Comparison:
    checklist: str
    docs: list[str]
    rows: list[Row]
    prompt_tokens: dict[str, int]  # per document: tokens prefilled (not served from cache)
    seconds: float
    prompt_rate_tok_s: float

    def to_json(self) -> dict:
        total = sum(self.prompt_tokens.values())
        return {
            "checklist": self.checklist,
            "docs": self.docs,
            "rows": [
                {"id": r.item.id, "title": r.item.title, "question": r.item.question, "difference": r.difference,
                 "findings": {d: f.to_json() for d, f in r.findings.items()}}
                for r in self.rows
            ],
            "cost": {
                "prefilled_tokens": self.prompt_tokens,
                "prefilled_tokens_total": total,
                "projected_kimi_prefill_s": round(total / self.prompt_rate_tok_s, 1),
                "prompt_rate_tok_s": self.prompt_rate_tok_s,
                "seconds": round(self.seconds, 1),
            },
        }


def wording_changes(a: str, b: str) -> list[tuple[str, str]] | None:
    """Word-level changes from quote a to quote b, [(old, new), ...]; None when the two
    share too little wording for a change list to mean anything."""
    from difflib import SequenceMatcher

    wa, wb = a.split(), b.split()
    sm = SequenceMatcher(a=[w.lower().strip(".,;:") for w in wa], b=[w.lower().strip(".,;:") for w in wb], autojunk=False)
    if sm.ratio() < 0.5:
        return None
    spans: list[list[int]] = []  # [i1, i2, j1, j2]; two changes one word apart read as one
    ops = sm.get_opcodes()
    for k, (tag, i1, i2, j1, j2) in enumerate(ops):
        if tag == "equal":
            continue
        prev = ops[k - 1] if k else None
        if spans and prev and prev[0] == "equal" and prev[2] - prev[1] == 1 and spans[-1][1] == prev[1]:
            spans[-1][1], spans[-1][3] = i2, j2
        else:
            spans.append([i1, i2, j1, j2])
    return [(" ".join(wa[i1:i2]).strip(".,;:"), " ".join(wb[j1:j2]).strip(".,;:")) for i1, i2, j1, j2 in spans]


def load_checklist(name_or_path: str) -> tuple[str, list[ChecklistItem]]:
    p = Path(name_or_path)
    if not (p.suffix == ".toml" and p.exists()):
        p = prompts_dir() / "checklists" / f"{name_or_path}.toml"
    if not p.exists():
        have = ", ".join(sorted(x.stem for x in (prompts_dir() / "checklists").glob("*.toml")))
        raise ConfigError(f"checklist {name_or_path!r} not found", hint=f"built in: {have}; or give a .toml path")
    try:
        data = tomllib.loads(p.read_text(encoding="utf-8"))
        items = [ChecklistItem(**{k: v for k, v in it.items() if k in ("id", "title", "question", "hypothesis", "terms", "contrary")})
                 for it in data["items"]]
    except (tomllib.TOMLDecodeError, KeyError, TypeError) as exc:
        raise ConfigError(f"checklist {p} is not valid: {exc}", hint="see prompts/checklists/nda.toml for the format") from None
    if not items or len({i.id for i in items}) != len(items):
        raise ConfigError(f"checklist {p} needs at least one item and unique ids")
    return data.get("name", p.stem), items


# the quote rules live with the sources (ragkit.retrieve.quotes), shared with `ask`'s passages
from ragkit.retrieve.quotes import (  # noqa: E402,F401
    _LIST_ITEM, _UNITS, LEXICAL_WEIGHT, _is_heading, _quotable, _stemmer, _words, clause_quote, split_units, with_lead_in,
)


def _similarity(settings: Settings | None, item: "ChecklistItem"):
    """Cosine of each text to the checklist item, with the store's embedder."""
    if settings is None:
        return None
    import numpy as np

    emb = Session.of(settings).embedder
    q = np.asarray(emb.embed_query(f"{item.title}. {item.question} {item.hypothesis or ''}".strip()), dtype=np.float32)

    def sim(texts: list[str]) -> list[float]:
        return [float(x) for x in np.asarray(emb.embed_documents(texts), dtype=np.float32) @ q]

    return sim


def _best_quote(contexts, item: "ChecklistItem", settings: Settings | None = None):
    """The clause that answers the item, found without trusting the model: among the
    sources in the prompt, the one whose section title and text share most words with
    the item's title and question (title words count double), ties broken by retrieval
    rank; then, in it, the sentence or list item sharing most words. A lawyer checks
    this quote, whatever the model said."""
    import math

    if not contexts:
        return None
    stem = _stemmer()
    want = _words(item.title + " " + item.question, stem)
    title_words = _words(item.title, stem)
    bags = [(_words(c.section or "", stem), _words(c.text, stem)) for c in contexts]
    # words found in every section of the document ("confidential", "party") tell
    # nothing: weight each word by its inverse document frequency across the sections
    n = len(bags)
    idf = {w: math.log((n + 1) / (1 + sum(1 for sec, body in bags if w in sec or w in body))) for w in want}
    fits = {}
    for c, (sec, body) in zip(contexts, bags):
        fits[id(c)] = (
            # a section whose heading names the item ("6. Term and Termination" for "Term")
            # is the strongest sign, whatever the word's frequency
            sum((idf[w] + 1.0) * 3 if w in title_words else idf[w] for w in want & sec) + sum(idf[w] for w in want & body),
            c.score,
        )
    # a section with a sentence that names the item (its checklist terms) before one that
    # only shares words with it
    named = [c for c in contexts if any(item.names_item(u) for u in split_units(c.text))] if item.terms else []
    top = max(named or contexts, key=lambda c: fits[id(c)])
    weight = {w: idf[w] + (1.0 if w in title_words else 0.1) for w in want}
    return top, clause_quote(top.text, want, weight, stem, similarity=_similarity(settings, item),
                             names_item=item.names_item if item.terms else None)


def _document_sentences(contexts, settings: Session | Settings) -> list[tuple[str, object]]:
    """Every quotable sentence of the documents the contexts come from (all their chunks
    in the store, not only those retrieved into the prompt), in document order, each with
    the chunk it is in (its page and section); kept by the session per document version."""
    session = Session.of(settings)
    memo = session.memo("compare.sentences")
    key = tuple(sorted({c.doc_id for c in contexts}))
    if key not in memo:
        hits = session.store.chunks(list(key)) or list(contexts)
        pairs = [(u, h) for h in hits for u in split_units(h.text)]
        keep = _quotable([u for u, _ in pairs])
        seen: dict[str, object] = {}
        for j in keep:
            seen.setdefault(pairs[j][0], pairs[j][1])
        memo[key] = list(seen.items()) or pairs
    return memo[key]


def _document_units(contexts, settings: Session | Settings) -> list[str]:
    """The documents' quotable sentences (`_document_sentences`), so the calibration sees
    the whole document."""
    return [u for u, _ in _document_sentences(contexts, settings)]


def _where(hit) -> tuple[int | None, str | None]:
    """A store hit's or a prompt context's page and section."""
    meta = getattr(hit, "meta", None)
    if meta is not None:
        return meta.get("page_start"), meta.get("section")
    return getattr(hit, "page_start", None), getattr(hit, "section", None)


def evidence(item: "ChecklistItem", contexts, quote: str | None, settings: Session | Settings) -> dict:
    """How well the quote matches the checklist item, calibrated on the document itself,
    so the rule holds whatever the embedder's cosine range (MiniLM's and e5's differ):
    `z` is the quote's cosine to the item (its hypothesis, else its question) in standard
    deviations above the mean cosine of every sentence of the sources; `coverage` the
    share of the item's content words (idf-weighted over the sentences, stemmed) that the
    quote holds. A quote a few deviations above the rest, that holds the item's rarer
    words, is on point; the nearest row of a cover page is not."""
    import math

    import numpy as np

    session = Session.of(settings)
    units = _document_units(contexts, session)
    if not quote or len(units) < 2:
        return {"z": None, "cos": None, "coverage": None, "units": len(units)}
    emb = session.embedder  # remembers the vectors: a document's sentences are embedded once per session
    vecs = np.asarray(emb.embed_documents(units + [quote]), dtype=np.float32)
    q = np.asarray(emb.embed_query(item.hypothesis or f"{item.title}. {item.question}"), dtype=np.float32)
    cos = vecs[:-1] @ q
    qc = float(vecs[-1] @ q)
    sd = float(cos.std()) or 1e-6
    stem = _stemmer()
    want = _words(item.hypothesis or item.question, stem)
    bags = [_words(u, stem) for u in units]
    n = len(bags)
    idf = {w: math.log((n + 1) / (1 + sum(1 for b in bags if w in b))) + 0.1 for w in want}
    have = _words(quote, stem)
    coverage = sum(idf[w] for w in want & have) / (sum(idf.values()) or 1.0)
    return {"z": round((qc - float(cos.mean())) / sd, 3), "cos": round(qc, 4), "coverage": round(coverage, 3), "units": n,
            "support": round(_hypothesis_support(item, quote, emb), 3)}


def _hypothesis_support(item: "ChecklistItem", quote: str, embedder) -> float:
    """The shared claims mechanism (ragkit.retrieve.claims.attribute) reading the item's
    hypothesis as a claim against the quote: its support, 0-1."""
    from types import SimpleNamespace

    from ragkit.retrieve.claims import attribute

    src = SimpleNamespace(n=1, doc="-", doc_id="-", page_start=None, page_end=None, section=None, text=quote)
    claims = attribute(item.hypothesis or item.question, [src], embedder)
    return max((c.support for c in claims), default=0.0)


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


def _renormalised(logprobs: dict[str, float]) -> dict[str, float]:
    top = max(logprobs.values())
    norm = math.log(sum(math.exp(v - top) for v in logprobs.values())) + top
    return {o: v - norm for o, v in logprobs.items()}


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


def unsupported_figures(answer: str, contexts) -> list[str]:
    """Figures in a free-text answer ("12 months", "1 year") that no source in the prompt
    contains: the shared check of ask, chat, compare and serve
    (ragkit.retrieve.claims.unsupported_figures)."""
    from ragkit.retrieve.claims import unsupported_figures as check

    return check(answer, contexts)


YES_NO = ["Yes", "No", "Not mentioned"]


def check_item(doc: str, item: ChecklistItem, settings: Session | Settings) -> tuple[Finding, "AskResult"]:
    """One checklist item asked of one document: the label (Yes / No / Not mentioned for
    a hypothesis item, Found for a free-text one), the model's confidence, and the quote.
    Used by `compare` and by the ContractNLI scoring in `ragkit eval run`."""
    from ragkit.ask import ask, ask_choice
    from ragkit.generate.base import option_scores

    settings = Session.of(settings)  # one session for every step below (a Settings: for this item)
    cs = settings.settings.compare
    confidence = None
    note = None
    claims: list[dict] = []  # a free-text answer's claims, each tied to the sentence that supports it
    outcome = None  # a free-text answer's outcome (ragkit.ask)
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
        from ragkit.retrieve.citations import is_abstention

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
        cue = next(((u, h, w) for u, h in topical if (w := item.contrary_in(u))), None) if item.contrary else None
    else:
        topical, cue = [], None
    if item.hypothesis is not None and r.choice is not None and not r.abstained:
        if cue is not None:
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
        elif cs.not_mentioned == "evidence" and not on_point(ev, cs):
            # no passage of the document is about the item: Not mentioned, whatever the
            # model says of the nearest one (it answers Yes or No about whatever it is shown)
            label, closest, quote, top, confidence = "Not mentioned", quote, None, None, None
            page = section = None
        elif r.choice.scored:
            scores = dict(r.choice.logprobs)
            if cs.not_mentioned == "evidence":  # on point: the model chooses between Yes and No
                scores = _renormalised({o: v for o, v in scores.items() if o != "Not mentioned"})
                label = "No" if math.exp(scores["No"]) >= cs.no_min_confidence else "Yes"
                confidence = round(math.exp(scores[label]), 3)
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


def same_substance(a: str, b: str, share: float = 0.6) -> bool:
    """Whether two quotes say the same: the shorter one's content words (stemmed) are
    mostly in the other ("may retain ... backup or record retention policies" in
    Bonterms and in Common Paper, worded apart)."""
    stem = _stemmer()
    wa, wb = _words(a, stem), _words(b, stem)
    small, big = (wa, wb) if len(wa) <= len(wb) else (wb, wa)
    return bool(small) and len(small & big) / len(small) >= share


def agree_on_same_quotes(row: Row, no_min: float = 0.5) -> None:
    """Labels that their quotes contradict never reach the page: where two documents'
    quotes say the same and their Yes/No labels differ, the label is decided once for
    both, on the two quotes' scores together (the sum of their log-probabilities), and
    the cells say so; where even that is a near tie, they say Uncertain."""
    scored = [(d, f) for d, f in row.findings.items() if f.quote and f.scores and f.label in ("Yes", "No")]
    for i, (d1, f1) in enumerate(scored):
        for d2, f2 in scored[i + 1:]:
            if f1.label == f2.label or not same_substance(f1.quote, f2.quote):
                continue
            both = _renormalised({o: f1.scores[o] + f2.scores[o] for o in ("Yes", "No") if o in f1.scores and o in f2.scores})
            label = "No" if math.exp(both.get("No", -math.inf)) >= no_min else "Yes"
            conf = math.exp(both[label])
            if conf < UNCERTAIN_BELOW:
                label, conf = "Uncertain", None
            for f, other in ((f1, d2), (f2, d1)):
                f.label, f.confidence = label, (round(conf, 3) if conf is not None else None)
                f.note = ((f.note + "; ") if f.note else "") + f"decided with {other}: the two quotes say the same"


UNCERTAIN_BELOW = 0.6  # a joint Yes/No below this probability is shown as Uncertain, with its quotes


def cost_line(c: Comparison) -> str:
    """"Prefilled tokens: a.pdf 1,234, b.md 567 (total 1,801); projected ...": the cost in words, not a dict."""
    j = c.to_json()["cost"]
    per = ", ".join(f"{d} {n:,}" for d, n in j["prefilled_tokens"].items())
    return (f"Prefilled tokens: {per} (total {j['prefilled_tokens_total']:,}); projected Kimi K2 prefill at "
            f"{j['prompt_rate_tok_s']:,.0f} tok/s: {j['projected_kimi_prefill_s']} s; took {j['seconds']} s.")


def claim_support(f: Finding) -> str:
    """" · answer: 2 of 3 claims supported": for a free-text item, how much of the model's
    answer the document supports (the quote is what to rely on)."""
    if not f.claims:
        return ""
    ok = sum(1 for c in f.claims if c.get("supported"))
    return f" · answer: {ok} of {len(f.claims)} claims supported"


def missing(f: Finding | None) -> str:
    """The cell of a document with no quote for the item."""
    if f is None:
        return "-: not found"
    if f.closest:
        return f"{f.label}: no clause on point (the closest passage is about something else)"
    return f"{f.label}: not found"


def _conf(f: Finding) -> str:
    """" (62%)": the model's probability of its Yes/No label, so a reader knows which
    labels to check first."""
    return f" ({f.confidence:.0%})" if f.confidence is not None else ""


def to_markdown(c: Comparison) -> str:
    lines = [f"# Clause comparison ({c.checklist})", "", "| clause | " + " | ".join(c.docs) + " | difference |",
             "|---|" + "---|" * len(c.docs) + "---|"]
    for r in c.rows:
        cells = []
        for d in c.docs:
            f = r.findings.get(d)
            if f is None or not f.quote:
                cells.append(missing(f).replace("|", "\\|"))
            else:
                loc = format_location(f.page, f.section)
                hint = " (closest clause)" if f.label == "Not mentioned" else ""
                warn = f" ⚠ {f.note}" if f.note else ""
                cells.append(f"**{f.label}**{_conf(f)}{hint}: “{f.quote}” ({loc}){claim_support(f)}{warn}".replace("|", "\\|"))
        lines.append(f"| {r.item.title} | " + " | ".join(cells) + f" | {r.difference} |")
    lines += ["", cost_line(c)]
    return "\n".join(lines) + "\n"


def to_html(c: Comparison, paths: dict[str, str] | None) -> str:
    """A self-contained page; with `paths` (the command line's memo, for the machine it runs
    on) each quote links to its document's file at its page; without (a memo exported by
    the web page, for a reader elsewhere) quotes carry no link, so no server path leaks."""
    e = html.escape
    head = "".join(f"<th>{e(d)}</th>" for d in c.docs)
    body = []
    for r in c.rows:
        cells = []
        for d in c.docs:
            f = r.findings.get(d)
            if f is None or not f.quote:
                cells.append(f"<td class='nf'>{e(missing(f))}</td>")
                continue
            quote = f"“{e(f.quote)}”"
            if paths is not None:
                href = Path(paths.get(d, d)).resolve().as_uri() + (f"#page={f.page}" if f.page else "")
                quote = f"<a href='{e(href)}'>{quote}</a>"
            loc = format_location(f.page, f.section)
            hint = " (closest clause)" if f.label == "Not mentioned" else ""
            hint += f"<br><small class='warn'>⚠ {e(f.note)}</small>" if f.note else ""
            cells.append(f"<td><b>{e(f.label)}</b>{e(_conf(f))}{hint}<blockquote>{quote}</blockquote><small>{e(loc)}{e(claim_support(f))}</small></td>")
        cls = "diff" if r.difference.startswith("differs") else ""
        body.append(f"<tr class='{cls}'><th>{e(r.item.title)}<br><small>{e(r.item.question)}</small></th>{''.join(cells)}<td>{e(r.difference)}</td></tr>")
    return (
        "<!doctype html><html><head><meta charset='utf-8'><title>Clause comparison</title><style>"
        "body{font-family:sans-serif;margin:2em}table{border-collapse:collapse}td,th{border:1px solid #ccc;padding:6px;vertical-align:top;max-width:28em}"
        "tr.diff{background:#fff4e5}td.nf{color:#888}.warn{color:#a40}blockquote{margin:4px 0 4px 8px}</style></head><body>"
        f"<h1>Clause comparison ({e(c.checklist)})</h1><table><tr><th>clause</th>{head}<th>difference</th></tr>{''.join(body)}</table>"
        f"<p>{e(cost_line(c))}</p>"
        "</body></html>"
    )
