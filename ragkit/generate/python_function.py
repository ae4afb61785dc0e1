"""A generator driven by a Python function (`generator.backend = "function"`): the prompt
goes in as text, the function's return value is the answer. For logic tests of `ask`,
`compare` and `serve` that need no weights (what an answer *is* once the model has
written it: supported, unverified, not_found), and for wiring a rule-based or external
answerer into the pipeline. The real-weights tests stay the integration tests.

    from ragkit.generate.python_function import FunctionGenerator
    gen = FunctionGenerator(lambda prompt: "The Recipient may retain backup copies [1].")
    ask(question, settings, generator=gen)

From settings: `generator.backend = "function"`, `generator.model = "package.module:callable"`
(a callable `(prompt: str) -> str`).

Its tokenizer is built in: every word, run of spaces and punctuation mark is one token, ids
assigned on first sight, so text round-trips exactly and prompt budgets count about as a
real tokenizer does (a byte tokenizer would count four times as many). Written by hand:
a library tokenizer needs a vocabulary file, which is what a weights-free backend has not.
"""

from __future__ import annotations

import re
import time
from importlib import import_module
from typing import TYPE_CHECKING, Callable

from ragkit.errors import ConfigError
from ragkit.generate.base import Generation

if TYPE_CHECKING:
    from ragkit.config import Settings

_PIECE = re.compile(r"\s+|\w+|[^\w\s]", re.U)


class WordTokenizer:
    """Words, space runs and punctuation marks as tokens (see the module's doc)."""

    def __init__(self) -> None:
        self.ids: dict[str, int] = {}
        self.pieces: list[str] = []

    def encode(self, text: str) -> list[int]:
        out = []
        for p in _PIECE.findall(text or ""):
            i = self.ids.get(p)
            if i is None:
                i = self.ids[p] = len(self.pieces)
                self.pieces.append(p)
            out.append(i)
        return out

    def decode(self, ids: list[int]) -> str:
        return "".join(self.pieces[i] for i in ids if 0 <= i < len(self.pieces))


def _default_template() -> str:
    from ragkit.paths import chat_template_source

    return chat_template_source("kimi-k2", {})


class FunctionGenerator:
    """The Generator protocol (ragkit.generate.base) over `fn(prompt) -> answer`. The
    answer is streamed to `on_text` a token at a time and cut at `max_tokens` tokens."""

    def __init__(self, fn: Callable[[str], str], *, n_ctx: int = 8192, chat_template: str | None = None,
                 name: str = "function"):
        self.fn = fn
        self.n_ctx = n_ctx
        self.name = name
        self.chat_template = chat_template if chat_template is not None else _default_template()
        self.tokenizer = WordTokenizer()
        self.prompts: list[str] = []  # every prompt it was given, for a test to read

    @classmethod
    def from_settings(cls, settings: "Settings", *, vocab_only: bool = False) -> "FunctionGenerator":
        target = settings.generator.model
        module, _, attr = target.partition(":")
        if not module or not attr:
            raise ConfigError(f"generator.model {target!r} is not 'package.module:callable'",
                              hint="the function backend calls a Python function (prompt -> answer)")
        try:
            fn = getattr(import_module(module), attr)
        except (ImportError, AttributeError) as exc:
            raise ConfigError(f"generator.model {target!r}: {exc}") from None
        template = None
        if settings.generator.chat_template:
            from ragkit.paths import chat_template_source

            template = chat_template_source(settings.generator.chat_template, {})
        return cls(fn, n_ctx=settings.generator.n_ctx, chat_template=template, name=f"function:{target}")

    def tokenize(self, text: str, *, special: bool, add_bos: bool = False) -> list[int]:
        return self.tokenizer.encode(text)

    def detokenize(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids)

    def special_token_ids(self) -> set[int]:
        return set()

    def generate(self, prompt_ids: list[int], *, max_tokens: int, on_text: Callable[[str], None] | None = None) -> Generation:
        t0 = time.perf_counter()
        prompt = self.detokenize(prompt_ids)
        self.prompts.append(prompt)
        ids = self.tokenize(str(self.fn(prompt) or ""), special=False)
        cut = ids[:max_tokens]
        ttft = time.perf_counter() - t0
        if on_text is not None:
            for i in cut:
                on_text(self.tokenizer.decode([i]))
        return Generation(text=self.detokenize(cut), prompt_tokens=len(prompt_ids), completion_tokens=len(cut),
                          ttft_s=ttft, total_s=time.perf_counter() - t0,
                          finish_reason="length" if len(ids) > max_tokens else "stop")
