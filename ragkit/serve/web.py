"""The web page of `ragkit serve`: its own files, the document viewer, uploads and
clause comparison, added to the server app by `register(app)`.

Security rules (every route is also behind the server's bearer-token middleware):
- Files are served only through a store record: a route takes a document id, looks it
  up among the store's records and opens the path *that record* names, after checking
  its sha256 is the record's (410 when the file is gone, 409 when it changed). No path,
  file name or part of one taken from a request ever reaches the filesystem.
- The page's own assets come from a fixed allowlist of three names.
- Uploads are written under `<store>/uploads/` with a sanitised base name (no folders,
  no `..`, no control characters, no leading dot), never through a symlink, then go
  through `ragkit.ingest.ingest` like the CLI; a file that fails leaves the store as it
  was (a replaced upload is put back).
- Compare takes only the built-in checklists by name, never a checklist path.
- PDF pages are rendered in a separate process (pdfium is not thread-safe, ingest runs
  in a worker thread of this one, and a hostile PDF that crashes pdfium takes down the
  renderer, not the server).
"""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import threading
import time
import unicodedata
import uuid
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from fastapi import APIRouter, FastAPI, HTTPException, Query, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import HTMLResponse, JSONResponse, Response
from pydantic import BaseModel, Field

from ragkit.errors import RagkitError, UsageError
from ragkit.ingest.loaders import SUPPORTED

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


# ---------------------------------------------------------------- file names

_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u200b-\u200f\u202a-\u202e\u2066-\u2069\ufeff]")


def safe_name(raw: str | None) -> str:
    """A file name safe to create in the uploads folder: the base name only (both / and \\
    separators), NFC, control and bidi characters removed, no leading dots or spaces (no
    hidden files, no `..`), at most 150 characters, and a type ragkit reads. Raises
    UsageError with the reason."""
    name = unicodedata.normalize("NFC", raw or "")
    name = re.split(r"[/\\]", name)[-1]
    name = _CONTROL.sub("", name)
    name = re.sub(r"\s+", " ", name).strip().lstrip(". ").rstrip(". ")
    if not name or name in (".", ".."):
        raise UsageError(f"{raw!r} is not a usable file name")
    stem, suffix = os.path.splitext(name)
    if suffix.lower() not in SUPPORTED:
        raise UsageError(f"unsupported file type {suffix or '(none)'}; ragkit reads {', '.join(sorted(SUPPORTED))}")
    if not stem.strip(". "):
        raise UsageError(f"{raw!r} is not a usable file name")
    if len(name) > 150:
        name = stem[: 150 - len(suffix)].rstrip(". ") + suffix
    return name


# ---------------------------------------------------------------- routes

router = APIRouter()


def _static(name: str) -> Response:
    media = STATIC_FILES.get(name)
    if media is None:
        raise HTTPException(404, "not found")
    data = (STATIC_DIR / next(k for k in STATIC_FILES if k == name)).read_bytes()
    headers = {"Cache-Control": "no-cache", "X-Content-Type-Options": "nosniff", "Referrer-Policy": "no-referrer"}
    if name.endswith(".html"):
        headers["Content-Security-Policy"] = CSP
        headers["X-Frame-Options"] = "DENY"
    return Response(data, media_type=media, headers=headers)


@router.get("/", include_in_schema=False)
def index() -> Response:
    return _static("index.html")


@router.get("/static/{name}", include_in_schema=False)
def static(name: str) -> Response:
    return _static(name)


@router.get("/api/documents")
def documents(request: Request) -> list[dict]:
    return [
        {"doc_id": r.doc_id, "name": r.name, "pages": r.n_pages, "sections": r.n_sections, "chunks": r.n_chunks,
         "kind": kind_of(r.name), "ingested_at": r.ingested_at}
        for r in _web(request).records()
    ]


