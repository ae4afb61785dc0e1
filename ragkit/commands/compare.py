"""`ragkit compare A B [C...]`: a clause checklist walked over several contracts."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Optional

import typer


def register(app: typer.Typer) -> None:
    @app.command()
    def compare(
        docs: list[str] = typer.Argument(..., help="documents to compare (name, name without extension, or path)"),
        checklist: str = typer.Option("nda", "--checklist", help="built-in checklist name (prompts/checklists) or a .toml path"),
        items: Optional[str] = typer.Option(None, "--items", help="comma-separated item ids (default: all)"),
        store: Optional[Path] = typer.Option(None, "--store", help="store folder"),
        profile: Optional[str] = typer.Option(None, "--profile", help="settings profile"),
        fmt: str = typer.Option("table", "--format", help="table | md | html | docx (docx needs --out)"),
        out_file: Optional[Path] = typer.Option(None, "--out", help="write the md/html/docx memo here"),
        as_json: bool = typer.Option(False, "--json", help="print JSON"),
    ) -> None:
        """Compare contracts clause by clause: quote, page and section per document, and the difference."""
        from rich.console import Console
        from rich.markup import escape
        from rich.table import Table

        from ragkit.commands._common import fail, settings_for
        from ragkit.compare import claim_support, confidence_note, cost_line, missing, to_html, to_markdown
        from ragkit.compare import compare as run_compare
        from ragkit.errors import RagkitError, UsageError
        from ragkit.evidence.location import format_location

        err = Console(stderr=True)
        if fmt not in ("table", "md", "html", "docx"):
            fail(__import__("ragkit.errors").errors.UsageError("--format must be table, md, html or docx"), as_json)
        if fmt == "docx" and out_file is None and not as_json:  # a Word file is binary: never on stdout
            fail(UsageError("--format docx needs --out FILE.docx (a Word file is not written to the terminal)"), as_json)
        try:
            from ragkit.session import Session

            session = Session(settings_for(store, profile))
            result = run_compare(
                docs, session, checklist, items=[i.strip() for i in items.split(",")] if items else None,
                on_progress=lambda d, i: err.print(f"  {d}: {i}", highlight=False) if not as_json else None,
            )
            from ragkit.retrieve.search import resolve_docs

            recs = resolve_docs(session.store.documents(), docs)
            paths = {d: r.path for d, r in zip(docs, recs)}
        except RagkitError as exc:
            fail(exc, as_json)
            return
        if as_json:
            sys.stdout.write(json.dumps(result.to_json(), ensure_ascii=False, indent=2) + "\n")
            return
        if fmt == "docx":
            from ragkit.compare.docx import to_docx

            try:
                to_docx(result, out_file)
            except OSError as exc:
                fail(UsageError(f"cannot write {out_file}: {exc.strerror or exc}"), as_json)
            err.print(f"wrote {out_file}")
            return
        if fmt in ("md", "html"):
            text = to_markdown(result) if fmt == "md" else to_html(result, paths)
            if out_file:
                out_file.write_text(text, encoding="utf-8")
                err.print(f"wrote {out_file}")
            else:
                sys.stdout.write(text)
            return
        table = Table("clause", *docs, "difference", show_lines=True)
        for r in result.rows:
            cells = []
            for d in docs:
                f = r.findings[d]
                if not f.quote:
                    cells.append(f"[dim]{escape(missing(f))}[/]")
                else:
                    loc = format_location(f.page, f.section)
                    hint = " [dim](closest clause)[/]" if f.label == "Not mentioned" else ""
                    warn = f"\n[yellow]⚠ {escape(f.note)}[/]" if f.note else ""
                    cells.append(f"[b]{f.label}[/]{confidence_note(f)}{hint} “{escape(f.quote)}” [dim]({escape(loc)}){escape(claim_support(f))}[/]{warn}")
            table.add_row(escape(r.item.title), *cells, escape(r.difference))
        Console().print(table)
        err.print(cost_line(result), highlight=False)
