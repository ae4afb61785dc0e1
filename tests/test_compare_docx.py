"""The comparison memo as a Word document (ragkit.compare.docx; `ragkit compare ...
--format docx --out memo.docx`; the web page's Word export).

The memo under test is a real comparison: two sample NDAs in the real Chroma store,
the real embedder and the default model, written by the command; python-docx reads it
back, LibreOffice renders it to PDF. Only test_flags_are_marked builds its Comparison by
hand (the model cannot be made to produce a flagged finding on demand).
"""

from __future__ import annotations

import io
import os
import re
import shutil
import subprocess
import uuid
from datetime import date

import pytest
from docx import Document
from docx.oxml.ns import qn
from docx.shared import RGBColor
from typer.testing import CliRunner

import ragkit.compare
from ragkit.cli import app
from ragkit.compare import ChecklistItem, Comparison, Finding, Row, cost_line, missing
from ragkit.compare.docx import MEDIA_TYPE, WARN, WARN_FILL, to_docx

BONTERMS = "bonterms-mutual-nda-v1.pdf"
COMMON_MD = "common-paper-mutual-nda-v1-standard-terms.md"
DOCS = [BONTERMS, COMMON_MD]
ITEMS = ["nda-12", "nda-20", "term"]  # in the checklist's order, which the rows keep
SMALL = {"RAGKIT_GENERATOR__N_CTX": "2048", "RAGKIT_GENERATOR__MAX_TOKENS": "96"}


def long_date(d: date) -> str:
    return f"{d.day} {d:%B %Y}"


@pytest.fixture(scope="module")
def memo(nda_store, tmp_path_factory):
    """The command's memo of Bonterms against Common Paper on three items, and the
    Comparison the command computed (recorded on its way through, not recomputed)."""
    out = tmp_path_factory.mktemp("memo") / "memo.docx"
    seen: list[Comparison] = []
    real = ragkit.compare.compare

    def recording(*a, **kw):
        seen.append(real(*a, **kw))
        return seen[-1]

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(ragkit.compare, "compare", recording)
        res = CliRunner().invoke(app, ["compare", *DOCS, "--items", ",".join(ITEMS), "--store", str(nda_store.store),
                                       "--format", "docx", "--out", str(out)], env=SMALL)
    assert res.exit_code == 0, res.output
    assert "PK" not in res.stdout  # the file went to --out, nothing of the zip to stdout
    assert len(seen) == 1 and out.stat().st_size > 0
    return out, seen[0]


def runs(cell) -> list:
    return [r for p in cell.paragraphs for r in p.runs]


def fill_of(cell) -> str | None:
    shd = cell._tc.tcPr.find(qn("w:shd")) if cell._tc.tcPr is not None else None
    return shd.get(qn("w:fill")) if shd is not None else None


def test_memo_has_a_row_per_item_and_each_documents_finding_in_its_cell(memo):
    path, c = memo
    d = Document(str(path))
    text = "\n".join(p.text for p in d.paragraphs)
    assert f"Clause comparison: {BONTERMS} and {COMMON_MD}" in d.paragraphs[0].text
    assert long_date(date.today()) in text and "Checklist: nda" in text
    sec = d.sections[0]
    assert sec.page_width > sec.page_height  # landscape
    assert len(d.tables) == 1
    t = d.tables[0]
    assert [cell.text for cell in t.rows[0].cells] == ["Clause", *DOCS, "Difference"]
    assert t.rows[0]._tr.trPr.find(qn("w:tblHeader")) is not None  # repeated on every page
    assert t.style.name == "Table Grid"
    assert len(t.rows) == 1 + len(ITEMS) and [r.item.id for r in c.rows] == ITEMS
    quoted_pages = 0
    for row, r in zip(t.rows[1:], c.rows):
        cells = row.cells
        assert cells[0].text.startswith(r.item.title) and r.item.question in cells[0].text
        for j, doc in enumerate(DOCS):
            f, cell = r.findings[doc], cells[1 + j]
            assert any(run.bold and run.text == f.label for run in runs(cell)), (doc, r.item.id, cell.text)
            if f.quote:
                assert f"“{f.quote}”" in cell.text
                other = cells[2 - j].text  # the other document's cell holds its own quote, not this one
                assert f.quote not in other or f.quote == (r.findings[DOCS[1 - j]].quote or "")
                if f.page is not None:
                    assert re.search(rf"\(p\. {f.page}\b", cell.text), cell.text
                    quoted_pages += 1
                if f.section:
                    assert f"§ {f.section}" in cell.text
                if f.confidence is not None:
                    assert f"({f.confidence:.0%})" in cell.text
            else:
                assert missing(f) in cell.text
            if f.note:
                assert f"⚠ {f.note}" in cell.text and fill_of(cell) == WARN_FILL
            else:
                assert "⚠" not in cell.text or f.label == "Uncertain"
        assert r.difference in cells[-1].text
    assert quoted_pages >= 1  # the Bonterms PDF has pages: at least one quote shows its page
    assert d.paragraphs[-1].text == cost_line(c)


