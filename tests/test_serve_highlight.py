"""ragkit.serve.highlight on real files: the sample NDAs (PDF text layers read with
pypdfium2) and a PDF written by matplotlib with a word hyphenated across a line break.

Every highlight box is checked against the PDF itself: converted back from image pixels
to PDF points (scale and page height only, not the module's own transform), the text
pypdfium2 finds inside it (get_text_bounded) must be the quote's words of that line."""

from __future__ import annotations

import io
import math
import re

import pypdfium2 as pdfium
import pytest
from conftest import CORPORA
from PIL import Image

from ragkit.serve.highlight import (
    PageOutOfRange,
    SourceUnavailable,
    find_quote,
    pdf_page_png,
    read_verified,
    sha256_of,
    text_section_html,
)

BONTERMS = CORPORA / "bonterms-mutual-nda-v1.pdf"  # one page
CNLI_411 = CORPORA / "cnli_dev_411.pdf"  # three pages; clause 2(a) runs from page 1 onto page 2
SCALE = 1.5

# read from the PDFs' text layers with pypdfium2 (get_text_range); each crosses a line break
BONTERMS_Q = ("Recipient’s obligations relating to Confidential Information will survive for the "
              "Confidentiality Period, despite expiration or termination of this NDA.")
CNLI_P2_Q = ("The term Confidential Information as defined in Section 2(a) hereof shall include information "
             "obtained by the Company from any third party under an agreement including restrictions on "
             "disclosure known to the Stockholder.")
# the end of page 1 and the start of page 2 of cnli_dev_411
CNLI_SPAN_Q = ("(D) the Stockholder can demonstrate that such information and its relevance in the applicable "
               "instance, was already known to the recipient thereof")


def words(s: str) -> list[str]:
    return re.findall(r"\w+", s.replace("\ufffe", "").lower())


def page_text(pdf, page: int) -> str:
    doc = pdfium.PdfDocument(str(pdf))
    try:
        return doc[page - 1].get_textpage().get_text_range()
    finally:
        doc.close()


def box_texts(pdf, page: int, boxes, scale: float = SCALE) -> list[str]:
    """The text pypdfium2 reads inside each box: pixels -> PDF points by the scale and
    the page height (y up). Only the middle third of the box's height is used: a line's
    box touches the descenders of the line above, which get_text_bounded would count."""
    doc = pdfium.PdfDocument(str(pdf))
    try:
        p = doc[page - 1]
        height = p.get_height()
        tp = p.get_textpage()
        out = []
        for x0, y0, x1, y1 in boxes:
            band = (y1 - y0) / 3
            out.append(tp.get_text_bounded(x0 / scale, height - (y1 - band) / scale, x1 / scale, height - (y0 + band) / scale))
        return out
    finally:
        doc.close()


def check_boxes_inside(boxes, size):
    w, h = size
    assert boxes
    for x0, y0, x1, y1 in boxes:
        assert 0 <= x0 < x1 <= w and 0 <= y0 < y1 <= h, (x0, y0, x1, y1, size)


def test_quotes_are_from_the_text_layers():
    # the fixtures of this file: each quote is on its page, with a line break inside
    t = page_text(BONTERMS, 1)
    assert "Confidentiality Period,\r\ndespite expiration" in t
    assert " ".join(BONTERMS_Q.split()) in " ".join(t.split())
    t2 = page_text(CNLI_411, 2)
    assert "information obtained\r\nby the Company" in t2
    assert CNLI_P2_Q in " ".join(t2.split())
    assert CNLI_SPAN_Q not in " ".join(page_text(CNLI_411, 1).split())
    assert CNLI_SPAN_Q not in " ".join(t2.split())


def test_bonterms_quote_boxes_are_its_two_lines():
    img = pdf_page_png(BONTERMS, 1, BONTERMS_Q, scale=SCALE)
    png, boxes, size = img  # unpacks as the tuple the viewer route uses
    assert (img.page, img.requested_page, img.match) == (1, 1, "full")
    pil = Image.open(io.BytesIO(png))
    assert pil.format == "PNG" and pil.size == size
    doc = pdfium.PdfDocument(str(BONTERMS))
    assert size == (math.ceil(doc[0].get_width() * SCALE), math.ceil(doc[0].get_height() * SCALE))
    check_boxes_inside(boxes, size)
    assert len(boxes) == 2  # one box per line of the match
    assert boxes[0][1] < boxes[1][1]  # top to bottom
    assert boxes[1][1] >= boxes[0][3] - 0.5  # the lines' boxes do not overlap
    texts = box_texts(BONTERMS, 1, boxes)
    assert words(texts[0]) == words("Recipient’s obligations relating to Confidential Information will survive for the Confidentiality Period,")
    assert words(texts[1]) == words("despite expiration or termination of this NDA.")
    assert words(" ".join(texts)) == words(BONTERMS_Q)


