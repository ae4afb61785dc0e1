"""`ragkit docs` (list) and `ragkit docs rm NAME...`."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer
from rich.table import Table

from ragkit.commands._common import JsonOpt, StoreOpt, err, fail, out, print_json, settings_for
from ragkit.errors import RagkitError

docs_app = typer.Typer(help="List or remove ingested documents.", invoke_without_command=True, no_args_is_help=False)


def register(app: typer.Typer) -> None:
    app.add_typer(docs_app, name="docs")


@docs_app.callback()
def docs_list(
    ctx: typer.Context,
    store: Optional[Path] = StoreOpt,
    as_json: bool = JsonOpt,
) -> None:
    """List ingested documents with their section and chunk counts."""
    if ctx.invoked_subcommand is not None:
        return
    from ragkit.session import Session

    try:
        records = Session(settings_for(store)).store.documents()
    except RagkitError as exc:
        fail(exc, as_json)
        return
    if as_json:
        print_json([
            {"name": r.name, "path": r.path, "doc_id": r.doc_id, "sections": r.n_sections, "chunks": r.n_chunks,
             "pages": r.n_pages, "sha256": r.sha256,
             "tracked_changes": {"count": r.tracked_changes, "authors": r.change_authors, "dates": r.change_dates}}
            for r in records
        ])
        return
    from ragkit.ingest.changes import summary_line

    changed = any(r.tracked_changes for r in records)
    table = Table("document", "pages", "sections", "chunks", *(["tracked changes"] if changed else []), "path")
    for r in records:
        marks = [summary_line(r.tracked_changes, r.change_authors, r.change_dates) or "-"] if changed else []
        table.add_row(r.name, str(r.n_pages or "-"), str(r.n_sections), str(r.n_chunks), *marks, r.path)
    out.print(table)
    if changed:
        n = sum(1 for r in records if r.tracked_changes)
        err.print(f"{n} document{'s' if n != 1 else ''} carr{'y' if n != 1 else 'ies'} tracked changes nobody has accepted: "
                  "the text stored is the document with every change accepted; answers and comparisons quoting "
                  "changed words say so", highlight=False)


@docs_app.command("rm")
def docs_rm(
    names: list[str] = typer.Argument(..., help="documents to remove (name or path)"),
    store: Optional[Path] = StoreOpt,
    as_json: bool = JsonOpt,
) -> None:
    """Remove documents and their sections from the store."""
    from ragkit.retrieve.search import resolve_docs
    from ragkit.session import Session
    from ragkit.store import StoreWriter

    try:
        settings = settings_for(store)
        session = Session(settings)
        with StoreWriter(settings) as writer:
            st = session.store
            st.guard = writer.check
            recs = resolve_docs(st.documents(), names)
            removed = [st.remove_document(r.key) for r in recs]
            from ragkit.ingest.pipeline import sync_lexical_index

            sync_lexical_index(st, settings)
    except RagkitError as exc:
        fail(exc, as_json)
        return
    if as_json:
        print_json({"removed": [r.name for r in removed if r]})
    else:
        for r in removed:
            if r:
                err.print(f"removed {r.name}", highlight=False)


