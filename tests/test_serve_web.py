"""The web page's API (ragkit.serve.web) on the real server app: `create_app` with a
real Chroma store ingested from corpora/nda, through FastAPI's TestClient. The page
renderer is the real one (a pdfium worker process); uploads go through the real ingest;
the comparison runs the real default model."""

from __future__ import annotations

import hashlib
import io
import json
import re
import shutil
import time
from pathlib import Path

import pypdfium2 as pdfium
import pytest
from conftest import CORPORA, make_settings
from fastapi.testclient import TestClient
from PIL import Image

BONTERMS = "bonterms-mutual-nda-v1.pdf"
CNLI_411 = "cnli_dev_411.pdf"
COMMON_MD = "common-paper-mutual-nda-v1-standard-terms.md"
GOOD_MD = (b"# Widget Supply Memo\n\n## 1. Scope\n\nThe vendor shall keep every widget blueprint confidential "
           b"for seven years after delivery, and shall return all blueprints on request.\n\n## 2. Law\n\n"
           b"This memo is governed by the laws of the State of Oregon.\n")


@pytest.fixture(scope="module")
def web_store(tmp_path_factory):
    """corpora/nda ingested into a store of this module's own (the tests upload into it)."""
    from ragkit.ingest import ingest

    corpus = tmp_path_factory.mktemp("web-corpus") / "nda"
    shutil.copytree(CORPORA, corpus)
    for p in corpus.iterdir():
        p.chmod(0o644)
    settings = make_settings(tmp_path_factory.mktemp("web-store") / "ragkit")
    report = ingest([corpus], settings)
    assert report.failed == [] and report.added == len(list(corpus.iterdir()))
    return settings, corpus


def make_client(settings, **kw) -> TestClient:
    from ragkit.serve.app import create_app

    # the server refuses a Host that is not loopback (DNS rebinding guard)
    return TestClient(create_app(settings, preload=False, **kw), base_url="http://127.0.0.1")


@pytest.fixture(scope="module")
def client(web_store):
    with make_client(web_store[0]) as c:
        yield c


def store_records(settings) -> list:
    from ragkit.embed import load_embedder
    from ragkit.store import open_store

    return open_store(settings, load_embedder(settings), create=False).documents()


def store_snapshot(settings) -> tuple:
    from ragkit.embed import load_embedder
    from ragkit.store import open_store

    st = open_store(settings, load_embedder(settings), create=False)
    return sorted((r.key, r.doc_id, r.n_chunks) for r in st.documents()), st.count()


def doc(client, name: str) -> dict:
    return next(d for d in client.get("/api/documents").json() if d["name"] == name)


def message(r) -> str:
    return r.json()["error"]["message"]


def upload(client, files: list[tuple[str, bytes]], wait: bool = True):
    return client.post("/api/upload" + ("?wait=true" if wait else ""),
                       files=[("files", (name, data, "application/octet-stream")) for name, data in files])


def citation_quote(settings, name: str, claim: str) -> tuple[str, int]:
    """A quote as ragkit's citations make it (best_quote over the stored chunk that
    answers the claim) and the page the citation names (the chunk's first page)."""
    from ragkit.answer.citations import best_quote, content_words
    from ragkit.embed import load_embedder
    from ragkit.store import open_store

    st = open_store(settings, load_embedder(settings), create=False)
    rec = next(r for r in st.documents() if r.name == name)
    want = content_words(claim)
    hit = max(st.chunks([rec.doc_id]), key=lambda h: len(content_words(h.text) & want))
    return best_quote(hit.text, claim), int(hit.meta["page_start"])


# ---------------------------------------------------------------- documents and pages

