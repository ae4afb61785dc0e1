"""Loaders and sections on real documents from corpora/ and ../shared/corpora."""

from __future__ import annotations

import functools
from pathlib import Path

import pytest
from conftest import CORPORA, SHARED

from ragkit.errors import DocumentError
from ragkit.ingest.loaders import load
from ragkit.ingest.sections import build_sections, chunk_sections, heading_level


@functools.lru_cache(maxsize=4)
def sections_of(path: Path):
    """A document's sections, read once per test session (PepsiCo's 503-page 10-K is read by two tests)."""
    return build_sections(load(path))


def test_pdf_pages_are_numbered_from_the_text_layer():
    blocks = load(CORPORA / "cnli_dev_019.pdf")
    pages = {b.page for b in blocks}
    assert pages == {1, 2}
    enurement = [b for b in blocks if b.text.startswith("7. Enurement")]
    assert enurement and enurement[0].page == 2
    definitions = [b for b in blocks if b.text.startswith("1. Definitions")]
    assert definitions and definitions[0].page == 1


@pytest.mark.parametrize("engine", ["pypdfium2", "pypdf"])
def test_both_pdf_engines_give_the_same_clauses(engine):
    secs = build_sections(load(CORPORA / "bonterms-mutual-nda-v1.pdf", pdf_engine=engine))
    paths = [s.path_str for s in secs]
    for want in ["6. Term and Termination", "10. Governing Law and Courts", "7. Return or Destruction of Confidential Information"]:
        assert any(p.endswith(want) for p in paths), (want, paths)


def test_nda_clauses_land_in_their_own_sections_with_paths():
    secs = sections_of(CORPORA / "ai-osi-stack-mutual-nda.md")
    by_path = {s.path_str: s for s in secs}
    gov = [p for p in by_path if p.endswith("13. Governing Law")]
    assert gov, list(by_path)
    assert "governed by" in " ".join(b.text for b in by_path[gov[0]].blocks).lower()
    # 7.1 nests under the Markdown heading '## 7. Term and Termination'
    term = [p for p in by_path if "7. Term and Termination > 7.1" in p]
    assert term, list(by_path)


def test_docx_headings_lists_and_tables():
    blocks = load(CORPORA / "common-paper-mutual-nda-v1.docx")
    tables = [b for b in blocks if b.kind == "table"]
    assert tables, "the cover page's key terms are a Word table"
    assert any("| Governing Law |" in t.text for t in tables)
    assert all(t.text.splitlines()[1].startswith("|---") for t in tables)


def test_numbering_patterns_english_and_chinese():
    assert heading_level("ARTICLE 5 TERM") == 1
    assert heading_level("Section 2.3 Notices") == 2
    assert heading_level("3.1.8 Backups") == 3
    assert heading_level("1. Definitions. In this Agreement") == 1
    assert heading_level("第二章 保密") == 1
    assert heading_level("第三条 乙方应当保密。") == 3
    assert heading_level("一、总则") == 1
    assert heading_level("（一）定义") == 2
    assert heading_level("(a) the Recipient shall") is None  # a list item stays in its clause
    assert heading_level("The Recipient shall keep it secret.") is None


def test_chinese_contract_sections(tmp_path):
    text = "保密协议\n\n第一章 总则\n\n第一条 本协议所称保密信息，是指披露方提供的技术信息。\n\n第二条 接收方应当对保密信息严格保密。\n\n第二章 期限\n\n第三条 本协议有效期为三年。\n"
    p = tmp_path / "contract.txt"
    p.write_text(text, encoding="utf-8")
    paths = [s.path_str for s in sections_of(p)]
    assert "第一章 总则 > 第二条 接收方应当对保密信息严格保密" in paths
    assert "第二章 期限 > 第三条 本协议有效期为三年" in paths


