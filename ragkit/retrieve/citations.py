"""Map [n] markers in an answer back to the sources that were in the prompt."""

from __future__ import annotations

import re
from dataclasses import dataclass

from ragkit.retrieve.prompt import Context

_MARK = re.compile(r"\[(\d+(?:\s*[,;–-]\s*\d+)*)\]")
_WORD = re.compile(r"\w+", re.U)
_SENT = re.compile(r"(?<=[.!?;:。；])\s+|\n+")
ABSTAIN = "the documents do not say"


@dataclass
class Citation:
    n: int
    doc: str
    page: int | None
    section: str | None
    quote: str
    inferred: bool = False  # the model gave no valid marker; matched by wording instead

    def to_json(self) -> dict:
        d = {"n": self.n, "doc": self.doc, "page": self.page, "section": self.section, "quote": self.quote}
        if self.inferred:
            d["inferred"] = True
        return d


def _numbers(spec: str) -> list[int]:
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


def _words(s: str) -> set[str]:
    return {w.lower() for w in _WORD.findall(s) if len(w) > 2}


def best_quote(ctx_text: str, claim: str, limit: int = 300) -> str:
    """The sentence of the source that shares the most words with the claim citing it."""
    sents = [s.strip() for s in _SENT.split(ctx_text) if s.strip()]
    if not sents:
        return ctx_text[:limit]
    cw = _words(claim)
    best = max(sents, key=lambda s: (len(_words(s) & cw), -abs(len(s) - 200)))
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
            for n in _numbers(m.group(1)):
                ctx = by_n.get(n)
                if ctx is None:
                    if n not in invalid:
                        invalid.append(n)
                    continue
                if n not in cites:
                    cites[n] = Citation(n, ctx.doc, ctx.page_start, ctx.section, best_quote(ctx.text, claim))
    if not cites and contexts and answer.strip() and not is_abstention(answer):
        # Small models often forget the markers. Attribute the answer to the source that
        # shares the most wording with it, and say so.
        aw = _words(answer)
        ctx = max(contexts, key=lambda c: len(_words(c.text) & aw))
        if len(_words(ctx.text) & aw) >= 2:
            cites[ctx.n] = Citation(ctx.n, ctx.doc, ctx.page_start, ctx.section, best_quote(ctx.text, answer), inferred=True)
    return [cites[n] for n in sorted(cites)], invalid
