"""The data-room review (`ragkit review`, ragkit.compare.review) and its CUAD scorer
(ragkit.eval.review_score)."""

from __future__ import annotations

import csv
import json

import pytest
from conftest import SHARED

from ragkit.compare.checklist import load_checklist
from ragkit.eval.review_score import jaccard, matches, score_review, slug

# ---------------------------------------------------------------------- the scorer, as CUAD scores

def test_cuad_match_rule_is_word_jaccard_after_normalisation_and_a_name_inside_for_parties():
    gold = "This Agreement shall be governed by the laws of the State of Ohio."
    assert jaccard("this agreement shall be governed by laws of State of Ohio", gold) == 1.0  # articles, case, punctuation
    assert matches("This Agreement shall be governed by the laws of the State of Ohio, without conflicts rules.", gold, "clauses")
    assert not matches("The laws of Ohio.", gold, "clauses")  # 2 of 9 words
    assert matches('between HOF Village, LLC ("HOFV") and Constellation NewEnergy, Inc.', "HOF Village, LLC", "parties")
    assert not matches('between HOF Village, LLC ("HOFV") and Constellation NewEnergy, Inc.', "HOF Village, LLC", "clauses")


def test_aupr_counts_missed_gold_and_unmatched_findings_as_cuad_does():
    gold = {("a", "law"): ["governed by the laws of the state of ohio"], ("a", "mfn"): [],
            ("b", "law"): ["governed by the laws of new york"]}
    findings = [
        {"doc": "a", "item": "law", "text": "governed by the laws of the state of ohio", "score": 3.0},  # tp
        {"doc": "a", "item": "mfn", "text": "the price shall not exceed", "score": 2.0},  # fp: a kind a lacks
        {"doc": "b", "item": "law", "text": "payment within thirty days", "score": 1.0},  # fp; b's gold missed
    ]
    s = score_review(findings, gold)
    assert (s["gold_clauses"], s["cells"], s["empty_cells"]) == (2, 3, 1)
    # thresholds 3, 2, 1: (p, r) = (1, .5), (.5, .5), (.33, .5): the curve never passes recall 0.5
    assert s["max_recall"] == 0.5
    assert s["precision_at_80_recall"] == 0.0
    assert s["aupr"] == 0.0  # one recall value: no area (CUAD's trapezoid over the points reached)
    findings.append({"doc": "b", "item": "law", "text": "governed by the laws of new york", "score": 0.5})
    s = score_review(findings, gold)
    # (1, .5), (.5, .5), (.33, .5), (.5, 1): precision made non-increasing -> area .5 x .5 + ... = 0.5 * (1 + .5)/2... read off:
    assert s["max_recall"] == 1.0
    assert s["precision_at_80_recall"] == 0.5 and s["precision_at_90_recall"] == 0.5
    assert s["aupr"] == pytest.approx(0.25)  # from recall .5 to 1 at precision .5 (monotone: .5 at every point)
    assert s["threshold_at_80_recall"] == 0.5
    assert s["empty_left_empty_at_80"] == 0.0  # mfn's near miss (2.0) is over the 80%-recall threshold
    assert s["per_kind"]["law"]["recall_at_80"] == 1.0


def test_the_cuad_checklist_has_an_item_for_each_of_cuads_41_columns():
    _, items = load_checklist("cuad")
    assert len(items) == 41
    with open(SHARED / "cuad-train" / "master_clauses.csv", encoding="utf-8", newline="") as f:
        header = next(csv.reader(f))
    columns = {slug(c) for c in header if c not in ("Filename", "txt_file") and not c.endswith("-Answer")}
    assert {i.id for i in items} == columns
    assert all(i.question.endswith("? Quote it.") and i.evidence for i in items)


# ---------------------------------------------------------------------- the real path

BIOPURE = "BIOPURECORP_06_30_1999-EX-10.13-AGENCY AGREEMENT.PDF"