def test_chunks_fit_the_embedder_and_repeat_the_section_path():
    from ragkit.config import load_settings
    from ragkit.embed import load_embedder

    emb = load_embedder(load_settings())
    long_clause = "5.2 Term. " + " ".join(f"Sentence {i} says the obligations continue for a while." for i in range(120))
    from ragkit.ingest.blocks import Block

    secs = build_sections([Block("ARTICLE 5 TERM"), Block(long_clause), Block("5.3 Notice. Short clause.")])
    chunks = chunk_sections(secs, emb.count_tokens, 128, 20)
    long_chunks = [c for c in chunks if c.section.endswith("5.2 Term")]
    assert len(long_chunks) >= 4, "a long section splits"
    assert all(c.section == "ARTICLE 5 TERM > 5.2 Term" for c in long_chunks)
    assert all(c.tokens <= 128 for c in chunks)
    assert all(c.embed_text().startswith("ARTICLE 5 TERM > 5.2 Term\n") for c in long_chunks)
    # split at sentence boundaries, nothing lost
    assert " ".join(c.text for c in long_chunks).count("Sentence ") == 120


def test_table_split_repeats_its_header():
    from ragkit.config import load_settings
    from ragkit.embed import load_embedder
    from ragkit.ingest.blocks import Block

    emb = load_embedder(load_settings())
    rows = "\n".join(f"| Product {i} | {i * 1000:,} | {i * 7}% |" for i in range(80))
    md = "| Segment | Net sales | Growth |\n|---|---|---|\n" + rows
    chunks = chunk_sections(build_sections([Block(md, kind="table")]), emb.count_tokens, 120, 10)
    assert len(chunks) > 2
    assert all(c.text.startswith("| Segment | Net sales | Growth |\n|---|---|---|") for c in chunks)
    assert sum(c.text.count("| Product ") for c in chunks) == 80


