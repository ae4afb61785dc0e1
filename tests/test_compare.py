"""Clause comparison across NDAs."""

from __future__ import annotations

import json

import pytest
from conftest import without_label_model
from typer.testing import CliRunner

from ragkit.cli import app
from ragkit.compare import YES_NO, clause_quote, compare, load_checklist, to_html, to_markdown, unsupported_figures, wording_changes
from ragkit.errors import ConfigError, UsageError


def test_builtin_nda_checklist_covers_contractnli_and_more():
    name, items = load_checklist("nda")
    ids = {i.id for i in items}
    assert name == "nda"
    assert {f"nda-{n}" for n in (1, 2, 3, 4, 5, 7, 8, 10, 11, 12, 13, 15, 16, 17, 18, 19, 20)} <= ids  # the 17 hypotheses
    assert {"term", "governing-law", "remedies", "assignment"} <= ids
    assert all(i.hypothesis for i in items if i.id.startswith("nda-"))


def test_checklist_files_are_validated(tmp_path):
    good = tmp_path / "mine.toml"
    good.write_text('name = "mine"\n[[items]]\nid = "a"\ntitle = "A"\nquestion = "Is there a term?"\n')
    assert load_checklist(str(good))[1][0].question == "Is there a term?"
    bad = tmp_path / "bad.toml"
    bad.write_text('[[items]]\nid = "a"\n')
    with pytest.raises(ConfigError, match="not valid"):
        load_checklist(str(bad))
    dup = tmp_path / "dup.toml"
    dup.write_text('[[items]]\nid="a"\ntitle="A"\nquestion="q"\n[[items]]\nid="a"\ntitle="B"\nquestion="q"\n')
    with pytest.raises(ConfigError, match="unique"):
        load_checklist(str(dup))
    with pytest.raises(ConfigError, match="not found"):
        load_checklist("nope")


def test_checklist_ids_are_the_contractnli_hypothesis_ids():
    """Each hypothesis item carries ContractNLI's own id (nda-1 ... nda-20): the scoring
    joins on it. Checked against the committed set, whose questions are phrased from the
    hypothesis text of each id (an earlier checklist had the ids shuffled)."""
    from pathlib import Path

    from ragkit.eval.sets import load_set, nli_question

    question_of = {}
    for it in load_set(Path(__file__).parents[1] / "eval" / "sets" / "contractnli-dev.jsonl"):
        question_of.setdefault(it.tags[0], it.question)
    items = [i for i in load_checklist("nda")[1] if i.hypothesis]
    assert len(items) == 17 and set(question_of) == {i.id for i in items}
    for i in items:
        assert question_of[i.id] == nli_question(i.hypothesis), i.id


def test_wording_changes_lists_what_a_lawyer_would_mark_up():
    a = "Recipient’s obligations will survive for the Confidentiality Period, despite expiration of this NDA."
    b = "The Receiving Party’s obligations will survive for the Term of Confidentiality, despite expiration of this MNDA."
    changes = wording_changes(a, b)
    assert ("Recipient’s", "The Receiving Party’s") in changes and ("NDA", "MNDA") in changes
    assert any("Confidentiality Period" in x and "Term of Confidentiality" in y for x, y in changes)
    assert wording_changes(a, a) == []
    assert wording_changes(a, "Delaware law governs every dispute arising hereunder.") is None


def test_clause_quote_keeps_the_lead_in_of_a_list_item():
    import ragkit.compare
    from ragkit.evidence.words import words

    text = ("3. Exceptions. The Receiving Party’s obligations do not apply to information that it can demonstrate: "
            "(a) is or becomes publicly available; (b) it rightfully knew before; (c) it rightfully obtained from a third party; "
            "or (d) it independently developed without using the Confidential Information.")
    want = words("Independent development May the receiving party independently develop similar information?")
    q = clause_quote(text, want, {})
    assert q.startswith("The Receiving Party’s obligations do not apply") and "(d) it independently developed" in q
    assert "(a) is or becomes" not in q
    # the words are stemmed by the lexical index's tokenizer: clause_quote takes no stemmer
    # (its `stem` argument was ignored), so the argument after the weights is the limit
    short = clause_quote(text, want, {}, 60)
    assert len(short) == 60 and short.endswith("…") and q.startswith(short[:-1])
    assert not hasattr(ragkit.compare, "_stemmer")


