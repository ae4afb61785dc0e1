"""Find numeric tables on a PDF page and render them as Markdown.

Why character boxes (pypdfium2) and not pypdf's layout mode, measured on the 12 SEC 10-Q
filings (536 pages, eval/bench_ingest.py, 2 shared cores): pypdf
`extract_text(extraction_mode="layout")` keeps columns aligned with spaces but ran at 7.7
pages/s, and still leaves the columns to be guessed from runs of spaces without the
header's geometry; the pypdfium2 text layer with this table pass ran at 83 pages/s (122
without it: the pass costs about 4 ms a page) and found 378 tables. Glyph boxes give
exact positions, so lines are regrouped by baseline (the text layer's own order splits a
two-line column header into four lines), cells split at wide gaps, and columns come
from the x-extent of the numbers.

Scope: tables whose body cells are numbers (financial statements, schedules). A page
only goes through the geometry when its text has several lines that end in two or more
numbers, so prose pages keep the plain text-layer flow. Everything outside a table on
the page flows as text, in the text layer's order.
"""

from __future__ import annotations

import ctypes
import re
from dataclasses import dataclass, field

# a value cell: $ 1,234 / (393) / 37.0 % / — / 1.2x ; the $ and % may be separate glyph runs
_NUM = re.compile(r"^[\$€£¥]?\s*\(?\s*[\$€£¥]?\s*(\d[\d,]*(\.\d+)?|\.\d+)\s*\)?\s*%?\)?$")
# a nil cell: "—", or "$ —" once a lone currency sign has joined it (_merge_units); left
# unread, a first row "Cost of sales $ — $ 1 $ 32" ended the table above it, so the year
# header lost its table (a third of the tables of four 10-Ks had no header)
_DASH = re.compile(r"^(?:[\$€£¥]\s*)?[—–\-−]+$")
_YEAR = re.compile(r"^(19|20)\d\d$")
# a text-layer line that ends in at least two numbers: the cheap test for a table page
_ROWISH = re.compile(r"(?:^|\s)(?:\$\s*)?\(?[\d][\d,.]*\)?\s*%?\s+(?:\$\s*)?\(?[\d][\d,.]*\)?\s*%?\s*$")


def is_value(s: str) -> bool:
    s = s.strip()
    return bool(_NUM.match(s) or _DASH.match(s))


def looks_tabular(text: str, min_lines: int = 3) -> bool:
    n = 0
    for line in text.splitlines():
        if _ROWISH.search(line) and not _YEAR_ONLY.match(line.strip()):
            n += 1
            if n >= min_lines:
                return True
    return False


_YEAR_ONLY = re.compile(r"^((19|20)\d\d\s*)+$")


@dataclass
class _Seg:
    x0: float
    x1: float
    text: str
    idx: list[int] = field(default_factory=list)  # char indices in the text layer
    lead: float | None = None  # x0 of a currency sign merged in front of the number

    @property
    def value(self) -> bool:
        return is_value(self.text)


@dataclass
class _Line:
    y: float  # centre of the line
    h: float  # typical glyph height
    segs: list[_Seg]

    @property
    def idx(self) -> list[int]:
        return [i for s in self.segs for i in s.idx]


@dataclass
class Table:
    markdown: str
    first_char: int  # where the table sits in the text layer's order
    chars: set[int]  # text-layer indices the table consumed
    rows: int
    cols: int
    heads: list[str] = field(default_factory=list)  # the column headers ("" where none was found)
    centres: list[float] = field(default_factory=list)  # each value column's x centre
    h: float = 0.0  # the body's glyph height

    @property
    def headless(self) -> bool:
        return not any(self.heads)


def carry_headers(tables: list[Table], before: Table | None = None) -> list[Table]:
    """A table found with no column headers, whose value columns stand where those of the
    table before it stand (the same page, or the last table of the page before: a statement
    that runs on, or one broken by a run of label lines such as "Commitments and
    contingencies"), takes that table's headers: the years and periods a figure is read by
    stay on every part. `before`: the previous page's last table."""
    out: list[Table] = []
    prev = before
    for t in tables:
        if t.headless and prev is not None and not prev.headless and _aligned(t, prev):
            lines = t.markdown.split("\n")
            head = prev.markdown.split("\n", 1)[0]
            t = Table("\n".join([head] + lines[1:]), t.first_char, t.chars, t.rows, t.cols, list(prev.heads),
                      t.centres, t.h)
        out.append(t)
        prev = t
    return out


