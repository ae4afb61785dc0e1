"""Show a cited quote where it is: a PDF page rendered with the quote highlighted, or a
text section with the quote marked.

Pure library (no web code): `pdf_page_png` renders with pypdfium2, finds the quote in
the page's text layer and returns the highlight rectangles in image pixels (one per line
of the match) drawn onto the PNG as well; `text_section_html` escapes a section's text
and wraps the quote in <mark>.

Matching is tolerant of what text extraction and ingest do to a quote: both sides are
reduced to a "skeleton" (Unicode NFKC, case-folded, curly quotes made straight, every
whitespace character, soft hyphen and hyphen dropped), so "confiden-\\r\\ntiality" on
the page matches "confidentiality" in the stored chunk, and a line break matches a
space. Each skeleton character remembers the index of the page character it came from,
so a match maps back to pdfium character indices and from there to glyph boxes. An
ellipsis ("…", as quotes are shortened with) splits a quote into pieces matched in turn.

PDFium is not thread-safe; every pdfium call here runs under `PDFIUM_LOCK`.
"""

from __future__ import annotations

import hashlib
import html
import io
import threading
import unicodedata
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

PDFIUM_LOCK = threading.RLock()

# dropped from the skeleton: whitespace is tested with str.isspace(); these are the rest
_DROP = set("\u00ad\u0002\u0003\ufffe\ufeff\u200b\u200c\u200d\u2060-\u2010\u2011")
_FOLD = str.maketrans({"\u2018": "'", "\u2019": "'", "\u201a": "'", "\u201b": "'", "\u2032": "'", "`": "'",
                       "\u201c": '"', "\u201d": '"', "\u201e": '"', "\u201f": '"', "\u2033": '"'})
MIN_PIECE = 3  # skeleton characters; shorter pieces of a quote are not searched
# a quote that spans a page break: the part on the asked page counts when it is at least
# this long (skeleton characters) or this share of the quote
PARTIAL_MIN_CHARS = 16
PARTIAL_MIN_SHARE = 0.25
# ... and it must end (start) within this many skeleton characters of the page's end
# (start): room for running footers and headers, which pdfium may read before the body
PAGE_EDGE_CHARS = 400
HIGHLIGHT_RGBA = (255, 221, 0, 96)  # semi-transparent yellow
PAD_PX = 1.0


def skeleton(text: str) -> tuple[str, list[int]]:
    """The comparable form of `text` and, per skeleton character, the index in `text`
    it came from."""
    out: list[str] = []
    idx: list[int] = []
    for i, ch in enumerate(text):
        if ch.isspace() or ch in _DROP:
            continue
        folded = unicodedata.normalize("NFKC", ch).casefold().translate(_FOLD)
        for c in folded:
            if c.isspace() or c in _DROP:
                continue
            out.append(c)
            idx.append(i)
    return "".join(out), idx


def quote_pieces(quote: str | None) -> list[str]:
    """The skeletons of the parts of a quote between ellipses ("lead-in: … (d) item …")."""
    if not quote:
        return []
    parts = quote.replace("...", "\u2026").split("\u2026")
    out = []
    for p in parts:
        s, _ = skeleton(p)
        if len(s) >= MIN_PIECE:
            out.append(s)
    return out


def _longest_prefix_in(hay: str, needle: str) -> tuple[int, int]:
    """(length, position) of the longest prefix of `needle` found in `hay`."""
    lo, hi, pos = 0, len(needle), -1
    while lo < hi:  # "needle[:k] in hay" is monotone in k
        mid = (lo + hi + 1) // 2
        at = hay.find(needle[:mid])
        if at >= 0:
            lo, pos = mid, at
        else:
            hi = mid - 1
    return lo, pos


def _longest_suffix_in(hay: str, needle: str) -> tuple[int, int]:
    lo, hi, pos = 0, len(needle), -1
    while lo < hi:
        mid = (lo + hi + 1) // 2
        at = hay.rfind(needle[len(needle) - mid:])
        if at >= 0:
            lo, pos = mid, at
        else:
            hi = mid - 1
    return lo, pos


@dataclass
class Match:
    """Where a quote is in a text: spans of text indices [start, end) and how much of it."""

    spans: list[tuple[int, int]] = field(default_factory=list)
    status: str = "none"  # "full" | "partial" | "none"
    direction: int = 0  # for a partial match: +1 the quote goes on after this text, -1 it began before


