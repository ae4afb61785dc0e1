"""`ragkit chat` on the real path: the default GGUF in process, its KV cache kept across
questions, and saved/restored across processes with --state-dir."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from conftest import ROOT, make_settings
from typer.testing import CliRunner

from ragkit.cli import app

NDA = ROOT / "corpora" / "nda" / "ai-osi-stack-mutual-nda.md"
ENV = {"RAGKIT_GENERATOR__N_CTX": "2048", "RAGKIT_GENERATOR__MAX_TOKENS": "48"}
QUESTIONS = [
    "How long do the confidentiality obligations survive after the agreement ends?",
    "Which law governs this agreement?",
]
runner = CliRunner()


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    from ragkit.ingest import ingest

    path = tmp_path_factory.mktemp("store-chat") / "ragkit"
    report = ingest([NDA], make_settings(path))
    assert report.failed == [] and report.added == 1
    return path


@pytest.fixture(scope="module")
def first_session(store, tmp_path_factory):
    """One `ragkit chat --json` over a questions file of two questions on one document."""
    d = tmp_path_factory.mktemp("chat")
    qfile = d / "questions.txt"
    qfile.write_text("# NDA questions\n" + "\n\n".join(QUESTIONS) + "\n", encoding="utf-8")
    state = d / "state"
    res = runner.invoke(app, ["chat", "--store", str(store), "--doc", "ai-osi-stack-mutual-nda", "--questions", str(qfile),
                              "--state-dir", str(state), "--json"], env=ENV)
    assert res.exit_code == 0, res.output
    answers = [json.loads(line) for line in res.stdout.splitlines() if line.strip()]
    return answers, state


def test_follow_up_reuses_the_kv_cache(first_session):
    answers, _ = first_session
    assert [a["question"] for a in answers] == QUESTIONS  # the comment and blank line were skipped
    first, second = answers
    for a in answers:  # the shape of `ask --json`
        assert {"answer", "citations", "usage", "timings", "mode", "contexts"} <= set(a)
        assert set(a["usage"]) == {"prompt_tokens", "completion_tokens", "cached_tokens"}
        assert a["answer"] and a["mode"] == "whole"
        assert a["usage"]["prompt_tokens"] + 48 <= 2048
    print(f"\nchat TTFT: first {first['timings']['ttft_s']:.2f}s ({first['usage']['cached_tokens']} of "
          f"{first['usage']['prompt_tokens']} cached), follow-up {second['timings']['ttft_s']:.2f}s "
          f"({second['usage']['cached_tokens']} of {second['usage']['prompt_tokens']} cached)")
    assert first["usage"]["cached_tokens"] < 0.5 * first["usage"]["prompt_tokens"]  # a cold model prefilled it
    assert second["usage"]["cached_tokens"] >= 0.9 * second["usage"]["prompt_tokens"]


def test_state_is_saved_once_per_document_set(first_session):
    _, state = first_session
    files = list(state.iterdir())
    assert len(files) == 1 and files[0].suffix == ".npz", files  # two questions, one prefix, one file
    assert files[0].stat().st_size > 1_000_000  # the KV cache of ~1600 tokens, not an empty shell


@pytest.mark.complete
def test_a_new_process_restores_the_saved_state(first_session, store):
    """A fresh process (no live cache) skips the documents' prefill with the saved state."""
    _, state = first_session
    env = {**os.environ, **ENV}
    proc = subprocess.run(
        [sys.executable, "-m", "ragkit.cli", "chat", "--store", str(store), "--doc", "ai-osi-stack-mutual-nda",
         "--state-dir", str(state), "--json"],
        input="Can the receiving party share information with its lawyers?\n/exit\nWhat is ignored after exit?\n",
        capture_output=True, text=True, env=env, cwd=ROOT, timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    answers = [json.loads(line) for line in proc.stdout.splitlines() if line.strip()]
    assert len(answers) == 1  # /exit ended the session
    a = answers[0]
    print(f"\nfresh process with saved state: TTFT {a['timings']['ttft_s']:.2f}s, "
          f"{a['usage']['cached_tokens']} of {a['usage']['prompt_tokens']} cached, load {a['timings'].get('state_load_s')}")
    assert "state_load_s" in a["timings"]
    assert a["usage"]["cached_tokens"] >= 0.9 * a["usage"]["prompt_tokens"]
    assert a["answer"]


def test_a_damaged_state_file_costs_a_prefill_not_the_answer(first_session, store, tmp_path):
    from ragkit.answer.chat import ChatSession
    from ragkit.config import load_settings

    _, state = first_session
    bad = tmp_path / "state"
    bad.mkdir()
    (bad / next(state.iterdir()).name).write_bytes(b"not a state")
    settings = load_settings(store=store, generator={"n_ctx": 2048, "max_tokens": 48})
    session = ChatSession(settings, ["ai-osi-stack-mutual-nda"], state_dir=bad)
    session.generator.llm.reset()  # no live cache: the file would be used
    from ragkit.retrieve import retrieve

    prompt = retrieve(QUESTIONS[1], settings, ["ai-osi-stack-mutual-nda"], generator=session.generator).prompt
    assert session.state_path(prompt).name == next(state.iterdir()).name  # same settings, same key
    assert session.restore_state(prompt) is None
    assert session.generator.llm.n_tokens == 0


def test_questions_file_missing_is_a_usage_error(store, tmp_path):
    res = runner.invoke(app, ["chat", "--store", str(store), "--questions", str(tmp_path / "nope.txt"), "--json"], env=ENV)
    assert res.exit_code == 2, res.output
    assert "cannot read the questions file" in json.loads(res.stdout)["error"]


def test_state_dir_needs_the_in_process_backend(store, tmp_path):
    env = {**ENV, "RAGKIT_GENERATOR__BACKEND": "openai", "RAGKIT_GENERATOR__BASE_URL": "http://127.0.0.1:9"}
    res = runner.invoke(app, ["chat", "--store", str(store), "--state-dir", str(tmp_path / "s"), "--json"], env=env, input="x?\n")
    assert res.exit_code == 2, res.output
    assert "in-process llama_cpp backend only" in json.loads(res.stdout)["error"]
