"""`crossencoder`: a user's own sentence-transformers CrossEncoder folder (`retrieve.reranker`),
e.g. one trained on a firm's clause library; run by sentence-transformers on torch."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from ragkit.errors import ConfigError

if TYPE_CHECKING:
    from ragkit.config import Settings


class SentenceTransformersCrossEncoder:
    """A local sentence-transformers CrossEncoder folder (`retrieve.reranker`)."""

    def __init__(self, path: Path):
        self.path = Path(path).expanduser()
        self.name = f"crossencoder:{self.path.name}"
        self._model = None
        if not self.path.exists():
            raise ConfigError(f"reranker model not found at {self.path}",
                              hint="retrieve.reranker must be a local CrossEncoder folder")

    def score(self, query: str, passages: list[str]) -> list[float]:
        if not passages:
            return []
        if self._model is None:
            from sentence_transformers import CrossEncoder

            self._model = CrossEncoder(str(self.path), device="cpu", local_files_only=True)
        return [float(s) for s in self._model.predict([(query, p) for p in passages], show_progress_bar=False)]

    @classmethod
    def from_settings(cls, settings: "Settings") -> "SentenceTransformersCrossEncoder":
        if not settings.retrieve.reranker:
            raise ConfigError("retrieve.rerank 'crossencoder' needs retrieve.reranker (a CrossEncoder folder)")
        return cls(Path(settings.retrieve.reranker))

