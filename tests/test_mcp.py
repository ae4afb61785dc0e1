"""`ragkit mcp` driven by the official MCP SDK's own client, as a desktop assistant or an
agent drives it: a real `ragkit mcp` subprocess over stdio (the SDK's stdio client) and
over streamable HTTP (the SDK's streamable HTTP client), on a store ingested from
corpora/nda, answering with the real default model.

One server process per transport (module-scoped); one `ask` and one `compare` with the
model. The network check runs a third server under strace for a real session.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import re
import subprocess
import threading
import time
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path
from typing import Any, Callable

import httpx
import pytest
from conftest import CORPORA
from serve_fixture import RAGKIT, SMALL, _stop, free_port
from test_network import _env, assert_traced_whole_process, offending_lines, strace  # noqa: F401  (strace: a fixture)

TOKEN = "mcp-test-token-51c2"
PDF = "cnli_dev_019.pdf"  # 2 pages; its governing law (Manitoba) is on page 2
GOVERNS = "Which law governs this agreement?"
START_TIMEOUT_S = 300.0
CALL_TIMEOUT_S = 900.0
TOOLS = {"documents": set(), "search": {"query", "docs", "max_tokens"}, "ask": {"question", "docs"},
         "compare": {"documents", "checklist", "items"}}


# ---------------------------------------------------------------------- a session in a thread


class McpSession:
    """An `mcp.Client` session held open in an event loop of its own thread, so that
    module-scoped fixtures can share it across tests; each call blocks for its result."""

    def __init__(self, transport: Callable[[], Any], *, mode: str = "auto", timeout: float = START_TIMEOUT_S):
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="mcp-client", daemon=True)
        self.thread.start()
        self.client = None
        self._ready: asyncio.Future = self.loop.create_future()
        self._stop = asyncio.Event()
        self._main = asyncio.run_coroutine_threadsafe(self._hold(transport, mode), self.loop)
        try:
            asyncio.run_coroutine_threadsafe(self._wait_ready(), self.loop).result(timeout)
        except BaseException:
            self.close()
            raise

    async def _wait_ready(self):
        return await self._ready

    async def _hold(self, transport, mode: str) -> None:
        from mcp import Client

        try:
            async with Client(transport(), mode=mode, read_timeout_seconds=CALL_TIMEOUT_S) as client:
                self.client = client
                self._ready.set_result(True)
                await self._stop.wait()
        except BaseException as exc:
            if not self._ready.done():
                self._ready.set_exception(exc)
            else:
                raise

    def run(self, coro, timeout: float = CALL_TIMEOUT_S):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def call(self, name: str, args: dict | None = None):
        return self.run(self.client.call_tool(name, args or {}))

    def close(self) -> None:
        if self.loop.is_running():
            self.loop.call_soon_threadsafe(self._stop.set)
            try:
                self._main.result(60)
            except Exception:
                pass
            self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


def stdio_transport(store: Path, log: Path, *, prefix: list[str] = (), env: dict | None = None):
    """The SDK's stdio client on `[*prefix, ragkit, mcp, --store STORE]` (the server's stderr to `log`)."""
    from mcp import StdioServerParameters
    from mcp.client.stdio import stdio_client

    cmd = [*prefix, *RAGKIT, "mcp", "--store", str(store)]
    # the SDK passes the server a minimal environment (HOME, PATH, USER...), as desktop
    # assistants do; ragkit's own settings and the cache location go along
    keep = {k: v for k, v in os.environ.items() if k.startswith(("RAGKIT_", "XDG_"))}
    params = StdioServerParameters(command=cmd[0], args=cmd[1:], env={**keep, **SMALL, **(env or {})},
                                   cwd=str(CORPORA.parents[1]))
    errlog = open(log, "w")
    return lambda: stdio_client(params, errlog=errlog)


def structured(result) -> dict:
    assert not result.is_error, result.content
    return result.structured_content


def error_text(result) -> str:
    assert result.is_error, result.structured_content
    return " ".join(c.text for c in result.content if getattr(c, "type", "") == "text")


def words(text: str) -> str:
    return " ".join(re.findall(r"[a-z0-9]+", text.lower()))


def share(text: str, other: str) -> float:
    """The share of `text`'s words that `other` has."""
    mine, theirs = words(text).split(), set(words(other).split())
    return sum(w in theirs for w in mine) / max(1, len(mine))


