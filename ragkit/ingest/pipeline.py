"""The ingest job: idempotent per file (keyed by content hash), one writer at a time,
each document committed by a single record write, bad files reported and skipped.

Stages: hash (skip unchanged files) -> parse + chunk (worker processes, ahead of the
embedder) -> vectors (the store's embedding cache first, the embedder for the rest) ->
write chunks -> commit the document record. Parsing runs in `ingest.workers` processes
(pypdfium2 is not thread-safe, and a PDF that crashes the parser takes down only its
worker), so the next files are parsed while this one embeds; results are taken in file
order, so commits stay in a deterministic order."""

from __future__ import annotations

import bisect
import os
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from ragkit.config import Settings
from ragkit.embed import Embedder, load_embedder
from ragkit.errors import DocumentError, StoreError, UsageError
from ragkit.ingest import embcache

# by job: the sources (ragkit.ingest.sources: files, hashes, chunks, document ids), the
# parse workers (ragkit.ingest.parsepool), the writer (ragkit.ingest.commit); this module
# runs the job
from ragkit.ingest.commit import Lookahead, _ingest_one
from ragkit.ingest.parsepool import (  # noqa: F401
    _SPAWN_LOCK,
    _WORKER,
    _main_hidden,
    _worker_init,
    auto_workers,
    error_reason,
)
from ragkit.ingest.parsepool import _Parsers as _ParsePool
from ragkit.ingest.sources import (  # noqa: F401
    _hash_file,
    _stat_key,
    check_size,
    chunk_file,
    chunking_key,
    discover,
    doc_id_for,
)
from ragkit.store import ChromaStore, StoreWriter, follow_store_embedder, open_store


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
    # on a cluster: the work each node did, by its address ({"10.0.0.3": {"parsed": 2, "embedded": 180}})
    nodes: dict = field(default_factory=dict)

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
            "pages": self.pages,
            "workers": self.workers,
            "timings": {k: round(v, 3) for k, v in self.timings.items()},
            **({"nodes": self.nodes} if self.nodes else {}),
        }


# ------------------------------------------------------------------ the parse job

def parse_one(path: str, settings: Settings | None = None, embedder: Embedder | None = None) -> tuple:
    """Parse one file; every failure comes back as ("error", reason), the same reason
    the batch reports. Runs in a worker process (a pool's or Ray's: the embedder is the
    worker's, loaded once), or in this one (`overlap=False`: the caller's `embedder`)."""
    from ragkit.ingest import loaders

    settings = settings or _WORKER["settings"]
    embedder = embedder or _worker_embedder(settings)
    before = dict(loaders.STATS)
    t0 = time.perf_counter()
    try:
        chunks, n_sections, n_pages = chunk_file(Path(path), settings, embedder)
    except DocumentError as exc:
        return ("error", exc.reason)
    except (KeyboardInterrupt, SystemExit):
        raise
    except Exception as exc:  # a bug or a library failure on one file must not stop the batch
        if os.environ.get("RAGKIT_DEBUG"):
            traceback.print_exc()
        return ("error", error_reason(exc))
    stats = {k: loaders.STATS[k] - before.get(k, 0) for k in loaders.STATS}
    return ("ok", chunks, n_sections, n_pages, time.perf_counter() - t0, stats)


def file_bytes(path: str, settings: Settings) -> bytes:
    """A file's bytes, to be parsed where it does not exist (a Ray task on another machine:
    bytes travel, never paths), refused by the same rules and in the same words as a local
    parse (the size limit first: an oversized file is never read)."""
    from ragkit.ingest.loaders import read_bytes

    check_size(Path(path), settings)
    return read_bytes(Path(path))


def parse_bytes(name: str, data: bytes, settings: Settings) -> tuple:
    """`parse_one` of a file sent as bytes: written under its own name (the readers go by
    its suffix and its content) in a private temporary folder, parsed, removed."""
    import tempfile

    with tempfile.TemporaryDirectory(prefix="ragkit-parse-") as tmp:
        path = Path(tmp) / Path(name).name
        path.write_bytes(data)
        return parse_one(str(path), settings)


def _worker_embedder(settings: Settings) -> Embedder:
    """The worker process's embedder for `settings.embed` (parse workers and Ray tasks get
    many files each: the model loads once per process, not per file)."""
    key = (settings.embed.model_dump_json(), str(settings.cache_dir))
    got = _WORKER.get("embedder")
    if got is None or got[0] != key:
        got = _WORKER["embedder"] = (key, load_embedder(settings))
    return got[1]


