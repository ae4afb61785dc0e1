"""A deterministic embedder with no model (`embed.backend = "hash"`): each stemmed content
word (the tokens the BM25 index makes) is hashed to one of `dim` dimensions with a sign,
and the vector is L2-normalised. Texts that share words are close, texts that share none
are orthogonal, the same text always gives the same vector, on any machine. For logic
tests of the pipeline that need no weights (with ragkit.generate.python_function); it reads no
meaning, so it is never a default and its store identity (`hash-DIM`) is its own.
"""

from __future__ import annotations

import hashlib
import math

DIM = 256


class HashEmbedder:
    max_tokens = 512

    def __init__(self, dim: int = DIM):
        self.dim = dim
        self.name = f"hash-{dim}"

    def _words(self, text: str) -> list[str]:
        from ragkit.store.lexical import tokenize

        return tokenize(text or "")

    def count_tokens(self, texts: list[str]) -> list[int]:
        return [max(1, len((t or "").split())) for t in texts]

    def _vector(self, text: str) -> list[float]:
        v = [0.0] * self.dim
        for w in self._words(text):
            h = hashlib.blake2b(w.encode("utf-8"), digest_size=8).digest()
            v[int.from_bytes(h[:4], "little") % self.dim] += 1.0 if h[4] & 1 else -1.0
        norm = math.sqrt(sum(x * x for x in v))
        if norm == 0:
            v[0], norm = 1.0, 1.0  # a text without words: one fixed direction, not a zero vector
        return [x / norm for x in v]

    def embed_documents(self, texts: list[str], progress=None) -> list[list[float]]:
        out = []
        for t in texts:
            out.append(self._vector(t))
            if progress is not None:
                progress(1)
        return out

    def embed_query(self, text: str) -> list[float]:
        return self._vector(text)
