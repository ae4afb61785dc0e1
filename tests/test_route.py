"""Routing (ragkit/retrieve/route.py): a question over the whole store that names documents by
who they are is searched in those documents."""

from __future__ import annotations

from ragkit.retrieve.route import names_in, periods_in, route, words
from ragkit.store import DocRecord


def _rec(name: str) -> DocRecord:
    return DocRecord(key=f"/d/{name}", doc_id=name.lower(), name=name, path=f"/d/{name}", sha256="0", n_chunks=3,
                     n_sections=1, n_pages=None, ingested_at=0.0)


FILINGS = {
    "VERIZON_2021_10K.pdf": "FORM 10-K For the fiscal year ended December 31, 2021 Verizon Communications Inc. New York, New York",
    "VERIZON_2022_10K.pdf": "FORM 10-K For the fiscal year ended December 31, 2022 Verizon Communications Inc.",
    "GENERALMILLS_2020_10K.pdf": "FORM 10-K GENERAL MILLS, INC. Number One General Mills Boulevard Minneapolis",
    "PEPSICO_2022_10K.pdf": "FORM 10-K PepsiCo, Inc. 700 Anderson Hill Road Purchase, New York",
    "AMD_2015_10K.pdf": "FORM 10-K ADVANCED MICRO DEVICES, INC. One AMD Place Sunnyvale, California",
    "CORNING_2022_10K.pdf": "FORM 10-K CORNING INCORPORATED One Riverfront Plaza Corning, New York",
}


def test_a_question_naming_a_company_routes_to_its_filings_and_one_naming_none_to_none():
    records = [_rec(n) for n in FILINGS]
    openings = {r.doc_id: words(FILINGS[r.name]) for r in records}

    got, names = route("Is Verizon a capital intensive business?", records, openings)
    assert [r.name for r in got] == ["VERIZON_2021_10K.pdf", "VERIZON_2022_10K.pdf"] and names == ["Verizon"]
    # of a company's filings, the period the question names (its cover's fiscal year)
    got, names = route("Is Verizon a capital intensive business based on FY 2022 data?", records, openings)
    assert [r.name for r in got] == ["VERIZON_2022_10K.pdf"] and names == ["Verizon", "FY 2022"]
    # both years named: both filings; a year neither holds narrows nothing
    got, _ = route("Has Verizon's debt grown between 2021 and 2022?", records, openings)
    assert len(got) == 2
    got, _ = route("What will Verizon pay its retirees in 2024?", records, openings)
    assert len(got) == 2
    # a company written as two words is found in its cover page, and its file name's one word
    got, names = route("What is General Mills's FY2020 working capital ratio?", records, openings)
    assert [r.name for r in got] == ["GENERALMILLS_2020_10K.pdf"] and "General Mills" in names
    # a name in every second document is not rare enough ("New York": three covers of six)
    assert route("Which of the companies based in New York pays a dividend?", records, openings) == ([], [])
    # no capitalised word but the sentence's first: the whole store
    assert route("What was the total revenue growth rate?", records, openings) == ([], [])
    # a capital opening a sentence names nothing ("Corning" is a company, but here it opens the question)
    assert names_in("Corning fiber. Has Pepsico reported restructuring?") == [("pepsico", "Pepsico", False)]
    assert periods_in("the Q3 2022 report, the first quarter of fiscal 2023, FY2021") == [
        ("2022", "2022"), ("2023", "fiscal 2023"), ("2021", "FY2021"), ("q3", "Q3"), ("q1", "first quarter")]
    # a store of two documents is never routed
    assert route("Is Verizon a capital intensive business?", records[:2], openings) == ([], [])


def test_a_question_over_the_store_naming_one_nda_is_answered_from_it(nda_store):
    """The seven sample NDAs: a question that names Bonterms is searched in Bonterms' NDA alone
    (the sources and the answer's JSON say so); the demo's question, which names no document,
    and the same question with `retrieve.route` off, are searched over all seven."""
    from ragkit.answer.ask import ABSTAIN_TEXT, AskResult, display_text
    from ragkit.retrieve import retrieve
    from ragkit.session import Session

    session = Session(nda_store)
    q = "How long do the confidentiality obligations survive under the Bonterms agreement?"
    r = retrieve(q, session)
    assert r.routed == ["Bonterms"] and [d.name for d in r.docs] == ["bonterms-mutual-nda-v1.pdf"]
    assert r.prompt.contexts and {c.doc for c in r.prompt.contexts} == {"bonterms-mutual-nda-v1.pdf"}
    res = AskResult.from_retrieval(r)
    assert res.to_json()["routed"] == {"documents": ["bonterms-mutual-nda-v1.pdf"], "names": ["Bonterms"]}
    # a not_found answer speaks for the documents searched, and says so (not for the store)
    res.outcome, res.answer = "not_found", ABSTAIN_TEXT
    assert display_text(res).startswith(ABSTAIN_TEXT + "\n\nSearched bonterms-mutual-nda-v1.pdf only: the question "
                                        "names Bonterms")

    demo = retrieve("How long do the confidentiality obligations survive after the agreement ends?", session)
    assert demo.routed == [] and len(demo.docs) == 7 and AskResult.from_retrieval(demo).to_json()["routed"] is None
    whole_store = AskResult.from_retrieval(demo)
    whole_store.outcome, whole_store.answer = "not_found", ABSTAIN_TEXT
    assert display_text(whole_store) == ABSTAIN_TEXT

    off = nda_store.model_copy(update={"retrieve": nda_store.retrieve.model_copy(update={"route": False})})
    whole = retrieve(q, session.with_settings(off))
    assert whole.routed == [] and len(whole.docs) == 7
    assert len({c.doc for c in whole.prompt.contexts}) > 1
    session.close()
