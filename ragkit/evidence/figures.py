"""Figures in text: numbers, amounts, percentages, periods and dates, read the same way by
the claims check (ragkit.answer.claims), compare's notes and the eval metrics.

    from ragkit.evidence.figures import unsupported_figures, periods, extract_numbers
    unsupported_figures("It lasts 24 months.", "for a period of two (2) years")   # []
    periods("one hundred eighty (180) days")                                      # {(180.0, "day")}

Spelled numbers are read by text2num (`alpha2digit`, a maintained parser on PyPI), not by
a word list: "twenty-four (24) months" is 24 months, "one hundred eighty days" 180 days,
"sixteenth day" the 16th, "thirty percent" 30%, "five million dollars" 5,000,000. Periods
compare across units where the conversion is exact (24 months = two years, 14 days = two
weeks) and never where it is not (180 days is not six months: a contract's months are not
30 days).
"""

from __future__ import annotations

import math
import re
import unicodedata
from dataclasses import dataclass
from functools import lru_cache

# typographic quotes and dashes as ASCII, soft hyphens and zero-width marks dropped: the
# figures and the eval metrics read text through the same table
QUOTES = str.maketrans({
    "\u2018": "'", "\u2019": "'", "\u201a": "'", "\u201b": "'", "\u2032": "'", "\u00b4": "'", "`": "'",
    "\u201c": '"', "\u201d": '"', "\u201e": '"', "\u201f": '"', "\u2033": '"', "\u00ab": '"', "\u00bb": '"',
    "\u2010": "-", "\u2011": "-", "\u2012": "-", "\u2013": "-", "\u2014": "-", "\u2015": "-", "\u2212": "-",
    "\u00ad": None, "\u200b": None, "\u2060": None, "\ufeff": None,
})

# ---------------------------------------------------------------------- spelled numbers


_ABBR = {"thousand": "k", "million": "mn", "billion": "bn", "trillion": "tn"}


@lru_cache(maxsize=8192)
def digits(text: str, threshold: float = 3.0) -> str:
    """`text` with its spelled numbers written as digits (text2num's `alpha2digit`):
    "twenty-four (24) months" -> "24 (24) months", "sixteenth" -> "16th". A number on its
    own at or below `threshold` stays a word (default 3: "one of the parties" is no
    figure); 0 converts every one (for periods: "one (1) year")."""
    from text_to_num import alpha2digit

    t = unicodedata.normalize("NFKC", text).translate(QUOTES)
    # "a one-year term", "24-month period": the unit is a word of its own for the parser and the period rule
    t = re.sub(r"(?<=\w)-(?=(?:year|month|week|day|hour)s?\b)", " ", t, flags=re.I)
    # "$1.2 million": a scale after digits is kept as the abbreviation extract_numbers reads
    # (the parser would write the word as a number of its own: "1.2 1000000")
    t = re.sub(r"(?<=\d)\s*(thousand|million|billion|trillion)s?\b", lambda m: " " + _ABBR[m.group(1).lower()], t,
               flags=re.I)
    try:
        return alpha2digit(t, "en", threshold=threshold)
    except Exception:  # the parser never stops a check: the text as it is
        return t


# ---------------------------------------------------------------------- numbers

_SCALE = {
    "thousand": 1e3, "thousands": 1e3, "k": 1e3,
    "million": 1e6, "millions": 1e6, "mn": 1e6, "m": 1e6, "mm": 1e6,
    "billion": 1e9, "billions": 1e9, "bn": 1e9, "b": 1e9,
    "trillion": 1e12, "trillions": 1e12, "tn": 1e12,
}
# a minus sign is one written against its number ("-5", "-$5"): "- 5" is a list's dash, and a
# dash after a number ("$5,000 - $10,000", "5 -10") joins a range (extract_numbers)
_NUM = re.compile(
    r"(?:(?<![\w.,)])(?P<neg>-|\u2212)(?=[($€£¥]|\.?\d))?\s*(?P<paren>\()?\s*(?:(?P<cur>[$€£¥])\s*(?P<neg2>-)?)?"
    r"(?P<num>\d{1,3}(?:,\d{3})+(?:\.\d+)?|\d+(?:\.\d+)?|\.\d+)"
    r"(?P<close>\))?"
    r"(?:\s*(?P<pct>%|percent\b|per cent\b|pct\b)|\s*(?P<scale>thousands?|millions?|billions?|trillions?|mn|bn|tn|mm|[kmb])\b)?"
    r"(?P<close2>\))?",
    re.I,
)
# scales that are a unit as often as a scale ("5 m" metres or minutes, "300 mm", "section 524B",
# "4K"): read as one only after a currency ("$5m", "€2.5 m", "$10k", "$5mm")
_AMBIGUOUS_SCALE = {"k", "m", "b", "mm"}


