"""`ragkit ingest PATH...`: files and folders into the store."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

import typer

from ragkit.commands._common import JsonOpt, StoreOpt, _print_json, _settings, command_errors, err


def register(app: typer.Typer) -> None:
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

        with command_errors(as_json, "interrupted: the store is consistent; run the same command again to finish"):
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
        if as_json:
            _print_json(report.to_json())
        else:
            err.print(
                f"added {report.added}, updated {report.updated}, unchanged {report.unchanged}, "
                f"failed {len(report.failed)}, chunks written {report.chunks}" + (f", pruned {report.removed}" if prune else ""),
                highlight=False,
            )
        raise typer.Exit(1 if report.failed else 0)
