"""Find candidate sections for a question."""

from __future__ import annotations

from pathlib import Path

from ragkit.errors import UsageError
from ragkit.store import DocRecord, Hit


class UnknownDocument(UsageError):
    """A named document matches nothing in the store."""


def resolve_docs(records: list[DocRecord], wanted: list[str]) -> list[DocRecord]:
    """Match each --doc (a path, a file name, or a name without extension) to one document."""
    if not wanted:
        return records
    out: list[DocRecord] = []
    for w in wanted:
        wp = str(Path(w).expanduser().resolve()) if ("/" in w or Path(w).exists()) else None
        matches = [r for r in records if wp and r.key == wp]
        if not matches:
            wl = w.lower()
            matches = [r for r in records if r.name.lower() == wl]
        if not matches:
            # the stored name with its extension removed: "NIST.SP.800-171r2" names
            # "NIST.SP.800-171r2.pdf" (the dots in the name are not an extension)
            matches = [r for r in records if Path(r.name).stem.lower() == wl]
        if not matches:
            names = ", ".join(sorted({r.name for r in records})[:12]) or "(the store is empty)"
            raise UnknownDocument(f"no ingested document matches --doc {w!r}", hint=f"ingested: {names}")
        if len(matches) > 1:
            raise UsageError(
                f"--doc {w!r} matches {len(matches)} documents ({', '.join(m.key for m in matches[:4])})",
                hint="give the full path",
            )
        if matches[0] not in out:
            out.append(matches[0])
    return out


def dense_search(store, query_vec: list[float], docs: list[DocRecord], k: int, *, per_doc: bool = False) -> list[Hit]:
    """Top-k sections by embedding similarity. With several documents named, each one is
    searched on its own and the results interleaved by rank, so every named document is
    represented in the candidates."""
    doc_ids = sorted({d.doc_id for d in docs})
    expect = {d.doc_id: d.n_chunks for d in docs}
    if len(doc_ids) <= 1 or not per_doc:
        return store.query(query_vec, k, doc_ids, expect=expect)
    per = max(2, -(-k // len(doc_ids)))
    lists = [store.query(query_vec, per, [d], expect=expect) for d in doc_ids]
    out: list[Hit] = []
    for rank in range(per):
        for lst in lists:
            if rank < len(lst):
                out.append(lst[rank])
    return out


def _get_hits(store, ids: list[str], expect: dict[str, int] | None = None) -> dict[str, Hit]:
    """Texts and metadata of chunks by id (the store's sidecars, else Chroma)."""
    if not ids:
        return {}
    return store.hits(ids, expect)


def hybrid_search(
    store,
    query: str,
    query_vec: list[float] | None,
    docs: list[DocRecord],
    k: int,
    *,
    mode: str = "hybrid",
    lexical=None,
    rrf_k: int = 60,
    per_doc: bool = False,
    all_docs: bool = False,
    bm25_weight: float = 1.0,
) -> list[Hit]:
    """Dense (Chroma) and BM25 rankings fused by reciprocal rank fusion. With `per_doc`,
    each document is searched on its own and the fused lists interleaved by rank, so
    every named document is represented."""
    from ragkit.store.lexical import rrf

    groups = [[d] for d in docs] if (per_doc and len(docs) > 1) else [docs]
    all_live = not per_doc and all_docs
    per = k if len(groups) == 1 else max(2, -(-k // len(groups)))
    expect = {d.doc_id: d.n_chunks for d in docs}
    fused_lists: list[list[Hit]] = []
    for group in groups:
        doc_ids = sorted({d.doc_id for d in group})
        rankings: list[list[str]] = []
        weights: list[float] = []
        dense = mode in ("hybrid", "dense") and query_vec is not None
        # a search over every live document (Chroma's HNSW) runs beside the lexical one; a
        # few documents' sidecar dot product takes less than handing it to a thread
        both = dense and mode == "hybrid" and lexical is not None and all_live
        if dense:
            kw = {"all_live": all_live, "expect": expect}
            pending = store.query_ids_beside(query_vec, per, doc_ids, **kw) if both else None
            if pending is None:
                rankings.append([i for i, _ in store.query_ids(query_vec, per, doc_ids, **kw)])
            weights.append(1.0)
        if mode in ("hybrid", "bm25") and lexical is not None:
            lex = lexical.search(query, per, None if all_live else doc_ids)
            if both:
                rankings.append([i for i, _ in pending.result()])
            rankings.append([i for i, _ in lex])
            weights.append(bm25_weight)
        # fuse the ids first, then fetch the texts of the `per` that are kept (and no more)
        fused = rrf(rankings, rrf_k, weights)[:per]
        known = _get_hits(store, [i for i, _ in fused], expect)
        out = []
        for i, score in fused:
            h = known.get(i)
            if h is not None:
                out.append(Hit(id=h.id, text=h.text, meta=h.meta, score=score))
        fused_lists.append(out)
    if len(fused_lists) == 1:
        return fused_lists[0]
    merged: list[Hit] = []
    for rank in range(per):
        for lst in fused_lists:
            if rank < len(lst):
                merged.append(lst[rank])
    return merged


def rerank(query: str, hits: list[Hit], model, top: int) -> list[Hit]:
    """Reorder the first `top` hits by a cross-encoder's scores alone (the pipeline's stage
    fuses them with the ranking instead: ragkit.retrieve.rerank). `model`: a Reranker (a
    Session's), or the path of a sentence-transformers CrossEncoder folder, loaded for this call."""
    if isinstance(model, (str, Path)):
        from ragkit.rerankers.crossencoder import SentenceTransformersCrossEncoder

        model = SentenceTransformersCrossEncoder(Path(model))
    head, tail = hits[:top], hits[top:]
    if not head:
        return hits
    scores = model.score(query, [h.text for h in head])
    order = sorted(range(len(head)), key=lambda i: -float(scores[i]))
    reranked = [Hit(id=head[i].id, text=head[i].text, meta=head[i].meta, score=float(scores[i])) for i in order]
    return reranked + tail
