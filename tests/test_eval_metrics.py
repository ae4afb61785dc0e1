"""Eval metrics on hand-computed cases (pure functions: no model, no store)."""

from __future__ import annotations

import math

import pytest

from ragkit.eval import metrics as M
from ragkit.eval.sets import EvalItem

# ---------------------------------------------------------------------- normalization

def test_normalize_whitespace_case_hyphenation_quotes():
    assert M.normalize("Confi-\ndential   “Information”\u00a0IS  ‘here’") == "confidential \"information\" is 'here'"
    # a PDF line break inside a word and a real compound compare the same on both sides
    assert M.normalize("third-\n party") == M.normalize("third-party") == "thirdparty"
    assert M.normalize("soft\u00adhyphen — dash") == "softhyphen - dash"
    assert M.normalize("ﬁle") == "file"  # NFKC ligature
    assert M.normalize(None) == ""


# ---------------------------------------------------------------------- evidence

EV = "alpha beta gamma delta epsilon zeta eta theta iota kappa"  # 10 tokens


def test_evidence_exact_containment_after_normalization():
    ctx = "Intro. ALPHA beta\ngamma delta epsilon zeta eta theta iota kappa. Outro."
    assert M.evidence_in_text(EV, ctx)
    assert M.evidence_in_context(EV, ["nothing here", ctx]) is True
    assert M.evidence_in_context(None, [ctx]) is None


def test_evidence_token_coverage_rule_90_percent():
    nine = "kappa iota theta eta zeta epsilon delta gamma beta"  # 9 of 10 tokens, reordered
    eight = "kappa iota theta eta zeta epsilon delta gamma"  # 8 of 10
    assert M.evidence_in_text(EV, nine)  # 9/10 = 0.9 >= 0.9
    assert not M.evidence_in_text(EV, eight)  # 0.8
    # tokens counted with multiplicity: "a a a b" needs three a's
    assert not M.evidence_in_text("a a a a a a a a a b", "a b")
    # coverage is per context: split across two contexts does not count
    assert M.evidence_in_context(EV, ["alpha beta gamma delta epsilon", "zeta eta theta iota kappa"]) is False


def test_evidence_rank_and_mrr():
    ranked = ["unrelated text", "prefix " + EV, EV + " again"]
    assert M.evidence_rank(EV, ranked) == 2
    assert M.evidence_rank(EV, ["no", "nope"]) is None
    assert M.mrr([1, 2, None, 4]) == pytest.approx((1 + 0.5 + 0 + 0.25) / 4)  # 0.4375
    assert M.mrr([]) is None


def test_evidence_split_over_adjacent_chunks():
    a = {"doc": "a.pdf", "chunk_index": 3, "rank": 1, "text": "alpha beta gamma delta epsilon"}
    b = {"doc": "a.pdf", "chunk_index": 4, "rank": 5, "text": "zeta eta theta iota kappa"}
    # both halves are needed: the evidence is complete at rank 5
    assert M.evidence_rank_split(EV, [a, b]) == 5
    assert M.evidence_rank_split(EV, [b, a]) == 5  # order of the list does not matter
    assert M.evidence_rank_split(EV, [a, {**b, "chunk_index": 6}]) is None  # not adjacent
    assert M.evidence_rank_split(EV, [a, {**b, "doc": "b.pdf"}]) is None  # another document
    assert M.evidence_rank_split(None, [a, b]) is None


def test_page_hit_at_k():
    pages = [(1, 1), (2, 4), (7, None)]
    assert M.page_hit(3, pages) is True  # inside 2-4
    assert M.page_hit(3, pages, k=1) is False
    assert M.page_hit(7, pages, k=3) is True  # page_end None = single page
    assert M.page_hit(5, pages) is False
    assert M.page_hit(None, pages) is None
    assert M.page_hit(1, [(None, None)]) is False


def test_doc_recall():
    assert M.doc_recall(["2022 Q3 AAPL.pdf", "2023 Q1 AAPL.pdf"], ["2022 q3 aapl.pdf", "x.pdf"]) == 0.5
    assert M.doc_recall(["a.pdf"], ["A.PDF"]) == 1.0
    assert M.doc_recall([], ["a.pdf"]) is None