# ---------------------------------------------------------------------- stdio


@pytest.fixture(scope="module")
def stdio(nda_store, tmp_path_factory):
    log = tmp_path_factory.mktemp("mcp-stdio") / "server.err"
    # mode="legacy": the initialize handshake today's desktop assistants speak
    session = McpSession(stdio_transport(nda_store.store, log), mode="legacy")
    session.log = log
    yield session
    session.close()


@pytest.fixture(scope="module")
def listed(stdio) -> dict:
    return {d["name"]: d for d in structured(stdio.call("documents"))["documents"]}


def test_the_four_tools_and_their_arguments_are_listed(stdio):
    tools = {t.name: t for t in stdio.run(stdio.client.list_tools()).tools}
    assert set(tools) == set(TOOLS)
    for name, args in TOOLS.items():
        schema = tools[name].input_schema
        assert set(schema.get("properties", {})) == args, (name, schema)
        assert tools[name].description and tools[name].output_schema is not None
        assert tools[name].annotations.read_only_hint is True
    search = tools["search"].input_schema
    assert search["required"] == ["query"]
    assert search["properties"]["max_tokens"]["minimum"] == 256 and search["properties"]["max_tokens"]["maximum"] == 32000
    assert tools["compare"].input_schema["properties"]["documents"]["minItems"] == 2
    assert tools["compare"].input_schema["properties"]["checklist"]["default"] == "nda"
    assert stdio.client.server_info.name == "ragkit"


def test_documents_are_the_stores_with_ids_pages_and_sections(listed):
    assert sorted(listed) == sorted(p.name for p in CORPORA.iterdir())
    for name, d in listed.items():
        assert d["sha256"] == hashlib.sha256((CORPORA / name).read_bytes()).hexdigest()
        assert re.fullmatch(r"[0-9a-f]{24}", d["id"]) and d["uri"] == f"ragkit://doc/{d['id']}"
        assert all(s["path"] for s in d["sections"]), name
    assert listed[PDF]["kind"] == "pdf" and listed[PDF]["pages"] == 2
    md = CORPORA / "ai-osi-stack-mutual-nda.md"
    headings = [ln.lstrip("#").strip() for ln in md.read_text(encoding="utf-8").splitlines() if ln.startswith("## ")]
    paths = [s["path"] for s in listed[md.name]["sections"]]
    assert len(headings) == 15 and all(any(p.split(" > ")[1:2] == [h] for p in paths) for h in headings), paths
    assert any("Governing Law" in s["path"] and s["page"] == 2 for s in listed[PDF]["sections"]), listed[PDF]["sections"]
    assert listed["ai-osi-stack-mutual-nda.md"]["pages"] is None


