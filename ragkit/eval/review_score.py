"""A data-room review scored as CUAD scores it (Hendrycks et al., NeurIPS 2021, its
`evaluate.py`): each finding is matched to the gold clauses of its contract and kind (a
match: word Jaccard at least 0.5 after CUAD's normalisation; for Parties, also a gold name
the finding holds whole), and over every threshold on the findings' scores:

- a gold clause is found when some finding at or over the threshold matches it (tp), else
  missed (fn); a finding that matches no gold clause of its cell is a false positive (fp);
- precision tp / (tp + fp), recall tp / (tp + fn), over all contracts and kinds together;
- AUPR: the area under that curve, precision made non-increasing in recall as CUAD does
  (the curve ends at the recall the findings reach: a gold clause no finding matches
  lowers it), and precision at 80% and 90% recall (0 when never reached).

Written here rather than taken from scikit-learn: its precision-recall curve counts one
label per prediction and assumes every positive is predicted, where CUAD's counts gold
clauses no finding reaches and findings that match nothing separately.

Also: per kind, the share of its gold clauses some finding matches at the threshold that
reaches 80% recall, and the share of empty gold cells (a kind the contract lacks) left
empty at that threshold.
"""

from __future__ import annotations

import ast
import csv
import json
import re
import string
from dataclasses import dataclass
from pathlib import Path

IOU = 0.5  # CUAD's match rule: word Jaccard at least this
_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCT = str.maketrans("", "", string.punctuation)


def normalize(text: str) -> str:
    """CUAD's (SQuAD's) normalisation: lower case, no punctuation, no articles, single spaces."""
    return " ".join(_ARTICLES.sub(" ", text.lower().translate(_PUNCT)).split())


def jaccard(a: str, b: str) -> float:
    x, y = set(normalize(a).split()), set(normalize(b).split())
    return len(x & y) / len(x | y) if x | y else 0.0


def slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")


def matches(finding: str, gold: str, kind: str) -> bool:
    if kind == "parties" and normalize(gold) and normalize(gold) in normalize(finding):
        return True
    return jaccard(finding, gold) >= IOU


# ---------------------------------------------------------------------- gold

def gold_from_cuad_qa(path: Path) -> dict[tuple[str, str], list[str]]:
    """(contract file name, kind slug) -> gold clauses, from cuad-10's cuad_qa.jsonl (one line
    per contract and category; an empty list where the contract lacks the kind)."""
    out: dict[tuple[str, str], list[str]] = {}
    for line in Path(path).read_text(encoding="utf-8").splitlines():
        if line.strip():
            r = json.loads(line)
            out[(Path(r["contract_pdf"]).name, slug(r["master_clauses_column"]))] = [g for g in r["gold_clauses"] if g.strip()]
    return out


def gold_from_master_clauses(path: Path, files: set[str] | None = None) -> dict[tuple[str, str], list[str]]:
    """(txt file name, kind slug) -> gold clauses, from CUAD's master_clauses.csv with a
    txt_file column (../shared/corpora/cuad-train), for the `files` named (all without)."""
    csv.field_size_limit(1 << 30)
    out: dict[tuple[str, str], list[str]] = {}
    with open(path, encoding="utf-8", newline="") as f:
        for row in csv.DictReader(f):
            name = row["txt_file"]
            if files is not None and name not in files:
                continue
            for col, cell in row.items():
                if col in ("Filename", "txt_file") or col.endswith("-Answer") or col is None:
                    continue
                cell = (cell or "").strip()
                clauses = [c.strip() for c in ast.literal_eval(cell)] if cell else []
                out[(name, slug(col))] = [c for c in clauses if c]
    return out


# ---------------------------------------------------------------------- the figures

@dataclass
class Curve:
    thresholds: list[float]
    precision: list[float]
    recall: list[float]
    n_gold: int
    n_findings: int


def _monotone(prec: list[float]) -> list[float]:
    """Precision made non-increasing in recall: at each point the best precision at any
    higher recall (CUAD's process_precisions)."""
    out = list(prec)
    for i in range(len(out) - 2, -1, -1):
        out[i] = max(out[i], out[i + 1])
    return out


