"""Uploads to the web page (ragkit.serve.web re-exports them): safe file names, the upload
route, staging under `<store>/uploads/.incoming/` and the ingest that puts a failed file's
predecessor back. The security rules are in ragkit.serve.web."""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import time
import unicodedata
from pathlib import Path

from fastapi import APIRouter, HTTPException, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse

from ragkit.errors import UsageError
from ragkit.ingest.loaders import SUPPORTED
from ragkit.serve.web_state import MAX_UPLOAD_FILES, Job, WebState, _web

router = APIRouter()

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
    web = _web(request)
    limit = web.upload_limit()
    cap = upload_request_cap(limit)  # the whole request (the guard in front lets this much through)
    _refuse_declared_length(request, cap)
    form = await _read_form(request, cap)
    job: Job | None = None
    staging: Path | None = None
    try:
        files = _uploaded_files(form, limit)
        job = web.jobs.new("upload", total=len(files))
        staging = web.uploads_dir() / ".incoming" / job.id
        staged, rejected = await _stage(files, web.uploads_dir(), staging, limit)
    except BaseException as exc:
        await form.close()
        _abandon(job, staging, exc)
        raise
    await form.close()
    task = _start_ingest(web, job, staged, rejected, staging)
    if wait:
        await asyncio.shield(task)
        return JSONResponse(job.to_json(), status_code=200)
    return JSONResponse(job.to_json(), status_code=202)


def _refuse_declared_length(request: Request, cap: int) -> None:
    """413 before reading a byte when the request's Content-Length is over `cap`."""
    length = request.headers.get("content-length")
    if length and length.isdigit() and int(length) > cap:
        raise HTTPException(413, f"upload of {int(length) / 1e6:.0f} MB is over the limit of {cap / 1e6:.0f} MB per request")


async def _read_form(request: Request, cap: int):
    """The multipart form, its bytes counted as they arrive: 413 once they pass `cap`
    (whatever the request declared), 400 for a form that is not multipart."""
    from starlette.formparsers import MultiPartException

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
        return await Request(request.scope, counted).form(max_files=MAX_UPLOAD_FILES, max_fields=20)
    except _TooLarge:
        raise HTTPException(413, f"upload is over the limit of {cap / 1e6:.0f} MB per request") from None
    except MultiPartException as exc:
        raise HTTPException(400, f"not a valid multipart upload: {exc.message}") from None
    except AssertionError as exc:  # starlette without python-multipart
        raise HTTPException(500, str(exc)) from None


def _uploaded_files(form, limit: int) -> list:
    """The form's files (any field name): 400 when there is none, 413 when one says it is
    over `limit` bytes."""
    files = [v for _, v in form.multi_items() if hasattr(v, "filename") and hasattr(v, "file")]
    if not files:
        raise HTTPException(400, "no files in the upload (send multipart/form-data with one or more files)")
    for f in files:
        size = f.size if f.size is not None else 0
        if size > limit:
            raise HTTPException(413, f"{safe_display(f.filename)} is {size / 1e6:.1f} MB, over the limit of "
                                     f"{limit / 1e6:.0f} MB per file (setting serve.max_upload_mb)")
    return files


async def _stage(files: list, uploads: Path, staging: Path, limit: int) -> tuple[list[tuple[str, Path]], list[dict]]:
    """Each file written under its safe name to `staging` (a new folder of `uploads`):
    (the staged (name, path) pairs, the files refused with their reasons: a name that
    is not usable, or the same name twice). 413 for a file that turns out over `limit`."""
    staged: list[tuple[str, Path]] = []
    rejected: list[dict] = []
    names: set[str] = set()
    await run_in_threadpool(_prepare_dirs, uploads, staging)
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
    return staged, rejected


def _abandon(job: Job | None, staging: Path | None, exc: BaseException) -> None:
    """An upload refused or interrupted while staging: its staged files go, and its job
    (when there is one) is an error that says why."""
    if staging is not None:
        shutil.rmtree(staging, ignore_errors=True)
    if job is not None:  # refused before it started: the job says so too
        job.status, job.finished = "error", time.time()
        job.error = str(exc.detail) if isinstance(exc, HTTPException) else "the upload was interrupted"


def _start_ingest(web: WebState, job: Job, staged: list[tuple[str, Path]], rejected: list[dict], staging: Path):
    """The job's files (the rejected ones already done) and its ingest started: the task."""
    job.files = [{"file": r["file"], "status": "rejected", "error": r["error"]} for r in rejected]
    job.total = len(staged) + len(rejected)
    job.done = len(rejected)
    return web.start(job, lambda j: _ingest_uploads(web, j, staged, rejected, staging))


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
    lock, with the server Session's embedder). A file that fails to ingest is removed
    again, or the file it replaced is put back, so the store and its files stay as they were."""
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
                # the server's own embedder (a second model in the server would double its memory)
                embedder = web.serve.session.embedder.inner
                rep = ingest([t for _, t, _ in placed.values()], web.settings, wait_s=30.0, on_event=on_event,
                             embedder=embedder)
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
