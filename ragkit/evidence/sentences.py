"""The one sentence splitter: ingest's chunker, retrieval's sentence ranking and reranker
units, the claim check and the quotes all cut text here, so a sentence is the same sentence
at every step.

    split_sentences(text)   sentences, bullets, table rows and headings of a source text
    split_units(text)       the same, with the list items inside a sentence ("...: (a) ...;
                            (b) ...") apart, so a quote can be one item
    merge_short(units)      pieces shorter than a few words joined to the next (ranking)
    sentence_spans(text)    (start, end) of each sentence in the text as it is (chunking)

No sentence splitter is installed, and the ones on PyPI either need a data download at run
time (nltk's punkt) or are a new dependency trained on news text (pysbd): contracts need
their own abbreviations ("Sec.", "U.S.C.", "Inc.") and list items ("(a) ...;"), so the
rules are written here.
"""

from __future__ import annotations

import re

_ABBR = {
    "e.g", "i.e", "etc", "inc", "ltd", "llc", "co", "corp", "no", "nos", "sec", "secs", "art", "arts", "u.s", "u.k",
    "mr", "mrs", "ms", "dr", "vs", "v", "st", "fig", "para", "paras", "pp", "p", "cf", "al", "jr", "sr", "approx",
    "dept", "est", "jan", "feb", "mar", "apr", "jun", "jul", "aug", "sep", "sept", "oct", "nov", "dec", "ch",
    "cl", "subsec", "u.s.c", "c.f.r", "cfr", "usc", "s.a", "n.a", "l.p", "p.c", "ref", "vol", "ed", "eds",
}
_ITEM = r"\((?:[a-z]{1,4}|\d{1,2})\)"  # "(a)", "(iv)", "(2)"
# a sentence ends at . ! ? before a space (closing quotes and brackets kept with it), at a
# CJK full stop with or without one, or at a ";" before a list item ("...; (b) ...")
_END = re.compile(rf"[.!?]+[\"”’')\]]*(?=\s)|[。！？；]+[”’」』）]*|;(?=\s+(?:(?:and|or)\s+)?{_ITEM}\s)")
BULLET = re.compile(r"^\s*(?:[-*•·]|\d{1,2}[.)]|\((?:[a-z]{1,4}|\d{1,2})\)|[a-z][.)])\s+")
# list items inside a sentence: "...: (a) ...", "..., (b) ...", "... and (c) ...", "...: a) ..."
_ITEM_BREAK = re.compile(rf"(?<=[.;:,!?])\s+(?:(?:and|or)\s+)?(?={_ITEM}\s)|(?<=[.;:!?])\s+(?=(?:[a-z]{{1,4}}|\d{{1,2}})\)\s)"
                         rf"|\s+(?:and|or)\s+(?={_ITEM}\s)")
LIST_ITEM = re.compile(r"^\(?([a-z]{1,4}|\d{1,2})\)\s")
_JOINER = re.compile(rf"^(?:and|or)\s+(?={_ITEM}\s)")  # "or (d) ...": the item starts at "(d)"
MIN_UNIT_WORDS = 4


def sentence_ends(para: str) -> list[int]:
    """The offsets where the sentences of `para` end: ".", "!" or "?" before a space, unless
    it ends an abbreviation, a single initial or a section number ("5. Term"), or the next
    word is lower case ("the U.S. government"); a CJK full stop; a ";" before a list item."""
    ends, start = [], 0
    for m in _END.finditer(para):
        end = m.end()
        if m.group().startswith("."):
            before = para[start:m.start()].rsplit(None, 1)
            word = before[-1].lower().lstrip("(\"“'") if before else ""
            if word in _ABBR or (len(word) == 1 and word.isalpha()) or re.fullmatch(r"[\d.]+|[ivxlc]+|[a-z]\.[a-z.]*",
                                                                                      word):
                continue
            nxt = para[end:].lstrip()[:1]
            if nxt and nxt.islower():  # "... the U.S. government" with an unknown abbreviation
                continue
        if para[start:end].strip():
            ends.append(end)
            start = end
    return ends


def sentences(para: str) -> list[str]:
    """A paragraph's sentences (`sentence_ends`), stripped."""
    out, start = [], 0
    for end in sentence_ends(para):
        out.append(para[start:end].strip())
        start = end
    tail = para[start:].strip()
    if tail:
        out.append(tail)
    return [s for s in out if s]


def sentence_spans(text: str) -> list[tuple[int, int]]:
    """(start, end) of each sentence of `text` as it is (line breaks are spaces here; the
    spaces between sentences belong to none), for cutting a block without changing it."""
    spans, start = [], 0
    for end in sentence_ends(text) + [len(text)]:
        a = start + (len(text[start:end]) - len(text[start:end].lstrip()))
        b = start + len(text[start:end].rstrip())
        if b > a:
            spans.append((a, b))
        start = end
    return spans


def split_sentences(text: str) -> list[str]:
    """The sentences and list items of a source text. A PDF's text layer breaks lines
    inside sentences, so a single line break is a space, except before a list item, a
    bullet or a table row, which start units of their own; a blank line ends a paragraph."""
    out: list[str] = []
    for para in re.split(r"\n\s*\n", text.replace("\r", "")):
        lines, buf = [], []
        for line in para.split("\n"):
            s = line.strip()
            if not s:
                continue
            if s.startswith("|") or BULLET.match(s) or re.match(r"^#+\s", s):
                if buf:
                    lines.append(" ".join(buf))
                buf = [s]
                if s.startswith("|") or s.startswith("#"):
                    lines.append(s)
                    buf = []
            else:
                buf.append(s)
        if buf:
            lines.append(" ".join(buf))
        for ln in lines:
            if ln.startswith("|"):
                if not re.fullmatch(r"[|\s:-]+", ln):  # a table's rule line is no sentence
                    out.append(ln)
            else:
                out.extend(sentences(ln))
    return out


def split_units(text: str) -> list[str]:
    """A clause's sentences (`split_sentences`) with the list items inside each apart."""
    return [_JOINER.sub("", u.strip()) for s in split_sentences(text) for u in _ITEM_BREAK.split(s) if u and u.strip()]


def merge_short(units: list[str], min_words: int = MIN_UNIT_WORDS) -> list[str]:
    """Units shorter than `min_words` words joined to the next (a lone "(b)" or "Section 5."
    says nothing); a short last one joins the one before."""
    out: list[str] = []
    carry = ""
    for piece in units:
        piece = f"{carry} {piece}".strip() if carry else piece
        if len(piece.split()) < min_words:
            carry = piece
            continue
        carry = ""
        out.append(piece)
    if carry:
        if out:
            out[-1] = f"{out[-1]} {carry}"
        else:
            out.append(carry)
    return out