def score_review(findings: list[dict], gold: dict[tuple[str, str], list[str]], kinds: dict[str, str] | None = None) -> dict:
    """CUAD's figures for `findings` ({"doc", "item", "text", "score"}) against `gold`, over
    the (contract, kind) cells gold names for the contracts that have findings or gold.
    `kinds`: item id -> its finding ("parties" gets the substring rule)."""
    kinds = kinds or {}
    docs = {d for d, _ in gold}
    cells = {c for c in gold if c[0] in docs}
    # each gold clause's best matching score; each finding whether it matches
    gold_best: dict[tuple[str, str, int], float | None] = {}
    for (d, k), clauses in gold.items():
        for j in range(len(clauses)):
            gold_best[(d, k, j)] = None
    unmatched: list[float] = []
    for f in findings:
        cell = (f["doc"], f["item"])
        if cell not in cells:
            continue
        hit = False
        for j, g in enumerate(gold[cell]):
            if matches(f["text"], g, kinds.get(f["item"], "")):
                hit = True
                key = (cell[0], cell[1], j)
                if gold_best[key] is None or f["score"] > gold_best[key]:
                    gold_best[key] = f["score"]
        if not hit:
            unmatched.append(f["score"])
    n_gold = len(gold_best)
    thresholds = sorted({f["score"] for f in findings if (f["doc"], f["item"]) in cells}, reverse=True)
    found = sorted((s for s in gold_best.values() if s is not None), reverse=True)
    wrong = sorted(unmatched, reverse=True)
    prec, rec = [], []
    i = j = 0
    for t in thresholds:
        while i < len(found) and found[i] >= t:
            i += 1
        while j < len(wrong) and wrong[j] >= t:
            j += 1
        prec.append(i / (i + j) if i + j else 0.0)
        rec.append(i / n_gold if n_gold else 0.0)
    mono = _monotone(prec)
    aupr = sum((rec[k] - rec[k - 1]) * (mono[k] + mono[k - 1]) / 2 for k in range(1, len(rec))) if rec else 0.0

    def at_recall(r: float) -> tuple[float, float | None]:
        for p, x, t in zip(mono, rec, thresholds):
            if x >= r:
                return p, t
        return 0.0, None

    p80, t80 = at_recall(0.8)
    p90, _ = at_recall(0.9)
    # empty gold cells left empty at the threshold reaching 80% recall (at the lowest
    # threshold when 80% is never reached: every finding shown)
    t_cut = t80 if t80 is not None else (thresholds[-1] if thresholds else 0.0)
    shown = {(f["doc"], f["item"]) for f in findings if f["score"] >= t_cut}
    empty = [c for c in cells if not gold[c]]
    per_kind: dict[str, dict] = {}
    for (d, k, j), s in gold_best.items():
        pk = per_kind.setdefault(k, {"gold": 0, "found_at_80": 0, "found_any": 0})
        pk["gold"] += 1
        pk["found_any"] += s is not None
        pk["found_at_80"] += s is not None and s >= t_cut
    return {
        "contracts": len(docs), "cells": len(cells), "gold_clauses": n_gold,
        "cells_with_gold": sum(1 for c in cells if gold[c]), "findings": sum(1 for f in findings if (f["doc"], f["item"]) in cells),
        "aupr": round(aupr, 4), "precision_at_80_recall": round(p80, 4), "precision_at_90_recall": round(p90, 4),
        "max_recall": round(rec[-1], 4) if rec else 0.0, "threshold_at_80_recall": t80,
        "empty_cells": len(empty), "empty_left_empty_at_80": round(sum(1 for c in empty if c not in shown) / len(empty), 4) if empty else None,
        "per_kind": {k: {**v, "recall_at_80": round(v["found_at_80"] / v["gold"], 3), "recall_any": round(v["found_any"] / v["gold"], 3)}
                     for k, v in sorted(per_kind.items())},
    }


def review_findings(review_json: dict) -> list[dict]:
    """A review's JSON (`Review.to_json`) as the flat findings `score_review` reads."""
    out = []
    for c in review_json["contracts"]:
        for item, found in c["findings"].items():
            for e in found:
                out.append({"doc": c["doc"], "item": item, "text": e["text"], "score": e["score"], "by": e.get("by", "kinds")})
    return out


def cells_at(findings: list[dict], gold: dict[tuple[str, str], list[str]], floor: float) -> dict:
    """Cells filled at `floor` (some finding of the cell scores at or over it) against cells
    with gold: precision, recall, F1, and the share of empty gold cells left empty."""
    best_by_cell: dict[tuple[str, str], float] = {}
    for f in findings:
        c = (f["doc"], f["item"])
        if c in gold:
            best_by_cell[c] = max(best_by_cell.get(c, float("-inf")), f["score"])
    present = {c for c, v in gold.items() if v}
    filled = {c for c, s in best_by_cell.items() if s >= floor}
    tp = len(filled & present)
    p = tp / len(filled) if filled else 0.0
    r = tp / len(present) if present else 0.0
    empty = [c for c in gold if not gold[c]]
    return {"floor": floor, "f1": round(2 * p * r / (p + r), 4) if p + r else 0.0, "precision": round(p, 4),
            "recall": round(r, 4), "cells": len(gold), "cells_with_gold": len(present),
            "empty_left_empty": round(sum(1 for c in empty if c not in filled) / len(empty), 4) if empty else None}


def cell_floor(findings: list[dict], gold: dict[tuple[str, str], list[str]]) -> tuple[float | None, dict]:
    """The floor that best tells a contract's kinds from the kinds it lacks: the one with the
    best F1 of filled cells (`cells_at`) against cells with gold (ties: the higher floor).
    Returns (floor, its counts)."""
    scores = sorted({f["score"] for f in findings if (f["doc"], f["item"]) in gold}, reverse=True)
    best: tuple[float, float | None, dict] = (-1.0, None, {})
    for t in scores:
        at = cells_at(findings, gold, t)
        if at["f1"] > best[0]:
            best = (at["f1"], t, at)
    return best[1], best[2]
