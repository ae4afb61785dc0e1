"""A question that errors (its doc is not in the store, ...) is a miss in every metric it
would have counted for, and every report says so at the top. Hand-computed cases on
the scoring functions, then one real retrieval-only run through the CLI."""

from __future__ import annotations

import json

import pytest
from conftest import ROOT
from typer.testing import CliRunner

from ragkit.eval.sets import EvalItem, load_set, write_set

EV = "alpha beta gamma delta epsilon zeta eta theta iota kappa"
EV2 = "lambda mu nu xi omicron pi rho sigma tau upsilon"
QUOTE_EV = "Recipient shall use the Confidential Information only for the Purpose and for no other purpose"


def _ok(id_, contexts, **kw):
    rec = {"id": id_, "status": "ok", "retrieval_only": False, "mode": "retrieved", "prompt_tokens": 500,
           "cached_tokens": 0, "completion_tokens": 10, "timings": {"total_s": 1.0}, "answer": "", "abstained": False,
           "citations": [], "invalid_citations": [], "contexts": contexts}
    rec.update(kw)
    return rec


def _err(id_, **kw):
    return {"id": id_, "status": "error", "error": "no ingested document matches --doc 'missing.pdf'", **kw}


def _ctx(n, text, page=1, doc="a.pdf"):
    return {"n": n, "rank": n, "doc": doc, "page": page, "page_end": page, "text": text}


ITEMS = [
    EvalItem(id="ev-ok", question="?", doc="a.pdf", answers=["alpha beta"], evidence=EV, page=1),
    EvalItem(id="ev-err", question="?", doc="missing.pdf", answers=["gamma"], evidence=EV2, page=2),
    EvalItem(id="unans-err", question="?", doc="missing.pdf", answerable=False),
    EvalItem(id="unans-ok", question="?", doc="a.pdf", answerable=False),
    EvalItem(id="nli-err", question="?", doc="missing.pdf", answers=["No"], label="Contradiction", evidence=QUOTE_EV,
             tags=["nda-4"]),
    EvalItem(id="nli-ok", question="?", doc="a.pdf", answers=["Yes"], label="Entailment", evidence=QUOTE_EV,
             tags=["nda-4"]),
    EvalItem(id="docless-err", question="?", answers=["$1.2 billion"], tags=["source:x.pdf"]),
]
RECORDS = {
    "ev-ok": _ok("ev-ok", [_ctx(1, "Intro. " + EV)], answer="It is alpha beta [1].", citations=[{"n": 1}]),
    "ev-err": _err("ev-err", retrieval_only=False, checklist=False),
    "unans-err": _err("unans-err", retrieval_only=False, checklist=False),
    "unans-ok": _ok("unans-ok", [_ctx(1, "unrelated")], answer="The documents do not say.", abstained=True),
    "nli-err": _err("nli-err", retrieval_only=False, checklist=True),
    "nli-ok": _ok("nli-ok", [_ctx(1, QUOTE_EV + ".")], answer="Yes",
                  quote={"text": QUOTE_EV + ".", "page": 1, "section": "2", "confidence": 0.7}),
    "docless-err": _err("docless-err", retrieval_only=False, checklist=False),
}


def _report():
    from ragkit.config import load_settings
    from ragkit.eval.run import score

    return score(ITEMS, RECORDS, load_settings())


def test_errored_questions_are_misses_in_every_metric():
    m = _report()["metrics"]
    assert (m["n_questions"], m["n_answered"], m["n_errors"]) == (7, 3, 4)
    # by hand, over the questions each metric applies to (errored ones included as misses):
    # evidence: ev-ok found, ev-err miss, nli-err miss, nli-ok found (rank 1 each)
    assert m["evidence_in_context"] == pytest.approx(2 / 4)
    assert m["mrr"] == pytest.approx((1 + 0 + 0 + 1) / 4)
    assert m["page_hit"] == pytest.approx(1 / 2)  # ev-ok on page 1; ev-err is a miss
    # answers: ev-ok matches; ev-err and docless-err are misses
    assert m["answer_match"] == pytest.approx(1 / 3)
    # token F1 of "It is alpha beta" against "alpha beta": P 2/4, R 2/2 -> 2/3
    assert m["token_f1"] == pytest.approx((2 / 3 + 0.0 + 0.0) / 3)
    # abstention: unans-ok abstained, unans-err did not
    assert m["abstain_recall"] == pytest.approx(1 / 2)
    assert m["abstain_precision"] == pytest.approx(1 / 1)
    # NLI: nli-ok right, nli-err wrong (no label); nli_unparsed is over answered items only
    assert m["nli_accuracy"] == pytest.approx(1 / 2)
    assert m["nli_unparsed"] == 0.0
    assert m["quote_has_evidence"] == pytest.approx(1 / 2)
    # the company-wide question: no source document retrieved, no figure in context
    assert m["doc_recall"] == 0.0 and m["answer_numbers_in_context"] == 0.0
    # a valid marked citation: ev-ok only, of the four questions with evidence
    assert m["valid_citation_rate"] == pytest.approx(1 / 4)
    # cost figures are over the answered questions only
    assert m["prompt_tokens_mean"] == 500 and m["completion_tokens_mean"] == 10


