"""In-process generation with llama-cpp-python (GGUF models, CPU or GPU)."""

from __future__ import annotations

import atexit
import time
import weakref
from pathlib import Path
from typing import Callable

from ragkit.config import GeneratorSettings, Settings
from ragkit.errors import ModelNotFound
from ragkit.generate.base import Choice, Generation, choice_from_tokens, free_threads, option_tokens
from ragkit.models import resolve
from ragkit.paths import chat_template_source

# the models alive now (weakly: this keeps none alive), closed before interpreter teardown
_LIVE: "weakref.WeakSet[LlamaCppGenerator]" = weakref.WeakSet()


@atexit.register
def _close_models() -> None:
    # llama-cpp-python's __del__ fails noisily once its module globals are gone
    for g in list(_LIVE):
        g.close()


class LlamaCppGenerator:
    def __init__(self, model_path: Path, cfg: GeneratorSettings, *, vocab_only: bool = False, name: str | None = None):
        from llama_cpp import Llama

        from ragkit.generate.gguf_files import check_shards, read_header
        from ragkit.generate.llama_params import TensorOverrides, cache_kwargs, capture_llama_log, model_params_patch, overridden_tensors

        self.name = name or model_path.name
        self.model_path = model_path
        self.cfg = cfg
        self.vocab_only = vocab_only
        # llama.cpp reports a missing shard, a non-first shard or a truncated file only as
        # "Failed to load model from file": check first and name the file.
        self.shards = check_shards(model_path)
        header = read_header(self.shards[0])
        is_mla = bool(header.key("attention.key_length_mla")) and bool(header.key("attention.value_length_mla"))
        extra = {} if vocab_only else cache_kwargs(
            cfg, is_mla=is_mla, key_length=header.key("attention.key_length"), value_length=header.key("attention.value_length")
        )
        # Kept on self: llama.cpp holds pointers into this array while the model lives.
        self._overrides = TensorOverrides.build(cfg.tensor_overrides) if not vocab_only else TensorOverrides([])
        threads = cfg.n_threads or free_threads()
        try:
            with model_params_patch(self._overrides), capture_llama_log() as log:
                self.llm = Llama(
                    model_path=str(model_path),
                    n_ctx=cfg.n_ctx,
                    n_threads=threads,
                    n_threads_batch=threads,
                    n_batch=min(cfg.n_batch, cfg.n_ctx),
                    n_ubatch=min(cfg.n_ubatch, cfg.n_batch, cfg.n_ctx),
                    n_gpu_layers=cfg.n_gpu_layers,
                    use_mmap=cfg.use_mmap,
                    use_mlock=cfg.use_mlock,
                    seed=cfg.seed,
                    vocab_only=vocab_only,
                    verbose=cfg.verbose,
                    **extra,
                )
        except ValueError as exc:  # llama-cpp-python reports every load failure this way
            errors = [t.strip() for lvl, t in log if lvl == 4 and t.strip()]  # GGML_LOG_LEVEL_ERROR (ggml.h)
            why = f" ({errors[-1]})" if errors else ""
            raise ModelNotFound(f"cannot load GGUF {model_path}: {exc}{why}") from None
        # tensor name -> buffer type, for every tensor a tensor override placed
        self.overridden = overridden_tensors(log)
        self.llm._ragkit_overrides = self._overrides  # lives exactly as long as the model
        self.n_ctx = cfg.n_ctx
        self.chat_template = chat_template_source(cfg.chat_template, self.llm.metadata)
        _LIVE.add(self)

    def close(self) -> None:
        """Free the model's memory now (a Session closes its generator this way)."""
        try:
            self.llm.close()
        except Exception:
            pass

    @classmethod
    def from_settings(cls, settings: Settings, *, vocab_only: bool = False) -> "LlamaCppGenerator":
        """A new generator for `settings` (a Session holds it: nothing here keeps it)."""
        cfg = settings.generator
        return cls(resolve(cfg.model, "generator", settings.cache_dir), cfg, vocab_only=vocab_only, name=cfg.model)

    # ------------------------------------------------------------ tokens

    def tokenize(self, text: str, *, special: bool, add_bos: bool = False) -> list[int]:
        if not text:
            return self.llm.tokenize(b"", add_bos=add_bos, special=False) if add_bos else []
        return self.llm.tokenize(text.encode("utf-8"), add_bos=add_bos, special=special)

    def detokenize(self, ids: list[int]) -> str:
        return self.llm.detokenize(ids).decode("utf-8", errors="replace")

    def special_token_ids(self) -> set[int]:
        """Ids of control tokens (BOS/EOS/turn markers) in this vocabulary."""
        import llama_cpp

        vocab = self.llm._model.vocab
        out: set[int] = set()
        n = self.llm.n_vocab()
        for tid in range(n):
            attr = llama_cpp.llama_vocab_get_attr(vocab, tid)
            if attr & (llama_cpp.LLAMA_TOKEN_ATTR_CONTROL | llama_cpp.LLAMA_TOKEN_ATTR_USER_DEFINED):
                if attr & llama_cpp.LLAMA_TOKEN_ATTR_CONTROL:
                    out.add(tid)
        return out

    # ------------------------------------------------------------ generation

    def cached_prefix(self, prompt_ids: list[int]) -> int:
        """Tokens of this prompt already in the KV cache (exact prefix from token 0)."""
        import numpy as np

        n = self.llm.n_tokens
        if n == 0:
            return 0
        prev = self.llm.input_ids[:n]
        m = min(n, len(prompt_ids) - 1)  # llama-cpp-python always re-evaluates the last token
        if m <= 0:
            return 0
        eq = np.asarray(prev[:m]) == np.asarray(prompt_ids[:m])
        mismatch = np.flatnonzero(~eq)
        return int(mismatch[0]) if mismatch.size else m

    def generate(self, prompt_ids: list[int], *, max_tokens: int, on_text: Callable[[str], None] | None = None) -> Generation:
        if self.vocab_only:
            raise RuntimeError("this generator was loaded for its vocabulary only")
        if len(prompt_ids) + max_tokens > self.n_ctx:
            raise ValueError(f"prompt of {len(prompt_ids)} tokens + {max_tokens} new tokens exceeds n_ctx {self.n_ctx}")
        cfg = self.cfg
        out = Generation(prompt_tokens=len(prompt_ids), cached_tokens=self.cached_prefix(prompt_ids))
        t0 = time.perf_counter()
        parts: list[str] = []
        stream = self.llm.create_completion(
            prompt=prompt_ids,
            max_tokens=max_tokens,
            temperature=cfg.temperature,
            top_p=cfg.top_p,
            min_p=cfg.min_p,
            repeat_penalty=cfg.repeat_penalty,
            seed=cfg.seed,
            stream=True,
        )
        try:
            for chunk in stream:
                choice = chunk["choices"][0]
                piece = choice.get("text") or ""
                if piece:
                    if not parts:
                        out.ttft_s = time.perf_counter() - t0
                    parts.append(piece)
                    if on_text is not None:
                        on_text(piece)  # an exception here stops the generation
                if choice.get("finish_reason"):
                    out.finish_reason = choice["finish_reason"]
        finally:
            # stop decoding now, not when the suspended stream is garbage-collected: the
            # KV cache then holds the prompt and the tokens so far, and the next call
            # reuses its prefix as usual
            close = getattr(stream, "close", None)
            if close is not None:
                close()
        out.total_s = time.perf_counter() - t0
        if not parts:
            out.ttft_s = out.total_s
        out.text = "".join(parts)
        out.completion_tokens = max(0, self.llm.n_tokens - len(prompt_ids))
        return out

    # ------------------------------------------------------------ choosing

    def choose(self, prompt_ids: list[int], options: list[str], *, score: str = "mean") -> Choice:
        """Score each option as the continuation of the prompt, from the log-probability
        of its tokens (`score`: "mean" per token, the default; "sum"; "first" token only;
        see ragkit.generate.base.OPTION_SCORES), normalised over the options. Nothing is
        sampled, so a checklist answer is always one of the options (a small model asked
        to "answer Yes, No or Not mentioned" often writes all three), and the cost is the
        prompt's prefill plus a token or two per option. The KV cache keeps the prompt for
        the next call."""
        import numpy as np

        if self.vocab_only:
            raise RuntimeError("this generator was loaded for its vocabulary only")
        toks = option_tokens(self, prompt_ids, options, score)
        llm = self.llm
        cached = self.cached_prefix(prompt_ids)
        t0 = time.perf_counter()
        n_vocab = llm.n_vocab()

        def logprobs() -> "np.ndarray":
            # with logits_all off llama.cpp keeps the last position's logits only, which
            # is all that is needed here
            x = np.ctypeslib.as_array(llm._ctx.get_logits(), shape=(n_vocab,)).astype(np.float64)
            x -= x.max()
            return x - np.log(np.exp(x).sum())

        llm.n_tokens = cached
        llm.eval(prompt_ids[cached:])
        base = llm.n_tokens
        first = logprobs()
        ttft = time.perf_counter() - t0
        per_token: dict[str, list[float]] = {}
        for option, ids in toks.items():
            lps = [float(first[ids[0]])]
            for i in range(1, len(ids)):  # later tokens ("Not" -> " mentioned"), one at a time
                llm.n_tokens = base + i - 1
                llm.eval([ids[i - 1]])
                lps.append(float(logprobs()[ids[i]]))
            per_token[option] = lps
        llm.n_tokens = base  # the cache now holds exactly the prompt, for the next call
        return choice_from_tokens(per_token, score, prompt_tokens=len(prompt_ids), cached_tokens=cached, ttft_s=ttft,
                                  total_s=time.perf_counter() - t0)
