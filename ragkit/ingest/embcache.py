"""Embed each text once: a content-addressed embedding cache kept in the chunk records.

Key: sha256 of the embedder's identity (name, dimension, backend and precision) and the exact text it
embeds (`Chunk.embed_text()`); value: the vector. The key is stored as the chunk
record's `text_hash` metadata, so the cache IS the chunk collection: a vector and the
text it was computed from are one record, written by one upsert, and there is no second
store that a killed ingest could leave out of step with the first (nor a second index
to write). A new chunk whose text hash is already in the store takes that record's
vector (`ChromaStore.vectors_by_text_hash`); only the rest go to the embedder.

Why not a separate cache (a sqlite file of hash -> vector)? It would need its own
crash story (a vector written, its text not, or the reverse), its own eviction, and a
second copy of every vector; and it would not follow the store to a Chroma server.
"""

from __future__ import annotations

import hashlib
from typing import Callable


def identity(embedder) -> str:
    """What makes two vectors of the same text interchangeable: the model, its size, and
    the backend and precision that computed them (`variant`: "torch-fp32", "onnx-int8"...).
    The store accepts vectors of every backend of one model (they agree to a cosine of 0.99
    and better), but a cached vector must be the one this embedder would compute: an int8
    vector depends on its batch-mates and is not what an fp32 re-ingest asked for."""
    variant = getattr(embedder, "variant", None) or type(embedder).__name__
    return f"{embedder.name}\x00{int(embedder.dim)}\x00{variant}"


def text_hash(ident: str, text: str) -> str:
    return hashlib.sha256(f"{ident}\x00{text}".encode("utf-8", "surrogatepass")).hexdigest()


def missing(texts: list[str], hashes: list[str], found, pending=()) -> tuple[dict[str, str], dict[str, str]]:
    """What the embedder must be given: (hash -> text of each distinct text neither `found`
    nor `pending`, first occurrence, in document order; hash -> text of those `pending`: being
    embedded for another file right now, ragkit.ingest.commit.Lookahead)."""
    todo: dict[str, str] = {}
    waits: dict[str, str] = {}
    for h, t in zip(hashes, texts):
        if h in found or h in todo or h in waits:
            continue
        if h in pending:
            waits[h] = t
        else:
            todo[h] = t
    return todo, waits


def embed_with_cache(
    texts: list[str],
    hashes: list[str],
    lookup: Callable[[list[str]], dict[str, list[float]]],
    embed: Callable[[list[str]], list[list[float]]],
) -> tuple[list[list[float]], int, float]:
    """Vectors for `texts` (hashed as `hashes`): from `lookup` where the store has them,
    each distinct remaining text embedded once. Returns (vectors, texts embedded,
    seconds spent in lookup)."""
    import time

    t0 = time.perf_counter()
    found = lookup(hashes) if hashes else {}
    t_lookup = time.perf_counter() - t0
    todo, _ = missing(texts, hashes, found)
    if todo:
        vecs = embed(list(todo.values()))
        if len(vecs) != len(todo):
            raise RuntimeError(f"the embedder returned {len(vecs)} vectors for {len(todo)} texts")
        found = {**found, **dict(zip(todo.keys(), vecs))}
    return [found[h] for h in hashes], len(todo), t_lookup
