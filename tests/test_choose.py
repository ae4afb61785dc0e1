"""Choosing one of a fixed set of answers: the real default GGUF model scores the options
(ragkit.generate.llama.LlamaCppGenerator.choose), checked against llama.cpp's own
per-position logits; the fallback for engines without scores is tested with a fake
generator that says so."""

from __future__ import annotations

import math

import numpy as np
import pytest

from ragkit.generate.base import match_option
from tests.conftest import make_settings

CLAUSE = "7.2 The obligations of confidentiality survive for three (3) years after termination of this Agreement."


def _chat_ids(gen, question: str) -> list[int]:
    ids = gen.tokenize("<|im_start|>system\nAnswer with exactly one option.<|im_end|>\n<|im_start|>user\n", special=True)
    ids += gen.tokenize(f"Clause: {CLAUSE}\n\nQuestion: {question}", special=False)
    ids += gen.tokenize("<|im_end|>\n<|im_start|>assistant\n", special=True)
    return ids


@pytest.fixture(scope="module")
def gen(tmp_path_factory):
    from ragkit.generate import load_generator

    return load_generator(make_settings(tmp_path_factory.mktemp("s") / "store"))


def _reference(gen, prompt_ids: list[int], options: list[str]) -> dict[str, float]:
    """Log-probabilities of each option from a second llama.cpp context that keeps the
    logits of every position (logits_all), normalised over the options."""
    from llama_cpp import Llama

    llm = Llama(model_path=str(gen.model_path), n_ctx=1024, n_threads=2, logits_all=True, verbose=False)
    try:
        raw = {}
        for o in options:
            opt = gen.tokenize(o, special=False)
            llm.reset()
            llm.eval(prompt_ids + opt)
            total = 0.0
            for k, t in enumerate(opt):
                row = np.asarray(llm.scores[len(prompt_ids) - 1 + k], dtype=np.float64)
                row = row - row.max()
                total += float(row[t] - np.log(np.exp(row).sum()))
            raw[o] = total
    finally:
        llm.close()
    top = max(raw.values())
    norm = math.log(sum(math.exp(v - top) for v in raw.values())) + top
    return {o: v - norm for o, v in raw.items()}


def test_choose_matches_llama_cpp_per_position_logits(gen):
    ids = _chat_ids(gen, "For how many years do the obligations survive? Answer Yes, No or Not mentioned.")
    # "Yes" and "Yes, three years" share their first token: the second is scored token by token
    options = ["Yes", "No", "Not mentioned", "Yes, three years"]
    assert gen.tokenize("Yes, three years", special=False)[0] == gen.tokenize("Yes", special=False)[0]
    ch = gen.choose(ids, options, score="sum")  # the reference is the options' whole probability
    ref = _reference(gen, ids, options)
    assert set(ch.logprobs) == set(options)
    assert math.isclose(sum(math.exp(v) for v in ch.logprobs.values()), 1.0, rel_tol=1e-6)
    for o in options:
        # the first token comes from the same batched prompt evaluation (equal to 1e-3);
        # each later token is evaluated alone, and ggml's one-token kernels round a little
        # differently from its batched ones (measured: 0.03-0.16 nats over 3 extra tokens;
        # a wrong position would be off by several nats)
        extra = len(gen.tokenize(o, special=False)) - 1
        assert ch.logprobs[o] == pytest.approx(ref[o], abs=1e-3 + 0.1 * extra), o
    assert ch.option == max(ref, key=ref.get)
    assert ch.scored and 0 < ch.confidence <= 1


def test_choose_follows_the_clause(gen):
    # the 0.5B model leans to "No" on many yes/no questions (that is why compare calibrates),
    # so this checks that the scores follow the clause: three years is likelier than ten
    true = gen.choose(_chat_ids(gen, "Is the survival period three (3) years?"), ["Yes", "No"])
    false = gen.choose(_chat_ids(gen, "Is the survival period ten (10) years?"), ["Yes", "No"])
    assert true.option == "Yes"
    assert math.exp(true.logprobs["Yes"]) > math.exp(false.logprobs["Yes"]) + 0.1


def test_choose_leaves_the_prompt_in_the_cache(gen):
    ids = _chat_ids(gen, "Do the obligations survive termination? Answer Yes or No.")
    first = gen.choose(ids, ["Yes", "No"])
    again = gen.choose(ids, ["Yes", "No"])
    assert again.cached_tokens == len(ids) - 1  # all but the last token, which llama.cpp re-evaluates
    assert again.logprobs == pytest.approx(first.logprobs, abs=0.05)  # last token alone vs in the batch: kernel rounding
    other = _chat_ids(gen, "Is the survival period three years? Answer Yes or No.")
    shared = next(i for i, (a, b) in enumerate(zip(ids, other)) if a != b)
    assert gen.choose(other, ["Yes", "No"]).cached_tokens == shared
    # generation afterwards starts from the cache choose left: the whole last prompt
    g = gen.generate(other, max_tokens=4)
    assert g.cached_tokens == len(other) - 1