def test_documents_list_is_the_store(client, web_store):
    settings, corpus = web_store
    got = client.get("/api/documents").json()
    recs = store_records(settings)
    assert sorted(d["doc_id"] for d in got) == sorted(r.doc_id for r in recs)
    by_name = {d["name"]: d for d in got}
    assert set(by_name) == {p.name for p in corpus.iterdir()}
    assert by_name[BONTERMS]["kind"] == "pdf" and by_name[BONTERMS]["pages"] == 1
    assert by_name[CNLI_411]["pages"] == 2  # pages with text (the third is blank)
    assert by_name["cnli_dev_054.docx"]["kind"] == "docx" and by_name["cnli_dev_054.docx"]["pages"] is None
    assert by_name[COMMON_MD]["kind"] == "md"
    rec = next(r for r in recs if r.name == BONTERMS)
    assert by_name[BONTERMS]["sections"] == rec.n_sections > 3
    assert all(set(d) >= {"doc_id", "name", "pages", "sections", "kind"} for d in got)
    assert not any("path" in d or "key" in d for d in got)  # no server paths in the listing


def test_page_png_of_a_citation_page_with_highlight(client, web_store):
    from ragkit.serve.highlight import pdf_page_png

    settings, corpus = web_store
    quote, page = citation_quote(settings, BONTERMS, "The obligations survive for the Confidentiality Period")
    assert "survive" in quote and page == 1
    d = doc(client, BONTERMS)
    r = client.get(f"/api/documents/{d['doc_id']}/page/{page}.png", params={"quote": quote})
    assert r.status_code == 200 and r.headers["content-type"] == "image/png"
    assert r.headers["x-ragkit-page"] == "1" and r.headers["x-ragkit-match"] == "full"
    img = Image.open(io.BytesIO(r.content))
    assert img.format == "PNG" and img.size == (918, 1188)  # 612 x 792 pt at the default scale 1.5
    b = client.get(f"/api/documents/{d['doc_id']}/page/{page}/boxes", params={"quote": quote})
    assert b.status_code == 200
    box = b.json()
    assert (box["page"], box["requested_page"], box["pages"], box["match"]) == (1, 1, 1, "full")
    assert (box["width"], box["height"]) == img.size
    assert len(box["boxes"]) == 2
    for x0, y0, x1, y1 in box["boxes"]:
        assert 0 <= x0 < x1 <= box["width"] and 0 <= y0 < y1 <= box["height"]
    # the same boxes as the library gives on the file itself
    direct = pdf_page_png(corpus / BONTERMS, 1, quote, render=False)
    assert box["boxes"] == [[round(v, 1) for v in bx] for bx in direct.boxes]
    # the boxes are over the quote: the text in them is the quote's words
    tp = pdfium.PdfDocument(str(corpus / BONTERMS))[0].get_textpage()
    inside = " ".join(tp.get_text_bounded(x0 / 1.5, 792 - (y1 - (y1 - y0) / 3) / 1.5, x1 / 1.5,
                                          792 - (y0 + (y1 - y0) / 3) / 1.5) for x0, y0, x1, y1 in box["boxes"])
    assert re.findall(r"\w+", inside.lower()) == re.findall(r"\w+", quote.lower())
    # scale is honoured
    small = client.get(f"/api/documents/{d['doc_id']}/page/1/boxes", params={"quote": quote, "scale": 1.0}).json()
    assert (small["width"], small["height"]) == (612, 792)


def test_quote_on_the_next_page_is_shown_there(client, web_store):
    settings, _ = web_store
    d = doc(client, CNLI_411)
    q = "shall include information obtained by the Company from any third party"
    box = client.get(f"/api/documents/{d['doc_id']}/page/1/boxes", params={"quote": q}).json()
    assert (box["requested_page"], box["page"], box["match"]) == (1, 2, "full") and box["boxes"]
    r = client.get(f"/api/documents/{d['doc_id']}/page/1.png", params={"quote": q})
    assert r.headers["x-ragkit-page"] == "2"
    none = client.get(f"/api/documents/{d['doc_id']}/page/1/boxes", params={"quote": "not in this contract at all"}).json()
    assert none["boxes"] == [] and none["match"] == "none" and none["page"] == 1


