"""Word (.docx) files as blocks: every piece of text a reader of the document sees.

python-docx gives the package, its parts, styles and a safe XML parser (no entities, no
network), but its `paragraph.text` and `document.paragraphs` see only runs that are direct
children of a paragraph and paragraphs that are direct children of the body: the text of
a tracked insertion, a content control, a smart tag or a text box is silently lost
(a clause "survive for <ins>five (5)</ins> years" read as "survive for  years"). No
library on the registries reads all of it: docx2python 3.7.1, the closest, measured on
the tests' tracked-change file (tests/wordxml.py), keeps the inserted and content-control
text but reads each text box twice (the drawing and its VML fallback), anchors a comment
to the wrong text, and gives no struck words, change authors or dates. So the XML is
walked here, with python-docx's parser (no entities, no network), in document order:

- runs inside insertions (w:ins, w:moveTo), hyperlinks, smart tags, custom XML, simple
  fields, bidi wrappers and inline content controls (w:sdt); deleted and moved-away text
  (w:del, w:moveFrom: w:delText) is not read into the text but kept as a TrackedChange;
- paragraphs and tables inside block-level content controls and custom XML, nested
  tables, rows and cells inside content controls;
- text boxes (w:txbxContent; of an mc:AlternateContent only its first choice, which
  holds the same text box as the fallback) as paragraphs after the one that anchors them;
- footnotes and endnotes after the paragraph that references them, with their mark:
  "(footnote 1)" in the clause, "Footnote 1: ..." after it;
- comments as blocks of kind "comment" after the paragraph where their range ends:
  "Comment by Counsel (2026-12-01) on “five (5)”: ...", never joined with contract text;
- headers and footers once per document (each distinct text once: "Header: ..."), under
  a last heading "Headers and footers".

Field codes (w:instrText) are not text a reader sees; a field's result is.
"""

from __future__ import annotations

import re
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

from ragkit.errors import DocumentError
from ragkit.ingest.blocks import Block
from ragkit.ingest.changes import TrackedChange

_W = "{http://schemas.openxmlformats.org/wordprocessingml/2006/main}"
_MC = "{http://schemas.openxmlformats.org/markup-compatibility/2006}"
_M = "{http://schemas.openxmlformats.org/officeDocument/2006/math}"

# inline wrappers whose content is read as if it stood in the paragraph itself
_INLINE_WRAPPERS = {f"{_W}hyperlink", f"{_W}smartTag", f"{_W}customXml", f"{_W}fldSimple", f"{_W}bdo", f"{_W}dir"}
# block-level wrappers whose paragraphs and tables are read in place
_BLOCK_WRAPPERS = {f"{_W}customXml", f"{_W}ins", f"{_W}moveTo"}
_SKIP = {f"{_W}pPr", f"{_W}rPr", f"{_W}tblPr", f"{_W}tblGrid", f"{_W}trPr", f"{_W}tcPr", f"{_W}sectPr", f"{_W}sdtPr",
         f"{_W}sdtEndPr", f"{_W}instrText", f"{_W}delInstrText", f"{_W}proofErr", f"{_W}bookmarkStart",
         f"{_W}bookmarkEnd", f"{_W}permStart", f"{_W}permEnd", f"{_W}lastRenderedPageBreak"}
_CHANGE_KIND = {f"{_W}ins": "inserted", f"{_W}moveTo": "moved-in", f"{_W}del": "deleted", f"{_W}moveFrom": "moved-out"}


def _attr(el, name: str) -> str:
    return el.get(f"{_W}{name}") or ""


def _day(date: str) -> str:
    m = re.match(r"\d{4}-\d{2}-\d{2}", date or "")
    return m.group(0) if m else ""


@dataclass
class _Para:
    """The text of one paragraph as it is read, and what it carries besides its text."""

    parts: list[str] = field(default_factory=list)
    changes: list[TrackedChange] = field(default_factory=list)
    after: list[Block] = field(default_factory=list)  # text boxes, notes, comments: blocks after it

    @property
    def pos(self) -> int:
        return sum(len(p) for p in self.parts)

    def add(self, s: str) -> None:
        if s:
            self.parts.append(s)