def test_cnli_page2_quote_on_three_lines_and_drawn_on_the_png():
    img = pdf_page_png(CNLI_411, 2, CNLI_P2_Q, scale=SCALE)
    assert (img.page, img.match, img.pages) == (2, "full", 3)
    check_boxes_inside(img.boxes, img.size)
    assert len(img.boxes) == 3
    assert words(" ".join(box_texts(CNLI_411, 2, img.boxes))) == words(CNLI_P2_Q)
    # the highlight is drawn into the image: inside a box the page is tinted yellow,
    # compared with the same page rendered without a quote
    plain = Image.open(io.BytesIO(pdf_page_png(CNLI_411, 2, None, scale=SCALE).png)).convert("RGB")
    lit = Image.open(io.BytesIO(img.png)).convert("RGB")
    x0, y0, x1, y1 = img.boxes[1]
    changed = yellow = 0
    for x in range(int(x0) + 2, int(x1) - 2, 7):
        y = int((y0 + y1) / 2)
        a, b = plain.getpixel((x, y)), lit.getpixel((x, y))
        changed += a != b
        yellow += b[2] < b[0] - 40 and b[2] < b[1] - 40  # blue well below red and green
    assert changed > 10 and yellow > 10
    # outside the boxes nothing changed
    assert plain.getpixel((5, 5)) == lit.getpixel((5, 5))
    assert plain.crop((0, 0, img.size[0], int(img.boxes[0][1]) - 2)).tobytes() == \
        lit.crop((0, 0, img.size[0], int(img.boxes[0][1]) - 2)).tobytes()


def test_tolerant_matching_same_boxes():
    base = pdf_page_png(CNLI_411, 2, CNLI_P2_Q, render=False).boxes
    variants = [
        CNLI_P2_Q.upper(),
        CNLI_P2_Q.replace(" ", "\n   "),  # line breaks and runs of spaces
        CNLI_P2_Q.replace("Confidential", "Confi\u00addential"),  # a soft hyphen
        CNLI_P2_Q.replace("information", "infor- mation"),  # ingest-style hyphenation left in
    ]
    for q in variants:
        got = pdf_page_png(CNLI_411, 2, q, render=False)
        assert got.match == "full" and got.boxes == base, q


def test_quote_not_on_the_page_gives_no_boxes():
    img = pdf_page_png(CNLI_411, 2, BONTERMS_Q)
    assert img.boxes == [] and img.match == "none" and img.page == 2
    assert Image.open(io.BytesIO(img.png)).size == img.size
    # a near miss (one word changed) is not a match either
    assert pdf_page_png(BONTERMS, 1, BONTERMS_Q.replace("survive", "persist")).boxes == []
    # nothing to look for
    assert pdf_page_png(BONTERMS, 1, "  ").boxes == []


def test_quote_on_the_next_or_previous_page_is_found_there():
    # a citation names the page its chunk starts on; the quote can be on the next one
    img = pdf_page_png(CNLI_411, 1, CNLI_P2_Q, render=False)
    assert (img.requested_page, img.page, img.match) == (1, 2, "full")
    assert words(" ".join(box_texts(CNLI_411, 2, img.boxes))) == words(CNLI_P2_Q)
    first_page_q = "Reference is made to that certain Agreement and Plan of Merger"
    assert first_page_q in page_text(CNLI_411, 1)
    back = pdf_page_png(CNLI_411, 2, first_page_q, render=False)
    assert (back.page, back.match) == (1, "full")


def test_quote_across_a_page_break():
    start = pdf_page_png(CNLI_411, 1, CNLI_SPAN_Q)
    assert (start.page, start.match, start.continues) == (1, "partial", 2)
    check_boxes_inside(start.boxes, start.size)
    t1 = words(" ".join(box_texts(CNLI_411, 1, start.boxes)))
    assert t1 == words("(D) the Stockholder can demonstrate that such information")
    end = pdf_page_png(CNLI_411, 2, CNLI_SPAN_Q)
    assert (end.page, end.match, end.continues) == (2, "partial", 1)
    t2 = words(" ".join(box_texts(CNLI_411, 2, end.boxes)))
    assert t2 == words("and its relevance in the applicable instance, was already known to the recipient thereof")