# ---------------------------------------------------------------------- numbers

@pytest.mark.parametrize("a,b", [
    ("$1.2 billion", "1,200 million"),
    ("$1.2 billion", "$1,200,000,000"),
    ("1,200 million", "$1,200,000,000"),
    ("$1.2 billion", "$1,201 million"),  # 0.08% apart: rounding
    ("12.5%", "12.5 percent"),
    ("(1,234)", "-1,234"),
    ("$(45) million", "-45,000,000"),
])
def test_numeric_match_equal(a, b):
    assert M.numeric_match(a, b) is True
    assert M.numeric_match(b, a) is True


@pytest.mark.parametrize("a,b", [
    ("$1.2 billion", "$1.3 billion"),
    ("12.5%", "12.5"),  # a percentage is not a plain number
    ("(1,234)", "1,234"),  # parentheses mean negative
    ("$1.2 billion", "$1.2 million"),
])
def test_numeric_match_different(a, b):
    assert M.numeric_match(a, b) is False


def test_extract_numbers_values():
    q = M.extract_numbers("Revenue $82,959 million, margin 43.3%, loss (1,234), years 2022-2023")
    assert [x.value for x in q] == [82_959e6, 43.3, -1234, 2022, 2023]
    assert [x.percent for x in q] == [False, True, False, False, False]
    assert M.numeric_match("no digits", "42") is None


def test_answer_numbers_in_context_scale_free():
    gold = ["Net sales were $82,959 million, up 12.5% in 2022."]
    ctx_full = ["Total net sales (in millions) 82,959 ... growth 12.5 %"]
    ctx_half = ["Total net sales (in millions) 82,959"]
    assert M.answer_numbers_in_context(gold, ctx_full) == 1.0
    assert M.answer_numbers_in_context(gold, ctx_half) == 0.5  # 2022 is a year: not counted
    assert M.answer_numbers_in_context(["three years"], ctx_full) is None


# ---------------------------------------------------------------------- answers

def test_answer_match_any_all():
    pred = "Confidentiality lasts three (3) years [1] under Manitoba law."
    assert M.answer_match(pred, ["five years", "three (3) years"], "any") is True
    assert M.answer_match(pred, ["three (3) years", "Manitoba"], "all") is True
    assert M.answer_match(pred, ["three (3) years", "Ontario"], "all") is False
    assert M.answer_match(pred, [], "any") is None
    assert M.answer_match("Sales were 1,200 million dollars", ["$1.2 billion"]) is True  # via numbers


def test_answer_match_is_whole_words_and_whole_numbers():
    """Gold "no" is not in "The documents do not say.", gold "14" is not in "140" (both
    matched as substrings before): whole words and numbers only."""
    assert M.answer_match("The documents do not say.", ["no"]) is False
    assert M.answer_match("The fee is due within 140 days.", ["14"]) is False
    assert M.answer_match("The rate is 14.5 percent.", ["14"]) is False
    assert M.answer_match("No, it may not.", ["no"]) is True
    assert M.answer_match("within 14 days [2]", ["14"]) is True
    assert M.answer_match("A new submission is not necessary.", ["not necessary"]) is True
    assert M.answer_match("It is unnecessary.", ["necessary"]) is False


def test_answer_body_drops_the_unverified_head_and_the_places_of_quotes():
    body = M.answer_body("Not verified against the sources. The passages that answer the question best:\n"
                         "“A new fee is not necessary.” [3] (fda.pdf, p. 6, § 5 (Permitted))")
    assert body == "“A new fee is not necessary.”"
    assert M.answer_match(body, ["6"]) is False  # the page is no figure of the answer
    assert M.outcome_of({"outcome": "unverified", "abstained": False}) == "unverified"
    assert M.outcome_of({"abstained": True}) == "not_found" and M.outcome_of({"answer": "x"}) == "supported"
    assert M.outcome_of({"answer": ""}) == "none"


def test_strip_citations():
    assert M.strip_citations("Three years [1]. Manitoba [2, 3] and [4-5].") == "Three years. Manitoba and."
    assert M.strip_citations(None) == ""