class _Reader:
    def __init__(self, document, path: Path):
        from docx.opc.constants import RELATIONSHIP_TYPE as RT

        self.styles: dict[str, str] = {}
        for s in document.styles:
            try:
                if s.style_id:
                    self.styles[s.style_id] = s.name or ""
            except Exception:  # an odd style entry must not cost the document
                continue
        self.notes: dict[str, dict[str, object]] = {"footnote": {}, "endnote": {}}
        self.comments: dict[str, object] = {}
        self.furniture: list[object] = []  # header and footer parts' roots
        for rel in document.part.rels.values():
            if rel.is_external:
                continue
            kind = {RT.FOOTNOTES: "footnote", RT.ENDNOTES: "endnote", RT.COMMENTS: "comment",
                    RT.HEADER: "header", RT.FOOTER: "footer"}.get(rel.reltype)
            if kind is None:
                continue
            root = _root_of(rel.target_part)
            if root is None:
                continue
            if kind in ("header", "footer"):
                self.furniture.append((kind, root))
            elif kind == "comment":
                for c in root.iter(f"{_W}comment"):
                    self.comments[_attr(c, "id")] = c
            else:
                for n in root.iter(f"{_W}{kind}"):
                    self.notes[kind][_attr(n, "id")] = n
        self.note_count = {"footnote": 0, "endnote": 0}
        self.open_comments: dict[str, list[str]] = {}  # id -> anchored text read so far
        self.seen_comments: set[str] = set()
        self.change_seq = 0

    # ------------------------------------------------------------ block level

    def blocks(self, container) -> list[Block]:
        """Paragraphs and tables of a body, cell, content control, note or text box."""
        out: list[Block] = []
        for el in container:
            tag = el.tag
            if tag == f"{_W}p":
                out.extend(self.paragraph(el))
            elif tag == f"{_W}tbl":
                out.extend(self.table(el))
            elif tag == f"{_W}sdt":
                content = el.find(f"{_W}sdtContent")
                if content is not None:
                    out.extend(self.blocks(content))
            elif tag in _BLOCK_WRAPPERS:
                out.extend(self.blocks(el))
            elif tag == f"{_MC}AlternateContent":
                choice = _first_choice(el)
                if choice is not None:
                    out.extend(self.blocks(choice))
        return out

    def paragraph(self, p) -> list[Block]:
        para = _Para()
        for text in self.open_comments.values():
            text.append("\n")
        self.inline(p, para)
        raw = "".join(para.parts)
        text = raw.strip()
        out: list[Block] = []
        if text:
            ppr = p.find(f"{_W}pPr")
            style = ""
            if ppr is not None:
                ps = ppr.find(f"{_W}pStyle")
                if ps is not None:
                    style = self.styles.get(_attr(ps, "val"), _attr(ps, "val"))
            level = _heading_level(style)
            prefix = ""
            if level is None and ppr is not None and ppr.find(f"{_W}numPr") is not None:
                prefix = "- "  # automatic numbering is not in the text: keep list items items
            shift = len(prefix) - (len(raw) - len(raw.lstrip()))
            for c in para.changes:
                c.start = max(0, min(len(prefix) + len(text), c.start + shift))
                c.end = max(c.start, min(len(prefix) + len(text), c.end + shift))
            block = Block(prefix + text, kind="heading" if level is not None else "text", level=level,
                          changes=para.changes)
            _deletion_context(block)
            out.append(block)
        elif para.changes:
            # a paragraph whose every word was struck: its changes stay with the next block
            out.append(Block("", changes=para.changes))
        # its notes and text boxes, then the comments on it (each a chunk of its own, so
        # they come last: the clause and its notes stay one chunk)
        out.extend([b for b in para.after if b.kind != "comment"] + [b for b in para.after if b.kind == "comment"])
        return out

    def table(self, tbl) -> list[Block]:
        """A table as one Markdown block on its layout grid; the notes, comments and text
        boxes of its cells follow it."""
        after: list[Block] = []
        changes: list[TrackedChange] = []
        rows: list[list[str]] = []
        above: dict[int, str] = {}  # grid column -> text of the cell covering it in the row above
        for tr in _children(tbl, f"{_W}tr"):
            trpr = tr.find(f"{_W}trPr")
            row = [""] * _grid(trpr, "gridBefore")
            here: dict[int, str] = {}
            for tc in _children(tr, f"{_W}tc"):
                col = len(row)
                texts = []
                for b in self.blocks(tc):
                    if b.kind in ("text", "heading") and b.text:
                        texts.append(b.text)
                    elif b.kind == "table":
                        texts.append(" ".join(b.text.replace("|", " ").replace("---", " ").split()))
                    elif b.text:
                        after.append(b)
                    changes.extend(b.changes)
                text = "\n".join(texts)
                tcpr = tc.find(f"{_W}tcPr")
                vm = tcpr.find(f"{_W}vMerge") if tcpr is not None else None
                if vm is not None and _attr(vm, "val") != "restart" and not text.strip():
                    # continues the cell above (Word moves merged content to the top cell)
                    text = above.get(col, "")
                here[col] = text
                row.append(text)
                row.extend([""] * (max(1, _grid(tcpr, "gridSpan") or 1) - 1))
            row.extend([""] * _grid(trpr, "gridAfter"))
            rows.append(row)
            above = here
        md = table_markdown(rows)
        out: list[Block] = []
        if md:
            block = Block(md, kind="table")
            for c in changes:  # placed where their words stand in the table's text
                at = md.find(c.text) if c.in_text and c.text else -1
                c.start, c.end = (at, at + len(c.text)) if at >= 0 else (0, 0)
            block.changes = changes
            out.append(block)
        elif changes:
            out.append(Block("", changes=changes))
        return out + after

    # ------------------------------------------------------------ inline level

    def inline(self, el, para: _Para, deleted: TrackedChange | None = None) -> None:
        for child in el:
            tag = child.tag
            if tag == f"{_W}r":
                self.run(child, para, deleted)
            elif tag in _CHANGE_KIND:
                self.change(child, para, deleted)
            elif tag in _INLINE_WRAPPERS:
                self.inline(child, para, deleted)
            elif tag == f"{_W}sdt":
                content = child.find(f"{_W}sdtContent")
                if content is not None:
                    self.inline(content, para, deleted)
            elif tag == f"{_MC}AlternateContent":
                choice = _first_choice(child)
                if choice is not None:
                    self.inline(choice, para, deleted)
            elif tag == f"{_W}commentRangeStart":
                self.open_comments.setdefault(_attr(child, "id"), [])
            elif tag == f"{_W}commentRangeEnd":
                self.comment(_attr(child, "id"), para)
            elif tag in (f"{_M}oMath", f"{_M}oMathPara"):
                self.add(para, "".join(t.text or "" for t in child.iter(f"{_M}t")), deleted)
            elif tag in _SKIP:
                continue
            else:  # an element this reader does not know: its runs are still text
                self.inline(child, para, deleted)

    def add(self, para: _Para, s: str, deleted: TrackedChange | None) -> None:
        if not s:
            return
        if deleted is not None:
            deleted.text += s
            return
        para.add(s)
        for text in self.open_comments.values():
            text.append(s)

    def run(self, r, para: _Para, deleted: TrackedChange | None) -> None:
        for child in r:
            tag = child.tag
            if tag == f"{_W}t":
                self.add(para, child.text or "", deleted)
            elif tag == f"{_W}delText":
                # struck text; a w:delText outside a deletion (malformed) is still struck
                if deleted is not None:
                    deleted.text += child.text or ""
            elif tag in (f"{_W}tab", f"{_W}ptab"):
                self.add(para, "\t", deleted)
            elif tag in (f"{_W}br", f"{_W}cr"):
                self.add(para, "\n", deleted)
            elif tag == f"{_W}noBreakHyphen":
                self.add(para, "-", deleted)
            elif tag in (f"{_W}footnoteReference", f"{_W}endnoteReference"):
                if deleted is None:
                    self.note(child, para)
            elif tag == f"{_W}commentReference":
                cid = _attr(child, "id")
                if cid not in self.seen_comments:  # a comment on a point, with no range
                    self.open_comments.setdefault(cid, [])
                    self.comment(cid, para)
            elif tag in (f"{_W}drawing", f"{_W}pict", f"{_W}object", f"{_MC}AlternateContent"):
                if deleted is None:
                    for box in _text_boxes(child):
                        para.after.extend(self.blocks(box))
            elif tag == f"{_MC}Choice" or tag == f"{_MC}Fallback":
                continue

    def change(self, el, para: _Para, deleted: TrackedChange | None) -> None:
        kind = _CHANGE_KIND[el.tag]
        self.change_seq += 1
        c = TrackedChange(kind=kind, text="", author=_attr(el, "author"), date=_day(_attr(el, "date")),
                          id=f"{kind}:{_attr(el, 'id') or ''}:{self.change_seq}")
        if deleted is not None:  # inserted, then struck: struck
            self.inline(el, para, deleted)
            return
        if c.in_text:
            c.start = para.pos
            self.inline(el, para, None)
            c.end = para.pos
            c.text = "".join(para.parts)[c.start:c.end]
        else:
            self.inline(el, para, c)
            c.start = c.end = para.pos
        if not c.text.strip():
            return
        prev = para.changes[-1] if para.changes else None
        if (prev is not None and prev.kind == c.kind and prev.author == c.author and prev.date == c.date
                and prev.end == c.start):
            # Word splits one edit into one element per run of formatting: one change
            prev.text += c.text
            prev.end = c.end
            return
        para.changes.append(c)

    def note(self, ref, para: _Para) -> None:
        kind = "footnote" if ref.tag == f"{_W}footnoteReference" else "endnote"
        n = self.notes[kind].get(_attr(ref, "id"))
        self.note_count[kind] += 1
        mark = str(self.note_count[kind])
        para.add(f" ({kind} {mark})")
        if n is None:
            return
        body = self.blocks(n)
        text = f"{kind.capitalize()} {mark}: " + "\n".join(b.text for b in body if b.kind != "comment" and b.text)
        changes = [c for b in body for c in b.changes]
        for c in changes:  # placed where their words (or, struck, the words after them) stand
            at = text.find(c.text if c.in_text else c.after) if (c.text if c.in_text else c.after) else -1
            c.start = max(at, 0)
            c.end = c.start + (len(c.text) if c.in_text and at >= 0 else 0)
        para.after.append(Block(text, changes=changes))
        para.after.extend(b for b in body if b.kind == "comment")

    def comment(self, cid: str, para: _Para) -> None:
        anchored = self.open_comments.pop(cid, None)
        c = self.comments.get(cid)
        if anchored is None or c is None or cid in self.seen_comments:
            return
        self.seen_comments.add(cid)
        saved = self.open_comments
        self.open_comments = {}
        body = [b.text for b in self.blocks(c) if b.text]
        self.open_comments = saved
        who = _attr(c, "author") or "an unnamed reviewer"
        when = _day(_attr(c, "date"))
        anchor = " ".join("".join(anchored).split())
        if len(anchor) > 200:
            anchor = anchor[:199].rstrip() + "…"
        head = f"Comment by {who}" + (f" ({when})" if when else "") + (f" on “{anchor}”" if anchor else "")
        para.after.append(Block(f"{head}: " + "\n".join(body), kind="comment"))

    def furniture_blocks(self) -> list[Block]:
        """Headers and footers once per document (each distinct text once), under a
        heading of their own so they never open or rename a clause."""
        seen: set[str] = set()
        texts: list[Block] = []
        for kind, root in self.furniture:
            for b in self.blocks(root):
                key = " ".join(b.text.split())
                if b.text and key not in seen and b.kind != "comment":
                    seen.add(key)
                    # "Header: CONFIDENTIAL": said what it is, and never read as a heading
                    texts.append(Block(b.text, kind="table") if b.kind == "table" else
                                 Block(f"{kind.capitalize()}: {b.text}"))
        return [Block("Headers and footers", kind="heading", level=1)] + texts if texts else []