def test_unknown_documents_and_pages_are_404(client):
    d = doc(client, BONTERMS)
    for path in (f"/api/documents/{'0' * 24}/page/1.png", f"/api/documents/{'0' * 24}/page/1/boxes",
                 f"/api/documents/{'0' * 24}/section?chunk=0",
                 f"/api/documents/{d['doc_id']}/page/2.png", f"/api/documents/{d['doc_id']}/page/0.png",
                 f"/api/documents/{d['doc_id']}/page/99/boxes", f"/api/documents/{d['doc_id']}/page/x.png",
                 f"/api/documents/{d['doc_id'].upper()}/page/1.png",
                 f"/api/documents/{doc(client, COMMON_MD)['doc_id']}/page/1.png",  # no pages in Markdown
                 f"/api/documents/{d['doc_id']}/section?chunk=9999", "/api/jobs/" + "a" * 32, "/api/jobs/nope"):
        r = client.get(path)
        assert r.status_code == 404, (path, r.status_code, r.text[:200])
    assert "out of range" in message(client.get(f"/api/documents/{d['doc_id']}/page/2.png"))
    assert client.get(f"/api/documents/{d['doc_id']}/page/1.png", params={"scale": 50}).status_code == 400


def test_section_of_a_text_document_marks_the_quote(client):
    d = doc(client, COMMON_MD)
    q = "use Confidential Information solely for the Purpose"
    r = client.get(f"/api/documents/{d['doc_id']}/section",
                   params={"section": "2. Use and Protection of Confidential Information", "quote": q})
    assert r.status_code == 200
    s = r.json()
    assert s["section"] == "2. Use and Protection of Confidential Information" and s["found"] is True
    assert re.search(r"<mark>use Confidential Information solely for the Purpose</mark>", s["html"])
    assert "Receiving Party" in s["html"]
    # by chunk index, and with the quote in another section: that section is shown
    s2 = client.get(f"/api/documents/{d['doc_id']}/section", params={"chunk": 0, "quote": q}).json()
    assert s2["section"] == s["section"] and s2["found"]
    s3 = client.get(f"/api/documents/{d['doc_id']}/section", params={"chunk": 0}).json()
    assert s3["chunk"] == 0 and "<mark>" not in s3["html"]


def test_section_html_escapes_document_text(client, web_store):
    settings, _ = web_store
    # plain text keeps markup as text (the Markdown loader drops inline HTML)
    r = upload(client, [("scripted.txt", b"1. Terms\n\nThe <script>alert('x')</script> party shall "
                                         b"keep the <b>secret</b> recipe confidential for ten years.\n")])
    assert r.status_code == 200 and r.json()["result"]["added"] == 1, r.text
    d = doc(client, "scripted.txt")
    assert d["kind"] == "txt"
    s = client.get(f"/api/documents/{d['doc_id']}/section", params={"chunk": 0, "quote": "the secret recipe"}).json()
    assert "<script>" not in s["html"] and "&lt;script&gt;" in s["html"]
    assert "<b>" not in s["html"]
    assert re.sub(r"</?mark>", "", s["html"]).count("<") == 0  # only the <mark> is markup


# ---------------------------------------------------------------- nothing but the store's files

