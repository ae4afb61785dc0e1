"""Split blocks into sections along the document's own structure, then into chunks
bounded in embedder tokens.

Written by hand on purpose: generic splitters (LangChain, LlamaIndex) cut by
characters or tokens and know nothing of "Article 5", "5.2(a)" or 第三条; a lawyer's
citation needs the clause path, so the numbering rules live here.
"""

from __future__ import annotations

import re
from typing import Callable

from ragkit.ingest.blocks import Block, Chunk, Section

_CN_NUM = "一二三四五六七八九十百千零〇两"

# SEC filings: "PART I — FINANCIAL INFORMATION", "Item 1A. Risk Factors", "Note 4 – Leases"
_PART = re.compile(r"^(PART|Part)\s+[IVX]+\b")
_ITEM = re.compile(r"^(ITEM|Item)\s+\d{1,2}[A-Z]?\.(\s|$)")
_NOTE = re.compile(r"^(NOTE|Note)\s+\d{1,2}\s*[–—:.-]\s*\S")
# a financial statement's title on a line of its own, in capitals or title case, with at most
# its unit in brackets: "CONSOLIDATED BALANCE SHEETS", "Consolidated Statements of Cash Flows
# (in millions)", "Condensed Consolidated Statements of Operations", and the notes' own title
# ("Notes to Consolidated Financial Statements"). Nothing may follow (a contents line ends in
# its page, "F-4" or "73"), so the statement's tables are cited, and searched, under its name;
# a page's "(continued)" repeat is text (a heading there would nest under the note it interrupts).
# A bank's style too: the company's name before a title in sentence case, "JPMorgan Chase & Co.
# Consolidated statements of income (unaudited)" (the name must end as a company's does, so
# "Refer to the Consolidated balance sheets" stays prose), or without the name, followed by its
# status in brackets ("Consolidated balance sheets (unaudited)"): a note's caption "Consolidated
# statements of income" stays text, in its note. In sentence case only a statement's own words
# may follow, so a wrapped line "Consolidated statements of income for the years ended" stays prose.
_SENTENCE_CASE = (
    r"(?:Condensed\s+)?(?:Consolidated|Combined)\s+(?:statements?\s+of\s+(?:(?:income|operations|earnings|"
    r"comprehensive|\(?loss\)?|\(?income\)?|cash|flows|changes|in|and|of|(?:stock|share)holders[’']?|members[’']?|"
    r"partners[’']?|equity|deficit|capital|financial|position|condition|net|assets)\s*){1,8}?|balance\s+sheets?)")
_STATEMENT = re.compile(
    r"^(?:(?:CONDENSED\s+)?(?:CONSOLIDATED|COMBINED)\s+(?:STATEMENTS?\s+OF\s+[A-Z][A-Z ,’'/&()-]{3,60}?|BALANCE\s+SHEETS?)"
    r"|[A-Z][\w.&,’' -]{0,50}?\b(?:Co|Inc|Corp|Corporation|Company|Ltd|plc|LLC|N\.A)\.?\s+" + _SENTENCE_CASE
    + r"|" + _SENTENCE_CASE + r"(?=\s*\((?![Cc]ontinued)[^()]{0,60}\)\s*$)"
    r"|(?:Condensed\s+)?(?:Consolidated|Combined)\s+(?:Statements?\s+of\s+(?:(?:[A-Z][\w’'/&()-]*|and|of|in)\s*){1,8}?"
    r"|Balance\s+Sheets?)"
    r"|(?:NOTES\s+TO\s+(?:THE\s+)?(?:CONDENSED\s+)?CONSOLIDATED\s+FINANCIAL\s+STATEMENTS"
    r"|Notes\s+to\s+(?:the\s+)?(?:Condensed\s+)?Consolidated\s+Financial\s+Statements))"
    r"\s*(?:\((?![Cc]ontinued|CONTINUED)[^()]{0,60}\))?\s*$")