def test_search_returns_passages_of_the_named_document_within_the_budget(stdio, listed):
    r = structured(stdio.call("search", {"query": GOVERNS, "docs": [PDF]}))
    assert r["documents"] == [PDF] and r["max_tokens"] == 4000 and r["relevant"] is True
    passages = r["passages"]
    assert passages and all(p["document"] == PDF and p["doc_id"] == listed[PDF]["id"] for p in passages)
    assert [p["rank"] for p in passages] == list(range(1, len(passages) + 1))
    law = [p for p in passages if "Manitoba" in p["text"]]
    assert law and law[0]["page"] == 2 and "Governing Law" in law[0]["section"], passages
    assert law[0]["uri"] == f"ragkit://doc/{listed[PDF]['id']}/page/2"
    assert r["total_tokens"] == sum(p["tokens"] for p in passages) <= 4000
    assert all(p["tokens"] > 0 for p in passages)
    # a small budget packs fewer tokens, still within it, still finding the clause
    small = structured(stdio.call("search", {"query": GOVERNS, "docs": [PDF], "max_tokens": 256}))
    assert 0 < small["total_tokens"] <= 256 and len(small["passages"]) <= len(passages)
    assert any("Manitoba" in p["text"] for p in small["passages"]), small
    # the whole store: passages of several documents, still within the budget
    every = structured(stdio.call("search", {"query": "How long do the confidentiality obligations survive?",
                                             "max_tokens": 2000}))
    assert len({p["document"] for p in every["passages"]}) >= 2 and every["total_tokens"] <= 2000


def test_ask_answers_with_citations_that_name_the_document_and_page(stdio, listed):
    r = structured(stdio.call("ask", {"question": GOVERNS, "docs": [PDF]}))
    assert r["outcome"] == "supported" and r["abstained"] is False and r["answer"].strip(), r
    cites = r["citations"]
    assert cites, r
    for c in cites:
        assert c["doc"] == PDF and c["doc_id"] == listed[PDF]["id"] and isinstance(c["page"], int)
        assert set(c) >= {"doc", "page", "section", "quote", "inferred"}
        assert c["uri"] == f"ragkit://doc/{c['doc_id']}/page/{c['page']}"
        # the quote is on the page the citation names (read back through the page resource)
        page = stdio.run(stdio.client.read_resource(c["uri"])).contents[0].text
        assert len(words(c["quote"]).split()) >= 5 and share(c["quote"], page) > 0.9, (c, page[:300])
    # `ragkit ask --json`'s shape: claims with their sentences and support, usage, contexts
    assert set(r) >= {"answer", "citations", "claims", "abstained", "abstain_reason", "usage", "timings", "contexts"}
    assert all({"text", "supported", "citations", "support"} <= set(c) for c in r["claims"])
    assert r["usage"]["completion_tokens"] > 0 and r["contexts"]


def test_a_question_the_documents_cannot_answer_is_not_supported_and_cites_nothing(stdio):
    r = structured(stdio.call("ask", {"question": "What is the capital of France?"}))
    assert r["outcome"] == "not_found" and r["abstained"] is True and r["abstain_reason"], r
    assert r["citations"] == [] and r["answer"] == "The documents do not say."


@pytest.mark.complete
def test_compare_two_ndas_on_two_items(stdio):
    docs = ["bonterms-mutual-nda-v1.pdf", "common-paper-mutual-nda-v1-standard-terms.md"]
    progress: list[tuple[float, float | None, str | None]] = []

    async def on_progress(done, total, message):
        progress.append((done, total, message))

    r = structured(stdio.run(stdio.client.call_tool("compare", {"documents": docs, "items": ["governing-law", "nda-12"]},
                                                    progress_callback=on_progress)))
    assert [(d, t) for d, t, _ in progress] == [(1, 4), (2, 4), (3, 4), (4, 4)], progress
    assert progress[0][2].startswith(docs[0] + ": ") and progress[-1][2].startswith(docs[1] + ": ")
    # `ragkit compare --json`'s object (Comparison.to_json())
    assert r["checklist"] == "nda" and r["docs"] == docs and set(r["cost"]) >= {"prefilled_tokens", "seconds"}
    assert sorted(row["id"] for row in r["rows"]) == ["governing-law", "nda-12"]  # in the checklist's order
    for row in r["rows"]:
        assert set(row["findings"]) == set(docs) and row["difference"]
        for d in docs:
            f = row["findings"][d]
            assert f["doc"] == d and f["label"], row
    labels = {row["findings"][d]["label"] for row in r["rows"] for d in docs}
    assert labels <= {"Found", "Yes", "No", "Not mentioned", "Uncertain"}, labels