def test_traversal_never_serves_a_file(client, web_store, tmp_path):
    settings, corpus = web_store
    secret = tmp_path / "secret.pdf"
    secret.write_bytes((corpus / CNLI_411).read_bytes() + b"\n%outside the store\n")  # a PDF the store does not hold
    web_src = (Path(__file__).resolve().parents[1] / "ragkit" / "serve" / "web.py").read_text()
    rec = next(r for r in store_records(settings) if r.name == BONTERMS)
    from ragkit.ingest.pipeline import doc_id_for

    attempts = [
        "/static/../web.py", "/static/..%2fweb.py", "/static/%2e%2e%2fweb.py", "/static/%2e%2e/%2e%2e/etc/passwd",
        "/static/%2fetc%2fpasswd", "/static//etc/passwd", "/static/web.py", "/static/highlight.py",
        "/static/app.js%00.py", "/static/.%2e/web.py", "/static/APP.JS", "/static/index.html/..",
        "/api/documents/..%2f..%2f..%2fetc%2fpasswd/page/1.png",
        "/api/documents/%2e%2e%2f%2e%2e%2fetc%2fpasswd/page/1/boxes",
        f"/api/documents/{rec.path.replace('/', '%2f')}/page/1.png",  # a doc id that is a stored file's path
        f"/api/documents/{secret}/page/1.png", f"/api/documents/{secret.as_posix().replace('/', '%2F')}/page/1/boxes",
        f"/api/documents/{doc_id_for(hashlib.sha256(secret.read_bytes()).hexdigest())}/page/1.png",  # its id form
        f"/api/documents/{rec.doc_id}%2f..%2f..%2fetc%2fpasswd/page/1.png",
        f"/api/documents/{rec.doc_id}/section?section=..%2f..%2fetc%2fpasswd",
        "/api/compare/..%2f..%2fetc%2fpasswd.html", "/api/jobs/..%2f..%2fetc%2fpasswd",
    ]
    secret_bytes = secret.read_bytes()
    for path in attempts:
        r = client.get(path)
        assert r.status_code in (404, 400), (path, r.status_code)
        assert b"root:" not in r.content and secret_bytes[:200] not in r.content
        assert "def register" not in r.text and web_src[:200] not in r.text


def test_symlink_planted_in_uploads_is_never_served_or_followed(client, web_store, tmp_path):
    settings, corpus = web_store
    uploads = Path(settings.store) / "uploads"
    uploads.mkdir(parents=True, exist_ok=True)
    outside = tmp_path / "outside.md"
    outside.write_text("# Private\n\nroot:x:0:0 the private notes of the server host.\n")
    before = outside.read_bytes()
    link = uploads / "planted.md"
    link.symlink_to(outside)
    secret_pdf = tmp_path / "outside.pdf"
    secret_pdf.write_bytes((corpus / CNLI_411).read_bytes() + b"\n%not in the store\n")
    (uploads / "planted.pdf").symlink_to(secret_pdf)
    try:
        names = {d["name"] for d in client.get("/api/documents").json()}
        assert "planted.md" not in names and "planted.pdf" not in names
        # what the links point at has no record, so no id of theirs serves anything
        from ragkit.ingest.pipeline import doc_id_for

        for target in (outside, secret_pdf):
            out_id = doc_id_for(hashlib.sha256(target.read_bytes()).hexdigest())
            assert client.get(f"/api/documents/{out_id}/section?chunk=0").status_code == 404
            assert client.get(f"/api/documents/{out_id}/page/1.png").status_code == 404
        # a link planted as the staging folder is replaced, not written through
        incoming = uploads / ".incoming"
        shutil.rmtree(incoming, ignore_errors=True)
        elsewhere = tmp_path / "elsewhere"
        elsewhere.mkdir()
        incoming.symlink_to(elsewhere, target_is_directory=True)
        # an upload with the link's name replaces the link; the target is untouched
        r = upload(client, [("planted.md", GOOD_MD)])
        assert not incoming.is_symlink() and list(elsewhere.iterdir()) == []
        assert r.status_code == 200 and r.json()["status"] == "done", r.text
        assert outside.read_bytes() == before
        assert not link.is_symlink() and link.read_bytes() == GOOD_MD
        d = doc(client, "planted.md")
        s = client.get(f"/api/documents/{d['doc_id']}/section", params={"chunk": 0}).json()
        assert "root:x" not in s["html"] and "widget blueprint" in json.dumps(s)
    finally:
        (uploads / "planted.pdf").unlink(missing_ok=True)


def test_changed_or_missing_file_is_409_or_410(client, web_store):
    settings, corpus = web_store
    pdf = (corpus / CNLI_411).read_bytes() + b"\n%a comment: another content, so another document id\n"
    r = upload(client, [("moving.pdf", pdf)])
    assert r.status_code == 200 and r.json()["result"]["added"] == 1, r.text
    d = doc(client, "moving.pdf")
    url = f"/api/documents/{d['doc_id']}/page/1.png"
    assert client.get(url).status_code == 200
    target = Path(settings.store) / "uploads" / "moving.pdf"
    target.write_bytes((corpus / BONTERMS).read_bytes())  # replaced behind the store's back
    r = client.get(url)
    assert r.status_code == 409 and "changed since it was ingested" in message(r)
    target.unlink()
    target.symlink_to(corpus / BONTERMS)  # a link to another stored file: still not this record's content
    assert client.get(url).status_code == 409
    target.unlink()
    r = client.get(url)
    assert r.status_code == 410 and "gone" in message(r)
    assert client.get(f"/api/documents/{d['doc_id']}/page/1/boxes").status_code == 410