# (pattern, how to compute the level from the match). Order matters.
_HEADING_RULES: list[tuple[re.Pattern[str], Callable[[re.Match[str]], int]]] = [
    # a lowercase word after the number is a sentence ("Section 12 of the Exchange Act",
    # "Article 5 shall survive"), not a heading
    (re.compile(r"^(ARTICLE|Article)\s+([IVXLC]+|\d+)(?![\dIVXLC])\.?(?!\s*[a-z])"), lambda m: 1),
    (_PART, lambda m: 1),
    (_ITEM, lambda m: 2),
    (_NOTE, lambda m: 3),
    (_STATEMENT, lambda m: 1),
    (re.compile(r"^(SECTION|Section)\s+(\d+(?:\.\d+)*)(?!\.?\d)\.?(?!\s*[a-z])"), lambda m: m.group(2).count(".") + 1),
    (re.compile(rf"^第[{_CN_NUM}\d]+[编]"), lambda m: 1),
    (re.compile(rf"^第[{_CN_NUM}\d]+[章]"), lambda m: 1),
    (re.compile(rf"^第[{_CN_NUM}\d]+[节]"), lambda m: 2),
    (re.compile(rf"^第[{_CN_NUM}\d]+[条]"), lambda m: 3),
    (re.compile(rf"^[{_CN_NUM}]+、"), lambda m: 1),
    (re.compile(rf"^[（(][{_CN_NUM}]+[)）]"), lambda m: 2),
    # 5.2, 3.1.8, 5.2. Title — needs a dot-separated number, and no lowercase word after it
    # (a wrapped line "19.7 percent, respectively" is no clause)
    (re.compile(r"^(\d{1,3}(?:\.\d{1,3})+)\.?\s+(?:[A-Z\"(\[]|[^\x00-\x7f])"), lambda m: m.group(1).count(".") + 1),
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
    if len(letters) < 4 or not re.search(r"[^\W\d_]{3}", t):  # a word, not "TM TM ® ®" or "U S A"
        return False
    if sum(c.isdigit() for c in t) > len(letters):  # a table row, "SOFR + 0.850 1.99 267"
        return False
    return all(c.isupper() for c in letters) and len(t.split()) <= 10


def statement_title(line: str) -> bool:
    """A financial statement's title standing alone ("Consolidated Statement of Income"):
    it ends its block too, so the lines under it ("PepsiCo, Inc. and Subsidiaries", the
    periods) are not read as part of the title."""
    return bool(_STATEMENT.match(line.strip()))


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


# a table of contents' entry: a title, then its page number(s) ("Item 8. Financial Statements
# and Supplementary Data 45", "GLOSSARY 114 29", "12. CONFIDENTIALITY ....... 12"); years
# (four digits) are no page numbers
_CONTENTS_TAIL = re.compile(r"[^\W\d_]{3}.*?(?:\s*[.…·]{2,}\s*|\s+)(?:\d{1,3}|[ivxlc]{1,6})(?:\s+\d{1,3})*\s*$")
CONTENTS_MIN = 3  # entries on one page (or close together) that make a table of contents


def _page_number_only(text: str) -> bool:
    """A heading's number, then only a page number: "PART II. 28"."""
    m = _NUM_PREFIX.match(" ".join(text.split()))
    return bool(m and re.fullmatch(r"\d{1,3}", m.group(2)))


def _contents_entry(text: str) -> bool:
    """A title after its number, then page number(s): "ARTICLE 1 Definitions 1" is one,
    a bare "ARTICLE 1" (its own number, no title) is not."""
    t = " ".join(text.split())
    m = _NUM_PREFIX.match(t)
    return bool(_CONTENTS_TAIL.search(m.group(2) if m else t))


def contents_entries(blocks: list[Block]) -> set[int]:
    """Indices of the blocks that are entries of a table of contents, which are never
    headings: lines that would open a section and end in a page number, at least
    CONTENTS_MIN of them on one page (or, without pages, each within 3 blocks of the next).
    Left as headings, a 10-K's contents page opens "Item 8. ... 116" before the real Item 8,
    and a line such as "GLOSSARY 114 29" stays on the section path of every note after it."""
    cands = [i for i, b in enumerate(blocks)
             if b.kind == "text" and len(b.text) <= 160 and _contents_entry(b.text) and heading_level(b.text) is not None]
    out: set[int] = set()
    if any(blocks[i].page is not None for i in cands):
        by_page: dict[int | None, list[int]] = {}
        for i in cands:
            by_page.setdefault(blocks[i].page, []).append(i)
        for page, idx in by_page.items():
            if page is not None and len(idx) >= CONTENTS_MIN:
                out.update(idx)
                # on a contents page, a part's line with only its page number is an entry too ("PART II. 28")
                out.update(i for i, b in enumerate(blocks) if b.page == page and b.kind == "text"
                           and _page_number_only(b.text) and heading_level(b.text) is not None)
                # and a heading-like line between two entries, though it names no page (PepsiCo's
                # MD&A contents: "CONSOLIDATED STATEMENT OF EQUITY 65", "NOTES TO THE CONSOLIDATED
                # FINANCIAL STATEMENTS", "Note 1 – Basis of Presentation and Our Divisions 66")
                out.update(i for i, b in enumerate(blocks) if b.page == page and b.kind == "text"
                           and 0 < i < len(blocks) - 1 and i - 1 in out and i + 1 in out
                           and heading_level(b.text) is not None)
        return out
    run: list[int] = []
    for i in cands + [None]:
        if i is not None and run and i - run[-1] <= 3:
            run.append(i)
            continue
        if len(run) >= CONTENTS_MIN:
            out.update(run)
        run = [i] if i is not None else []
    return out


def _filing_level(text: str, level: int, filing: bool) -> tuple[int, bool]:
    """In an SEC filing (once a PART or Item heading is seen) the Items are the frame: an
    ALL-CAPS heading ("NOTES TO THE CONSOLIDATED FINANCIAL STATEMENTS", "CONSOLIDATED
    BALANCE SHEET") sits under the current Item, a Note under that ("Item 8 > NOTES TO ... >
    Note 3 — Restructuring"), instead of closing the Item as a level-1 heading would."""
    if _PART.match(text) or _ITEM.match(text):
        return level, True
    if not filing:
        return level, False
    if _NOTE.match(text):
        return 4, True
    if _STATEMENT.match(text):
        # the notes' own title heads the notes (3); a statement sits under the company line
        # above it ("NVIDIA CORPORATION AND SUBSIDIARIES > CONDENSED CONSOLIDATED STATEMENTS OF
        # INCOME"), whose name a question often gives
        return (3 if text.lstrip()[:5].upper() == "NOTES" else 4), True
    if not any(pat.match(text) for pat, _ in _HEADING_RULES) and _is_caps_heading(text):
        return 3, True
    return level, True


def build_sections(blocks: list[Block], doc_title: str = "") -> list[Section]:
    """Group blocks into sections. Each numbered clause or heading opens a section whose
    path is the chain of enclosing headings. A clause numbered 7.1 nests under the
    heading numbered 7 wherever that heading's level came from (a Markdown '## 7. Term'
    or a Word style), so mixed styling still gives 'Term > 7.1 ...'."""
    sections: list[Section] = []
    stack: list[tuple[int, str, tuple[int, ...] | None]] = []  # (level, title, number)
    current = Section(path=[])
    sections.append(current)
    contents = contents_entries(blocks)
    filing = False  # a PART or Item heading was seen: an SEC filing's structure
    for n, block in enumerate(blocks):
        level: int | None = None
        if block.kind == "heading":
            level = block.level or 1
        elif block.kind == "text" and n not in contents:
            level = heading_level(block.text)
            if level is not None:
                level, filing = _filing_level(block.text, level, filing)
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
        current = Section(path=[t for _, t, _ in stack], changes=list(block.changes) if block.kind == "heading" else [],
                          heading=block if block.kind == "heading" else None)
        sections.append(current)
        if block.kind != "heading" or title != " ".join(block.text.split()).rstrip(".:：。；;"):
            # a numbered clause: the heading line is also the clause body (and so is a
            # heading-styled paragraph too long to be a title whole: its words stay text)
            current.blocks.append(block if block.kind != "heading" else Block(block.text, page=block.page))
    sections = _keep_orphan_headings(sections)
    kept = [s for s in sections if s.blocks]
    # a heading's tracked changes stay with the clause it opens (the next one with text)
    pending: list = []
    for s in sections:
        if s.blocks:
            s.changes = pending + s.changes
            pending = []
        else:
            pending += s.changes
    if pending and kept:
        kept[-1].changes += pending
    return kept



CountTokens = Callable[[list[str]], list[int]]

_ELIDED = "…"


def _keep_orphan_headings(sections: list[Section]) -> list[Section]:
    """A heading the format declares (a Word style, a Markdown #) that heads no text and
    no clause under it (a document's title lines before "1. Definitions", read at the
    same level) is text the reader sees: it stays, where it stands, as the text of a
    section under the headings above it (consecutive ones together), never dropped."""
    out: list[Section] = []
    made: set[int] = set()  # ids of the sections made here of such headings
    for i, s in enumerate(sections):
        nxt = sections[i + 1].path if i + 1 < len(sections) else []
        if s.blocks or s.heading is None or nxt[: len(s.path)] == s.path:
            out.append(s)
            continue
        text = Block(s.heading.text, page=s.heading.page)
        if out and id(out[-1]) in made and out[-1].path == s.path[:-1]:
            out[-1].blocks.append(text)
            out[-1].changes += s.changes
        else:
            out.append(Section(path=s.path[:-1], blocks=[text], changes=s.changes))
            made.add(id(out[-1]))
    return out


class ChunkingError(RuntimeError):
    """Internal error: a chunk still exceeds the embedder's limit after re-splitting. A bug
    in the chunker (or a tokenizer that spends more than the budget on one character),
    never a property of the user's file; raised so that nothing is silently truncated."""


def _split_sentences(text: str) -> list[str]:
    """The block's sentences, as they stand in it (ragkit.evidence.sentences, the one splitter)."""
    from ragkit.evidence.sentences import sentence_spans

    parts = [text[a:b] for a, b in sentence_spans(text)]
    return parts or [text]


def chunk_sections(
    sections: list[Section],
    count_tokens: CountTokens,
    max_tokens: int,
    min_tokens: int = 40,
) -> list[Chunk]:
    """Pack each section's blocks into chunks whose embedded text (`Chunk.embed_text()`:
    section path, newline, body) is at most `max_tokens` embedder tokens. Long blocks split
    at sentence boundaries, then between words, then between characters (text without
    spaces such as Chinese, long URLs); a table too big for one chunk splits by rows with
    its header repeated. A section path longer than a quarter of the limit is shortened
    in the embedded text only (leading headings elided, then the title cut: "… > 5.2
    Term"), so the body always has room; `Chunk.section` keeps the full path. The final
    embedded text of every chunk is measured, re-split when it is still over the limit,
    and ChunkingError is raised if it cannot be made to fit. Chunks never span sections,
    so a citation names one clause."""
    if max_tokens < 8:
        raise ValueError(f"max_tokens must be at least 8, got {max_tokens}")
    chunks: list[Chunk] = []
    offset = 0
    path_cap = max(2, max_tokens // 4)
    placed: list[tuple[int, int, object]] = []  # tracked changes at their offsets in the full text
    for section in sections:
        placed.extend((offset, offset, c) for c in section.changes)
        path = section.path_str
        shown, shown_cost = _fit_path(section.path, count_tokens, path_cap)
        embed_section = None if shown == path else shown
        head_cost = shown_cost + 1 if shown else 0  # +1: the newline after the path
        budget = max_tokens - head_cost  # at least 3/4 of the limit
        # pieces: (text, page, kind, char_start, char_end)
        pieces: list[tuple[str, int | None, str, int, int]] = []
        for block in section.blocks:
            start = offset
            offset += len(block.text) + 2  # blocks are joined by a blank line in the full text
            placed.extend((start + c.start, start + c.end, c) for c in block.changes)
            if not block.text.strip():
                continue
            if block.kind == "table":
                for part in _split_table(block.text, count_tokens, budget):
                    pieces.append((part, block.page, "table", start, start + len(block.text)))
                continue
            kind = "comment" if block.kind == "comment" else "text"
            for sent_start, sent in _pieces_for(block.text, count_tokens, budget):
                pieces.append((sent, block.page, kind, start + sent_start, start + sent_start + len(sent)))
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
                    kind=items[0][2] if all(p[2] == items[0][2] for p in items) else "text",
                    embed_section=embed_section,
                )
            )

        for i, size in enumerate(sizes):
            # +2 leaves room for the joins between pieces
            # a table, and a reviewer's comment, are chunks of their own
            if group and (group_tokens + size + 2 > budget or pieces[i][2] == "table" or pieces[group[-1]][2] == "table"
                          or pieces[i][2] != pieces[group[-1]][2]):
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
    chunks = _merge_tiny(chunks, min_tokens, max_tokens, count_tokens)
    chunks = _enforce_limit(chunks, count_tokens, max_tokens)
    _place_changes(chunks, placed)
    return chunks