def test_choose_refuses_what_does_not_fit(gen):
    with pytest.raises(ValueError, match="exceeds n_ctx"):
        gen.choose([gen.tokenize("x", special=False)[0]] * gen.n_ctx, ["Yes"])
    with pytest.raises(ValueError, match="at least one option"):
        gen.choose(_chat_ids(gen, "?"), [])


@pytest.mark.parametrize("text,option", [
    ("Yes.", "Yes"),
    ("**No** – the clause forbids it.", "No"),
    ("Not mentioned.", "Not mentioned"),
    ("not mentioned in the agreement", "Not mentioned"),
    ("No.", "No"),
    ("Yes, No or Not mentioned.", None),  # names several options: not an answer
    ("Nothing in the clause.", None),
    ("", None),
])
def test_match_option(text, option):
    assert match_option(text, ["Yes", "No", "Not mentioned"]) == option


def test_ask_choice_reads_the_option_from_text_when_the_engine_gives_no_scores(nda_store, monkeypatch):
    """FAKE generator (unit test): an engine without `choose`, e.g. a remote server; the
    option is read from its short answer and marked as not scored."""
    import ragkit.answer.ask as ask_mod
    from ragkit.generate import Generation, load_generator

    real = load_generator(nda_store, vocab_only=True)

    class TextOnly:
        name, n_ctx, chat_template = "fake", real.n_ctx, real.chat_template
        tokenize, detokenize, special_token_ids = real.tokenize, real.detokenize, real.special_token_ids
        asked: list[int] = []

        def generate(self, prompt_ids, *, max_tokens, on_text=None):
            self.asked.append(max_tokens)
            return Generation(text="No. The agreement forbids it.", prompt_tokens=len(prompt_ids))

    fake = TextOnly()
    from ragkit.session import Session

    session = Session(nda_store, generator=fake)  # the session's generator is the text-only one
    r = ask_mod.ask_choice("May the recipient keep copies of Confidential Information under its backup policies?", ["Yes", "No", "Not mentioned"], session,
                           ["bonterms-mutual-nda-v1.pdf"])
    assert r.answer == "No" and r.choice.scored is False and fake.asked == [8]
    assert r.choice.logprobs["No"] == 0.0 and r.choice.logprobs["Yes"] == float("-inf")


# ------------------------------------------------------------ option scoring rules

HEADINGS = "The headings in this Agreement are for convenience only and do not affect its interpretation."
OFF_TOPIC = ["Yes", "No", "The clause does not address this"]


def _options_ids(gen, clause: str, question: str, options: list[str]) -> list[int]:
    ids = gen.tokenize("<|im_start|>system\nAnswer with exactly one of the options, nothing else.<|im_end|>\n<|im_start|>user\n", special=True)
    ids += gen.tokenize(f"Clause: {clause}\n\nQuestion: {question}\nOptions: {' | '.join(options)}", special=False)
    ids += gen.tokenize("<|im_end|>\n<|im_start|>assistant\n", special=True)
    return ids


def test_the_sum_picks_the_short_option_on_an_off_topic_clause_and_the_mean_does_not(gen):
    """The length bias on the real model: a clause about headings says nothing of backup
    copies. The old rule (sum of the option's token log-probabilities) charges the
    six-token answer for every token and picks the one-token "No"; the mean per token
    (the default now) picks the answer the clause supports."""
    ids = _options_ids(gen, HEADINGS, "May the recipient keep backup copies?", OFF_TOPIC)
    old = gen.choose(ids, OFF_TOPIC, score="sum")
    new = gen.choose(ids, OFF_TOPIC)
    assert new.score == "mean" and len(new.token_logprobs[OFF_TOPIC[2]]) == 6
    assert old.option == "No"
    assert new.option == OFF_TOPIC[2]
    # the same per-token log-probabilities under both rules: only the arithmetic differs
    for o in OFF_TOPIC:
        assert new.token_logprobs[o] == pytest.approx(old.token_logprobs[o], abs=0.05)
        assert old.logprobs[o] - new.logprobs[o] == pytest.approx(
            sum(old.token_logprobs[o]) - sum(new.token_logprobs[o]) / len(new.token_logprobs[o]) - (
                math.log(sum(math.exp(sum(v)) for v in old.token_logprobs.values()))
                - math.log(sum(math.exp(sum(v) / len(v)) for v in new.token_logprobs.values()))), abs=0.06)