@dataclass(frozen=True)
class Quantity:
    value: float
    percent: bool = False


def written_numbers(text: str | None) -> list[tuple[str, Quantity]]:
    """`extract_numbers` with each number as written ("$ 8,500", "4.7%")."""
    if not text:
        return []
    t = unicodedata.normalize("NFKC", text).translate(QUOTES)
    ms = list(_NUM.finditer(t))
    return [(m.group(0).strip(), q) for m, q in zip(ms, _quantities(t, ms)) if q is not None]


def extract_numbers(text: str | None) -> list[Quantity]:
    """Numbers with their scale and sign: "$1.2 billion" -> 1.2e9, "1,200 million" -> 1.2e9,
    "$5m" -> 5e6 (but "5 m" -> 5: a one-letter scale needs a currency), "(1,234)" -> -1234,
    "-5" -> -5 (but "$5,000 - $10,000" -> 5000 and 10000: a range), "12.5%" -> 12.5
    (percent). Years and section numbers come out as plain numbers too; callers compare sets of quantities. Digits only: pass the text
    through `digits` first to read spelled numbers."""
    if not text:
        return []
    t = unicodedata.normalize("NFKC", text).translate(QUOTES)
    return [q for q in _quantities(t, list(_NUM.finditer(t))) if q is not None]


def _quantities(t: str, matches: list) -> list[Quantity | None]:
    """The quantity of each match of _NUM in `t` (None where its digits do not read)."""
    out: list[Quantity | None] = []
    prev_end = None
    for m in matches:
        try:
            v = float(m.group("num").replace(",", ""))
        except ValueError:
            out.append(None)
            continue
        scale = (m.group("scale") or "").lower()
        if scale and (m.group("cur") or scale not in _AMBIGUOUS_SCALE):
            v *= _SCALE[scale]
        closed = bool(m.group("close") or m.group("close2"))
        # a dash right after the number before it is a range's ("$5,000 - $10,000", "5% -10%")
        neg = bool(m.group("neg")) and not (prev_end is not None and not t[prev_end : m.start("neg")].strip())
        prev_end = m.end()
        if neg or m.group("neg2") or (m.group("paren") and closed):
            v = -v
        out.append(Quantity(v, percent=bool(m.group("pct"))))
    return out


def same_number(a: Quantity, b: Quantity, rel_tol: float = 5e-3) -> bool:
    if a.percent != b.percent:
        return False
    return math.isclose(a.value, b.value, rel_tol=rel_tol, abs_tol=1e-9)


# ---------------------------------------------------------------------- periods

# Where a period is, in the text as written: a number (digits, or number words, which only
# locate it: text2num reads it), its digits in brackets ("two (2)"), a range ("30 to 60",
# "thirty (30) and sixty (60)"), a qualifier ("calendar", "business"), the unit.
_NUMWORD = (r"(?:zero|one|two|three|four|five|six|seven|eight|nine|ten|eleven|twelve|thirteen|fourteen|fifteen|sixteen|"
            r"seventeen|eighteen|nineteen|twenty|thirty|forty|fifty|sixty|seventy|eighty|ninety|hundred|thousand)")
_AMOUNT = rf"(?:\d+(?:\.\d+)?|{_NUMWORD}(?:(?:[\s-]+|\s+and\s+){_NUMWORD})*)(?:\s*\(\s*\d+(?:\.\d+)?\s*\))?"
_SPAN = re.compile(
    rf"\b{_AMOUNT}(?:\s*(?:-|to|and|or|through)\s*{_AMOUNT})?[\s-]*"
    r"(?:calendar\s+|business\s+|working\s+|consecutive\s+|full\s+)?(?:year|month|week|day|hour|minute)s?\b", re.I)
