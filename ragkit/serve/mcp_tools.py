"""What `ragkit mcp` serves, without the protocol: the store's documents, search, ask,
compare and page text, over one loaded `ServeState` (settings, embedder, generator,
store, the generator queue). `ragkit.serve.mcp` turns these into MCP tools and
resources; nothing here imports the MCP SDK (the page reader also runs in the page
renderer process).

The same rules as `ragkit serve`:
- documents are named by file name, name without extension, or document id; never by a
  path (a name with / or \\ is refused);
- page text comes from the file a store record names (looked up by document id), only
  while its sha256 is the record's (`ragkit.serve.highlight.read_verified`), read in the
  page renderer process (`ragkit.serve.web.RENDERER`: pdfium is not thread-safe, and a
  hostile PDF that crashes it takes down the renderer, not the server); documents
  without pages (Word, Markdown, text) are read from the store's chunks;
- checklists are the built-in ones, by name (a path would read any TOML file);
- one generation at a time (`ServeState.generator_lock`): `ask` and `compare` wait for
  each other; `documents`, `search` and page reads do not generate and do not wait.

Errors a caller can cause raise `UsageError` (`NotFound` for a document or page the
store does not have) with a message naming the thing and the reason.
"""

from __future__ import annotations

import re
from typing import Any, Callable

from pydantic import BaseModel, ConfigDict, Field

from ragkit.errors import RagkitError, UsageError
from ragkit.serve.server_state import ServeState

DOC_URI = "ragkit://doc/{doc_id}"
PAGE_URI = "ragkit://doc/{doc_id}/page/{n}"
MIN_BUDGET, MAX_BUDGET, DEFAULT_BUDGET = 256, 32000, 4000
MAX_PASSAGES = 100  # passages one search returns at most
TOKENS_PER_PASSAGE = 300  # a budget of N tokens asks for up to N / 300 passages (a chunk is ~256 embedder tokens)
MAX_QUERY_CHARS = 4000
DOC_ID = re.compile(r"^[0-9a-f]{24}$")  # as ragkit.serve.web.DOC_ID: 24 hex digits of the file's sha256


class NotFound(UsageError):
    """A document or page the store does not have."""


def doc_uri(doc_id: str) -> str:
    return DOC_URI.format(doc_id=doc_id)


def page_uri(doc_id: str, n: int) -> str:
    return PAGE_URI.format(doc_id=doc_id, n=n)


def outcome_of(result) -> str:
    """"supported" for an answer, "not_found" for an abstention; an outcome the result
    carries itself (a later "unverified", say) wins."""
    own = getattr(result, "outcome", None)
    if isinstance(own, str) and own:
        return own
    return "not_found" if result.abstained else "supported"


# ---------------------------------------------------------------------- output shapes


# A section as the `documents` tool lists it (not ragkit.ingest.blocks.Section); its schema
# keeps the title MCP clients have seen. No docstring: it would become the schema's description.
class SectionOut(BaseModel):
    model_config = ConfigDict(title="Section")
    path: str = Field(description="the section path, ' > ' joined (as citations name it)")
    page: int | None = Field(description="the page the section starts on (None for documents without pages)")


class Document(BaseModel):
    id: str = Field(description="document id (24 hex digits of the file's sha256); names its resources")
    name: str = Field(description="file name: what `docs` arguments and citations use")
    sha256: str
    kind: str = Field(description="pdf, docx, md or txt")
    pages: int | None = Field(description="page count (None for Word, Markdown and text files)")
    chunks: int
    sections: list[SectionOut]
    uri: str = Field(description="resource with the document's whole text")


class Documents(BaseModel):
    documents: list[Document]


# A passage as the `search` tool returns it (not ragkit.answer.passages.Passage); its schema
# keeps the title MCP clients have seen.
class PassageOut(BaseModel):
    model_config = ConfigDict(title="Passage")
    rank: int = Field(description="1 = the best match")
    document: str
    doc_id: str
    page: int | None
    page_end: int | None
    section: str | None
    text: str
    tokens: int = Field(description="tokens of this passage with its source line, counted with the generator's tokenizer")
    score: float
    uri: str = Field(description="resource with the text of the page the passage starts on (or of the document)")


class SearchResult(BaseModel):
    query: str
    documents: list[str] = Field(description="the documents searched")
    passages: list[PassageOut]
    total_tokens: int = Field(description="sum of the passages' tokens, at most max_tokens")
    max_tokens: int
    relevant: bool = Field(description="false when no passage is relevant to the query (ask would abstain)")
    abstain_reason: str | None


