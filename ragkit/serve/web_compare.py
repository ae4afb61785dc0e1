"""Clause comparison from the web page (ragkit.serve.web re-exports it): the built-in
checklists, the compare job, and its HTML, Markdown and Word exports."""

from __future__ import annotations

import asyncio

from fastapi import APIRouter, HTTPException, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import HTMLResponse, JSONResponse, Response
from pydantic import BaseModel, Field

from ragkit.errors import RagkitError, UsageError
from ragkit.serve.web_state import Job, _web

router = APIRouter()


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
    serve = web.serve

    def work(j: Job) -> dict:
        from ragkit.compare import compare as run_compare

        def progress(doc: str, item: str) -> None:
            j.done += 1
            j.current = f"{doc}: {item}"

        with serve.generator_lock:  # never beside a chat answer: one model, one KV cache
            j.status = "running"
            result = run_compare(names, serve.session, body.checklist, items=[i.id for i in chosen], on_progress=progress)
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
    """The memo as a Word file (ragkit.compare.docx), written in memory: no path is read or written."""
    import io

    from ragkit.compare.docx import MEDIA_TYPE, to_docx

    job = _finished_comparison(request, job_id)
    buf = io.BytesIO()
    to_docx(job.comparison, buf)
    return Response(buf.getvalue(), media_type=MEDIA_TYPE, headers={
        "Content-Disposition": f'attachment; filename="ragkit-compare-{job.id[:8]}.docx"', "X-Content-Type-Options": "nosniff"})
