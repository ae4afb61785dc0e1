"""One Session per run: what the pipeline loads, loaded once and passed down.

    from ragkit.config import load_settings
    from ragkit.session import Session
    from ragkit.answer.ask import ask

    s = Session(load_settings())
    ask("Which law governs?", s, docs=["nda.pdf"])   # loads the embedder, store, generator
    ask("And the term?", s, docs=["nda.pdf"])        # reuses them

`ask`, `chat`, `retrieve`, `compare`, `eval` and `serve` take a Session (a plain Settings
still works: it gets a Session of its own for that call, so nothing is shared between
calls). Each part loads on first use, so a dry run never loads the generator and a
retrieval-only evaluation never loads it either. There is no module-level cache behind
any of this: a Session that is dropped frees what it loaded.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ragkit.config import Settings


def load_checked_generator(settings: "Settings"):
    """The generator of the settings, after `doctor`'s fit check where a plan could thrash the disk."""
    from ragkit.generate import load_generator

    if settings.generator.backend == "llama_cpp" and (
        settings.profile == "kimi-k2" or settings.generator.tensor_overrides or settings.generator.n_gpu_layers
    ):
        # A plan that cannot fit would thrash the disk for an hour: refuse up front.
        from ragkit.doctor.fit import check_fit

        check_fit(settings)
    return load_generator(settings)


def settings_of(x: "Session | Settings") -> "Settings":
    """The Settings of a Session, or `x` itself."""
    return x.settings if isinstance(x, Session) else x


# what makes two cross-encoders the same (with cache_dir); rerank_pool, its weight and the
# table lane only say how much of the ranking it scores
RERANKER_FIELDS = ("rerank", "rerank_model", "reranker", "rerank_threads", "rerank_base_url", "rerank_remote_model",
                   "rerank_api_key", "rerank_timeout_s")


def _same(a, b, *fields: str) -> bool:
    return all(getattr(a, f) == getattr(b, f) for f in fields)


