"""The ingest job: idempotent per file (keyed by content hash), one writer at a time,
each document committed by a single record write, bad files reported and skipped.

Stages: hash (skip unchanged files) -> parse + chunk (worker processes, ahead of the
embedder) -> vectors (the store's embedding cache first, the embedder for the rest) ->
write chunks -> commit the document record. Parsing runs in `ingest.workers` processes
(pypdfium2 is not thread-safe, and a PDF that crashes the parser takes down only its
worker), so the next files are parsed while this one embeds; results are taken in file
order, so commits stay in a deterministic order."""

from __future__ import annotations

import hashlib
import os
import time
import traceback
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from ragkit.config import Settings
from ragkit.embed import Embedder, load_embedder
from ragkit.errors import DocumentError, StoreError, UsageError
from ragkit.ingest import embcache
from ragkit.ingest.loaders import SUPPORTED, load
from ragkit.ingest.model import Chunk
from ragkit.ingest.sections import build_sections, chunk_sections
from ragkit.store import ChromaStore, DocRecord, StoreWriter, open_store


@dataclass
class IngestReport:
    added: int = 0
    updated: int = 0
    unchanged: int = 0
    failed: list[dict] = field(default_factory=list)
    chunks: int = 0  # chunks written in this run
    removed: int = 0  # documents pruned
    files: list[dict] = field(default_factory=list)  # per-file outcome, for humans
    # of the chunks written: texts sent to the embedder, and chunks whose vector was
    # already in the store (the same text embedded before) or repeated in the same file
    chunks_embedded: int = 0
    chunks_from_cache: int = 0
    pages: int = 0  # pages parsed (files with pages)
    workers: int = 0  # parse processes used (0: parsed in this process)
    # seconds: parse_s is the parsers' own time (in parallel with the rest); the others are
    # this process's time in each stage; wait_parse_s is time spent waiting for a parser
    timings: dict = field(default_factory=dict)

    def to_json(self) -> dict:
        return {
            "added": self.added,
            "updated": self.updated,
            "unchanged": self.unchanged,
            "failed": self.failed,
            "chunks": self.chunks,
            "removed": self.removed,
            "chunks_embedded": self.chunks_embedded,
            "chunks_from_cache": self.chunks_from_cache,
        }


def doc_id_for(sha256: str, chunking: str = "") -> str:
    """A stored version of a document: its content and how it was cut into chunks
    (`chunking_key`). The same bytes chunked another way are another version, with chunks
    of their own, so re-chunking never leaves a longer old version's tail chunks live under
    the id. 24 hex digits."""
    if not chunking:
        return sha256[:24]
    return hashlib.sha256(f"{sha256}\x00{chunking}".encode()).hexdigest()[:24]


def chunking_key(settings: Settings, embedder: Embedder) -> str:
    """What decides the chunks of a file besides its bytes (the settings `chunk_file` reads)."""
    i = settings.ingest
    max_tokens = min(i.chunk_tokens or embedder.max_tokens, embedder.max_tokens)
    # v2: pdfium's U+FFFE read as a hyphen (ragkit/ingest/loaders.py): a PDF ingested before is re-read
    return (f"v2|{i.pdf_engine}|{max_tokens}|{i.min_chunk_tokens}|{i.max_pages}|{i.ocr_lang}|{i.tables}|"
            f"{embedder.name}")


def discover(paths: list[Path]) -> tuple[list[Path], list[dict]]:
    """Expand files and folders. Folders are walked without following symlinks (no loops);
    only supported types are taken from folders, while a file named explicitly is always
    tried so the user hears why it was refused."""
    files: list[Path] = []
    failed: list[dict] = []
    seen: set[str] = set()

    def add(p: Path) -> None:
        key = os.path.abspath(p)
        if key not in seen:
            seen.add(key)
            files.append(Path(key))

    for p in paths:
        try:
            if p.is_dir():
                for root, dirs, names in os.walk(p, followlinks=False, onerror=None):
                    dirs[:] = sorted(d for d in dirs if not d.startswith("."))
                    for n in sorted(names):
                        fp = Path(root) / n
                        if n.startswith((".", "~$")) or fp.suffix.lower() not in SUPPORTED:
                            continue
                        add(fp)
            elif p.exists() or p.is_symlink():
                add(p)
            else:
                failed.append({"path": str(p), "error": "no such file or folder"})
        except OSError as exc:
            failed.append({"path": str(p), "error": f"cannot read: {exc.strerror or exc}"})
    return files, failed


