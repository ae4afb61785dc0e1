"""Tables in real SEC 10-Q filings stay whole: a row is chunked together with its column
header, and prose pages stay prose."""

from __future__ import annotations

import re

import pytest
from conftest import CORPORA, SHARED

from ragkit.ingest.loaders import load
from ragkit.ingest.sections import build_sections, chunk_sections

DOCS = SHARED / "sec-10q-docugami" / "docs"

pytestmark = pytest.mark.skipif(not DOCS.exists(), reason="shared SEC 10-Q corpus not present")


@pytest.fixture(scope="module")
def embedder():
    from ragkit.config import load_settings
    from ragkit.embed import load_embedder

    return load_embedder(load_settings())


def _chunks(name: str, embedder):
    blocks = load(DOCS / name)
    return blocks, chunk_sections(build_sections(blocks), embedder.count_tokens, embedder.max_tokens, 40)


@pytest.mark.parametrize(
    "name, page, row, header",
    [
        # income statement: the row and both period columns
        ("2023 Q1 AAPL.pdf", 4, "| Total net sales | 117,154 | 123,945 |",
         ["Three Months Ended December 31, 2022", "Three Months Ended December 25, 2021"]),
        # four period columns, a dash for a nil value
        ("2023 Q2 NVDA.pdf", 3, "| Acquisition termination cost | — | — | — | 1,353 |",
         ["Three Months Ended July 30, 2023", "Six Months Ended July 31, 2022"]),
        # percentages with the '%' as a separate glyph run
        ("2023 Q1 AAPL.pdf", 21, "| Total gross margin percentage | 43.0 % | 43.8 % |",
         ["Three Months Ended December 31, 2022"]),
    ],
)
def test_a_table_row_is_chunked_with_its_column_header(embedder, name, page, row, header):
    blocks, chunks = _chunks(name, embedder)
    tables = [b for b in blocks if b.kind == "table" and b.page == page]
    assert tables, f"no table found on page {page} of {name}"
    hits = [c for c in chunks if row in c.text]
    assert len(hits) == 1, (row, [c.text[:200] for c in chunks if "Total" in c.text][:5])
    chunk = hits[0]
    assert chunk.kind == "table" and chunk.page_start == page
    head = chunk.text.splitlines()[0]
    for h in header:
        assert h in head, (h, head)
    assert chunk.text.splitlines()[1].startswith("|---")
    assert chunk.tokens <= embedder.max_tokens


def test_big_table_split_by_rows_repeats_the_period_header(embedder):
    """Amazon's cash-flow statement is longer than one chunk: every piece starts with the header."""
    blocks, chunks = _chunks("2022 Q3 AMZN.pdf", embedder)
    page3 = [c for c in chunks if c.kind == "table" and c.page_start == 3]
    assert len(page3) >= 2
    heads = {c.text.splitlines()[0] for c in page3}
    assert len(heads) == 1 and "Nine Months Ended September 30, 2022" in heads.pop()
    assert any("| Net income (loss) | 3,156 | 2,872 | 19,041 | (3,000) |" in c.text for c in page3)


def test_no_number_is_lost_on_a_table_page():
    """Every number of the page's text layer is in the blocks (tables and prose together)."""
    import pypdfium2 as pdfium

    pdf = pdfium.PdfDocument(str(DOCS / "2023 Q1 AAPL.pdf"))
    raw = pdf[3].get_textpage().get_text_range()
    blocks = [b for b in load(DOCS / "2023 Q1 AAPL.pdf") if b.page == 4]
    out = " ".join(b.text for b in blocks)
    for num in re.findall(r"\(?\d[\d,.]*\)?", raw):
        assert num in out, num
    prose = [b for b in blocks if b.kind == "text"]
    assert any("CONDENSED CONSOLIDATED STATEMENTS OF OPERATIONS" in b.text for b in prose)
    assert any(b.text.startswith("See accompanying Notes") for b in prose)


@pytest.mark.parametrize("name, page", [("2023 Q1 AAPL.pdf", 18), ("2023 Q1 AAPL.pdf", 31), ("2023 Q2 NVDA.pdf", 33)])
def test_prose_pages_stay_prose(name, page):
    import pypdfium2 as pdfium

    blocks = [b for b in load(DOCS / name) if b.page == page]
    assert blocks and all(b.kind == "text" for b in blocks)
    # pdfium marks a breakable hyphen U+FFFE; the loader reads it as "-" (ragkit/ingest/loaders.py)
    raw = " ".join(pdfium.PdfDocument(str(DOCS / name))[page - 1].get_textpage().get_text_range().replace("\ufffe", "-").split())
    got = " ".join(" ".join(b.text for b in blocks).split())
    # the same words, in the same order, as before tables existed (modulo a dropped page number)
    assert got.replace(" ", "")[:2000] in raw.replace(" ", "").replace("- ", "")


