"""Figures in text: numbers, amounts, percentages, periods and dates, read the same way by
the claims check (ragkit.answer.claims), compare's notes and the eval metrics.

    from ragkit.answer.numbers import unsupported_figures, periods, extract_numbers
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

_QUOTES = str.maketrans({
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

    t = unicodedata.normalize("NFKC", text).translate(_QUOTES)
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


def extract_numbers(text: str | None) -> list[Quantity]:
    """Numbers with their scale and sign: "$1.2 billion" -> 1.2e9, "1,200 million" -> 1.2e9,
    "$5m" -> 5e6 (but "5 m" -> 5: a one-letter scale needs a currency), "(1,234)" -> -1234,
    "-5" -> -5 (but "$5,000 - $10,000" -> 5000 and 10000: a range), "12.5%" -> 12.5
    (percent). Years and section numbers come out as plain numbers too; callers compare sets of quantities. Digits only: pass the text
    through `digits` first to read spelled numbers."""
    if not text:
        return []
    t = unicodedata.normalize("NFKC", text).translate(_QUOTES)
    out: list[Quantity] = []
    prev_end = None
    for m in _NUM.finditer(t):
        try:
            v = float(m.group("num").replace(",", ""))
        except ValueError:
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
    for m in _SPAN.finditer(unicodedata.normalize("NFKC", text).translate(_QUOTES)):
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

_MARKS = re.compile(r"\s*\[(\d+(?:\s*[,;–-]\s*\d+)*)\]")


def unsupported_figures(claim: str, source) -> list[str]:
    """Figures of `claim` that `source` (a text, or sources with `.text`) does not hold: a
    period must occur with its unit, in any unit it converts to exactly ("1 year" is not
    supported by a section numbered 1, "three (3) years" supports "3 years", "24 months"
    supports "two years", "180 days" does not support "six months"); a date's month must
    occur with it; other numbers, ordinals, amounts and percentages must occur as the
    same quantity ("$1.2 billion" = "1,200 million", "16th" = "sixteenth", "30%" =
    "thirty percent"). [n] markers are not figures. This is the one check ask, chat,
    compare and serve use: a small model fills a blank the contract leaves to its cover
    page with a plausible period, and a reader must not take that for the contract's."""
    if not isinstance(source, str):
        source = " ".join(c.text for c in source)
    text = unicodedata.normalize("NFKC", _MARKS.sub(" ", claim)).translate(_QUOTES)
    have_periods = periods(source)
    bad = [m.group(0) for m in _SPAN.finditer(text) if _read_period(m.group(0)) - have_periods]
    have_months = _months(source)
    bad += [m.group(0) for m in _MONTH.finditer(text) if (m.group(1) or m.group(2)).lower() not in have_months]
    # the other numbers (spelled ones above three: "one of the parties" is no figure)
    have = extract_numbers(digits(source))
    for q in extract_numbers(digits(_SPAN.sub(" ", text))):
        if not any(same_number(q, h) for h in have):
            bad.append(f"{q.value:g}{'%' if q.percent else ''}")
    return list(dict.fromkeys(bad))


__all__ = ["Quantity", "digits", "extract_numbers", "periods", "same_number", "unsupported_figures"]