def _root_of(part):
    from docx.oxml.parser import parse_xml

    el = getattr(part, "element", None)
    if el is not None:
        return el
    try:
        return parse_xml(part.blob)
    except Exception:  # an unreadable side part (notes, comments) must not cost the body
        return None


def _first_choice(alt):
    """Of an mc:AlternateContent, the content to read: its first mc:Choice (the fallback
    holds the same content for older readers), else the fallback."""
    choice = alt.find(f"{_MC}Choice")
    return choice if choice is not None else alt.find(f"{_MC}Fallback")


def _text_boxes(el) -> list:
    """The outermost w:txbxContent under `el`, reading only the first choice of each
    mc:AlternateContent on the way."""
    out = []

    def walk(node) -> None:
        for child in node:
            if child.tag == f"{_W}txbxContent":
                out.append(child)
            elif child.tag == f"{_MC}AlternateContent":
                choice = _first_choice(child)
                if choice is not None:
                    walk(choice)
            else:
                walk(child)

    walk([el])
    return out


def _children(el, tag: str) -> list:
    """Rows of a table or cells of a row, also those inside content controls and custom XML."""
    out = []
    for child in el:
        if child.tag == tag:
            out.append(child)
        elif child.tag == f"{_W}sdt":
            content = child.find(f"{_W}sdtContent")
            if content is not None:
                out.extend(_children(content, tag))
        elif child.tag in (f"{_W}customXml", f"{_W}ins", f"{_W}moveTo"):
            out.extend(_children(child, tag))
    return out


