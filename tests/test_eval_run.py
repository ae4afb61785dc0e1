"""The eval harness end to end: convert, retrieval-only run, a small generating run,
resume after SIGKILL, reports, compare, and one-line errors."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import ROOT, SHARED
from typer.testing import CliRunner

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


# Independent scorers for the hand checks below: written from the definitions (SQuAD token
# F1; "the gold answer occurs in the answer"), not with ragkit's own functions.

_MARKERS = re.compile(r"\[\d+(?:\s*[,;\u2013-]\s*\d+)*\]")  # [n] markers are not answer text


def _plain(text: str) -> str:
    """SQuAD's answer normalization: lower case, punctuation deleted, articles dropped."""
    text = _MARKERS.sub(" ", text or "").lower()
    text = re.sub(r"[^\w\s]", "", text)
    return " ".join(w for w in text.split() if w not in ("a", "an", "the"))


def _contains(answer: str, gold: str) -> bool:
    """The gold answer occurs in the answer, or every figure of the gold is stated in it."""
    if _plain(gold) in _plain(answer):
        return True
    nums = re.findall(r"\d+", gold)
    return bool(nums) and all(n in re.findall(r"\d+", _MARKERS.sub(" ", answer or "")) for n in nums)


def _f1(answer: str, gold: str) -> float:
    from collections import Counter

    a, g = _plain(answer).split(), _plain(gold).split()
    same = sum((Counter(a) & Counter(g)).values())
    return 0.0 if not same else 2 * (same / len(a)) * (same / len(g)) / (same / len(a) + same / len(g))


def _words(text: str) -> list[str]:
    text = text.replace("\u2019", "'").replace("\u2018", "'").replace("\u00ad", "").lower()
    return re.findall(r"\w+", re.sub(r"(?<=\w)-\s*(?=\w)", "", text))  # a line-break hyphen joins the word


def _holds(context: str, evidence: str) -> bool:
    """At least 90% of the evidence's words, with multiplicity, occur in the context (the
    rule eval/README.md states; plain containment passes it)."""
    from collections import Counter

    ev, have = Counter(_words(evidence)), Counter(_words(context))
    return sum(min(k, have[w]) for w, k in ev.items()) >= 0.9 * sum(ev.values())


# ---------------------------------------------------------------------- sets

def test_convert_contractnli_rendered8(tmp_path):
    if not (SHARED / "contractnli-dev").exists():
        pytest.skip("../shared/corpora (the ContractNLI source files, licensed separately, beside the checkout) is not present")
    out = tmp_path / "cnli8.jsonl"
    res = CliRunner().invoke(_cli(), ["eval", "convert", "contractnli-rendered8", "--out", str(out), "--corpora", str(SHARED), "--json"])
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


# ---------------------------------------------------------------------- what a run loads and reads

def test_a_run_with_corpus_loads_one_embedder(tmp_path, monkeypatch):
    """`eval run --corpus`: the ingest and the questions use one embedder (the run's
    Session's), counted through the real loader."""
    import ragkit.embed.factory as embed_factory
    from ragkit.eval.run import RunOptions, run_eval

    monkeypatch.setenv("RAGKIT_GENERATOR__N_CTX", "2048")
    real = embed_factory._make
    loaded: list = []
    monkeypatch.setattr(embed_factory, "_make", lambda settings: loaded.append(settings) or real(settings))
    docs = tmp_path / "docs"
    docs.mkdir()
    shutil.copy(ROOT / "corpora" / "nda" / "bonterms-mutual-nda-v1.pdf", docs)  # the set's first question's document
    report = run_eval(RunOptions(set_path=NDA_DEMO, out=tmp_path / "run", corpus=[docs], limit=1, retrieval_only=True))
    assert report["questions"][0]["evidence_in_context"] is True
    assert len(loaded) == 1, loaded


