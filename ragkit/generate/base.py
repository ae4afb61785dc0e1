"""The generator protocol. A new engine is one class that implements it, registered by
name in ragkit.generate.factory.BACKENDS; this module imports no implementation."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Callable, Protocol, runtime_checkable


@dataclass
class Generation:
    text: str = ""
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    ttft_s: float = 0.0  # time to first token
    total_s: float = 0.0
    finish_reason: str | None = None
    extra: dict = field(default_factory=dict)


@dataclass
class Choice:
    """One of a fixed set of answers, picked by the model's own probabilities."""

    option: str
    logprobs: dict[str, float]  # per option, normalised over the options (exp sums to 1)
    prompt_tokens: int = 0
    cached_tokens: int = 0
    ttft_s: float = 0.0
    total_s: float = 0.0
    scored: bool = True  # False: the engine gave no probabilities; the option was parsed from a short answer
    # per option, the log-probability of each of its tokens after the prompt (unnormalised);
    # `logprobs` is computed from these by the scoring rule `score` (OPTION_SCORES)
    token_logprobs: dict[str, list[float]] = field(default_factory=dict)
    score: str = "mean"
    note: str | None = None  # how the option was obtained when not scored (e.g. the engine gave no log-probabilities)

    @property
    def confidence(self) -> float:
        import math

        return math.exp(self.logprobs.get(self.option, 0.0))


# How an option's token log-probabilities make its score:
# "mean": per token (length-normalised; the default: a sum penalises "Not mentioned",
#         two tokens with the Qwen tokenizer, against "Yes" and "No", one each);
# "sum":  the option's whole probability (the rule before; kept for measurements);
# "first": the first token only (what an engine's top log-probabilities give directly).
OPTION_SCORES = ("mean", "sum", "first")


def option_scores(token_logprobs: dict[str, list[float]], score: str = "mean") -> dict[str, float]:
    """The options' log-probabilities under a scoring rule, normalised over the options
    (exp sums to 1)."""
    import math

    if score not in OPTION_SCORES:
        raise ValueError(f"unknown option score {score!r}: one of {', '.join(OPTION_SCORES)}")
    raw = {}
    for o, lps in token_logprobs.items():
        if score == "sum":
            raw[o] = sum(lps)
        elif score == "first":
            raw[o] = lps[0]
        else:
            raw[o] = sum(lps) / len(lps)
    top = max(raw.values())
    norm = math.log(sum(math.exp(v - top) for v in raw.values())) + top
    return {o: v - norm for o, v in raw.items()}


def option_tokens(gen, prompt_ids: list[int], options: list[str], score: str) -> dict[str, list[int]]:
    """What every engine's `choose` checks before any work: options given, a known
    scoring rule, and room in the window for the prompt plus the longest option.
    Returns each option's tokens."""
    if not options:
        raise ValueError("choose needs at least one option")
    option_scores({o: [0.0] for o in options}, score)  # an unknown rule fails here
    toks = {o: gen.tokenize(o, special=False) for o in options}
    longest = max(len(t) for t in toks.values())
    if len(prompt_ids) + longest > gen.n_ctx:
        raise ValueError(f"prompt of {len(prompt_ids)} tokens + {longest} option tokens exceeds n_ctx {gen.n_ctx}")
    return toks


def choice_from_tokens(token_logprobs: dict[str, list[float]], score: str = "mean", **kw) -> "Choice":
    """A Choice from per-option token log-probabilities (every engine's choose ends here,
    so in-process and remote scoring agree by construction)."""
    lp = option_scores(token_logprobs, score)
    return Choice(option=max(lp, key=lp.get), logprobs=lp, token_logprobs=token_logprobs, score=score, **kw)


@runtime_checkable
class Generator(Protocol):
    name: str
    n_ctx: int
    chat_template: str  # Jinja source

    def tokenize(self, text: str, *, special: bool, add_bos: bool = False) -> list[int]: ...

    def detokenize(self, ids: list[int]) -> str: ...

    def special_token_ids(self) -> set[int]: ...

    def generate(
        self, prompt_ids: list[int], *, max_tokens: int, on_text: Callable[[str], None] | None = None
    ) -> Generation: ...

    # Optional: `choose(prompt_ids, options, *, score="mean") -> Choice`: each option
    # scored as the continuation of the prompt (OPTION_SCORES). Engines without it are asked
    # to generate a few tokens and the option is read from the text (ragkit.answer.ask.ask_choice).


def _cpu_times() -> tuple[int, int] | None:
    try:
        with open("/proc/stat") as f:
            vals = [int(x) for x in f.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    idle = vals[3] + (vals[4] if len(vals) > 4 else 0)
    return sum(vals), idle


def free_threads(sample_s: float = 0.25) -> int:
    """Threads from the free cores, not the core count: on a shared 2-core machine two
    threads collapsed generation when another process was busy, one thread held.
    Busy cores are sampled from /proc/stat over a short window (the load average lags
    by a minute and counts our own earlier work)."""
    import time

    n = os.cpu_count() or 1
    a = _cpu_times()
    if a is None:
        return n
    time.sleep(sample_s)
    b = _cpu_times()
    if b is None or b[0] == a[0]:
        return n
    busy = n * (1.0 - (b[1] - a[1]) / (b[0] - a[0]))
    return max(1, min(n, n - int(busy + 0.35)))


def match_option(text: str, options: list[str]) -> str | None:
    """The option a short free-text answer starts with ("**Yes.** The agreement..." ->
    "Yes"); the longest option wins ("Not mentioned" before "No"). None when the answer
    starts with none of them, or names two ("Yes, No or Not mentioned")."""
    import re

    low = re.sub(r"^[\W_]+", "", text.strip().lower())
    hits = [o for o in sorted(options, key=len, reverse=True) if re.match(re.escape(o.lower()) + r"\b", low)]
    if not hits:
        return None
    rest = low[len(hits[0]):][:30]
    if any(re.search(r"\b" + re.escape(o.lower()) + r"\b", rest) for o in options if o != hits[0]):
        return None
    return hits[0]


def choose_by_text(gen, prompt_ids: list[int], options: list[str], *, note: str | None = None,
                   max_tokens: int = 8) -> "Choice":
    """`choose` for a generator that scores no options (an engine without log-probabilities,
    or one without `choose`): a short answer is generated and the option it starts with is
    read (`match_option`); the choice is marked as not scored."""
    import time

    t0 = time.perf_counter()
    out = gen.generate(prompt_ids, max_tokens=max_tokens)
    picked = match_option(out.text, options)
    return Choice(option=picked or "", logprobs={o: (0.0 if o == picked else float("-inf")) for o in options},
                  prompt_tokens=out.prompt_tokens, cached_tokens=out.cached_tokens, ttft_s=out.ttft_s,
                  total_s=time.perf_counter() - t0, scored=False,
                  note=None if note is None else f"{note}; the option was read from its answer {out.text.strip()[:40]!r}")