def test_bad_arguments_are_tool_errors_and_the_server_goes_on(stdio):
    msg = error_text(stdio.call("search", {"query": GOVERNS, "max_tokens": 10}))
    assert "max_tokens" in msg and "256" in msg
    assert "max_tokens" in error_text(stdio.call("search", {"query": GOVERNS, "max_tokens": 100_000}))
    assert "the question is empty" in error_text(stdio.call("ask", {"question": "   "}))
    assert "the query is empty" in error_text(stdio.call("search", {"query": " \n "}))
    msg = error_text(stdio.call("compare", {"documents": ["bonterms-mutual-nda-v1.pdf", PDF], "items": ["no-such-item"]}))
    assert "no-such-item" in msg and "governing-law" in msg  # names the bad item and lists the good ones
    assert "checklist" in error_text(stdio.call("compare", {"documents": ["bonterms-mutual-nda-v1.pdf", PDF],
                                                            "checklist": "/etc/passwd"}))
    assert "at least 2" in error_text(stdio.call("compare", {"documents": [PDF]}))  # the schema: 2 or more
    assert "two different documents" in error_text(stdio.call("compare", {"documents": [PDF, PDF.removesuffix(".pdf")]}))
    assert "not by path" in error_text(stdio.call("search", {"query": GOVERNS, "docs": ["/etc/passwd"]}))
    # the server is still serving
    assert len(structured(stdio.call("documents"))["documents"]) == len(list(CORPORA.iterdir()))


def test_an_unknown_document_is_an_error_naming_it(stdio):
    for tool, args in (("search", {"query": GOVERNS}), ("ask", {"question": GOVERNS})):
        msg = error_text(stdio.call(tool, {**args, "docs": [PDF, "no-such-contract.pdf"]}))
        assert "no-such-contract.pdf" in msg and "unknown document" in msg and PDF in msg  # lists what there is


def test_page_resources_hold_the_text_of_that_page(stdio, listed):
    import pypdf
    from mcp import MCPError

    resources = stdio.run(stdio.client.list_resources()).resources
    by_name = {r.name: r for r in resources}
    assert sorted(by_name) == sorted(listed)  # one per document
    assert all(by_name[n].uri == listed[n]["uri"] for n in listed)
    templates = [t.uri_template for t in stdio.run(stdio.client.list_resource_templates()).resource_templates]
    assert "ragkit://doc/{doc_id}/page/{n}" in templates
    doc_id = listed[PDF]["id"]
    reader = pypdf.PdfReader(str(CORPORA / PDF))  # another PDF reader than ragkit's
    for n in (1, 2):
        got = stdio.run(stdio.client.read_resource(f"ragkit://doc/{doc_id}/page/{n}")).contents[0].text
        assert len(words(got).split()) > 50
        assert share(got, reader.pages[n - 1].extract_text()) > 0.9, (n, got[:300])
    page2 = stdio.run(stdio.client.read_resource(f"ragkit://doc/{doc_id}/page/2")).contents[0].text
    assert "Manitoba" in page2
    page1 = stdio.run(stdio.client.read_resource(f"ragkit://doc/{doc_id}/page/1")).contents[0].text
    assert "Manitoba" not in page1
    # the passage search found is on the page its uri names
    hit = next(p for p in structured(stdio.call("search", {"query": GOVERNS, "docs": [PDF]}))["passages"]
               if "Manitoba" in p["text"])
    assert hit["uri"].endswith("/page/2") and share(hit["text"], page2) > 0.95 > share(hit["text"], page1)
    whole = stdio.run(stdio.client.read_resource(listed[PDF]["uri"])).contents[0].text
    assert words(page1)[:200] in words(whole) and words(page2)[:200] in words(whole)
    md = listed["ai-osi-stack-mutual-nda.md"]
    md_text = stdio.run(stdio.client.read_resource(f"ragkit://doc/{md['id']}/page/1")).contents[0].text
    assert "three (3) years" in md_text  # a document without pages: page 1 is its stored text
    for uri, why in ((f"ragkit://doc/{doc_id}/page/3", "out of range"),
                     ("ragkit://doc/0123456789abcdef01234567/page/1", "no document with id"),
                     (f"ragkit://doc/{md['id']}/page/2", "without pages")):
        with pytest.raises(MCPError, match=why):
            stdio.run(stdio.client.read_resource(uri))
    assert structured(stdio.call("documents"))["documents"]  # still serving


