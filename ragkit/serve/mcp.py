"""`ragkit mcp`: ragkit as a Model Context Protocol server, for desktop assistants and
agent tools (Claude Desktop, LM Studio, Cursor, Zed, a firm's own agent), built on the
official `mcp` SDK (2.x: `mcp.server.MCPServer`).

    from ragkit.serve.mcp import build_server, http_app
    state = ServeState(settings); state.load()
    server = build_server(RagkitTools(state))
    anyio.run(server.run_stdio_async)              # stdio
    app = http_app(server, state, host=..., token=...)   # streamable HTTP, behind ragkit serve's Guard

Tools (typed input schemas, structured output; the work is `ragkit.serve.mcp_tools`):
`documents`, `search` (retrieval only, within a token budget the caller gives), `ask`
(`ragkit ask --json`'s object plus `outcome`), `compare` (`ragkit compare --json`'s
object). A bad argument is a tool error (`isError`) with a message; the server goes on.

Resources: one per document, `ragkit://doc/{doc_id}` (its whole text), and the template
`ragkit://doc/{doc_id}/page/{n}` (one page's text), read from the store's records only.

Over HTTP the app sits behind `ragkit.serve.guard.Guard`, the one `ragkit serve` uses:
loopback Host names only on a loopback bind (DNS rebinding), no cross-origin browser
requests, the bearer token on everything but GET /health, the body size limit. The SDK's
own Host/Origin check is left off, so the rules are exactly serve's.
"""

from contextlib import contextmanager
from typing import Annotated, Any

import anyio
import anyio.from_thread
import anyio.to_thread
from mcp.server import MCPServer
from mcp.server.mcpserver import Context
from mcp.server.mcpserver.exceptions import ResourceError, ResourceNotFoundError, ToolError
from mcp_types import Resource as MCPResource
from mcp_types import ToolAnnotations
from pydantic import Field

from ragkit.errors import RagkitError
from ragkit.serve.mcp_tools import (
    DEFAULT_BUDGET,
    DOC_URI,
    MAX_BUDGET,
    MAX_QUERY_CHARS,
    MIN_BUDGET,
    PAGE_URI,
    Documents,
    NotFound,
    RagkitTools,
    SearchResult,
    doc_uri,
)

MCP_PATH = "/mcp"
DEFAULT_HTTP_PORT = 8765  # not serve's 8000: both can run side by side

INSTRUCTIONS = (
    "ragkit answers from the user's own ingested documents (contracts, filings), offline. "
    "Call `documents` to see what is in the store. `search` returns ranked passages (document, page, section, "
    "text) within a token budget, for you to read and cite; `ask` has ragkit's local model answer with checked "
    "citations (`outcome` says whether the answer is supported or the documents do not say); `compare` walks a "
    "clause checklist (default `nda`) over two or more contracts. Name documents by file name or id. "
    "Page text is in the resources ragkit://doc/{doc_id}/page/{n}."
)

DocsArg = Annotated[
    list[str] | None,
    Field(description="restrict to these documents: file names, names without extension, or document ids "
                      "(the `documents` tool lists them); default: the whole store"),
]
READ_ONLY = ToolAnnotations(read_only_hint=True, destructive_hint=False, idempotent_hint=True, open_world_hint=False)


@contextmanager
def tool_errors():
    """A ragkit error (bad argument, unknown document, store or model trouble) becomes a
    tool error with its message; anything else stays a crash (logged, generic message)."""
    try:
        yield
    except RagkitError as exc:
        raise ToolError(str(exc)) from None


@contextmanager
def resource_errors():
    try:
        yield
    except NotFound as exc:
        raise ResourceNotFoundError(str(exc)) from None
    except RagkitError as exc:
        raise ResourceError(str(exc)) from None


class RagkitMCP(MCPServer):
    """An MCPServer whose resource list is the store's documents, read when listed (a
    document ingested while the server runs is listed too)."""

    def __init__(self, tools: RagkitTools, **kwargs: Any):
        super().__init__(**kwargs)
        self.ragkit = tools

    async def list_resources(self) -> list[MCPResource]:
        listed = await super().list_resources()
        try:
            records = await anyio.to_thread.run_sync(self.ragkit.records)
        except RagkitError:
            records = []
        seen: set[str] = set()
        for r in records:
            if r.doc_id in seen:  # one content ingested under two paths: one resource
                continue
            seen.add(r.doc_id)
            pages = f", {r.n_pages} pages" if r.n_pages else ""
            listed.append(MCPResource(uri=doc_uri(r.doc_id), name=r.name, title=r.name, mime_type="text/plain",
                                      description=f"{r.name}: the whole text{pages} (sha256 {r.sha256[:12]}…); "
                                                  f"one page: ragkit://doc/{r.doc_id}/page/N"))
        return listed