def test_unsupported_figures_flags_numbers_the_document_does_not_hold():
    from types import SimpleNamespace as C

    ctx = [C(text="1. Term. This NDA expires at the end of the NDA Term. Obligations survive for three (3) years.")]
    assert unsupported_figures("The term is 12 months [1].", ctx) == ["12 months"]
    assert unsupported_figures("The agreement lasts for 1 year.", ctx) == ["1 year"]  # "1." is a section number
    assert unsupported_figures("Obligations survive three (3) years [1].", ctx) == []
    assert unsupported_figures("Obligations survive 3 years.", ctx) == []
    assert unsupported_figures("The agreement lasts two years.", ctx) == ["two years"]
    assert unsupported_figures("It expires at the end of the NDA Term [1].", ctx) == []
    assert unsupported_figures("A fee of $5,000 applies.", ctx) == ["5000"]


@pytest.mark.complete
def test_a_document_missing_from_the_store_is_an_error_not_an_omission(nda_store):
    with pytest.raises(UsageError, match="no ingested document matches"):
        compare(["bonterms-mutual-nda-v1.pdf", "missing-nda.pdf"], nda_store, items=["term"])
    with pytest.raises(UsageError, match="unknown checklist item"):
        compare(["bonterms-mutual-nda-v1.pdf"], nda_store, items=["no-such-item"])


def test_compare_two_ndas_json_md_html(nda_store, tmp_path):
    docs = ["bonterms-mutual-nda-v1.pdf", "ai-osi-stack-mutual-nda.md"]
    c = compare(docs, nda_store, items=["governing-law"])
    j = c.to_json()
    assert j["docs"] == docs and [r["id"] for r in j["rows"]] == ["governing-law"]
    row = j["rows"][0]
    assert set(row["findings"]) == set(docs)
    for d in docs:
        f = row["findings"][d]
        assert f["label"] in ("Found", "Not mentioned")  # an open question, not yes/no
        assert f["confidence"] is None
        assert f["doc"] == d and f["prompt_tokens"] > 0
        if f["quote"]:
            assert f["section"] or f["page"]
    assert j["cost"]["prefilled_tokens_total"] == sum(j["cost"]["prefilled_tokens"].values()) > 0
    md = to_markdown(c)
    assert md.count("\n| Governing law |") == 1 and all(d in md for d in docs)
    page = to_html(c, {docs[0]: str(tmp_path / "b.pdf")})
    assert page.startswith("<!doctype html>") and "<table>" in page and "Governing law" in page
    if row["findings"][docs[0]]["quote"] and row["findings"][docs[0]]["page"]:
        assert "b.pdf#page=" in page


@pytest.mark.complete
def test_compare_cli_json(nda_store):
    res = CliRunner().invoke(app, ["compare", "bonterms-mutual-nda-v1.pdf", "--items", "term", "--store", str(nda_store.store), "--json"],
                             env={"RAGKIT_GENERATOR__N_CTX": "2048", "RAGKIT_GENERATOR__MAX_TOKENS": "96"})
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    assert out["rows"][0]["id"] == "term" and "bonterms-mutual-nda-v1.pdf" in out["rows"][0]["findings"]
    res = CliRunner().invoke(app, ["compare", "nope.pdf", "--store", str(nda_store.store)])
    assert res.exit_code == 2 and "no ingested document" in res.output