def test_a_run_resolves_its_settings_once_with_its_profile_and_store(nda_store, tmp_path, monkeypatch):
    """`eval run` reads the settings once, with --profile and --store, and the cluster
    choice uses those (it read them again without either: a profile in the environment that
    --profile overrides failed the run)."""
    import ragkit.config

    real = ragkit.config.load_settings
    reads: list[dict] = []
    monkeypatch.setattr(ragkit.config, "load_settings", lambda **kw: reads.append(kw) or real(**kw))
    out = tmp_path / "run"
    res = CliRunner().invoke(_cli(), ["eval", "run", str(NDA_DEMO), "--store", str(nda_store.store), "--profile", "laptop",
                                      "--limit", "1", "--retrieval-only", "--out", str(out), "--json"],
                             env={"RAGKIT_PROFILE": "no-such-profile", "RAGKIT_GENERATOR__N_CTX": "2048"})
    assert res.exit_code == 0, res.output
    assert [r.get("profile") for r in reads] == ["laptop"] and reads[0]["store"] == nda_store.store
    report = json.loads((out / "report.json").read_text(encoding="utf-8"))
    assert report["run"]["profile"] == "laptop" and report["run"]["store"] == str(nda_store.store)


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
    # the scores, computed by hand from the items and the answers the model gave
    items = {i.id: i for i in load_set(NDA_DEMO)[:2]}
    rows = {r["id"]: r for r in report["questions"]}
    match = {r["id"]: any(_contains(r["answer"], g) for g in items[r["id"]].answers) for r in recs}
    f1 = {r["id"]: max(_f1(r["answer"], g) for g in items[r["id"]].answers) for r in recs}
    for r in recs:
        assert rows[r["id"]]["answer_match"] is match[r["id"]], (r["id"], r["answer"])
        assert rows[r["id"]]["token_f1"] == pytest.approx(f1[r["id"]]), (r["id"], r["answer"])
    m = report["metrics"]
    assert m["answer_match"] == pytest.approx(sum(match.values()) / 2)
    assert m["token_f1"] == pytest.approx(sum(f1.values()) / 2)
    # citations: the ones the model marked [n] apart from the ones ragkit inferred
    n_inferred = sum(bool(c.get("inferred")) for r in recs for c in r["citations"])
    n_all = sum(len(r["citations"]) for r in recs)
    assert m["citations_inferred_share"] == (pytest.approx(n_inferred / n_all) if n_all else None)
    valid = []
    for r in recs:
        text = {c["n"]: c["text"] for c in r["contexts"]}
        marked = [c["n"] for c in r["citations"] if not c.get("inferred") and c["n"] in text]
        valid.append(any(_holds(text[n], items[r["id"]].evidence) for n in marked))
        assert rows[r["id"]]["valid_citation"] is valid[-1], r["id"]
        assert rows[r["id"]]["n_citations"] == len(marked)
    assert m["valid_citation_rate"] == pytest.approx(sum(valid) / 2)
    assert report["settings"]["generator"]["n_ctx"] == 2048 and report["settings"]["generator"]["max_tokens"] == 48
    assert report["versions"]["chromadb"] and "revision" in report["git"]
    html = (run / "report.html").read_text()
    assert html.count("data:image/png;base64,") >= 3 and "<table" in html
    assert "<script" not in html and "<link" not in html and "src='http" not in html  # self-contained
    assert "| metric | value |" in (run / "report.md").read_text()

    # compare against a copy whose every answer is an abstention, rescored: by hand, its
    # answer_match, token_f1 and valid citation rate are 0 (no gold answer shares a word
    # with "The documents do not say."), so exactly the ones the run scored above the
    # threshold (0.02) regress, and nothing regresses the other way round
    worse = tmp_path / "worse"
    shutil.copytree(run, worse)
    lines = [{**r, "answer": "The documents do not say.", "abstained": True, "citations": []} for r in recs]
    (worse / "answers.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines), encoding="utf-8")
    res = CliRunner().invoke(_cli(), ["eval", "rescore", str(worse)])
    assert res.exit_code == 0, res.output
    mw = json.loads((worse / "report.json").read_text())["metrics"]
    assert (mw["answer_match"], mw["token_f1"], mw["valid_citation_rate"]) == (0.0, 0.0, 0.0)
    # (answer_or_quote_match: the answer, or the quote a quoted or unverified answer shows, holds the gold)
    expected = [k for k in m if k in ("answer_match", "token_f1", "valid_citation_rate", "answer_or_quote_match")
                and (m[k] or 0) > 0.02]
    res = CliRunner().invoke(_cli(), ["eval", "compare", str(run), str(worse), "--json"])
    assert json.loads(res.stdout)["regressions"] == expected
    assert res.exit_code == (1 if expected else 0), res.output
    res = CliRunner().invoke(_cli(), ["eval", "compare", str(worse), str(run), "--json"])
    assert json.loads(res.stdout)["regressions"] == [] and res.exit_code == 0


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
        # compare.no_min_confidence unset: the options' scores could not change the label, so
        # no generator is run for it (ragkit.compare.item_label.generator_decides)
        assert r.get("choice") is None, r.get("choice")
        q = r["quote"]
        # a cell shows a quote with its confidence, or (judged not on point: Not mentioned)
        # no quote and the closest passage beside it
        if q["text"]:
            # compare.no_min_confidence unset: a Yes means "on point, no contrary wording", no probability
            assert q["confidence"] is None and r["answer"] in ("Yes", "No")
        else:
            assert r["answer"] == "Not mentioned" and q["closest"]
    shown = recs["x-nda-4"]["quote"]["text"] or recs["x-nda-4"]["quote"]["closest"]
    assert "Permitted Use" in shown  # the limited-use clause was found
    rows = {r["id"]: r for r in report["questions"]}
    assert rows["x-nda-4"]["passage_has_evidence"] is True  # matched the second gold span
    # the headline counts only a quote the cell shows: a "not on point" cell is a miss
    assert rows["x-nda-4"]["quote_has_evidence"] is bool(recs["x-nda-4"]["quote"]["text"])
    assert rows["x-nda-18"]["quote_has_evidence"] is None  # NotMentioned has no span
    m = report["metrics"]
    assert m["quote_has_evidence"] == float(rows["x-nda-4"]["quote_has_evidence"])
    assert m["passage_has_evidence"] == 1.0
    # the label scores, by hand from the labels the model chose (Yes / No / Not mentioned)
    to_nli = {"Yes": "Entailment", "No": "Contradiction", "Not mentioned": "NotMentioned"}
    gold = [i.label for i in items]
    pred = [to_nli[recs[i.id]["answer"]] for i in items]
    assert m["nli_accuracy"] == pytest.approx(sum(g == p for g, p in zip(gold, pred)) / 2)
    assert m["nli_majority_accuracy"] == pytest.approx(1 / 2)  # one Entailment, one NotMentioned
    sk = pytest.importorskip("sklearn.metrics")  # an independent F1 (test-only dependency)
    present = sorted(set(gold) | set(pred))
    assert m["nli_macro_f1"] == pytest.approx(sk.f1_score(gold, pred, labels=present, average="macro", zero_division=0))
    if "Contradiction" in present:
        assert m["nli_f1_contradiction"] == pytest.approx(sk.f1_score(gold, pred, labels=["Contradiction"], average="macro"))
    else:
        assert m["nli_f1_contradiction"] is None


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


def test_compare_flags_a_metric_that_rises_from_zero(tmp_path):
    """A relative change from 0 has no meaning: a lower-is-better metric at 0 regresses when
    it rises by more than the absolute threshold (nli_unparsed 0 -> 0.10 is 10 of 100
    answers no longer parsed)."""
    from ragkit.eval.report import compare

    def rep(**m):
        return {"run": {"set_digest": "x", "retrieval_only": False}, "metrics": m}

    assert compare(rep(nli_unparsed=0.0), rep(nli_unparsed=0.10))["regressions"] == ["nli_unparsed"]
    assert compare(rep(nli_unparsed=0.0), rep(nli_unparsed=0.01))["regressions"] == []  # within 0.02
    assert compare(rep(nli_unparsed=0.0), rep(nli_unparsed=0.01), threshold=0.005)["regressions"] == ["nli_unparsed"]
    assert compare(rep(nli_unparsed=0.0), rep(nli_unparsed=0.0))["regressions"] == []
    assert compare(rep(citations_inferred_share=0.0), rep(citations_inferred_share=0.5))["regressions"] == ["citations_inferred_share"]
    # and through the CLI
    for name, v in (("a", 0.0), ("b", 0.25)):
        (tmp_path / name).mkdir()
        (tmp_path / name / "report.json").write_text(json.dumps(rep(nli_unparsed=v)))
    res = CliRunner().invoke(_cli(), ["eval", "compare", str(tmp_path / "a"), str(tmp_path / "b"), "--json"])
    assert res.exit_code == 1 and json.loads(res.stdout)["regressions"] == ["nli_unparsed"]


# ---------------------------------------------------------------------- resume

@pytest.mark.complete
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


def test_the_cuad_abstention_sample_is_what_its_script_draws():
    """eval/sets/cuad-abstain-sample.jsonl is drawn, not picked: 40 answerable and 40
    unanswerable CUAD items, seed 13, reproduced by eval/sample_set.py."""
    import subprocess
    import sys

    out = subprocess.run([sys.executable, str(ROOT / "eval" / "sample_set.py"), str(ROOT / "eval" / "sets" / "cuad.jsonl"),
                          "--per-kind", "40", "--seed", "13"], capture_output=True, text=True, check=True).stdout
    committed = (ROOT / "eval" / "sets" / "cuad-abstain-sample.jsonl").read_text(encoding="utf-8")
    assert out == committed
    items = load_set(ROOT / "eval" / "sets" / "cuad-abstain-sample.jsonl")
    assert len(items) == 80 and sum(not i.answerable for i in items) == 40
