"""The clause comparison as a Word memo (`ragkit compare ... --format docx --out memo.docx`
and the web page's "Export Word"): the same Comparison `ragkit.compare.compare()` returns,
written with python-docx, showing what the Markdown and HTML memos show.

One landscape table, a header row repeated on every page: the clause (title and
question), a column per document (the label in bold with the model's confidence, the
quote, its page and section, how many of a free-text answer's claims hold, and any note
marked ⚠ on an amber cell), and the difference. The cost line closes the memo.
"""

from __future__ import annotations

import re
from datetime import date
from typing import IO

from ragkit.compare.report import Comparison, Finding, Row, claim_support, confidence_note, cost_line, missing
from ragkit.evidence.location import format_location

MEDIA_TYPE = "application/vnd.openxmlformats-officedocument.wordprocessingml.document"

# colours of the HTML memo: .warn #a40, tr.diff #fff4e5, td.nf #888
WARN = "AA4400"
WARN_FILL = "FFF4E5"
DIFF_FILL = "FDE9D9"
HEADER_FILL = "D9E2F3"
GREY = "6B6B6B"

# US Letter landscape, 0.5 in margins: 10 in of table
PAGE_W_IN, PAGE_H_IN, MARGIN_IN = 11.0, 8.5, 0.5
CLAUSE_IN, DIFF_IN = 1.7, 1.9
FONT = "Calibri"  # Word's own; LibreOffice substitutes Carlito (same metrics) or its sans


# what XML 1.0 cannot hold (python-docx refuses it with ValueError): the C0 controls but tab,
# newline and carriage return, lone surrogates, U+FFFE and U+FFFF. Ingest keeps a document's
# text as it is, so a quote can carry a PDF's form feed or a Word file's vertical tab.
_NOT_XML = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ud800-\udfff\ufffe\uffff]")


def _xml_text(text: str) -> str:
    """`text` as a Word document can hold it: a vertical tab or form feed (a line or page
    break in the source) becomes a space, any other character XML forbids is dropped."""
    return _NOT_XML.sub(lambda m: " " if m.group(0) in "\x0b\x0c" else "", text)


def _names(docs: list[str]) -> str:
    if len(docs) <= 2:
        return " and ".join(docs)
    return ", ".join(docs[:-1]) + " and " + docs[-1]


def _long_date(d: date) -> str:
    return f"{d.day} {d:%B %Y}"


def _shade(cell, fill: str) -> None:
    from docx.oxml import OxmlElement
    from docx.oxml.ns import qn

    shd = OxmlElement("w:shd")
    shd.set(qn("w:val"), "clear")
    shd.set(qn("w:color"), "auto")
    shd.set(qn("w:fill"), fill)
    cell._tc.get_or_add_tcPr().append(shd)  # before vAlign, which python-docx inserts in order


def _row_props(row, *, header: bool = False) -> None:
    """A row is kept on one page (a longer one still breaks); the header row repeats on each page."""
    from docx.oxml import OxmlElement
    from docx.oxml.ns import qn

    tr_pr = row._tr.get_or_add_trPr()
    for tag in ("w:cantSplit", "w:tblHeader") if header else ("w:cantSplit",):
        el = OxmlElement(tag)
        el.set(qn("w:val"), "true")
        tr_pr.append(el)


def _page_field(run) -> None:
    """A PAGE field in the run: Word and LibreOffice fill in the page number."""
    from docx.oxml import OxmlElement
    from docx.oxml.ns import qn

    for kind, text in (("begin", None), (None, "PAGE"), ("end", None)):
        if kind:
            el = OxmlElement("w:fldChar")
            el.set(qn("w:fldCharType"), kind)
        else:
            el = OxmlElement("w:instrText")
            el.set(qn("xml:space"), "preserve")
            el.text = text
        run._r.append(el)


def _para(cell, first: bool):
    """The cell's next paragraph (its first is there already), tight spacing."""
    from docx.shared import Pt

    p = cell.paragraphs[0] if first else cell.add_paragraph()
    p.paragraph_format.space_after = Pt(2)
    p.paragraph_format.space_before = Pt(0)
    return p