# ---------------------------------------------------------------------- the page reader (renderer process)


def stored_pdf_pages(sources: list[tuple[str, str, str]], pages: list[int] | None, max_bytes: int) -> tuple[int, list[tuple[int, str]]]:
    """(page count, [(page, text), ...]) of a stored PDF: the first of `sources` (path,
    sha256, name: the store records of one document id) whose file still holds the
    ingested content; `pages` None: every page. Raises SourceUnavailable (file gone or
    changed) or PageOutOfRange. Runs in the page renderer process."""
    from ragkit.ingest.loaders import pdfium_text
    from ragkit.serve.highlight import PDFIUM_LOCK, PageOutOfRange, SourceUnavailable, open_pdf, read_verified

    first: SourceUnavailable | None = None
    for path, sha256, name in sources:
        try:
            data = read_verified(path, sha256, name, max_bytes)
        except SourceUnavailable as exc:
            first = first or exc
            continue
        with PDFIUM_LOCK:
            doc = open_pdf(data)
            try:
                total = len(doc)
                wanted = list(range(1, total + 1)) if pages is None else pages
                for p in wanted:
                    if not 1 <= p <= total:
                        raise PageOutOfRange(p, total)
                out = []
                for p in wanted:
                    page = doc[p - 1]
                    try:
                        tp = page.get_textpage()
                        try:
                            text = pdfium_text(tp)  # what ingest reads, its U+FFFE read as "-"
                        finally:
                            tp.close()
                    finally:
                        page.close()
                    out.append((p, text.replace("\r\n", "\n").replace("\r", "\n")))
                return total, out
            finally:
                doc.close()
    raise first or SourceUnavailable(410, "no file for this document")


# ---------------------------------------------------------------------- the tools