def build_server(tools: RagkitTools) -> RagkitMCP:
    """The MCP server over loaded ragkit tools: four tools, the document resources."""
    from ragkit import __version__

    server = RagkitMCP(tools, name="ragkit", title="ragkit", version=__version__, instructions=INSTRUCTIONS,
                       log_level="WARNING")

    @server.tool(title="List the documents", annotations=READ_ONLY)
    def documents() -> Documents:
        """The ingested documents: id, file name, sha256, kind, page count, and their section paths (with the page
        each starts on)."""
        with tool_errors():
            return tools.documents()

    @server.tool(title="Search the documents", annotations=READ_ONLY)
    def search(
        query: Annotated[str, Field(min_length=1, max_length=MAX_QUERY_CHARS, description="what to look for: a question or keywords")],
        docs: DocsArg = None,
        max_tokens: Annotated[int, Field(ge=MIN_BUDGET, le=MAX_BUDGET,
                                         description=f"token budget for the passages returned ({MIN_BUDGET}-{MAX_BUDGET})")] = DEFAULT_BUDGET,
    ) -> SearchResult:
        """Ranked passages (document, page, section, text) for a query, packed within `max_tokens`: hybrid
        retrieval only, nothing generated. `relevant` is false when nothing in the documents is about the query."""
        with tool_errors():
            return tools.search(query, docs, max_tokens)

    @server.tool(title="Ask the documents", annotations=READ_ONLY)
    def ask(
        question: Annotated[str, Field(min_length=1, max_length=MAX_QUERY_CHARS, description="the question")],
        docs: DocsArg = None,
    ) -> dict[str, Any]:
        """Answer a question from the documents with ragkit's local model: `answer`, `outcome` ("supported", or
        "not_found" when the documents do not say), `citations` (doc, page, section, quote, inferred), `claims`
        (each sentence of the answer with the source sentence that supports it), `abstained`, `abstain_reason`.
        One answer at a time; it can take a minute."""
        with tool_errors():
            return tools.ask(question, docs)

    @server.tool(title="Compare contracts on a checklist", annotations=READ_ONLY)
    async def compare(
        documents: Annotated[list[str], Field(min_length=2, max_length=8, description="two or more documents (file names or ids)")],
        ctx: Context,
        checklist: Annotated[str, Field(max_length=100, description="a built-in checklist: nda")] = "nda",
        items: Annotated[list[str] | None, Field(max_length=100, description="checklist item ids, e.g. term, governing-law, "
                                                                            "nda-12; default: every item (slow)")] = None,
    ) -> dict[str, Any]:
        """A clause checklist over two or more contracts: per item and document a label, the quoted clause with
        page and section, and the difference between the documents (the JSON `ragkit compare --json` prints).
        Takes a few seconds per item and document; progress is reported."""

        def report(done: int, total: int, message: str) -> None:
            try:
                anyio.from_thread.run(ctx.report_progress, done, total, message)
            except Exception:  # progress is best effort: the comparison goes on
                pass

        def work() -> dict[str, Any]:
            with tool_errors():
                return tools.compare(documents, checklist, items, on_progress=report)

        return await anyio.to_thread.run_sync(work)

    @server.resource(PAGE_URI, name="page", title="A page of a document", mime_type="text/plain",
                     description="The text of page n of a document (a PDF's text layer, read from the ingested file "
                                 "while it is unchanged); a document without pages has page 1, its whole text.")
    def page(doc_id: str, n: str) -> str:
        with resource_errors():
            return tools.page_text(doc_id, n)

    @server.resource(DOC_URI, name="document", title="A document's whole text", mime_type="text/plain",
                     description="The whole text of a document, page by page.")
    def document(doc_id: str) -> str:
        with resource_errors():
            return tools.document_text(doc_id)

    return server


def http_app(server: RagkitMCP, state, *, host: str, token: str | None):
    """The streamable HTTP app (at /mcp, and GET /health) behind ragkit serve's Guard."""
    from mcp.server.transport_security import TransportSecuritySettings
    from starlette.requests import Request
    from starlette.responses import JSONResponse

    from ragkit.serve.guard import Guard, is_loopback_host

    @server.custom_route("/health", methods=["GET"])
    async def health(request: Request) -> JSONResponse:
        status, n = "ok", 0
        try:
            n = len(await anyio.to_thread.run_sync(state.documents))
        except Exception:
            status = "degraded"
        return JSONResponse({"status": status, "documents": n, "generator": state.generator_name, "busy": state.busy})

    limit = state.settings.serve.max_body_bytes
    inner = server.streamable_http_app(
        streamable_http_path=MCP_PATH, host=host, max_request_body_size=limit,
        transport_security=TransportSecuritySettings(enable_dns_rebinding_protection=False),  # the Guard checks
    )
    return Guard(inner, token=token, loopback_only=is_loopback_host(host), api_limit=limit, other_limit=limit)
