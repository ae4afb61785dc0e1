"""`ragkit review PATH...`: every contract of a folder (or named in the store) against a
checklist, into a spreadsheet a lawyer filters."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Optional

import typer

FORMATS = ("xlsx", "csv", "json")


def _documents(targets: list[str], session, as_json: bool, on_event) -> tuple[list[str], list[tuple[str, str]]]:
    """The store's names of the documents to review: files and folders given are ingested
    first (files the store already holds unchanged are not parsed again), names of stored
    documents taken as they are. Returns (names, [(file, why) of those that failed])."""
    from ragkit.errors import UsageError
    from ragkit.ingest import ingest

    paths = [Path(t) for t in targets if Path(t).exists()]
    names = [t for t in targets if not Path(t).exists()]
    failed: list[tuple[str, str]] = []
    if paths:
        rep = ingest(paths, session.settings, embedder=session.embedder, on_event=on_event)
        failed = [(str(f.get("path")), str(f.get("error"))) for f in rep.failed]
        bad = {f for f, _ in failed}
        keys = {str(Path(f["path"]).resolve()) for f in rep.files if f.get("path") not in bad}
        session.reopen_store()
        by_key = {r.key: r.name for r in session.store.documents()}
        names = [by_key[k] for k in sorted(keys) if k in by_key] + names
    from ragkit.retrieve.search import UnknownDocument, resolve_docs

    records = session.store.documents()
    for n in names:
        try:
            resolve_docs(records, [n])
        except UnknownDocument as exc:
            raise UsageError(f"{n!r} is neither a file nor a document in the store", hint=exc.hint) from None
    if not names:
        raise UsageError("no document to review" + (f": every file failed ({len(failed)})" if failed else ""),
                         hint="give contract files, a folder of them, or names of documents in the store")
    return names, failed


def register(app: typer.Typer) -> None:
    @app.command()
    def review(
        targets: list[str] = typer.Argument(..., help="contract files, folders of them, or names of stored documents"),
        checklist: str = typer.Option("cuad", "--checklist", help="built-in checklist (cuad: CUAD's 41 clause kinds; nda) or a .toml path"),
        items: Optional[str] = typer.Option(None, "--items", help="comma-separated item ids (default: all)"),
        out_file: Optional[Path] = typer.Option(None, "--out", help="the review file: review.xlsx, .csv or .json"),
        fmt: Optional[str] = typer.Option(None, "--format", help="xlsx | csv | json (default: from --out's suffix)"),
        fresh: bool = typer.Option(False, "--fresh", help="review every contract again (default: resume, skipping those already in --out's log)"),
        store: Optional[Path] = typer.Option(None, "--store", help="store folder"),
        profile: Optional[str] = typer.Option(None, "--profile", help="settings profile"),
        cluster: Optional[str] = typer.Option(None, "--cluster", help="review on this Ray cluster (host:port of its head, or auto)"),
        as_json: bool = typer.Option(False, "--json", help="print the review as JSON on stdout"),
    ) -> None:
        """Review a data room: every contract against a checklist (default CUAD's 41 clause
        kinds), one row per contract, one column per kind: the clauses found, their page and
        score. Resumable: a second run skips the contracts already reviewed."""
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

        from ragkit.commands._common import command_errors, err, fail, print_json, settings_for
        from ragkit.errors import UsageError

        kind = fmt or (out_file.suffix.lstrip(".").lower() if out_file is not None else None)
        if out_file is None and not as_json:
            fail(UsageError("review needs --out FILE (review.xlsx, .csv or .json), or --json"), as_json)
        if kind is not None and kind not in FORMATS:
            fail(UsageError(f"--format must be xlsx, csv or json (got {kind!r})"), as_json)
        if out_file is not None and not out_file.resolve().parent.is_dir():  # said now, not after the first contract
            fail(UsageError(f"cannot write {out_file}: its folder does not exist"), as_json)
        with command_errors(as_json, "interrupted: the contracts finished so far are in the review log; run again to go on"):
            from ragkit.compare.review import review as run_review
            from ragkit.compare.review import write_review
            from ragkit.session import Session

            session = Session(settings_for(store, profile))

            def ingest_event(k: str, info: dict) -> None:
                if k == "failed":
                    err.print(f"[red]  not reviewed[/] {info['path']}: {info['error']}", highlight=False)

            docs, failed = _documents(targets, session, as_json, ingest_event)
            from ragkit.compare.checklist import load_checklist

            chosen = [i.strip() for i in items.split(",")] if items else None
            n_items = len([i for i in load_checklist(checklist)[1] if not chosen or i.id in chosen])
            log = out_file.with_name(out_file.name + ".log.jsonl") if out_file is not None else None
            if log is not None and fresh and log.exists():
                log.unlink()
            progress = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                                TimeElapsedColumn(), TimeRemainingColumn(), console=err, transient=True,
                                disable=not err.is_terminal)
            t0 = time.perf_counter()
            with progress:
                task = progress.add_task("contracts x kinds", total=len(docs) * n_items)

                asked: dict[str, int] = {}

                def on_progress(doc: str, item: str | None) -> None:
                    if item is not None:
                        asked[doc] = asked.get(doc, 0) + 1
                        progress.advance(task)
                        return
                    progress.advance(task, n_items - asked.get(doc, 0))  # a contract read back from the log
                    if not as_json:
                        how = "reviewed " if asked.get(doc) else "from log "
                        progress.console.print(f"  {how} {doc}", highlight=False)

                many = None
                if cluster:
                    from ragkit.cluster.review import review_on_cluster

                    many = review_on_cluster(cluster)
                rv = run_review(docs, session, checklist, items=chosen, log=log, on_progress=on_progress, review_many=many)
            rv.failed = failed + rv.failed
            written = write_review(rv, out_file, kind or "xlsx") if out_file is not None else []
            if as_json:
                print_json({**rv.to_json(), "written": written, "log": str(log) if log else None})
            else:
                shown = sum(1 for c in rv.contracts for i in rv.items if rv.shown(c.findings.get(i.id, [])))
                floor = "every finding" if rv.floor is None else f"findings scoring {rv.floor:g} or more"
                err.print(f"{len(rv.contracts)} contracts x {len(rv.items)} kinds ({rv.resumed} from the log) in "
                          f"{time.perf_counter() - t0:.0f} s; {shown} cells filled with {floor}", highlight=False)
                for w in written:
                    err.print(f"wrote {w}", highlight=False)
            if failed:
                raise typer.Exit(1)
