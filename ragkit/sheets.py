"""Spreadsheets a reviewer opens: CSV (UTF-8 with a byte-order mark, which Excel needs to read
it as UTF-8) and xlsx (openpyxl), for the evaluation's rows and a review's matrix.

A document's text can be hostile: a cell whose text starts with = + - @ (or a tab or
carriage return) is a formula to a spreadsheet. In the CSV such a cell gets a leading
apostrophe; in the xlsx it is written as a string (never a formula) and keeps its quote
prefix when edited. Characters XML forbids (a PDF's control characters, U+FFFE/U+FFFF, lone
surrogates) are dropped, and a cell is cut at Excel's 32,767 characters.
"""

from __future__ import annotations

import csv
import re
from dataclasses import dataclass, field
from pathlib import Path

FORMULA_START = ("=", "+", "-", "@", "\t", "\r")
XLSX_CELL_MAX = 32767  # Excel's limit on the characters of one cell
_NOT_XML = re.compile("[\ud800-\udfff\ufffe\uffff]")


def xlsx_available() -> bool:
    try:
        import openpyxl  # noqa: F401
    except ImportError:
        return False
    return True


def is_hostile(v) -> bool:
    return isinstance(v, str) and v.startswith(FORMULA_START)


def _csv_value(v):
    if v is None:
        return ""
    if is_hostile(v):
        return "'" + v
    return v


def write_csv(path: Path, columns: list[str], rows: list[dict]) -> None:
    with open(path, "w", encoding="utf-8-sig", newline="") as f:
        w = csv.writer(f)
        w.writerow([_csv_value(c) for c in columns])
        for r in rows:
            w.writerow([_csv_value(r.get(c)) for c in columns])


@dataclass
class Sheet:
    title: str
    columns: list[str]
    rows: list[dict]
    widths: dict[str, float] = field(default_factory=dict)  # column -> width in characters (else fitted, at most 30)
    wrap: set[str] = field(default_factory=set)  # columns of long text: wrapped
    freeze: str = "B2"  # the header row and the first column stay in view
    number_format: str = "0.000"


def fitted_width(col: str, rows: list[dict]) -> float:
    """A column as wide as its name or its longest value (of the first 500 rows), at most 30."""
    longest = max([len(str(r.get(col))) for r in rows[:500] if r.get(col) is not None] + [0])
    return min(max(len(col), longest) + 2, 30)


def write_workbook(path: Path, sheets: list[Sheet]) -> None:
    """Every sheet with a bold header row, frozen panes, filters on every column, and the
    column widths given (else fitted to the text, at most 30 characters)."""
    from openpyxl import Workbook
    from openpyxl.cell.cell import ILLEGAL_CHARACTERS_RE
    from openpyxl.styles import Alignment, Font
    from openpyxl.utils import get_column_letter

    wb = Workbook()
    bold = Font(bold=True)
    top = Alignment(vertical="top")
    wrap = Alignment(vertical="top", wrap_text=True)
    for n, sh in enumerate(sheets):
        ws = wb.active if n == 0 else wb.create_sheet()
        ws.title = sh.title[:31]
        wrapped = {i for i, c in enumerate(sh.columns, 1) if c in sh.wrap}

        def put(r: int, c: int, v, ws=ws, sh=sh, wrapped=wrapped) -> None:
            cell = ws.cell(row=r, column=c)
            if isinstance(v, str):
                v = _NOT_XML.sub("", ILLEGAL_CHARACTERS_RE.sub("", v))[:XLSX_CELL_MAX]
                cell.value = v
                cell.data_type = "s"  # text, never a formula, whatever it starts with
                if is_hostile(v):
                    cell.quotePrefix = True  # stays text when the cell is edited
            else:
                cell.value = v
                if isinstance(v, float):
                    cell.number_format = sh.number_format
            cell.alignment = wrap if c in wrapped else top

        for c, name in enumerate(sh.columns, 1):
            put(1, c, name)
            ws.cell(row=1, column=c).font = bold
        for r, row in enumerate(sh.rows, 2):
            for c, name in enumerate(sh.columns, 1):
                v = row.get(name)
                if v is not None:
                    put(r, c, v)
        for c, name in enumerate(sh.columns, 1):
            ws.column_dimensions[get_column_letter(c)].width = sh.widths.get(name) or fitted_width(name, sh.rows)
        ws.freeze_panes = sh.freeze
        ws.auto_filter.ref = f"A1:{get_column_letter(max(1, len(sh.columns)))}{len(sh.rows) + 1}"
    wb.save(path)