def _grid(pr, name: str) -> int:
    if pr is None:
        return 0
    el = pr.find(f"{_W}{name}")
    try:
        return int(_attr(el, "val")) if el is not None else 0
    except ValueError:
        return 0


def _heading_level(style: str) -> int | None:
    s = style.lower()
    if s == "title":
        return 1
    m = re.match(r"heading\s*(\d)", s)
    return int(m.group(1)) if m else None


def table_markdown(rows: list[list[str]]) -> str:
    """Markdown of a table given on its grid: one Markdown column per grid column, the
    first row as the header. Cells are told apart by their <w:tc> element, never by their
    text, so neighbouring cells that read the same stay two cells; a horizontally merged
    cell (w:gridSpan) is one cell with the columns it also covers empty; a vertically
    merged one shows its text in each row it covers, so a row stays self-contained when
    a big table is chunked by rows."""
    rows = [[" ".join(c.split()).replace("|", "\\|") for c in r] for r in rows]
    rows = [r for r in rows if any(c for c in r)]
    if not rows:
        return ""
    width = max(len(r) for r in rows)
    rows = [r + [""] * (width - len(r)) for r in rows]
    head, body = rows[0], rows[1:]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * width]
    lines += ["| " + " | ".join(r) + " |" for r in body]
    return "\n".join(lines)


