"""Clause comparison across NDAs."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from ragkit.cli import app
from ragkit.compare import compare, label_of, load_checklist, to_html, to_markdown
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


@pytest.mark.parametrize("answer,label", [
    ("Yes. “Recipient may retain Confidential Information …” [2]", "Yes"),
    ("No, the recipient may not assign [1].", "No"),
    ("Not mentioned.", "Not mentioned"),
    ("The documents do not say.", "Not mentioned"),
    ("", "Not mentioned"),
    ("Yes, No.", "Unclear"),
    ("The agreement lasts two years.", "Unclear"),
])
def test_answer_labels(answer, label):
    assert label_of(answer) == label


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


def test_compare_cli_json(nda_store):
    res = CliRunner().invoke(app, ["compare", "bonterms-mutual-nda-v1.pdf", "--items", "term", "--store", str(nda_store.store), "--json"],
                             env={"RAGKIT_GENERATOR__N_CTX": "2048", "RAGKIT_GENERATOR__MAX_TOKENS": "96"})
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    assert out["rows"][0]["id"] == "term" and "bonterms-mutual-nda-v1.pdf" in out["rows"][0]["findings"]
    res = CliRunner().invoke(app, ["compare", "nope.pdf", "--store", str(nda_store.store)])
    assert res.exit_code == 2 and "no ingested document" in res.output
