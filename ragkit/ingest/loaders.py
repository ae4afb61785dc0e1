"""Turn a file into Blocks in reading order, with page numbers where the format has them.

PDF: pypdfium2 text layer by default (about 10x faster than pypdf here at the same text),
pypdf as an alternative engine. With pypdfium2, numeric tables become Markdown table
blocks (ragkit/ingest/tables.py: character boxes, chosen over pypdf's layout mode by
measurement) and pages without a text layer are OCR'd by tesseract when it is installed
(ragkit/ingest/ocr.py). DOCX: every text a reader sees, tracked changes kept apart
(ragkit/ingest/docx.py). Markdown and plain text: read directly.

Every failure a user's file can cause is raised as DocumentError with a one-line reason.
"""

from __future__ import annotations

import re
from pathlib import Path

from ragkit.errors import DocumentError
from ragkit.ingest.blocks import Block

SUPPORTED = {".pdf", ".docx", ".md", ".markdown", ".txt"}

_HTML_RE = re.compile(rb"^\s*(<!doctype html|<html|<\?xml|<head|<body)", re.I)


def sniff(path: Path, head: bytes) -> str:
    """Describe what a file's first bytes look like, for 'mislabelled file' errors."""
    if not head:
        return "empty"
    if head.startswith(b"%PDF"):
        return "PDF"
    if head.startswith(b"PK\x03\x04"):
        return "zip"
    if _HTML_RE.match(head[:256]):
        return "HTML"
    if head.startswith((b"\xd0\xcf\x11\xe0",)):
        return "legacy MS Office (OLE)"
    if b"\x00" in head[:1024]:
        return "binary data"
    return "text"


def read_bytes(path: Path, n: int = -1) -> bytes:
    """The first `n` bytes of a file (all with -1); what stops the read is the file's
    DocumentError, in the words every reader uses."""
    try:
        with open(path, "rb") as f:
            return f.read(n)
    except PermissionError:
        raise DocumentError(str(path), "permission denied") from None
    except FileNotFoundError:
        raise DocumentError(str(path), "file vanished before it could be read") from None
    except OSError as exc:
        raise DocumentError(str(path), f"cannot read file: {exc.strerror or exc}") from None


def load(
    path: Path,
    *,
    pdf_engine: str = "pypdfium2",
    max_pages: int = 3000,
    max_docx_inflated_mb: int = 300,
    ocr_lang: str = "eng",
    tables: bool = True,
) -> list[Block]:
    """Blocks of one file. PDF pages without a text layer are OCR'd with tesseract when it
    is installed (language `ocr_lang`, tesseract's names: eng, chi_sim, eng+chi_sim);
    numeric tables on PDF pages become Markdown table blocks (`tables`)."""
    suffix = path.suffix.lower()
    if suffix not in SUPPORTED:
        raise DocumentError(str(path), f"unsupported file type {suffix or '(none)'}; ragkit reads {', '.join(sorted(SUPPORTED))}")
    head = read_bytes(path, 2048)
    if not head:
        raise DocumentError(str(path), "file is empty (0 bytes)")
    kind = sniff(path, head)
    if suffix == ".pdf":
        if kind != "PDF":
            raise DocumentError(str(path), f"not a PDF: the content looks like {kind}")
        if pdf_engine == "pypdfium2":
            blocks = _load_pdf_pdfium(path, max_pages=max_pages, ocr_lang=ocr_lang, tables=tables)
        else:
            blocks = _load_pdf_pypdf(path, max_pages=max_pages)
    elif suffix == ".docx":
        if kind != "zip":
            raise DocumentError(str(path), f"not a DOCX (a DOCX is a zip archive): the content looks like {kind}")
        from ragkit.ingest.docx import load_docx

        blocks = load_docx(path, max_inflated=max_docx_inflated_mb * 1024 * 1024)
    elif suffix in (".md", ".markdown"):
        blocks = _load_markdown(_read_text(path, kind))
    else:
        blocks = _load_plain(_read_text(path, kind))
    blocks = [b for b in blocks if b.text.strip()]
    if suffix == ".pdf":
        blocks = drop_running_lines(blocks)
    if not blocks:
        if suffix == ".pdf":
            from ragkit.ingest.ocr import INSTALL_HINT, tesseract

            if pdf_engine == "pypdfium2" and tesseract() is not None:
                raise DocumentError(str(path), "no text layer, and OCR found no text (blank pages, or images without text)")
            raise DocumentError(
                str(path), f"no text layer (scanned or image-only PDF) and OCR is not available; {INSTALL_HINT}"
            )
        raise DocumentError(str(path), "no text found in the file")
    return blocks


