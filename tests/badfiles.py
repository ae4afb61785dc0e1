"""Generate malformed input files, each a different kind of user mistake."""

from __future__ import annotations

import io
import os
import zipfile
from pathlib import Path


def make_bad_files(folder: Path, good_pdf: Path, good_docx: Path) -> dict[str, str]:
    """Write the files; return {file name: a word the error must contain}."""
    import pypdf

    folder.mkdir(parents=True, exist_ok=True)
    expect: dict[str, str] = {}

    def put(name: str, data: bytes, word: str) -> None:
        (folder / name).write_bytes(data)
        expect[name] = word

    put("empty.pdf", b"", "empty")
    put("empty.docx", b"", "empty")
    put("empty.txt", b"", "empty")
    put("page.html.pdf", b"<!DOCTYPE html><html><body>Not a PDF</body></html>", "HTML")
    put("random.pdf", os.urandom(4096).replace(b"%PDF", b"xxxx"), "not a PDF")
    data = good_pdf.read_bytes()
    put("truncated.pdf", data[: len(data) // 3], "PDF")
    corrupted = bytearray(data)
    for i in range(200, len(corrupted) - 200, 97):
        corrupted[i] = (corrupted[i] * 7 + 13) % 256
    put("corrupted.pdf", bytes(corrupted), "PDF")
    # encrypted with an unknown password
    writer = pypdf.PdfWriter(clone_from=pypdf.PdfReader(str(good_pdf)))
    writer.encrypt(user_password="secret-user", owner_password="secret-owner")
    buf = io.BytesIO()
    writer.write(buf)
    put("encrypted.pdf", buf.getvalue(), "encrypted")
    # no text layer (what a scan looks like to a text extractor)
    blank = pypdf.PdfWriter()
    blank.add_blank_page(width=612, height=792)
    buf = io.BytesIO()
    blank.write(buf)
    put("scanned.pdf", buf.getvalue(), "no text layer")
    put("notzip.docx", b"This is plain text saved with a .docx name.\n" * 20, "not a DOCX")
    put("html.docx", b"<html><body>hello</body></html>", "HTML")
    # a zip that is not a Word document
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        zf.writestr("hello.txt", "hi")
    put("otherzip.docx", buf.getvalue(), "word/document.xml")
    # zip bomb: a real DOCX plus a member that inflates far beyond the limit
    buf = io.BytesIO()
    with zipfile.ZipFile(good_docx) as src, zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as zf:
        for item in src.infolist():
            zf.writestr(item, src.read(item.filename))
        zf.writestr("word/media/bomb.bin", b"\0" * (400 * 1024 * 1024))
    put("bomb.docx", buf.getvalue(), "zip bomb")
    # truncated DOCX (zip directory cut off)
    d = good_docx.read_bytes()
    put("truncated.docx", d[: len(d) // 2], "DOCX")
    put("latin1.txt", "Vertraulichkeit für fünf Jahre, Gerichtsstand München.\n".encode("latin-1"), "UTF-8")
    put("binary.txt", bytes(range(256)) * 8, "binary")
    put("only-spaces.md", b"   \n\n  \t \n", "no text")
    put("notes.xyz", b"some text", "unsupported")
    return expect


def make_many_bad_files(folder: Path, good_pdf: Path, good_docx: Path) -> dict[str, str]:
    """At least 40 malformed inputs of different kinds (issue: reliability). Returns
    {file name: a word its error must contain}."""
    import gzip

    import pypdf

    expect = make_bad_files(folder, good_pdf, good_docx)
    pdf = good_pdf.read_bytes()
    docx = good_docx.read_bytes()

    def put(name: str, data: bytes, word: str) -> None:
        (folder / name).write_bytes(data)
        expect[name] = word

    for frac in (0.05, 0.5, 0.9):
        put(f"truncated-{int(frac * 100)}.pdf", pdf[: int(len(pdf) * frac)], "PDF")
    put("header-only.pdf", b"%PDF-1.7\n", "PDF")
    put("jpeg.pdf", b"\xff\xd8\xff\xe0\x00\x10JFIF\x00" + os.urandom(2000), "not a PDF")
    put("docx-named.pdf", docx, "not a PDF")
    put("pdf-named.docx", pdf, "not a DOCX")
    put("gzip.txt", gzip.compress(b"hello " * 1000), "binary")
    put("nul.txt", b"\0" * 4096, "binary")
    put("mixed-encoding.txt", "Clause 1. Caf\u00e9 ".encode() + "na\u00efve r\u00e9sum\u00e9".encode("latin-1"), "UTF-8")
    put("utf16-no-bom.txt", "Confidential information".encode("utf-16-le"), "binary")
    put("random.docx", os.urandom(3000), "not a DOCX")
    put("empty-zip.docx", b"PK\x05\x06" + b"\0" * 18, "DOCX")
    put("html.md", b"\x00\x01\x02binary in markdown", "binary")
    put("spaces.txt", b" \n\t\n   \n", "no text")
    put("zero.md", b"", "empty")
    put("latin1.md", "# Vertrag\n\nGerichtsstand M\u00fcnchen.\n".encode("latin-1"), "UTF-8")
    put("ole.docx", b"\xd0\xcf\x11\xe0\xa1\xb1\x1a\xe1" + b"\0" * 1000, "legacy MS Office")
    # 5,000 pages: refused by the page limit before any page is read
    big = pypdf.PdfWriter()
    for _ in range(5000):
        big.add_blank_page(width=72, height=72)
    buf = io.BytesIO()
    big.write(buf)
    put("pages-5000.pdf", buf.getvalue(), "5000 pages")
    # a very long file name (255 bytes is the usual limit)
    put("n" * 240 + ".pdf", b"not a pdf at all", "not a PDF")
    # symbolic link loop, and a link to nowhere
    os.symlink(folder / "loop-b.pdf", folder / "loop-a.pdf")
    os.symlink(folder / "loop-a.pdf", folder / "loop-b.pdf")
    expect["loop-a.pdf"] = "link"
    expect["loop-b.pdf"] = "link"
    os.symlink(folder / "does-not-exist.pdf", folder / "dangling.pdf")
    expect["dangling.pdf"] = "broken symbolic link"
    return expect