@pytest.mark.complete
def test_compare_two_templates_quotes_the_right_clauses(nda_store):
    """The issue's acceptance check: Bonterms vs Common Paper on term, retention of copies,
    independent development and governing law, each with a checkable quote from the
    clause that governs it; Yes/No labels come with the model's confidence."""
    docs = ["bonterms-mutual-nda-v1.pdf", "common-paper-mutual-nda-v1-standard-terms.md"]
    nda_store = without_label_model(nda_store)  # the generator's path (the label model's: test_label_model.py)
    c = compare(docs, nda_store, items=["term", "nda-20", "nda-12", "governing-law"])
    rows = {r.item.id: r for r in c.rows}
    for d in docs:
        term, keep, indep, law = (rows[i].findings[d] for i in ("term", "nda-20", "nda-12", "governing-law"))
        assert "Term" in (term.section or "") and ("expires" in term.quote or "survive" in term.quote)
        # the 0.5B model's term is not the clause's ("1 year"; from the packed units, "the Term of
        # NDA", which restates the question): the note sends the reader to the quote
        assert term.note is None or "document does not contain" in term.note or "rely on the quote" in term.note
        assert "retain" in keep.quote.lower() and "Return or Destruction" in (keep.section or "")
        assert "independently developed" in indep.quote and "Exceptions" in (indep.section or "")
        # the question asks for the law and the courts: either sentence of the clause answers it
        assert ("Governing Law" in law.quote or "jurisdiction" in law.quote) and "Governing Law" in (law.section or "")
        for f in (keep, indep):
            # compare.no_min_confidence unset (the default): the model's scores could not make a
            # No, so an on-point quote without contrary wording is a Yes with no probability
            # shown, and the generator is not run for it (nothing prefilled, no scores)
            assert nda_store.compare.no_min_confidence is None
            assert f.label == "Yes" and f.confidence is None and f.scores == {}, (f.label, f.note)
            assert f.decided_by == "evidence" and f.prompt_tokens == 0
            assert f.evidence["support"] >= nda_store.compare.on_point_support  # on point
    # with a No threshold the generator scores the options, on the quoted clause alone (clause mode)
    scored = nda_store.model_copy(update={"compare": nda_store.compare.model_copy(update={"no_min_confidence": 0.6})})
    f = compare(docs[:1], scored, items=["nda-12"]).rows[0].findings[docs[0]]
    assert f.label in ("Yes", "No") and set(f.scores) == {"Yes", "No"} and f.decided_by == "generator", (f.label, f.note)
    assert 0 < f.prompt_tokens < 300 and f.confidence is not None and f.quote == rows["nda-12"].findings[docs[0]].quote
    # the term clauses differ in wording, and the difference names it
    assert "Term of Confidentiality" in rows["term"].difference or "words it differently" in rows["term"].difference


@pytest.mark.complete
def test_document_mode_scores_labels_on_the_shared_document_prefix(nda_store):
    doc = ["bonterms-mutual-nda-v1.pdf"]
    # n_ctx large enough for the whole document: every item shares it as the prefix
    # (a No threshold: with none the options' scores could not change a label, and nothing is scored)
    s = nda_store.model_copy(update={"compare": nda_store.compare.model_copy(update={"label_context": "document",
                                                                                     "label_model": "off",
                                                                                     "no_min_confidence": 0.6}),
                                     "generator": nda_store.generator.model_copy(update={"n_ctx": 4096})})
    c = compare(doc, s, items=["nda-20", "nda-12"])
    first, second = (c.rows[i].findings[doc[0]] for i in range(2))
    assert first.prompt_tokens > 1500 and second.cached_tokens >= 0.9 * first.prompt_tokens  # one cached prefix
    assert second.label in YES_NO + ["Not mentioned"]
    assert second.label == "Not mentioned" or set(second.scores) == {"Yes", "No"}  # scored on the shared prefix


def test_compare_flags_figures_with_the_shared_claims_check():
    """One mechanism for ask, chat, compare and serve, defined once: compare's figure check
    (the name `ragkit.compare` exports and the one `check_item` calls) is
    ragkit.evidence.figures.unsupported_figures itself, not a second function around it (a
    month the document never names is flagged, as in ask)."""
    from types import SimpleNamespace as C

    import ragkit.answer.claims
    import ragkit.compare.item_label
    import ragkit.evidence.figures

    shared = ragkit.evidence.figures.unsupported_figures
    assert unsupported_figures is shared and ragkit.compare.item_label.unsupported_figures is shared
    assert ragkit.answer.claims.unsupported_figures is shared
    ctx = [C(text="1. Term. This NDA starts on the Effective Date, 1 January 2024, and lasts two (2) years.")]
    assert unsupported_figures("The NDA started on 1 March 2024.", ctx) != []
    assert unsupported_figures("It lasts 2 years [1].", ctx) == []
