"""The web page shows an answer's outcome (issue 23): a quoted answer's passages and an
unverified answer's "Not verified against the sources" with the passages, each opening its
page, and the model's text marked apart; never "The documents do not say." for it. The
real `ragkit serve` and its page in headless Chromium (the fixtures of
tests/test_serve_browser.py)."""

from __future__ import annotations

import json

import pytest
from test_serve_browser import BONTERMS, page, server  # noqa: F401  (fixtures: the real server, a fresh Chromium)

RETAIN = ("As an exception to part (b), Recipient may retain Confidential Information in accordance with its standard "
          "backup or record retention policies or as required by law, but this NDA will continue to apply to the "
          "retained Confidential Information.")


def _ask(page, url: str, question: str) -> None:  # noqa: F811  (the page fixture passed in)
    page.goto(url + "/")
    box = page.locator(f'#doc-list input[type=checkbox][value="{BONTERMS}"]')
    box.wait_for()
    box.check()
    page.fill("#question", question)
    page.click("#ask-btn")


def test_a_quoted_answer_lists_its_passages_and_each_opens_its_page(server, page):  # noqa: F811
    """A real stream from the real server: a question asking for the clause is answered by
    quoting (nothing generated), and the page lists the quotes as passages."""
    _ask(page, server.url, "Which part of this contract concerns the return or destruction of Confidential "
                           "Information? Quote it.")
    item = page.locator("#passages li").first
    item.wait_for(timeout=240_000)
    assert "Quoted from the documents" in page.inner_text("#answer")
    assert BONTERMS in item.inner_text() and "§ 7." in item.inner_text()
    item.locator("button").click()
    page.locator("#viewer").wait_for(state="visible", timeout=60_000)
    assert page.errors == [] and page.outside == []


@pytest.mark.complete
def test_an_unverified_answer_shows_the_passages_and_marks_the_models_text(server, page):  # noqa: F811
    """The page's rendering of the unverified outcome. With the test's small answer length
    the model answers this question correctly, so this test answers the page's one chat
    request itself (Playwright `route`, a stream in the shape the server sends:
    tests/test_serve_outcomes.py checks the real server's); the rest is the real page."""
    said = "The recipient cannot retain backup copies after termination."
    passages = [{"n": 11, "doc": BONTERMS, "doc_id": None, "page": 1, "page_end": 1,
                 "section": "7. Return or Destruction of Confidential Information", "quote": RETAIN, "score": 0.9,
                 "relevance": 0.7}]
    content = (f"{said}\n\nNot verified against the sources. The passages that answer the question best:\n“{RETAIN}” [11] "
               f"({BONTERMS}, p. 1, § 7. Return or Destruction of Confidential Information)\n\nSources:\n[11] {BONTERMS}, "
               "p. 1, § 7. Return or Destruction of Confidential Information (inferred)")
    base = {"id": "x", "object": "chat.completion.chunk", "created": 0, "model": "ragkit"}
    final = {"outcome": "unverified", "answer_kind": "generated", "passages": passages, "model_answer": said,
             "unverified_reason": "no claim of the answer is supported by a source sentence (1 checked)",
             "abstained": False, "abstain_reason": None, "unsupported_answer": said, "invalid_citations": [],
             "contexts": []}
    events = [
        {**base, "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}]},
        {**base, "choices": [{"index": 0, "delta": {"content": content}, "finish_reason": None}]},
        {**base, "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}],
         "citations": [{"n": 11, "doc": BONTERMS, "doc_id": None, "page": 1, "page_end": 1, "section": passages[0]["section"],
                        "quote": RETAIN, "inferred": True}],
         "claims": [{"text": said, "supported": False, "support": 0.51, "citations": [], "markers": [],
                     "flagged_markers": [], "missing_figures": [], "missing_names": []}], "ragkit": final},
    ]
    body = "".join("data: " + json.dumps(e) + "\n\n" for e in events) + "data: [DONE]\n\n"
    page.route("**/v1/chat/completions", lambda route: route.fulfill(status=200, body=body,
                                                                     headers={"Content-Type": "text/event-stream"}))
    _ask(page, server.url, "Can the recipient keep backup copies after termination?")
    item = page.locator("#passages li").first
    item.wait_for(timeout=60_000)
    answer = page.inner_text("#answer")
    assert "Not verified against the sources." in answer
    marked = page.locator("#answer .model-answer")
    assert said in marked.inner_text() and "not verified" in marked.inner_text().lower()
    assert "underline" in marked.locator(".claim-text").evaluate("e => getComputedStyle(e).textDecorationLine")
    assert "may retain Confidential Information" in item.inner_text() and "§ 7." in item.inner_text()
    warning = page.inner_text("#ask-warning")
    assert "Not verified against the sources" in warning and "passages below" in warning
    section = page.inner_text("#answer") + page.inner_text("#passages-box") + warning
    assert "do not say" not in section.lower() and "do not answer" not in section.lower()
    assert page.errors == [] and page.outside == []