def test_contract_pdfs_have_no_tables():
    for pdf in sorted(CORPORA.glob("*.pdf")):
        assert not [b for b in load(pdf) if b.kind == "table"], pdf.name


FILINGS = SHARED / "financebench-dev" / "pdfs"


@pytest.fixture(scope="module")
def filing_tables():
    """The table blocks of two financebench-dev 10-Ks, by page (read once for the tests below)."""
    if not FILINGS.exists():
        pytest.skip(f"the shared corpora are not at {SHARED} (set RAGKIT_SHARED_CORPORA)")
    out: dict[str, dict[int, list[str]]] = {}
    for name in ("PEPSICO_2022_10K.pdf", "ACTIVISIONBLIZZARD_2019_10K.pdf"):
        by_page: dict[int, list[str]] = {}
        for b in load(FILINGS / name):
            if b.kind == "table":
                by_page.setdefault(b.page, []).append(b.text)
        out[name] = by_page
    return out


def _table_with(tables: list[str], row: str) -> str:
    return next(t for t in tables if row in t)


def test_a_statement_that_runs_onto_the_next_page_keeps_its_year_columns(filing_tables):
    """Activision Blizzard's 2019 10-K: the cash-flow table of page 119 runs onto page 120,
    whose part has no header of its own; it is read under the years of page 119."""
    t = _table_with(filing_tables["ACTIVISIONBLIZZARD_2019_10K.pdf"][120], "| Cash paid for interest | 86 | 150 | 145 |")
    head = t.split("\n", 1)[0]
    assert re.search(r"\| 2019 \|.*2018.*\| 2017 \|", head), head


def test_a_nil_cell_with_its_currency_sign_keeps_its_row_in_the_table(filing_tables):
    """PepsiCo's 2022 10-K, page 109: "Cost of sales $ — $ 1 $ 32" is the table's first row;
    read as text, it cut the table off from its header "2022 2021 2020"."""
    t = _table_with(filing_tables["PEPSICO_2022_10K.pdf"][109], "| Cost of sales | $ — | $ 1 | $ 32 |")
    assert t.startswith("|  | 2022 | 2021 | 2020 |\n"), t[:80]


def test_a_table_broken_by_label_lines_keeps_its_header(filing_tables):
    """PepsiCo's balance sheet (page 66) breaks at "Commitments and contingencies"; the
    equity rows below keep the year columns."""
    t = _table_with(filing_tables["PEPSICO_2022_10K.pdf"][66], "| Retained earnings | 67,800 | 65,165 |")
    assert t.startswith("|  | 2022 | 2021 |\n"), t[:80]


@pytest.mark.complete
def test_a_figure_computed_from_a_real_income_statement_shows_its_cells(tmp_path):
    """Apple's 10-Q ingested and asked on the product path: an answer's operating margin,
    which no page of the filing writes, is shown as the computation of the two cells it
    comes from, each named by its row and its period column, and is not flagged; a margin
    no two cells give stays flagged."""
    from ragkit.answer.claims import attribute
    from ragkit.config import load_settings
    from ragkit.ingest import ingest
    from ragkit.retrieve import retrieve
    from ragkit.session import Session

    settings = load_settings(store=tmp_path / "store")
    assert not ingest([DOCS / "2023 Q1 AAPL.pdf"], settings).failed
    session = Session(settings)
    r = retrieve("What were Apple's total net sales and operating income in the quarter ended December 31, 2022?",
                 session)
    ctxs = r.prompt.contexts
    (n,) = [c.n for c in ctxs if "| Operating income | 36,016 | 41,488 |" in c.text][:1]
    (c,) = attribute(f"Apple's operating margin was 30.74% in the quarter ended December 31, 2022 [{n}].", ctxs,
                     session.embedder)
    assert c.missing_figures == [] and len(c.computed) == 1, c
    comp = c.computed[0].to_json()
    assert comp["formula"] == "36,016 / 117,154 x 100 = 30.74%"
    assert [x["label"] for x in comp["cells"]] == ["Operating income · Three Months Ended December 31, 2022",
                                                    "Total net sales · Three Months Ended December 31, 2022"]
    (bad,) = attribute(f"Apple's operating margin was 32.5% in the quarter ended December 31, 2022 [{n}].", ctxs,
                       session.embedder)
    assert bad.missing_figures == ["32.5%"] and bad.computed == [] and not bad.supported
    session.close()