# ---------------------------------------------------------------- text files

def _read_text(path: Path, kind: str) -> str:
    if kind == "binary data":
        raise DocumentError(str(path), "not a text file: the content is binary data")
    data = path.read_bytes()
    if data.startswith((b"\xff\xfe", b"\xfe\xff")):
        try:
            return data.decode("utf-16")
        except UnicodeDecodeError:
            pass
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise DocumentError(
            str(path), f"not UTF-8 text (invalid byte 0x{data[exc.start]:02x} at offset {exc.start}); re-save it as UTF-8"
        ) from None


_MD_HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
_MD_TABLE_ROW = re.compile(r"^\s*\|.*\|\s*$")


def _load_markdown(text: str) -> list[Block]:
    blocks: list[Block] = []
    para: list[str] = []
    table: list[str] = []

    def flush_para() -> None:
        if para:
            blocks.append(Block(" ".join(s.strip() for s in para)))
            para.clear()

    def flush_table() -> None:
        if table:
            blocks.append(Block("\n".join(table), kind="table"))
            table.clear()

    for line in text.splitlines():
        m = _MD_HEADING.match(line)
        if _MD_TABLE_ROW.match(line):
            flush_para()
            table.append(line.strip())
            continue
        flush_table()
        if m:
            flush_para()
            blocks.append(Block(_strip_md(m.group(2)), kind="heading", level=len(m.group(1))))
        elif not line.strip():
            flush_para()
        elif re.match(r"^\s*([-*+]|\d+[.)])\s+", line) and para:
            flush_para()  # a list item starts its own block
            para.append(line)
        else:
            para.append(line)
    flush_para()
    flush_table()
    for b in blocks:
        if b.kind == "text":
            b.text = _strip_md(b.text)
    return blocks


def _strip_md(s: str) -> str:
    s = re.sub(r"<[^>]+>", "", s)  # inline HTML such as <span class="...">Purpose</span>
    s = re.sub(r"\*\*(.+?)\*\*", r"\1", s)
    s = re.sub(r"__(.+?)__", r"\1", s)
    s = re.sub(r"\[([^\]]+)\]\([^)]+\)", r"\1", s)
    return s.strip()


def _load_plain(text: str) -> list[Block]:
    return [Block(p) for p in _paragraphs(text.splitlines())]


# ---------------------------------------------------------------- PDF

def _paragraphs(lines: list[str]) -> list[str]:
    """Join wrapped lines into paragraphs. A blank line, or a line that starts a numbered
    clause or heading, starts a new paragraph."""
    from ragkit.ingest.sections import starts_new_block, statement_title

    out: list[str] = []
    buf: list[str] = []
    for raw in lines:
        line = raw.strip()
        if not line:
            if buf:
                out.append(" ".join(buf))
                buf = []
            continue
        if buf and starts_new_block(line):
            out.append(" ".join(buf))
            buf = []
        buf.append(line)
        if statement_title(line):
            out.append(" ".join(buf))
            buf = []
    if buf:
        out.append(" ".join(buf))
    return [_dehyphenate(p) for p in out]