def find_quote(text: str, quote: str | None, *, partial: bool = False, continues_after: bool = True,
               began_before: bool = True) -> Match:
    """Locate `quote` in `text` with the tolerant matching described above. With
    `partial`, a quote that is only partly here because it crosses a page break is
    matched by its longest prefix found near the end of the text (`continues_after`) or
    its longest suffix found near the start (`began_before`)."""
    pieces = quote_pieces(quote)
    if not pieces:
        return Match()
    skel, idx = skeleton(text)
    if not skel:
        return Match()

    def span(a: int, n: int) -> tuple[int, int]:
        return idx[a], idx[a + n - 1] + 1

    spans: list[tuple[int, int]] = []
    pos = 0
    for p in pieces:
        at = skel.find(p, pos)
        if at < 0:
            at = skel.find(p)  # out of order: still show it
        if at < 0:
            break
        spans.append(span(at, len(p)))
        pos = at + len(p)
    else:
        return Match(spans=sorted(spans), status="full")
    if not partial:
        return Match()
    whole = "".join(pieces)
    need = min(len(whole), max(PARTIAL_MIN_CHARS, int(PARTIAL_MIN_SHARE * len(whole))))
    best, best_len = Match(), 0
    if continues_after:  # the start of the quote ends this page (a footer may follow)
        n, at = _longest_prefix_in(skel, whole)
        if n >= need and len(skel) - (at + n) <= PAGE_EDGE_CHARS:
            best, best_len = Match(spans=[span(at, n)], status="partial", direction=+1), n
    if began_before:  # the end of the quote starts this page (after a running header)
        n, at = _longest_suffix_in(skel, whole)
        if n >= need and n > best_len and at <= PAGE_EDGE_CHARS:
            best = Match(spans=[span(at, n)], status="partial", direction=-1)
    return best


# ---------------------------------------------------------------- text sections

def text_section_html(text: str, quote: str | None) -> str:
    """`text` HTML-escaped, with the quote (tolerant matching) wrapped in <mark>. Line
    breaks are kept as characters; show the result with `white-space: pre-wrap`."""
    m = find_quote(text, quote)
    out: list[str] = []
    pos = 0
    for a, b in _merge_spans(m.spans):
        out.append(html.escape(text[pos:a]))
        out.append("<mark>" + html.escape(text[a:b]) + "</mark>")
        pos = b
    out.append(html.escape(text[pos:]))
    return "".join(out)


def _merge_spans(spans: list[tuple[int, int]]) -> list[tuple[int, int]]:
    out: list[list[int]] = []
    for a, b in sorted(spans):
        if out and a <= out[-1][1]:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return [(a, b) for a, b in out]


# ---------------------------------------------------------------- PDF pages

Box = tuple[float, float, float, float]  # x0, y0, x1, y1 in image pixels, y down


@dataclass
class PageImage:
    """A rendered page. Unpacks as `png, boxes, size = pdf_page_png(...)`; `page` is
    the page that was rendered (the one the quote was found on), `requested_page` the one
    asked for, `match` "full" / "partial" / "none", `continues` the neighbouring page a
    partial quote goes on to (None otherwise)."""

    png: bytes
    boxes: list[Box]
    size: tuple[int, int]  # image width, height in pixels
    page: int
    requested_page: int
    match: str
    continues: int | None = None
    pages: int = 0  # pages in the document

    def __iter__(self) -> Iterator:
        return iter((self.png, self.boxes, self.size))

    def to_json(self) -> dict:
        return {
            "page": self.page, "requested_page": self.requested_page, "pages": self.pages,
            "boxes": [[round(v, 1) for v in b] for b in self.boxes],
            "width": self.size[0], "height": self.size[1], "match": self.match, "continues": self.continues,
        }


class PageOutOfRange(ValueError):
    def __init__(self, page: int, pages: int):
        super().__init__(page, pages)  # picklable: the renderer process raises it to the server
        self.page = page
        self.pages = pages

    def __str__(self) -> str:
        return f"page {self.page} is out of range: the document has {self.pages} page(s)"


def _page_chars(textpage) -> str:
    """The page's text, one character per pdfium character index (get_text_range can
    differ from the index space for characters outside the BMP)."""
    import pypdfium2.raw as pdfium_c

    n = textpage.count_chars()
    raw = textpage.raw
    return "".join(chr(pdfium_c.FPDFText_GetUnicode(raw, i)) for i in range(n))


def _line_boxes(textpage, spans: list[tuple[int, int]], chars: str) -> list[Box]:
    """Glyph boxes of the matched characters (PDF units, y up), merged per line: a new
    line starts when a glyph does not overlap the current line vertically or when the
    text jumps back to the left (the next line, or the next column)."""
    lines: list[list[float]] = []  # [left, bottom, right, top] in PDF units
    for a, b in _merge_spans(spans):
        cur: list[float] | None = None
        for i in range(a, b):
            if chars[i].isspace() or (chars[i] in _DROP and chars[i] not in "-\u2010\u2011"):
                continue
            left, bottom, right, top = textpage.get_charbox(i, loose=True)
            if right - left <= 0 or top - bottom <= 0:
                continue
            if cur is not None:
                overlap = min(top, cur[3]) - max(bottom, cur[1])
                height = min(top - bottom, cur[3] - cur[1])
                if overlap > 0.5 * height and left >= cur[0] - 1.0:
                    cur[0], cur[1] = min(cur[0], left), min(cur[1], bottom)
                    cur[2], cur[3] = max(cur[2], right), max(cur[3], top)
                    continue
            cur = [left, bottom, right, top]
            lines.append(cur)
    return [tuple(x) for x in lines]


