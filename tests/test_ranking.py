"""Ranking stages on the real path: real embedder, real Chroma store, real BM25 index,
real generator tokenizer (issue 14: evidence first)."""

from __future__ import annotations

import pytest
from conftest import make_settings

from ragkit.ingest import ingest
from ragkit.retrieve import retrieve
from ragkit.retrieve.rank import drop_near_duplicates, unit_rank, units
from ragkit.store import Hit, lexical

# An NDA written for these tests (Markdown: each heading is a section title, not body text):
# the clause titled "Return or Destruction" never says "return" or "destroy" in its body
# ("deliver up", "expunge").
NDA = """# MUTUAL NON-DISCLOSURE AGREEMENT

## 1. Definitions

"Confidential Information" means all information, in any form, disclosed by one party to the other in connection with the Purpose, including know-how, designs, prices and customer lists.

## 2. Obligations of the Recipient

The Recipient shall keep the Confidential Information secret, use it only for the Purpose, and disclose it only to those of its employees and advisers who need to know it and are bound by duties of confidence no less strict than these.

## 3. Exclusions

These obligations do not extend to information that is or becomes public other than through a breach of this Agreement, that the Recipient already lawfully held, or that it develops independently without use of the Confidential Information.

## 4. Return or Destruction

Upon the written request of the Discloser at any time, the Recipient shall promptly deliver up to the Discloser all documents and media containing Confidential Information, and shall expunge every copy held in its computer systems, save for copies kept in automatic back-up archives.

## 5. Term

This Agreement continues for three years from the date of signature, and the duties of confidence survive its end for a further five years.

## 6. Governing Law

This Agreement is governed by the laws of England and Wales, and the courts of London have exclusive jurisdiction over any dispute arising from it.

## 7. Remedies

Each party acknowledges that damages alone may not be an adequate remedy for a breach, and that the other party may seek an injunction or specific performance.
"""


@pytest.fixture(scope="module")
def titled_store(tmp_path_factory):
    folder = tmp_path_factory.mktemp("titled")
    docs = folder / "docs"
    docs.mkdir()
    (docs / "titled-nda.md").write_text(NDA, encoding="utf-8")
    (docs / "notes-ru.txt").write_text(
        "Соглашение о конфиденциальности. Получатель обязуется хранить конфиденциальную информацию в тайне.\n\n"
        "Η παρούσα σύμβαση διέπεται από το ελληνικό δίκαιο.\n\n"
        "La résiliation du contrat prend effet après un préavis de trente jours.\n", encoding="utf-8")
    settings = make_settings(folder / "store")
    rep = ingest([docs], settings)
    assert rep.failed == []
    return settings


def _top(settings, question: str, doc: str, **retrieve_settings):
    if retrieve_settings:
        settings = settings.model_copy(update={"retrieve": settings.retrieve.model_copy(update=retrieve_settings)})
    r = retrieve(question, settings, [doc])
    return sorted(r.prompt.contexts, key=lambda c: -c.score)


def test_heading_only_match_ranks_the_titled_clause_first(titled_store):
    """The question's words are only in the clause's heading; its body says "deliver up"."""
    ranked = _top(titled_store, "What does the agreement say about return or destruction of confidential materials?",
                  "titled-nda.md")
    assert "Return or Destruction" in (ranked[0].section or "")
    assert "deliver up" in ranked[0].text and "return" not in ranked[0].text.lower()


def test_bm25_indexes_the_heading_as_a_field():
    meta = {"section": "MUTUAL NON-DISCLOSURE AGREEMENT > 4. Return or Destruction"}
    body = "the Recipient shall deliver up all documents"
    toks = lexical.tokenize(lexical.index_text(body, meta))
    # the deepest heading weighs more than a word of the path above it
    assert toks.count(lexical.tokenize("destruction")[0]) > toks.count(lexical.tokenize("mutual")[0]) >= 1
    assert lexical.index_text(body, {}) == body


def test_sentence_match_returns_its_whole_clause(titled_store):
    """A question matching one sentence of a clause gets the whole clause (the chunk), first."""
    ranked = _top(titled_store, "Can the courts of London hear disputes?", "titled-nda.md")
    assert "Governing Law" in (ranked[0].section or "")
    assert "This Agreement is governed" in ranked[0].text and "exclusive jurisdiction" in ranked[0].text