class RagkitTools:
    """The MCP tools' work over a loaded ServeState (`state.load()` done by the caller)."""

    def __init__(self, state: ServeState):
        self.state = state

    @property
    def settings(self):
        return self.state.settings

    # ------------------------------------------------------------ documents

    def records(self) -> list:
        """The store's document records ([] while nothing is ingested)."""
        return self.state.documents()

    def _records_or_fail(self) -> list:
        recs = self.records()
        if not recs:
            where = self.settings.store_url or self.settings.store
            raise UsageError(f"the store at {where} holds no documents yet", hint="ingest some first: ragkit ingest PATH")
        return recs

    def pick(self, names: list[str] | None) -> list:
        """The records of the named documents (file name, name without extension, or
        document id), each once; [] for none named. A name that matches nothing is a
        NotFound naming it and listing what the store holds."""
        from ragkit.retrieve.search import UnknownDocument, resolve_docs

        if not names:
            return []
        records = self._records_or_fail()
        by_id = {r.doc_id: r.name for r in records}
        out: list = []
        for raw in names:
            name = (raw or "").strip()
            if not name:
                raise UsageError("an empty document name in docs")
            if "/" in name or "\\" in name:
                raise UsageError(f"name documents by file name or id, not by path: {name!r}")
            try:
                (rec,) = resolve_docs(records, [by_id.get(name, name)])
            except UnknownDocument:
                have = ", ".join(sorted({r.name for r in records})[:20])
                raise NotFound(f"unknown document {name!r}: no document of that name or id in the store",
                               hint=f"the documents tool lists them: {have}") from None
            if rec not in out:
                out.append(rec)
        return out

    def documents(self) -> Documents:
        from ragkit.serve.web import kind_of

        store = self.state.store() if self.records() else None
        out = []
        for r in self.records():
            sections: list[SectionOut] = []
            last = None
            for h in store.chunks([r.doc_id]):
                path = h.meta.get("section") or ""
                if path and path != last:
                    sections.append(SectionOut(path=path, page=h.meta.get("page_start")))
                last = path
            out.append(Document(id=r.doc_id, name=r.name, sha256=r.sha256, kind=kind_of(r.name), pages=r.n_pages,
                                chunks=r.n_chunks, sections=sections, uri=doc_uri(r.doc_id)))
        return Documents(documents=out)

    # ------------------------------------------------------------ search

    def search(self, query: str, docs: list[str] | None = None, max_tokens: int = DEFAULT_BUDGET) -> SearchResult:
        """Ranked passages for `query` (retrieval only, no generation), packed within
        `max_tokens` tokens of the generator's tokenizer: `ragkit.retrieve.retrieve` with
        a prompt budget of exactly `max_tokens` for the sources, and up to one passage
        per TOKENS_PER_PASSAGE tokens of it (at least `retrieve.top_k`)."""
        from ragkit.retrieve import retrieve
        from ragkit.retrieve.prompt import PromptBuilder

        q = (query or "").strip()
        if not q:
            raise UsageError("the query is empty")
        if len(q) > MAX_QUERY_CHARS:
            raise UsageError(f"the query is {len(q)} characters, over the limit of {MAX_QUERY_CHARS}")
        if not MIN_BUDGET <= max_tokens <= MAX_BUDGET:
            raise UsageError(f"max_tokens {max_tokens} is out of range: give {MIN_BUDGET} to {MAX_BUDGET}")
        recs = self.pick(docs)
        self._records_or_fail()
        s = self.settings
        gen = self.state.generator
        fixed = -PromptBuilder(gen, n_ctx=0, max_tokens=0).budget_for(q)  # template and query tokens
        top_k = min(MAX_PASSAGES, max(s.retrieve.top_k, max_tokens // TOKENS_PER_PASSAGE))
        sized = s.model_copy(update={
            "generator": s.generator.model_copy(update={"n_ctx": max_tokens + fixed + s.generator.max_tokens}),
            "retrieve": s.retrieve.model_copy(update={"top_k": top_k, "candidates": max(s.retrieve.candidates, 3 * top_k)}),
        })
        r = retrieve(q, self.state.session.with_settings(sized), [x.name for x in recs] or None, generator=gen)
        contexts = r.prompt.contexts
        if r.prompt.mode == "whole":  # every chunk went in: keep those the search ranked
            contexts = [c for c in contexts if c.score > 0] or contexts
        chosen = _best(contexts, top_k, per_doc=len(recs) > 1)
        passages = [
            PassageOut(rank=i, document=c.doc, doc_id=c.doc_id, page=c.page_start, page_end=c.page_end, section=c.section,
                    text=c.text, tokens=c.tokens, score=round(c.score, 4),
                    uri=page_uri(c.doc_id, c.page_start) if c.page_start else doc_uri(c.doc_id))
            for i, c in enumerate(chosen, 1)
        ]
        return SearchResult(query=q, documents=[d.name for d in r.docs], passages=passages,
                            total_tokens=sum(p.tokens for p in passages), max_tokens=max_tokens,
                            relevant=r.abstain_reason is None, abstain_reason=r.abstain_reason)

    # ------------------------------------------------------------ ask, compare (the generator)

    def ask(self, question: str, docs: list[str] | None = None) -> dict[str, Any]:
        """`ragkit ask --json`'s object for the question, plus `outcome`; each citation
        also carries `doc_id`, `page_end` (as `ragkit serve` gives them) and `uri`, the
        page resource that shows it."""
        from ragkit.answer.ask import ask as run_ask
        from ragkit.serve.answer_json import citation_json

        q = (question or "").strip()
        if not q:
            raise UsageError("the question is empty")
        if len(q) > MAX_QUERY_CHARS:
            raise UsageError(f"the question is {len(q)} characters, over the limit of {MAX_QUERY_CHARS}")
        recs = self.pick(docs)
        self._records_or_fail()
        with self.state.generator_lock:  # one generation at a time
            result = run_ask(q, self.state.session, [r.name for r in recs] or None)
        out = result.to_json()
        by_n = {c.n: c for c in result.prompt.contexts}
        cites = []
        for c in result.citations:
            j = citation_json(c, by_n)
            if j["doc_id"]:
                j["uri"] = page_uri(j["doc_id"], c.page) if c.page else doc_uri(j["doc_id"])
            cites.append(j)
        out["citations"] = cites
        out.setdefault("outcome", outcome_of(result))
        return out

    def compare(self, documents: list[str], checklist: str = "nda", items: list[str] | None = None,
                on_progress: Callable[[int, int, str], None] | None = None) -> dict[str, Any]:
        """Exactly `ragkit compare --json`'s object (`Comparison.to_json()`) for a
        built-in checklist over 2+ documents; `on_progress(done, total, "doc: item")`."""
        from ragkit.compare import compare as run_compare
        from ragkit.serve.web import builtin_checklists

        lists = builtin_checklists()
        if checklist not in lists:  # names only: a path here would read any TOML file
            raise UsageError(f"unknown checklist {checklist!r}", hint=f"built in: {', '.join(lists)}")
        known = [i.id for i in lists[checklist]]
        wanted = list(dict.fromkeys(i.strip() for i in items or [] if i.strip()))
        unknown = [i for i in wanted if i not in known]
        if unknown:
            raise UsageError(f"unknown checklist item(s) {', '.join(repr(i) for i in unknown)} in {checklist!r}",
                             hint=f"its items: {', '.join(known)}")
        names = list(dict.fromkeys(r.name for r in self.pick(documents)))
        if len(names) < 2:
            raise UsageError("compare needs at least two different documents")
        total = len(names) * (len(wanted) or len(known))
        done = 0

        def progress(doc: str, item: str) -> None:
            nonlocal done
            done += 1
            if on_progress is not None:
                on_progress(done, total, f"{doc}: {item}")

        with self.state.generator_lock:  # never beside an answer: one model, one KV cache
            result = run_compare(names, self.state.session, checklist, items=wanted or None, on_progress=progress)
        return result.to_json()

    # ------------------------------------------------------------ text of pages and documents

    def _records_of(self, doc_id: str) -> list:
        if not DOC_ID.match(doc_id or ""):
            raise NotFound(f"{doc_id!r} is not a document id (24 hex digits; the documents tool lists them)")
        recs = [r for r in self.records() if r.doc_id == doc_id]
        if not recs:
            raise NotFound(f"no document with id {doc_id} in the store")
        return recs

    def _pdf_pages(self, recs: list, pages: list[int] | None) -> tuple[int, list[tuple[int, str]]]:
        from fastapi import HTTPException

        from ragkit.serve.highlight import PageOutOfRange, SourceUnavailable
        from ragkit.serve.web import RENDERER

        max_bytes = max(self.settings.ingest.max_file_mb * 1024 * 1024, 1)
        try:
            # the paths come from the store's records of this id, never from the request
            return RENDERER.run(stored_pdf_pages, [(r.path, r.sha256, r.name) for r in recs], pages, max_bytes)
        except SourceUnavailable as exc:
            raise RagkitError(exc.message) from None
        except PageOutOfRange as exc:
            raise NotFound(f"{recs[0].name}: {exc}") from None
        except HTTPException as exc:  # the renderer crashed or timed out on this file
            raise RagkitError(f"{recs[0].name}: {exc.detail}") from None

    def _stored_text(self, rec) -> str:
        """A document's text from the store's chunks, section by section."""
        from ragkit.serve.web import section_text

        runs: list[tuple[str, list]] = []
        for h in self.state.store().chunks([rec.doc_id]):
            path = h.meta.get("section") or ""
            if runs and runs[-1][0] == path:
                runs[-1][1].append(h)
            else:
                runs.append((path, [h]))
        return "\n\n".join((f"§ {path}\n\n" if path else "") + section_text(hits) for path, hits in runs)

    def page_text(self, doc_id: str, n: str | int) -> str:
        """The text of page `n` of a document (a PDF's text layer, from its verified file);
        a document without pages has one: its whole text from the store."""
        from ragkit.serve.web import kind_of

        recs = self._records_of(doc_id)
        try:
            page = int(str(n).strip())
        except ValueError:
            raise NotFound(f"{n!r} is not a page number") from None
        pdfs = [r for r in recs if kind_of(r.name) == "pdf"]
        if not pdfs:
            if page != 1:
                raise NotFound(f"{recs[0].name} is a {kind_of(recs[0].name)} document without pages: "
                               f"{page_uri(doc_id, 1)} holds its whole text")
            return self._stored_text(recs[0])
        if page < 1:
            raise NotFound(f"{pdfs[0].name}: page {page} is out of range")
        return self._pdf_pages(pdfs, [page])[1][0][1]

    def document_text(self, doc_id: str) -> str:
        """A document's whole text: every page of a PDF, marked, or the stored text."""
        from ragkit.serve.web import kind_of

        recs = self._records_of(doc_id)
        pdfs = [r for r in recs if kind_of(r.name) == "pdf"]
        if not pdfs:
            return self._stored_text(recs[0])
        _, pages = self._pdf_pages(pdfs, None)
        return "\n\n".join(f"--- {pdfs[0].name}, page {p} ---\n{text}" for p, text in pages)


def _best(contexts: list, k: int, *, per_doc: bool) -> list:
    """The `k` best-scoring passages, best first; with several documents, the best of
    each comes first, so every document is represented."""
    ranked = sorted(contexts, key=lambda c: -c.score)
    firsts = list({c.doc_id: c for c in reversed(ranked)}.values()) if per_doc else []
    firsts.sort(key=lambda c: -c.score)
    rest = [c for c in ranked if c not in firsts]
    return (firsts + rest)[: max(k, len(firsts))]
