"""One row per question, for review in a spreadsheet: RUN_DIR/rows.csv and rows.xlsx, and
two runs side by side (`ragkit eval compare A B --out DIR`: compare_rows.csv / .xlsx).

A row holds the question and its gold answer (and where the evidence is), ragkit's answer
and outcome, the citations, the error of a question that errored, and the per-question
figures `ragkit.eval.run.score_item` gives (the same values as report.json's
`questions`; yes/no figures as 1/0).

A document's text can be hostile: a cell whose text starts with = + - @ (or a tab or
carriage return) is a formula to a spreadsheet. In the CSV such a cell gets a leading
apostrophe; in the xlsx it is written as a string (never a formula). The CSV is UTF-8
with a byte-order mark, which Excel needs to read it as UTF-8. The xlsx needs openpyxl;
without it only the CSV is written and the report says so.
"""

from __future__ import annotations

import json
from pathlib import Path

from ragkit.config import Settings
from ragkit.errors import UsageError
from ragkit.eval.sets import EvalItem
from ragkit.sheets import FORMULA_START, XLSX_CELL_MAX, fitted_width, is_hostile, write_csv, xlsx_available  # noqa: F401  (re-exported)

ROWS_CSV, ROWS_XLSX = "rows.csv", "rows.xlsx"
COMPARE_CSV, COMPARE_XLSX = "compare_rows.csv", "compare_rows.xlsx"
STAGES = ("retrieve_s", "prompt_s", "generate_s", "ttft_s", "total_s")

# the columns before the figures (the optional ones only when some question has a value)
INFO_COLUMNS = ("id", "question", "gold_answer", "gold_label", "answerable", "gold_doc", "gold_page", "gold_evidence",
                "answer", "outcome", "abstain_reason", "first_cited_doc", "first_cited_page", "citations", "quote",
                "top_context", "error", "failed", "why")
# keys of a scored row that are not figures (shown in their own columns, or not at all)
_NOT_METRIC = {"id", "question", "doc", "tags", "status", "answer", "quote", "timings", "why", "failed", "top_context",
               "mode", "counted_as_miss"}
# figures of cost and latency: shown side by side, but not named in `changed` (they differ run to run)
_COST = {"prompt_tokens", "cached_tokens", "completion_tokens", "projected_prefill_s", "n_contexts", *STAGES}
# columns of long text: wrapped and wide in the xlsx
_LONG = {"question": 50, "gold_answer": 30, "gold_evidence": 50, "answer": 60, "abstain_reason": 30, "citations": 36,
         "quote": 50, "error": 40, "why": 36, "top_context": 30, "changed": 40}

_XLSX_MISSING = "openpyxl is not installed: {name} not written (the CSV holds the same rows)"


# ---------------------------------------------------------------------- one run

def outcome(rec: dict | None, scored: dict | None = None) -> str:
    """What ragkit did with the question: the record's own `outcome` when it has one, else
    "supported" or "abstained" from `abstained`; "error" / "missing" for a question that
    errored or was not answered, "retrieval only" when nothing was generated."""
    scored = scored or {}
    if rec is None:  # no answers.jsonl beside the report: what the scored row says
        if scored.get("status", "missing") != "ok":
            return str(scored.get("status", "missing"))
        if "abstained" in scored:
            return "abstained" if scored["abstained"] else "supported"
        return "retrieval only" if scored.get("answer") is None else "supported"
    if rec.get("status", "ok") != "ok":
        return str(rec.get("status") or "error")
    if rec.get("outcome"):
        return str(rec["outcome"])
    if rec.get("retrieval_only") or rec.get("answer") is None:
        return "retrieval only"
    return "abstained" if rec.get("abstained") else "supported"


def _where(c: dict) -> str:
    where = str(c.get("doc") or "?")
    if c.get("page") is not None:
        where += f" p.{c['page']}"
    return where + (" (inferred)" if c.get("inferred") else "")


def citations_text(cites: list[dict]) -> str:
    """All citations as "doc p.N; doc p.M"; one ragkit inferred from the answer's wording
    (the model wrote no marker) says so."""
    return "; ".join(_where(c) for c in cites)


def _cell(v):
    """A value as a spreadsheet holds it: yes/no as 1/0, lists joined, None empty."""
    if isinstance(v, bool):
        return int(v)
    if isinstance(v, (list, tuple)):
        return " | ".join(str(x) for x in v)
    if isinstance(v, dict):
        return json.dumps(v, ensure_ascii=False)
    return v


def metric_columns(scored: list[dict]) -> list[str]:
    """The figures of the scored rows, in the order score_item gives them (a figure no row
    has a value for is left out), then the timings per stage."""
    cols: list[str] = []
    for r in scored:
        for k, v in r.items():
            if k not in _NOT_METRIC and k not in cols and v is not None:
                cols.append(k)
    stages = [s for s in STAGES if any(s in (r.get("timings") or {}) for r in scored)]
    return cols + stages