def test_token_f1_squad_style():
    assert M.token_f1("a red cat", ["the black cat"]) == pytest.approx(0.5)  # [red,cat] vs [black,cat]
    assert M.token_f1("cat cat dog", ["cat"]) == pytest.approx(0.5)  # p=1/3, r=1
    assert M.token_f1("The cat sat on the mat.", ["cat sat on mat"]) == 1.0
    assert M.token_f1("dog", ["cat", "a dog!"]) == 1.0  # best over golds
    assert M.token_f1("dog", ["cat"]) == 0.0
    assert M.token_f1("x", []) is None


# ---------------------------------------------------------------------- NLI

@pytest.mark.parametrize("answer,label", [
    ("Yes, the agreement says so [1].", "Entailment"),
    ("**Yes** [2]", "Entailment"),
    ("No. Confidential Information includes business information [1].", "Contradiction"),
    ("Not mentioned.", "NotMentioned"),
    ("No, the agreement does not mention reverse engineering.", "NotMentioned"),
    ("The documents do not say.", "NotMentioned"),
    ("Nothing in section 3 covers it.", None),  # "nothing" is not "no"
    ("The agreement requires notice.", None),
    ("", None),
])
def test_nli_label_mapping(answer, label):
    assert M.nli_label(answer) == label


def test_nli_scores_hand_computed():
    gold = ["Entailment", "Entailment", "Contradiction", "NotMentioned"]
    pred = ["Entailment", "Contradiction", "Contradiction", None]
    s = M.nli_scores(gold, pred)
    assert s["accuracy"] == 0.5
    e, c, n = (s["per_class"][k] for k in ("Entailment", "Contradiction", "NotMentioned"))
    assert (e["precision"], e["recall"]) == (1.0, 0.5) and e["f1"] == pytest.approx(2 / 3)
    assert (c["precision"], c["recall"]) == (0.5, 1.0) and c["f1"] == pytest.approx(2 / 3)
    # NotMentioned has a gold item and no prediction: F1 0, not left out of the macro F1
    assert n["precision"] is None and n["recall"] == 0.0 and n["f1"] == 0.0
    assert (e["support"], c["predicted"]) == (2, 2)
    assert s["macro_f1"] == pytest.approx((2 / 3 + 2 / 3 + 0.0) / 3)
    # majority baseline: Entailment is gold for 2 of 4
    assert s["majority_class"] == "Entailment" and s["majority_accuracy"] == pytest.approx(2 / 4)


def _sk_labels(pred):
    return ["(unparsed)" if p is None else p for p in pred]  # a None prediction is no class


NLI_CASES = {
    "mixed": (["Entailment", "Entailment", "Contradiction", "NotMentioned", "NotMentioned", "Entailment"],
              ["Entailment", "Contradiction", "Contradiction", None, "Entailment", "NotMentioned"]),
    "always-yes": (["Entailment"] * 5 + ["Contradiction"] * 3 + ["NotMentioned"] * 2, ["Entailment"] * 10),
    "always-no-with-unparsed": (["Entailment", "Contradiction", "NotMentioned", "Entailment"],
                                ["Contradiction", "Contradiction", None, "Contradiction"]),
    "predicted-never-gold": (["Entailment", "Entailment", "Contradiction"], ["Entailment", "NotMentioned", "Contradiction"]),
}


@pytest.mark.parametrize("case", sorted(NLI_CASES))
def test_nli_scores_agree_with_scikit_learn(case):
    """Per-class precision / recall / F1 and macro F1 against scikit-learn (a test-only
    dependency). Undefined precision (never predicted) and recall (never gold) are None
    here and NaN there (zero_division=nan); the macro F1 averages the classes that occur
    in gold or prediction."""
    np = pytest.importorskip("numpy")
    sk = pytest.importorskip("sklearn.metrics")
    gold, pred = NLI_CASES[case]
    s = M.nli_scores(gold, pred)
    p, r, f, sup = sk.precision_recall_fscore_support(gold, _sk_labels(pred), labels=list(M.NLI), zero_division=np.nan)
    for i, c in enumerate(M.NLI):
        ours = s["per_class"][c]
        for key, theirs in (("precision", p[i]), ("recall", r[i]), ("f1", f[i])):
            if np.isnan(theirs):
                assert ours[key] is None, (c, key)
            else:
                assert ours[key] == pytest.approx(float(theirs)), (c, key)
        assert ours["support"] == sup[i]
    present = [c for c in M.NLI if c in gold or c in pred]
    macro = sk.f1_score(gold, _sk_labels(pred), labels=present, average="macro", zero_division=np.nan)
    assert s["macro_f1"] == pytest.approx(float(macro))
    assert s["accuracy"] == pytest.approx(sk.accuracy_score(gold, _sk_labels(pred)))