# the same span once `digits` has read it
_READ = re.compile(r"(?P<a>\d+(?:\.\d+)?)(?:\s*\(\s*\d+(?:\.\d+)?\s*\))?(?:\s*(?:-|to|and|or|through)\s*"
                   r"(?P<b>\d+(?:\.\d+)?)(?:\s*\(\s*\d+(?:\.\d+)?\s*\))?)?[\s-]*(?:[a-z]+\s+)?"
                   r"(?P<u>year|month|week|day|hour|minute)s?\b", re.I)
# exact conversions only: a year is 12 months and a week 7 days, but a month is no fixed number of days
_UNIT = {"year": ("month", 12.0), "month": ("month", 1.0), "week": ("day", 7.0), "day": ("day", 1.0),
         "hour": ("minute", 60.0), "minute": ("minute", 1.0)}


def _read_period(span: str) -> set[tuple[float, str]]:
    m = _READ.search(digits(span, 0))
    if not m:
        return set()
    base, k = _UNIT[m.group("u").lower()]
    return {(round(float(m.group(g)) * k, 6), base) for g in ("a", "b") if m.group(g)}


def periods(text: str) -> set[tuple[float, str]]:
    """Every period of the text in its base unit: (value, "month" | "day" | "minute").
    "two (2) years" -> {(24, "month")}; "30 to 60 days" -> {(30, "day"), (60, "day")}."""
    out: set[tuple[float, str]] = set()
    for m in _SPAN.finditer(unicodedata.normalize("NFKC", text).translate(QUOTES)):
        out |= _read_period(m.group(0))
    return out


# ---------------------------------------------------------------------- dates

_MONTHS = ("january", "february", "march", "april", "may", "june", "july", "august", "september", "october",
           "november", "december")
_MONTH = re.compile(r"\b(" + "|".join(_MONTHS) + r")\s+\d{1,2}\b|\b\d{1,2}(?:st|nd|rd|th)?\s+(?:of\s+)?("
                    + "|".join(_MONTHS) + r")\b", re.I)


def _months(text: str) -> set[str]:
    named = {(m.group(1) or m.group(2)).lower() for m in _MONTH.finditer(text)}
    # a month named anywhere in the source ("May" aside: it is a verb)
    return named | {w.lower() for w in re.findall(r"[A-Za-z]+", text) if w.lower() in _MONTHS and w.lower() != "may"}


# ---------------------------------------------------------------------- the check

# a statement's own scale ("(In millions, except per share amounts)", "Amounts in thousands"):
# its "411" is the answer's "$411 million"
_IN_SCALE = re.compile(r"\bin\s+(thousands|millions|billions)\b", re.I)


def figure_name(q: Quantity) -> str:
    """A number as unsupported_figures names it ("4.7%", "4.11e+08")."""
    return f"{q.value:g}{'%' if q.percent else ''}"


def held_numbers(source: str) -> list[Quantity]:
    """The quantities a source holds: its numbers as written and, where it states its scale
    ("in millions"), each amount at that scale too."""
    have = extract_numbers(digits(source))
    scales = {_SCALE[m.group(1).lower()] for m in _IN_SCALE.finditer(source)}
    return have + [Quantity(q.value * k) for k in sorted(scales) for q in have if not q.percent]


_MARKS = re.compile(r"\s*\[(\d+(?:\s*[,;–-]\s*\d+)*)\]")