def test_flags_are_marked():
    """A hand-built Comparison (no model: a flagged finding cannot be produced on
    demand): an unsupported figure, a Not mentioned with and without its closest
    clause, and an Uncertain row carry their marks; a clean cell carries none."""
    term = ChecklistItem("term", "Term", "How long do the obligations last?")
    ret = ChecklistItem("nda-20", "Retention of copies", "May copies be retained?", hypothesis="Copies may be retained.")
    flagged = Finding("a.pdf", "Found", "12 months", "This NDA lasts two (2) years.", 2, "4 Term", None, claims=[{"supported": True}, {"supported": False}],
                      note="the answer names 12 months, which the document does not contain: rely on the quote")
    absent = Finding("b.md", "Not mentioned", "", None, None, None, None, closest="Each party may disclose ...")
    closest = Finding("a.pdf", "Not mentioned", "", "Recipient may keep backup copies made in the ordinary course.", 3, "7 Return", None)
    no = Finding("b.md", "No", "No", "Recipient may keep backup copies made in the ordinary course of business.", None, "6 Return", None, confidence=0.71)
    c = Comparison("nda", ["a.pdf", "b.md"], [Row(term, {"a.pdf": flagged, "b.md": absent}), Row(ret, {"a.pdf": closest, "b.md": no})],
                   {"a.pdf": 120, "b.md": 80}, 3.2, 106.0)
    buf = io.BytesIO()
    to_docx(c, buf, checklist_name="firm NDA list", today=date(2024, 3, 5))
    d = Document(io.BytesIO(buf.getvalue()))
    assert "5 March 2024" in d.paragraphs[1].text and "Checklist: firm NDA list" in d.paragraphs[1].text
    t = d.tables[0]
    fig, nm = t.rows[1].cells[1], t.rows[1].cells[2]
    assert "⚠ the answer names 12 months" in fig.text and fill_of(fig) == WARN_FILL
    assert any(r.text == "⚠ " and r.font.color.rgb == RGBColor.from_string(WARN) for r in runs(fig))
    assert "(p. 2, § 4 Term) · answer: 1 of 2 claims supported" in fig.text
    assert nm.text == "Not mentioned: no clause on point (the closest passage is about something else)"
    assert "⚠" not in nm.text and fill_of(nm) is None
    near, labelled_no = t.rows[2].cells[1], t.rows[2].cells[2]
    assert near.text.startswith("Not mentioned (closest clause)")
    assert labelled_no.text.startswith("No (71%)") and "(§ 6 Return)" in labelled_no.text and fill_of(labelled_no) is None
    # the quotes say the same, the labels differ: the difference is marked uncertain
    diff = t.rows[2].cells[3]
    assert c.rows[1].difference.startswith("uncertain") and diff.text.startswith("⚠ uncertain") and fill_of(diff) == WARN_FILL
    assert d.paragraphs[-1].text == cost_line(c)


def test_docx_needs_out_and_says_so(tmp_path):
    res = CliRunner().invoke(app, ["compare", BONTERMS, "--format", "docx", "--store", str(tmp_path / "none")])
    assert res.exit_code == 2 and "--format docx needs --out" in res.output
    res = CliRunner().invoke(app, ["compare", BONTERMS, "--format", "pdf", "--store", str(tmp_path / "none")])
    assert res.exit_code == 2 and "table, md, html or docx" in res.output


@pytest.mark.complete
def test_docx_with_json_still_prints_json(nda_store):
    import json

    res = CliRunner().invoke(app, ["compare", BONTERMS, "--items", "governing-law", "--store", str(nda_store.store),
                                   "--format", "docx", "--json"], env=SMALL)
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["rows"][0]["id"] == "governing-law"


def test_web_export_is_a_word_file(nda_store):
    from fastapi.testclient import TestClient

    from ragkit.serve.app import create_app

    token = "docx-t0ken"
    auth = {"Authorization": f"Bearer {token}"}
    with TestClient(create_app(nda_store, token=token, preload=False), base_url="http://127.0.0.1") as client:
        r = client.post("/api/compare?wait=true", json={"docs": DOCS, "checklist": "nda", "items": ["nda-19"]}, headers=auth)
        assert r.status_code == 200, r.text
        job = r.json()
        assert client.get(f"/api/compare/{job['id']}.docx").status_code == 401  # behind the token
        assert client.get(f"/api/compare/{'c' * 32}.docx", headers=auth).status_code == 404
        res = client.get(f"/api/compare/{job['id']}.docx", headers=auth)
    assert res.status_code == 200
    assert res.headers["content-type"] == MEDIA_TYPE
    assert res.headers["content-disposition"].startswith("attachment;") and ".docx" in res.headers["content-disposition"]
    d = Document(io.BytesIO(res.content))
    row = d.tables[0].rows[1].cells
    found = job["result"]["rows"][0]
    assert row[0].text.startswith(found["title"])
    for j, doc in enumerate(DOCS):
        f = found["findings"][doc]
        assert row[1 + j].text.startswith(f["label"])
        if f["quote"]:
            assert f"“{f['quote']}”" in row[1 + j].text
    assert row[-1].text.endswith(found["difference"])


