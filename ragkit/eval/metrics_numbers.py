"""Evaluation metrics on figures (ragkit.eval.metrics re-exports them): do the gold
answer's numbers occur in a prediction or in the retrieved contexts. The number reader is
the pipeline's (ragkit.evidence.figures): the claims check and the metrics read figures
the same way."""

from __future__ import annotations

import math
from typing import Sequence

from ragkit.evidence.figures import Quantity, extract_numbers, same_number


def numeric_match(gold: str, pred: str, rel_tol: float = 5e-3) -> bool | None:
    """Every number of the gold text occurs in the prediction (same value after scale
    and sign, within a relative tolerance for rounding: "$1.2 billion" == "1,200 million"
    == "$1,200,000,000"). None when the gold text has no number."""
    g = extract_numbers(gold)
    if not g:
        return None
    p = extract_numbers(pred)
    return all(any(same_number(x, y, rel_tol) for y in p) for x in g)


def _informative(q: Quantity) -> bool:
    v = abs(q.value)
    if q.percent:
        return True
    if v == int(v) and (v < 10 or 1900 <= v <= 2100):  # counts, quarters, years
        return False
    return True


def _same_up_to_scale(a: Quantity, b: Quantity, rel_tol: float = 5e-3) -> bool:
    if a.percent != b.percent:
        return False
    for f in (1.0, 1e3, 1e6, 1e9, 1e-3, 1e-6, 1e-9):
        if math.isclose(abs(a.value), abs(b.value) * f, rel_tol=rel_tol):
            return True
    return False


def answer_numbers_in_context(golds: Sequence[str], contexts: Sequence[str]) -> float | None:
    """A retrieval proxy for sets without evidence quotes (SEC 10-Q): the share of the
    gold answer's figures that occur in the retrieved context. Figures are compared by
    absolute value up to a factor of 1e3/1e6/1e9, because a filing's table says "82,959"
    under "(in millions)" where the answer says "$82,959 million"; years 1900-2100 and
    integers below 10 are skipped. None when the gold answer states no such figure."""
    gold = [q for g in golds for q in extract_numbers(g) if _informative(q)]
    gold = list(dict.fromkeys(gold))
    if not gold:
        return None
    have = [q for c in contexts for q in extract_numbers(c)]
    return sum(any(_same_up_to_scale(g, h) for h in have) for g in gold) / len(gold)


def gold_figure_in(golds: Sequence[str], contexts: Sequence[str]) -> bool | None:
    """At least one of the gold answer's figures (as `answer_numbers_in_context` counts
    them) occurs in the contexts. None when the gold answer states no such figure."""
    share = answer_numbers_in_context(golds, contexts)
    return None if share is None else share > 0
