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