def _hash_file(path: Path) -> str:
    h = hashlib.sha256()
    if os.path.islink(path):
        try:
            os.stat(path)
        except FileNotFoundError:
            raise DocumentError(str(path), f"broken symbolic link (points to {os.readlink(path)})") from None
        except OSError as exc:
            if exc.errno == 40:  # ELOOP
                raise DocumentError(str(path), "symbolic link loop") from None
    try:
        with open(path, "rb") as f:
            while block := f.read(1 << 20):
                h.update(block)
    except FileNotFoundError:
        raise DocumentError(str(path), "file vanished before it could be read") from None
    except PermissionError:
        raise DocumentError(str(path), "permission denied") from None
    except IsADirectoryError:
        raise DocumentError(str(path), "is a folder") from None
    except OSError as exc:
        if exc.errno == 40:  # ELOOP
            raise DocumentError(str(path), "symbolic link loop") from None
        raise DocumentError(str(path), f"cannot read file: {exc.strerror or exc}") from None
    return h.hexdigest()


def chunk_file(path: Path, settings: Settings, embedder: Embedder) -> tuple[list[Chunk], int, int | None]:
    """Parse one file into chunks. Returns (chunks, n_sections, n_pages)."""
    try:
        size = path.stat().st_size
    except OSError:
        size = 0
    if size > settings.ingest.max_file_mb * 1024 * 1024:
        raise DocumentError(str(path), f"file is {size / 1e6:.0f} MB, over the limit of {settings.ingest.max_file_mb} MB (setting ingest.max_file_mb)")
    blocks = load(
        path,
        pdf_engine=settings.ingest.pdf_engine,
        max_pages=settings.ingest.max_pages,
        max_docx_inflated_mb=settings.ingest.max_docx_inflated_mb,
        ocr_lang=settings.ingest.ocr_lang,
        tables=settings.ingest.tables,
    )
    sections = build_sections(blocks)
    max_tokens = settings.ingest.chunk_tokens or embedder.max_tokens
    max_tokens = min(max_tokens, embedder.max_tokens)
    chunks = chunk_sections(sections, embedder.count_tokens, max_tokens, settings.ingest.min_chunk_tokens)
    pages = [b.page for b in blocks if b.page is not None]
    return chunks, len(sections), (max(pages) if pages else None)


def auto_workers() -> int:
    """Parse processes when `ingest.workers` is 0: the cores this process may use, less
    the load already on them, less one for the embedder's own process; at least one."""
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cores = os.cpu_count() or 1
    try:
        load = os.getloadavg()[0]
    except OSError:
        load = 0.0
    return max(1, min(8, int(cores - load) - 1))


def _error_reason(exc: BaseException) -> str:
    """The per-file message for an unexpected failure (a bug or a library error)."""
    return f"could not be read ({type(exc).__name__}: {str(exc)[:160]})"


# ------------------------------------------------------------------ parse workers

_WORKER: dict = {}


def _worker_init(settings: Settings) -> None:
    import signal
    import threading

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle: it ends the workers
    _WORKER["settings"] = settings
    parent = os.getppid()

    def watch() -> None:
        # A parent killed with -9 never tells its pool: the workers would wait on their
        # queue forever (seen here). Leave when the parent is gone (re-parented).
        while os.getppid() == parent:
            time.sleep(0.5)
        os._exit(1)

    threading.Thread(target=watch, name="ragkit-parent-watch", daemon=True).start()


