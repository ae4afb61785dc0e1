"""The passages `ask` shows when an answer cannot be verified or when the question asks for
the clause itself (`best_passages`), chosen from the sources without trusting the model, by
the quote rules the checklist's clause quote uses (ragkit.evidence.quotes).

    from ragkit.answer.passages import best_passages
    found = best_passages(question, prompt.contexts, session.embedder)
    found.passages      # [Passage(doc, page, section, quote, ...)], best first
    found.not_found     # why the sources do not hold the answer, or None

A passage is a sentence or list item of a source with its lead-in ("... do not apply to
information that it can demonstrate: … (d) it independently developed ..."), chosen as
the checklist chooses its quote: among the units that name the question's key terms,
the one closest in meaning to the question (the store's embedder) plus a share for the
(IDF-weighted, stemmed) words it shares with it; or, for `ask` by default
(`retrieve.passages_by = "reranker"`), the one the cross-encoder scores highest.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

from ragkit.answer.citations import SourceSpan
from ragkit.evidence.quotes import LEXICAL_WEIGHT, lexical_score, quotable, with_lead_in
from ragkit.evidence.sentences import split_units
from ragkit.evidence.words import content_words, name_words, words

# ---------------------------------------------------------------------- passages for `ask`

# Words of a question that say what kind of text is wanted, not what it is about ("Which
# part of this contract concerns ...", "Quote it."): stemmed, as content_words gives them.
_FRAME_WORDS = {"contract", "agreement", "document", "part", "concern", "quot", "quote", "claus", "clause", "section",
                "provis", "provision", "detail", "highlight", "relat", "related", "say", "specifi", "mention",
                "answer", "describ", "passag", "text", "doe", "question", "wherea", "herein", "hereof"}
# question words and modals: every sentence of a contract holds "which", "may" or "shall"
_QUESTION_WORDS = ("which what where when who whom whose how why whether must shall may can cannot will would should "
                   "could might does did need there any")


def _frame_words() -> set[str]:
    return _FRAME_WORDS | words(_QUESTION_WORDS) | set(_QUESTION_WORDS.split())

PASSAGES = 3  # shown at most
CANDIDATES = 24  # units embedded per question (those sharing most of its key words)
NEAR = 0.15  # a passage after the first is shown when its score is this close to the best
# the relevance floor (`Found.relevance`, 0-1: half the best unit's calibrated cosine to the
# question, half the share of the question's key terms it holds, IDF-weighted): below it
# the sources hold nothing on point. Measured in eval/README.md ("Outcomes").
RELEVANCE_MIN = 0.25


@dataclass
class Passage(SourceSpan):
    """A sentence (or list item with its lead-in) of a source, chosen for the question."""

    score: float = 0.0  # how well it answers the question (cosine + word share, as the checklist ranks)
    relevance: float = 0.0  # 0-1, calibrated (see RELEVANCE_MIN)

    def to_json(self) -> dict:
        return {**self.span_json(), "score": round(self.score, 3), "relevance": round(self.relevance, 3)}


@dataclass
class Found:
    passages: list[Passage] = field(default_factory=list)
    key_terms: list[str] = field(default_factory=list)  # the question's words a passage must name (stemmed)
    relevance: float = 0.0  # the best unit's
    meaning: float = 0.0  # the best unit's calibrated cosine to the question, 0-1
    coverage: float = 0.0  # the best unit's share of the question's key terms (IDF-weighted), 0-1
    not_found: str | None = None  # why the sources hold nothing on point, or None


def key_terms(question: str, contexts) -> set[str]:
    """The question's content words (stemmed) less the words of its frame ("which part of
    this contract concerns", "quote it") and of the documents' names."""
    from ragkit.retrieve.query import search_query

    names: set[str] = set()
    for c in contexts:
        names |= name_words(c.doc)
    # a word of a document's name is dropped only where the question uses it as a name
    # (capitalised past its first word: "the Common Paper NDA"), not as a word: "its term"
    # keeps "term" although a file is called "...-standard-terms.md"
    named_in_q = content_words(" ".join(re.findall(r"(?<!^)(?<![.?!]\s)\b[A-Z][\w’'-]*", question.strip())))
    names &= named_in_q
    asked = content_words(search_query(question))
    frame = _frame_words()
    return {w for w in asked if w not in frame and w not in names} or {w for w in asked if w not in frame}


