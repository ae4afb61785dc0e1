"""The writer side of the ingest job (ragkit.ingest.pipeline runs it): one file's parse
result -> vectors (the store's embedding cache first, the embedder for the rest) -> chunks
written -> the document record committed.

Two ways through it, with the same store writes in the same order:
- `_ingest_one`: one file at a time (parse result, vectors, write, commit);
- `Lookahead`: while file k is written and committed, file k+1's texts are already with the
  embedder (a background thread waits on it), so an embedder in another process (Ray's
  actors, ragkit.cluster) never waits for the driver's store writes."""

from __future__ import annotations

import queue
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from ragkit.errors import DocumentError, StoreError
from ragkit.evidence import spans
from ragkit.ingest import changes, embcache
from ragkit.ingest.sources import _hash_file, _stat_key, doc_id_for
from ragkit.store import DocRecord


def _parsed(path, key, sha, st, parsers, tm) -> tuple[tuple, str]:
    """This file's parse result, once the file is known not to have changed since it was hashed."""
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
            return res, sha
        # the file changed after it was hashed: what was parsed may not be what was hashed
        if attempt == 1:
            raise DocumentError(key, "file kept changing while it was being ingested; run ingest again when it is written")
        st = now
        sha = _hash_file(path)
    raise AssertionError("unreachable")


def _ingest_one(path, key, sha, st, old, store, settings, embedder, ident, parsers, report, existing, emit,
                chunking: str = "") -> None:
    """Parse result -> vectors (cache, then embedder) -> chunks written -> commit."""
    tm = report.timings
    res, sha = _parsed(path, key, sha, st, parsers, tm)
    _, chunks, n_sections, n_pages, t_parse, _stats = res
    doc_id = doc_id_for(sha, chunking, Path(path).suffix)
    t0 = time.perf_counter()
    n_existing = store.has_chunks(doc_id)
    tm["store_s"] += time.perf_counter() - t0
    hashes = vectors = None
    n_embedded = 0
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
    else:
        emit("parsed", {"path": key, "chunks": len(chunks), "to_embed": 0, "from_cache": 0})
    _write(path, key, sha, old, doc_id, res, hashes, vectors, n_embedded, store, report, existing, emit)