def _aligned(a: Table, b: Table) -> bool:
    if a.cols != b.cols or len(a.centres) != len(b.centres) or not a.centres:
        return False
    tol = 2.0 * max(a.h, b.h, 1.0)
    return all(abs(x - y) <= tol for x, y in zip(a.centres, b.centres))


def _char_boxes(textpage, text: str):
    """(index, char, left, right, bottom, top) of each visible glyph. Loose boxes (font
    ascent to descent) so that a comma sits on the same line as its digits."""
    import pypdfium2.raw as pdfium_c

    rect = pdfium_c.FS_RECTF()
    out = []
    get = pdfium_c.FPDFText_GetLooseCharBox
    raw = textpage.raw
    ref = ctypes.byref(rect)
    for i, ch in enumerate(text):
        if ch.isspace():
            continue
        if not get(raw, i, ref):
            continue
        if rect.right <= rect.left or rect.top <= rect.bottom:
            continue
        out.append((i, ch, rect.left, rect.right, rect.bottom, rect.top))
    return out


def _median(xs: list[float]) -> float:
    xs = sorted(xs)
    return xs[len(xs) // 2] if xs else 0.0


def _lines(chars, text: str) -> list[_Line]:
    """Regroup glyphs into visual lines by their vertical centre, then split each line
    into cells at gaps wider than a glyph height."""
    if not chars:
        return []
    hs = [c[5] - c[4] for c in chars]
    med_h = max(_median(hs), 1.0)
    items = sorted(chars, key=lambda c: -(c[4] + c[5]) / 2)
    groups: list[list] = []
    cur: list = []
    cur_y = None
    for c in items:
        yc = (c[4] + c[5]) / 2
        if cur and abs(yc - cur_y) > 0.45 * med_h:
            groups.append(cur)
            cur = []
        if not cur:
            cur_y = yc
        cur.append(c)
        cur_y = cur_y if len(cur) == 1 else (cur_y * (len(cur) - 1) + yc) / len(cur)
    if cur:
        groups.append(cur)
    lines: list[_Line] = []
    for g in groups:
        g.sort(key=lambda c: c[2])
        h = max(_median([c[5] - c[4] for c in g]), 1.0)
        segs: list[_Seg] = []
        prev = None
        for c in g:
            gap = c[2] - prev[3] if prev is not None else 0.0
            numeric_edge = prev is not None and prev[1] in "0123456789)%—–" and c[1] in "0123456789$€£(—–-"
            if prev is None or gap > max(1.3 * h, 4.0) or (numeric_edge and gap > 0.6 * h):
                segs.append(_Seg(c[2], c[3], c[1], [c[0]]))
            else:
                s = segs[-1]
                between = text[prev[0] + 1 : c[0]] if 0 <= c[0] - prev[0] <= 4 else None
                if between is not None and (not between or between.isspace()):
                    space = bool(between)  # the text layer's own word spacing
                else:
                    space = gap > 0.2 * h
                s.text += (" " if space else "") + c[1]
                s.x1 = max(s.x1, c[3])
                s.idx.append(c[0])
            prev = c
        lines.append(_Line(y=sum((c[4] + c[5]) / 2 for c in g) / len(g), h=h, segs=_merge_units(segs)))
    return lines


def _merge_units(segs: list[_Seg]) -> list[_Seg]:
    """A lone '$' joins the number after it; a lone '%' or ')' joins the number before."""
    out: list[_Seg] = []
    for k, s in enumerate(segs):
        t = s.text.strip()
        if out and out[-1].text.strip() in ("$", "€", "£", "¥") and is_value(s.text):
            p = out.pop()
            s = _Seg(s.x0, s.x1, p.text + " " + s.text, p.idx + s.idx, lead=p.x0)
        elif t in ("%", ")", "%)") and out and is_value(out[-1].text):
            p = out[-1]
            out[-1] = _Seg(p.x0, s.x1, p.text + t, p.idx + s.idx, lead=p.lead)
            continue
        out.append(s)
    return out


def _is_row(line: _Line) -> bool:
    """A label (optional) then one or more value cells, at least two cells in all."""
    if len(line.segs) < 2:
        return False
    vals = line.segs[1:]
    if not all(s.value for s in vals):
        return False
    if all(_YEAR.match(s.text.strip()) for s in line.segs):
        return False  # '2023   2022': a header line
    return True


def _columns(rows: list[_Line]) -> list[tuple[float, float]]:
    """Merge the x-extents of value cells into column intervals."""
    spans = sorted((s.x0, s.x1) for ln in rows for s in ln.segs[1:] if s.value)
    spans += sorted((s.x0, s.x1) for ln in rows if ln.segs[0].value and _all_values(ln) for s in ln.segs[:1])
    spans.sort()
    cols: list[list[float]] = []
    for x0, x1 in spans:
        if cols and x0 <= cols[-1][1] + 1.0:
            cols[-1][1] = max(cols[-1][1], x1)
        else:
            cols.append([x0, x1])
    return [(a, b) for a, b in cols]


def _all_values(line: _Line) -> bool:
    return all(s.value for s in line.segs)


def _col_of(seg: _Seg, cols: list[tuple[float, float]]) -> int:
    best, best_ov = -1, 0.0
    for j, (a, b) in enumerate(cols):
        ov = min(b, seg.x1) - max(a, seg.x0)
        if ov > best_ov:
            best, best_ov = j, ov
    if best >= 0:
        return best
    c = (seg.x0 + seg.x1) / 2
    return min(range(len(cols)), key=lambda j: abs((cols[j][0] + cols[j][1]) / 2 - c))


def _header_cols(seg: _Seg, zones: list[tuple[float, float]]) -> list[int]:
    """Columns a header cell stands over: every column zone holding a quarter of its
    width (a spanning 'Three Months Ended' covers two), else the nearest one."""
    w = max(seg.x1 - seg.x0, 1.0)
    over = [j for j, (a, b) in enumerate(zones) if min(b, seg.x1) - max(a, seg.x0) >= 0.25 * w]
    if over:
        return over
    c = (seg.x0 + seg.x1) / 2
    return [min(range(len(zones)), key=lambda j: abs((zones[j][0] + zones[j][1]) / 2 - c))]


def _zones(rows: list[_Line], cols: list[tuple[float, float]], label_right: float, h: float) -> list[tuple[float, float]]:
    """The horizontal band each column's header may occupy: from halfway across the gap
    to the column on its left (currency signs counted in) to just past its numbers."""
    lefts = [a for a, _ in cols]
    for ln in rows:
        for s in ln.segs[1:]:
            if s.lead is not None:
                j = _col_of(s, cols)
                lefts[j] = min(lefts[j], s.lead)
    zones = []
    for j, (a, b) in enumerate(cols):
        lo = label_right + 0.5 * h if j == 0 else (cols[j - 1][1] + lefts[j]) / 2
        zones.append((lo, b + 0.5 * h))
    return zones


def _cell(s: str) -> str:
    return " ".join(s.split()).replace("|", "\\|")


def find_tables(textpage, text: str) -> list[Table]:
    """Numeric tables on one page, top to bottom. Empty when the page has none."""
    if not looks_tabular(text):
        return []
    lines = _lines(_char_boxes(textpage, text), text)
    tables: list[Table] = []
    i, n = 0, len(lines)
    while i < n:
        if not _is_row(lines[i]):
            i += 1
            continue
        end, j = i, i + 1
        while j < n:  # rows, with runs of at most 2 label-only lines between them
            if _is_row(lines[j]):
                end, j = j, j + 1
                continue
            k = j
            while k < n and k - j < 2 and _label_only(lines[k]):
                k += 1
            if j < k < n and _is_row(lines[k]) and lines[end].y - lines[k].y < 4 * lines[k].h * (k - end):
                j = k
                continue
            break
        t = _table_at(lines, i, end)
        if t is not None:
            tables.append(t)
        i = end + 1
    return tables


def _label_only(line: _Line) -> bool:
    return len(line.segs) == 1 and not line.segs[0].value


def _table_at(lines: list[_Line], first: int, last: int) -> Table | None:
    rows = [ln for ln in lines[first : last + 1] if _is_row(ln)]
    if len(rows) < 2 or sum(len(ln.segs) - 1 for ln in rows) < 4:
        return None
    cols = _columns(rows)
    if not cols or len(cols) > 12:
        return None
    label_edge = cols[0][0]
    if any(not ln.segs[0].value and ln.segs[0].x0 >= label_edge for ln in rows):
        return None  # a 'label' inside the value columns: not a table we understand
    h = _median([ln.h for ln in rows])
    label_right = max((s.x1 for ln in rows for s in ln.segs if s.x1 <= label_edge + 1 and not s.value), default=label_edge - h)
    start = first
    # label-only lines just above the first row ('Net sales:') belong to the body
    while (
        start - 1 >= 0 and first - (start - 1) <= 2 and _label_only(lines[start - 1])
        and lines[start - 1].segs[0].x1 <= label_edge and lines[start - 1].y - lines[start].y < 3 * h
    ):
        start -= 1
    # header: lines above whose cells stand over the value columns
    header: list[_Line] = []
    label_head = ""
    k, prev_y = start - 1, lines[start].y
    while k >= 0 and len(header) < 5:
        ln = lines[k]
        if ln.y - prev_y > 3.2 * h:
            break
        segs = ln.segs
        lead = segs[0] if len(segs) > 1 and segs[0].x1 <= label_edge and not segs[0].value else None
        rest = segs[1:] if lead is not None else segs
        ok = rest and all(
            s.x0 >= label_right + 0.5 * h and (s.x0 + s.x1) / 2 >= label_edge - 2 * h
            and not (s.value and not _YEAR.match(s.text.strip()))
            for s in rest
        )
        if not ok:
            break
        header.insert(0, ln)
        if lead is not None:
            label_head = (_cell(lead.text) + " " + label_head).strip()
        prev_y, k = ln.y, k - 1
    zones = _zones(rows, cols, label_right, h)
    heads: list[list[str]] = [[] for _ in cols]
    for ln in header:
        for s in ln.segs:
            if s.x1 <= label_edge and not s.value and s is ln.segs[0] and len(ln.segs) > 1:
                continue  # the label column's own header
            for c in _header_cols(s, zones):
                heads[c].append(_cell(s.text))
    body = lines[start : last + 1]
    md_rows: list[list[str]] = []
    for ln in body:
        label: list[str] = []
        cells = [""] * len(cols)
        for s in ln.segs:
            if s.x1 <= label_edge + 1 and not s.value:
                label.append(_cell(s.text))
            else:
                c = _col_of(s, cols)
                cells[c] = (cells[c] + " " + _cell(s.text)).strip()
        md_rows.append([" ".join(label)] + cells)
    head_row = [label_head] + [" ".join(x) for x in heads]
    md = ["| " + " | ".join(head_row) + " |", "|" + "---|" * len(head_row)]
    md += ["| " + " | ".join(r) + " |" for r in md_rows]
    used = [c for ln in header + body for c in ln.idx]
    return Table("\n".join(md), min(used), set(used), len(md_rows), len(cols), [" ".join(x) for x in heads],
                 [(a + b) / 2 for a, b in cols], h)


def split_page(text: str, tables: list[Table]) -> list[tuple[str, str]]:
    """The page as ('text', prose) and ('table', markdown) pieces in reading order: the
    text layer with the tables' characters taken out, each table placed where its first
    character was."""
    if not tables:
        return [("text", text)]
    drop: set[int] = set()
    for t in tables:
        drop |= t.chars
    at = {t.first_char: t for t in tables}
    pieces: list[tuple[str, str]] = []
    buf: list[str] = []
    for i, ch in enumerate(text):
        t = at.get(i)
        if t is not None:
            pieces.append(("text", "".join(buf)))
            buf = []
            pieces.append(("table", t.markdown))
        if i not in drop:
            buf.append(ch)
    pieces.append(("text", "".join(buf)))
    return pieces