def unsupported_figures(claim: str, source) -> list[str]:
    """Figures of `claim` that `source` (a text, or sources with `.text`) does not hold: a
    period must occur with its unit, in any unit it converts to exactly ("1 year" is not
    supported by a section numbered 1, "three (3) years" supports "3 years", "24 months"
    supports "two years", "180 days" does not support "six months"); a date's month must
    occur with it; other numbers, ordinals, amounts and percentages must occur as the
    same quantity ("$1.2 billion" = "1,200 million", "16th" = "sixteenth", "30%" =
    "thirty percent"; "$411 million" = "411" in a statement that says "in millions"). [n]
    markers are not figures. This is the one check ask, chat,
    compare and serve use: a small model fills a blank the contract leaves to its cover
    page with a plausible period, and a reader must not take that for the contract's."""
    if not isinstance(source, str):
        source = " ".join(c.text for c in source)
    text = unicodedata.normalize("NFKC", _MARKS.sub(" ", claim)).translate(QUOTES)
    have_periods = periods(source)
    bad = [m.group(0) for m in _SPAN.finditer(text) if _read_period(m.group(0)) - have_periods]
    have_months = _months(source)
    bad += [m.group(0) for m in _MONTH.finditer(text) if (m.group(1) or m.group(2)).lower() not in have_months]
    # the other numbers (spelled ones above three: "one of the parties" is no figure)
    have = held_numbers(source)
    for q in extract_numbers(digits(_SPAN.sub(" ", text))):
        if not any(same_number(q, h) for h in have):
            bad.append(figure_name(q))
    return list(dict.fromkeys(bad))


# ---------------------------------------------------------------------- cells and computed figures

@dataclass(frozen=True)
class Cell:
    """A figure as a source writes it and what names it: a table cell's row label and column
    header ("Total restructuring charges · 2022"), empty for a figure in running text."""

    written: str
    value: Quantity
    label: str = ""
    at: tuple[int, int, int] | None = None  # (table, row, column) in its source; None in running text

    def shown(self) -> str:
        return f"{self.written} ({self.label})" if self.label else self.written


_TABLE_ROW = re.compile(r"^\s*\|(.*)\|\s*$")
_RULE = re.compile(r":?-{3,}:?")


def table_rows(text: str) -> list[list[str]]:
    """The rows of the Markdown tables in `text`, each a list of its cells (stripped), the
    header rows included and the |---| rules left out: what reads a table by its row labels
    (a row's first cell) and column headings."""
    rows = []
    for line in text.splitlines():
        m = _TABLE_ROW.match(line)
        if m:
            cells = [p.strip() for p in m.group(1).split("|")]
            if not all(_RULE.fullmatch(c) or not c for c in cells):
                rows.append(cells)
    return rows


def table_cells(text: str) -> list[Cell]:
    """The numeric cells of the Markdown tables in `text` (ingest writes a table as a header
    row, a |---| rule and its rows), each named by its row's first cell and its column's
    header. A cell holding more or less than one number is none."""
    out: list[Cell] = []
    block: list[list[str]] = []
    tables = 0
    for line in [*text.splitlines(), ""]:
        m = _TABLE_ROW.match(line)
        if m:
            block.append([p.strip() for p in m.group(1).split("|")])
            continue
        if block:
            header: list[str] = []
            rows = block
            if len(block) > 1 and all(_RULE.fullmatch(p) for p in block[1] if p):
                header, rows = block[0], block[2:]
            for i, row in enumerate(rows):
                for j, cell in enumerate(row[1:], 1):
                    nums = written_numbers(cell)
                    if len(nums) == 1:
                        col = header[j] if j < len(header) else ""
                        out.append(Cell(cell, nums[0][1], " · ".join(x for x in (row[0], col) if x), (tables, i, j)))
            block = []
            tables += 1
    return out


@dataclass(frozen=True)
class Computation:
    """A figure of an answer that no source holds, given by one computation of two figures
    the sources hold: `formula` ("411 / 8,745 x 100 = 4.7%") and the cells it used."""

    figure: str
    formula: str
    cells: tuple[Cell, ...]
    quantity: Quantity  # the figure as read (figure_name names it as unsupported_figures does)

    def to_json(self) -> dict:
        return {"figure": self.figure, "formula": self.formula,
                "cells": [{"written": c.written, "label": c.label} for c in self.cells]}


def _decimals(written: str) -> int:
    m = re.search(r"\d(?:[\d,]*)\.(\d+)", written)
    return len(m.group(1)) if m else 0


def _is_year(w: str, q: Quantity) -> bool:
    return not q.percent and float(q.value).is_integer() and 1900 <= q.value <= 2100 and not re.search(r"[$€£¥]", w)


