"""The `ragkit` command: a thin layer over the library. Every command takes --json.

Exit codes: 0 success; 1 some input files failed; 2 usage or configuration error;
3 model not found or unloadable; 4 store error; 5 store locked by another writer;
130 interrupted.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any, Optional

import ragkit  # noqa: F401  (sets the offline switches first)

import typer
from rich.console import Console
from rich.table import Table

from ragkit.errors import RagkitError

app = typer.Typer(
    help="Offline document question answering with page and section citations.\n\n"
    "Ingest PDF/Word/Markdown/text files, then ask questions answered only from them, by a model running on this machine.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
docs_app = typer.Typer(help="List or remove ingested documents.", invoke_without_command=True, no_args_is_help=False)
app.add_typer(docs_app, name="docs")

err = Console(stderr=True, soft_wrap=True)  # one line per message, greppable
out = Console()

StoreOpt = typer.Option(None, "--store", help="store folder (default ./.ragkit, or RAGKIT_STORE / ragkit.toml)")
JsonOpt = typer.Option(False, "--json", help="print machine-readable JSON on stdout")
ProfileOpt = typer.Option(None, "--profile", help="settings profile: laptop (default) or kimi-k2")


def _settings(store: Optional[Path], profile: Optional[str] = None, **extra: Any):
    from ragkit.config import load_settings

    overrides: dict[str, Any] = dict(extra)
    if store is not None:
        overrides["store"] = store
    if profile is not None:
        overrides["profile"] = profile
    return load_settings(**overrides)


def _fail(exc: RagkitError, as_json: bool) -> None:
    if as_json:
        print(json.dumps({"error": str(exc), "exit_code": exc.exit_code}))
    err.print(f"[bold red]error:[/] {exc}", highlight=False, markup=True, soft_wrap=True) if not as_json else None
    raise typer.Exit(exc.exit_code)


def _print_json(obj: Any) -> None:
    sys.stdout.write(json.dumps(obj, ensure_ascii=False, indent=2) + "\n")
    sys.stdout.flush()


# ---------------------------------------------------------------------- ingest

@app.command()
def ingest(
    paths: list[Path] = typer.Argument(..., help="files and folders (PDF, DOCX, MD, TXT)"),
    store: Optional[Path] = StoreOpt,
    prune: bool = typer.Option(False, "--prune", help="remove documents whose files are gone"),
    wait: float = typer.Option(0.0, "--wait", help="seconds to wait for another writer to finish"),
    as_json: bool = JsonOpt,
) -> None:
    """Ingest files and folders into the store. Unchanged files are skipped; bad files are reported and skipped."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from ragkit.ingest import ingest as run_ingest

    try:
        settings = _settings(store)
        progress = Progress(
            TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
            console=err, transient=True, disable=not err.is_terminal,
        )
        tasks: dict[str, Any] = {}

        def on_event(kind: str, info: dict) -> None:
            if kind == "start":
                tasks["files"] = progress.add_task("files", total=info["files"])
            elif kind == "parsed":
                tasks["emb"] = progress.add_task(f"  embedding {Path(info['path']).name}", total=info["chunks"])
            elif kind == "embedded" and "emb" in tasks:
                progress.advance(tasks["emb"], info["n"])
            elif kind == "file":
                if "emb" in tasks:
                    progress.remove_task(tasks.pop("emb"))
                if "files" in tasks:
                    progress.advance(tasks["files"])
                if not as_json:
                    progress.console.print(f"  {info['status']:<9} {Path(info['path']).name}" + (f"  ({info['chunks']} chunks)" if info.get("chunks") is not None and info["status"] != "unchanged" else ""), highlight=False)
            elif kind == "failed":
                if "emb" in tasks:
                    progress.remove_task(tasks.pop("emb"))
                if "files" in tasks and info["path"]:
                    progress.advance(tasks["files"])
                progress.console.print(f"[red]  failed[/]    {info['path']}: {info['error']}", highlight=False)
            elif kind == "pruned" and not as_json:
                progress.console.print(f"  pruned    {info['path']}", highlight=False)

        with progress:
            report = run_ingest(list(paths), settings, prune=prune, wait_s=wait, on_event=on_event)
    except RagkitError as exc:
        _fail(exc, as_json)
        return
    except KeyboardInterrupt:
        err.print("interrupted: the store is consistent; run the same command again to finish")
        raise typer.Exit(130)
    if as_json:
        _print_json(report.to_json())
    else:
        err.print(
            f"added {report.added}, updated {report.updated}, unchanged {report.unchanged}, "
            f"failed {len(report.failed)}, chunks written {report.chunks}" + (f", pruned {report.removed}" if prune else ""),
            highlight=False,
        )
    raise typer.Exit(1 if report.failed else 0)


# ---------------------------------------------------------------------- ask