def _to_pixels(page, box: tuple[float, float, float, float], width: int, height: int) -> Box:
    """A PDF-space rectangle as image pixels of a rendering of `width` x `height`
    (pdfium's own page-to-device mapping: rotation and crop box included)."""
    import ctypes

    import pypdfium2.raw as pdfium_c

    left, bottom, right, top = box
    xs, ys = [], []
    for px, py in ((left, bottom), (right, top)):
        dx, dy = ctypes.c_int(), ctypes.c_int()
        pdfium_c.FPDF_PageToDevice(page.raw, 0, 0, width, height, 0, px, py, ctypes.byref(dx), ctypes.byref(dy))
        xs.append(dx.value)
        ys.append(dy.value)
    x0, x1 = max(0.0, min(xs) - PAD_PX), min(float(width), max(xs) + PAD_PX)
    y0, y1 = max(0.0, min(ys) - PAD_PX), min(float(height), max(ys) + PAD_PX)
    return (x0, y0, x1, y1)


def open_pdf(pdf: str | Path | bytes):
    import pypdfium2 as pdfium

    return pdfium.PdfDocument(pdf if isinstance(pdf, bytes) else str(pdf))


def locate_in_pdf(doc, page_number: int, quote: str | None) -> tuple[int, Match]:
    """(page, match): the quote on the asked page, else on the next or previous page
    (a citation names the page a chunk starts on; its quote may sit on the next one),
    else the part of it on the asked page when it crosses a page break."""
    n = len(doc)

    def text_of(p: int) -> str:
        page = doc[p - 1]
        try:
            tp = page.get_textpage()
            try:
                return _page_chars(tp)
            finally:
                tp.close()
        finally:
            page.close()

    if not quote_pieces(quote):
        return page_number, Match()
    texts: dict[int, str] = {}
    for p in (page_number, page_number + 1, page_number - 1):
        if 1 <= p <= n:
            texts[p] = text_of(p)
            m = find_quote(texts[p], quote)
            if m.status == "full":
                return p, m
    m = find_quote(texts[page_number], quote, partial=True, continues_after=page_number < n,
                   began_before=page_number > 1)
    return page_number, m


def _separate_lines(boxes: list[Box]) -> list[Box]:
    """Loose glyph boxes of neighbouring lines overlap by a few pixels (ascent and
    descent); split the overlap so each line's highlight covers its own line."""
    out = [list(b) for b in boxes]
    for i in range(1, len(out)):
        a, b = out[i - 1], out[i]
        if b[1] < a[3] and b[1] > a[1] and b[3] > a[3]:  # b is the line below a and overlaps it
            mid = (b[1] + a[3]) / 2
            a[3], b[1] = mid, mid
    return [tuple(b) for b in out]


def pdf_page_png(pdf_path: str | Path | bytes, page_number: int, quote: str | None, *, scale: float = 1.5,
                 render: bool = True) -> PageImage:
    """Render page `page_number` (1-based) of a PDF (a path or its bytes) with the quote
    highlighted. Returns a PageImage that unpacks as (png_bytes, boxes, (width, height));
    boxes are [x0, y0, x1, y1] image pixels, one per line of the match. When the quote is
    not on that page but on the next or previous one, that page is rendered (see
    `.page`); when it is nowhere, the asked page comes back without boxes. Raises
    PageOutOfRange for a page the document does not have. With `render=False` only the
    boxes and the image size are computed (png is empty)."""
    import math

    from PIL import Image, ImageDraw

    if not 0.1 <= scale <= 6:
        raise ValueError(f"scale {scale} is outside 0.1-6")
    img = None
    with PDFIUM_LOCK:
        doc = open_pdf(pdf_path)
        try:
            n = len(doc)
            if not 1 <= page_number <= n:
                raise PageOutOfRange(page_number, n)
            shown, m = locate_in_pdf(doc, page_number, quote)
            page = doc[shown - 1]
            try:
                # the size pypdfium2's render() gives (PdfPage.render: ceil of size x scale)
                width, height = math.ceil(page.get_width() * scale), math.ceil(page.get_height() * scale)
                if render:
                    img = page.render(scale=scale).to_pil().convert("RGB")
                    width, height = img.size
                boxes: list[Box] = []
                if m.spans:
                    tp = page.get_textpage()
                    try:
                        chars = _page_chars(tp)
                        boxes = [_to_pixels(page, b, width, height) for b in _line_boxes(tp, m.spans, chars)]
                    finally:
                        tp.close()
                    boxes = _separate_lines(boxes)
            finally:
                page.close()
        finally:
            doc.close()
    png = b""
    if img is not None:
        if boxes:
            overlay = Image.new("RGBA", img.size, (0, 0, 0, 0))
            draw = ImageDraw.Draw(overlay)
            for x0, y0, x1, y1 in boxes:
                draw.rectangle([x0, y0, x1, y1], fill=HIGHLIGHT_RGBA)
            img = Image.alpha_composite(img.convert("RGBA"), overlay).convert("RGB")
        buf = io.BytesIO()
        img.save(buf, format="PNG", compress_level=3)
        png = buf.getvalue()
    continues = shown + m.direction if m.status == "partial" and m.direction else None
    return PageImage(png=png, boxes=boxes, size=(width, height), page=shown, requested_page=page_number,
                     match=m.status, continues=continues, pages=n)


