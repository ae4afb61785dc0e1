"""The statement lane (ragkit/retrieve/statements.py): a question that names a primary
financial statement, or a figure only a statement gives, gets that statement's table from
a named filing, read by the statement's title as ingest makes it a section."""

from __future__ import annotations

import pytest
from conftest import SHARED

from ragkit.evidence.words import content_words
from ragkit.retrieve import statements as lane
from ragkit.store import Hit

FILINGS = SHARED / "financebench-dev" / "pdfs"


@pytest.mark.parametrize("question, kinds", [
    ("According to the statement of cash flows, how much did the company spend on acquisitions?", ["cash_flow"]),
    ("Based only on the statement of financial position, is the company's working capital positive?", ["balance"]),
    ("Using the P&L, what was the gross margin in fiscal 2021?", ["income"]),
    # named statements in the order named, before any a figure implies
    ("From the income statement and the cash flow statement, what is the D&A margin?", ["income", "cash_flow"]),
    # no statement named: the figures' own statements, most cues first
    ("What was the fixed asset turnover (revenue / average PP&E)?", ["balance", "income"]),
    ("How much did capital expenditures grow from 2021 to 2022?", ["cash_flow"]),
    ("What were total net sales in the quarter?", ["income"]),
    # a contract's question asks for no statement
    ("Which state's law governs this agreement?", []),
    ("How long do the confidentiality obligations survive termination?", []),
])
def test_a_question_names_or_implies_the_statements_it_needs(question, kinds):
    assert lane.asked(question) == kinds


def test_at_most_two_statements_are_asked_for():
    q = "Compare the balance sheet, the income statement and the statement of cash flows."
    assert lane.asked(q) == ["balance", "income"] and lane.asked(q, most=3) == ["balance", "income", "cash_flow"]


@pytest.mark.parametrize("section, kind", [
    ("PART II > Item 8. Financial Statements and Supplementary Data > Consolidated Statements of Operations", "income"),
    ("PART II > Item 8. > Consolidated Statement of Income", "income"),
    ("Item 8. > SQUARE, INC > CONSOLIDATED STATEMENTS OF OPERATIONS", "income"),
    ("PART I > Item 1. > Condensed Consolidated Statements of Operations and Comprehensive Loss (Unaudited)", "income"),
    ("Item 8. > Consolidated Statements of Earnings", "income"),
    ("Item 8. > Consolidated Balance Sheets", "balance"),
    ("Item 8. > Consolidated Statements of Financial Position", "balance"),
    ("Item 8. > Consolidated Statements of Cash Flows", "cash_flow"),
    ("Item 8. > Consolidated Statements of Shareholders’ Equity", "equity"),
    # not a primary statement of the lane: other comprehensive income, a note, prose
    ("Item 8. > Consolidated Statements of Comprehensive Income", None),
    ("Item 8. > Notes to Consolidated Financial Statements > Note 3 — Restructuring and Impairment Charges", None),
    ("PART II > Item 7. Management's Discussion and Analysis > Results of Operations", None),
    ("12. CONFIDENTIALITY", None),
    (None, None),
])
def test_a_statement_is_known_by_the_title_its_section_bears(section, kind):
    assert lane.kind_of(section) == kind


def _hit(i: int, section: str, kind: str = "table", text: str = "| | 2022 |\n|---|---|\n| Revenue | 1 |") -> Hit:
    return Hit(id=f"c{i}", text=text, score=0.0, meta={"doc_id": "d", "section": section, "kind": kind})


def test_the_first_statement_of_a_kind_is_read_up_to_its_next_section():
    """The primary statement comes first; a schedule that repeats its title later (Schedule
    II, a parent-only statement) is not added to it, nor is a table of another section."""
    ops = "Item 8. > Consolidated Statements of Operations"
    whole = [_hit(0, "Item 7. > Results of Operations"), _hit(1, ops, "text"), _hit(2, ops), _hit(3, ops),
             _hit(4, "Item 8. > Consolidated Balance Sheets"), _hit(5, "Item 15. > Schedule II"), _hit(6, ops)]
    (income,) = lane.statements(whole, ["income"])
    assert [h.id for h in income.tables] == ["c2", "c3"]
    assert [s.kind for s in lane.statements(whole, ["cash_flow", "balance", "income"])] == ["balance", "income"]
    assert lane.statements(whole, []) == []