def build_rows(items: list[EvalItem], records: dict[str, dict], scored: list[dict]) -> tuple[list[str], list[dict]]:
    """The columns and one row per question, in set order. `scored` are report["questions"]
    (score_item's rows, by id); `records` the answers.jsonl records (may lack some)."""
    by_id = {r["id"]: r for r in scored}
    metrics = metric_columns(scored)
    optional = {
        "gold_label": any(i.label for i in items),
        "answerable": any(not i.answerable for i in items),
        "gold_doc": any(i.doc for i in items),
        "gold_page": any(i.page is not None for i in items),
        "gold_evidence": any(i.evidence for i in items),
        "quote": any(r.get("quote") for r in scored),
    }
    cols = [c for c in INFO_COLUMNS if optional.get(c, True)] + metrics
    rows = []
    for item in items:
        s = by_id.get(item.id, {})
        rec = records.get(item.id)
        ok = rec is not None and rec.get("status", "ok") == "ok"
        cites = list((rec or {}).get("citations") or []) if ok else []
        row = {
            "id": item.id,
            "question": item.question,
            "gold_answer": " | ".join(item.answers),
            "gold_label": item.label,
            "answerable": int(item.answerable),
            "gold_doc": item.doc,
            "gold_page": item.page,
            "gold_evidence": item.evidence,
            "answer": (rec.get("answer") if ok else None) if rec is not None else s.get("answer"),
            "outcome": outcome(rec, s),
            "abstain_reason": (rec or {}).get("abstain_reason") if ok else None,
            "first_cited_doc": cites[0].get("doc") if cites else None,
            "first_cited_page": cites[0].get("page") if cites else None,
            "citations": citations_text(cites),
            "quote": s.get("quote"),
            "top_context": s.get("top_context"),
            "error": (rec or {}).get("error") if rec is not None and not ok else None,
            "failed": _cell(s.get("failed")),
            "why": s.get("why"),
        }
        timings = s.get("timings") or {}
        for k in metrics:
            row[k] = _cell(timings.get(k) if k in STAGES else s.get(k))
        rows.append({c: row.get(c) for c in cols})
    return cols, rows


# ---------------------------------------------------------------------- writing

def _width(col: str, rows: list[dict]) -> float:
    base = col.rsplit(" ", 1)[0]  # "answer A" is as wide as "answer"
    return _LONG[base] if base in _LONG else fitted_width(col, rows)


def write_xlsx(path: Path, columns: list[str], rows: list[dict], title: str = "rows") -> None:
    from ragkit.sheets import Sheet, write_workbook

    write_workbook(path, [Sheet(title, columns, rows, widths={c: _width(c, rows) for c in columns},
                                wrap={c for c in columns if c.rsplit(" ", 1)[0] in _LONG})])


def _plan(csv_name: str, xlsx_name: str) -> dict:
    """The files about to be written (file names) and, without openpyxl, why the xlsx is not."""
    if xlsx_available():
        return {"csv": csv_name, "xlsx": xlsx_name, "note": None}
    return {"csv": csv_name, "xlsx": None, "note": _XLSX_MISSING.format(name=xlsx_name)}


def write_table(out: Path, plan: dict, columns: list[str], rows: list[dict], title: str) -> dict:
    """Write the CSV (and the xlsx when the plan has one) into `out`; their paths by kind."""
    out = Path(out)
    files = {"csv": out / plan["csv"]}
    if plan["xlsx"]:
        files["xlsx"] = out / plan["xlsx"]
    try:
        write_csv(files["csv"], columns, rows)
        if "xlsx" in files:
            write_xlsx(files["xlsx"], columns, rows, title)
    except OSError as exc:
        raise UsageError(f"cannot write the rows in {out}: {exc.strerror or exc}") from None
    return {k: str(v) for k, v in files.items()}


def write_run_files(out: Path, report: dict, settings: Settings, items: list[EvalItem], records: dict[str, dict]) -> dict:
    """report.json/.md/.html (ragkit.eval.report.write_reports) and rows.csv/.xlsx into a
    run folder. Returns the paths written, by kind (`rows_xlsx` None without openpyxl;
    report["rows"]["note"] says why)."""
    from ragkit.eval.report import write_reports

    out = Path(out)
    plan = _plan(ROWS_CSV, ROWS_XLSX)
    report["rows"] = plan  # report.json and report.md say which were written (and why not)
    write_reports(out, report, settings)
    cols, rows = build_rows(items, records, report["questions"])
    written = write_table(out, plan, cols, rows, "rows")
    return {"report_json": str(out / "report.json"), "report_md": str(out / "report.md"),
            "report_html": str(out / "report.html"), "rows_csv": written["csv"], "rows_xlsx": written.get("xlsx")}