@app.command()
def ask(
    question: str = typer.Argument(..., help="the question"),
    doc: list[str] = typer.Option([], "--doc", help="restrict to this document (name, name without extension, or path); repeat for several"),
    store: Optional[Path] = StoreOpt,
    profile: Optional[str] = ProfileOpt,
    dry_run: bool = typer.Option(False, "--dry-run", help="build and print the prompt with its token count; do not generate"),
    as_json: bool = JsonOpt,
) -> None:
    """Answer a question from the ingested documents, with citations to document, page and section."""
    from ragkit.ask import ask as run_ask
    from ragkit.retrieve.prompt import format_location

    try:
        settings = _settings(store, profile)
        streamed = []

        def on_text(piece: str) -> None:
            streamed.append(piece)
            if not as_json:
                sys.stdout.write(piece)
                sys.stdout.flush()

        result = run_ask(question, settings, doc, dry_run=dry_run, on_text=on_text)
    except RagkitError as exc:
        _fail(exc, as_json)
        return
    except KeyboardInterrupt:
        err.print("interrupted")
        raise typer.Exit(130)
    if dry_run:
        if as_json:
            _print_json(result.dry_run_json())
        else:
            sys.stdout.write(result.prompt.text + "\n")
            p = result.prompt
            err.print(
                f"prompt tokens {len(p.ids)} (prefix {p.prefix_tokens}), sources {len(p.contexts)} ({p.mode}), "
                f"n_ctx {p.n_ctx}, max_tokens {p.max_tokens}",
                highlight=False,
            )
        return
    if as_json:
        _print_json(result.to_json())
        return
    sys.stdout.write("\n\n")
    if result.citations:
        out.print("[bold]Sources[/]")
        for c in result.citations:
            where = format_location(c.page, c.section)
            flag = " [dim](matched by wording; the model gave no marker)[/]" if c.inferred else ""
            out.print(f" [{c.n}] [cyan]{c.doc}[/] {where}{flag}", highlight=False)
            out.print(f"     “{c.quote}”", highlight=False, style="dim")
    if result.invalid_citations:
        out.print(f"[yellow]warning:[/] the answer cites {result.invalid_citations}, which were not among the sources", highlight=False)
    g = result.generation
    t = result.timings
    err.print(
        f"[dim]prompt {len(result.prompt.ids)} tok ({g.cached_tokens} cached), {g.completion_tokens} generated; "
        f"retrieve {t['retrieve_s']:.2f}s, first token {t['ttft_s']:.2f}s, generate {t['generate_s']:.2f}s[/]",
        highlight=False,
    )


# ---------------------------------------------------------------------- docs

@docs_app.callback()
def docs_list(
    ctx: typer.Context,
    store: Optional[Path] = StoreOpt,
    as_json: bool = JsonOpt,
) -> None:
    """List ingested documents with their section and chunk counts."""
    if ctx.invoked_subcommand is not None:
        return
    from ragkit.embed import load_embedder
    from ragkit.store import open_store

    try:
        settings = _settings(store)
        st = open_store(settings, load_embedder(settings), create=False)
        records = st.documents()
    except RagkitError as exc:
        _fail(exc, as_json)
        return
    if as_json:
        _print_json([
            {"name": r.name, "path": r.path, "doc_id": r.doc_id, "sections": r.n_sections, "chunks": r.n_chunks,
             "pages": r.n_pages, "sha256": r.sha256}
            for r in records
        ])
        return
    table = Table("document", "pages", "sections", "chunks", "path")
    for r in records:
        table.add_row(r.name, str(r.n_pages or "-"), str(r.n_sections), str(r.n_chunks), r.path)
    out.print(table)


@docs_app.command("rm")
def docs_rm(
    names: list[str] = typer.Argument(..., help="documents to remove (name or path)"),
    store: Optional[Path] = StoreOpt,
    as_json: bool = JsonOpt,
) -> None:
    """Remove documents and their sections from the store."""
    from ragkit.embed import load_embedder
    from ragkit.store import open_store
    from ragkit.retrieve.search import resolve_docs
    from ragkit.store import WriteLock, lock_path

    try:
        settings = _settings(store)
        embedder = load_embedder(settings)
        with WriteLock(lock_path(settings.store, settings.store_url, settings.collection, settings.cache_dir)):
            st = open_store(settings, embedder, create=False)
            recs = resolve_docs(st.documents(), names)
            removed = [st.remove_document(r.key) for r in recs]
            from ragkit.ingest.pipeline import sync_lexical_index

            sync_lexical_index(st, settings)
    except RagkitError as exc:
        _fail(exc, as_json)
        return
    if as_json:
        _print_json({"removed": [r.name for r in removed if r]})
    else:
        for r in removed:
            if r:
                err.print(f"removed {r.name}", highlight=False)


def _register_commands() -> None:
    import importlib
    import pkgutil

    import ragkit.commands as commands

    for mod in sorted(pkgutil.iter_modules(commands.__path__), key=lambda m: m.name):
        module = importlib.import_module(f"ragkit.commands.{mod.name}")
        register = getattr(module, "register", None)
        if register is not None:
            register(app)


_register_commands()


def main() -> None:
    try:
        app()
    except KeyboardInterrupt:
        sys.stderr.write("interrupted\n")
        sys.exit(130)


if __name__ == "__main__":
    main()