def test_unit_rank_moves_a_sentence_match_above_the_hybrid_order(titled_store):
    """With the hybrid order reversed on purpose, the best-sentence signal still lifts the
    clause holding the matching sentence."""
    from ragkit.embed import load_embedder
    from ragkit.store import open_store

    emb = load_embedder(titled_store)
    st = open_store(titled_store, emb, create=False)
    doc = [r for r in st.documents() if r.name == "titled-nda.md"][0]
    chunks = st.chunks([doc.doc_id])
    q = "Does the recipient have to expunge copies from its computer systems?"
    target = next(h for h in chunks if "expunge" in h.text)
    reversed_order = [h for h in chunks if h is not target] + [target]
    out = unit_rank(q, emb.embed_query(q), reversed_order, chunks, emb, hybrid_weight=0.0)
    assert out[0].id == target.id
    # fused with the (reversed) hybrid order, the clause still rises from last place to the top two
    out = unit_rank(q, emb.embed_query(q), reversed_order, chunks, emb)
    assert target.id in [h.id for h in out[:2]]
    # and without the unit signals the reversed order stands
    out = unit_rank(q, None, reversed_order, chunks, emb, lexical_weight=0.0, dense_weight=0.0)
    assert out[0].id == reversed_order[0].id


@pytest.mark.parametrize("question, doc, word", [
    ("конфиденциальная информация", "notes-ru.txt", "конфиденциальную"),
    ("ελληνικό δίκαιο", "notes-ru.txt", "ελληνικό"),
    ("resiliation preavis", "notes-ru.txt", "résiliation"),  # accents folded both ways
])
def test_words_outside_a_to_z_are_searchable(titled_store, question, doc, word):
    ix_settings = titled_store
    from ragkit.embed import load_embedder
    from ragkit.store import open_store

    st = open_store(ix_settings, load_embedder(ix_settings), create=False)
    folder = lexical.index_dir(ix_settings.store, ix_settings.store_url, ix_settings.collection, ix_settings.cache_dir)
    ix = lexical.open_index(st, folder, [r.doc_id for r in st.documents()])
    hits = ix.search(question, 3)
    assert hits, f"BM25 found nothing for {question!r}"
    got = st.col.get(ids=[hits[0][0]], include=["documents"])["documents"][0]
    assert word in got


def test_tokenizer_stems_and_keeps_other_scripts():
    t = lexical.tokenize
    assert t("obligations")[0] == t("obligation")[0] == t("obligated")[0][: len(t("obligation")[0])]
    assert t("confidentiality") == t("confidential")
    assert t("Конфиденциальной") == t("конфиденциальная")  # Russian stemmer, case folded
    assert t("Café") == t("cafe")
    assert len(t("비밀유지")) == 3 and len(t("ひみつ")) == 2  # Hangul and kana as bigrams
    assert t("$1,200.50 million") == ["1,200.50", "million"]


def test_near_duplicates_are_dropped_before_packing():
    para = ("Net sales increased during the quarter compared to the same quarter a year ago, driven by higher "
            "sales of iPhone and Services, partially offset by lower sales of Mac.")
    hits = [Hit("q3", para, {}, 0.9), Hit("other", "Operating expenses rose 7% on research spending.", {}, 0.8),
            Hit("q2", para.replace("quarter a year ago", "quarter a year ago ") + " ", {}, 0.7),
            Hit("q1", "As reported: " + para, {}, 0.6)]
    kept, dropped = drop_near_duplicates(hits, 0.9)
    assert [h.id for h in kept] == ["q3", "other"] and dropped == 2
    kept, dropped = drop_near_duplicates(hits, 0)
    assert len(kept) == 4 and dropped == 0


def test_dedupe_in_retrieve_spends_no_budget_twice(tmp_path):
    """Two filings that repeat a paragraph word for word: the prompt holds it once."""
    docs = tmp_path / "docs"
    docs.mkdir()
    repeated = ("Our business is subject to risks from changes in foreign exchange rates, which affect the value of "
                "revenue earned outside the United States and the cost of components bought in other currencies.")
    for q, revenue in (("one", 10), ("two", 12)):
        (docs / f"q{q}.md").write_text(f"# Quarter {q} report\n\n## Risk factors\n\n{repeated}\n\n## Results\n\n"
                                      f"In quarter {q} revenue was {revenue} million, and the gross margin was stable "
                                      f"against the quarter before, with operating expenses flat.\n")
    settings = make_settings(tmp_path / "store")
    ingest([docs], settings)
    q = "What risk do foreign exchange rates pose?"
    on = retrieve(q, settings)
    off = retrieve(q, settings.model_copy(update={"retrieve": settings.retrieve.model_copy(update={"dedupe": 0.0})}))
    count = lambda r: sum("foreign exchange rates" in c.text for c in r.prompt.contexts)  # noqa: E731
    assert count(off) == 2 and count(on) == 1