def _parse_one(path: str, settings: Settings | None = None) -> tuple:
    """Parse one file; every failure comes back as ("error", reason), the same reason
    the batch reports. Runs in a worker process (or in this one, `overlap=False`)."""
    from ragkit.ingest import loaders

    settings = settings or _WORKER["settings"]
    before = dict(loaders.STATS)
    t0 = time.perf_counter()
    try:
        chunks, n_sections, n_pages = chunk_file(Path(path), settings, load_embedder(settings))
    except DocumentError as exc:
        return ("error", exc.reason)
    except (KeyboardInterrupt, SystemExit):
        raise
    except Exception as exc:  # a bug or a library failure on one file must not stop the batch
        if os.environ.get("RAGKIT_DEBUG"):
            traceback.print_exc()
        return ("error", _error_reason(exc))
    stats = {k: loaders.STATS[k] - before.get(k, 0) for k in loaders.STATS}
    return ("ok", chunks, n_sections, n_pages, time.perf_counter() - t0, stats)


_SPAWN_LOCK = __import__("threading").Lock()


@contextmanager
def _main_hidden():
    """Spawn workers without re-running the caller's `__main__` in them.

    multiprocessing's spawn imports the parent's main module in every child so that
    functions defined there can be unpickled. The parse job lives in this module and needs
    nothing from `__main__`, while re-importing it breaks real callers: a script that calls
    ingest() at top level without an `if __name__ == "__main__"` guard (as in the README)
    would start ingest again in each worker, and code read from stdin has no file to import.
    So while a worker is being spawned, `__main__` is a blank module (a few milliseconds)."""
    import sys
    import types

    with _SPAWN_LOCK:
        real = sys.modules.get("__main__")
        sys.modules["__main__"] = types.ModuleType("__main__")
        try:
            yield
        finally:
            if real is not None:
                sys.modules["__main__"] = real


class _Parsers:
    """Files parsed ahead of the embedder, results taken in file order.

    A pool of `workers` processes (spawned, not forked: the parent may hold torch's
    threads) keeps up to 2 x workers files in flight. A worker that dies (a crash inside
    a parser, the OOM killer) breaks the pool: the pool is rebuilt and the file retried
    once alone; if it kills its worker again, that file fails with a clear reason and the
    others go on. With workers = 0 each file is parsed here, when its turn comes."""

    def __init__(self, settings: Settings, workers: int, on_done: Callable[[str, tuple], None], job: Callable = None):
        from collections import deque

        self.job = job or _parse_one  # a module-level function (it is pickled by name)
        self.settings = settings
        self.workers = workers
        self.on_done = on_done  # called in this thread, from drain()
        self.todo: deque[str] = deque()
        self.futures: dict[str, object] = {}
        self.pool = None
        import queue

        self.done: queue.SimpleQueue = queue.SimpleQueue()  # (path, result), filled by the pool's thread

    def _pool(self):
        if self.pool is None:
            import multiprocessing
            from concurrent.futures import ProcessPoolExecutor

            self.pool = ProcessPoolExecutor(
                self.workers, mp_context=multiprocessing.get_context("spawn"),
                initializer=_worker_init, initargs=(self.settings,),
            )
        return self.pool

    def plan(self, paths: list[str]) -> None:
        self.todo.extend(paths)
        self._fill()

    def _submit(self, path: str):
        with _main_hidden():  # submit() is where the pool spawns its workers
            fut = self._pool().submit(self.job, path)

        def done(f, path=path):
            if not f.cancelled() and f.exception() is None:
                self.done.put((path, f.result()))

        fut.add_done_callback(done)
        return fut

    def _fill(self) -> None:
        from concurrent.futures.process import BrokenProcessPool

        if self.workers <= 0:
            return
        while self.todo and len(self.futures) < 2 * self.workers:
            path = self.todo.popleft()
            try:
                self.futures[path] = self._submit(path)
            except BrokenProcessPool:  # a worker died since: result() finds out and rebuilds the pool
                self.todo.appendleft(path)
                return

    def drain(self) -> None:
        """Report the parses that finished since the last call (in this thread)."""
        while True:
            try:
                path, res = self.done.get_nowait()
            except Exception:
                return
            self.on_done(path, res)

    def result(self, path: str) -> tuple:
        """The parse of `path` (the next file in order, or any file again, parsed now)."""
        from concurrent.futures.process import BrokenProcessPool

        if self.workers <= 0:
            res = self.job(path, self.settings)
            self.on_done(path, res)
            return res
        if path in self.todo:
            self.todo.remove(path)
        try:
            fut = self.futures.pop(path, None) or self._submit(path)
            self._fill()  # keep the workers busy while this file embeds
            res = fut.result()
        except BrokenProcessPool:
            res = self._retry_alone(path)
        self.drain()
        return res

    def _retry_alone(self, path: str) -> tuple:
        from concurrent.futures.process import BrokenProcessPool

        self._restart()
        try:
            res = self._submit(path).result()
        except BrokenProcessPool:
            self._restart()
            res = ("error", "the parser crashed on this file (its worker process died); the other files went on")
        self._fill()
        return res

    def _restart(self) -> None:
        """A broken pool: drop it and resubmit what was in flight, in order (results that
        came back before it broke are kept)."""
        ok = lambda f: f.done() and not f.cancelled() and f.exception() is None  # noqa: E731
        pending = [p for p, f in self.futures.items() if not ok(f)]
        for p in pending:
            del self.futures[p]
        self.close(kill=True)
        self.todo.extendleft(reversed(pending))

    def close(self, kill: bool = False) -> None:
        if self.pool is None:
            return
        pool, self.pool = self.pool, None
        if not kill:
            pool.shutdown(wait=True)
            return
        # ProcessPoolExecutor has no public way to stop running workers before Python 3.14
        # (terminate_workers); a parse can take seconds, so end them instead of waiting.
        procs = list((getattr(pool, "_processes", None) or {}).values())
        pool.shutdown(wait=False, cancel_futures=True)
        for p in procs:
            try:
                p.kill()
            except Exception:
                pass
        for p in procs:
            p.join(5)


