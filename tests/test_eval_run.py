"""The eval harness end to end: convert, retrieval-only run, a small generating run,
resume after SIGKILL, reports, compare, and one-line errors."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from conftest import ROOT, SHARED

from ragkit.eval.metrics import normalize
from ragkit.eval.sets import EvalItem, load_set, write_set

NDA_DEMO = ROOT / "eval" / "sets" / "nda-demo.jsonl"
_EXE = Path(sys.executable).parent / "ragkit"
RAGKIT = [str(_EXE)] if _EXE.exists() else [sys.executable, "-m", "ragkit.cli"]
REPORT_KEYS = {"evidence_in_context", "page_hit", "mrr", "answer_match", "token_f1", "nli_accuracy", "abstain_precision",
               "abstain_recall", "citation_precision", "prompt_tokens_mean", "projected_prefill_s_mean", "n_questions"}


def _env(**extra) -> dict:
    env = dict(os.environ)
    env.update({"RAGKIT_GENERATOR__N_CTX": "2048", "RAGKIT_GENERATOR__MAX_TOKENS": "48"})
    env.update(extra)
    return env


def _cli():
    from ragkit.cli import app

    return app


def _lines(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text(encoding="utf-8").splitlines() if x.strip()]


# ---------------------------------------------------------------------- sets

def test_convert_contractnli_rendered8(tmp_path):
    if not (SHARED / "contractnli-dev").exists():
        pytest.skip("../shared/corpora (the ContractNLI source files, licensed separately, beside the checkout) is not present")
    out = tmp_path / "cnli8.jsonl"
    res = CliRunner().invoke(_cli(), ["eval", "convert", "contractnli-rendered8", "--out", str(out), "--json"])
    assert res.exit_code == 0, res.output
    items = load_set(out)
    assert len(items) == 8 * 17
    rendered = SHARED / "contractnli-dev" / "rendered"
    assert all((rendered / i.doc).exists() for i in items)  # every doc is a real file
    assert {i.label for i in items} == {"Entailment", "Contradiction", "NotMentioned"}
    with_ev = [i for i in items if i.evidence]
    assert with_ev and all(i.label != "NotMentioned" for i in with_ev)
    assert all(i.page is not None for i in with_ev)  # located in the rendered PDF
    # the committed copy is what the converter makes
    committed = ROOT / "eval" / "sets" / "contractnli-rendered8.jsonl"
    assert committed.read_text(encoding="utf-8") == out.read_text(encoding="utf-8")


def test_committed_sets_load_and_hand_written_evidence_is_verbatim():
    sets = sorted((ROOT / "eval" / "sets").glob("*.jsonl"))
    assert {p.name for p in sets} >= {"nda-demo.jsonl", "fda-guidance.jsonl", "sec-10q.jsonl", "cuad.jsonl",
                                      "contractnli-dev.jsonl", "contractnli-rendered8.jsonl"}
    for p in sets:
        assert load_set(p)
    fda = load_set(ROOT / "eval" / "sets" / "fda-guidance.jsonl")
    assert len(fda) >= 10 and sum(not i.answerable for i in fda) >= 2
    assert len(load_set(ROOT / "eval" / "sets" / "sec-10q.jsonl")) == 195
    src = SHARED / "regulatory" / "fda-guidance"
    if src.exists():
        texts = {p.stem: normalize(p.read_text(encoding="utf-8")) for p in src.glob("*.md")}
        for i in fda:
            if i.evidence:
                assert normalize(i.evidence) in texts[Path(i.doc).stem], i.id


def test_bad_set_is_a_one_line_error(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"id": "a", "question": "q?", "answers": []}\n{"id": "b", "question": "q?", "colour": "red"}\n')
    res = CliRunner().invoke(_cli(), ["eval", "run", str(bad), "--store", str(tmp_path / "s"), "--out", str(tmp_path / "r")])
    assert res.exit_code == 2
    assert "bad.jsonl:2" in res.output and "colour" in res.output and "Traceback" not in res.output
    res = CliRunner().invoke(_cli(), ["eval", "run", str(tmp_path / "nope.jsonl"), "--store", str(tmp_path / "s"),
                                      "--out", str(tmp_path / "r")])
    assert res.exit_code == 2 and "no such set file" in res.output
    res = CliRunner().invoke(_cli(), ["eval", "run", str(NDA_DEMO), "--out", str(tmp_path / "r")])
    assert res.exit_code == 2 and "--corpus" in res.output
    res = CliRunner().invoke(_cli(), ["eval", "convert", "no-such-set", "--out", str(tmp_path / "x.jsonl")])
    assert res.exit_code == 2 and "unknown set" in res.output


# ---------------------------------------------------------------------- retrieval-only

def test_retrieval_only_run_scores_evidence(nda_store, tmp_path, monkeypatch):
    from ragkit.eval.run import RunOptions, run_eval

    monkeypatch.setenv("RAGKIT_GENERATOR__N_CTX", "2048")
    items = load_set(NDA_DEMO)
    # a known miss: the evidence is nowhere in the corpus
    items.append(EvalItem(id="planted-miss", question="How long does confidentiality last?",
                          doc="bonterms-mutual-nda-v1.pdf", answers=["x"], evidence="the moon is made of green cheese", page=1))
    set_path = tmp_path / "set.jsonl"
    write_set(items, set_path)
    run = tmp_path / "run"
    report = run_eval(RunOptions(set_path=set_path, out=run, store=nda_store.store, retrieval_only=True))
    recs = {r["id"]: r for r in _lines(run / "answers.jsonl")}
    assert set(recs) == {i.id for i in items}
    rows = {r["id"]: r for r in report["questions"]}
    # independent check: plain normalized containment in one context
    for i in items:
        if not i.evidence:
            assert rows[i.id]["evidence_in_context"] is None
            continue
        found = any(normalize(i.evidence) in normalize(c["text"]) for c in recs[i.id]["contexts"])
        assert rows[i.id]["evidence_in_context"] == found, i.id
    assert rows["planted-miss"]["evidence_in_context"] is False and rows["planted-miss"]["evidence_rank"] is None
    assert rows["cnli019-law"]["evidence_in_context"] is True  # Manitoba clause is in cnli_dev_019
    m = report["metrics"]
    ev_items = [i for i in items if i.evidence]
    assert m["evidence_in_context"] == pytest.approx(sum(rows[i.id]["evidence_in_context"] for i in ev_items) / len(ev_items))
    assert m["evidence_in_context"] < 1.0  # the planted miss counts
    assert m["mrr"] == pytest.approx(sum(rows[i.id]["rr"] for i in ev_items) / len(ev_items))
    for r in recs.values():
        assert r["answer"] is None and r["prompt_tokens"] <= 2048
        ranks = sorted(c["rank"] for c in r["contexts"])
        assert ranks == list(range(1, len(ranks) + 1))
        assert all(set(c) >= {"doc", "page", "section", "text"} for c in r["contexts"])
    assert m["answer_match"] is None and m["nli_accuracy"] is None  # nothing generated
    assert all("generate_s" not in r["timings"] for r in recs.values())  # nothing was generated
    for f in ("report.json", "report.md", "report.html"):
        assert (run / f).stat().st_size > 0


# ---------------------------------------------------------------------- generating run + reports

def test_generating_run_limit_2_and_reports(nda_store, tmp_path):
    run = tmp_path / "gen"
    proc = subprocess.run(
        RAGKIT + ["eval", "run", str(NDA_DEMO), "--store", str(nda_store.store), "--limit", "2",
                  "--concurrency", "4", "--out", str(run), "--json"],
        cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=900,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "--concurrency forced to 1" in proc.stderr  # llama.cpp in process
    assert "eta" in proc.stderr
    out = json.loads(proc.stdout)
    recs = _lines(run / "answers.jsonl")
    assert [r["id"] for r in recs] == [i.id for i in load_set(NDA_DEMO)[:2]]
    for r in recs:
        assert r["status"] == "ok" and r["answer"]
        assert r["prompt_tokens"] + 48 <= 2048
        assert r["completion_tokens"] <= 48
        assert {"retrieve_s", "prompt_s", "generate_s", "ttft_s", "total_s"} <= set(r["timings"])
        assert r["contexts"] and "cached_tokens" in r
    report = json.loads((run / "report.json").read_text())
    assert REPORT_KEYS <= set(report["metrics"])
    assert report["metrics"]["n_questions"] == 2 and out["metrics"]["n_questions"] == 2
    assert report["metrics"]["nli_accuracy"] is None  # nda-demo has no NLI labels
    assert report["metrics"]["answer_match"] is not None and report["metrics"]["token_f1"] is not None
    assert report["settings"]["generator"]["n_ctx"] == 2048 and report["settings"]["generator"]["max_tokens"] == 48
    assert report["versions"]["chromadb"] and "revision" in report["git"]
    html = (run / "report.html").read_text()
    assert html.count("data:image/png;base64,") >= 3 and "<table" in html
    assert "<script" not in html and "<link" not in html and "src='http" not in html  # self-contained
    assert "| metric | value |" in (run / "report.md").read_text()

    # compare: the run against itself has no regression
    res = CliRunner().invoke(_cli(), ["eval", "compare", str(run), str(run)])
    assert res.exit_code == 0, res.output


def test_nli_items_are_scored_through_the_checklist(nda_store, tmp_path):
    """ContractNLI-style items on a real NDA of the store: labelled by compare's checklist
    item (joined on the hypothesis id), with the quote scored against every gold span."""
    from ragkit.eval.run import RunOptions, run_eval
    from ragkit.eval.sets import nli_question

    doc = "cnli_dev_019.pdf"
    hyp = {i.id: i.hypothesis for i in __import__("ragkit.compare").compare.load_checklist("nda")[1] if i.hypothesis}
    items = [
        EvalItem(id="x-nda-4", question=nli_question(hyp["nda-4"]), doc=doc, answers=["Yes"], label="Entailment",
                 evidence="Confidant may use the Confidential Information only for the Permitted Use",
                 evidence_all=["nothing like the quote at all", "Confidant may use the Confidential Information only for the Permitted Use and for no other purpose"],
                 tags=["nda-4", "label:Entailment"]),
        EvalItem(id="x-nda-18", question=nli_question(hyp["nda-18"]), doc=doc, answers=["Not mentioned"], label="NotMentioned",
                 tags=["nda-18", "label:NotMentioned"]),
    ]
    set_path = tmp_path / "nli.jsonl"
    write_set(items, set_path)
    report = run_eval(RunOptions(set_path=set_path, out=tmp_path / "run", store=nda_store.store))
    recs = {r["id"]: r for r in _lines(tmp_path / "run" / "answers.jsonl")}
    for r in recs.values():
        assert r["answer"] in ("Yes", "No", "Not mentioned")
        assert set(r["choice"]["logprobs"]) == {"Yes", "No", "Not mentioned"} and r["choice"]["scored"]
        assert r["quote"]["text"] and 0 < r["quote"]["confidence"] <= 1
    assert "Permitted Use" in recs["x-nda-4"]["quote"]["text"]  # the limited-use clause
    rows = {r["id"]: r for r in report["questions"]}
    assert rows["x-nda-4"]["quote_has_evidence"] is True  # matched the second gold span
    assert rows["x-nda-18"]["quote_has_evidence"] is None  # NotMentioned has no span
    m = report["metrics"]
    assert m["quote_has_evidence"] == 1.0 and m["nli_macro_f1"] is not None and m["nli_accuracy"] in (0.0, 0.5, 1.0)


def test_compare_flags_regressions(tmp_path):
    base = {"run": {"set_digest": "x", "retrieval_only": False},
            "metrics": {"n_questions": 10, "n_errors": 0, "token_f1": 0.50, "mrr": 0.40, "nli_accuracy": None,
                        "prompt_tokens_mean": 1000.0, "projected_prefill_s_mean": 9.4, "total_s_p50": 10.0}}

    def write(name, **metrics):
        d = tmp_path / name
        d.mkdir()
        rep = json.loads(json.dumps(base))
        rep["metrics"].update(metrics)
        (d / "report.json").write_text(json.dumps(rep))
        return str(d)

    a = write("a")
    runner = CliRunner()

    def regs(b, *opts):
        res = runner.invoke(_cli(), ["eval", "compare", a, b, "--json", *opts])
        return res.exit_code, json.loads(res.output)["regressions"]

    assert regs(write("same")) == (0, [])
    # token_f1 drops 0.05 (> 0.02), mrr drops 0.01 (within), tokens +50% (> 10%), latency x3 (not flagged by default)
    b = write("worse", token_f1=0.45, mrr=0.39, prompt_tokens_mean=1500.0, total_s_p50=30.0)
    assert regs(b) == (1, ["token_f1", "prompt_tokens_mean"])
    assert regs(b, "--latency") == (1, ["token_f1", "prompt_tokens_mean", "total_s_p50"])
    assert regs(b, "--threshold", "0.1", "--cost-threshold", "0.6") == (0, [])
    assert regs(write("better", token_f1=0.9, prompt_tokens_mean=500.0)) == (0, [])
    assert regs(write("errors", n_errors=2)) == (1, ["n_errors"])
    res = runner.invoke(_cli(), ["eval", "compare", a, str(tmp_path / "missing")])
    assert res.exit_code == 2 and "no report" in res.output and "Traceback" not in res.output


# ---------------------------------------------------------------------- resume

def test_resume_after_sigkill(nda_store, tmp_path):
    base = load_set(NDA_DEMO)
    items = [i.model_copy(update={"id": f"{i.id}-{k}"}) for k in range(3) for i in base]  # 12 questions
    set_path = tmp_path / "twelve.jsonl"
    write_set(items, set_path)
    run = tmp_path / "run"
    answers = run / "answers.jsonl"
    cmd = RAGKIT + ["eval", "run", str(set_path), "--store", str(nda_store.store), "--retrieval-only",
                    "--limit", "10", "--out", str(run)]
    proc = subprocess.Popen(cmd, cwd=ROOT, env=_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 600
    try:
        while time.monotonic() < deadline and proc.poll() is None:
            if answers.exists() and answers.read_bytes().count(b"\n") >= 1:
                break
            time.sleep(0.02)
        assert proc.poll() is None, "the run ended before it could be killed"
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        proc.wait(timeout=30)
    assert proc.returncode == -signal.SIGKILL
    first = answers.read_bytes()
    complete = first[: first.rfind(b"\n") + 1]  # a line cut by the kill has no newline
    first_ids = [json.loads(x)["id"] for x in complete.splitlines() if x.strip()]
    assert 1 <= len(first_ids) < 10
    done = subprocess.run(cmd + ["--json"], cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    assert f"resuming: {len(first_ids)} of 10 already answered" in done.stderr
    ids = [r["id"] for r in _lines(answers)]
    assert len(ids) == len(set(ids)) == 10  # nobody answered twice, nobody missing
    assert set(ids) == {i.id for i in items[:10]}
    assert ids[: len(first_ids)] == first_ids  # the first run's answers were kept
    assert json.loads(done.stdout)["metrics"]["n_questions"] == 10
    # a run folder is tied to its set and mode
    res = CliRunner().invoke(_cli(), ["eval", "run", str(NDA_DEMO), "--store", str(nda_store.store), "--out", str(run)])
    assert res.exit_code == 2 and "another set or mode" in res.output