def _page(request: Request, doc_id: str, n: int, quote: str | None, scale: float, render: bool):
    from ragkit.serve.highlight import PageOutOfRange, SourceUnavailable, render_stored_page

    web = _web(request)
    recs = [r for r in web.records_of(doc_id) if kind_of(r.name) == "pdf"]
    if not recs:
        rec = web.record(doc_id)
        raise HTTPException(404, f"{rec.name} is a {kind_of(rec.name)} document: it has no pages (see /section)")
    rec = recs[0]
    if n < 1:
        raise HTTPException(404, f"page {n} is out of range")
    max_bytes = max(web.settings.ingest.max_file_mb * 1024 * 1024, 1)
    try:
        # the paths come from the store's records of this id, never from the request
        img = RENDERER.run(render_stored_page, [(r.path, r.sha256, r.name) for r in recs], n, quote or None,
                           scale=scale, render=render, max_bytes=max_bytes)
        return img, rec
    except SourceUnavailable as exc:
        raise HTTPException(exc.status, exc.message) from None
    except PageOutOfRange as exc:
        raise HTTPException(404, f"{rec.name}: {exc}") from None
    except HTTPException:
        raise
    except Exception as exc:  # pdfium refused the file (it was readable at ingest)
        raise HTTPException(500, f"{rec.name}: cannot render page {n} ({type(exc).__name__}: {str(exc)[:160]})") from None


@router.get("/api/documents/{doc_id}/page/{n:int}.png")
def page_png(request: Request, doc_id: str, n: int, quote: str | None = Query(None, max_length=MAX_QUOTE_CHARS),
             scale: float = Query(1.5, ge=0.5, le=4.0)) -> Response:
    """The page as PNG; with `quote`, the quote highlighted (on the page it is found on:
    the X-Ragkit-Page header says which)."""
    img, _ = _page(request, doc_id, n, quote, scale, True)
    return Response(img.png, media_type="image/png", headers={
        "X-Ragkit-Page": str(img.page), "X-Ragkit-Match": img.match, "Cache-Control": "private, max-age=300",
        "X-Content-Type-Options": "nosniff"})


@router.get("/api/documents/{doc_id}/page/{n:int}/boxes")
def page_boxes(request: Request, doc_id: str, n: int, quote: str | None = Query(None, max_length=MAX_QUOTE_CHARS),
               scale: float = Query(1.5, ge=0.5, le=4.0)) -> dict:
    """{page, requested_page, pages, boxes: [[x0, y0, x1, y1], ...], width, height, match,
    continues}: the quote's line rectangles in pixels of the PNG at the same scale."""
    img, rec = _page(request, doc_id, n, quote, scale, False)
    return {**img.to_json(), "doc_id": rec.doc_id, "doc": rec.name}


def section_text(hits: list) -> str:
    """The stored text of consecutive chunks of one section, as one text (chunks of one
    block are joined by a space, blocks by a blank line; ragkit.ingest.sections)."""
    out = ""
    prev_end = None
    for h in hits:
        start = int(h.meta.get("char_start", 0))
        sep = "" if prev_end is None else (" " if start <= prev_end + 1 else "\n\n")
        out += sep + h.text
        prev_end = int(h.meta.get("char_end", start + len(h.text)))
    return out