def test_memo_renders_in_libreoffice(memo, tmp_path):
    soffice = shutil.which("soffice")
    if soffice is None:
        pytest.skip("LibreOffice is not installed (soffice not on PATH): apt-get install libreoffice-writer-nogui")
    import pypdfium2 as pdfium
    from pypdf import PdfReader

    path, c = memo
    profile = tmp_path / f"lo-{uuid.uuid4().hex}"  # a fresh profile: no clash with another soffice
    proc = subprocess.run([soffice, f"-env:UserInstallation={profile.as_uri()}", "--headless", "--convert-to", "pdf",
                           "--outdir", str(tmp_path), str(path)], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "HOME": str(tmp_path)})
    pdf = tmp_path / (path.stem + ".pdf")
    assert proc.returncode == 0 and pdf.exists(), proc.stdout + proc.stderr
    reader = PdfReader(str(pdf))

    def squeeze(text: str) -> str:  # lines wrap anywhere in a cell: compare without whitespace
        return "".join(text.split())

    flat = squeeze("".join(p.extract_text() or "" for p in reader.pages))
    for r in c.rows:
        assert squeeze(r.item.title) in flat
        for doc in DOCS:
            f = r.findings[doc]
            assert squeeze(f.label) in flat
            if f.quote:
                assert squeeze(f"“{f.quote}”") in flat, f.quote
            if f.note:
                assert squeeze(f"⚠ {f.note}") in flat, f.note
    assert squeeze(cost_line(c)) in flat
    page = pdfium.PdfDocument(str(pdf))[0]
    img = page.render(scale=1.5).to_pil().convert("L")
    assert img.width > img.height  # landscape
    dark = sum(img.histogram()[:128])  # pixels darker than mid-grey
    assert dark > 0.005 * img.width * img.height  # text on the page, not a blank one


def test_a_quote_holding_control_characters_is_written_and_reopens():
    """Ingest keeps a document's text as it is, so a quote can hold what XML forbids (a
    PDF's form feed, a Word file's vertical tab, a NUL, pdfium's U+FFFE): python-docx
    raised ValueError on it and no memo was written. The memo writes the quote with a
    vertical tab or form feed read as a space and the rest dropped, and python-docx
    reopens it."""
    item = ChecklistItem("term", "Term\x01", "How long do the obligations last?")
    quote = "This NDA lasts\x0btwo (2)\x0cyears\x00 from the\x1f Effective\ufffe Date."
    f = Finding("a\x02.pdf", "Found", "two years\x07", quote, 2, "4 Term\x1b", None,
                note="the answer names\x08 12 months")
    c = Comparison("nda", ["a\x02.pdf"], [Row(item, {"a\x02.pdf": f})], {"a\x02.pdf": 120}, 3.2, 106.0)
    buf = io.BytesIO()
    to_docx(c, buf, checklist_name="firm\x03 list", today=date(2024, 3, 5))
    d = Document(io.BytesIO(buf.getvalue()))
    cell = d.tables[0].rows[1].cells[1]
    assert "“This NDA lasts two (2) years from the Effective Date.”" in cell.text
    assert "(p. 2, § 4 Term)" in cell.text and "⚠ the answer names 12 months" in cell.text
    assert d.tables[0].rows[1].cells[0].text.startswith("Term\n")
    assert d.paragraphs[0].text == "Clause comparison: a.pdf" and "Checklist: firm list" in d.paragraphs[1].text
    assert d.core_properties.title == "Clause comparison: a.pdf"
    every = "".join(p.text for p in d.paragraphs) + "".join(cl.text for row in d.tables[0].rows for cl in row.cells)
    assert not re.search("[\x00-\x08\x0b\x0c\x0e-\x1f\ufffe\uffff]", every)


def test_the_command_writes_a_memo_of_a_document_holding_a_control_character(tmp_path):
    """The real path: a text file whose governing-law sentence holds a control character
    (U+0001, which ingest keeps: a vertical tab or form feed it reads as whitespace)
    ingested into a real store, and `ragkit compare --format docx` over it with the real
    model. The command wrote no memo (ValueError from python-docx); now it does, and the
    quote reads as the sentence without the character."""
    from conftest import make_settings

    from ragkit.ingest import ingest

    doc = tmp_path / "control-chars-nda.txt"
    doc.write_text("Mutual Non-Disclosure Agreement\n\n1. Governing Law. This Agreement is governed by the laws of "
                   "the State of New York without regard to its conflict of laws\x01 principles, and the courts of "
                   "New York County have exclusive jurisdiction.\n\n2. Term. This Agreement lasts two (2) years.\n")
    settings = make_settings(tmp_path / "store")
    assert ingest([doc], settings).failed == []
    out = tmp_path / "memo.docx"
    res = CliRunner().invoke(app, ["compare", doc.name, "--items", "governing-law", "--store", str(settings.store),
                                   "--format", "docx", "--out", str(out)], env=SMALL)
    assert res.exit_code == 0, res.output
    cell = Document(str(out)).tables[0].rows[1].cells[1]
    assert "conflict of laws principles" in cell.text and "\x01" not in cell.text, cell.text
