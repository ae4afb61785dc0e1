"""Scanned PDFs: an image-only page is read by tesseract when it is installed, and gives
one clear line naming the file and what to install when it is not."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from conftest import CORPORA

from ragkit.errors import DocumentError
from ragkit.ingest.loaders import load

HAS_TESSERACT = shutil.which("tesseract") is not None
# outside CI these skip without tesseract; in CI a skip fails the run (conftest.py), and
# .ci/run installs it
needs_tesseract = pytest.mark.skipif(
    not HAS_TESSERACT, reason="tesseract is not installed (apt-get install tesseract-ocr tesseract-ocr-eng)"
)


def make_scan(src: Path, dst: Path, page_index: int = 0, scale: float = 200 / 72) -> Path:
    """Render a real text page to a bitmap and write it back as an image-only PDF."""
    import pypdfium2 as pdfium

    pdf = pdfium.PdfDocument(str(src))
    page = pdf[page_index]
    w, h = page.get_size()
    bitmap = page.render(scale=scale, grayscale=True)
    out = pdfium.PdfDocument.new()
    new_page = out.new_page(w, h)
    image = pdfium.PdfImage.new(out)
    image.set_bitmap(bitmap)
    image.set_matrix(pdfium.PdfMatrix().scale(w, h))
    new_page.insert_obj(image)
    new_page.gen_content()
    out.save(str(dst))
    out.close()
    pdf.close()
    return dst


@pytest.fixture(scope="module")
def scan(tmp_path_factory) -> Path:
    path = make_scan(CORPORA / "cnli_dev_019.pdf", tmp_path_factory.mktemp("scan") / "scanned-nda.pdf")
    import pypdfium2 as pdfium

    assert pdfium.PdfDocument(str(path))[0].get_textpage().get_text_range().strip() == "", "the fixture has no text layer"
    return path


@needs_tesseract
def test_a_missing_ocr_language_is_one_clear_line(scan):
    with pytest.raises(DocumentError) as info:
        load(scan, ocr_lang="xxq")
    msg = str(info.value)
    assert scan.name in msg and "'xxq'" in msg and "not installed" in msg and "\n" not in msg


def test_without_tesseract_the_error_says_what_to_install(scan, monkeypatch, tmp_path):
    empty = tmp_path / "empty-bin"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))
    with pytest.raises(DocumentError) as info:
        load(scan)
    msg = str(info.value)
    assert scan.name in msg
    assert "no text layer (scanned or image-only PDF) and OCR is not available" in msg
    assert "apt-get install tesseract-ocr" in msg and "\n" not in msg


@needs_tesseract
def test_a_scanned_pdf_is_read_by_ocr_end_to_end(scan, tmp_path):
    """ingest OCRs the page (one OCR run, about 10-40 s on 2 shared cores); the stored
    chunks hold the words of the original page, numbered clauses still in sections."""
    from conftest import make_settings

    from ragkit.embed import load_embedder
    from ragkit.ingest import ingest
    from ragkit.store import open_store

    folder = tmp_path / "docs"
    folder.mkdir()
    shutil.copy(scan, folder / scan.name)
    settings = make_settings(tmp_path / "store")
    report = ingest([folder], settings)
    assert report.failed == [] and report.added == 1 and report.chunks > 0
    store = open_store(settings, load_embedder(settings), create=False)
    doc = store.documents()[0]
    hits = store.chunks([doc.doc_id])
    text = " ".join(h.text for h in hits)
    assert {h.meta["page_start"] for h in hits} == {1}
    original = " ".join(b.text for b in load(CORPORA / "cnli_dev_019.pdf") if b.page == 1)
    words = [w for w in original.split() if len(w) > 5 and w.isalpha()]
    found = sum(1 for w in words if w in text)
    assert words and found / len(words) > 0.9, (found, len(words), text[:300])
    assert any(h.meta["section"].startswith("1. Definitions") for h in hits), [h.meta["section"] for h in hits]