def test_cuad_pdf_page_numbers_match_the_pages():
    pdfs = sorted((SHARED / "cuad-10" / "pdf").glob("*.pdf")) + sorted((SHARED / "cuad-10" / "pdf").glob("*.PDF"))
    if not pdfs:
        pytest.skip("../shared/corpora (the licensed sample filings beside the checkout) is not present")
    import pypdfium2 as pdfium

    pdf = pdfs[0]
    blocks = load(pdf)
    doc = pdfium.PdfDocument(str(pdf))
    n = len(doc)
    assert max(b.page for b in blocks) <= n
    # a block's text is on the page it claims
    for b in blocks[:: max(1, len(blocks) // 15)]:
        page_text = " ".join(doc[b.page - 1].get_textpage().get_text_range().split())
        assert " ".join(b.text.split())[:40].replace("- ", "") in page_text.replace("- ", "") or b.text[:20] in page_text


def test_bad_files_raise_one_clear_reason(tmp_path):
    from badfiles import make_bad_files

    expect = make_bad_files(tmp_path / "bad", CORPORA / "cnli_dev_019.pdf", CORPORA / "cnli_dev_054.docx")
    assert len(expect) >= 15
    for name, word in expect.items():
        with pytest.raises(DocumentError) as info:
            load(tmp_path / "bad" / name, max_docx_inflated_mb=300)
        msg = str(info.value)
        assert name in msg and word.lower() in msg.lower(), msg
        assert "\n" not in msg and "Traceback" not in msg


def test_a_10k_contents_page_opens_no_section_and_a_note_sits_under_its_item():
    """PepsiCo's 2022 10-K (503 pages, financebench-dev): the contents page's entries
    ("Item 8. Financial Statements and Supplementary Data 116") are text, not headings, so the
    restructuring table on page 78 is cited under its Item and Note, not under a contents
    line such as "GLOSSARY 114 29"."""
    import re

    path = SHARED / "financebench-dev" / "pdfs" / "PEPSICO_2022_10K.pdf"
    if not path.exists():
        pytest.skip(f"the shared corpora are not at {SHARED} (set RAGKIT_SHARED_CORPORA)")
    sections = sections_of(path)
    note = next(s for s in sections if any("Total restructuring and impairment charges" in b.text and b.page == 78
                                           for b in s.blocks))
    assert note.path[:2] == ["PART II", note.path[1]] and note.path[1].startswith("Item 7. Management’s Discussion")
    assert note.path[-1].startswith("Note 3 — Restructuring and Impairment Charges")
    assert not any(re.match(r"(Item \d+[A-Z]?\.|GLOSSARY).* \d{1,3}$", p) for s in sections for p in s.path)


@pytest.mark.parametrize("line", ["Section 12 of the Exchange Act) Period Total", "19.7 percent, respectively",
                                  "3.900 % July 2032 $ 1,250", "TM TM TM TM ® ®", "SOFR + 0.850 1.99 267",
                                  "Section 4.1 and will be entitled to a", "Article 5 shall survive termination"])
def test_wrapped_lines_and_table_rows_open_no_section(line):
    assert heading_level(line) is None


def test_contents_entries_are_text_but_the_headings_they_name_are_headings():
    from ragkit.ingest.blocks import Block

    toc = ["ARTICLE 1 Definitions 1", "ARTICLE 2 Licenses 13", "12. CONFIDENTIALITY 12 13", "ARTICLE 13 Term ....... 40"]
    body = ["ARTICLE 1", "Definitions apply throughout.", "12. CONFIDENTIALITY", "Each party keeps the other's secrets."]
    sections = build_sections([Block(t, page=1) for t in toc] + [Block(t, page=2) for t in body])
    assert [s.path for s in sections] == [[], ["ARTICLE 1"], ["12. CONFIDENTIALITY"]]
    assert [b.text for b in sections[0].blocks] == toc


def test_a_financial_statement_is_a_section_under_its_title():
    """Verizon's and PepsiCo's 10-Ks (financebench-dev): each primary statement's tables are
    cited, and searched, under the statement's title, within the Item that holds them;
    PepsiCo's title line ("Consolidated Statement of Income") is followed by lines that were
    read into it ("PepsiCo, Inc. and Subsidiaries Fiscal years ended ...")."""
    folder = SHARED / "financebench-dev" / "pdfs"
    if not folder.exists():
        pytest.skip(f"the shared corpora are not at {SHARED} (set RAGKIT_SHARED_CORPORA)")

    def statement_of(name: str, row: str) -> list[str]:
        return next(s.path for s in sections_of(folder / name)
                    if any(b.kind == "table" and row in b.text for b in s.blocks))

    vz = statement_of("VERIZON_2022_10K.pdf", "| Total current assets |")
    assert vz[0] == "PART II" and vz[1].startswith("Item 8.") and vz[-1] == "Consolidated Balance Sheets"
    pep = statement_of("PEPSICO_2022_10K.pdf", "| Net Revenue | $ 86,392 |")
    assert pep[-1] == "Consolidated Statement of Income", pep


@pytest.mark.parametrize("line, heading", [
    ("CONSOLIDATED STATEMENTS OF CASH FLOWS", True), ("Consolidated Balance Sheets (in millions)", True),
    ("Condensed Consolidated Statements of Operations (Unaudited)", True), ("Notes to Consolidated Financial Statements", True),
    ("Consolidated Balance Sheets F-4", False), ("Consolidated Statements of Cash Flows 73", False),
    ("Notes to Consolidated Financial Statements (continued)", False),
    ("Consolidated Statements of Income for the years ended December 31, 2022 were", False),
    # a bank's sentence case: after the company's name, or with the statement's status
    ("JPMorgan Chase & Co. Consolidated statements of income (unaudited)", True),
    ("Consolidated balance sheets (unaudited)", True),
    ("Consolidated statements of changes in stockholders’ equity (unaudited)", True),
    ("Consolidated statements of income", False),  # a note's caption: stays in its note
    ("Consolidated statements of income for the years ended", False),  # a wrapped line of prose
    ("Refer to the Consolidated balance sheets", False),
    ("JPMorgan Chase & Co. Consolidated statements of income (continued)", False)])
def test_statement_titles_open_a_section_but_contents_lines_and_repeats_do_not(line, heading):
    assert (heading_level(line) is not None) is heading
