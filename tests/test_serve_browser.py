"""The web page end to end: the real `ragkit serve` (a subprocess, the default model) on
a store of corpora/nda, driven in headless Chromium (Debian's /usr/bin/chromium through
Playwright's Python package; Playwright's own browser downloads are never used).

A question about bonterms-mutual-nda-v1.pdf streams in, citation chips appear, a click
on the first one shows the cited page with the highlight drawn over the quote: the
overlay boxes sit where the /boxes JSON says, inside the image, and the PDF's own text
under them is the quote. Screenshots go to the test's tmp folder (and to docs/serve.png with RAGKIT_UPDATE_SCREENSHOT=1)
(the README shows it)."""

from __future__ import annotations

import os
import re
import shutil
import tempfile
import time
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import httpx
import pypdfium2 as pdfium
import pytest
from conftest import CORPORA, ROOT
from serve_fixture import running_server

CHROMIUM = os.environ.get("RAGKIT_CHROMIUM", "/usr/bin/chromium")
BONTERMS = "bonterms-mutual-nda-v1.pdf"
QUESTION = "How long do the confidentiality obligations survive?"
# Chromium must not reach out on its own (updates, sync, field trials)
ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
        "--disable-component-update", "--disable-sync", "--disable-default-apps", "--disable-extensions",
        "--metrics-recording-only", "--no-default-browser-check", "--disable-features=Translate,MediaRouter"]

sync_api = pytest.importorskip("playwright.sync_api", reason="the browser test needs `pip install playwright`")
if not Path(CHROMIUM).exists():
    pytest.skip(f"no Chromium at {CHROMIUM} (apt-get install chromium)", allow_module_level=True)


@pytest.fixture(scope="module")
def server(nda_store, tmp_path_factory):
    with running_server(nda_store.store, log_dir=tmp_path_factory.mktemp("serve-browser")) as srv:
        yield srv


@pytest.fixture
def page(tmp_path):
    profile = Path(tempfile.mkdtemp(prefix="ragkit-chromium-"))  # a fresh profile every run
    with sync_api.sync_playwright() as p:
        ctx = p.chromium.launch_persistent_context(
            str(profile), executable_path=CHROMIUM, headless=True, args=ARGS,
            viewport={"width": 1440, "height": 1000}, device_scale_factor=1,
        )
        try:
            pg = ctx.new_page()
            pg.set_default_timeout(30_000)
            errors: list[str] = []
            pg.on("pageerror", lambda exc: errors.append(str(exc)))
            pg.on("console", lambda msg: errors.append(msg.text) if msg.type == "error" else None)
            outside: list[str] = []
            pg.on("request", lambda req: outside.append(req.url) if not req.url.startswith(("http://127.0.0.1", "blob:", "data:")) else None)
            pg.errors, pg.outside = errors, outside
            yield pg
        finally:
            ctx.close()
            shutil.rmtree(profile, ignore_errors=True)


def words(s: str) -> list[str]:
    return re.findall(r"\w+", s.replace("\ufffe", "").lower())