def _run(p, text: str, *, bold: bool = False, italic: bool = False, color: str | None = None, size: float | None = None):
    from docx.shared import Pt, RGBColor

    r = p.add_run(_xml_text(text))  # every text of the memo enters it here
    r.bold = bold or None
    r.italic = italic or None
    if color:
        r.font.color.rgb = RGBColor.from_string(color)
    if size:
        r.font.size = Pt(size)
    return r


def _note(cell, note: str) -> None:
    p = _para(cell, False)
    _run(p, "⚠ ", bold=True, color=WARN)
    _run(p, note, color=WARN, size=8)
    _shade(cell, WARN_FILL)


def _finding_cell(cell, f: Finding | None) -> None:
    """What the Markdown memo's cell says, one part per paragraph."""
    p = _para(cell, True)
    if f is None or not f.quote:
        text = missing(f)
        label, _, rest = text.partition(": ")
        _run(p, label, bold=True, color=GREY)
        _run(p, f": {rest}", color=GREY)
    else:
        uncertain = f.label == "Uncertain"
        if uncertain:
            _run(p, "⚠ ", bold=True, color=WARN)
        _run(p, f.label, bold=True, color=WARN if uncertain else None)
        _run(p, confidence_note(f))
        if f.label == "Not mentioned":
            _run(p, " (closest clause)", italic=True, color=GREY)
        _run(_para(cell, False), f"“{f.quote}”")
        loc = format_location(f.page, f.section)
        _run(_para(cell, False), f"({loc}){claim_support(f)}" if loc else claim_support(f).lstrip(" ·"), color=GREY, size=8)
        if uncertain and not f.note:
            _shade(cell, WARN_FILL)
    if f is not None and f.note:
        _note(cell, f.note)


def _difference_cell(cell, difference: str) -> None:
    p = _para(cell, True)
    if difference.startswith("uncertain"):
        _run(p, "⚠ ", bold=True, color=WARN)
        _run(p, difference, color=WARN)
        _shade(cell, WARN_FILL)
    elif difference.startswith("differs"):
        head, _, rest = difference.partition(":")
        _run(p, head, bold=True)
        _run(p, f":{rest}")
        _shade(cell, DIFF_FILL)
    else:
        _run(p, difference)


def to_docx(result: Comparison, path_or_stream: "str | IO[bytes]", *, checklist_name: str | None = None,
            today: date | None = None) -> None:
    """Write the comparison memo as a .docx to a path or a binary stream."""
    from docx import Document

    today = today or date.today()
    checklist_name = checklist_name or result.checklist
    doc = Document()
    section = _landscape_page(doc)
    _memo_styles(doc)
    title = f"Clause comparison: {_names(result.docs)}"
    _heading(doc, result, title, checklist_name, today)
    _page_footer(doc, section, f"{title} · {_long_date(today)} · page ")
    _comparison_table(doc, result)
    _cost_paragraph(doc, result)
    doc.save(path_or_stream)


def _landscape_page(doc):
    """The document's one section: US Letter landscape with MARGIN_IN margins (returned)."""
    from docx.enum.section import WD_ORIENT
    from docx.shared import Inches

    section = doc.sections[0]
    section.orientation = WD_ORIENT.LANDSCAPE
    section.page_width, section.page_height = Inches(PAGE_W_IN), Inches(PAGE_H_IN)
    for side in ("left_margin", "right_margin", "top_margin", "bottom_margin"):
        setattr(section, side, Inches(MARGIN_IN))
    return section


def _memo_styles(doc) -> None:
    """The Normal style (FONT at 9 pt, East Asian text too) and Heading 1 (15 pt, tight)."""
    from docx.oxml.ns import qn
    from docx.shared import Pt

    normal = doc.styles["Normal"]
    normal.font.name = FONT
    normal.element.get_or_add_rPr().get_or_add_rFonts().set(qn("w:eastAsia"), FONT)
    normal.font.size = Pt(9)
    h1 = doc.styles["Heading 1"]
    h1.font.name, h1.font.size = FONT, Pt(15)
    h1.paragraph_format.space_before, h1.paragraph_format.space_after = Pt(0), Pt(4)
    normal.paragraph_format.space_after = Pt(4)


