"""The web page's state (ragkit.serve.web re-exports it): its constants, the jobs the page
polls, the page renderer process and the per-app `WebState`. The security rules are in
ragkit.serve.web."""

from __future__ import annotations

import asyncio
import os
import re
import threading
import time
import uuid
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from fastapi import FastAPI, HTTPException, Request
from fastapi.concurrency import run_in_threadpool

from ragkit.errors import RagkitError

STATIC_DIR = Path(__file__).resolve().parent / "static"
# the page's own files: the only names /static/ serves
STATIC_FILES = {
    "index.html": "text/html; charset=utf-8",
    "app.js": "text/javascript; charset=utf-8",
    "app.css": "text/css; charset=utf-8",
}
# what a browser loads before it can send a token (a navigation carries no Authorization
# header): the page and its assets, which hold no document data. For the server's guard
# to exempt from the token check (Host and Origin checks still apply).
PUBLIC_PATHS = frozenset({"/"} | {f"/static/{name}" for name in STATIC_FILES})
# nothing from another origin: scripts, styles, images (blob: for the page images fetched
# with the token), fetches
CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' blob: data:; connect-src 'self'; "
       "base-uri 'none'; form-action 'none'; frame-ancestors 'none'")
DOC_ID = re.compile(r"^[0-9a-f]{24}$")  # ragkit.ingest.pipeline.doc_id_for: 24 hex digits of the sha256
JOB_ID = re.compile(r"^[0-9a-f]{32}$")
KINDS = {".pdf": "pdf", ".docx": "docx", ".md": "md", ".markdown": "md", ".txt": "txt"}
DEFAULT_UPLOAD_MB = 50
MAX_UPLOAD_FILES = 50
RENDER_TIMEOUT_S = 60.0
MAX_QUOTE_CHARS = 4000


# ---------------------------------------------------------------- jobs

@dataclass
class Job:
    """An upload or a comparison running in a worker thread; the page polls it."""

    id: str
    kind: str  # "upload" | "compare"
    total: int = 0
    done: int = 0
    status: str = "queued"  # queued | running | done | error
    current: str | None = None  # the file or item being worked on
    detail: str | None = None  # e.g. "embedding 12 chunks"
    error: str | None = None
    result: Any = None  # JSON for the page
    files: list[dict] = field(default_factory=list)  # uploads: per-file outcome
    created: float = field(default_factory=time.time)
    finished: float | None = None
    comparison: Any = None  # compare: the ragkit.compare.Comparison, for the exports
    paths: dict[str, str] = field(default_factory=dict)  # compare: doc name -> file, for to_html

    def to_json(self) -> dict:
        return {
            "id": self.id, "kind": self.kind, "status": self.status, "done": self.done, "total": self.total,
            "current": self.current, "detail": self.detail, "error": self.error, "files": self.files,
            "result": self.result, "seconds": round((self.finished or time.time()) - self.created, 1),
        }


class Jobs:
    KEEP = 100

    def __init__(self) -> None:
        self._jobs: dict[str, Job] = {}
        self._lock = threading.Lock()

    def new(self, kind: str, total: int = 0) -> Job:
        job = Job(id=uuid.uuid4().hex, kind=kind, total=total)
        with self._lock:
            self._jobs[job.id] = job
            if len(self._jobs) > self.KEEP:  # forget the oldest finished jobs
                for jid in [j.id for j in self._jobs.values() if j.finished][: len(self._jobs) - self.KEEP]:
                    del self._jobs[jid]
        return job

    def get(self, job_id: str) -> Job:
        job = self._jobs.get(job_id) if JOB_ID.match(job_id or "") else None
        if job is None:
            raise HTTPException(404, f"no job {job_id!r} (jobs are kept in memory while the server runs)")
        return job


# ---------------------------------------------------------------- the page renderer process