def _place_changes(chunks: list[Chunk], placed: list[tuple[int, int, object]]) -> None:
    """Each tracked change goes with the chunks of contract text its span touches (a
    deletion, with no span, with the first whose range holds its place); one that falls
    between chunks goes with the chunk after it (or the last)."""
    text_chunks = [c for c in chunks if c.kind != "comment"]
    for a, b, change in placed:
        if a < b:
            hit = [c for c in text_chunks if a < c.char_end and b > c.char_start]
        else:
            hit = [c for c in text_chunks if c.char_start <= a <= c.char_end][:1]
        if not hit:
            after = [c for c in text_chunks if c.char_start >= a]
            hit = after[:1] or text_chunks[-1:]
        for c in hit:
            c.changes.append(change)


def _fit_path(parts: list[str], count_tokens: CountTokens, cap: int) -> tuple[str, int]:
    """The section path as it goes into the embedded text, and its token count: the whole
    path when it costs at most `cap` tokens, else the deepest headings that fit behind
    '… > ', else the deepest heading cut short ('…' at the end); '' if not even that fits."""
    full = " > ".join(parts)
    if not full:
        return "", 0
    cands = [full] + [f"{_ELIDED} > " + " > ".join(parts[k:]) for k in range(1, len(parts))]
    for cand, n in zip(cands, count_tokens(cands)):
        if n <= cap:
            return cand, n
    last = cands[-1]
    keep = _longest_fit(len(last), lambda k: count_tokens([last[:k].rstrip() + _ELIDED])[0] <= cap, start=cap)
    if not keep:
        return "", 0
    shown = last[:keep].rstrip() + _ELIDED
    return shown, count_tokens([shown])[0]


