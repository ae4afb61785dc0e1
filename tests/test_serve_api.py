"""`ragkit serve` through the official OpenAI client: a real server on loopback (a
subprocess with --token), the default model, and a store ingested from corpora/nda."""

from __future__ import annotations

import re

import httpx
import openai
import pytest
from conftest import CORPORA
from serve_fixture import running_server

TOKEN = "test-token-7f3a"
NDA = "ai-osi-stack-mutual-nda.md"
SURVIVE = "How long do the confidentiality obligations survive?"


@pytest.fixture(scope="module")
def server(nda_store, tmp_path_factory):
    with running_server(nda_store.store, token=TOKEN, log_dir=tmp_path_factory.mktemp("serve-api")) as srv:
        yield srv


@pytest.fixture(scope="module")
def client(server):
    return server.client()


def ask(client, question: str, model: str = f"ragkit:{NDA}", **kw):
    return client.chat.completions.create(model=model, messages=[{"role": "user", "content": question}], **kw)


def test_ready_line_and_health(server):
    assert server.ready["url"] == server.url and server.ready["base_url"] == server.base_url
    assert server.ready["token_required"] is True
    assert server.ready["documents"] == len(list(CORPORA.iterdir()))
    h = httpx.get(server.url + "/health", trust_env=False).json()  # no token needed
    assert h["status"] == "ok" and h["documents"] == len(list(CORPORA.iterdir()))
    assert h["generator"] == "qwen2.5-coder-0.5b" and h["busy"] is False


def test_lists_the_store_and_each_document(client):
    ids = [m.id for m in client.models.list().data]
    assert ids[0] == "ragkit"
    assert sorted(ids[1:]) == sorted(f"ragkit:{p.name}" for p in CORPORA.iterdir())
    assert client.models.retrieve(f"ragkit:{NDA}").id == f"ragkit:{NDA}"


def test_answer_with_sources_in_the_content_and_structured(client):
    r = ask(client, SURVIVE)
    d = r.model_dump()
    content = r.choices[0].message.content
    answer, _, sources = content.partition("\n\nSources:\n")
    assert re.search(r"\b(three|3)\b", answer, re.I), content  # 7.2: three (3) years from disclosure
    lines = sources.splitlines()
    assert lines and all(re.match(rf"^\[\d+\] {re.escape(NDA)}(, .*)?$", ln) for ln in lines), content
    cites = d["citations"]
    assert cites and all(c["doc"] == NDA for c in cites)
    assert set(cites[0]) >= {"n", "doc", "doc_id", "page", "section", "quote", "inferred"}
    ctx = {c["n"]: c for c in d["ragkit"]["contexts"]}
    assert ctx and all(c["doc"] == NDA for c in ctx.values())
    by_n = {int(re.match(r"^\[(\d+)\]", ln).group(1)): ln for ln in lines}
    assert sorted(by_n) == sorted(c["n"] for c in cites)
    for c in cites:  # each citation names its prompt source: number, document id, section
        assert c["doc_id"] == ctx[c["n"]]["doc_id"] and c["section"] == ctx[c["n"]]["section"]
        assert by_n[c["n"]].endswith(" (inferred)") == c["inferred"]
        if c["section"]:
            assert f"§ {c['section']}" in by_n[c["n"]]
    assert "three" in " ".join(c["quote"] for c in cites).lower()
    assert d["ragkit"]["abstained"] is False and d["ragkit"]["invalid_citations"] == []
    # claims: each tied to the source sentence that supports it (not the whole chunk)
    claims = d["claims"]
    assert claims and all({"text", "supported", "citations", "support"} <= set(c) for c in claims)
    held = [c for c in claims if c["supported"]]
    assert held, claims  # "three (3) years from the date of disclosure" is in 7.2
    for c in held:
        for s in c["citations"]:  # a sentence of a prompt source, with its place
            assert s["doc"] == NDA and s["doc_id"] == ctx[s["n"]]["doc_id"] and s["section"] == ctx[s["n"]]["section"]
            assert 0 < len(s["quote"]) < 400
    assert any("three (3) years" in s["quote"] for c in held for s in c["citations"])
    u = r.usage
    assert u.prompt_tokens > 200 and 0 < u.completion_tokens <= 96
    assert u.total_tokens == u.prompt_tokens + u.completion_tokens
    assert u.prompt_tokens_details is not None and u.prompt_tokens_details.cached_tokens >= 0
    assert r.choices[0].finish_reason in ("stop", "length") and r.object == "chat.completion"