class Renderer:
    """One worker process that renders PDF pages (shared by every app in this process)."""

    def __init__(self) -> None:
        self._pool: ProcessPoolExecutor | None = None
        self._lock = threading.Lock()

    def _get(self) -> ProcessPoolExecutor:
        import multiprocessing

        with self._lock:
            if self._pool is None:
                self._pool = ProcessPoolExecutor(max_workers=1, mp_context=multiprocessing.get_context("spawn"))
            return self._pool

    def _reset(self, pool: ProcessPoolExecutor, kill: bool = False) -> None:
        with self._lock:
            if self._pool is pool:
                self._pool = None
        if kill:
            for p in list(getattr(pool, "_processes", {}).values()):  # a hung render: end its process
                try:
                    p.kill()
                except Exception:
                    pass
        pool.shutdown(wait=False, cancel_futures=True)

    def run(self, fn: Callable, *args, **kwargs):
        from concurrent.futures import TimeoutError as FutureTimeout

        pool = self._get()
        try:
            fut = pool.submit(fn, *args, **kwargs)
        except (BrokenProcessPool, RuntimeError):
            self._reset(pool)
            pool = self._get()
            fut = pool.submit(fn, *args, **kwargs)
        try:
            return fut.result(timeout=RENDER_TIMEOUT_S)
        except BrokenProcessPool:
            self._reset(pool)
            raise HTTPException(500, "the page renderer crashed on this document") from None
        except FutureTimeout:
            self._reset(pool, kill=True)
            raise HTTPException(504, f"rendering the page took over {RENDER_TIMEOUT_S:.0f} s") from None

    def close(self) -> None:
        with self._lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=True, cancel_futures=True)


RENDERER = Renderer()


# ---------------------------------------------------------------- state

class WebState:
    def __init__(self, app: FastAPI):
        self.app = app
        self.jobs = Jobs()
        self.write_lock = threading.Lock()  # one upload ingest at a time (the store has one writer)
        self.tasks: set[asyncio.Task] = set()

    @property
    def serve(self):
        return self.app.state.ragkit

    @property
    def settings(self):
        return self.serve.settings

    def upload_limit(self) -> int:
        """Largest file accepted, in bytes: serve.max_upload_mb (default 50 MB) and no more
        than ingest.max_file_mb, which ingest would refuse anyway."""
        return upload_limit_of(self.settings)

    def uploads_dir(self) -> Path:
        return Path(os.path.abspath(self.settings.store)) / "uploads"

    def records(self) -> list:
        """The store's document records ([] while nothing is ingested yet)."""
        try:
            return self.serve.documents()
        except RagkitError as exc:
            raise HTTPException(503, str(exc)) from None

    def records_of(self, doc_id: str) -> list:
        """The store records of `doc_id` (404 when the store has none). Several records
        share an id when one content was ingested under two paths."""
        if not DOC_ID.match(doc_id or ""):
            raise HTTPException(404, "no such document")
        recs = [r for r in self.records() if r.doc_id == doc_id]
        if not recs:
            raise HTTPException(404, f"no document with id {doc_id} in the store")
        return recs

    def record(self, doc_id: str):
        recs = self.records_of(doc_id)
        return next((r for r in recs if os.path.exists(r.path)), recs[0])

    def start(self, job: Job, work: Callable[[Job], Any]) -> asyncio.Task:
        async def run() -> None:
            try:
                job.result = await run_in_threadpool(work, job)
                job.status = "done"
            except HTTPException as exc:
                job.status, job.error = "error", str(exc.detail)
            except RagkitError as exc:
                job.status, job.error = "error", str(exc)
            except Exception as exc:  # a bug must reach the page as a message, not a stuck job
                job.status, job.error = "error", f"{type(exc).__name__}: {str(exc)[:300]}"
            finally:
                job.finished = time.time()
                job.current = None

        task = asyncio.get_running_loop().create_task(run())
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)
        return task


def _web(request: Request) -> WebState:
    return request.app.state.ragkit_web


def kind_of(name: str) -> str:
    return KINDS.get(Path(name).suffix.lower(), "other")


def upload_limit_of(settings) -> int:
    """Largest file accepted, in bytes: serve.max_upload_mb and no more than ingest.max_file_mb."""
    mb = getattr(getattr(settings, "serve", None), "max_upload_mb", None) or DEFAULT_UPLOAD_MB
    return int(min(mb, settings.ingest.max_file_mb) * 1024 * 1024)