def best_passages(question: str, contexts, embedder, *, k: int = PASSAGES, relevance_min: float = RELEVANCE_MIN,
                  reranker=None, near_logit: float = 2.0) -> Found:
    """The units of `contexts` that answer `question` best (at most `k`, best first), and
    whether the sources hold anything on point: `not_found` says why not when no unit
    names a key term of the question, or the best one's relevance is under
    `relevance_min`. With `reranker` (a cross-encoder), the candidates are ordered by its
    score of (question as searched, unit), a later one shown while within `near_logit` of
    the best; relevance is read as without it."""
    import numpy as np

    from ragkit.evidence.similarity import ANCHORS, calibrated_cosine, embed_docs, unit_vector

    units: list[tuple[object, str]] = []  # (context, unit with its lead-in)
    for c in contexts:
        us = split_units(c.text)
        for j in quotable(us):
            units.append((c, with_lead_in(us, j)))
    want = key_terms(question, contexts)
    if not units or not want:
        return Found(key_terms=sorted(want), not_found=None if units else "no source text")
    bags = [words(u) for _, u in units]
    n = len(bags)
    idf = {w: math.log((n + 1) / (1 + sum(1 for b in bags if w in b))) + 0.1 for w in want}
    total = sum(idf.values()) or 1.0
    named = [i for i, b in enumerate(bags) if b & want]
    if not named:
        return Found(key_terms=sorted(want), not_found="no sentence of the sources names " + ", ".join(
            f"“{w}”" for w in sorted(want, key=lambda w: -idf[w])[:5]))
    lex = {i: lexical_score(bags[i], want, idf) for i in named}
    cand = sorted(named, key=lambda i: -lex[i])[:CANDIDATES]
    from ragkit.retrieve.query import search_query

    # the question as searched: without its answer-format sentences and frame ("Quote it.")
    q = unit_vector(np.asarray(embedder.embed_query(search_query(question)), dtype=np.float32))
    vecs = embed_docs(embedder, [units[i][1] for i in cand])
    cos = vecs @ q
    floor = float(np.mean(embed_docs(embedder, ANCHORS) @ q))
    meaning = calibrated_cosine(cos, floor)
    top_lex = max(lex[i] for i in cand) or 1.0
    score = {i: float(c) + LEXICAL_WEIGHT * lex[i] / top_lex for i, c in zip(cand, cos)}
    rel = {i: 0.5 * float(m) + 0.5 * sum(idf[w] for w in bags[i] & want) / total for i, m in zip(cand, meaning)}
    near = NEAR
    if reranker is not None:
        # the cross-encoder reads the question with each unit: its order, and its own scale
        ce = reranker.score(search_query(question), [units[i][1] for i in cand])
        score = {i: float(x) for i, x in zip(cand, ce)}
        near = near_logit
    order = sorted(cand, key=lambda i: -score[i])
    best = order[0]
    cover = {i: sum(idf[w] for w in bags[i] & want) / total for i in cand}
    found = Found(key_terms=sorted(want), relevance=max(rel.values()), meaning=float(max(meaning)),
                  coverage=max(cover.values()))
    if found.relevance < relevance_min:
        found.not_found = f"no passage is on point (relevance {found.relevance:.2f} < {relevance_min:.2f})"
        return found
    picked: list[int] = []
    for i in order:
        if len(picked) >= k or score[i] < score[best] - near:
            break
        if units[i][1] in {units[j][1] for j in picked}:
            continue
        picked.append(i)
    for i in picked:
        c, u = units[i]
        found.passages.append(Passage(n=c.n, doc=c.doc, doc_id=c.doc_id, page=c.page_start, page_end=c.page_end,
                                      section=c.section, quote=u, score=score[i], relevance=rel[i]))
    return found


# ---------------------------------------------------------------------- quoted answers

def quoted_answer(passages: list[Passage], head: str | None = None) -> str:
    """The passages as an answer: each quote with its document, page and section."""
    from ragkit.evidence.location import format_location

    lines = [head] if head else []
    for p in passages:
        where = format_location(p.page, p.section, p.page_end)
        lines.append(f"“{p.quote}” [{p.n}] ({p.doc}{', ' + where if where else ''})")
    return "\n".join(lines)


__all__ = ["Found", "Passage", "best_passages", "key_terms", "quoted_answer"]