def _deletion_context(b: Block) -> None:
    """A deletion's place: the accepted words just before and after it in its block."""
    for c in b.changes:
        if not c.in_text:
            c.before = b.text[max(0, c.start - 40):c.start]
            c.after = b.text[c.end:c.end + 40]


def _carry_empty(blocks: list[Block]) -> list[Block]:
    """Blocks left with no text (a paragraph wholly struck) hand their changes to the next
    block with text (or the last one), so the document still says what was struck."""
    out: list[Block] = []
    pending: list[TrackedChange] = []
    for b in blocks:
        if not b.text.strip():
            pending.extend(b.changes)
            continue
        if pending:
            for c in pending:
                c.start = c.end = 0
                c.before, c.after = "", b.text[:40]
            b.changes = pending + b.changes
            pending = []
        out.append(b)
    if pending and out:
        last = out[-1]
        for c in pending:
            c.start = c.end = len(last.text)
            c.before, c.after = last.text[-40:], ""
        last.changes = last.changes + pending
    return out


def load_docx(path: Path, *, max_inflated: int) -> list[Block]:
    """The blocks of a Word file, in reading order (see the module's docstring)."""
    try:
        with zipfile.ZipFile(path) as zf:
            names = zf.namelist()
            if "word/document.xml" not in names:
                raise DocumentError(str(path), "not a Word document: the zip has no word/document.xml")
            inflated = sum(i.file_size for i in zf.infolist())
            if inflated > max_inflated:
                raise DocumentError(
                    str(path),
                    f"refused: inflates to {inflated / 1e6:.0f} MB, over the limit of {max_inflated / 1e6:.0f} MB (possible zip bomb)",
                )
    except zipfile.BadZipFile as exc:
        raise DocumentError(str(path), f"corrupt DOCX: {exc}") from None

    import docx

    try:
        document = docx.Document(str(path))
        reader = _Reader(document, path)
        blocks = reader.blocks(document.element.body) + reader.furniture_blocks()
    except DocumentError:
        raise
    except Exception as exc:  # python-docx raises many types for bad XML/parts
        raise DocumentError(str(path), f"corrupt DOCX ({type(exc).__name__}: {str(exc)[:120]})") from None
    return _carry_empty(blocks)