@pytest.mark.complete  # 20 s: make test is at its 15 minutes
def test_a_folder_is_reviewed_into_a_workbook_a_lawyer_filters_and_a_second_run_resumes(tmp_path):
    """A real CUAD contract (cuad-10, BioPure's agency agreement) and a corrupt file in one
    folder: the corrupt file is reported by name and the batch goes on (exit 1); the workbook
    holds the governing-law clause with its page, an empty cell for a kind the contract lacks
    (CUAD's gold: no most-favoured-nation clause), a findings sheet, a frozen header and
    filters; a second run reads the contract back from the log instead of reviewing it again."""
    from openpyxl import load_workbook
    from typer.testing import CliRunner

    from ragkit.cli import app

    room = tmp_path / "room"
    room.mkdir()
    (room / BIOPURE).write_bytes((SHARED / "cuad-10" / "pdf" / BIOPURE).read_bytes())
    (room / "broken.pdf").write_bytes(b"%PDF-1.4 this is not a PDF")
    out = tmp_path / "review.xlsx"
    args = ["review", str(room), "--items", "governing-law,most-favored-nation", "--out", str(out), "--store", str(tmp_path / "s")]
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 1, res.output  # one file failed; the rest reviewed
    assert "broken.pdf" in res.output
    wb = load_workbook(out)
    ws = wb["review"]
    header = [c.value for c in ws[1]]
    assert header == ["contract", "pages", "Governing Law", "Most Favored Nation"]
    assert ws.freeze_panes == "B2" and ws.auto_filter.ref == "A1:D2"
    row = {h: c.value for h, c in zip(header, ws[2])}
    assert row["contract"] == BIOPURE
    assert "governed by the laws of the Commonwealth of Massachusetts" in " ".join(row["Governing Law"].split())
    assert row["Governing Law"].startswith("[p. 7 · p ")  # its page (pypdf finds the clause on page 7 of 8), and the probability
    assert row["Most Favored Nation"] is None  # a kind the contract lacks: an empty cell, not a near miss
    found = list(wb["findings"].iter_rows(values_only=True))
    cols = found[0]
    law = [dict(zip(cols, r)) for r in found[1:] if r[cols.index("kind_id")] == "governing-law"]
    assert law[0]["rank"] == 1 and law[0]["page"] == 7 and law[0]["shown"] == 1
    mfn = [dict(zip(cols, r)) for r in found[1:] if r[cols.index("kind_id")] == "most-favored-nation"]
    assert mfn and not any(f["shown"] for f in mfn)  # its near misses kept, with their scores, for another threshold
    assert "not reviewed" in wb.sheetnames
    again = CliRunner().invoke(app, [*args, "--json"])
    assert again.exit_code == 1
    doc = json.loads(again.stdout)
    assert doc["resumed"] == 1 and doc["contracts"][0]["doc"] == BIOPURE
    assert [f["file"] for f in doc["failed"]] == [str((room / "broken.pdf").resolve())]


def test_the_kinds_model_is_pinned_and_its_floor_belongs_to_the_file_it_was_fitted_on(tmp_path, monkeypatch):
    import shutil

    from conftest import assert_a_changed_byte_is_refused

    from ragkit.compare.kinds import load_kinds_model
    from ragkit.config import load_settings
    from ragkit.errors import ConfigError
    from ragkit.models import REGISTRY, resolve
    from ragkit.session import Session

    assert_a_changed_byte_is_refused("cuad-kinds", "kinds-model", tmp_path, monkeypatch, file="kinds.npz")
    monkeypatch.undo()
    session = Session(load_settings(store=tmp_path / "s"))
    shipped = load_kinds_model("cuad-kinds", session)
    assert shipped.floor is not None and len(shipped.kinds) == 41 and shipped.W.shape == (41, 384)
    # the same folder named by path keeps its floor; another kinds.npz under that floor is refused
    folder = tmp_path / "kinds"
    shutil.copytree(resolve("cuad-kinds", "kinds-model", tmp_path), folder)
    assert load_kinds_model(str(folder), session).floor == shipped.floor
    import numpy as np

    np.savez(folder / "kinds.npz", W=shipped.W * 2, b=shipped.b)
    with pytest.raises(ConfigError, match="not the file its floor was fitted on"):
        load_kinds_model(str(folder), session)
    assert REGISTRY["cuad-kinds"].kind == "kinds-model"
