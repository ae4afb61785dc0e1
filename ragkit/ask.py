"""`ask`: retrieve -> budgeted prompt -> local generation -> answer with citations.

Usable from Python:

    from ragkit.config import load_settings
    from ragkit.ask import ask
    result = ask("How long does confidentiality last?", load_settings(), docs=["nda.pdf"])
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable

from ragkit.config import Settings
from ragkit.generate import Choice, Generation, load_generator
from ragkit.generate.base import match_option  # noqa: F401  (lives with `choose`; re-exported)
from ragkit.retrieve import Retrieval, retrieve
from ragkit.retrieve.citations import Citation, extract, is_abstention
from ragkit.retrieve.claims import Claim
from ragkit.retrieve.prompt import Prompt

ABSTAIN_TEXT = "The documents do not say."


@dataclass
class AskResult:
    question: str
    prompt: Prompt
    answer: str = ""
    citations: list[Citation] = field(default_factory=list)
    invalid_citations: list[int] = field(default_factory=list)
    abstained: bool = False
    abstain_reason: str | None = None
    generation: Generation | None = None
    timings: dict[str, float] = field(default_factory=dict)
    choice: Choice | None = None  # set by ask_choice
    claims: list[Claim] = field(default_factory=list)  # the answer's claims, each tied to its source sentence(s)
    unsupported_answer: str | None = None  # the generated answer when no claim of it was supported (then abstained)

    @classmethod
    def from_retrieval(cls, r: Retrieval) -> "AskResult":
        return cls(question=r.question, prompt=r.prompt, timings=dict(r.timings))

    def to_json(self) -> dict:
        g = self.generation or Generation()
        return {
            "answer": self.answer,
            "citations": [c.to_json() for c in self.citations],
            "invalid_citations": self.invalid_citations,
            "claims": [c.to_json() for c in self.claims],
            "abstained": self.abstained,
            "abstain_reason": self.abstain_reason,
            "unsupported_answer": self.unsupported_answer,
            "usage": {
                "prompt_tokens": len(self.prompt.ids),
                "completion_tokens": g.completion_tokens,
                "cached_tokens": g.cached_tokens,
            },
            "timings": {k: round(v, 4) for k, v in self.timings.items()},
            "mode": self.prompt.mode,
            "contexts": [c.to_json() for c in self.prompt.contexts],
        }

    def dry_run_json(self) -> dict:
        p = self.prompt
        return {
            "prompt": p.text,
            "prompt_tokens": len(p.ids),
            "n_ctx": p.n_ctx,
            "max_tokens": p.max_tokens,
            "budget": p.budget,
            "prefix_tokens": p.prefix_tokens,
            "mode": p.mode,
            "dropped": p.dropped,
            "best_similarity": p.best_similarity,
            "contexts": [
                {"n": c.n, "doc": c.doc, "page": c.page_start, "section": c.section, "text": c.text, "tokens": c.tokens}
                for c in p.contexts
            ],
        }


def _load_checked(settings: Settings):
    if settings.generator.backend == "llama_cpp" and (
        settings.profile == "kimi-k2" or settings.generator.tensor_overrides or settings.generator.n_gpu_layers
    ):
        # A plan that cannot fit would thrash the disk for an hour: refuse up front.
        from ragkit.doctor.fit import check_fit

        check_fit(settings)
    return load_generator(settings)


def ask(
    question: str,
    settings: Settings,
    docs: list[str] | None = None,
    *,
    dry_run: bool = False,
    on_text: Callable[[str], None] | None = None,
    context: str | None = None,
    context_reserve: int = 0,
    max_tokens: int | None = None,
    generator=None,
) -> AskResult:
    """Answer `question` from the documents (all, or those named in `docs`).

    `on_text` receives the answer as it is generated; an exception it raises stops the
    generation and propagates. `context` is earlier conversation (plain text) placed in
    the prompt before the question, not searched with; `context_reserve` prompt tokens are
    kept for it either way (see `ragkit.retrieve.retrieve`). `max_tokens` caps this
    answer below `generator.max_tokens` (the prompt budget stays that of the settings, so
    the cached prefix does not change). `generator`: an already loaded one to use."""
    if generator is None and not dry_run:
        generator = _load_checked(settings)
    t0 = time.perf_counter()
    r = retrieve(question, settings, docs, generator=generator, context=context, context_reserve=context_reserve)
    result = AskResult.from_retrieval(r)
    if dry_run:
        return result
    if abstain_if_irrelevant(result, r, t0, on_text):
        return result
    limit = settings.generator.max_tokens if max_tokens is None else max(1, min(max_tokens, settings.generator.max_tokens))
    gen = generator.generate(r.prompt.ids, max_tokens=limit, on_text=on_text)
    finish(result, gen, t0, settings)
    return result


def abstain_if_irrelevant(result: AskResult, r: Retrieval, t0: float, on_text: Callable[[str], None] | None = None) -> bool:
    """Answer "The documents do not say." without generating when retrieval found nothing
    relevant (`Retrieval.abstain_reason`). Returns whether it abstained."""
    if r.abstain_reason is None:
        return False
    result.answer = ABSTAIN_TEXT
    result.abstained = True
    result.abstain_reason = r.abstain_reason
    result.generation = Generation(prompt_tokens=len(result.prompt.ids))
    result.timings.update({"generate_s": 0.0, "ttft_s": 0.0, "total_s": time.perf_counter() - t0})
    if on_text is not None:
        on_text(result.answer)
    return True


def finish(result: AskResult, gen: Generation, t0: float, settings: Settings | None = None) -> None:
    """Fill a result from a generation: answer, checked citations, claims tied to source
    sentences (with `settings`: the store's embedder reads them), abstention, timings."""
    result.generation = gen
    result.answer = gen.text.strip()
    result.citations, result.invalid_citations = extract(result.answer, result.prompt.contexts)
    result.abstained = is_abstention(result.answer)
    result.timings["generate_s"] = gen.total_s
    result.timings["ttft_s"] = gen.ttft_s
    if settings is not None and not result.abstained:
        t1 = time.perf_counter()
        attach_claims(result, settings)
        result.timings["claims_s"] = time.perf_counter() - t1
    result.timings["total_s"] = time.perf_counter() - t0


def attach_claims(result: AskResult, settings: Settings) -> None:
    """Split the answer into claims and tie each to the source sentence that supports it
    (`ragkit.retrieve.claims`). When the answer makes claims and none is supported by any
    source sentence (and `retrieve.abstain_unsupported`), the answer is replaced by "The
    documents do not say." and kept in `unsupported_answer`: a small model asked about
    something the documents lack writes a plausible clause instead of abstaining."""
    from ragkit.embed import load_embedder
    from ragkit.retrieve.claims import attribute

    result.claims = attribute(result.answer, result.prompt.contexts, load_embedder(settings), question=result.question)
    if settings.retrieve.abstain_unsupported and result.claims and not any(c.supported for c in result.claims):
        result.unsupported_answer = result.answer
        result.answer = ABSTAIN_TEXT
        result.abstained = True
        result.abstain_reason = f"no claim of the answer is supported by a source sentence ({len(result.claims)} checked)"


def ask_choice(
    question: str,
    options: list[str],
    settings: Settings,
    docs: list[str] | None = None,
    *,
    narrow: Callable[[Prompt, object], Prompt] | None = None,
) -> AskResult:
    """Answer with one of `options` (Yes / No / Not mentioned for a checklist item),
    scored by the generator when it can (`choose`: the options' own probabilities, no
    sampling), otherwise read from a short generated answer. The prompt is the one `ask`
    builds, so documents-first prefixes are shared with `ask` and across questions.
    `result.answer` is the option (empty when a free-text answer named none), or the
    abstention text when no source is relevant to the question.

    `narrow(prompt, generator)`, when given, turns the retrieval prompt into the one the
    options are scored on (compare: the quoted clause alone); `result.prompt` stays the
    retrieval prompt, the tokens and cache figures are the scored prompt's."""
    generator = _load_checked(settings)
    t0 = time.perf_counter()
    r = retrieve(question, settings, docs, generator=generator)
    result = AskResult.from_retrieval(r)
    if abstain_if_irrelevant(result, r, t0):
        return result
    prompt = r.prompt
    scored = narrow(prompt, generator) if narrow is not None else prompt
    if hasattr(generator, "choose"):
        ch = generator.choose(scored.ids, options)
        gen = Generation(text=ch.option, prompt_tokens=ch.prompt_tokens, cached_tokens=ch.cached_tokens,
                         ttft_s=ch.ttft_s, total_s=ch.total_s, finish_reason="choice")
    else:
        gen = generator.generate(scored.ids, max_tokens=8)
        picked = match_option(gen.text, options)
        ch = Choice(option=picked or "", logprobs={o: (0.0 if o == picked else float("-inf")) for o in options},
                    prompt_tokens=gen.prompt_tokens, cached_tokens=gen.cached_tokens, ttft_s=gen.ttft_s,
                    total_s=gen.total_s, scored=False)
    result.choice = ch
    result.generation = gen
    result.answer = ch.option
    result.timings.update({"generate_s": gen.total_s, "ttft_s": gen.ttft_s, "total_s": time.perf_counter() - t0})
    return result
