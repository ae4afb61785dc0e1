"""Inferred citations (the model wrote no [n]): content-word overlap, a meaningful share
of the answer; and eval counts them apart from the citations the model marked."""

from __future__ import annotations

import pytest

from ragkit.answer.citations import extract
from ragkit.eval.sets import EvalItem
from ragkit.retrieve.prompt import Context

LAW = "This Agreement is governed by the laws of Delaware, and its courts have exclusive jurisdiction."
RETURN = "The Recipient shall return all materials and copies within thirty days."
SURVIVAL = "Confidentiality obligations under this Agreement survive termination for a period of three (3) years."


def _contexts(*texts: str) -> list[Context]:
    return [Context(n=i, doc="nda.pdf", doc_id="d", chunk_id=f"d:{i:05d}", chunk_index=i, section=f"§{i}",
                    page_start=i, page_end=i, text=t) for i, t in enumerate(texts, 1)]


def test_no_citation_from_shared_stopwords():
    # shares "the" and "and" with [2] (two words of three letters or more), no content word
    answer = "The party that receives the information has to keep it secret, and use it with care."
    cites, invalid = extract(answer, _contexts(LAW, RETURN))
    assert cites == [] and invalid == []


def test_no_citation_when_only_a_small_share_of_the_answer_is_in_a_source():
    # content words: delaware court decide dispute payment schedule invoice late fee (9);
    # the law clause holds 2 of them (delaware, court): under half
    answer = "Delaware courts decide disputes about payment schedules, invoices and late fees."
    cites, _ = extract(answer, _contexts(LAW, RETURN))
    assert cites == []


def test_paraphrase_is_cited_and_marked_inferred():
    # content words: obligation confidentiality survive three year after termination (7); [2] holds 6
    answer = "The obligations of confidentiality survive for three years after termination."
    cites, _ = extract(answer, _contexts(LAW, SURVIVAL, RETURN))
    assert [c.n for c in cites] == [2] and cites[0].inferred is True
    assert cites[0].to_json()["inferred"] is True and cites[0].quote in SURVIVAL
    # a marker the model wrote is used as it is, never marked inferred
    cites, _ = extract("Delaware law governs [1].", _contexts(LAW, SURVIVAL))
    assert [c.n for c in cites] == [1] and cites[0].inferred is False and cites[0].to_json()["inferred"] is False


def test_abstention_and_one_word_answers_infer_nothing():
    assert extract("The documents do not say.", _contexts(LAW))[0] == []
    assert extract("Yes.", _contexts(LAW))[0] == []


EV = "Confidentiality obligations under this Agreement survive termination for a period of three (3) years"


def _rec(id_, citations):
    ctxs = [{"n": 1, "rank": 1, "doc": "nda.pdf", "page": 1, "page_end": 1, "text": SURVIVAL},
            {"n": 2, "rank": 2, "doc": "nda.pdf", "page": 2, "page_end": 2, "text": LAW}]
    return {"id": id_, "status": "ok", "retrieval_only": False, "mode": "retrieved", "prompt_tokens": 100,
            "cached_tokens": 0, "completion_tokens": 5, "timings": {"total_s": 1.0}, "answer": "Three years.",
            "abstained": False, "citations": citations, "invalid_citations": [], "contexts": ctxs}


def test_eval_never_counts_an_inferred_citation_as_precise():
    from ragkit.config import load_settings
    from ragkit.eval.report import render_md
    from ragkit.eval.run import score

    items = [EvalItem(id=f"q{k}", question="How long?", doc="nda.pdf", answers=["three"], evidence=EV) for k in (1, 2, 3)]
    recs = {
        "q1": _rec("q1", [{"n": 1}]),  # marked, holds the evidence
        "q2": _rec("q2", [{"n": 1, "inferred": True}]),  # inferred, holds the evidence: not precise
        "q3": _rec("q3", [{"n": 2}]),  # marked, the wrong source
    }
    rep = score(items, recs, load_settings())
    rows = {r["id"]: r for r in rep["questions"]}
    assert (rows["q2"]["citation_precision"], rows["q2"]["valid_citation"]) == (None, False)
    assert (rows["q2"]["n_citations"], rows["q2"]["n_inferred_citations"]) == (0, 1)
    m = rep["metrics"]
    assert m["citation_precision"] == pytest.approx((1.0 + 0.0) / 2)  # q1 and q3, the marked ones
    assert m["valid_citation_rate"] == pytest.approx(1 / 3)  # only q1 has a marked citation holding the evidence
    assert m["citations_inferred_share"] == pytest.approx(1 / 3)  # 1 of the 3 citations
    assert m["inferred_citation_precision"] == 1.0  # reported apart
    md = render_md({**rep, "run": {"set": "s.jsonl"}})
    assert "| citations_inferred_share | 0.333 |" in md and "| citation_precision | 0.500 |" in md


def test_compare_flags_a_rise_in_inferred_citations():
    from ragkit.eval.report import compare

    a = {"metrics": {"citations_inferred_share": 0.2}}
    b = {"metrics": {"citations_inferred_share": 0.5}}
    assert compare(a, b)["regressions"] == ["citations_inferred_share"]
    assert compare(b, a)["regressions"] == []