def test_streaming_answer_final_citations_then_usage(client):
    stream = ask(client, "Which law governs this agreement?", stream=True, stream_options={"include_usage": True},
                 temperature=0.9, top_p=0.5)  # sampling options are accepted and ignored
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    answer = text.partition("\n\nSources:\n")[0]
    assert answer.strip() and answer == answer.lstrip()
    finals = [i for i, c in enumerate(chunks) if c.choices and c.choices[0].finish_reason]
    assert len(finals) == 1
    final = chunks[finals[0]].model_dump()
    assert isinstance(final["citations"], list) and "ragkit" in final
    assert all(c["doc"] == NDA for c in final["citations"])
    assert all(c["doc"] == NDA for c in final["ragkit"]["contexts"])
    if final["citations"]:
        assert "\n\nSources:\n" in text
    usage = chunks[-1]
    assert finals[0] == len(chunks) - 2 and usage.choices == []  # the usage chunk comes last
    assert usage.usage.completion_tokens > 0 and usage.usage.prompt_tokens > 200
    assert all(c.usage is None for c in chunks[:-1])
    assert len({c.id for c in chunks}) == 1


def test_follow_up_on_the_same_document_prefills_only_the_new_part(client):
    first = ask(client, SURVIVE)
    messages = [
        {"role": "system", "content": "You are a helpful assistant."},  # ignored: ragkit's own rules apply
        {"role": "user", "content": SURVIVE},
        {"role": "assistant", "content": first.choices[0].message.content},
        {"role": "user", "content": "And which law governs the agreement?"},
    ]
    r = client.chat.completions.create(model=f"ragkit:{NDA}", messages=messages)
    u = r.usage
    cached = u.prompt_tokens_details.cached_tokens
    assert cached > 0 and cached >= 0.75 * u.prompt_tokens, u
    assert u.prompt_tokens > first.usage.prompt_tokens  # the earlier turn is in the prompt
    # the same sources were packed, so the documents-first prefix was identical
    assert r.model_dump()["ragkit"]["contexts"] == first.model_dump()["ragkit"]["contexts"]
    assert r.choices[0].message.content.strip()


@pytest.mark.complete
def test_extra_body_docs_pick_documents(client):
    r = ask(client, "Which law governs this agreement?", model="ragkit", extra_body={"docs": ["bonterms-mutual-nda-v1"]})
    d = r.model_dump()
    assert {c["doc"] for c in d["ragkit"]["contexts"]} == {"bonterms-mutual-nda-v1.pdf"}
    assert all(c["doc"] == "bonterms-mutual-nda-v1.pdf" for c in d["citations"])
    assert all(isinstance(c["page"], int) for c in d["ragkit"]["contexts"])  # a PDF: pages


def test_unknown_documents_and_models_are_not_found(client):
    with pytest.raises(openai.NotFoundError) as e:
        ask(client, SURVIVE, model="ragkit:NOPE.pdf")
    assert e.value.body["code"] == "document_not_found" and "NOPE.pdf" in e.value.body["message"]
    assert e.value.body["param"] == "model"
    with pytest.raises(openai.NotFoundError) as e:
        ask(client, SURVIVE, model="ragkit", extra_body={"docs": [NDA, "nothing-like-this"]})
    assert e.value.body["code"] == "document_not_found" and e.value.body["param"] == "docs"
    with pytest.raises(openai.NotFoundError) as e:
        ask(client, SURVIVE, model="gpt-4o")
    assert e.value.body["code"] == "model_not_found"
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("ragkit:NOPE.pdf")


def test_missing_or_bad_token_is_refused(server):
    for key in ("wrong-token", TOKEN + "x", TOKEN[:-1]):
        bad = server.client(api_key=key)
        with pytest.raises(openai.AuthenticationError) as e:
            bad.models.list()
        assert e.value.body["code"] == "invalid_api_key" and e.value.response.headers["www-authenticate"] == "Bearer"
        with pytest.raises(openai.AuthenticationError):
            ask(bad, SURVIVE)
    r = httpx.get(server.url + "/v1/models", trust_env=False)  # no Authorization header at all
    assert r.status_code == 401 and set(r.json()["error"]) == {"message", "type", "param", "code"}


@pytest.mark.complete
def test_max_tokens_is_honoured_and_capped(client):
    r = ask(client, SURVIVE, max_tokens=4)
    assert r.usage.completion_tokens <= 4 and r.choices[0].finish_reason == "length"
    r = ask(client, SURVIVE, max_tokens=100_000)  # over the server's max_tokens: capped, not an error
    assert 0 < r.usage.completion_tokens <= 96


def test_requests_without_a_question_are_bad_requests(client):
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="ragkit", messages=[{"role": "system", "content": "hi"}])
    assert e.value.body["param"] == "messages" and "user message" in e.value.body["message"]
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model="ragkit", messages=[{"role": "user", "content": "   "}])
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model="ragkit", messages=[{"role": "user", "content": SURVIVE}], n=2)
    with pytest.raises(openai.BadRequestError) as e:  # a path is not a document name over HTTP
        ask(client, SURVIVE, model="ragkit", extra_body={"docs": ["/etc/passwd"]})
    assert e.value.body["param"] == "docs"