def test_always_one_class_predictor_gets_no_flattering_macro_f1():
    """Always answering "Yes" on 5 Entailment, 3 Contradiction, 2 NotMentioned items, by hand:
    Entailment tp 5, fp 5, fn 0 -> F1 10/15 = 2/3; the two never-predicted classes F1 0;
    macro F1 (2/3 + 0 + 0) / 3 = 2/9 (ignoring the unpredicted classes would say 2/3).
    Accuracy 5/10, the same as the majority-class baseline."""
    from ragkit.config import load_settings
    from ragkit.eval.run import score

    gold, pred = NLI_CASES["always-yes"]
    s = M.nli_scores(gold, pred)
    assert s["per_class"]["Entailment"]["f1"] == pytest.approx(2 / 3)
    assert s["per_class"]["Contradiction"]["f1"] == 0.0 and s["per_class"]["NotMentioned"]["f1"] == 0.0
    assert s["macro_f1"] == pytest.approx(2 / 9)
    assert s["accuracy"] == s["majority_accuracy"] == pytest.approx(0.5)
    # and through the run's scoring, as the report shows it
    items = [EvalItem(id=f"q{k}", question="?", answers=["x"], label=g) for k, g in enumerate(gold)]
    recs = {i.id: _rec([{"n": 1, "rank": 1, "doc": "d", "page": None, "page_end": None, "text": "t"}], id=i.id, answer="Yes.")
            for i in items}
    m = score(items, recs, load_settings())["metrics"]
    assert m["nli_macro_f1"] == pytest.approx(2 / 9)
    assert m["nli_accuracy"] == pytest.approx(0.5) and m["nli_majority_accuracy"] == pytest.approx(0.5)
    assert m["nli_f1_contradiction"] == 0.0


# ---------------------------------------------------------------------- abstention, citations, cost

def test_abstention_precision_recall():
    s = M.abstention_scores([True, True, False, False], [True, False, True, False])
    assert (s["precision"], s["recall"]) == (0.5, 0.5)
    s = M.abstention_scores([False, False], [False, False])
    assert s["precision"] is None and s["recall"] is None


def test_citation_scores():
    assert M.citation_scores(["see " + EV, "other"], EV) == (0.5, True)
    assert M.citation_scores(["other"], EV) == (0.0, False)
    assert M.citation_scores([], EV) == (None, False)
    assert M.citation_scores(["x"], None) == (None, None)


def test_cost_and_percentiles():
    assert M.projected_prefill_s(1060, 106) == pytest.approx(10.0)
    with pytest.raises(ValueError):
        M.projected_prefill_s(10, 0)
    assert M.percentile([4, 1, 3, 2], 50) == 2.5
    assert M.percentile([1, 2, 3, 4], 95) == pytest.approx(3.85)  # pos 2.85 -> 3 + 0.85
    assert M.percentile([7], 95) == 7.0
    assert M.percentile([], 50) is None
    assert M.mean([True, False, None, 1.0]) == pytest.approx(2 / 3)


# ---------------------------------------------------------------------- per-question scoring

def _rec(contexts, **kw):
    rec = {"id": "q", "status": "ok", "retrieval_only": False, "mode": "retrieved", "prompt_tokens": 530,
           "cached_tokens": 0, "completion_tokens": 10, "timings": {"total_s": 1.0}, "answer": "", "abstained": False,
           "citations": [], "invalid_citations": [], "contexts": contexts}
    rec.update(kw)
    return rec