class _Parsers(_ParsePool):
    """The parse-worker pool (ragkit.ingest.parsepool), with `parse_one` as its job
    unless another is given."""

    def __init__(self, settings: Settings, workers: int, on_done: Callable[[str, tuple], None], job: Callable = None):
        super().__init__(settings, workers, on_done, job or parse_one)


# ------------------------------------------------------------------ the job


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
    lookahead: bool | None = None,
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

    `lookahead` sends the next file's texts to the embedder before this file is written
    (`ragkit.ingest.commit.Lookahead`: same writes, same order); None takes `ingest.lookahead`
    (ragkit.cluster passes True).

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
    timings = report.timings = {"hash_s": 0.0, "parse_s": 0.0, "wait_parse_s": 0.0, "lookup_s": 0.0, "embed_s": 0.0,
                                "store_s": 0.0, "index_s": 0.0}
    for item in failed:
        emit("failed", item)
    if embedder is None:
        settings = follow_store_embedder(settings)  # files added to a store are embedded by its own model
        embedder = load_embedder(settings)
    ident = embcache.identity(embedder)
    chunking = chunking_key(settings, embedder)
    with StoreWriter(settings, wait_s) as writer:
        store, existing = _open_for_writing(settings, embedder, writer, timings)
        emit("start", {"files": len(files)})
        plan = _hash_files(files, existing, store, chunking, timings)  # 1. unchanged files are skipped unparsed
        to_parse = [entry[1] for entry in plan if entry[5] is None]
        sizes = {entry[1]: (entry[3][0] if entry[3] else 0) for entry in plan if entry[5] is None}
        workers = report.workers = _worker_count(settings, parsers, overlap, len(to_parse))
        emit("plan", {"parse": len(to_parse), "bytes": sum(sizes.values()), "workers": workers})
        pool = _start_parsers(settings, parsers, workers, embedder, _parse_recorder(report, sizes, emit))
        job = _Job(settings, embedder, ident, chunking, store, existing, pool, report, emit)
        if lookahead is None:
            lookahead = settings.ingest.lookahead
        if lookahead and len(to_parse) > 1:
            job.ahead = Lookahead(embedder, ident, store, pool, report, emit)
        try:
            pool.plan(to_parse)
            _write_files(plan, job)  # 2. parse, embed, write and commit each file, in plan order
            pool.close()
        except BaseException:
            pool.close(kill=True)  # Ctrl-C or a store error: end the workers now
            raise
        finally:
            if job.ahead is not None:
                job.ahead.close()
        if prune:
            _prune_missing(files, existing, store, report, emit)
        t0 = time.perf_counter()
        sync_lexical_index(store, settings)
        timings["index_s"] += time.perf_counter() - t0
    timings["wall_s"] = time.perf_counter() - t_start
    return report


@dataclass
class _Job:
    """What every file's write shares: the settings and embedder of this ingest, the store
    it writes to, the records it started with, the parse pool, the report and the events."""

    settings: Settings
    embedder: Embedder
    ident: str  # the embedder's identity in the embedding cache (embcache.identity)
    chunking: str  # chunking_key: part of every document id
    store: ChromaStore
    existing: dict  # key -> the document record the store held when the job started
    parsers: object  # the parse pool: plan, result, drain, close
    report: IngestReport
    emit: Callable[[str, dict], None]
    ahead: Lookahead | None = None  # the next file's texts embedded while this one is written


def _open_for_writing(settings: Settings, embedder: Embedder, writer: StoreWriter, timings: dict) -> tuple:
    """The store under this writer's lease, tidied after an interrupted run, and its document records by key."""
    t0 = time.perf_counter()
    store = open_store(settings, embedder, create=True)
    store.guard = writer.check  # a writer that lost the server lease stops before its next write
    store.gc()  # finish what an interrupted run left behind
    existing = {rec.key: rec for rec in store.documents()}
    timings["store_s"] += time.perf_counter() - t0
    return store, existing


def _hash_files(files: list[Path], existing: dict, store: ChromaStore, chunking: str, timings: dict) -> list[tuple]:
    """One plan entry per file, (path, key, sha | None, stat, old record, state): state is
    None for a file to parse, "unchanged" for one stored as it is, or why it cannot be read."""
    plan: list[tuple] = []
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
        if old is not None and old.doc_id == doc_id_for(sha, chunking, Path(path).suffix) and store.has_chunks(old.doc_id) == old.n_chunks:
            plan.append((path, key, sha, st, old, "unchanged"))
        else:
            plan.append((path, key, sha, st, old, None))
    timings["hash_s"] += time.perf_counter() - t0
    return plan


