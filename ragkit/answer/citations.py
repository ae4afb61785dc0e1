"""Map [n] markers in an answer back to the sources that were in the prompt."""

from __future__ import annotations

import re
from dataclasses import dataclass

from ragkit.evidence.words import content_words, plain_words
from ragkit.retrieve.prompt import Context

_MARK = re.compile(r"\[(\d+(?:\s*[,;–-]\s*\d+)*)\]")
_SENT = re.compile(r"(?<=[.!?;:。；])\s+|\n+")
ABSTAIN = "the documents do not say"


@dataclass
class SourceSpan:
    """Words quoted from one source of the prompt: its number [n], document, pages and
    section. A claim's supporting sentence and an unverified answer's passage are both one."""

    n: int  # the source's number in the prompt ([n])
    doc: str
    doc_id: str
    page: int | None
    page_end: int | None
    section: str | None
    quote: str

    def span_json(self) -> dict:
        return {"n": self.n, "doc": self.doc, "doc_id": self.doc_id, "page": self.page, "page_end": self.page_end,
                "section": self.section, "quote": self.quote}


@dataclass
class Citation:
    n: int
    doc: str
    page: int | None
    section: str | None
    quote: str
    inferred: bool = False  # the model gave no valid marker; matched by wording instead

    def to_json(self) -> dict:
        # `inferred` always present: a reader must never take an attribution by wording for
        # a marker the model wrote
        return {"n": self.n, "doc": self.doc, "page": self.page, "section": self.section, "quote": self.quote,
                "inferred": self.inferred}


def marker_numbers(spec: str) -> list[int]:
    """The source numbers a marker's inside names: "1, 3" -> [1, 3], "2-4" -> [2, 3, 4]."""
    out: list[int] = []
    for part in re.split(r"\s*[,;]\s*", spec):
        if re.fullmatch(r"\d+\s*[–-]\s*\d+", part):
            a, b = (int(x) for x in re.split(r"\s*[–-]\s*", part))
            if 0 < b - a < 20:
                out.extend(range(a, b + 1))
                continue
        for x in re.findall(r"\d+", part):
            out.append(int(x))
    return out


def best_quote(ctx_text: str, claim: str, limit: int = 300) -> str:
    """The sentence of the source that shares the most words with the claim citing it."""
    sents = [s.strip() for s in _SENT.split(ctx_text) if s.strip()]
    if not sents:
        return ctx_text[:limit]
    cw = plain_words(claim)
    best = max(sents, key=lambda s: (len(plain_words(s) & cw), -abs(len(s) - 200)))
    return best if len(best) <= limit else best[: limit - 1].rstrip() + "…"


def is_abstention(answer: str) -> bool:
    return ABSTAIN in answer.lower()


def extract(answer: str, contexts: list[Context]) -> tuple[list[Citation], list[int]]:
    """Citations for every valid [n] in the answer, and the list of invalid numbers
    (markers that point at no source in the prompt; they are flagged, not trusted)."""
    by_n = {c.n: c for c in contexts}
    cites: dict[int, Citation] = {}
    invalid: list[int] = []
    for sent in re.split(r"(?<=[.!?])\s+|\n+", answer):
        for m in _MARK.finditer(sent):
            claim = _MARK.sub("", sent)
            for n in marker_numbers(m.group(1)):
                ctx = by_n.get(n)
                if ctx is None:
                    if n not in invalid:
                        invalid.append(n)
                    continue
                if n not in cites:
                    cites[n] = Citation(n, ctx.doc, ctx.page_start, ctx.section, best_quote(ctx.text, claim))
    if not cites and contexts and answer.strip() and not is_abstention(answer):
        # Small models often forget the markers. Attribute the answer to the source that
        # holds most of its content words, and say so (inferred); none when no source
        # holds a meaningful share of them.
        ctx = infer_source(answer, contexts)
        if ctx is not None:
            cites[ctx.n] = Citation(ctx.n, ctx.doc, ctx.page_start, ctx.section, best_quote(ctx.text, answer), inferred=True)
    return [cites[n] for n in sorted(cites)], invalid


# An inferred citation needs the source to hold at least this share of the answer's
# content words (stopwords dropped, stemmed), and at least INFER_MIN_WORDS of them:
# sharing "the", "this", "agreement" with an answer says nothing about where it came from.
INFER_MIN_SHARE = 0.5
INFER_MIN_WORDS = 2


def infer_source(answer: str, contexts: list[Context]) -> Context | None:
    """The source that holds the largest share of the answer's content words, when that
    share is at least INFER_MIN_SHARE and at least INFER_MIN_WORDS words; else None."""
    aw = content_words(answer)
    if len(aw) < INFER_MIN_WORDS:
        return None
    best, have = None, 0
    for c in contexts:
        k = len(content_words(c.text) & aw)
        if k > have:
            best, have = c, k
    if best is None or have < INFER_MIN_WORDS or have / len(aw) < INFER_MIN_SHARE:
        return None
    return best