def test_score_item_ranks_by_retrieval_not_prompt_order():
    from ragkit.eval.run import score_item

    ctxs = [  # prompt order n=1..3; retrieval rank differs
        {"n": 1, "rank": 3, "doc": "a.pdf", "page": 1, "page_end": 1, "text": EV},
        {"n": 2, "rank": 1, "doc": "a.pdf", "page": 2, "page_end": 2, "text": "unrelated"},
        {"n": 3, "rank": 2, "doc": "a.pdf", "page": 5, "page_end": 6, "text": "also unrelated"},
    ]
    item = EvalItem(id="q", question="?", doc="a.pdf", answers=["alpha beta"], evidence=EV, page=1)
    row = score_item(item, _rec(ctxs, answer="It is alpha beta [1] and [3].",
                                citations=[{"n": 1}, {"n": 3}]), rate_tok_s=106.0)
    assert row["evidence_in_context"] is True
    assert row["evidence_rank"] == 3 and row["rr"] == pytest.approx(1 / 3)
    assert row["page_hit"] is True and row["page_hit_at_1"] is False and row["page_hit_at_3"] is True
    assert row["answer_match"] is True
    assert row["citation_precision"] == 0.5 and row["valid_citation"] is True
    assert row["projected_prefill_s"] == pytest.approx(5.0)
    assert row["failed"] is False

    unans = EvalItem(id="u", question="?", doc="a.pdf", answerable=False)
    row = score_item(unans, _rec(ctxs, answer="It is 5."), rate_tok_s=106.0)
    assert row["should_abstain"] is True and row["abstained"] is False and row["failed"] is True
    assert "should have abstained" in row["why"]

    nli = EvalItem(id="n", question="?", answers=["No"], label="Contradiction")
    row = score_item(nli, _rec(ctxs, answer="Yes [1]."), rate_tok_s=106.0)
    assert (row["nli_gold"], row["nli_pred"], row["failed"]) == ("Contradiction", "Entailment", True)
    assert "should_abstain" not in row  # NLI questions are scored by label, not abstention


def test_wrongly_refused_counts_an_unverified_answer_with_the_gold_passage_apart():
    """eval's refusal figures (issue 23): an answerable question is wrongly refused when its
    outcome is not supported, unless it is unverified with the gold evidence among the
    passages shown; abstained (for precision and recall) means not_found only."""
    from ragkit.config import load_settings
    from ragkit.eval.run import score

    ctx = [{"n": 1, "rank": 1, "doc": "a.pdf", "page": 1, "page_end": 1, "text": EV}]
    shown = {"outcome": "unverified", "answer": "Not verified against the sources. ...", "passages": [{"quote": EV}]}
    items = [EvalItem(id=i, question="?", doc="a.pdf", answers=["alpha beta"], evidence=EV) for i in "abcd"] + [
        EvalItem(id="u", question="?", doc="a.pdf", answerable=False)]
    recs = {
        "a": _rec(ctx, id="a", answer="It is alpha beta.", outcome="supported"),
        "b": _rec(ctx, id="b", **shown),  # unverified, the gold passage shown: not a refusal
        "c": _rec(ctx, id="c", outcome="unverified", answer="Not verified ...", passages=[{"quote": "Something else entirely."}]),
        "d": _rec(ctx, id="d", answer="The documents do not say.", abstained=True, outcome="not_found"),
        "u": _rec(ctx, id="u", answer="The documents do not say.", abstained=True, outcome="not_found"),
    }
    rep = score(items, recs, load_settings())
    by = {r["id"]: r for r in rep["questions"]}
    assert [by[i]["wrongly_refused"] for i in "abcd"] == [False, False, True, True]
    assert by["b"]["unverified_with_evidence"] is True and by["b"]["abstained"] is False
    assert by["b"]["answer_or_quote_match"] is True and by["b"]["answer_match"] is False
    m = rep["metrics"]
    assert (m["wrongly_refused"], m["n_answerable"], m["unverified_with_evidence"]) == (2, 4, 1)
    assert (m["n_supported"], m["n_unverified"], m["n_not_found"]) == (1, 2, 2)
    assert m["abstain_precision"] == 0.5 and m["abstain_recall"] == 1.0  # d and u not_found, only u should be