def _heading(doc, result: Comparison, title: str, checklist_name: str, today: date) -> None:
    """The document's title and subject, the heading, the date and checklist line, and
    the line that tells the reader to read the quotes."""
    doc.core_properties.title = _xml_text(title)
    doc.core_properties.subject = _xml_text(f"checklist {checklist_name}")
    _run(doc.add_heading("", level=1), title)
    p = doc.add_paragraph()
    _run(p, _long_date(today), bold=True)
    _run(p, f" · Checklist: {checklist_name} · {len(result.rows)} item{'s' if len(result.rows) != 1 else ''}")
    _run(doc.add_paragraph(), "Each label comes with the quote it was decided on: read the quote. "
         "⚠ marks a note the reader must see.", italic=True, color=GREY)


def _page_footer(doc, section, text: str) -> None:
    """The section's footer, right-aligned: `text` and the page number."""
    from docx.enum.text import WD_ALIGN_PARAGRAPH
    from docx.shared import Pt, RGBColor

    footer = doc.styles["Footer"]  # the page number is a field: it takes the paragraph's style
    footer.font.size, footer.font.color.rgb = Pt(8), RGBColor.from_string(GREY)
    foot = section.footer.paragraphs[0]
    foot.style = footer
    foot.alignment = WD_ALIGN_PARAGRAPH.RIGHT
    _run(foot, text)
    _page_field(foot.add_run())


def _column_widths(n_docs: int) -> list:
    """The clause column, a column per document sharing what is left, the difference column."""
    from docx.shared import Inches

    usable = PAGE_W_IN - 2 * MARGIN_IN
    doc_in = (usable - CLAUSE_IN - DIFF_IN) / max(n_docs, 1)
    return [Inches(CLAUSE_IN)] + [Inches(doc_in)] * n_docs + [Inches(DIFF_IN)]


def _comparison_table(doc, result: Comparison) -> None:
    """The table: a header row repeated on every page, then a row per checklist item."""
    from docx.enum.table import WD_TABLE_ALIGNMENT

    widths = _column_widths(len(result.docs))
    table = doc.add_table(rows=1, cols=len(result.docs) + 2)
    table.style = "Table Grid"
    table.alignment = WD_TABLE_ALIGNMENT.CENTER
    table.autofit = False
    for col, w in zip(table.columns, widths):
        col.width = w
    header = table.rows[0]
    _row_props(header, header=True)
    _cell_widths(header, widths)
    for cell, text in zip(header.cells, ["Clause", *result.docs, "Difference"]):
        _run(_para(cell, True), text, bold=True)
        _shade(cell, HEADER_FILL)
    for r in result.rows:
        _item_row(table.add_row(), r, result.docs, widths)


def _cell_widths(row, widths: list) -> None:
    for cell, w in zip(row.cells, widths):
        cell.width = w


def _item_row(row, item_row: Row, docs: list[str], widths: list) -> None:
    """One checklist item's row: the clause (title and question), its finding in each
    document, the difference; every cell aligned to the top."""
    from docx.enum.table import WD_CELL_VERTICAL_ALIGNMENT

    _row_props(row)
    _cell_widths(row, widths)
    cells = row.cells
    _run(_para(cells[0], True), item_row.item.title, bold=True)
    _run(_para(cells[0], False), item_row.item.question, color=GREY, size=8)
    for cell, d in zip(cells[1:-1], docs):
        _finding_cell(cell, item_row.findings.get(d))
    _difference_cell(cells[-1], item_row.difference)
    for cell in cells:
        cell.vertical_alignment = WD_CELL_VERTICAL_ALIGNMENT.TOP


def _cost_paragraph(doc, result: Comparison) -> None:
    """The cost line that closes the memo."""
    from docx.shared import Pt

    p = doc.add_paragraph()
    p.paragraph_format.space_before = Pt(8)
    _run(p, cost_line(result), color=GREY, size=8)