def _dehyphenate(p: str) -> str:
    return re.sub(r"(\w)- (\w)", lambda m: m.group(1) + m.group(2) if m.group(2).islower() else m.group(0), p)


def drop_running_lines(blocks: list[Block]) -> list[Block]:
    """Drop running headers and footers: short text blocks that repeat (digits ignored)
    on at least 3 pages and 30% of the pages ("AMAZON.COM, INC.", "Apple Inc. | Q1 2023
    Form 10-Q | 4"). Left in, they become bogus section headings on every page."""
    pages = {b.page for b in blocks if b.page is not None}
    if len(pages) < 3:
        return blocks
    def key(b: Block) -> str:
        return re.sub(r"\d+", "#", " ".join(b.text.split()).lower())
    seen: dict[str, set[int]] = {}
    for b in blocks:
        if b.kind == "text" and len(b.text) <= 100 and b.page is not None:
            seen.setdefault(key(b), set()).add(b.page)
    running = {k for k, ps in seen.items() if len(ps) >= max(3, 0.3 * len(pages))}
    if not running:
        return blocks
    return [b for b in blocks if not (b.kind == "text" and len(b.text) <= 100 and key(b) in running)]


def _page_blocks(page_texts: list[tuple[int, str]]) -> list[Block]:
    blocks: list[Block] = []
    for page_no, text in page_texts:
        blocks.extend(_text_blocks(text, page_no))
    return blocks


def _text_blocks(text: str, page_no: int, *, head: bool = True, tail: bool = True) -> list[Block]:
    """Paragraph blocks of a page's text (or of a piece of it between tables); a bare page
    number at the page's top (head) or bottom (tail) is dropped."""
    lines = text.replace("\r\n", "\n").replace("\r", "\n").split("\n")
    lines = _drop_page_furniture(lines, page_no, head=head, tail=tail)
    return [Block(p, page=page_no) for p in _paragraphs(lines)]


def _page_pieces_blocks(pieces: list[tuple[str, str]], page_no: int) -> list[Block]:
    blocks: list[Block] = []
    last = len(pieces) - 1
    for k, (kind, payload) in enumerate(pieces):
        if kind == "table":
            blocks.append(Block(payload, page=page_no, kind="table"))
        else:
            blocks.extend(_text_blocks(payload, page_no, head=k == 0, tail=k == last))
    return blocks


def _drop_page_furniture(lines: list[str], page_no: int, *, head: bool = True, tail: bool = True) -> list[str]:
    """Drop a bare page number ('3', 'Page 3', '- 3 -', 'Page 3 of 9') at the top or bottom of a page."""
    pat = re.compile(rf"^\s*(page\s*)?[-–]?\s*{page_no}\s*[-–]?(\s*of\s*\d+)?\s*$", re.I)
    while lines and not lines[-1].strip():
        lines.pop()
    if tail and lines and pat.match(lines[-1]):
        lines = lines[:-1]
    if head and lines and pat.match(lines[0]):
        lines = lines[1:]
    return lines


# Time spent per stage, for eval/bench_ingest.py (process-wide; reset by the caller).
STATS: dict[str, float] = {"pdf_pages": 0, "pdf_text_s": 0.0, "table_s": 0.0, "tables": 0, "ocr_pages": 0, "ocr_s": 0.0}


def pdfium_text(textpage) -> str:
    """A page's text as ingest stores it, from its pdfium text page: pdfium writes U+FFFE
    for a hyphen the PDF marks as breakable (between "non" and "transferable" in CUAD's
    filings), a noncharacter no reader, matcher or spreadsheet accepts: read here as "-".
    Whatever shows a page's text beside the stored chunks (the MCP page resource) reads it so."""
    return textpage.get_text_range().replace("\ufffe", "-")


