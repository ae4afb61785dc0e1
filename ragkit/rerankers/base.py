"""The reranker protocol: a cross-encoder reads a question together with a passage and gives
one relevance score per pair. It is small so a new engine is one class; this module imports
none of the implementations (ragkit.rerankers.onnx, .crossencoder and .openai, named by
ragkit.rerankers.factory's BACKENDS)."""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from ragkit.errors import RagkitError

DEFAULT_MODEL = "legal-minilm-l12"  # the registry's cross-encoder trained on contracts (ragkit/models_data/legal-reranker)


class RerankerError(RagkitError):
    """The rerank server answered with an error, or with scores we cannot use."""

    exit_code = 3


@runtime_checkable
class Reranker(Protocol):
    name: str  # what the Retrieval reports as the backend

    def score(self, query: str, passages: list[str]) -> list[float]: ...
