"""Split blocks into sections along the document's own structure, then into chunks
bounded in embedder tokens.

Written by hand on purpose: generic splitters (LangChain, LlamaIndex) cut by
characters or tokens and know nothing of "Article 5", "5.2(a)" or 第三条; a lawyer's
citation needs the clause path, so the numbering rules live here.
"""

from __future__ import annotations

import re
from typing import Callable

from ragkit.ingest.model import Block, Chunk, Section

_CN_NUM = "一二三四五六七八九十百千零〇两"

# (pattern, how to compute the level from the match). Order matters.
_HEADING_RULES: list[tuple[re.Pattern[str], Callable[[re.Match[str]], int]]] = [
    (re.compile(r"^(ARTICLE|Article)\s+([IVXLC]+|\d+)\b"), lambda m: 1),
    # SEC filings: "PART I — FINANCIAL INFORMATION", "Item 1A. Risk Factors", "Note 4 – Leases"
    (re.compile(r"^(PART|Part)\s+[IVX]+\b"), lambda m: 1),
    (re.compile(r"^(ITEM|Item)\s+\d{1,2}[A-Z]?\.(\s|$)"), lambda m: 2),
    (re.compile(r"^(NOTE|Note)\s+\d{1,2}\s*[–—:.-]\s*\S"), lambda m: 3),
    (re.compile(r"^(SECTION|Section)\s+(\d+(?:\.\d+)*)\b"), lambda m: m.group(2).count(".") + 1),
    (re.compile(rf"^第[{_CN_NUM}\d]+[编]"), lambda m: 1),
    (re.compile(rf"^第[{_CN_NUM}\d]+[章]"), lambda m: 1),
    (re.compile(rf"^第[{_CN_NUM}\d]+[节]"), lambda m: 2),
    (re.compile(rf"^第[{_CN_NUM}\d]+[条]"), lambda m: 3),
    (re.compile(rf"^[{_CN_NUM}]+、"), lambda m: 1),
    (re.compile(rf"^[（(][{_CN_NUM}]+[)）]"), lambda m: 2),
    # 5.2, 3.1.8, 5.2. Title — needs a dot-separated number
    (re.compile(r"^(\d{1,3}(?:\.\d{1,3})+)\.?\s+\S"), lambda m: m.group(1).count(".") + 1),
    # "1. Definitions" / "12. GOVERNING LAW"
    (re.compile(r"^(\d{1,3})\.\s+[A-Z\"“(]"), lambda m: 1),
]

# List items belong to the clause above them: they start a block, not a section.
_LIST_ITEM = re.compile(r"^(\(([a-z]{1,2}|[ivx]{1,5}|\d{1,2})\)|[a-z]\.|[ivx]{1,5}\.|[-•*–])\s+\S")


def heading_level(text: str) -> int | None:
    """Level of a numbered heading/clause that starts this text, or None."""
    for pat, level in _HEADING_RULES:
        m = pat.match(text)
        if m:
            return level(m)
    if _is_caps_heading(text):
        return 1
    return None


def _is_caps_heading(text: str) -> bool:
    t = text.strip()
    if not (3 <= len(t) <= 80) or t.endswith((",", ";")):
        return False
    letters = [c for c in t if c.isalpha()]
    if len(letters) < 4:
        return False
    return all(c.isupper() for c in letters) and len(t.split()) <= 10


def starts_new_block(line: str) -> bool:
    return heading_level(line) is not None or bool(_LIST_ITEM.match(line))


_NUM_PREFIX = re.compile(
    rf"^((?:ARTICLE|Article|SECTION|Section|PART|Part|ITEM|Item)\s+[\dIVXLC]+[A-Z]?(?:\.\d+)*\.?|(?:NOTE|Note)\s+\d+\s*[–—:.-]|\d{{1,3}}(?:\.\d{{1,3}})*\.?|第[{_CN_NUM}\d]+[编章节条款]|[{_CN_NUM}]+、|[（(][{_CN_NUM}]+[)）])\s*(.*)$",
    re.S,
)


def _title_of(text: str, limit: int = 70) -> str:
    """A section title from its first block: 'ARTICLE 5 TERM', '5.2 Term', '1. Definitions'
    (the clause body after the title is cut off)."""
    t = " ".join(text.split())
    m = _NUM_PREFIX.match(t)
    number, rest = (m.group(1), m.group(2)) if m else ("", t)
    if len(t) <= limit and not re.search(r"[.;:]\s+\S|[。：；]\S", rest):
        return t.rstrip(".:：。；;")
    cut = re.match(r"^(.{1,%d}?)(?:[.:;](?:\s|$)|[。：；])" % limit, rest)
    if cut:
        title = cut.group(1)
    else:
        words = rest.split()
        title = " ".join(words[:6]).rstrip(".,;:") + ("…" if len(words) > 6 else "")
    return f"{number} {title}".strip() if number else title