@router.get("/api/documents/{doc_id}/section")
def section(request: Request, doc_id: str, chunk: int | None = Query(None, ge=0), section: str | None = None,
            quote: str | None = Query(None, max_length=MAX_QUOTE_CHARS)) -> dict:
    """A section's text from the store's chunks (not the file), HTML-escaped, the quote
    in <mark>. The section is named by a chunk index or by its section path; when the
    quote is not in it but in another section of the document, that one is shown."""
    from ragkit.serve.highlight import find_quote, text_section_html

    web = _web(request)
    rec = web.record(doc_id)
    try:
        hits = web.serve.store().chunks([rec.doc_id])
    except RagkitError as exc:
        raise HTTPException(503, str(exc)) from None
    if not hits:
        raise HTTPException(404, f"{rec.name} has no stored text")
    at = None
    if chunk is not None:
        at = next((i for i, h in enumerate(hits) if int(h.meta.get("chunk_index", -1)) == chunk), None)
        if at is None:
            raise HTTPException(404, f"{rec.name} has no chunk {chunk}")
    elif section is not None:
        cands = [i for i, h in enumerate(hits) if (h.meta.get("section") or "") == section]
        if quote:  # a section path can recur: the occurrence that holds the quote
            cands = [i for i in cands if find_quote(hits[i].text, quote).status == "full"] or cands
        at = cands[0] if cands else None
    if (at is None or (quote and find_quote(hits[at].text, quote).status != "full")) and quote:
        found = next((i for i, h in enumerate(hits) if find_quote(h.text, quote).status == "full"), None)
        at = found if found is not None else at
    if at is None:
        raise HTTPException(404, f"{rec.name} has no section {section!r}" if section is not None else "name a chunk or a section")
    name = hits[at].meta.get("section") or ""
    lo = hi = at
    while lo > 0 and (hits[lo - 1].meta.get("section") or "") == name:
        lo -= 1
    while hi + 1 < len(hits) and (hits[hi + 1].meta.get("section") or "") == name:
        hi += 1
    run = hits[lo: hi + 1]
    text = section_text(run)
    pages = [int(h.meta[k]) for h in run for k in ("page_start", "page_end") if h.meta.get(k) is not None]
    marked = text_section_html(text, quote)
    return {"doc_id": rec.doc_id, "doc": rec.name, "kind": kind_of(rec.name), "section": name or None,
            "page": min(pages) if pages else None, "chunk": int(hits[at].meta.get("chunk_index", at)),
            "html": marked, "found": "<mark>" in marked}


@router.get("/api/jobs/{job_id}")
def job_status(request: Request, job_id: str) -> dict:
    return _web(request).jobs.get(job_id).to_json()


# ---------------------------------------------------------------- uploads

class _TooLarge(Exception):
    pass


