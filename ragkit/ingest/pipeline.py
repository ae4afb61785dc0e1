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
    _error_reason,
    _main_hidden,
    _worker_init,
    auto_workers,
)
from ragkit.ingest.parsepool import _Parsers as _ParsePool
from ragkit.ingest.sources import (  # noqa: F401
    _hash_file,
    _stat_key,
    chunk_file,
    chunking_key,
    discover,
    doc_id_for,
)
from ragkit.store import ChromaStore, StoreWriter, open_store


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


# ------------------------------------------------------------------ the parse job

def _parse_one(path: str, settings: Settings | None = None, embedder: Embedder | None = None) -> tuple:
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
        return ("error", _error_reason(exc))
    stats = {k: loaders.STATS[k] - before.get(k, 0) for k in loaders.STATS}
    return ("ok", chunks, n_sections, n_pages, time.perf_counter() - t0, stats)


def _worker_embedder(settings: Settings) -> Embedder:
    """The worker process's embedder for `settings.embed` (parse workers and Ray tasks get
    many files each: the model loads once per process, not per file)."""
    key = (settings.embed.model_dump_json(), str(settings.cache_dir))
    got = _WORKER.get("embedder")
    if got is None or got[0] != key:
        got = _WORKER["embedder"] = (key, load_embedder(settings))
    return got[1]


class _Parsers(_ParsePool):
    """The parse-worker pool (ragkit.ingest.parsepool), with `_parse_one` as its job
    unless another is given."""

    def __init__(self, settings: Settings, workers: int, on_done: Callable[[str, tuple], None], job: Callable = None):
        super().__init__(settings, workers, on_done, job or _parse_one)


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
        if getattr(parsers, "embedder", ...) is None:
            parsers.embedder = embedder  # files parsed here count tokens with the embedder of this ingest
        if lookahead is None:
            lookahead = settings.ingest.lookahead
        ahead = Lookahead(embedder, ident, store, parsers, report, emit) if lookahead and len(to_parse) > 1 else None
        todo_at = [i for i, p in enumerate(plan) if p[5] is None]  # plan indices of the files to parse, in order
        try:
            parsers.plan(to_parse)
            for i, (path, key, sha, st, old, state) in enumerate(plan):
                if state == "unchanged":
                    report.unchanged += 1
                    report.files.append({"path": key, "status": "unchanged", "chunks": old.n_chunks})
                    emit("file", {"path": key, "status": "unchanged"})
                    continue
                try:
                    if state is not None:
                        raise DocumentError(key, state)
                    if ahead is None:
                        _ingest_one(path, key, sha, st, old, store, settings, embedder, ident, parsers, report, existing,
                                    emit, chunking)
                        continue
                    if key not in ahead.ready:
                        ahead.take_up((path, key, sha, st, old), chunking)
                    k = bisect.bisect_right(todo_at, i)  # the next file to parse after this one
                    if k < len(todo_at):  # its texts go to the embedder before this file's writes
                        ahead.take_up(plan[todo_at[k]][:5], chunking)
                    ahead.write(key, existing)
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
        finally:
            if ahead is not None:
                ahead.close()
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


def sync_lexical_index(store: ChromaStore, settings: Settings) -> None:
    """Bring the lexical index of `retrieve.lexical` in line with the store (under the write lock)."""
    from ragkit.store.lexical_backend import refresh_lexical

    refresh_lexical(settings, store)