def _computations(target: Quantity, written: str, operands: list[Cell], *, by_table: bool = False) -> list[Computation]:
    """Every computation of two operands that gives `target` at the precision it is
    written with ("4.7%": within 0.05): a share or ratio a / b, a change (a - b) / b, a
    difference a - b, a sum a + b; a percentage as a share or change x 100. `by_table`
    (operands the claim does not name, read from the sources' tables): a share, a
    difference or a sum of two cells of one column (one period), a change of two cells of
    one row (one line item): any two cells of a table give some percentage by chance."""
    tol = 0.5 * 10 ** -_decimals(written) + 1e-9
    found: dict[tuple, Computation] = {}
    pct = " x 100" if target.percent else ""
    for a in operands:
        for b in operands:
            if a is b or a.value.percent or b.value.percent:
                continue
            col = row = True
            if by_table:
                if a.at is None or b.at is None or a.at[0] != b.at[0]:
                    continue
                col, row = a.at[2] == b.at[2], a.at[1] == b.at[1]
            x, y = a.value.value, b.value.value
            tries = []
            k = 100.0 if target.percent else 1.0
            if y and col:
                tries.append(("share", x / y * k, f"{a.written} / {b.written}{pct}"))
            if y and row:
                # a change's sign is in the claim's words ("fell 5.5%"): its size is compared
                tries.append(("change", abs(x - y) / abs(y) * k, f"({a.written} - {b.written}) / {b.written}{pct}"))
            if not target.percent and col:
                tries += [("difference", x - y, f"{a.written} - {b.written}"), ("sum", x + y, f"{a.written} + {b.written}")]
            for op, value, formula in tries:
                if abs(value - target.value) <= tol:
                    # b + a is a + b: one computation, not two
                    key = (op, *sorted((x, y))) if op == "sum" else (op, x, y)
                    found.setdefault(key, Computation(written, f"{formula} = {written}", (a, b), target))
    return list(found.values())


def computed_figures(claim: str, sources: list[str]) -> list[Computation]:
    """The figures of `claim` that no source holds but one computation gives from figures
    the sources do hold (a ratio, a margin, a change, a difference), each with its formula
    and its cells, named by their table row and column where a table holds them.
    The operands are the claim's own figures that the sources hold ("capital expenditure of
    $1,577 million ... 4.9% of revenue of $32,184 million"), else the numeric cells of the
    sources' tables, two of one column or of one row. Where two computations give it, the
    one whose cells' row labels and column headers the claim names most ("operating",
    "December 31, 2022"); where that leaves two, the figure is left unexplained: a guess is
    no evidence."""
    text = unicodedata.normalize("NFKC", _MARKS.sub(" ", claim)).translate(QUOTES)
    words = {v: k for k, v in _ABBR.items()}  # digits() writes "$411 million" as "$411 mn": shown as written
    figs = [(re.sub(r"\b(k|mn|bn|tn)$", lambda m: words[m.group(1)], w), q)
            for w, q in written_numbers(digits(_SPAN.sub(" ", text))) if not _is_year(w, q)]
    if not figs:
        return []
    have = [q for src in sources for q in held_numbers(src)]
    missing = [(w, q) for w, q in figs if not any(same_number(q, h) for h in have)]
    if not missing:
        return []
    cells = [c for src in sources for c in table_cells(src)]

    def named(w: str, q: Quantity) -> Cell:  # the claim's figure as the source's cell that holds it
        return next((c for c in cells if same_number(q, c.value)), Cell(w, q))

    held = [named(w, q) for w, q in figs if (w, q) not in missing]
    out = []
    for w, q in missing:
        found = _computations(q, w, held) if len(held) >= 2 else []
        if not found:
            found = _computations(q, w, [c for c in cells if not _is_year(c.written, c.value)], by_table=True)
        if len(found) > 1:  # the one whose cells' rows and columns the claim names most, if one does
            words = _label_words(text)
            score = [len(words & _label_words(" ".join(c.label for c in f.cells))) for f in found]
            found = [f for f, k in zip(found, score) if k == max(score)]
        if len(found) == 1:
            out.append(found[0])
    return out


def _label_words(text: str) -> set[str]:
    return {w for w in re.findall(r"[a-z0-9]+", text.lower()) if len(w) >= 3 or w.isdigit()}


__all__ = ["Cell", "Computation", "QUOTES", "Quantity", "computed_figures", "digits", "extract_numbers", "figure_name", "held_numbers", "periods",
           "same_number",
           "table_cells", "unsupported_figures", "written_numbers"]