def _longest_fit(n: int, fits: Callable[[int], bool], start: int = 1) -> int:
    """The largest k in 1..n with fits(k) (0 when not even 1 fits), by galloping up from
    `start` and then bisecting, so a huge n costs O(log k) calls on short prefixes. fits
    is taken to be monotone (a prefix of something that fits, fits)."""
    if n <= 0:
        return 0
    k = min(max(1, start), n)
    if fits(k):
        lo, hi = k, n
        while lo < hi:
            nxt = min(2 * lo, hi)
            if not fits(nxt):
                hi = nxt - 1
                break
            lo = nxt
    else:
        lo, hi = 0, k - 1
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if fits(mid):
            lo = mid
        else:
            hi = mid - 1
    return lo


def _join(items: list[tuple[str, int | None, str, int, int]]) -> str:
    """Sentences of one block join with a space, separate blocks with a newline."""
    out = items[0][0]
    for prev, cur in zip(items, items[1:]):
        out += (" " if cur[3] <= prev[4] + 1 else "\n") + cur[0]
    return out


def _pieces_for(text: str, count_tokens: CountTokens, budget: int) -> list[tuple[int, str]]:
    """(offset, text) pieces of a block that each fit the budget: whole block, else sentences,
    else words, else characters."""
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
    return [(o, p) for o, p in out if p.strip()]