def _write(path, key, sha, old, doc_id, res, hashes, vectors, n_embedded, store, report, existing, emit) -> None:
    """The document's chunks (when `hashes` is not None: they are not stored yet), then its record."""
    tm = report.timings
    _, chunks, n_sections, n_pages, t_parse, _stats = res
    if hashes is not None:
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
                # its units (sentences, list items) as character offsets, split once here and read by
                # every later step: the reranker's units, the prompt's excerpts (ragkit.evidence.spans)
                "units": spans.encode(spans.unit_spans(c.text)),
                # unaccepted tracked changes of a Word file (ragkit.ingest.changes), when it has them
                **({"changes": changes.dumps(c.changes)} if c.changes else {}),
            }
            for i, (c, h) in enumerate(zip(chunks, hashes))
        ]
        t0 = time.perf_counter()
        store.add_chunks(ids, vectors, [c.text for c in chunks], metas)
        tm["store_s"] += time.perf_counter() - t0
        report.chunks += len(chunks)
        report.chunks_embedded += n_embedded
        report.chunks_from_cache += len(chunks) - n_embedded
    tracked = changes.summary([t for c in chunks for t in c.changes])
    record = DocRecord(
        key=key, doc_id=doc_id, name=path.name, path=key, sha256=sha, n_chunks=len(chunks),
        n_sections=n_sections, n_pages=n_pages, ingested_at=time.time(),
        tracked_changes=tracked["count"], change_authors=", ".join(tracked["authors"]),
        change_dates=tracked["first"] + (f" to {tracked['last']}" if tracked["last"] != tracked["first"] else ""),
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


@dataclass
class _Ahead:
    """A file taken up ahead of its write: its parse result, and its texts with the embedder."""

    entry: tuple  # (path, key, sha, stat, old) as planned
    error: Exception | None = None  # raised at its turn, so the batch reports files in order
    sha: str = ""
    res: tuple = ()
    doc_id: str = ""
    hashes: list[str] | None = None  # None: its chunks are stored already (same content, another path)
    found: dict = field(default_factory=dict)  # text hash -> vector, from the store
    job: Future | None = None  # the embedding of `todo` in the background thread
    todo: list[str] = field(default_factory=list)  # the hashes this file sends to the embedder
    waits_on: dict = field(default_factory=dict)  # text hash -> the earlier file's job embedding it
    texts: dict = field(default_factory=dict)  # text hash -> text, for the hashes of `waits_on`


class Lookahead:
    """File k+1's texts go to the embedder before file k is written.

    The driver's store writes (chunks, then the record: the commit rule is unchanged, and
    files are still committed in plan order) then overlap the next file's embedding instead
    of leaving the embedder idle. The embed-once rule holds across the two files in flight:
    a text of file k+1 that file k is still embedding is taken from file k's job, not sent
    again. Every event is still sent from the calling thread (the background thread only
    counts embedded chunks; they are reported while the caller waits)."""

    def __init__(self, embedder, ident: str, store, parsers, report, emit):
        self.embedder, self.ident, self.store, self.parsers = embedder, ident, store, parsers
        self.report, self.emit = report, emit
        self.tm = report.timings
        # one thread: the embedder runs one job at a time, in file order
        self.pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ragkit-embed")
        self.counts: queue.SimpleQueue[int] = queue.SimpleQueue()
        self.inflight: dict[str, Future] = {}  # text hash -> the job embedding it (files not yet written)
        self.ready: dict[str, _Ahead] = {}  # key -> file taken up ahead
        self.stopping = False

    def take_up(self, entry: tuple, chunking: str) -> None:
        """Parse result, cache lookup and the embedding started for one planned file."""
        path, key, sha, st, old = entry
        a = self.ready[key] = _Ahead(entry)
        try:
            a.res, a.sha = _parsed(path, key, sha, st, self.parsers, self.tm)
            chunks = a.res[1]
            a.doc_id = doc_id_for(a.sha, chunking, Path(path).suffix)
            t0 = time.perf_counter()
            n_existing = self.store.has_chunks(a.doc_id)
            self.tm["store_s"] += time.perf_counter() - t0
            if n_existing == len(chunks):
                self.emit("parsed", {"path": key, "chunks": len(chunks), "to_embed": 0, "from_cache": 0})
                return
            texts = [c.embed_text() for c in chunks]
            a.hashes = [embcache.text_hash(self.ident, t) for t in texts]
            t0 = time.perf_counter()
            a.found = self.store.vectors_by_text_hash(a.hashes) if a.hashes else {}
            self.tm["lookup_s"] += time.perf_counter() - t0
            # a text an earlier file, not yet written, is embedding is taken from that file's job
            todo, a.texts = embcache.missing(texts, a.hashes, a.found, self.inflight)
            a.waits_on = {h: self.inflight[h] for h in a.texts}
            self.emit("parsed", {"path": key, "chunks": len(chunks), "to_embed": len(todo),
                                 "from_cache": len(chunks) - len(todo)})
            if todo:
                a.todo = list(todo)
                a.job = self.pool.submit(self._embed, list(todo.values()))
                a.job.index = {h: i for i, h in enumerate(a.todo)}
                for h in a.todo:
                    self.inflight[h] = a.job
        except StoreError:
            raise
        except Exception as exc:  # reported at this file's turn
            a.error = exc

    def _embed(self, texts: list[str]) -> tuple[list, float]:
        t0 = time.perf_counter()
        vecs = self.embedder.embed_documents(texts, progress=self._count)
        if len(vecs) != len(texts):
            raise RuntimeError(f"the embedder returned {len(vecs)} vectors for {len(texts)} texts")
        return vecs, time.perf_counter() - t0

    def _count(self, n: int) -> None:
        """The embedder's progress, after each batch: where a closed lookahead stops its job."""
        if self.stopping:
            raise _Stopped("ingest stopped")
        self.counts.put(n)

    def _pump(self) -> None:
        """The embedded counts as events, and the parse results that landed, from this thread."""
        while True:
            try:
                n = self.counts.get_nowait()
            except queue.Empty:
                break
            self.emit("embedded", {"n": n})
        self.parsers.drain()

    def _result(self, job: Future) -> list:
        while True:
            try:
                vecs, seconds = job.result(timeout=0.2)  # returns as soon as it is done; 0.2 s: how often progress is reported
                break
            except TimeoutError:
                self._pump()
        self._pump()
        if not getattr(job, "counted", False):
            job.counted = True
            self.tm["embed_s"] += seconds
        return vecs

    def write(self, key: str, existing: dict) -> None:
        """Wait for this file's vectors, write its chunks and commit its record."""
        a = self.ready.pop(key)
        try:
            if a.error is not None:
                raise a.error
            path, key, _sha, _st, old = a.entry
            vectors = None
            redo: list[str] = []
            if a.hashes is not None:
                found = dict(a.found)
                if a.job is not None:
                    found.update(zip(a.todo, self._result(a.job)))
                for h, job in a.waits_on.items():
                    try:
                        vecs = self._result(job)
                    except Exception:  # the earlier file's embedding failed: embed its text here
                        redo.append(h)
                        continue
                    found[h] = vecs[job.index[h]]
                if redo:
                    found.update(zip(redo, self.embedder.embed_documents([a.texts[h] for h in redo])))
                vectors = [found[h] for h in a.hashes]
            # texts taken from an earlier file's job count as cached, as they would once it is written
            _write(path, key, a.sha, old, a.doc_id, a.res, a.hashes, vectors, len(a.todo) + len(redo),
                   self.store, self.report, existing, self.emit)
        finally:
            for h in a.todo:
                if self.inflight.get(h) is a.job:
                    del self.inflight[h]

    def close(self) -> None:
        """No job waits to start, and the running one stops after its current batch (Ctrl-C
        or a store error: the process exits within a batch, not after a whole file)."""
        self.stopping = True
        self.pool.shutdown(wait=False, cancel_futures=True)


class _Stopped(Exception):
    pass
