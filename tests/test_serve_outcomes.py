"""`ragkit serve`: a streamed and a non-streamed answer end in the same state (issue 23):
the same outcome, the same passages, the same content; the final chunk carries the
outcome and the passages. A real server (subprocess), the default model with the
default context and answer length (as a user runs it), the sample NDAs."""

from __future__ import annotations

import pytest
from serve_fixture import running_server

BONTERMS = "bonterms-mutual-nda-v1.pdf"
BACKUP = "Can the recipient keep backup copies after termination?"
RETAIN = "Recipient may retain Confidential Information in accordance with its standard backup or record retention policies"
DEFAULTS = {"RAGKIT_GENERATOR__N_CTX": "3072", "RAGKIT_GENERATOR__MAX_TOKENS": "320"}


@pytest.fixture(scope="module")
def client(nda_store, tmp_path_factory):
    with running_server(nda_store.store, env=DEFAULTS, log_dir=tmp_path_factory.mktemp("serve-outcomes")) as srv:
        yield srv.client(timeout=900.0)  # a 320-token answer on 2 busy cores


def _both(client, question: str, doc: str):
    msgs = [{"role": "user", "content": question}]
    plain = client.chat.completions.create(model=f"ragkit:{doc}", messages=msgs).model_dump()
    chunks = [c.model_dump() for c in client.chat.completions.create(model=f"ragkit:{doc}", messages=msgs, stream=True)]
    text = "".join((c["choices"][0]["delta"].get("content") or "") for c in chunks if c["choices"])
    finals = [c for c in chunks if c["choices"] and c["choices"][0]["finish_reason"]]
    assert len(finals) == 1
    return plain, text, finals[0]


def test_stream_and_non_stream_end_in_the_same_outcome_with_the_passages(client):
    plain, text, final = _both(client, BACKUP, BONTERMS)
    rk, fk = plain["ragkit"], final["ragkit"]
    assert rk["outcome"] in ("supported", "unverified") and fk["outcome"] == rk["outcome"], (rk, fk)
    assert [p["quote"] for p in fk["passages"]] == [p["quote"] for p in rk["passages"]]
    assert text == plain["choices"][0]["message"]["content"]  # the stream's text is the answer's content
    assert "do not say" not in text.lower() and rk["abstained"] is False
    assert final["citations"] == plain["citations"]
    if rk["outcome"] == "unverified":
        assert RETAIN in fk["passages"][0]["quote"] and fk["passages"][0]["doc"] == BONTERMS
        assert "Not verified against the sources." in text and RETAIN in text
        assert fk["model_answer"] and text.startswith(fk["model_answer"])  # the model's text, marked by what follows


@pytest.mark.complete
def test_not_found_streams_as_it_answers_citing_nothing(client):
    plain, text, final = _both(client, "What is the purchase price of the shares?", "ai-osi-stack-mutual-nda.md")
    assert plain["ragkit"]["outcome"] == final["ragkit"]["outcome"] == "not_found"
    assert plain["citations"] == final["citations"] == [] and final["ragkit"]["passages"] == []
    assert text == plain["choices"][0]["message"]["content"] and text.endswith("The documents do not say.")
    assert "\n\nSources:\n" not in text