def _load_pdf_pdfium(path: Path, *, max_pages: int, ocr_lang: str = "eng", tables: bool = True) -> list[Block]:
    import time

    import pypdfium2 as pdfium

    from ragkit.ingest import ocr
    from ragkit.ingest.tables import carry_headers, find_tables, split_page

    try:
        pdf = pdfium.PdfDocument(str(path))
    except pdfium.PdfiumError as exc:
        msg = str(exc).lower()
        if "password" in msg:
            raise DocumentError(str(path), "encrypted PDF: a password is needed to read it") from None
        raise DocumentError(str(path), f"corrupt or truncated PDF ({_pdfium_reason(exc)})") from None
    try:
        n = len(pdf)
        if n == 0:
            raise DocumentError(str(path), "PDF has no pages")
        if n > max_pages:
            raise DocumentError(str(path), f"PDF has {n} pages, over the limit of {max_pages} (setting ingest.max_pages)")
        blocks: list[Block] = []
        exe = ocr.tesseract()
        last_table = None  # the previous page's last table, when the page ended in it (carry_headers)
        for i in range(n):
            page = pdf[i]
            try:
                t0 = time.perf_counter()
                tp = page.get_textpage()
                text = pdfium_text(tp)
                t1 = time.perf_counter()
                found = []
                if tables and text.strip():
                    try:
                        found = carry_headers(find_tables(tp, text), last_table)
                    except Exception:  # a heuristic must never cost the document its text
                        found = []
                tp.close()
                t2 = time.perf_counter()
                STATS["pdf_pages"] += 1
                STATS["pdf_text_s"] += t1 - t0
                STATS["table_s"] += t2 - t1
                STATS["tables"] += len(found)
                if not text.strip() and exe is not None and ocr.page_has_images(page):
                    try:
                        text = ocr.ocr_page(page, ocr_lang, exe=exe)
                    except ocr.OcrError as exc:
                        raise DocumentError(str(path), f"page {i + 1}: {exc}") from None
                    STATS["ocr_pages"] += 1
                    STATS["ocr_s"] += time.perf_counter() - t2
                pieces = split_page(text, found)
                blocks.extend(_page_pieces_blocks(pieces, i + 1))
                # a table runs on only when nothing but the page's footer (a page number) follows it
                ends_in_table = bool(found) and len(" ".join(pieces[-1][1].split())) <= 40
                last_table = found[-1] if ends_in_table else None
            finally:
                page.close()
        return blocks
    except pdfium.PdfiumError as exc:
        raise DocumentError(str(path), f"corrupt PDF page ({_pdfium_reason(exc)})") from None
    finally:
        pdf.close()


def _pdfium_reason(exc: Exception) -> str:
    s = str(exc)
    m = re.search(r"\(PDFium: (.*?)\)", s)
    return m.group(1) if m else s


def _load_pdf_pypdf(path: Path, *, max_pages: int) -> list[Block]:
    import logging

    import pypdf
    from pypdf.errors import FileNotDecryptedError, PdfReadError

    logging.getLogger("pypdf").setLevel(logging.ERROR)
    try:
        reader = pypdf.PdfReader(str(path))
        if reader.is_encrypted:
            try:
                ok = reader.decrypt("")
            except Exception:
                ok = 0
            if not ok:
                raise DocumentError(str(path), "encrypted PDF: a password is needed to read it")
        n = len(reader.pages)
        if n > max_pages:
            raise DocumentError(str(path), f"PDF has {n} pages, over the limit of {max_pages} (setting ingest.max_pages)")
        texts = [(i + 1, page.extract_text() or "") for i, page in enumerate(reader.pages)]
    except DocumentError:
        raise
    except FileNotDecryptedError:
        raise DocumentError(str(path), "encrypted PDF: a password is needed to read it") from None
    except (PdfReadError, ValueError, KeyError, TypeError, AttributeError, IndexError) as exc:
        raise DocumentError(str(path), f"corrupt or truncated PDF ({type(exc).__name__}: {str(exc)[:120]})") from None
    return _page_blocks(texts)