def test_score_aggregates_null_where_no_data():
    from ragkit.config import load_settings
    from ragkit.eval.run import score

    items = [EvalItem(id="a", question="?", answers=["x"]), EvalItem(id="b", question="?", answers=["y"])]
    recs = {"a": _rec([{"n": 1, "rank": 1, "doc": "d", "page": None, "page_end": None, "text": "x"}], id="a", answer="x [1]"),
            "b": {"id": "b", "status": "error", "error": "no ingested document"}}
    rep = score(items, recs, load_settings())
    m = rep["metrics"]
    assert m["n_questions"] == 2 and m["n_answered"] == 1 and m["n_errors"] == 1
    for k in ("evidence_in_context", "page_hit", "mrr", "nli_accuracy", "abstain_precision", "abstain_recall", "citation_precision"):
        assert m[k] is None, k
    # "a" matches, "b" errored: a miss, not left out
    assert m["answer_match"] == 0.5 and m["token_f1"] == 0.5
    assert m["prompt_tokens_mean"] == 530 and math.isclose(m["projected_prefill_s_mean"], 530 / 106)


def test_quote_matches_evidence():
    span = "Recipient may retain Confidential Information in accordance with its standard backup or record retention policies."
    # a quote inside a longer gold clause, and a longer quote around a short gold span
    assert M.quote_matches_evidence("Recipient may retain Confidential Information in accordance with its standard backup", [span])
    assert M.quote_matches_evidence("As an exception, " + span + " The NDA continues to apply.", [span])
    assert M.quote_matches_evidence("Recipient may retain … standard backup or record retention policies.", ["other text", span])
    assert M.quote_matches_evidence("This NDA is governed by the laws of Delaware.", [span]) is False
    assert M.quote_matches_evidence(None, [span]) is False
    assert M.quote_matches_evidence("anything", []) is None


# ---------------------------------------------------------------------- strict evidence rule

def test_strict_rule_needs_a_contiguous_run_of_80_percent():
    # the whole evidence, or 8 of its 10 tokens unbroken (a page header cut in after them)
    assert M.evidence_in_text_strict(EV, "see " + EV.upper() + " end")
    assert M.evidence_in_text_strict(EV, "alpha beta gamma delta epsilon zeta eta theta PAGE 3 iota kappa")
    # 7 then 3: the longest run is 7 of 10
    assert not M.evidence_in_text_strict(EV, "alpha beta gamma delta epsilon zeta eta PAGE 3 theta iota kappa")
    assert M.evidence_in_text(EV, "alpha beta gamma delta epsilon zeta eta PAGE 3 theta iota kappa")  # loose: yes


def test_strict_rule_rejects_scattered_words_that_the_loose_rule_accepts():
    long_text = ("Kappa is defined in clause 9. The alpha party and the beta party agree that gamma, delta and "
                 "epsilon apply; zeta shall survive. eta and theta are excluded, iota is void.")
    assert M.evidence_in_text(EV, long_text)  # every word is somewhere: the loose rule says found
    assert not M.evidence_in_text_strict(EV, long_text)
    assert M.evidence_rank(EV, [long_text, EV], strict=True) == 2
    assert M.evidence_rank(EV, [long_text, EV]) == 1


def test_strict_rule_over_adjacent_chunks_and_token_counts():
    a = {"doc": "a.pdf", "chunk_index": 3, "rank": 2, "text": "alpha beta gamma delta epsilon"}
    b = {"doc": "a.pdf", "chunk_index": 4, "rank": 4, "text": "zeta eta theta iota kappa"}
    assert M.evidence_rank_split(EV, [a, b], strict=True) == 4
    assert M.evidence_rank_split(EV, [{**a, "text": "epsilon delta gamma beta alpha"}, b], strict=True) is None
    assert M.tokens_through_rank([100, 250, 400], 2) == 350
    assert M.tokens_through_rank([100, 250], None) is None
    assert M.within_tokens(350, 1000, True) is True and M.within_tokens(1350, 1000, True) is False
    assert M.within_tokens(None, 1000, True) is False and M.within_tokens(None, 1000, False) is None