def pdf_page_count(pdf: str | Path | bytes) -> int:
    with PDFIUM_LOCK:
        doc = open_pdf(pdf)
        try:
            return len(doc)
        finally:
            doc.close()


def sha256_of(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


# ---------------------------------------------------------------- a stored document's file

class SourceUnavailable(Exception):
    """The file a store record names cannot be shown. `status`: 410 (gone) or 409 (its
    content is no longer what was ingested)."""

    def __init__(self, status: int, message: str):
        super().__init__(status, message)
        self.status = status
        self.message = message

    def __str__(self) -> str:
        return self.message


# (path, device, inode, size, mtime_ns) -> verified bytes of recently shown documents
# (a page and its boxes are asked for one after the other), newest last
_VERIFIED: dict[tuple, bytes] = {}
_VERIFIED_MAX_BYTES = 64 * 1024 * 1024


def read_verified(path: str, sha256: str, name: str, max_bytes: int) -> bytes:
    """The bytes of the file at `path` (a path from a store record, never from a
    request), only when their sha256 is the record's: a file replaced or edited since it
    was ingested is refused (409), a missing one is gone (410). The bytes are what is
    rendered, so what was hashed is what is shown."""
    import os

    try:
        st = os.stat(path)
    except (FileNotFoundError, NotADirectoryError):
        raise SourceUnavailable(410, f"{name}: the file is gone since it was ingested; re-ingest it or remove it "
                                     "from the store (ragkit docs rm)") from None
    except OSError as exc:
        raise SourceUnavailable(410, f"{name}: the file cannot be read ({exc.strerror or exc})") from None
    key = (path, st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
    if key in _VERIFIED:
        return _VERIFIED[key]
    if st.st_size > max_bytes:
        raise SourceUnavailable(409, f"{name}: the file has changed since it was ingested "
                                     f"(now {st.st_size / 1e6:.0f} MB); re-ingest it")
    try:
        with open(path, "rb") as f:
            data = f.read(max_bytes + 1)
    except (FileNotFoundError, NotADirectoryError):
        raise SourceUnavailable(410, f"{name}: the file is gone since it was ingested; re-ingest it") from None
    except OSError as exc:
        raise SourceUnavailable(410, f"{name}: the file cannot be read ({exc.strerror or exc})") from None
    if sha256_of(data) != sha256:
        raise SourceUnavailable(409, f"{name}: the file has changed since it was ingested (its sha256 differs from "
                                     "the store's record); re-ingest it to view it")
    if len(data) <= _VERIFIED_MAX_BYTES // 4:
        _VERIFIED[key] = data
        while sum(len(v) for v in _VERIFIED.values()) > _VERIFIED_MAX_BYTES:
            _VERIFIED.pop(next(iter(_VERIFIED)))
    return data


def render_stored_page(sources: list[tuple[str, str, str]], page: int, quote: str | None, *, scale: float = 1.5,
                       render: bool = True, max_bytes: int = 200 * 1024 * 1024) -> PageImage:
    """`pdf_page_png` on a stored document's file: the first of `sources` (path, sha256,
    name: the store records of one document id) whose file still holds the ingested
    content; SourceUnavailable (the first record's reason) when none does. Runs in the
    page renderer process (ragkit.serve.web)."""
    first: SourceUnavailable | None = None
    for path, sha256, name in sources:
        try:
            data = read_verified(path, sha256, name, max_bytes)
        except SourceUnavailable as exc:
            first = first or exc
            continue
        return pdf_page_png(data, page, quote, scale=scale, render=render)
    raise first or SourceUnavailable(410, "no file for this document")
