"""The writer side of the ingest job (ragkit.ingest.pipeline runs it): one file's parse
result -> vectors (the store's embedding cache first, the embedder for the rest) -> chunks
written -> the document record committed."""

from __future__ import annotations

import time

from ragkit.errors import DocumentError
from ragkit.ingest import embcache
from ragkit.ingest.sources import _hash_file, _stat_key, doc_id_for
from ragkit.store import DocRecord


def _ingest_one(path, key, sha, st, old, store, settings, embedder, ident, parsers, report, existing, emit,
                chunking: str = "") -> None:
    """Parse result -> vectors (cache, then embedder) -> chunks written -> commit."""
    tm = report.timings
    for attempt in range(2):
        t0 = time.perf_counter()
        res = parsers.result(key)
        tm["wait_parse_s"] += time.perf_counter() - t0
        if res[0] == "error":
            raise DocumentError(key, res[1])
        now = _stat_key(path)
        if now is None:
            raise DocumentError(key, "file vanished during ingest (after it was read)")
        if now == st:
            break
        # the file changed after it was hashed: what was parsed may not be what was hashed
        if attempt == 1:
            raise DocumentError(key, "file kept changing while it was being ingested; run ingest again when it is written")
        st = now
        sha = _hash_file(path)
    _, chunks, n_sections, n_pages, t_parse, _stats = res
    doc_id = doc_id_for(sha, chunking)
    t0 = time.perf_counter()
    n_existing = store.has_chunks(doc_id)
    tm["store_s"] += time.perf_counter() - t0
    if n_existing != len(chunks):  # same content may already be stored under another path
        texts = [c.embed_text() for c in chunks]
        hashes = [embcache.text_hash(ident, t) for t in texts]

        def embed(todo: list[str]) -> list[list[float]]:
            emit("parsed", {"path": key, "chunks": len(chunks), "to_embed": len(todo), "from_cache": len(chunks) - len(todo)})

            def progress(n: int) -> None:
                emit("embedded", {"n": n})
                parsers.drain()

            t1 = time.perf_counter()
            try:
                return embedder.embed_documents(todo, progress=progress)
            finally:
                tm["embed_s"] += time.perf_counter() - t1

        vectors, n_embedded, t_lookup = embcache.embed_with_cache(texts, hashes, store.vectors_by_text_hash, embed)
        tm["lookup_s"] += t_lookup
        if n_embedded == 0:
            emit("parsed", {"path": key, "chunks": len(chunks), "to_embed": 0, "from_cache": len(chunks)})
        ids = [f"{doc_id}:{i:05d}" for i in range(len(chunks))]
        metas = [
            {
                "doc_id": doc_id,
                "doc_name": path.name,
                "section": c.section,
                "page_start": c.page_start,
                "page_end": c.page_end,
                "chunk_index": i,
                "char_start": c.char_start,
                "char_end": c.char_end,
                "kind": c.kind,
                "tokens": c.tokens,
                "text_hash": h,  # the embedding cache's key (ragkit.ingest.embcache)
            }
            for i, (c, h) in enumerate(zip(chunks, hashes))
        ]
        t0 = time.perf_counter()
        store.add_chunks(ids, vectors, [c.text for c in chunks], metas)
        tm["store_s"] += time.perf_counter() - t0
        report.chunks += len(chunks)
        report.chunks_embedded += n_embedded
        report.chunks_from_cache += len(chunks) - n_embedded
    else:
        emit("parsed", {"path": key, "chunks": len(chunks), "to_embed": 0, "from_cache": 0})
    record = DocRecord(
        key=key, doc_id=doc_id, name=path.name, path=key, sha256=sha, n_chunks=len(chunks),
        n_sections=n_sections, n_pages=n_pages, ingested_at=time.time(),
    )
    t0 = time.perf_counter()
    store.commit_document(record)  # the commit point
    if old is not None and old.doc_id != doc_id:
        store._delete_unreferenced([old.doc_id])
        report.updated += 1
        status = "updated"
    else:
        report.added += 1
        status = "added"
    tm["store_s"] += time.perf_counter() - t0
    existing[key] = record
    report.files.append({"path": key, "status": status, "chunks": len(chunks), "parse_s": round(t_parse, 3)})
    emit("file", {"path": key, "status": status, "chunks": len(chunks)})
