"""Word files as lawyers exchange them: tracked changes, content controls, text boxes,
footnotes, comments, headers and footers, with no text silently lost. The files are
written here (tests/wordxml.py: python-docx's package, Word's own XML) and go through the
real loader, chunker, `ragkit ingest`, store, retrieval, default generator and compare."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import wordxml as wx
from conftest import SHARED, make_settings
from hypothesis import HealthCheck, given
from hypothesis import settings as hsettings
from hypothesis import strategies as st
from typer.testing import CliRunner

from ragkit.cli import app
from ragkit.errors import DocumentError
from ragkit.ingest.loaders import load
from ragkit.ingest.sections import build_sections, chunk_sections

runner = CliRunner()
ENV = {"RAGKIT_GENERATOR__N_CTX": "2048", "RAGKIT_GENERATOR__MAX_TOKENS": "64"}
INSERTED = "“five (5)”: inserted by Counsel on 2026-12-01, not yet accepted"
STRUCK = "“two (2)”: deleted by Counsel on 2026-12-01, not yet accepted"
COMMENT = "We cannot accept more than three years."


def term_nda(path: Path) -> Path:
    """The issue's first file: 'survive for ~~two (2)~~ <ins>five (5)</ins> years', with a
    reviewer's comment on the change and a footnote on the clause."""
    body = "".join([
        wx.para(wx.run("MUTUAL NON-DISCLOSURE AGREEMENT"), style="Title"),
        wx.para(wx.run("1. Purpose. The parties wish to explore a supply relationship and will exchange "
                       "Confidential Information for that purpose only.")),
        wx.para(wx.run("5. Term. The obligations of confidentiality survive for ")
                + wx.comment_range(7, wx.dele("two (2)") + wx.ins(wx.run("five (5)")))
                + wx.run(" years after termination of this Agreement.") + wx.footnote_ref(1)),
        wx.para(wx.run("6. Return. On request the Recipient returns or destroys all Confidential Information.")),
    ])
    return wx.write_docx(path, body, footnotes={1: wx.para(wx.run("Five years was agreed on the call of 28 November."))},
                         comments=[(7, "Opposing Counsel", "2026-12-02T09:00:00Z", COMMENT)])


def cover_page(path: Path) -> Path:
    """The issue's second file: an inline content control holding the governing law, a
    block-level one holding a whole paragraph; a header and footer on three sections."""
    body = "".join([
        wx.para(wx.run("Mutual NDA Cover Page"), style="Title"),
        wx.para(wx.run("Governing Law: ") + wx.sdt_inline(wx.run("State of Delaware"))),
        wx.sdt_block(wx.para(wx.run("Confidentiality Period: five years from the Effective Date."))),
    ])
    return wx.write_docx(path, body, header="ACME CONFIDENTIAL DRAFT", footer="Cover page v3",
                         more_sections=(wx.para(wx.run("Schedule 1. Affiliates: none.")),
                                        wx.para(wx.run("Schedule 2. Notices: by email to legal@acme.example."))))


def _chunks(path: Path, embedder):
    return chunk_sections(build_sections(load(path)), embedder.count_tokens, embedder.max_tokens)


def _ingested(chunks) -> str:
    """The text ingest keeps: the chunks' bodies in order, each section's path (headings
    live there) where its first chunk starts (a long paragraph cut into two chunks reads
    on without the path between its halves)."""
    out, last, head = [], None, None
    for c in chunks:
        text = c.text
        lines = text.split("\n")
        if c.kind == "table" and c.section == last and head is not None and lines[:2] == head:
            text = "\n".join(lines[2:])  # a big table's next part repeats its header: read on after it
        head = lines[:2] if c.kind == "table" else None
        out.append(text if c.section == last else f"{c.section}\n{text}")
        last = c.section
    return "\n".join(out)


@pytest.fixture(scope="module")
def embedder():
    from ragkit.config import load_settings
    from ragkit.embed import load_embedder

    return load_embedder(load_settings())


@pytest.fixture(scope="module")
def word_store(tmp_path_factory):
    """The two files ingested by `ragkit ingest` into a real store."""
    folder = tmp_path_factory.mktemp("word")
    term_nda(folder / "term-nda.docx")
    cover_page(folder / "cover-page.docx")
    store = tmp_path_factory.mktemp("word-store") / "ragkit"
    res = runner.invoke(app, ["ingest", str(folder), "--store", str(store), "--json"], env=ENV)
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["added"] == 2
    return make_settings(store, max_tokens=64)


# ---------------------------------------------------------------- the loader, no model