_NUMBER = re.compile(r"^(?:(?:ARTICLE|Article|SECTION|Section)\s+)?(\d{1,3}(?:\.\d{1,3})*)\b")


def _number_of(text: str) -> tuple[int, ...] | None:
    m = _NUMBER.match(text.strip())
    return tuple(int(x) for x in m.group(1).split(".")) if m else None


def build_sections(blocks: list[Block], doc_title: str = "") -> list[Section]:
    """Group blocks into sections. Each numbered clause or heading opens a section whose
    path is the chain of enclosing headings. A clause numbered 7.1 nests under the
    heading numbered 7 wherever that heading's level came from (a Markdown '## 7. Term'
    or a Word style), so mixed styling still gives 'Term > 7.1 ...'."""
    sections: list[Section] = []
    stack: list[tuple[int, str, tuple[int, ...] | None]] = []  # (level, title, number)
    current = Section(path=[])
    sections.append(current)
    for block in blocks:
        level: int | None = None
        if block.kind == "heading":
            level = block.level or 1
        elif block.kind == "text":
            level = heading_level(block.text)
        if level is None:
            current.blocks.append(block)
            continue
        title = _title_of(block.text)
        number = _number_of(block.text)
        parent = None
        if number is not None and len(number) > 1:
            for i in range(len(stack) - 1, -1, -1):
                pn = stack[i][2]
                if pn is not None and len(pn) < len(number) and number[: len(pn)] == pn:
                    parent = i
                    break
        if parent is not None:
            del stack[parent + 1 :]
            level = stack[parent][0] + 1
        else:
            while stack and stack[-1][0] >= level:
                stack.pop()
        stack.append((level, title, number))
        current = Section(path=[t for _, t, _ in stack])
        sections.append(current)
        if block.kind != "heading":
            # a numbered clause: the heading line is also the clause body
            current.blocks.append(block)
    return [s for s in sections if s.blocks]


_SENT_SPLIT = re.compile(r"(?<=[.!?;。；！？])\s+|(?<=[。；！？])")


def _split_sentences(text: str) -> list[str]:
    parts = [p for p in _SENT_SPLIT.split(text) if p and p.strip()]
    return parts or [text]


def chunk_sections(
    sections: list[Section],
    count_tokens: Callable[[list[str]], list[int]],
    max_tokens: int,
    min_tokens: int = 40,
) -> list[Chunk]:
    """Pack each section's blocks into chunks of at most `max_tokens` embedder tokens,
    the section path counted in. Long blocks split at sentence boundaries; a table too
    big for one chunk splits by rows with its header repeated. Chunks never span
    sections, so a citation names one clause."""
    chunks: list[Chunk] = []
    offset = 0
    for section in sections:
        path = section.path_str
        head_cost = count_tokens([path])[0] + 1 if path else 0
        budget = max(16, max_tokens - head_cost)
        # pieces: (text, page, kind, char_start, char_end)
        pieces: list[tuple[str, int | None, str, int, int]] = []
        for block in section.blocks:
            start = offset
            offset += len(block.text) + 2  # blocks are joined by a blank line in the full text
            if block.kind == "table":
                for part in _split_table(block.text, count_tokens, budget):
                    pieces.append((part, block.page, "table", start, start + len(block.text)))
                continue
            for sent_start, sent in _pieces_for(block.text, count_tokens, budget):
                pieces.append((sent, block.page, "text", start + sent_start, start + sent_start + len(sent)))
        if not pieces:
            continue
        sizes = count_tokens([p[0] for p in pieces])
        group: list[int] = []
        group_tokens = 0

        def emit(idx: list[int]) -> None:
            items = [pieces[i] for i in idx]
            sep = "\n\n"
            text = sep.join(p[0] for p in items) if any(p[2] == "table" for p in items) else _join(items)
            pages = [p[1] for p in items if p[1] is not None]
            chunks.append(
                Chunk(
                    text=text,
                    section=path,
                    page_start=min(pages) if pages else None,
                    page_end=max(pages) if pages else None,
                    char_start=items[0][3],
                    char_end=items[-1][4],
                    kind="table" if all(p[2] == "table" for p in items) else "text",
                )
            )

        for i, size in enumerate(sizes):
            # +2 leaves room for the joins between pieces
            if group and (group_tokens + size + 2 > budget or pieces[i][2] == "table" or pieces[group[-1]][2] == "table"):
                emit(group)
                group, group_tokens = [], 0
            group.append(i)
            group_tokens += size + 2
        if group:
            emit(group)
    # measure the real embedder input of each chunk (joins can merge tokens differently)
    if chunks:
        real = count_tokens([c.embed_text() for c in chunks])
        for c, n in zip(chunks, real):
            c.tokens = n
    return _merge_tiny(chunks, min_tokens, max_tokens, count_tokens)


