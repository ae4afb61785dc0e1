"""An embedder that remembers the vectors it made: the one a `Session` hands out.

A chat's follow-up cites the same sources, a checklist embeds each document's sentences
once for all its items, and the claim check embeds the passages retrieval ranked a moment
before; each would otherwise pay the model again. The memory lives as long as the
object that holds it (a Session), never in a module.
"""

from __future__ import annotations

import threading
from collections import OrderedDict

import numpy as np


class MemoEmbedder:
    """`inner`'s vectors, each document text embedded once (least recently used first out
    past `max_texts`). Queries are remembered apart (a query vector may carry an
    instruction prefix a document's does not). Everything else is `inner`'s.

    Vectors are kept as float32 arrays (the models compute float32): a 384-dim vector is
    1.5 KB there against about 9 KB as a list of Python floats, so a full memo of 50,000
    texts holds about 77 MB rather than 460 MB. They are handed out as lists, as made."""

    def __init__(self, inner, max_texts: int = 50_000):
        self.inner = inner
        self.max_texts = max_texts
        self._docs: OrderedDict[str, np.ndarray] = OrderedDict()
        self._queries: OrderedDict[str, np.ndarray] = OrderedDict()
        self._lock = threading.Lock()  # serve answers from worker threads

    # the protocol's identity, read through (a store compares it with its own)
    @property
    def name(self) -> str:
        return self.inner.name

    @property
    def dim(self) -> int:
        return self.inner.dim

    @property
    def max_tokens(self) -> int:
        return self.inner.max_tokens

    @property
    def variant(self) -> str:
        return getattr(self.inner, "variant", None) or type(self.inner).__name__

    def __getattr__(self, attr: str):  # precision, query_prefix, close ...: the model's own
        if attr == "inner":
            raise AttributeError(attr)
        return getattr(self.inner, attr)

    def count_tokens(self, texts: list[str]) -> list[int]:
        return self.inner.count_tokens(texts)

    def _remember(self, memo: OrderedDict, text: str, vec) -> list[float]:
        """Keep `vec` as float32; returns it as the list every caller gets."""
        memo[text] = arr = np.asarray(vec, dtype=np.float32)
        while len(memo) > self.max_texts:
            memo.popitem(last=False)
        return arr.tolist()

    def embed_documents(self, texts: list[str], progress=None) -> list[list[float]]:
        with self._lock:
            have = {}
            for t in texts:
                if t in self._docs:
                    have[t] = self._docs[t].tolist()
                    self._docs.move_to_end(t)
        todo = list(dict.fromkeys(t for t in texts if t not in have))
        if todo:
            made = self.inner.embed_documents(todo, progress=progress) if progress is not None \
                else self.inner.embed_documents(todo)
            with self._lock:
                for t, v in zip(todo, made):
                    have[t] = self._remember(self._docs, t, v)
        return [have[t] for t in texts]

    def embed_query(self, text: str) -> list[float]:
        with self._lock:
            hit = self._queries.get(text)
        if hit is not None:
            return hit.tolist()
        v = self.inner.embed_query(text)
        with self._lock:
            return self._remember(self._queries, text, v)