def test_the_rows_a_question_names_choose_the_statements_part():
    q = "What is the working capital ratio: total current assets divided by total current liabilities?"
    assets = _hit(0, "s", text="| | 2020 |\n|---|---|\n| Total current assets | 5 |\n| Total assets | 9 |")
    liabilities = _hit(1, "s", text="| | 2020 |\n|---|---|\n| Total current liabilities | 4 |")
    equity = _hit(2, "s", text="| | 2020 |\n|---|---|\n| Total equity | 3 |\n| Total | 7 |")
    # "Total assets" is named too ("assets"); "Total equity" is not, and "Total" alone names nothing
    assert [lane.rows_named(content_words(q), h) for h in (assets, liabilities, equity)] == [2, 1, 0]
    st = lane.Statement("balance", "d", "s", [equity, assets, liabilities])
    assert [h.id for h in lane.chosen(q, [st])] == ["c0"]  # the most rows named; ties by document order
    assert [h.id for h in lane.chosen(q, [st], per=2)] == ["c0", "c1"]


def test_a_long_filings_statements_are_found_and_the_rows_asked_for_chosen():
    """General Mills' 2020 10-K (financebench-dev, 128 pages, 672 chunks: more than the
    sentence ranking reads), parsed and chunked by ingest's own path, and the shipped
    cross-encoder: the balance sheet of page 50 for a question that names the statement of
    financial position, its part with the current assets; the cash flow statement's part
    with "Purchases of land, buildings, and equipment" for capital expenditures, a row the
    question does not name (the cross-encoder reads it)."""
    if not FILINGS.exists():
        pytest.skip(f"the shared corpora are not at {SHARED} (set RAGKIT_SHARED_CORPORA)")
    from ragkit.config import load_settings
    from ragkit.embed import load_embedder
    from ragkit.ingest.loaders import load
    from ragkit.ingest.sections import build_sections, chunk_sections
    from ragkit.rerankers import load_reranker

    settings = load_settings()
    embedder, reranker = load_embedder(settings), load_reranker(settings)
    chunks = chunk_sections(build_sections(load(FILINGS / "GENERALMILLS_2020_10K.pdf")), embedder.count_tokens,
                            embedder.max_tokens, 40)
    whole = [Hit(id=f"c{i}", text=c.text, score=0.0,
                 meta={"doc_id": "gm", "section": c.section, "kind": c.kind, "page_start": c.page_start})
             for i, c in enumerate(chunks)]
    assert len(whole) > settings.retrieve.unit_pool_max

    q = ("By drawing conclusions from the statement of financial position only, what is the FY2020 working capital "
         "ratio? Define it as total current assets divided by total current liabilities.")
    (balance,) = lane.statements(whole, lane.asked(q))
    assert balance.kind == "balance" and balance.section.endswith("Consolidated Balance Sheets")
    assert {h.meta["page_start"] for h in balance.tables} == {50}
    (best,) = lane.chosen(q, [balance], reranker)
    assert "| Total current assets |" in best.text and best.text.startswith("|  | May 31, 2020 | May 26, 2019 |")

    q = "What were General Mills's capital expenditures in fiscal 2020?"
    (cash,) = lane.statements(whole, lane.asked(q))
    assert cash.section.endswith("Consolidated Statements of Cash Flows") and len(cash.tables) > 3
    (best,) = lane.chosen(q, [cash], reranker)
    assert "| Purchases of land, buildings, and equipment | (460.8) |" in best.text


def test_a_banks_statements_in_sentence_case_are_found():
    """JPMorgan's 2021 Q1 10-Q (financebench-dev, 1,094 chunks): its statements are titled in
    sentence case after the company's name ("JPMorgan Chase & Co. Consolidated statements of
    income (unaudited)"); each is a section, so the lane finds the income statement for a
    question about net revenue, and a note's caption "Consolidated statements of income" (Note
    9) stays inside its note."""
    if not FILINGS.exists():
        pytest.skip(f"the shared corpora are not at {SHARED} (set RAGKIT_SHARED_CORPORA)")
    from ragkit.ingest.loaders import load
    from ragkit.ingest.sections import build_sections

    sections = build_sections(load(FILINGS / "JPMORGAN_2021Q1_10Q.pdf"))
    whole = [Hit(id=f"s{i}.{j}", text=b.text, score=0.0,
                 meta={"doc_id": "jpm", "section": " > ".join(s.path), "kind": b.kind, "page_start": b.page})
             for i, s in enumerate(sections) for j, b in enumerate(s.blocks)]
    q = "What was JPMorgan's total net revenue in the first quarter of 2021?"
    (income,) = lane.statements(whole, lane.asked(q))
    assert income.section.endswith("> Consolidated statements of income (unaudited)"), income.section
    assert any("Total net revenue" in h.text for h in income.tables)
    assert all("Note 9" not in h.meta["section"] for h in income.tables)
    note9 = [s for s in sections if s.path and s.path[-1].startswith("Note 9 ")]
    assert note9 and any("Consolidated statements of income" in b.text for s in note9 for b in s.blocks)