def _join(items: list[tuple[str, int | None, str, int, int]]) -> str:
    """Sentences of one block join with a space, separate blocks with a newline."""
    out = items[0][0]
    for prev, cur in zip(items, items[1:]):
        out += (" " if cur[3] <= prev[4] + 1 else "\n") + cur[0]
    return out


def _pieces_for(text: str, count_tokens: Callable[[list[str]], list[int]], budget: int) -> list[tuple[int, str]]:
    """(offset, text) pieces of a block that each fit the budget: whole block, else sentences,
    else words."""
    if count_tokens([text])[0] <= budget:
        return [(0, text)]
    out: list[tuple[int, str]] = []
    pos = 0
    sents = _split_sentences(text)
    sizes = count_tokens(sents)
    cur: list[str] = []
    cur_tokens = 0
    cur_start = 0
    for sent, size in zip(sents, sizes):
        at = text.find(sent, pos)
        at = pos if at < 0 else at
        pos = at + len(sent)
        if size > budget:
            if cur:
                out.append((cur_start, " ".join(cur)))
                cur, cur_tokens = [], 0
            out.extend((at + o, w) for o, w in _split_words(sent, count_tokens, budget))
            continue
        if cur and cur_tokens + size + 1 > budget:
            out.append((cur_start, " ".join(cur)))
            cur, cur_tokens = [], 0
        if not cur:
            cur_start = at
        cur.append(sent)
        cur_tokens += size + 1
    if cur:
        out.append((cur_start, " ".join(cur)))
    return out


def _split_words(text: str, count_tokens: Callable[[list[str]], list[int]], budget: int) -> list[tuple[int, str]]:
    words = text.split(" ")
    out: list[tuple[int, str]] = []
    start = 0
    lo = 0
    while lo < len(words):
        # binary search the longest run of words that fits
        hi_ok, lo_try, hi_try = lo + 1, lo + 1, len(words)
        while lo_try <= hi_try:
            mid = (lo_try + hi_try) // 2
            if count_tokens([" ".join(words[lo:mid])])[0] <= budget:
                hi_ok, lo_try = mid, mid + 1
            else:
                hi_try = mid - 1
        piece = " ".join(words[lo:hi_ok])
        out.append((start, piece))
        start += len(piece) + 1
        lo = hi_ok
    return out


def _split_table(md: str, count_tokens: Callable[[list[str]], list[int]], budget: int) -> list[str]:
    if count_tokens([md])[0] <= budget:
        return [md]
    lines = md.split("\n")
    header = lines[:2] if len(lines) > 1 and set(lines[1].replace("|", "").strip()) <= set("-: ") else lines[:1]
    rows = lines[len(header):]
    head_text = "\n".join(header)
    head_cost = count_tokens([head_text])[0]
    out: list[str] = []
    cur: list[str] = []
    sizes = count_tokens(rows) if rows else []
    cur_tokens = head_cost
    for row, size in zip(rows, sizes):
        if cur and cur_tokens + size + 1 > budget:
            out.append(head_text + "\n" + "\n".join(cur))
            cur, cur_tokens = [], head_cost
        cur.append(row)
        cur_tokens += size + 1
    if cur:
        out.append(head_text + "\n" + "\n".join(cur))
    return out


def _merge_tiny(chunks: list[Chunk], min_tokens: int, max_tokens: int, count_tokens) -> list[Chunk]:
    """Merge a tiny chunk into its neighbour in the same section when the result still fits."""
    out: list[Chunk] = []
    for c in chunks:
        prev = out[-1] if out else None
        if (
            prev is not None
            and prev.section == c.section
            and prev.kind == c.kind == "text"
            and (c.tokens < min_tokens or prev.tokens < min_tokens)
        ):
            merged_text = prev.text + "\n" + c.text
            merged = Chunk(
                text=merged_text,
                section=c.section,
                page_start=_min(prev.page_start, c.page_start),
                page_end=_max(prev.page_end, c.page_end),
                char_start=prev.char_start,
                char_end=c.char_end,
                kind="text",
            )
            merged.tokens = count_tokens([merged.embed_text()])[0]
            if merged.tokens <= max_tokens:
                out[-1] = merged
                continue
        out.append(c)
    return out


def _min(a, b):
    vals = [v for v in (a, b) if v is not None]
    return min(vals) if vals else None


def _max(a, b):
    vals = [v for v in (a, b) if v is not None]
    return max(vals) if vals else None
