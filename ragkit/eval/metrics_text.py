"""Evaluation metrics on text (ragkit.eval.metrics re-exports them): normalization, and
whether and where gold evidence occurs in the retrieved contexts. Pure functions.

Text comparison goes through `normalize`: Unicode NFKC, curly quotes and dashes made
plain, soft hyphens dropped, hyphens between word characters removed (so a PDF's
line-break hyphenation "confi-\\ndential" and a real compound "third-party" both compare
equal to their unhyphenated form on either side), case folded, whitespace collapsed.
"""

from __future__ import annotations

import math
import re
import unicodedata
from collections import Counter
from typing import Iterable, Sequence

from ragkit.evidence.figures import QUOTES

# ---------------------------------------------------------------------- normalization

_HYPHEN = re.compile(r"(?<=\w)-\s*(?=\w)")
_WS = re.compile(r"\s+")
_TOKEN = re.compile(r"\w+", re.U)


def normalize(text: str | None) -> str:
    if not text:
        return ""
    t = unicodedata.normalize("NFKC", text).translate(QUOTES)
    t = _HYPHEN.sub("", t)
    return _WS.sub(" ", t).strip().casefold()


def tokens(text: str | None) -> list[str]:
    return _TOKEN.findall(normalize(text))


# ---------------------------------------------------------------------- retrieval

TOKEN_COVERAGE = 0.9


def evidence_in_text(evidence: str, text: str, coverage: float = TOKEN_COVERAGE) -> bool:
    """True when the normalized evidence is a substring of the normalized text, or when at
    least `coverage` (90%) of the evidence's tokens, counted with multiplicity, occur in
    the text. The second rule accepts evidence that a chunk boundary, a page header or a
    PDF extraction quirk (a dropped footnote mark, a split number) breaks up slightly."""
    ev, tx = normalize(evidence), normalize(text)
    if not ev:
        return False
    if ev in tx:
        return True
    et = Counter(_TOKEN.findall(ev))
    total = sum(et.values())
    if total == 0:
        return False
    tt = Counter(_TOKEN.findall(tx))
    have = sum(min(n, tt[w]) for w, n in et.items())
    return have / total >= coverage


# The strict rule (the headline figure): the evidence counts as found in a source only when
# a contiguous run of at least this share of its tokens lies inside that one source. The
# loose rule above accepts 90% of the evidence's words scattered anywhere in a long text.
STRICT_RUN = 0.8


def longest_shared_run(a: Sequence[str], b: Sequence[str]) -> int:
    """Length of the longest run of tokens that occurs contiguously in both sequences
    (difflib's longest-match search, with its "popular element" heuristic off so that
    frequent words such as "the" still match)."""
    from difflib import SequenceMatcher

    if not a or not b:
        return 0
    sm = SequenceMatcher(None, a, b, autojunk=False)
    return sm.find_longest_match(0, len(a), 0, len(b)).size


def evidence_in_text_strict(evidence: str, text: str, share: float = STRICT_RUN) -> bool:
    """True when a contiguous run of at least `share` (80%) of the evidence's tokens (after
    `normalize`) occurs, in order and unbroken, inside the text. A page header or a
    dropped footnote mark inside the evidence still passes; the same words scattered over
    a long text do not."""
    ev, tx = normalize(evidence), normalize(text)
    if not ev:
        return False
    if ev in tx:
        return True
    et = _TOKEN.findall(ev)
    if not et:
        return False
    need = math.ceil(share * len(et))
    tt = _TOKEN.findall(tx)
    if len(tt) < need:
        return False
    return longest_shared_run(et, tt) >= need


def evidence_in(evidence: str, text: str, coverage: float = TOKEN_COVERAGE, *, strict: bool = False) -> bool:
    """The strict rule (`evidence_in_text_strict`) or the loose one (`evidence_in_text`)."""
    return evidence_in_text_strict(evidence, text) if strict else evidence_in_text(evidence, text, coverage)


def evidence_in_context(evidence: str | None, contexts: Sequence[str], coverage: float = TOKEN_COVERAGE) -> bool | None:
    """Does any one context contain the evidence? None when there is no evidence to look for."""
    if not evidence:
        return None
    return any(evidence_in_text(evidence, c, coverage) for c in contexts)


