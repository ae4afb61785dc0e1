"""Word tables keep every column: cells are told apart by their XML element, not by their
text. Built here with python-docx (real .docx files through the real loader)."""

from __future__ import annotations

import docx
import pytest

from ragkit.ingest.loaders import load


def _md_rows(md: str) -> list[list[str]]:
    """Cells of a Markdown table as the loader writes it ('| a | b |'), separator dropped."""
    lines = md.splitlines()
    assert len(lines) >= 2 and set(lines[1]) <= set("|-:"), md
    out = []
    for line in [lines[0]] + lines[2:]:
        assert line.startswith("| ") and line.endswith(" |"), line
        out.append([c.strip() for c in line[2:-2].split(" | ")])
    return out


def _only_table(path) -> str:
    tables = [b for b in load(path) if b.kind == "table"]
    assert len(tables) == 1, [b.text for b in tables]
    return tables[0].text


def test_equal_neighbours_stay_separate_and_merged_cells_span(tmp_path):
    header = ["Segment", "Item", "Q1", "Q2", "Q3"]
    d = docx.Document()
    d.add_heading("Schedule 1 Fees", level=1)
    t = d.add_table(rows=4, cols=5)
    for j, h in enumerate(header):
        t.cell(0, j).text = h
    for j, v in enumerate(["Americas", "Revenue", "—", "—", "1,353"]):
        t.cell(1, j).text = v
    for j, v in enumerate(["", "Costs", "5", "5", "7"]):
        t.cell(2, j).text = v
    for j, v in enumerate(["Europe", "Total", "", "", "9"]):
        t.cell(3, j).text = v
    # a vertical merge: 'Americas' covers rows 1-2 of the Segment column
    vertical = t.cell(1, 0).merge(t.cell(2, 0))
    vertical.text = "Americas"
    # a horizontal merge: one cell across Q1 and Q2 of the last row
    horizontal = t.cell(3, 2).merge(t.cell(3, 3))
    horizontal.text = "First half"
    xml = t._tbl.xml
    assert "w:gridSpan" in xml and "w:vMerge" in xml, "the document really has both kinds of merge"
    path = tmp_path / "fees.docx"
    d.save(str(path))

    rows = _md_rows(_only_table(path))
    width = len(header)
    assert [len(r) for r in rows] == [width] * 4, rows  # no column lost in any row
    assert rows[0] == header
    # equal neighbours ('—', '—' and '5', '5') are two cells each, in their own columns
    assert rows[1] == ["Americas", "Revenue", "—", "—", "1,353"]
    assert rows[2][1:] == ["Costs", "5", "5", "7"]
    # the vertically merged cell reads the same in each row it covers (so a row split off
    # into its own chunk keeps its label), and moves no other cell
    assert rows[2][0] == "Americas"
    # the horizontally merged cell is one cell over Q1-Q2; Q3 keeps its own column
    assert rows[3] == ["Europe", "Total", "First half", "", "9"]
    flat = [c for r in rows for c in r]
    assert flat.count("Americas") == 2 and flat.count("First half") == 1


@pytest.mark.parametrize("cols", [2, 3, 6])
def test_rows_of_identical_values_keep_their_width(tmp_path, cols):
    """A whole row of the same value (a nil row in a schedule) keeps every column."""
    d = docx.Document()
    t = d.add_table(rows=3, cols=cols)
    for j in range(cols):
        t.cell(0, j).text = f"Col {j}"
        t.cell(1, j).text = "—"
        t.cell(2, j).text = "0"
    path = tmp_path / "nil.docx"
    d.save(str(path))
    rows = _md_rows(_only_table(path))
    assert rows == [[f"Col {j}" for j in range(cols)], ["—"] * cols, ["0"] * cols]