# ------------------------------------------------------------------ the job


def _stat_key(path: Path) -> tuple | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_size, st.st_mtime_ns, st.st_ino)


def ingest(
    paths: list[Path],
    settings: Settings,
    *,
    prune: bool = False,
    wait_s: float = 0.0,
    on_event: Callable[[str, dict], None] | None = None,
    overlap: bool = True,
    embedder: Embedder | None = None,
    parsers: Callable[[Settings, Callable[[str, tuple], None]], "_Parsers"] | None = None,
) -> IngestReport:
    """Ingest files and folders into the store named by `settings`.

    `overlap=False` parses each file in this process when its turn comes (no workers):
    the sequential path, for debugging and for the benchmark's comparison.

    `embedder` and `parsers` let another executor do the work while this job keeps the
    writer lease, the embedding cache and the commit order (ragkit.cluster: Ray tasks
    parse, Ray actors embed): `embedder` stands in for `load_embedder(settings)` (same
    name, dimension, variant and token counts), `parsers(settings, on_done)` for the
    parse-worker pool (an object with `plan`, `result`, `drain`, `close`, the same
    contract as `_Parsers`; the factory's `workers` attribute is what the report says).

    Events (kind, info), all sent from the calling thread: "start" {files}; "plan"
    {parse: files to parse, bytes}; "parse_done" {path, pages, chunks, bytes} when a
    parser finishes a file (ahead of its turn); "parsed" {path, chunks, to_embed,
    from_cache} when its turn comes; "embedded" {n} per batch; "file" {path, status,
    chunks} after its commit; "failed" {path, error}; "pruned" {path}."""
    if not paths:
        raise UsageError("nothing to ingest: give at least one file or folder")
    emit = on_event or (lambda kind, info: None)
    t_start = time.perf_counter()
    files, failed = discover(paths)
    report = IngestReport(failed=list(failed))
    tm = {"hash_s": 0.0, "parse_s": 0.0, "wait_parse_s": 0.0, "lookup_s": 0.0, "embed_s": 0.0, "store_s": 0.0, "index_s": 0.0}
    report.timings = tm
    for f in failed:
        emit("failed", f)
    embedder = embedder or load_embedder(settings)
    ident = embcache.identity(embedder)
    chunking = chunking_key(settings, embedder)
    with StoreWriter(settings, wait_s) as writer:
        t0 = time.perf_counter()
        store = open_store(settings, embedder, create=True)
        store.guard = writer.check  # a writer that lost the server lease stops before its next write
        store.gc()  # finish what an interrupted run left behind
        existing = {r.key: r for r in store.documents()}
        tm["store_s"] += time.perf_counter() - t0
        emit("start", {"files": len(files)})

        # 1. hash every file: unchanged ones are skipped without being parsed
        plan: list[tuple] = []  # (path, key, sha | None, stat, old, error | None)
        t0 = time.perf_counter()
        for path in files:
            key = str(path)
            old = existing.get(key)
            try:
                st = _stat_key(path)
                sha = _hash_file(path)
            except DocumentError as exc:
                plan.append((path, key, None, None, old, exc.reason))
                continue
            if old is not None and old.doc_id == doc_id_for(sha, chunking) and store.has_chunks(old.doc_id) == old.n_chunks:
                plan.append((path, key, sha, st, old, "unchanged"))
            else:
                plan.append((path, key, sha, st, old, None))
        tm["hash_s"] += time.perf_counter() - t0
        to_parse = [p[1] for p in plan if p[5] is None]
        sizes = {p[1]: (p[3][0] if p[3] else 0) for p in plan if p[5] is None}
        workers = 0
        if parsers is not None:
            workers = getattr(parsers, "workers", 0)  # the factory says how many it runs
        elif overlap and to_parse:
            workers = min(settings.ingest.workers or auto_workers(), len(to_parse))
        report.workers = workers
        emit("plan", {"parse": len(to_parse), "bytes": sum(sizes.values()), "workers": workers})

        def parse_done(path: str, res: tuple) -> None:
            ok = res[0] == "ok"
            if ok:
                tm["parse_s"] += res[4]
                report.pages += res[3] or 0
                for k, v in res[5].items():
                    tm[f"loader_{k}"] = tm.get(f"loader_{k}", 0) + v
            emit("parse_done", {"path": path, "pages": (res[3] or 0) if ok else 0,
                                "chunks": len(res[1]) if ok else 0, "bytes": sizes.get(path, 0)})

        make_parsers = parsers
        parsers = make_parsers(settings, parse_done) if make_parsers is not None else _Parsers(settings, workers, parse_done)
        try:
            parsers.plan(to_parse)
            for path, key, sha, st, old, state in plan:
                if state == "unchanged":
                    report.unchanged += 1
                    report.files.append({"path": key, "status": "unchanged", "chunks": old.n_chunks})
                    emit("file", {"path": key, "status": "unchanged"})
                    continue
                try:
                    if state is not None:
                        raise DocumentError(key, state)
                    _ingest_one(path, key, sha, st, old, store, settings, embedder, ident, parsers, report, existing, emit,
                                chunking)
                except DocumentError as exc:
                    item = {"path": key, "error": exc.reason}
                    report.failed.append(item)
                    emit("failed", item)
                except (KeyboardInterrupt, SystemExit, StoreError):
                    raise  # the store itself failed (a full disk, a lost lease): the batch stops, exit 4 or 5
                except Exception as exc:  # a bug or a library failure on one file must not stop the batch
                    item = {"path": key, "error": _error_reason(exc)}
                    report.failed.append(item)
                    emit("failed", item)
                    if os.environ.get("RAGKIT_DEBUG"):
                        traceback.print_exc()
            parsers.close()
        except BaseException:
            parsers.close(kill=True)  # Ctrl-C or a store error: end the workers now
            raise
        if prune:
            wanted = {str(p) for p in files}
            for rec in list(existing.values()):
                if rec.key not in wanted and not Path(rec.key).exists():
                    store.remove_document(rec.key)
                    report.removed += 1
                    emit("pruned", {"path": rec.key})
        t0 = time.perf_counter()
        sync_lexical_index(store, settings)
        tm["index_s"] += time.perf_counter() - t0
    tm["wall_s"] = time.perf_counter() - t_start
    return report


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


def sync_lexical_index(store: ChromaStore, settings: Settings) -> None:
    """Bring the BM25 index in line with the store (under the write lock)."""
    from ragkit.store import lexical as bm25

    bm25.refresh(store, bm25.index_dir(settings.store, settings.store_url, settings.collection, settings.cache_dir))