def test_hyphenated_word_across_lines(tmp_path):
    """A word hyphenated at a line end ("confiden-" / "tial"): pdfium reads the hyphen
    as U+FFFE, the stored chunk has the joined word."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    plt.rcParams["pdf.fonttype"] = 42  # TrueType with a ToUnicode map: a real text layer
    fig = plt.figure(figsize=(8.5, 11))
    lines = ["1. Confidentiality. The Recipient shall keep all confiden-",
             "tial information secret and shall not disclose it to any",
             "third party without the prior written consent of the Discloser."]
    for i, line in enumerate(lines):
        fig.text(0.1, 0.9 - i * 0.025, line, fontsize=12)
    pdf = tmp_path / "hyphen.pdf"
    fig.savefig(pdf)
    plt.close(fig)
    assert "confiden\ufffetial" in page_text(pdf, 1) or "confiden-\r\ntial" in page_text(pdf, 1)
    img = pdf_page_png(pdf, 1, "keep all confidential information secret", scale=2.0)
    assert img.match == "full" and len(img.boxes) == 2
    check_boxes_inside(img.boxes, img.size)
    texts = box_texts(pdf, 1, img.boxes, scale=2.0)
    assert words(texts[0]) == ["keep", "all", "confiden"]
    assert words(texts[1]) == ["tial", "information", "secret"]


def test_page_out_of_range_and_bytes_input():
    with pytest.raises(PageOutOfRange) as exc:
        pdf_page_png(BONTERMS, 2, None)
    assert "1 page" in str(exc.value)
    with pytest.raises(PageOutOfRange):
        pdf_page_png(BONTERMS, 0, None)
    # from bytes, as the server renders what it hashed
    img = pdf_page_png(BONTERMS.read_bytes(), 1, BONTERMS_Q, render=False)
    assert len(img.boxes) == 2 and img.png == b""


def test_read_verified_refuses_changed_and_missing_files(tmp_path):
    f = tmp_path / "a.pdf"
    f.write_bytes(BONTERMS.read_bytes())
    sha = sha256_of(f.read_bytes())
    assert read_verified(str(f), sha, "a.pdf", 10**8) == BONTERMS.read_bytes()
    f.write_bytes(CNLI_411.read_bytes())  # replaced after ingest
    with pytest.raises(SourceUnavailable) as exc:
        read_verified(str(f), sha, "a.pdf", 10**8)
    assert exc.value.status == 409 and "changed" in str(exc.value)
    f.unlink()
    with pytest.raises(SourceUnavailable) as exc:
        read_verified(str(f), sha, "a.pdf", 10**8)
    assert exc.value.status == 410 and "gone" in str(exc.value)


def test_text_section_html_marks_and_escapes():
    text = ('2. Use. The <script>alert("x")</script> Receiving Party shall: (a) use Confidential\n'
            "Information solely for the Purpose; & (b) not disclose it.")
    out = text_section_html(text, "use confidential information SOLELY for the purpose")
    assert "<script>" not in out and "&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt;" in out
    assert out.count("<mark>") == 1
    marked = re.search(r"<mark>(.*?)</mark>", out, re.S).group(1)
    assert marked == "use Confidential\nInformation solely for the Purpose"
    assert "&amp; (b)" in out
    # a quote of two pieces joined by an ellipsis marks both
    two = text_section_html(text, "The … Receiving Party shall: … not disclose it")
    assert re.findall(r"<mark>(.*?)</mark>", two, re.S) == ["The", "Receiving Party shall:", "not disclose it"]
    # no quote, or one that is not there: escaped text, nothing marked
    assert "<mark>" not in text_section_html(text, None)
    assert "<mark>" not in text_section_html(text, "governing law of Delaware")
    # a quote whose text holds markup is matched on the raw text and escaped inside the mark
    inj = text_section_html("a <b>bold</b> claim here", "<b>bold</b> claim")
    assert inj == "a <mark>&lt;b&gt;bold&lt;/b&gt; claim</mark> here"


def test_find_quote_maps_back_to_text_indices():
    text = "Alpha beta-\ngamma  DELTA epsilon"
    m = find_quote(text, "betagamma delta")
    assert m.status == "full"
    (a, b), = m.spans
    assert text[a:b] == "beta-\ngamma  DELTA"