def test_gold_figure_in_top_sources():
    gold = ["Total net sales were $82,959 million."]
    assert M.gold_figure_in(gold, ["Net sales 82,959 (in millions)"]) is True
    assert M.gold_figure_in(gold, ["Net sales 81,797"]) is False
    assert M.gold_figure_in(["It rose in 2023."], ["2023"]) is None  # a year is no figure


def test_score_item_reports_both_rules_and_tokens_to_evidence():
    from ragkit.config import load_settings
    from ragkit.eval.run import score

    scattered = "kappa iota theta eta zeta epsilon delta gamma beta alpha"  # every word, reversed
    ctxs = [
        {"n": 1, "rank": 1, "doc": "a.pdf", "chunk_index": 0, "page": 1, "page_end": 1, "text": scattered, "tokens": 600},
        {"n": 2, "rank": 2, "doc": "a.pdf", "chunk_index": 5, "page": 2, "page_end": 2, "text": EV, "tokens": 500},
    ]
    item = EvalItem(id="q", question="?", doc="a.pdf", answers=["x"], evidence=EV)
    rep = score([item], {"q": {**_rec(ctxs), "id": "q", "retrieval_only": True}}, load_settings())
    row, m = rep["questions"][0], rep["metrics"]
    assert (row["evidence_rank"], row["evidence_rank_strict"]) == (1, 2)
    assert row["tokens_to_evidence"] == 1100
    assert row["evidence_within_1000_tokens"] is False and row["evidence_within_2000_tokens"] is True
    assert m["mrr"] == 1.0 and m["mrr_strict"] == 0.5 and m["evidence_strict"] == 1.0


def test_financebench_dev_is_split_by_company_in_its_set_files():
    """One split for every tool: the committed tune / held files are the converter's, and no
    company has a question on both sides; evidence pages are 1-based (upstream 0-based)."""
    from conftest import ROOT, SHARED

    from ragkit.eval.sets import convert_financebench, load_set

    if not (SHARED / "financebench-dev").exists():
        pytest.skip(f"the shared corpora are not at {SHARED} (set RAGKIT_SHARED_CORPORA)")
    for part in ("tune", "held"):
        committed = [i.to_line() for i in load_set(ROOT / "eval" / "sets" / f"financebench-dev-{part}.jsonl")]
        assert committed == [i.to_line() for i in convert_financebench(SHARED, part)]
    company = {p: {t for i in convert_financebench(SHARED, p) for t in i.tags if t.startswith("company:")}
               for p in ("tune", "held")}
    assert company["tune"] and company["held"] and not company["tune"] & company["held"]
    items = {i.id: i for i in convert_financebench(SHARED)}
    assert len(items) == 31
    restructuring = next(i for i in items.values() if "restructuring costs" in i.question and "Pepsico" in i.question)
    assert (restructuring.doc, restructuring.page) == ("PEPSICO_2022_10K.pdf", 78)


def test_a_ratio_of_two_statements_needs_both_pages_for_the_strict_page_figure():
    from ragkit.eval.run import score_item
    from ragkit.eval.sets import EvalItem

    item = EvalItem(id="q", question="FY2019 fixed asset turnover?", doc="a.pdf", answers=["24.26"], page=69, pages=[69, 70])

    def rec(*pages):
        return {"id": "q", "status": "ok", "retrieval_only": True, "prompt_tokens": 10, "citations": [],
                "invalid_citations": [], "contexts": [
                    {"n": k, "rank": k, "doc": "a.pdf", "page": p, "page_end": p, "text": "x", "chunk_id": f"c{k}",
                     "tokens": 5} for k, p in enumerate(pages, 1)]}

    one, both = score_item(item, rec(12, 70), 100.0), score_item(item, rec(70, 69), 100.0)
    assert (one["page_hit"], one["pages_all_hit"]) == (True, False)
    assert (both["page_hit"], both["pages_all_hit"], both["page_hit_at_1"]) == (True, True, True)