class Session:
    """The embedder (remembering its vectors), the open store, the reranker, the generator
    (checked to fit before it loads) and the tokenizer, for one Settings."""

    def __init__(self, settings: "Settings", *, embedder=None, generator=None, store=None, reranker: Any = ...):
        self.settings = settings
        self._embedder = embedder
        self._generator = generator
        self._store = store
        self._tokenizer = None
        self._owns_generator = generator is not None  # close() frees only a generator not another session's
        # the cross-encoder: ... = not loaded yet, None = retrieve.rerank is off (or one given, as the other parts)
        self._reranker: Any = reranker
        # a variant's parts that are its parent's (with_settings): part name -> the parent, which loads it
        self._parent: dict[str, Session] = {}
        self._memos: dict[str, dict] = {}
        self._lock = threading.RLock()

    @classmethod
    def of(cls, x: "Session | Settings") -> "Session":
        """`x` if it is a Session, else a new Session of the Settings `x`."""
        return x if isinstance(x, Session) else cls(x)

    # ------------------------------------------------------------ the parts

    @property
    def embedder(self):
        with self._lock:
            if self._embedder is None:
                if "embedder" in self._parent:
                    self._embedder = self._parent["embedder"].embedder
                else:
                    from ragkit.embed import load_embedder
                    from ragkit.embed.remembering import MemoEmbedder
                    from ragkit.store import follow_store_embedder

                    # a store built with another registry embedder is read with it unless one was chosen
                    self.settings = follow_store_embedder(self.settings)
                    self._embedder = MemoEmbedder(load_embedder(self.settings))
            return self._embedder

    @property
    def has_embedder(self) -> bool:
        parent = self._parent.get("embedder")
        return self._embedder is not None or (parent is not None and parent.has_embedder)

    @property
    def store(self):
        """The store, opened once (checked against the embedder: name and dimension).
        A failure is not kept: the next use tries again."""
        with self._lock:
            if self._store is None:
                if "store" in self._parent:
                    self._store = self._parent["store"].store
                else:
                    from ragkit.store import open_store

                    self._store = open_store(self.settings, self.embedder, create=False)
            return self._store

    def reopen_store(self) -> None:
        """The store changed under us (an upload created it, a removal): open it on next use."""
        with self._lock:
            self._store = None
            self._memos.pop("lexical", None)

    @property
    def reranker(self):
        """The cross-encoder of `retrieve.rerank`, or None when it is off or
        `retrieve.rerank_pool` is 0 (its pinned files are checked when it loads: a mismatch
        is ModelNotFound)."""
        if self.settings.retrieve.rerank_pool <= 0:
            return None
        return self._cross_encoder()

    def _cross_encoder(self):
        """The cross-encoder of this session's reranker settings, whatever its pool (a parent
        that reranks nothing still loads it for a variant that does)."""
        with self._lock:
            if self._reranker is ...:
                if "reranker" in self._parent:
                    self._reranker = self._parent["reranker"]._cross_encoder()
                else:
                    from ragkit.rerankers import load_reranker

                    self._reranker = load_reranker(self.settings)
            return self._reranker

    @property
    def generator(self):
        """The generator, after `doctor`'s fit check where a plan could thrash the disk."""
        with self._lock:
            if self._generator is None:
                if "generator" in self._parent:
                    self._generator = self._parent["generator"].generator
                else:
                    self._generator = load_checked_generator(self.settings)
                    self._owns_generator = True
                self._tokenizer = None
            return self._generator

    @property
    def has_generator(self) -> bool:
        parent = self._parent.get("generator")
        return self._generator is not None or (parent is not None and parent.has_generator)

    @property
    def tokenizer(self):
        """What counts prompt tokens: the generator when it is loaded, else its vocabulary only."""
        with self._lock:
            if self._generator is not None:
                return self._generator
            if self._tokenizer is None:
                if "tokenizer" in self._parent:
                    return self._parent["tokenizer"].tokenizer  # the parent's model once it loads
                from ragkit.generate import load_generator

                self._tokenizer = load_generator(self.settings, vocab_only=True)
            return self._tokenizer

    def memo(self, name: str) -> dict:
        """A dictionary this session keeps under `name` (a store's calibration, a checklist's
        priors, a document's sentences), dropped with the session."""
        with self._lock:
            return self._memos.setdefault(name, {})

    # ------------------------------------------------------------ variants

    def with_settings(self, settings: "Settings") -> "Session":
        """A Session for `settings` (a request's own top_k, budget ...) that shares every part
        whose settings did not change: the embedder, store, reranker, generator and
        tokenizer are this session's, loaded here (once, for every variant) when a variant
        first needs one that is not loaded yet. The reranker is shared whatever either's
        `retrieve.rerank_pool` (a variant with pool 0 uses none, one with a pool uses it).
        A variant's `close()` frees only what it loaded itself."""
        if settings is self.settings:
            return self
        old = self.settings
        s = Session(settings)
        same_cache = old.cache_dir == settings.cache_dir
        if _same(old, settings, "embed") and same_cache:
            s._parent["embedder"] = self
            if _same(old, settings, "store", "store_url", "collection"):
                s._parent["store"] = self
                s._memos = self._memos
        if old.generator == settings.generator and same_cache:
            s._parent["generator"] = s._parent["tokenizer"] = self
        elif old.generator.model_copy(update={"n_ctx": 0, "max_tokens": 0}) == \
                settings.generator.model_copy(update={"n_ctx": 0, "max_tokens": 0}) and same_cache:
            s._parent["tokenizer"] = self  # the same vocabulary and template (another context size)
        if _same(old.retrieve, settings.retrieve, *RERANKER_FIELDS) and same_cache:
            s._parent["reranker"] = self
        return s

    def close(self) -> None:
        """Free the generator now (llama.cpp's memory), rather than when the session is
        dropped: the one this session loaded (or was given), never one it shares with the
        session it is a variant of (that one only lets go of it)."""
        with self._lock:
            g, self._generator = self._generator, None
            owned, self._owns_generator = self._owns_generator, False
            self._tokenizer = None
        close = getattr(g, "close", None) if owned else None
        if callable(close):
            close()