def test_static_files_are_an_allowlist(client):
    for name, ctype in (("app.js", "javascript"), ("app.css", "text/css"), ("index.html", "text/html")):
        r = client.get(f"/static/{name}")
        assert r.status_code == 200 and ctype in r.headers["content-type"] and r.headers["x-content-type-options"] == "nosniff"
    page = client.get("/")
    assert page.status_code == 200 and "text/html" in page.headers["content-type"]
    csp = page.headers["content-security-policy"]
    assert "default-src 'none'" in csp and "script-src 'self'" in csp and "connect-src 'self'" in csp
    # the page loads nothing from another origin
    assert not re.search(r"""(src|href)\s*=\s*["'](https?:)?//""", page.text)
    assert not re.search(r"https?://", client.get("/static/app.js").text)
    assert re.findall(r'(?:src|href)="(/static/[^"]+)"', page.text) == ["/static/app.css", "/static/app.js"]
    for bad in ("/static/", "/static/app.py", "/static/.htaccess", "/static/index.htm", "/static/app.js.map"):
        assert client.get(bad).status_code == 404, bad


def test_token_covers_the_web_routes(web_store):
    settings, _ = web_store
    with make_client(settings, token="s3cret-web") as c:
        d_id = store_records(settings)[0].doc_id
        for path in ("/api/documents", f"/api/documents/{d_id}/page/1/boxes", "/api/checklists", "/api/jobs/" + "a" * 32):
            assert c.get(path).status_code == 401, path
        assert c.post("/api/upload", files=[("files", ("x.md", GOOD_MD))]).status_code == 401
        ok = c.get("/api/documents", headers={"Authorization": "Bearer s3cret-web"})
        assert ok.status_code == 200 and len(ok.json()) >= 7


# ---------------------------------------------------------------- uploads

def test_upload_good_markdown_is_ingested(client, web_store):
    settings, _ = web_store
    r = upload(client, [("widget-memo.md", GOOD_MD)], wait=False)
    assert r.status_code == 202
    job = r.json()
    assert job["kind"] == "upload" and job["total"] == 1 and job["status"] in ("queued", "running", "done")
    deadline = time.monotonic() + 120
    while job["status"] not in ("done", "error"):
        assert time.monotonic() < deadline, job
        # the server answers while the ingest runs in its worker thread
        assert client.get("/api/documents").status_code == 200
        time.sleep(0.2)
        job = client.get(f"/api/jobs/{job['id']}").json()
    assert job["status"] == "done", job
    assert job["done"] == job["total"] == 1
    assert job["result"]["added"] == 1 and job["result"]["failed"] == []
    assert job["files"] == [{"file": "widget-memo.md", "status": "added", "chunks": job["files"][0]["chunks"]}]
    d = doc(client, "widget-memo.md")
    assert d["kind"] == "md" and d["sections"] >= 2
    rec = next(x for x in store_records(settings) if x.name == "widget-memo.md")
    assert Path(rec.path) == (Path(settings.store) / "uploads" / "widget-memo.md").absolute()
    assert Path(rec.path).read_bytes() == GOOD_MD
    # the same file again: unchanged
    again = upload(client, [("widget-memo.md", GOOD_MD)]).json()
    assert again["result"]["unchanged"] == 1 and again["result"]["added"] == 0
    assert not list((Path(settings.store) / "uploads" / ".incoming").iterdir())  # staging cleaned up