def test_units_split_sentences_and_list_items():
    u = units("The Recipient shall deliver up all documents. (a) copies made by it; (b) notes; and (c) other material. Ok.")
    assert u[0] == "The Recipient shall deliver up all documents."
    assert any(x.startswith("(a)") for x in u) and all(len(x.split()) >= 2 for x in u)


# ---------------------------------------------------------------------- the search text

def test_search_text_leaves_out_answer_format_and_question_frame():
    from ragkit.retrieve.query import search_query

    q = ("Does the agreement state that Receiving Party may retain some Confidential Information? "
         "Start your answer with Yes, No or Not mentioned.")
    assert search_query(q) == "Receiving Party may retain some Confidential Information?"
    assert search_query("Which law governs? Answer with exactly one of: Yes, No, Not mentioned.") == "Which law governs?"
    assert search_query("Which part of this contract concerns Governing Law (Which law governs)? Quote it.") == \
        "Governing Law (Which law governs)?"
    # content is never dropped: a question that is only a frame stays as asked
    assert search_query("Does the agreement state?") == "Does the agreement state?"
    assert search_query("What is the notice period? Is it 30 days?") == "What is the notice period? Is it 30 days?"


def test_answer_format_instructions_do_not_change_what_is_found(titled_store):
    """Words of the instruction ("answer", "mentioned") are rare in a contract; searched,
    they would reward any clause holding them. The sources are those of the bare question."""
    bare = "Can the courts of London hear disputes?"
    asked = _top(titled_store, bare + " Start your answer with Yes, No or Not mentioned.", "titled-nda.md")
    assert [c.chunk_id for c in asked] == [c.chunk_id for c in _top(titled_store, bare, "titled-nda.md")]
    assert "Governing Law" in (asked[0].section or "")


@pytest.fixture(scope="module")
def cuad_store(tmp_path_factory):
    """The CUAD joint venture agreement of tests/fixtures/unseen (its gold labels: parties
    KIROMIC BIOPHARMA Inc. and MOLIPHARMA S.R.L.; chunk 0 is the exhibit legend, chunk 1
    the preamble; its date, 2 April 2020, is in the signature block at the end)."""
    from pathlib import Path

    folder = tmp_path_factory.mktemp("cuad")
    settings = make_settings(folder / "store")
    rep = ingest([Path(__file__).parent / "fixtures" / "unseen" / "cuad_kiromic_joint_venture.pdf"], settings)
    assert rep.failed == []
    return settings


@pytest.mark.parametrize("question, gold", [
    ("Who are the parties to this agreement?", "MOLIPHARMA S.R.L."),
    ("What is the name of this agreement?", "JOINT VENTURE AGREEMENT BETWEEN"),
])
def test_title_parties_and_date_questions_get_the_opening_first(cuad_store, question, gold):
    """The preamble shares few words with "who are the parties"; the rule puts the
    document's first two chunks first for such questions (CUAD dev: gold clause within 2,000
    prompt tokens 0.556 -> 0.646, eval/README.md). Off, the opening is not the first source."""
    doc = "cuad_kiromic_joint_venture.pdf"
    def holds(cs) -> bool:
        return any(gold in c.text.replace("\n", " ") for c in cs)

    ranked = _top(cuad_store, question, doc)
    assert sorted(c.chunk_index for c in ranked[:2]) == [0, 1]  # the exhibit legend, then the preamble
    assert holds(ranked[:2])
    off = _top(cuad_store, question, doc, opening_first=False)
    assert sorted(c.chunk_index for c in off[:2]) != [0, 1]  # without the rule the opening is not first


def test_other_questions_keep_their_order(cuad_store):
    from ragkit.retrieve.rank import asks_for_opening

    assert not asks_for_opening("Which parties to the contract own the joint IP?")
    q = "Which law governs this agreement?"
    doc = "cuad_kiromic_joint_venture.pdf"
    assert [c.chunk_id for c in _top(cuad_store, q, doc)] == [c.chunk_id for c in _top(cuad_store, q, doc, opening_first=False)]
