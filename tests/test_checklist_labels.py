"""Checklist labels a reader can trust: Not mentioned decided from the evidence, labels
that agree with their quotes, on the sample NDAs with the real default model and the
real embedder (the two cases of the issue, tried as a new user would)."""

from __future__ import annotations

from collections import Counter

import pytest

from ragkit.compare import Finding, Row, agree_on_same_quotes, compare, load_checklist, same_substance, to_html, to_markdown

COVER = "common-paper-mutual-nda-v1.docx"  # Common Paper's cover page: a table of blanks, none of the standard terms
BONTERMS = "bonterms-mutual-nda-v1.pdf"
COMMON = "common-paper-mutual-nda-v1-standard-terms.md"


def test_a_cover_page_does_not_quote_its_nearest_row_in_every_cell(nda_store):
    """The cover page holds none of the standard terms: the items it lacks say Not
    mentioned with no quote, instead of quoting "Purpose | How Confidential Information
    may be used" in all 21 cells."""
    c = compare([COVER], nda_store)
    findings = [r.findings[COVER] for r in c.rows]
    assert len(findings) == len(load_checklist("nda")[1]) == 21
    quotes = Counter(f.quote for f in findings if f.quote)
    assert not quotes or quotes.most_common(1)[0][1] <= 4, quotes.most_common(3)
    hyp = [r.findings[COVER] for r in c.rows if r.item.hypothesis]
    not_on_point = [f for f in hyp if f.label == "Not mentioned" and f.quote is None]
    assert len(not_on_point) >= len(hyp) // 2, [(f.label, f.quote) for f in hyp]
    for f in not_on_point:
        assert f.closest and f.confidence is None  # the nearest passage is kept for the JSON, not quoted
    md = to_markdown(c)
    assert "no clause on point" in md


def test_labels_agree_with_their_quotes_on_the_two_templates(nda_store, tmp_path):
    """Bonterms vs Common Paper: both say the recipient may keep backup copies, so the
    difference column must not say they differ; both exclude independently developed
    information, so neither cell may say No. The cost line is words, not a dict."""
    docs = [BONTERMS, COMMON]
    c = compare(docs, nda_store, items=["term", "governing-law", "nda-20", "nda-12", "nda-16"])
    rows = {r.item.id: r for r in c.rows}
    keep = rows["nda-20"]
    qa, qb = (keep.findings[d].quote for d in docs)
    assert "retain" in qa and "retain" in qb and same_substance(qa, qb)
    assert keep.findings[docs[0]].label == keep.findings[docs[1]].label, keep.difference
    assert not keep.difference.startswith("differs"), keep.difference
    indep = rows["nda-12"]
    for d in docs:
        f = indep.findings[d]
        assert f.label != "No", (d, f.label, f.quote)
        if f.quote:
            assert "independently developed" in f.quote
    page = to_html(c, {d: str(tmp_path / d) for d in docs})
    assert "{'" not in page and "Prefilled tokens: bonterms-mutual-nda-v1.pdf " in page
    assert "(total " in page


def _f(doc: str, label: str, quote: str, yes: float) -> Finding:
    import math

    return Finding(doc=doc, label=label, answer=label, quote=quote, page=1, section=None, path=None,
                   scores={"Yes": math.log(yes), "No": math.log(1 - yes)}, confidence=max(yes, 1 - yes))


@pytest.mark.parametrize("p1,p2,want", [(0.45, 0.9, "Yes"), (0.2, 0.55, "No"), (0.4, 0.62, "Uncertain")])
def test_two_quotes_that_say_the_same_get_one_label(p1, p2, want):
    """Unit test (no model: the scores are given): the label is decided on both quotes'
    scores together; a near tie says Uncertain, and the row never reads "differs"."""
    item = load_checklist("nda")[1][0]
    a = "As an exception, Recipient may retain Confidential Information under its standard backup or record retention policies."
    b = "As an exception, the Receiving Party may retain Confidential Information in accordance with its standard backup or record retention policies."
    row = Row(item, {"a": _f("a", "Yes" if p1 >= 0.5 else "No", a, p1), "b": _f("b", "Yes" if p2 >= 0.5 else "No", b, p2)})
    assert row.findings["a"].label != row.findings["b"].label
    agree_on_same_quotes(row)
    assert row.findings["a"].label == row.findings["b"].label == want
    assert not row.difference.startswith("differs")
    assert "the two quotes say the same" in row.findings["a"].note
    # quotes about different things keep their own labels
    other = Row(item, {"a": _f("a", "No", a, 0.2), "b": _f("b", "Yes", "This NDA is governed by the laws of Delaware.", 0.9)})
    agree_on_same_quotes(other)
    assert other.difference.startswith("differs")