def evidence_rank(evidence: str | None, ranked_contexts: Sequence[str], coverage: float = TOKEN_COVERAGE, *,
                  strict: bool = False) -> int | None:
    """1-based rank of the first context (best first) that contains the evidence, or None.
    `strict`: by the strict rule (a contiguous run, `evidence_in_text_strict`)."""
    if not evidence:
        return None
    for i, c in enumerate(ranked_contexts, 1):
        if evidence_in(evidence, c, coverage, strict=strict):
            return i
    return None


def evidence_rank_split(evidence: str | None, contexts: Sequence[dict], coverage: float = TOKEN_COVERAGE, *,
                        strict: bool = False) -> int | None:
    """For evidence that no single context holds: is it in the joined text of a run of
    contexts that are consecutive chunks of one document (the chunker split a long clause)?
    `contexts` are dicts with `doc`, `chunk_index`, `rank` and `text`. Returns the worst
    rank in the shortest such run (all of its chunks are needed), or None."""
    if not evidence:
        return None
    by_doc: dict[str, list[dict]] = {}
    for c in contexts:
        if c.get("chunk_index") is not None:
            by_doc.setdefault(c.get("doc", ""), []).append(c)
    best: int | None = None
    for cs in by_doc.values():
        cs = sorted(cs, key=lambda c: c["chunk_index"])
        for i in range(len(cs)):
            for j in range(i + 1, len(cs)):
                if cs[j]["chunk_index"] - cs[j - 1]["chunk_index"] != 1:
                    break
                run = cs[i: j + 1]
                if evidence_in(evidence, " ".join(c["text"] for c in run), coverage, strict=strict):
                    worst = max(c["rank"] for c in run)
                    best = worst if best is None else min(best, worst)
                    break
    return best


def tokens_through_rank(ranked_tokens: Sequence[int | None], rank: int | None) -> int | None:
    """Prompt tokens of the ranked sources up to and including the one at `rank` (1-based):
    what must be prefilled to reach the evidence when the sources go in best first.
    None when the evidence was not found."""
    if not rank:
        return None
    return sum(int(t or 0) for t in ranked_tokens[:rank])


def within_tokens(tokens_to_evidence: int | None, n: int, has_evidence: bool) -> bool | None:
    """Is the evidence (the whole source that holds it) within the first `n` prompt tokens
    of the ranked sources? None when there is no evidence to look for."""
    if not has_evidence:
        return None
    return tokens_to_evidence is not None and tokens_to_evidence <= n


def reciprocal_rank(rank: int | None) -> float:
    return 0.0 if not rank else 1.0 / rank


def mrr(ranks: Iterable[int | None]) -> float | None:
    """Mean reciprocal rank; a question whose evidence was not retrieved counts 0."""
    rr = [reciprocal_rank(r) for r in ranks]
    return sum(rr) / len(rr) if rr else None


def page_hit(gold_page: int | None, ranked_pages: Sequence[tuple[int | None, int | None]], k: int | None = None) -> bool | None:
    """Is the gold page within the page range (start, end) of one of the top-k contexts?
    None when there is no gold page."""
    if gold_page is None:
        return None
    top = ranked_pages if k is None else ranked_pages[:k]
    for start, end in top:
        if start is None:
            continue
        if start <= gold_page <= (end if end is not None else start):
            return True
    return False


def doc_recall(sources: Sequence[str], context_docs: Sequence[str]) -> float | None:
    """Share of the documents that hold the answer that appear among the contexts
    (file names compared without case and extension)."""
    if not sources:
        return None

    def key(n: str) -> str:
        n = n.lower()
        return n.rsplit(".", 1)[0] if "." in n[-6:] else n

    have = {key(d) for d in context_docs}
    return sum(key(s) in have for s in sources) / len(sources)


# ---------------------------------------------------------------------- quotes

def quote_matches_evidence(quote: str | None, spans: Sequence[str], coverage: float = 0.6) -> bool | None:
    """Whether a quote shown to the reader is (mostly) gold evidence: at least `coverage`
    of the shorter of the two, in tokens with multiplicity, is shared with one gold span.
    A quote is a sentence or list item, a span can be a whole clause, or the reverse.
    None when there is no gold span (NotMentioned)."""
    spans = [s for s in spans if s]
    if not spans:
        return None
    if not quote:
        return False
    q = Counter(tokens(quote.replace("\u2026", " ")))
    for s in spans:
        e = Counter(tokens(s))
        shared = sum((q & e).values())
        if shared and shared >= coverage * min(sum(q.values()), sum(e.values())):
            return True
    return False