def test_the_issue_files_lose_nothing(tmp_path, embedder):
    """Every text of both files is in their chunks, in order: the inserted words, the
    content controls, the footnote (after its clause, with its mark); struck words are not."""
    term, cover = term_nda(tmp_path / "t.docx"), cover_page(tmp_path / "c.docx")
    for path in (term, cover):
        text = _ingested(_chunks(path, embedder))
        assert wx.lost_texts(path, text) == []
    chunks = _chunks(term, embedder)
    clause = next(c for c in chunks if "survive for" in c.text)
    assert "survive for five (5) years after termination of this Agreement. (footnote 1)" in clause.text
    assert "two (2)" not in " ".join(c.text for c in chunks if c.kind != "comment")
    assert "Footnote 1: Five years was agreed on the call of 28 November." in clause.text
    # the change stays with its clause: the struck words (and where they stood) as well as the inserted ones
    assert sorted(c.describe() for c in clause.changes) == sorted([INSERTED, STRUCK])
    struck = next(c for c in clause.changes if c.kind == "deleted")
    assert struck.before.endswith("survive for ") and struck.after.startswith("five (5) years")
    # the comment: a chunk of its own, marked as a reviewer's, naming the words it is on
    comments = [c for c in chunks if c.kind == "comment"]
    assert [c.text for c in comments] == [f"Comment by Opposing Counsel (2026-12-02) on “five (5)”: {COMMENT}"]
    assert COMMENT not in " ".join(c.text for c in chunks if c.kind != "comment")
    # the cover page: the header and footer of three sections once each, said for what they are
    text = "\n".join(c.text for c in _chunks(cover, embedder))
    assert "Governing Law: State of Delaware" in text
    assert "Confidentiality Period: five years from the Effective Date." in text
    assert text.count("ACME CONFIDENTIAL DRAFT") == 1 and text.count("Cover page v3") == 1
    assert "Header: ACME CONFIDENTIAL DRAFT" in text and "Footer: Cover page v3" in text


# random documents: paragraphs of runs nested in insertions, deletions, hyperlinks, smart
# tags and content controls, with text boxes and footnotes; tables whose cells hold any
# of it; block-level content controls holding paragraphs and tables
_TEXT = st.text(st.characters(whitelist_categories=("Lu", "Ll", "Nd", "Po", "Zs"), max_codepoint=0x2FFF),
                min_size=1, max_size=14)


def _inline(depth: int):
    leaf = _TEXT.map(wx.run) | _TEXT.map(wx.dele)
    if depth == 0:
        return leaf
    inner = st.lists(_inline(depth - 1), min_size=1, max_size=3).map("".join)
    return st.one_of(leaf, leaf, inner.map(wx.ins), inner.map(wx.hyperlink), inner.map(wx.sdt_inline),
                     inner.map(wx.smart_tag))


def _paragraph(notes: list, depth: int):
    parts = st.lists(_inline(2), min_size=1, max_size=4).map("".join)
    if depth == 0:
        return parts.map(wx.para)

    box = st.lists(_paragraph(notes, depth - 1), min_size=1, max_size=2).map(lambda ps: wx.text_box("".join(ps)))

    @st.composite
    def p(draw):
        body = draw(parts)
        if draw(st.booleans()):
            body += draw(box)
        if draw(st.booleans()):
            notes.append(wx.para(wx.run(draw(_TEXT))))
            body += wx.footnote_ref(len(notes))
        body += draw(st.lists(_inline(1), max_size=2).map("".join))
        return wx.para(body)

    return p()


@st.composite
def _document(draw):
    notes: list[str] = []

    def blocks(depth: int):
        para = _paragraph(notes, 1)
        if depth == 0:
            return para
        cell = st.lists(blocks(depth - 1), min_size=1, max_size=2).map("".join)
        table = st.lists(st.lists(cell, min_size=1, max_size=3), min_size=1, max_size=3).map(wx.table)
        sdt = st.lists(blocks(depth - 1), min_size=1, max_size=2).map(lambda bs: wx.sdt_block("".join(bs)))
        return st.one_of(para, para, table, sdt)

    body = draw(st.lists(blocks(2), min_size=1, max_size=5).map("".join))
    return body, {i + 1: n for i, n in enumerate(notes)}


@hsettings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture,
                                                                  HealthCheck.data_too_large])
@given(doc=_document())
def test_no_text_is_lost_from_generated_word_files(tmp_path, embedder, doc):
    """For any document built of Word's nesting elements, every w:t of its main text,
    text boxes and footnotes is in the chunks, in its story's order."""
    body, notes = doc
    path = wx.write_docx(tmp_path / "gen.docx", body, footnotes=notes or None)
    if not any(t.strip() for texts in wx.stories(path).values() for t in texts):  # every word struck
        with pytest.raises(DocumentError, match="no text found"):
            load(path)
        return
    text = _ingested(_chunks(path, embedder))
    assert wx.lost_texts(path, text) == []


def test_no_text_is_lost_from_the_shared_word_files(embedder):
    """The same check on every .docx of the shared corpora (NDAs, templates, FDA guidance)."""
    files = sorted(SHARED.rglob("*.docx"))
    if not files:
        pytest.skip(f"the shared corpora are not at {SHARED} (set RAGKIT_SHARED_CORPORA)")
    lost = {}
    for path in files:
        text = _ingested(_chunks(path, embedder))
        if miss := wx.lost_texts(path, text):
            lost[path.name] = miss[:3]
    assert lost == {}, lost
    assert len(files) >= 10


# ---------------------------------------------------------------- the real path

