"""Logic tests on the library's fakes, and they say so: `ragkit.generate.python_function.FunctionGenerator`
(the answer is what a Python function returns for the prompt) and `ragkit.embed.hash.HashEmbedder`
(word hashing, no model), over the real sample NDAs in a real Chroma store with the real
BM25 index. They check what an answer *is* once a model has written it (supported,
unverified, not_found; the stream ends as the non-streamed answer) in seconds, with no
weights; the same rules on the real model and embedder: tests/test_outcomes.py,
tests/test_serve_outcomes.py."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
from conftest import CORPORA
from fastapi.testclient import TestClient

BONTERMS = "bonterms-mutual-nda-v1.pdf"
BACKUP = "Can the recipient keep backup copies after termination?"
RETAIN = "Recipient may retain Confidential Information in accordance with its standard backup or record retention policies"

# what the scripted generator of the settings-built tests answers (generator.model = "test_fakes:scripted")
SCRIPT = {"answer": "The documents do not say."}


def scripted(prompt: str) -> str:
    return SCRIPT["answer"]


@pytest.fixture(scope="module")
def fake(tmp_path_factory):
    from ragkit.config import load_settings
    from ragkit.ingest import ingest

    store = tmp_path_factory.mktemp("fakes") / "ragkit"
    s = load_settings(store=store, embed={"backend": "hash"}, retrieve={"rerank": "off"},
                      generator={"backend": "function", "model": "test_fakes:scripted", "n_ctx": 4096, "max_tokens": 128})
    rep = ingest([CORPORA], s)
    assert rep.failed == [] and rep.added == len(list(CORPORA.iterdir()))
    return s


def _ask(settings, question, answer, docs=(BONTERMS,)):
    from ragkit.answer.ask import ask
    from ragkit.generate.python_function import FunctionGenerator

    gen = FunctionGenerator(lambda prompt: answer)
    return ask(question, settings, list(docs), generator=gen), gen


def test_the_fakes_are_backends_of_the_settings(fake):
    from ragkit.embed import load_embedder
    from ragkit.generate import load_generator
    from ragkit.store import open_store

    emb = load_embedder(fake)
    assert emb.name == "hash-256" and emb.embed_query("retain backup copies") == emb.embed_query("retain backup copies")
    assert open_store(fake, emb, create=False).col.metadata["embedder"] == "hash-256"  # its own store identity
    with pytest.raises(Exception, match="minilm|embedder"):  # a store of the fake takes no other embedder's vectors
        open_store(fake, SimpleNamespace(name="minilm", dim=384), create=False)
    gen = load_generator(fake)
    assert gen.generate(gen.tokenize("q", special=True), max_tokens=32).text == SCRIPT["answer"]
    ids = gen.tokenize("Recipient may retain  copies, (7).", special=False)
    assert gen.detokenize(ids) == "Recipient may retain  copies, (7)." and len(ids) == 13  # words, space runs, marks


def test_a_supported_answer_ties_its_claim_to_the_retention_sentence(fake):
    r, gen = _ask(fake, BACKUP, RETAIN + ".")
    assert "Confidential Information" in gen.prompts[0] and BACKUP in gen.prompts[0]  # the real prompt reached it
    assert r.outcome == "supported" and not r.abstained, (r.outcome, r.unverified_reason)
    held = [c for c in r.claims if c.supported]
    assert held and "retain" in held[0].citations[0].quote and "do not say" not in r.answer


def test_the_models_do_not_say_is_unverified_with_the_retention_passage(fake):
    from ragkit.answer.ask import display_text

    r, _ = _ask(fake, BACKUP, "The documents do not say.")
    assert r.outcome == "unverified" and not r.abstained, (r.outcome, r.abstain_reason)
    # the passages of the clause on point (which sentence of it comes first is the real embedder's
    # business: the hash embedder reads no meaning; tests/test_outcomes.py checks the quote itself)
    assert r.passages and all("Return or Destruction" in (p.section or "") for p in r.passages), [p.section for p in r.passages]
    shown = display_text(r)
    assert "do not say" not in shown and shown.startswith("Not verified against the sources")
    assert all(c.inferred for c in r.citations) and r.model_answer == "The documents do not say."


def test_an_invented_period_is_not_verified_and_the_model_text_is_kept(fake):
    wrong = "Recipient may retain Confidential Information in its backup systems for 10 years."
    r, _ = _ask(fake, BACKUP, wrong)
    assert r.claims and r.claims[0].missing_figures, [c.to_json() for c in r.claims]
    assert r.outcome == "unverified" and r.model_answer == wrong


def test_a_question_the_documents_lack_is_not_found_citing_nothing(fake):
    r, _ = _ask(fake, "What is the capital of France?", "Paris is the capital of France.")
    assert r.outcome == "not_found" and r.abstained and r.citations == [] and r.passages == []
    assert r.answer == "The documents do not say."


def test_a_clause_asking_question_is_quoted_without_generating(fake):
    q = "Which part of this contract concerns the return or destruction of Confidential Information? Quote it."
    r, gen = _ask(fake, q, "never used")
    assert gen.prompts == [] and r.answer_kind == "quoted" and r.outcome == "supported"
    assert any("destroy" in p.quote or "return" in p.quote.lower() for p in r.passages)


def test_serve_streams_and_answers_alike_on_the_fakes(fake):
    """The same outcome, passages and text through `ragkit serve`'s /v1 route, streamed and not
    (the app in-process over the fakes; the real server and the openai client: tests/test_serve_outcomes.py)."""
    from ragkit.serve.app import create_app

    SCRIPT["answer"] = "The documents do not say."
    body = {"model": f"ragkit:{BONTERMS}", "messages": [{"role": "user", "content": BACKUP}]}
    with TestClient(create_app(fake, preload=False), base_url="http://127.0.0.1") as client:
        plain = client.post("/v1/chat/completions", json=body).json()
        with client.stream("POST", "/v1/chat/completions", json={**body, "stream": True}) as resp:
            events = [json.loads(line[6:]) for line in resp.iter_lines() if line.startswith("data: {")]
    text = "".join((e["choices"][0]["delta"].get("content") or "") for e in events if e.get("choices"))
    final = [e for e in events if e.get("choices") and e["choices"][0].get("finish_reason")][-1]
    assert plain["ragkit"]["outcome"] == final["ragkit"]["outcome"] == "unverified"
    assert [p["quote"] for p in final["ragkit"]["passages"]] == [p["quote"] for p in plain["ragkit"]["passages"]]
    assert text == plain["choices"][0]["message"]["content"] and "do not say" not in text


def test_compare_reads_the_label_from_a_short_answer_on_the_fakes(fake):
    """The checklist on the fakes: an engine without log-probabilities (the function
    generator has no `choose`) gets its label read from a short answer, and says so."""
    from ragkit.compare import compare

    # the generator's path (no label model), its written answer allowed to decide (compare.text_labels)
    words = fake.model_copy(update={"compare": fake.compare.model_copy(update={"label_model": "off", "text_labels": True})})
    SCRIPT["answer"] = "Yes."
    c = compare([BONTERMS], words, items=["nda-12"])
    f = c.rows[0].findings[BONTERMS]
    assert f.label == "Yes" and f.confidence is None, f.to_json()  # read, not scored: no probability is shown
    assert "independently" in f.quote and "Exceptions" in (f.section or "")
    SCRIPT["answer"] = "No."
    f2 = compare([BONTERMS], words, items=["nda-12"]).rows[0].findings[BONTERMS]
    assert f2.label == "No" and f2.confidence is None and f2.quote == f.quote, f2.to_json()  # the quote is not the model's
    assert f2.decided_by == "generator"
    # without compare.text_labels (the default) a written answer could decide nothing, so none is asked for:
    # the evidence's Yes, nothing prefilled
    strict = fake.model_copy(update={"compare": fake.compare.model_copy(update={"label_model": "off"})})
    f3 = compare([BONTERMS], strict, items=["nda-12"]).rows[0].findings[BONTERMS]
    assert f3.label == "Yes" and f3.decided_by == "evidence" and f3.prompt_tokens == 0 and f3.scores == {}, f3.to_json()
    # with a No threshold the generator is asked; one that cannot score does not decide from its text, and says so
    SCRIPT["answer"] = "No."
    thr = fake.model_copy(update={"compare": fake.compare.model_copy(update={"label_model": "off", "no_min_confidence": 0.6})})
    f4 = compare([BONTERMS], thr, items=["nda-12"]).rows[0].findings[BONTERMS]
    assert f4.label == "Yes" and f4.decided_by == "evidence" and "cannot score the options" in f4.note, f4.to_json()


def test_the_cli_shows_a_name_the_source_lacks_as_a_flag(fake):
    """`ragkit ask` in a terminal, on the fakes: a claim that names what its sentence does not
    ("Delaware") keeps its support and shows the flag (a flag, not a veto: issue 23)."""
    from typer.testing import CliRunner

    from ragkit.cli import app

    SCRIPT["answer"] = RETAIN + " in Delaware."
    env = {"RAGKIT_EMBED__BACKEND": "hash", "RAGKIT_GENERATOR__BACKEND": "function",
           "RAGKIT_GENERATOR__MODEL": "test_fakes:scripted", "RAGKIT_RETRIEVE__RERANK": "off",
           "RAGKIT_GENERATOR__N_CTX": "4096", "COLUMNS": "200"}
    res = CliRunner().invoke(app, ["ask", BACKUP, "--store", str(fake.store), "--doc", BONTERMS], env=env)
    assert res.exit_code == 0, res.output
    assert "names what its source does not: Delaware" in res.output and "do not say" not in res.output