def test_option_scores_rules_and_bad_rule(gen):
    from ragkit.generate.base import option_scores

    ids = _chat_ids(gen, "Is the survival period three (3) years? Answer Yes, No or Not mentioned.")
    ch = gen.choose(ids, ["Yes", "No", "Not mentioned"], score="first")
    toks = ch.token_logprobs
    assert len(toks["Not mentioned"]) == 2 and all(len(toks[o]) == 1 for o in ("Yes", "No"))
    for rule in ("mean", "sum", "first"):
        lp = option_scores(toks, rule)
        assert math.isclose(sum(math.exp(v) for v in lp.values()), 1.0, rel_tol=1e-9)
    # "first" ignores the second token of "Not mentioned"; "mean" halves the option's sum
    assert ch.logprobs == option_scores({o: v[:1] for o, v in toks.items()}, "sum")
    assert option_scores(toks, "mean") == option_scores({"Yes": toks["Yes"], "No": toks["No"],
                                                         "Not mentioned": [sum(toks["Not mentioned"]) / 2]}, "sum")
    with pytest.raises(ValueError, match="unknown option score"):
        gen.choose(ids, ["Yes", "No"], score="median")


# ------------------------------------------------------------ choose over an OpenAI-compatible engine

@pytest.fixture(scope="module")
def scoring_server(tmp_path_factory):
    """The real `python -m llama_cpp.server` on loopback, serving the same GGUF, started
    with logits for every position (what its completions need for log-probabilities)."""
    from tests.test_openai_backend import Server

    srv = Server(tmp_path_factory.mktemp("llama-server-logprobs") / "server.log", logits_all=True)
    yield srv
    srv.stop()


TOLERANCE = 0.05  # nats


@pytest.mark.complete
def test_choose_over_the_server_agrees_with_the_in_process_engine(gen, scoring_server, tmp_path):
    """Same model, same prompts: the option scored over /v1/completions (top
    log-probabilities, one request per distinct prefix) is the in-process option, and
    every token's log-probability agrees within TOLERANCE (both are llama.cpp on the same
    weights: equal to 1e-6 from a cold cache, measured; with a prefix already cached,
    either side evaluates its last tokens in a smaller batch, and ggml's kernels then
    round up to 0.05 nats differently, as test_choose_leaves_the_prompt_in_the_cache
    shows in process)."""
    from ragkit.generate.openai_compat import OpenAICompatGenerator
    from tests.test_openai_backend import remote_settings

    remote = OpenAICompatGenerator(remote_settings(scoring_server.url, tmp_path / "store"))
    prompts = [
        (_chat_ids(gen, "Do the obligations survive termination? Answer Yes, No or Not mentioned."), ["Yes", "No", "Not mentioned"]),
        (_chat_ids(gen, "Is the survival period ten (10) years? Answer Yes, No or Not mentioned."), ["Yes", "No", "Not mentioned"]),
        (_options_ids(gen, HEADINGS, "May the recipient keep backup copies?", OFF_TOPIC), OFF_TOPIC),
    ]
    for ids, options in prompts:
        here = gen.choose(ids, options)
        there = remote.choose(ids, options)
        assert there.scored and there.note is None
        assert there.option == here.option
        for o in options:
            assert there.token_logprobs[o] == pytest.approx(here.token_logprobs[o], abs=TOLERANCE), o
            assert there.logprobs[o] == pytest.approx(here.logprobs[o], abs=TOLERANCE), o
    assert remote.no_logprobs is None and remote.mode == "text"  # llama_cpp.server takes text prompts


def test_choose_over_a_server_without_logprobs_falls_back_and_says_so(tmp_path):
    """llama_cpp.server started without logits_all refuses log-probabilities: choose reads
    the option from an eight-token answer, marks it unscored with the reason, and does
    not ask for log-probabilities again."""
    from ragkit.generate.openai_compat import OpenAICompatGenerator
    from tests.test_openai_backend import Server, remote_settings

    srv = Server(tmp_path / "server.log", logits_all=False)
    try:
        remote = OpenAICompatGenerator(remote_settings(srv.url, tmp_path / "store"))
        ids = _chat_ids(remote, "Do the obligations survive termination? Answer Yes, No or Not mentioned.")
        ch = remote.choose(ids, ["Yes", "No", "Not mentioned"])
        assert not ch.scored and ch.token_logprobs == {}
        assert "no log-probabilities" in ch.note and "logits_all" in ch.note
        assert ch.option in ("Yes", "No", "Not mentioned", "")
        sent = remote.attempts
        remote.choose(ids, ["Yes", "No"])
        assert remote.attempts == sent + 1  # one generation, no second log-probability request
    finally:
        srv.stop()