def test_a_tracked_change_is_answered_and_shown_as_not_accepted(word_store):
    """`ragkit ingest` then `ragkit ask`: the answer is the term as the draft reads with the
    change, and the source says the words are not yet accepted; `ragkit docs` marks the file."""
    res = runner.invoke(app, ["docs", "--store", str(word_store.store), "--json"], env=ENV)
    assert res.exit_code == 0, res.output
    marks = {d["name"]: d["tracked_changes"] for d in json.loads(res.stdout)}
    assert marks["term-nda.docx"] == {"count": 2, "authors": "Counsel", "dates": "2026-12-01"}
    assert marks["cover-page.docx"]["count"] == 0

    res = runner.invoke(app, ["ask", "How long do the obligations survive?", "--doc", "term-nda.docx",
                              "--store", str(word_store.store), "--json"], env=ENV)
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    # the JSON contract of `ask --json`
    assert set(out) >= {"answer", "citations", "usage", "timings", "outcome", "contexts"}
    assert set(out["usage"]) == {"prompt_tokens", "completion_tokens", "cached_tokens"}
    assert set(out["timings"]) >= {"retrieve_s", "prompt_s", "generate_s"}
    assert out["usage"]["prompt_tokens"] + 64 <= 2048
    for c in out["citations"]:
        assert set(c) >= {"doc", "page", "section", "quote", "inferred", "notes"}
        assert c["doc"] == "term-nda.docx" and c["page"] is None  # a Word file has no pages
    assert re.search(r"\bfive\b|\b5\b", out["answer"], re.I), out["answer"]
    assert "two" not in out["answer"].lower()
    notes = [n for c in out["citations"] for n in c["notes"]]
    assert INSERTED in notes, out["citations"]
    # the prompt told the model what is not yet agreed, and what was struck
    clause = next(c for c in out["contexts"] if "survive for five (5)" in c["text"])
    assert {c["kind"] for c in clause["tracked_changes"]} == {"inserted", "deleted"}
    assert "two (2)" not in clause["text"]

    # "what did the other side strike?": the struck words, listed from the file's own
    # change records (never "the documents do not say")
    res = runner.invoke(app, ["ask", "What did the other side strike from the agreement?", "--doc", "term-nda.docx",
                              "--store", str(word_store.store), "--json"], env=ENV)
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    assert (out["outcome"], out["answer_kind"]) == ("supported", "changes")
    assert STRUCK in out["answer"] and "[struck: two (2)] five (5) years" in out["answer"]
    assert INSERTED not in out["answer"]  # a deletion was asked about
    assert out["citations"] and all(c["section"] == "5. Term" for c in out["citations"])


@pytest.mark.complete
def test_content_controls_answer_the_governing_law(word_store):
    res = runner.invoke(app, ["ask", "Which law governs?", "--doc", "cover-page.docx",
                              "--store", str(word_store.store), "--json"], env=ENV)
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    assert "delaware" in (out["answer"] + " ".join(p["quote"] for p in out["passages"])).lower(), out


def test_a_comment_is_found_and_shown_as_a_comment_never_as_contract_text(word_store):
    from ragkit.answer.claims import attribute
    from ragkit.retrieve import retrieve
    from ragkit.session import Session

    session = Session(word_store)
    r = retrieve("What did opposing counsel say about the term?", session, ["term-nda.docx"])
    comments = [c for c in r.prompt.contexts if c.kind == "comment"]
    assert len(comments) == 1 and COMMENT in comments[0].text
    assert "a reviewer's comment, not contract text" in r.prompt.text
    assert comments[0].notes_for(COMMENT) == ["a reviewer's comment, not contract text"]
    # what the comment asks for is not what the contract says: no claim stands on it
    claims = attribute("The obligations survive for three years.", r.prompt.contexts, session.embedder)
    assert claims and not any(c.supported for c in claims)
    # a checklist reads the contract: the comment is not among its sources
    r2 = retrieve("What did opposing counsel say about the term?", session, ["term-nda.docx"], contract_text=True)
    assert r2.prompt.contexts and all(c.kind != "comment" for c in r2.prompt.contexts)


@pytest.mark.complete
def test_compare_cell_quoting_changed_words_says_they_are_not_accepted(word_store):
    from ragkit.compare import compare
    from ragkit.session import Session

    c = compare(["term-nda.docx"], Session(word_store), "nda", items=["term"])
    f = c.rows[0].findings["term-nda.docx"]
    assert f.quote and "five (5)" in f.quote, f
    assert INSERTED in (f.note or ""), f.note
    assert COMMENT not in f.quote


def test_only_questions_about_the_draft_s_changes_are_answered_from_them():
    from ragkit.answer.redline import asks_about_changes

    for q in ("What did the other side strike?", "Which words were deleted?", "Show the tracked changes",
              "What did Counsel change in clause 5?", "Which insertions are not yet accepted?", "List the redlines"):
        assert asks_about_changes(q), q
    for q in ("Must the recipient delete Confidential Information on request?", "Is there a change of control clause?",
              "How long do the obligations survive?", "May the recipient make copies?"):
        assert not asks_about_changes(q), q