def test_a_page_resource_reads_a_breakable_hyphen_as_ingest_does(tmp_path):
    """Page 7 of a real CUAD filing (ENERGOUS, copied to a one-page PDF with pypdf, its
    text layer unchanged): pdfium gives U+FFFE for the breakable hyphen of
    "non-transferable", which ingest stores as "-". The page resource
    (`RagkitTools.page_text`, what `ragkit://doc/{id}/page/{n}` returns, through the page
    renderer process) returned the U+FFFE; it reads the page with ingest's own function
    (ragkit.ingest.loaders.pdfium_text), so it holds the stored chunk's words."""
    import pypdf
    import pypdfium2 as pdfium
    from conftest import SHARED, make_settings

    from ragkit.ingest import ingest
    from ragkit.serve.mcp_tools import RagkitTools
    from ragkit.serve.server_state import ServeState

    src = next((SHARED / "cuad-10" / "pdf").glob("ENERGOUSCORP*"))
    pdf = tmp_path / "energous-page-7.pdf"
    writer = pypdf.PdfWriter()
    writer.add_page(pypdf.PdfReader(src).pages[6])
    writer.write(pdf)
    doc = pdfium.PdfDocument(str(pdf))
    try:
        assert "non\ufffetransferable" in doc[0].get_textpage().get_text_range()  # what pdfium gives
    finally:
        doc.close()
    settings = make_settings(tmp_path / "store")
    assert ingest([pdf], settings).failed == []
    tools = RagkitTools(ServeState(settings))
    (rec,) = tools.records()
    page = tools.page_text(rec.doc_id, 1)
    stored = " ".join(h.text for h in tools.state.store().chunks([rec.doc_id]))
    assert "\ufffe" not in page and "\ufffe" not in stored
    assert "non-transferable" in page.replace("\xa0", " ") and "non-transferable" in stored.replace("\xa0", " ")
    assert "non-transferable" in tools.document_text(rec.doc_id).replace("\xa0", " ")


# ---------------------------------------------------------------------- streamable HTTP


@contextmanager
def http_server(store: Path, log_dir: Path, *, token: str | None):
    port = free_port()
    cmd = [*RAGKIT, "mcp", "--http", "--port", str(port), "--store", str(store), "--json"]
    if token:
        cmd += ["--token", token]
    out, err = log_dir / "mcp-http.out", log_dir / "mcp-http.err"
    with open(out, "wb") as fo, open(err, "wb") as fe:
        proc = subprocess.Popen(cmd, stdout=fo, stderr=fe, cwd=CORPORA.parents[1],
                                env={**os.environ, **SMALL, "PYTHONUNBUFFERED": "1"})
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            assert proc.poll() is None, f"ragkit mcp --http exited {proc.returncode}: {err.read_text()[-3000:]}"
            try:
                if httpx.get(url + "/health", timeout=2, trust_env=False).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, f"no /health within {START_TIMEOUT_S} s: {err.read_text()[-3000:]}"
            time.sleep(0.25)
        ready = json.loads(next(x for x in out.read_text().splitlines() if x.startswith("{")))
        yield url, ready
    finally:
        _stop(proc)


@pytest.fixture(scope="module")
def http(nda_store, tmp_path_factory):
    with http_server(nda_store.store, tmp_path_factory.mktemp("mcp-http"), token=TOKEN) as (url, ready):
        yield url, ready