def _split_words(text: str, count_tokens: CountTokens, budget: int) -> list[tuple[int, str]]:
    """Runs of space-separated words that each fit the budget; a word too long on its own
    (a run of Chinese, a long URL) is split by characters."""
    words = text.split(" ")
    out: list[tuple[int, str]] = []
    start = 0  # offset of words[lo] in text
    lo = 0
    while lo < len(words):
        k = _longest_fit(len(words) - lo, lambda k: count_tokens([" ".join(words[lo : lo + k])])[0] <= budget)
        if k == 0:
            k = 1
            out.extend((start + o, p) for o, p in _split_chars(words[lo], count_tokens, budget))
        else:
            out.append((start, " ".join(words[lo : lo + k])))
        start += sum(len(w) for w in words[lo : lo + k]) + k  # the words and the spaces after them
        lo += k
    return [(o, p) for o, p in out if p.strip()]


def _split_chars(text: str, count_tokens: CountTokens, budget: int) -> list[tuple[int, str]]:
    """Character windows of text that each fit the budget, measured with the tokenizer
    (a CJK character is about one token, a Latin word piece several characters). A cut
    inside a run of letters or digits moves back to the nearest other character in the
    window's second half, so a URL splits at '/' or '.' where it can."""
    out: list[tuple[int, str]] = []
    pos, n = 0, len(text)
    while pos < n:
        k = _longest_fit(n - pos, lambda k: count_tokens([text[pos : pos + k]])[0] <= budget, start=budget)
        if k == 0:
            raise ChunkingError(f"the character {text[pos]!r} alone is more than {budget} embedder tokens")
        end = pos + k
        if end < n and text[end - 1].isalnum() and text[end].isalnum():
            for cut in range(end - 1, pos + k // 2, -1):
                if not (text[cut - 1].isalnum() and text[cut].isalnum()):
                    end = cut
                    break
        out.append((pos, text[pos:end]))
        pos = end
    return out


def _split_table(md: str, count_tokens: CountTokens, budget: int) -> list[str]:
    """A Markdown table in pieces that each fit the budget: runs of rows, each with the
    header repeated (unless the header takes more than 3/4 of the budget, when it goes
    once, as the first rows); a row too long for a piece is split like text."""
    if count_tokens([md])[0] <= budget:
        return [md]
    lines = md.split("\n")
    header = lines[:2] if len(lines) > 1 and set(lines[1].replace("|", "").strip()) <= set("-: ") else lines[:1]
    head_text = "\n".join(header)
    head_cost = count_tokens([head_text])[0]
    if head_cost > 3 * budget // 4:  # too big to repeat: it would leave the rows no room
        head_text, head_cost, rows = "", 0, lines
    else:
        rows = lines[len(header) :]
    rows = [r for r in rows if r.strip()]

    def piece(body: list[str]) -> str:
        return "\n".join(([head_text] if head_text else []) + body)

    out: list[str] = []
    cur: list[str] = []
    sizes = count_tokens(rows) if rows else []
    cur_tokens = head_cost
    for row, size in zip(rows, sizes):
        if size + 1 > budget - head_cost:  # a row too long for any piece: its own pieces
            if cur:
                out.append(piece(cur))
                cur, cur_tokens = [], head_cost
            out.extend(piece([p]) for _, p in _pieces_for(row, count_tokens, budget - head_cost - 1))
            continue
        if cur and cur_tokens + size + 1 > budget:
            out.append(piece(cur))
            cur, cur_tokens = [], head_cost
        cur.append(row)
        cur_tokens += size + 1
    if cur:
        out.append(piece(cur))
    return out


def _merge_tiny(chunks: list[Chunk], min_tokens: int, max_tokens: int, count_tokens) -> list[Chunk]:
    """Merge a tiny chunk into its neighbour in the same section when the result still fits."""
    out: list[Chunk] = []
    for c in chunks:
        prev = out[-1] if out else None
        if (
            prev is not None
            and prev.section == c.section
            and prev.embed_section == c.embed_section
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
                embed_section=c.embed_section,
            )
            merged.tokens = count_tokens([merged.embed_text()])[0]
            if merged.tokens <= max_tokens:
                out[-1] = merged
                continue
        out.append(c)
    return out


def _enforce_limit(chunks: list[Chunk], count_tokens: CountTokens, max_tokens: int, tries: int = 4) -> list[Chunk]:
    """The final check: measure every chunk's real embedder input (`embed_text()`), set
    `tokens`, and re-split any chunk still over `max_tokens` (the count of joined pieces
    is not always the sum of their counts), each retry with a budget cut by the
    overshoot. ChunkingError if some chunk still does not fit."""
    for attempt in range(tries + 1):
        sizes = count_tokens([c.embed_text() for c in chunks]) if chunks else []
        for c, n in zip(chunks, sizes):
            c.tokens = n
        over = [c for c in chunks if c.tokens > max_tokens]
        if not over:
            return chunks
        if attempt == tries:
            break
        chunks = [p for c in chunks for p in (_resplit(c, count_tokens, max_tokens, attempt) if c.tokens > max_tokens else [c])]
    c = over[0]
    raise ChunkingError(
        f"a chunk of section {c.section!r} is {c.tokens} embedder tokens after re-splitting, over the limit of {max_tokens}"
    )


def _resplit(c: Chunk, count_tokens: CountTokens, max_tokens: int, attempt: int) -> list[Chunk]:
    """An over-limit chunk as several. Pages and kind are the chunk's; character offsets
    are the piece's position in the chunk's text, which is close to (not exactly) its
    position in the document when the chunk joined several blocks."""
    head = c.section if c.embed_section is None else c.embed_section
    head_cost = count_tokens([head])[0] + 1 if head else 0
    budget = max(1, max_tokens - head_cost - attempt * (c.tokens - max_tokens))
    if c.kind == "table":
        parts = [(0, p) for p in _split_table(c.text, count_tokens, budget)]
    else:
        parts = _pieces_for(c.text, count_tokens, budget)
        if len(parts) == 1 and attempt:  # nothing to split at that budget: halve it
            parts = _pieces_for(c.text, count_tokens, max(1, budget // 2))
    return [
        Chunk(
            text=p,
            section=c.section,
            page_start=c.page_start,
            page_end=c.page_end,
            char_start=min(c.char_start + o, c.char_end),
            char_end=min(c.char_start + o + len(p), c.char_end),
            kind=c.kind,
            embed_section=c.embed_section,
        )
        for o, p in parts
    ]


def _min(a, b):
    vals = [v for v in (a, b) if v is not None]
    return min(vals) if vals else None


def _max(a, b):
    vals = [v for v in (a, b) if v is not None]
    return max(vals) if vals else None