def _worker_count(settings: Settings, make_parsers: Callable | None, overlap: bool, n_to_parse: int) -> int:
    """Parse processes this job runs: the factory's own count, else `ingest.workers`
    (or one per core) up to the files to parse, or 0 when parsing in this process."""
    if make_parsers is not None:
        return getattr(make_parsers, "workers", 0)  # the factory says how many it runs
    if overlap and n_to_parse:
        return min(settings.ingest.workers or auto_workers(), n_to_parse)
    return 0


def _parse_recorder(report: IngestReport, sizes: dict, emit: Callable[[str, dict], None]) -> Callable[[str, tuple], None]:
    """The parse pool's on_done: a finished parse's time, pages and loader counts go to the
    report, and its "parse_done" event is sent (`sizes`: bytes by key)."""
    timings = report.timings

    def parse_done(path: str, res: tuple) -> None:
        ok = res[0] == "ok"
        if ok:
            timings["parse_s"] += res[4]
            report.pages += res[3] or 0
            for name, seconds in res[5].items():
                timings[f"loader_{name}"] = timings.get(f"loader_{name}", 0) + seconds
        emit("parse_done", {"path": path, "pages": (res[3] or 0) if ok else 0,
                            "chunks": len(res[1]) if ok else 0, "bytes": sizes.get(path, 0)})

    return parse_done


def _start_parsers(settings: Settings, make_parsers: Callable | None, workers: int, embedder: Embedder,
                   on_done: Callable[[str, tuple], None]):
    """The parse pool: the caller's factory's, or `workers` processes of `parse_one`."""
    pool = make_parsers(settings, on_done) if make_parsers is not None else _Parsers(settings, workers, on_done)
    if getattr(pool, "embedder", ...) is None:
        pool.embedder = embedder  # files parsed here count tokens with the embedder of this ingest
    return pool


def _write_files(plan: list[tuple], job: _Job) -> None:
    """Each planned file in order: unchanged ones counted, the others written and committed;
    a file that fails is reported and the batch goes on, a store failure stops it."""
    todo_at = [i for i, entry in enumerate(plan) if entry[5] is None]  # plan indices of the files to parse, in order
    for i, (path, key, sha, st, old, state) in enumerate(plan):
        if state == "unchanged":
            job.report.unchanged += 1
            job.report.files.append({"path": key, "status": "unchanged", "chunks": old.n_chunks})
            job.emit("file", {"path": key, "status": "unchanged"})
            continue
        try:
            if state is not None:
                raise DocumentError(key, state)
            if job.ahead is None:
                _ingest_one(path, key, sha, st, old, job.store, job.settings, job.embedder, job.ident, job.parsers,
                            job.report, job.existing, job.emit, job.chunking)
            else:
                _write_ahead(plan, todo_at, i, job)
        except DocumentError as exc:
            _record_failure(job, key, exc.reason)
        except (KeyboardInterrupt, SystemExit, StoreError):
            raise  # the store itself failed (a full disk, a lost lease): the batch stops, exit 4 or 5
        except Exception as exc:  # a bug or a library failure on one file must not stop the batch
            _record_failure(job, key, error_reason(exc))
            if os.environ.get("RAGKIT_DEBUG"):
                traceback.print_exc()


def _write_ahead(plan: list[tuple], todo_at: list[int], i: int, job: _Job) -> None:
    """Plan entry `i` written through the lookahead, once the next file to parse after it
    (`todo_at`: the plan indices of the files to parse) has gone to the embedder."""
    key = plan[i][1]
    if key not in job.ahead.ready:
        job.ahead.take_up(plan[i][:5], job.chunking)
    k = bisect.bisect_right(todo_at, i)  # the next file to parse after this one
    if k < len(todo_at):  # its texts go to the embedder before this file's writes
        job.ahead.take_up(plan[todo_at[k]][:5], job.chunking)
    job.ahead.write(key, job.existing)


def _record_failure(job: _Job, key: str, reason: str) -> None:
    item = {"path": key, "error": reason}
    job.report.failed.append(item)
    job.emit("failed", item)


def _prune_missing(files: list[Path], existing: dict, store: ChromaStore, report: IngestReport,
                   emit: Callable[[str, dict], None]) -> None:
    """Documents whose file is neither in this ingest nor on disk any more are removed."""
    wanted = {str(p) for p in files}
    for rec in list(existing.values()):
        if rec.key not in wanted and not Path(rec.key).exists():
            store.remove_document(rec.key)
            report.removed += 1
            emit("pruned", {"path": rec.key})


def sync_lexical_index(store: ChromaStore, settings: Settings) -> None:
    """Bring the lexical index of `retrieve.lexical` in line with the store (under the write lock)."""
    from ragkit.store.lexical_backend import refresh_lexical

    refresh_lexical(settings, store)