def test_errored_question_rows_say_why_and_are_failures():
    rows = {r["id"]: r for r in _report()["questions"]}
    for i in ("ev-err", "unans-err", "nli-err", "docless-err"):
        r = rows[i]
        assert r["status"] == "error" and r["failed"] is True and r["counted_as_miss"] is True
        assert "no ingested document" in r["why"] and "counted as a miss" in r["why"]
        assert "prompt_tokens" not in r and "projected_prefill_s" not in r
    assert rows["ev-err"]["evidence_in_context"] is False and rows["ev-err"]["rr"] == 0.0
    assert rows["ev-err"]["answer_match"] is False and rows["ev-err"]["token_f1"] == 0.0
    assert rows["unans-err"]["should_abstain"] is True and rows["unans-err"]["abstained"] is False
    assert rows["nli-err"]["nli_pred"] is None and rows["nli-err"]["quote_has_evidence"] is False


def test_an_errored_question_of_a_retrieval_only_run_is_a_retrieval_miss_only():
    from ragkit.config import load_settings
    from ragkit.eval.run import score

    items = ITEMS[:2]
    recs = {"ev-ok": _ok("ev-ok", [_ctx(1, EV)], retrieval_only=True, answer=None),
            "ev-err": {"id": "ev-err", "status": "error", "error": "no ingested document"}}  # an old record: no mode
    m = score(items, recs, load_settings())["metrics"]
    assert m["evidence_in_context"] == pytest.approx(1 / 2) and m["page_hit"] == pytest.approx(1 / 2)
    assert m["answer_match"] is None and m["valid_citation_rate"] is None  # nothing was generated


def test_reports_say_at_the_top_that_errors_count_as_misses(tmp_path):
    from ragkit.config import load_settings
    from ragkit.eval.report import write_reports

    rep = _report()
    note = "4 of 7 questions errored; counted as misses"
    assert rep["notes"] == [note]
    rep["run"] = {"set": "x.jsonl", "retrieval_only": False}
    write_reports(tmp_path, rep, load_settings())
    js = json.loads((tmp_path / "report.json").read_text(encoding="utf-8"))
    assert list(js)[0] == "notes" and js["notes"] == [note]
    md = (tmp_path / "report.md").read_text(encoding="utf-8")
    assert note in md and md.index(note) < md.index("| metric | value |")
    html = (tmp_path / "report.html").read_text(encoding="utf-8")
    assert note in html and html.index(note) < html.index("<h2>")
    # no errors: no note
    clean = {k: v for k, v in RECORDS.items() if v["status"] == "ok"}
    from ragkit.eval.run import score

    assert score([i for i in ITEMS if i.id in clean], clean, load_settings())["notes"] == []


def test_cli_run_summary_leads_with_the_errors(nda_store, tmp_path, monkeypatch):
    """A real retrieval-only run in which one question names a document the store lacks:
    the terminal summary opens with the note, and evidence_in_context counts the miss."""
    from ragkit.cli import app

    monkeypatch.setenv("RAGKIT_GENERATOR__N_CTX", "2048")
    items = load_set(ROOT / "eval" / "sets" / "nda-demo.jsonl")
    items.append(EvalItem(id="no-such-doc", question="How long does confidentiality last?", doc="no-such-nda.pdf",
                          answers=["x"], evidence="This Agreement shall be governed by the laws of Manitoba", page=1))
    set_path = tmp_path / "set.jsonl"
    write_set(items, set_path)
    n = len(items)
    res = CliRunner().invoke(app, ["eval", "run", str(set_path), "--store", str(nda_store.store), "--retrieval-only",
                                   "--out", str(tmp_path / "run")])
    assert res.exit_code == 0, res.output
    note = f"1 of {n} questions errored; counted as misses"
    assert note in res.stdout
    assert res.stdout.index(note) < res.stdout.index("evidence_in_context")
    rows = {r["id"]: r for r in json.loads((tmp_path / "run" / "report.json").read_text())["questions"]}
    with_ev = [i.id for i in items if i.evidence]
    found = sum(bool(rows[i]["evidence_in_context"]) for i in with_ev)
    assert rows["no-such-doc"]["evidence_in_context"] is False
    m = json.loads((tmp_path / "run" / "report.json").read_text())["metrics"]
    assert m["evidence_in_context"] == pytest.approx(found / len(with_ev))  # the errored one in the denominator
    res = CliRunner().invoke(app, ["eval", "run", str(set_path), "--store", str(nda_store.store), "--retrieval-only",
                                   "--out", str(tmp_path / "run"), "--json"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["notes"] == [note]
