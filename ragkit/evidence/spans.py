"""Units with their place in the text: where each sentence or list item of a source lies
(character offsets), and the smallest whole clause around one, so a prompt, a quote or a
check can carry a unit without cutting it out of its sense.

    spans = unit_spans(chunk_text)                 # [Span(start, end, text)], in text order
    excerpt(chunk_text, spans, chosen, clause_words=60)   # the chosen units, each in its clause

The units are the reranker's (`ragkit.evidence.sentences`: `split_units`, pieces of fewer than
four words joined to the next), found back in the text they came from. A list item brings
its lead-in ("... shall not apply to information that: … (d) was independently developed
..."); a unit inside a short paragraph (at most `clause_words` words: a numbered clause, a
definition) brings the whole paragraph; neighbouring units of one clause merge into one
passage, and passages apart are separate paragraphs.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_WORD = re.compile(r"\S+")
_PARA = re.compile(r"\n\s*\n")
# between two passages of one source that are not next to each other: a paragraph break, no
# mark a quote could take in ("… Recipient's obligations ..."); a source cut so is marked
# `excerpt` in its metadata and its JSON
GAP = "\n\n"


@dataclass(frozen=True)
class Span:
    start: int
    end: int
    text: str  # the unit as the splitter gives it (what the reranker scored)
    index: int = 0  # its place in the list of units it was found from


def _locate(text: str, unit: str, cursor: int) -> tuple[int, int] | None:
    """(start, end) of `unit` in `text` at or after `cursor`: its first words found in order,
    then its last words, whatever the spacing and line breaks between (the splitter joins
    broken lines with one space and drops the "and" before an "(d)")."""
    words = unit.split()
    if not words:
        return None
    head = r"\s+".join(re.escape(w) for w in words[:3])
    m = re.compile(head).search(text, cursor)
    if m is None:
        return None
    if len(words) <= 3:
        return m.start(), m.end()
    # the unit's last words where the span is at least as long as the unit (the text has as
    # much whitespace or more): a table row of repeated cells ("| | |") ends at its own end
    tail = r"\s+".join(re.escape(w) for w in words[-3:])
    for t in re.compile(tail).finditer(text, m.start()):
        if t.end() - m.start() >= len(unit) - 2:
            return m.start(), t.end()
    return None


def unit_spans(text: str, units: list[str] | None = None) -> list[Span]:
    """Each unit of `text` with its offsets, in text order (`units`: the ones already split,
    e.g. those the reranker scored; else `ragkit.evidence.sentences.split_units` merged as
    the reranker merges them). A unit that cannot be found back is left out."""
    if units is None:
        from ragkit.evidence.sentences import merge_short, split_units

        units = merge_short(split_units(text))
    out: list[Span] = []
    cursor = 0
    for k, u in enumerate(units):
        at = _locate(text, u, cursor)
        if at is None:
            continue
        out.append(Span(at[0], at[1], u, k))
        cursor = at[1]
    return out


def _paragraph(text: str, span: Span) -> tuple[int, int]:
    """The paragraph (between blank lines, or the whole text) holding `span`."""
    start = 0
    for m in _PARA.finditer(text):
        if m.end() <= span.start:
            start = m.end()
        elif m.start() >= span.end:
            return start, m.start()
    return start, len(text)


def clause_of(text: str, spans: list[Span], i: int, clause_words: int) -> list[tuple[int, int]]:
    """The smallest whole clause around unit `i`, as ranges of `text`: its paragraph when that
    has at most `clause_words` words, else the unit and, for a list item, its lead-in (the
    unit before the first item of its list, when it ends with ":")."""
    from ragkit.evidence.sentences import BULLET, LIST_ITEM, sentence_spans

    s = spans[i]
    a, b = _paragraph(text, s)
    if len(_WORD.findall(text[a:b])) <= clause_words:
        return [(a, b)]
    # the sentence a list item is part of ("... until the earliest of (a) ... (b) ...")
    a, b = next(((x, y) for x, y in sentence_spans(text) if x <= s.start < y), (s.start, s.end))
    if (a, b) != (s.start, s.end) and len(_WORD.findall(text[a:b])) <= clause_words:
        return [(min(a, s.start), max(b, s.end))]
    out = [(s.start, s.end)]
    # the lead-in a unit completes: for a list item, the unit before its list ("... shall
    # not extend to: … (4) information which ..."; "... means information that the
    # Receiving Party can demonstrate … (iv) was developed ..."); for any unit, the one just
    # before it when that ends with ":"
    def item(k: int) -> bool:
        return bool(LIST_ITEM.match(spans[k].text) or BULLET.match(spans[k].text))

    j = i - 1
    if item(i):
        while j >= 0 and item(j) and not spans[j].text.rstrip().endswith(":"):
            j -= 1
    if j >= 0 and (item(i) or spans[j].text.rstrip().endswith(":")):
        out.insert(0, (spans[j].start, spans[j].end))
    return out


def excerpt(text: str, spans: list[Span], chosen: list[int], clause_words: int = 60) -> str:
    """The chosen units of `text`, each in its clause (`clause_of`), overlapping or adjacent
    clauses merged, in text order, passages apart joined by `GAP`; whitespace inside a
    passage as in the text."""
    if not chosen:
        return ""
    ranges = sorted(r for i in set(chosen) for r in clause_of(text, spans, i, clause_words))
    merged: list[list[int]] = []
    for a, b in ranges:
        if merged and not text[merged[-1][1]:a].strip():  # overlapping, or only whitespace between
            merged[-1][1] = max(merged[-1][1], b)
        else:
            merged.append([a, b])
    return GAP.join(p for p in (text[a:b].strip() for a, b in merged) if p)


# ---------------------------------------------------------------------- stored beside the chunks

def encode(spans: list[Span]) -> str:
    """A chunk's units as ingest stores them in its metadata (Chroma keeps scalars only):
    "start-end,start-end,..."."""
    return ",".join(f"{s.start}-{s.end}" for s in spans)


def stored_spans(text: str, value) -> list[Span] | None:
    """The units `encode` stored for `text`, each read from the text at its offsets
    (whitespace as the splitter gives it); None when absent or not this text's."""
    if not value or not isinstance(value, str):
        return None
    out: list[Span] = []
    try:
        for k, part in enumerate(value.split(",")):
            a, b = (int(x) for x in part.split("-"))
            if not 0 <= a < b <= len(text):
                return None
            piece = text[a:b].strip()
            # the splitter joins a sentence's broken lines with one space; a line (a table row) stays as written
            out.append(Span(a, b, " ".join(piece.split()) if "\n" in piece else piece, k))
    except ValueError:
        return None
    return out
