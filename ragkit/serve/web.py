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

By job: the state, jobs and renderer (`web_state`), uploads (`web_uploads`), compare and
its exports (`web_compare`); this module holds the page's own routes (its files, the
document viewer, job status) and `register`, and re-exports the names of the others.
"""

from __future__ import annotations

from fastapi import APIRouter, FastAPI, HTTPException, Query, Request
from fastapi.responses import Response

from ragkit.errors import RagkitError
from ragkit.serve import web_compare, web_uploads
from ragkit.serve.web_compare import (  # noqa: F401
    CompareBody,
    _finished_comparison,
    builtin_checklists,
    checklists,
    compare,
    compare_docx,
    compare_html,
    compare_md,
)
from ragkit.serve.web_state import (  # noqa: F401
    CSP,
    DEFAULT_UPLOAD_MB,
    DOC_ID,
    JOB_ID,
    KINDS,
    MAX_QUOTE_CHARS,
    MAX_UPLOAD_FILES,
    PUBLIC_PATHS,
    RENDER_TIMEOUT_S,
    RENDERER,
    STATIC_DIR,
    STATIC_FILES,
    Job,
    Jobs,
    Renderer,
    WebState,
    _web,
    kind_of,
    upload_limit_of,
)
from ragkit.serve.web_uploads import (  # noqa: F401
    _CONTROL,
    UPLOAD_PATH,
    _ingest_uploads,
    _prepare_dirs,
    _refresh_state,
    _restore,
    _TooLarge,
    _write_new,
    safe_display,
    safe_name,
    upload,
    upload_request_cap,
)

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


# ---------------------------------------------------------------- registration

def register(app: FastAPI) -> None:
    """Add the page and its API to the server app (called by ragkit.serve.app.create_app)."""
    app.state.ragkit_web = WebState(app)
    app.include_router(router)
    app.include_router(web_uploads.router)
    app.include_router(web_compare.router)