def test_upload_corrupt_pdf_is_an_error_and_the_store_is_unchanged(client, web_store):
    settings, corpus = web_store
    before = store_snapshot(settings)
    data = (corpus / BONTERMS).read_bytes()
    r = upload(client, [("broken.pdf", data[: len(data) // 3]), ("notes.xyz", b"some text")])
    assert r.status_code == 200, r.text
    job = r.json()
    assert job["status"] == "done"
    failed = {f["file"]: f["error"] for f in job["result"]["failed"]}
    assert set(failed) == {"broken.pdf", "notes.xyz"}
    assert "PDF" in failed["broken.pdf"] and ("corrupt" in failed["broken.pdf"] or "truncated" in failed["broken.pdf"])
    assert "unsupported file type .xyz" in failed["notes.xyz"]
    assert {f["file"]: f["status"] for f in job["files"]} == {"broken.pdf": "failed", "notes.xyz": "rejected"}
    assert job["result"]["added"] == 0
    assert store_snapshot(settings) == before
    assert not (Path(settings.store) / "uploads" / "broken.pdf").exists()
    assert not (Path(settings.store) / "uploads" / "notes.xyz").exists()


def test_failed_reupload_puts_the_previous_file_back(client, web_store):
    settings, _ = web_store
    r = upload(client, [("keeper.md", GOOD_MD)])
    assert r.json()["result"]["added"] == 1
    before = store_snapshot(settings)
    bad = upload(client, [("keeper.md", b"\xff\xfe\x00bad" + bytes(range(256)) * 4)]).json()  # binary, not text
    assert [f["file"] for f in bad["result"]["failed"]] == ["keeper.md"]
    assert store_snapshot(settings) == before
    assert (Path(settings.store) / "uploads" / "keeper.md").read_bytes() == GOOD_MD


def test_upload_name_clash_with_a_stored_document_is_refused(client, web_store):
    settings, corpus = web_store
    before = store_snapshot(settings)
    job = upload(client, [(BONTERMS, (corpus / CNLI_411).read_bytes())]).json()
    assert job["result"]["added"] == 0 and "already in the store" in job["result"]["failed"][0]["error"]
    assert store_snapshot(settings) == before


def test_an_upload_is_embedded_by_the_servers_own_embedder(client, monkeypatch):
    """The server holds one embedder (its Session's): an upload's ingest embeds with it and
    loads no second model (counted through the real loader)."""
    import ragkit.embed.factory as embed_factory

    inner = client.app.state.ragkit.session.embedder.inner  # the server's, loaded once
    real_make, real_embed = embed_factory._make, inner.embed_documents
    loaded: list = []
    embedded: list[int] = []

    def counting_embed(texts, *args, **kwargs):
        embedded.append(len(texts))
        return real_embed(texts, *args, **kwargs)

    monkeypatch.setattr(embed_factory, "_make", lambda settings: loaded.append(settings) or real_make(settings))
    monkeypatch.setattr(inner, "embed_documents", counting_embed)  # an instance attribute over the real method
    job = upload(client, [("one-embedder.md", GOOD_MD.replace(b"Oregon", b"Vermont"))]).json()
    assert job["status"] == "done" and job["result"]["added"] == 1, job
    assert loaded == [] and sum(embedded) >= 1


def test_upload_too_large_is_413(web_store):
    settings, _ = web_store
    small = settings.model_copy(update={"serve": settings.serve.model_copy(update={"max_upload_mb": 1})})
    before = store_snapshot(settings)
    with make_client(small) as c:
        r = upload(c, [("big.txt", b"confidential " * 120_000)])  # 1.5 MB: over the 1 MB per file
        assert r.status_code == 413 and "over the limit" in message(r)
        r = upload(c, [("huge.txt", b"x" * (3 * 1024 * 1024))])  # over the whole request's limit
        assert r.status_code == 413
        ok = upload(c, [("tiny.txt", b"The tiny supplier keeps the formula confidential for two years.\n")])
        assert ok.status_code == 200 and ok.json()["result"]["added"] == 1
    uploads = Path(settings.store) / "uploads"
    assert not (uploads / "big.txt").exists() and not (uploads / "huge.txt").exists()
    assert store_snapshot(settings)[1] > before[1]  # only tiny.txt went in
    assert not {"big.txt", "huge.txt"} & {r.name for r in store_records(settings)}


def test_an_upload_of_several_files_under_the_limit_reaches_the_route(web_store):
    """Store item 6: the app's guard applied its general body limit (max_upload_mb + 1 MB) to
    the upload route too, so three files of 0.9 MB each (each under a 1 MB serve.max_upload_mb)
    were refused as one oversized request before the route's own limits (per file, and a few
    files per request) could apply. Now the route's own cap is the guard's for that path."""
    settings, _ = web_store
    small = settings.model_copy(update={"serve": settings.serve.model_copy(update={"max_upload_mb": 1})})
    before = store_snapshot(settings)
    junk = b"%PDF-1.4\n" + b"0" * 900_000  # not a readable PDF: ingest refuses each file by name, quickly
    with make_client(small) as c:
        r = upload(c, [(f"part-{i}.pdf", junk) for i in range(3)])
        assert r.status_code == 200, (r.status_code, r.text[:300])
        failed = {f["file"]: f["error"] for f in r.json()["result"]["failed"]}
        assert set(failed) == {"part-0.pdf", "part-1.pdf", "part-2.pdf"} and "limit" not in " ".join(failed.values())
        # a request over the route's own cap is still refused
        r = upload(c, [(f"big-{i}.pdf", junk) for i in range(6)])
        assert r.status_code == 413 and "over the limit of 5242880 bytes" in message(r)
    assert store_snapshot(settings) == before


def test_upload_names_are_sanitised(client, web_store, tmp_path):
    settings, _ = web_store
    uploads = (Path(settings.store) / "uploads").absolute()
    escape = Path(settings.store).parent.parent / "etc"
    r = upload(client, [("../../etc/passwd.md", GOOD_MD.replace(b"Oregon", b"Nevada"))])
    assert r.status_code == 200, r.text
    job = r.json()
    assert job["files"][0]["file"] == "passwd.md" and job["result"]["added"] == 1
    rec = next(x for x in store_records(settings) if x.name == "passwd.md")
    assert Path(rec.path).parent == uploads
    assert not (escape / "passwd.md").exists() and not Path("/etc/passwd.md").exists()
    cases = [("..\\..\\win\\evil.md", "evil.md"), (".hidden.md", "hidden.md"), ("a\x01b\x1fc\u202e\x7f.md", "abc.md"),
             ("  spaced   name .md", "spaced name .md"), ("..%2f..%2fpct.md", "%2f..%2fpct.md")]
    # a multipart body written by hand: clients escape control characters in file names
    # (httpx as %XX), a hostile one need not
    boundary = "ragkitboundary7"
    body = b""
    for raw, _ in cases:
        body += (f"--{boundary}\r\nContent-Disposition: form-data; name=\"files\"; filename=\"{raw}\"\r\n"
                 "Content-Type: text/markdown\r\n\r\n").encode("utf-8") + GOOD_MD + raw.encode("unicode_escape") + b"\r\n"
    body += f"--{boundary}--\r\n".encode()
    r = client.post("/api/upload?wait=true", content=body,
                    headers={"Content-Type": f"multipart/form-data; boundary={boundary}"})
    assert r.status_code == 200, r.text
    job = r.json()
    assert [f["file"] for f in job["files"]] == [want for _, want in cases], job
    assert job["result"]["added"] == len(cases)
    for _, want in cases:
        assert (uploads / want).is_file()
    assert {p.name for p in uploads.iterdir()} <= {
        "passwd.md", "evil.md", "hidden.md", "abc.md", "spaced name .md", "%2f..%2fpct.md", ".incoming", "widget-memo.md",
        "scripted.txt", "planted.md", "keeper.md", "tiny.txt", "moving.pdf", "one-embedder.md"}
    bad = upload(client, [("..", GOOD_MD), ("", GOOD_MD), ("/", GOOD_MD), ("evil.exe", b"MZ")]).json()
    assert bad["result"]["added"] == 0 and len(bad["result"]["failed"]) >= 3


def test_safe_name_rules():
    from ragkit.errors import UsageError
    from ragkit.serve.web import safe_name

    assert safe_name("../../etc/passwd.md") == "passwd.md"
    assert safe_name("C:\\Users\\me\\Contract v2.PDF") == "Contract v2.PDF"
    assert safe_name("...md.md") == "md.md"
    assert safe_name("x" * 300 + ".pdf").endswith(".pdf") and len(safe_name("x" * 300 + ".pdf")) == 150
    for bad in ("..", ".", "", None, "a/..", "noext", "x.exe", ".md", "\x00.md"):
        with pytest.raises(UsageError):
            safe_name(bad)


# ---------------------------------------------------------------- compare

def test_compare_job_and_exports(client):
    body = {"docs": [BONTERMS, COMMON_MD], "checklist": "nda", "items": ["nda-19"]}
    r = client.post("/api/compare?wait=true", json=body)
    assert r.status_code == 200, r.text
    job = r.json()
    assert job["status"] == "done" and job["done"] == job["total"] == 2
    res = job["result"]
    assert res["docs"] == [BONTERMS, COMMON_MD] and [row["id"] for row in res["rows"]] == ["nda-19"]
    f = res["rows"][0]["findings"][BONTERMS]
    assert f["label"] in ("Yes", "No", "Not mentioned") and f["confidence"] is None  # compare.no_min_confidence unset
    assert "survive" in f["quote"] and f["page"] == 1
    html = client.get(f"/api/compare/{job['id']}.html")
    assert html.status_code == 200 and "<table>" in html.text and BONTERMS in html.text
    assert "attachment" in html.headers["content-disposition"]
    # the export is for a reader elsewhere: the quote is there, the server's files are not
    settings = client.app.state.ragkit.settings
    assert "survive" in html.text and "<blockquote>" in html.text
    assert "file://" not in html.text and "href=" not in html.text
    assert str(Path(settings.store).resolve()) not in html.text and str(CORPORA.resolve()) not in html.text
    md = client.get(f"/api/compare/{job['id']}.md")
    assert md.status_code == 200 and md.text.startswith("# Clause comparison (nda)")
    assert "| Survival of obligations |" in md.text
    # the quote of the PDF finding opens at its page with a highlight
    d = doc(client, BONTERMS)
    box = client.get(f"/api/documents/{d['doc_id']}/page/{f['page']}/boxes", params={"quote": f["quote"]}).json()
    assert box["match"] == "full" and box["boxes"]


def test_compare_refuses_paths_and_unknowns(client, web_store):
    settings, corpus = web_store
    for body, word in (
        ({"docs": [BONTERMS], "checklist": "../../etc/passwd"}, "unknown checklist"),
        ({"docs": [BONTERMS], "checklist": str(Path("prompts/checklists/nda.toml").resolve())}, "unknown checklist"),
        ({"docs": [BONTERMS], "checklist": "nda", "items": ["nda-999"]}, "unknown checklist item"),
        ({"docs": [str(corpus / BONTERMS)], "checklist": "nda", "items": ["nda-19"]}, "not by path"),
        ({"docs": ["no-such.pdf"], "checklist": "nda", "items": ["nda-19"]}, "no ingested document"),
        ({"docs": [], "checklist": "nda"}, "docs"),
    ):
        r = client.post("/api/compare", json=body)
        assert r.status_code == 400, (body, r.text)
        assert word in message(r), (word, message(r))
    assert client.get(f"/api/compare/{'b' * 32}.html").status_code == 404
    up = upload(client, [("cmp-note.md", GOOD_MD)]).json()
    assert client.get(f"/api/compare/{up['id']}.md").status_code == 404  # an upload job is no comparison


def test_checklists_list_the_builtin_ones(client):
    lists = client.get("/api/checklists").json()
    nda = next(c for c in lists if c["name"] == "nda")
    ids = [i["id"] for i in nda["items"]]
    assert "nda-19" in ids and "term" in ids
    assert {i["kind"] for i in nda["items"]} == {"yes/no", "text"}