def _http_transport(url: str, token: str | None):
    import httpx2
    from mcp.client.streamable_http import streamable_http_client

    @asynccontextmanager
    async def transport():
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        async with httpx2.AsyncClient(headers=headers, timeout=CALL_TIMEOUT_S) as client:
            async with streamable_http_client(url + "/mcp", http_client=client) as streams:
                yield streams

    return transport


def test_http_lists_tools_and_documents_with_the_token(http):
    url, ready = http
    assert ready["mcp_url"] == url + "/mcp" and ready["token_required"] is True
    assert ready["documents"] == len(list(CORPORA.iterdir()))
    session = McpSession(_http_transport(url, TOKEN))
    try:
        assert {t.name for t in session.run(session.client.list_tools()).tools} == set(TOOLS)
        docs = structured(session.call("documents"))["documents"]
        assert sorted(d["name"] for d in docs) == sorted(p.name for p in CORPORA.iterdir())
        assert "unknown document" in error_text(session.call("search", {"query": GOVERNS, "docs": ["nope.pdf"]}))
    finally:
        session.close()


def test_http_refuses_a_missing_token_and_a_foreign_host(http):
    url, _ = http
    init = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "0"}}}
    headers = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}
    auth = {"Authorization": f"Bearer {TOKEN}"}
    ok = httpx.post(url + "/mcp", json=init, headers={**headers, **auth}, trust_env=False)
    assert ok.status_code == 200, ok.text  # the same request with the token and a loopback Host is served
    r = httpx.post(url + "/mcp", json=init, headers=headers, trust_env=False)
    assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
    r = httpx.post(url + "/mcp", json=init, headers={**headers, "Authorization": "Bearer wrong"}, trust_env=False)
    assert r.status_code == 401
    r = httpx.post(url + "/mcp", json=init, headers={**headers, **auth, "Host": "attacker.example:80"}, trust_env=False)
    assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_host"  # DNS rebinding
    r = httpx.post(url + "/mcp", json=init, headers={**headers, **auth, "Origin": "http://attacker.example"}, trust_env=False)
    assert r.status_code == 403
    assert httpx.get(url + "/health", trust_env=False).json()["status"] == "ok"  # no token needed
    with pytest.raises(Exception):  # the SDK's client without the token gets nowhere
        McpSession(_http_transport(url, None), timeout=60)


def test_a_public_bind_without_a_token_is_refused_before_loading(nda_store):
    res = subprocess.run([*RAGKIT, "mcp", "--http", "--host", "0.0.0.0", "--port", "0", "--store", str(nda_store.store)],
                         capture_output=True, text=True, timeout=120, env={**os.environ, **SMALL})
    assert res.returncode == 2 and "not a loopback address" in res.stderr and "token" in res.stderr
    assert "loading" not in res.stderr  # refused before any model loads
    res = subprocess.run([*RAGKIT, "mcp", "--token", "x", "--store", str(nda_store.store), "--json"],
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 2 and "--http" in json.loads(res.stdout)["error"]


# ---------------------------------------------------------------------- nothing leaves loopback


def test_a_stdio_session_under_strace_reaches_nothing_but_loopback(strace, nda_store, tmp_path):  # noqa: F811
    log = tmp_path / "mcp.strace"
    # the environment without ragkit's offline switches (ragkit must set them itself)
    session = McpSession(stdio_transport(nda_store.store, tmp_path / "server.err", prefix=[*strace, "-o", str(log)],
                                         env=_env()), mode="legacy")
    try:
        assert {t.name for t in session.run(session.client.list_tools()).tools} == set(TOOLS)
        r = structured(session.call("search", {"query": GOVERNS, "docs": [PDF], "max_tokens": 512}))
        assert any("Manitoba" in p["text"] for p in r["passages"])
    finally:
        session.close()
    trace = log.read_text(errors="replace")
    assert_traced_whole_process(trace, RAGKIT[0])
    assert offending_lines(trace) == []