def test_ask_then_click_a_citation_shows_the_highlighted_page(server, page, tmp_path):
    t0 = time.monotonic()
    page.goto(server.url + "/")
    box = page.locator(f'#doc-list input[type=checkbox][value="{BONTERMS}"]')
    box.wait_for()
    assert page.locator("#doc-list li").count() == len(list(CORPORA.iterdir()))
    # the filter narrows the list; the check survives clearing it
    page.fill("#doc-filter", "bonterms")
    assert page.locator("#doc-list li").count() == 1
    box.check()
    page.fill("#doc-filter", "")
    assert page.locator(f'#doc-list input[value="{BONTERMS}"]').is_checked()
    assert BONTERMS in page.inner_text("#scope")

    page.fill("#question", QUESTION)
    with page.expect_request("**/v1/chat/completions") as asked:
        page.click("#ask-btn")
    body = asked.value.post_data_json
    assert body["stream"] is True and body["docs"] == [BONTERMS] and body["model"] == "ragkit"
    # the answer streams in, then the chips come with the final chunk
    chip = page.locator("#chips .chip").first
    chip.wait_for(timeout=240_000)
    answer = page.inner_text("#answer").strip()
    assert answer and answer != "…" and "The question failed" not in page.inner_text("#ask-warning")
    assert BONTERMS in chip.inner_text()
    n_chips = page.locator("#chips .chip").count()
    assert n_chips >= 1

    with page.expect_response(lambda r: "/boxes" in r.url) as got_boxes, \
            page.expect_response(lambda r: r.url.endswith(".png") and "/page/" in r.url) as got_png:
        chip.click()
    boxes_resp, png_resp = got_boxes.value, got_png.value
    assert boxes_resp.ok and png_resp.ok and png_resp.headers["content-type"] == "image/png"
    shown = boxes_resp.json()
    quote = parse_qs(urlsplit(boxes_resp.url).query)["quote"][0]
    assert quote and shown["doc"] == BONTERMS
    assert shown["requested_page"] == int(chip.get_attribute("data-page"))
    assert f"/page/{shown['page']}.png" in png_resp.url  # the image of the page the quote is on

    img = page.locator("#page-img")
    page.wait_for_function("() => { const i = document.getElementById('page-img'); return i.complete && i.naturalWidth > 0 }")
    assert img.evaluate("i => [i.naturalWidth, i.naturalHeight]") == [shown["width"], shown["height"]]
    assert img.evaluate("i => i.src").startswith("blob:")
    assert shown["match"] == "full" and shown["boxes"], shown
    hl = page.locator("#overlay .hl")
    assert hl.count() == len(shown["boxes"])

    # the same boxes as the server gives anyone for that page and quote
    again = httpx.get(f"{server.url}/api/documents/{shown['doc_id']}/page/{shown['page']}/boxes",
                      params={"quote": quote}, timeout=30, trust_env=False).json()
    assert again["boxes"] == shown["boxes"]

    # the overlay is where the boxes are, scaled to the image as displayed, inside it
    ib = img.bounding_box()
    sx, sy = ib["width"] / shown["width"], ib["height"] / shown["height"]
    for k, (x0, y0, x1, y1) in enumerate(shown["boxes"]):
        b = hl.nth(k).bounding_box()
        assert b is not None and b["width"] > 5 and b["height"] > 3
        assert abs(b["x"] - (ib["x"] + x0 * sx)) < 1.5 and abs(b["y"] - (ib["y"] + y0 * sy)) < 1.5
        assert abs(b["width"] - (x1 - x0) * sx) < 1.5 and abs(b["height"] - (y1 - y0) * sy) < 1.5
        assert ib["x"] - 0.5 <= b["x"] and b["x"] + b["width"] <= ib["x"] + ib["width"] + 0.5
        assert ib["y"] - 0.5 <= b["y"] and b["y"] + b["height"] <= ib["y"] + ib["height"] + 0.5

    # and over the quote: the PDF's text under the boxes (pixels -> points at scale 1.5)
    doc = pdfium.PdfDocument(str(CORPORA / BONTERMS))
    pg = doc[shown["page"] - 1]
    h = pg.get_height()
    tp = pg.get_textpage()
    under = " ".join(tp.get_text_bounded(x0 / 1.5, h - (y1 - (y1 - y0) / 3) / 1.5, x1 / 1.5, h - (y0 + (y1 - y0) / 3) / 1.5)
                     for x0, y0, x1, y1 in shown["boxes"])
    q_words, u_words = words(quote.rstrip("…")), words(under)
    if quote.endswith("…"):  # a shortened quote: its last word may be cut
        assert u_words[: len(q_words) - 1] == q_words[:-1], (under, quote)
    else:
        assert u_words == q_words, (under, quote)
    doc.close()

    # keyboard: Escape closes the viewer and gives the focus back to the chip
    page.wait_for_timeout(200)
    shot = tmp_path / "serve.png"
    page.screenshot(path=str(shot), full_page=False)
    if os.environ.get("RAGKIT_UPDATE_SCREENSHOT"):  # the README's picture; never rewritten by a plain test run
        docs = ROOT / "docs"
        docs.mkdir(exist_ok=True)
        shutil.copyfile(shot, docs / "serve.png")
    page.keyboard.press("Escape")
    assert page.locator("#viewer").is_hidden()
    assert page.evaluate("() => document.activeElement.classList.contains('chip')")

    assert not page.errors, page.errors
    assert not page.outside, page.outside  # nothing but the server itself was asked for
    print(f"browser test: {time.monotonic() - t0:.1f} s from page load, {n_chips} chip(s)")


@pytest.mark.complete
def test_the_page_marks_a_claim_no_source_supports(server, page):
    """The page's rendering of claims. The model cannot be made to write an unsupported
    claim on demand, so this test answers the page's one chat request itself (Playwright
    `route`, a canned stream in the shape the server sends: test_serve_api checks the
    real server's `claims`); everything else is the real server and page."""
    import json

    claims = [
        {"text": "Obligations survive for the Confidentiality Period.", "supported": True, "support": 0.91,
         "citations": [{"n": 5, "doc": BONTERMS, "doc_id": None, "page": 1, "page_end": 1, "section": "Term",
                        "quote": "Recipient’s obligations relating to Confidential Information will survive for the "
                                 "Confidentiality Period.", "support": 0.91, "inferred": True}],
         "markers": [], "flagged_markers": [], "missing_figures": []},
        {"text": "They survive for 7 years.", "supported": False, "support": 0.41, "citations": [],
         "markers": [2], "flagged_markers": [2], "missing_figures": ["7 years"]},
    ]
    base = {"id": "x", "object": "chat.completion.chunk", "created": 0, "model": "ragkit"}
    events = [
        {**base, "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}]},
        {**base, "choices": [{"index": 0, "delta": {"content": "Obligations survive for the Confidentiality Period. "
                                                               "They survive for 7 years [2]."}, "finish_reason": None}]},
        {**base, "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}], "citations": [], "claims": claims,
         "ragkit": {"abstained": False, "abstain_reason": None, "unsupported_answer": None, "invalid_citations": [],
                    "contexts": []}},
    ]
    body = "".join("data: " + json.dumps(e) + "\n\n" for e in events) + "data: [DONE]\n\n"
    page.route("**/v1/chat/completions", lambda route: route.fulfill(status=200, body=body,
                                                                     headers={"Content-Type": "text/event-stream"}))
    page.goto(server.url + "/")
    page.fill("#question", QUESTION)
    page.click("#ask-btn")
    bad = page.locator("#claims .claim.unsupported")
    bad.wait_for(timeout=30_000)
    assert page.locator("#claims .claim").count() == 2
    assert "not supported by the sources" in bad.inner_text().lower() and "7 years" in bad.inner_text()
    assert "[2]" in bad.inner_text()  # the marker whose source does not say it
    good = page.locator("#claims .claim.supported")
    assert "Confidentiality Period" in good.locator("blockquote").inner_text() and BONTERMS in good.inner_text()
    # marked for the eye, not only in the text: the unsupported claim is styled apart
    style = bad.locator(".claim-text").evaluate("e => getComputedStyle(e).textDecorationLine")
    assert "underline" in style
    assert "1 of 2 claims are not supported" in page.inner_text("#ask-warning")
    assert page.errors == [] and page.outside == []