def _write_new(path: Path, src, limit: int) -> int:
    """Copy an uploaded file to a new file at `path` (never through a symlink, never over
    an existing file). Returns the bytes written."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0), 0o600)
    n = 0
    with os.fdopen(fd, "wb") as out:
        src.seek(0)
        while block := src.read(1 << 20):
            n += len(block)
            if n > limit:
                raise _TooLarge()
            out.write(block)
    return n


UPLOAD_PATH = "/api/upload"


def upload_limit_of(settings) -> int:
    """Largest file accepted, in bytes: serve.max_upload_mb and no more than ingest.max_file_mb."""
    mb = getattr(getattr(settings, "serve", None), "max_upload_mb", None) or DEFAULT_UPLOAD_MB
    return int(min(mb, settings.ingest.max_file_mb) * 1024 * 1024)


def upload_request_cap(limit: int) -> int:
    """Largest upload request, in bytes: a few files of the largest size. The app's guard
    applies this same cap to the upload route (not its general limit), so the route's own,
    more precise answer (which file, how large, which setting) is the one a client gets."""
    return limit * 4 + (1 << 20)


@router.post(UPLOAD_PATH)
async def upload(request: Request, wait: bool = False) -> JSONResponse:
    """Files (multipart, any field name) written to <store>/uploads/ and ingested as one
    job. 202 with the job ({id, status, done, total, files, ...}; poll /api/jobs/{id});
    with ?wait=true, 200 with the finished job. The job's `result` is ingest's report
    ({added, updated, unchanged, failed: [{file, error}], chunks, removed}); files that
    cannot be taken (bad name, unsupported type) are in `failed` and never written."""
    from starlette.formparsers import MultiPartException

    web = _web(request)
    limit = web.upload_limit()
    cap = upload_request_cap(limit)  # the whole request (the guard in front lets this much through)
    length = request.headers.get("content-length")
    if length and length.isdigit() and int(length) > cap:
        raise HTTPException(413, f"upload of {int(length) / 1e6:.0f} MB is over the limit of {cap / 1e6:.0f} MB per request")
    seen = 0
    receive = request.receive

    async def counted():
        nonlocal seen
        msg = await receive()
        if msg.get("type") == "http.request":
            seen += len(msg.get("body", b""))
            if seen > cap:
                raise _TooLarge()
        return msg

    try:
        form = await Request(request.scope, counted).form(max_files=MAX_UPLOAD_FILES, max_fields=20)
    except _TooLarge:
        raise HTTPException(413, f"upload is over the limit of {cap / 1e6:.0f} MB per request") from None
    except MultiPartException as exc:
        raise HTTPException(400, f"not a valid multipart upload: {exc.message}") from None
    except AssertionError as exc:  # starlette without python-multipart
        raise HTTPException(500, str(exc)) from None
    try:
        files = [v for _, v in form.multi_items() if hasattr(v, "filename") and hasattr(v, "file")]
        if not files:
            raise HTTPException(400, "no files in the upload (send multipart/form-data with one or more files)")
        for f in files:
            size = f.size if f.size is not None else 0
            if size > limit:
                raise HTTPException(413, f"{safe_display(f.filename)} is {size / 1e6:.1f} MB, over the limit of "
                                         f"{limit / 1e6:.0f} MB per file (setting serve.max_upload_mb)")
        job = web.jobs.new("upload", total=len(files))
        staging = web.uploads_dir() / ".incoming" / job.id
        staged: list[tuple[str, Path]] = []
        rejected: list[dict] = []
        names: set[str] = set()
        await run_in_threadpool(_prepare_dirs, web.uploads_dir(), staging)
        for f in files:
            try:
                name = safe_name(f.filename)
            except UsageError as exc:
                rejected.append({"file": safe_display(f.filename), "error": str(exc)})
                continue
            if name.lower() in names:
                rejected.append({"file": name, "error": "the same file name twice in one upload"})
                continue
            names.add(name.lower())
            try:
                await run_in_threadpool(_write_new, staging / name, f.file, limit)
            except _TooLarge:
                raise HTTPException(413, f"{name} is over the limit of {limit / 1e6:.0f} MB per file") from None
            staged.append((name, staging / name))
    except BaseException as exc:
        await form.close()
        if "staging" in locals():
            shutil.rmtree(staging, ignore_errors=True)
        if "job" in locals():  # refused before it started: the job says so too
            job.status, job.finished = "error", time.time()
            job.error = str(exc.detail) if isinstance(exc, HTTPException) else "the upload was interrupted"
        raise
    await form.close()
    job.files = [{"file": r["file"], "status": "rejected", "error": r["error"]} for r in rejected]
    job.total = len(staged) + len(rejected)
    job.done = len(rejected)
    task = web.start(job, lambda j: _ingest_uploads(web, j, staged, rejected, staging))
    if wait:
        await asyncio.shield(task)
        return JSONResponse(job.to_json(), status_code=200)
    return JSONResponse(job.to_json(), status_code=202)


def safe_display(name: str | None) -> str:
    """A file name as it may be shown in a message (control characters removed)."""
    return _CONTROL.sub("", name or "")[:200] or "(no name)"


def _prepare_dirs(uploads: Path, staging: Path) -> None:
    if uploads.is_symlink():
        raise HTTPException(500, f"{uploads} is a symbolic link; refusing to write uploads through it")
    uploads.mkdir(parents=True, exist_ok=True, mode=0o700)
    incoming = uploads / ".incoming"
    if incoming.is_symlink() or (incoming.exists() and not incoming.is_dir()):
        incoming.unlink()  # planted: never stage uploads through a link
    incoming.mkdir(exist_ok=True, mode=0o700)
    staging.mkdir(mode=0o700)  # new, or it fails


def _ingest_uploads(web: WebState, job: Job, staged: list[tuple[str, Path]], rejected: list[dict], staging: Path) -> dict:
    """Move the staged files into the uploads folder and ingest them (CLI path, writer
    lock). A file that fails to ingest is removed again, or the file it replaced is put
    back, so the store and its files stay as they were."""
    from ragkit.ingest import ingest

    uploads = web.uploads_dir()
    report: dict = {"added": 0, "updated": 0, "unchanged": 0, "failed": list(rejected), "chunks": 0, "removed": 0}
    try:
        with web.write_lock:
            job.status = "running"
            if not staged:
                return report
            records = web.records()
            placed: dict[str, tuple[str, Path, Path | None]] = {}  # target -> (name, target, backup of the old file)
            for name, tmp in staged:
                target = uploads / name
                clash = [r for r in records if r.name.lower() == name.lower() and r.key != str(target)]
                if clash:
                    msg = (f"a document named {clash[0].name} from another folder is already in the store; rename "
                           "the file (two documents with one name cannot be told apart in questions)")
                    report["failed"].append({"file": name, "error": msg})
                    job.files.append({"file": name, "status": "failed", "error": msg})
                    job.done += 1
                    continue
                backup = None
                if os.path.lexists(target):
                    if os.path.islink(target) or not target.is_file():
                        os.unlink(target)  # never ingest through a link planted in the folder
                    else:
                        backup = staging / (name + ".previous")
                        os.replace(target, backup)
                os.replace(tmp, target)  # replaces the directory entry, never writes through a link
                placed[str(target)] = (name, target, backup)
            if not placed:
                return report
            by_path = {k: v[0] for k, v in placed.items()}

            def on_event(kind: str, info: dict) -> None:
                path = info.get("path")
                if kind == "parsed":
                    job.current = by_path.get(path, path and Path(path).name)
                    job.detail = f"embedding {info.get('chunks', 0)} chunks"
                elif kind == "embedded":
                    job.detail = f"embedded {info.get('n', 0)} chunks"
                elif kind in ("file", "failed"):
                    job.done += 1
                    job.detail = None
                    job.current = by_path.get(path, path and Path(path).name)

            try:
                rep = ingest([t for _, t, _ in placed.values()], web.settings, wait_s=30.0, on_event=on_event)
            except BaseException:
                for name, target, backup in placed.values():
                    _restore(target, backup)
                raise
            failed_paths = {f["path"]: f["error"] for f in rep.failed}
            for path, (name, target, backup) in placed.items():
                if path in failed_paths:
                    _restore(target, backup)
                    report["failed"].append({"file": name, "error": failed_paths[path]})
                    job.files.append({"file": name, "status": "failed", "error": failed_paths[path]})
                else:
                    status = next((f.get("status") for f in rep.files if f.get("path") == path), "added")
                    chunks = next((f.get("chunks") for f in rep.files if f.get("path") == path), None)
                    job.files.append({"file": name, "status": status, "chunks": chunks})
            for k in ("added", "updated", "unchanged", "chunks", "removed"):
                report[k] = getattr(rep, k)
            _refresh_state(web)
            return report
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _restore(target: Path, backup: Path | None) -> None:
    try:
        if backup is not None and backup.exists():
            os.replace(backup, target)
        elif os.path.lexists(target):
            os.unlink(target)
    except OSError:
        pass


def _refresh_state(web: WebState) -> None:
    """The store changed: the server reopens it on next use (an upload may have created it)."""
    web.serve.invalidate()


# ---------------------------------------------------------------- compare

def builtin_checklists() -> dict[str, list]:
    from ragkit.compare import load_checklist
    from ragkit.paths import prompts_dir

    out = {}
    for p in sorted((prompts_dir() / "checklists").glob("*.toml")):
        try:
            out[p.stem] = load_checklist(p.stem)[1]
        except RagkitError:
            continue
    return out


@router.get("/api/checklists")
def checklists() -> list[dict]:
    return [{"name": name, "items": [{"id": i.id, "title": i.title, "question": i.question,
                                      "kind": "yes/no" if i.hypothesis is not None else "text"} for i in items]}
            for name, items in builtin_checklists().items()]


class CompareBody(BaseModel):
    docs: list[str] = Field(..., min_length=1, max_length=8, description="document names (or ids) to compare")
    checklist: str = Field("nda", max_length=200, description="a built-in checklist (prompts/checklists)")
    items: list[str] | None = Field(None, max_length=100, description="item ids; default: all")


@router.post("/api/compare")
async def compare(request: Request, body: CompareBody, wait: bool = False) -> JSONResponse:
    """A checklist walked over 1+ documents (ragkit.compare.compare) as a job: 202 with
    the job (poll /api/jobs/{id}; `result` is Comparison.to_json()), or with ?wait=true
    200 with the finished job. Exports: /api/compare/{id}.html, .md and .docx."""
    from ragkit.retrieve.search import resolve_docs

    web = _web(request)
    lists = await run_in_threadpool(builtin_checklists)
    if body.checklist not in lists:  # names only: a path here would read any TOML file
        raise HTTPException(400, f"unknown checklist {body.checklist!r}; built in: {', '.join(lists)}")
    items = lists[body.checklist]
    chosen = [i for i in items if not body.items or i.id in body.items]
    if body.items:
        unknown = sorted(set(body.items) - {i.id for i in items})
        if unknown:
            raise HTTPException(400, f"unknown checklist item(s): {', '.join(unknown)}")
    records = await run_in_threadpool(web.records)
    by_id = {r.doc_id: r.name for r in records}
    names = [by_id.get(d, d) for d in body.docs]
    if any("/" in n or "\\" in n for n in names):  # by name or id only, never a path
        raise HTTPException(400, "name the documents by file name or document id, not by path")
    try:
        picked = resolve_docs(records, names)
    except UsageError as exc:
        raise HTTPException(400, str(exc)) from None
    names = list(dict.fromkeys(r.name for r in picked))
    job = web.jobs.new("compare", total=len(names) * len(chosen))
    job.paths = {r.name: r.path for r in picked}
    settings = web.settings
    serve = web.serve

    def work(j: Job) -> dict:
        from ragkit.compare import compare as run_compare

        def progress(doc: str, item: str) -> None:
            j.done += 1
            j.current = f"{doc}: {item}"

        with serve.generator_lock:  # never beside a chat answer: one model, one KV cache
            j.status = "running"
            result = run_compare(names, settings, body.checklist, items=[i.id for i in chosen], on_progress=progress)
        j.comparison = result
        return result.to_json()

    task = web.start(job, work)
    if wait:
        await asyncio.shield(task)
        return JSONResponse(job.to_json(), status_code=200)
    return JSONResponse(job.to_json(), status_code=202)


def _finished_comparison(request: Request, job_id: str):
    job = _web(request).jobs.get(job_id)
    if job.kind != "compare":
        raise HTTPException(404, f"job {job_id} is not a comparison")
    if job.comparison is None:
        raise HTTPException(409, f"comparison {job_id} is {job.status}" + (f": {job.error}" if job.error else ""))
    return job


@router.get("/api/compare/{job_id}.html")
def compare_html(request: Request, job_id: str) -> HTMLResponse:
    from ragkit.compare import to_html

    job = _finished_comparison(request, job_id)
    # no file links: the server's own paths are not the reader's business (nor usable by them)
    return HTMLResponse(to_html(job.comparison, None), headers={
        "Content-Disposition": f'attachment; filename="ragkit-compare-{job.id[:8]}.html"',
        "Content-Security-Policy": "default-src 'none'; style-src 'unsafe-inline'", "X-Content-Type-Options": "nosniff"})


@router.get("/api/compare/{job_id}.md")
def compare_md(request: Request, job_id: str) -> Response:
    from ragkit.compare import to_markdown

    job = _finished_comparison(request, job_id)
    return Response(to_markdown(job.comparison), media_type="text/markdown; charset=utf-8", headers={
        "Content-Disposition": f'attachment; filename="ragkit-compare-{job.id[:8]}.md"', "X-Content-Type-Options": "nosniff"})


@router.get("/api/compare/{job_id}.docx")
def compare_docx(request: Request, job_id: str) -> Response:
    """The memo as a Word file (ragkit.compare_docx), written in memory: no path is read or written."""
    import io

    from ragkit.compare_docx import MEDIA_TYPE, to_docx

    job = _finished_comparison(request, job_id)
    buf = io.BytesIO()
    to_docx(job.comparison, buf)
    return Response(buf.getvalue(), media_type=MEDIA_TYPE, headers={
        "Content-Disposition": f'attachment; filename="ragkit-compare-{job.id[:8]}.docx"', "X-Content-Type-Options": "nosniff"})


# ---------------------------------------------------------------- registration

def register(app: FastAPI) -> None:
    """Add the page and its API to the server app (called by ragkit.serve.app.create_app)."""
    app.state.ragkit_web = WebState(app)
    app.include_router(router)