# ---------------------------------------------------------------------- two runs

def run_rows(path: Path) -> tuple[dict, list[str], list[dict]]:
    """The rows of a finished run (its folder, or its report.json): its report's scored
    questions, its answers.jsonl beside it, and the gold of its set file when that still
    loads (else the gold columns are empty)."""
    from ragkit.eval.answers import ANSWERS, read_answers
    from ragkit.eval.report import load_report
    from ragkit.eval.sets import load_set

    p = Path(path)
    report = load_report(p)
    run_dir = p if p.is_dir() else p.parent
    scored = [q for q in report.get("questions") or [] if isinstance(q, dict) and q.get("id")]
    records = read_answers(run_dir / ANSWERS)
    gold: dict[str, EvalItem] = {}
    set_path = report.get("run", {}).get("set")
    if set_path:
        try:
            gold = {i.id: i for i in load_set(Path(set_path))}
        except UsageError:
            gold = {}
    items = [gold.get(q["id"]) or EvalItem(id=q["id"], question=q.get("question") or "?", doc=q.get("doc"),
                                           answerable=True) for q in scored]
    cols, rows = build_rows(items, records, scored)
    return report, cols, rows


def _show(v) -> str:
    if v is None or v == "":
        return "none"
    if isinstance(v, float):
        return f"{v:.3f}".rstrip("0").rstrip(".")
    return str(v)


def _differs(a, b) -> bool:
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return abs(a - b) > 1e-9
    return (a if a != "" else None) != (b if b != "" else None)


def compare_rows(cols_a: list[str], rows_a: list[dict], cols_b: list[str], rows_b: list[dict]) -> tuple[list[str], list[dict]]:
    """Every question of two runs side by side (A's order, then B's own), with `changed`
    naming what changed: each figure ("answer_match 1->0"), the outcome and the answer
    text (cost and latency are shown, not named); "only in A" / "only in B"."""
    fixed = set(INFO_COLUMNS)
    metrics = [c for c in cols_a if c not in fixed] + [c for c in cols_b if c not in fixed and c not in cols_a]
    cols = ["id", "question", "gold_answer", "answer A", "outcome A", "answer B", "outcome B", "changed"]
    cols += [f"{m} {side}" for m in metrics for side in ("A", "B")]
    a_by, b_by = {r["id"]: r for r in rows_a}, {r["id"]: r for r in rows_b}
    order = [r["id"] for r in rows_a] + [r["id"] for r in rows_b if r["id"] not in a_by]
    out = []
    for qid in order:
        a, b = a_by.get(qid), b_by.get(qid)
        base = a or b
        row = {"id": qid, "question": base.get("question"),
               "gold_answer": (a or {}).get("gold_answer") or (b or {}).get("gold_answer")}
        for side, r in (("A", a), ("B", b)):
            if r is not None:
                row[f"answer {side}"] = r.get("answer")
                row[f"outcome {side}"] = r.get("outcome")
                for m in metrics:
                    row[f"{m} {side}"] = r.get(m)
        if a is None or b is None:
            row["changed"] = "only in A" if b is None else "only in B"
        else:
            what = [f"{m} {_show(a.get(m))}->{_show(b.get(m))}" for m in metrics
                    if m not in _COST and _differs(a.get(m), b.get(m))]
            if a.get("outcome") != b.get("outcome"):
                what.append(f"outcome {_show(a.get('outcome'))}->{_show(b.get('outcome'))}")
            if _differs(a.get("answer"), b.get("answer")):
                what.append("answer text")
            row["changed"] = "; ".join(what)
        out.append({c: row.get(c) for c in cols})
    return cols, out


def write_compare_rows(out: Path, run_a: Path, run_b: Path) -> dict:
    """compare_rows.csv (and .xlsx) of two runs into the folder `out`. Returns `files`, the
    paths written by kind (`compare_rows_xlsx` None without openpyxl, `note` says why), and
    how many rows there are and how many changed."""
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise UsageError(f"--out {out} is a file, not a folder")
    _, cols_a, rows_a = run_rows(run_a)
    _, cols_b, rows_b = run_rows(run_b)
    cols, rows = compare_rows(cols_a, rows_a, cols_b, rows_b)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UsageError(f"cannot make the folder {out}: {exc.strerror or exc}") from None
    plan = _plan(COMPARE_CSV, COMPARE_XLSX)
    written = write_table(out, plan, cols, rows, "compare")
    return {"files": {"compare_rows_csv": written["csv"], "compare_rows_xlsx": written.get("xlsx")},
            "note": plan["note"], "n_rows": len(rows), "n_changed": sum(bool(r["changed"]) for r in rows)}


__all__ = ["build_rows", "compare_rows", "outcome", "run_rows", "write_compare_rows", "write_run_files", "is_hostile"]
