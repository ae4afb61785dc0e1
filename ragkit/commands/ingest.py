"""`ragkit ingest PATH...`: files and folders into the store."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

import typer

from ragkit.commands._common import JsonOpt, StoreOpt, _print_json, _settings, command_errors, err


def _progress_bars(as_json: bool):
    """Three bars: files (committed), pages parsed and chunks embedded, each with its rate
    and time left. Totals not known in advance are estimated from what is done so far:
    pages from the bytes still to parse, chunks to embed from the chunks per byte parsed
    (the cache share included), and become exact as parsing finishes."""
    import time

    from rich.progress import BarColumn, MofNCompleteColumn, Progress, ProgressColumn, TextColumn
    from rich.text import Text

    started: dict[Any, float] = {}  # task id -> when it was added

    # Rate and time left over the whole run, from our own clock: rich's own estimate is
    # reset each time a task's total changes, and these totals grow as files are parsed.
    def rate(task) -> float | None:
        t0 = started.get(task.id)
        dt = time.monotonic() - t0 if t0 is not None else 0.0
        return task.completed / dt if dt > 0.5 and task.completed else None

    class Rate(ProgressColumn):
        def render(self, task) -> Text:
            r = rate(task)
            unit = task.fields.get("unit", "")
            return Text(f"{r:7.1f} {unit}/s" if r else f"{'':>7} {unit}/s", style="progress.data.speed")

    class Left(ProgressColumn):
        def render(self, task) -> Text:
            r = rate(task)
            if not r or task.total is None:
                return Text("-:--:--", style="progress.remaining")
            left = max(task.total - task.completed, 0) / r
            return Text(time.strftime("%H:%M:%S", time.gmtime(left)) + " left", style="progress.remaining")

    progress = Progress(
        TextColumn("{task.description:<16}"), BarColumn(), MofNCompleteColumn(), Rate(), Left(),
        console=err, transient=True, disable=not err.is_terminal,
    )
    tasks: dict[str, Any] = {}
    s = {"bytes": 0, "bytes_done": 0, "pages": 0, "parse_files": 0, "parsed_files": 0,
         "to_embed": 0, "embedded": 0, "chunks_parsed": 0, "chunks_seen": 0, "cached": 0}

    def totals() -> None:
        left = max(s["bytes"] - s["bytes_done"], 0)
        per_byte = lambda n: n / s["bytes_done"] if s["bytes_done"] else 0.0  # noqa: E731
        if "pages" in tasks:
            # a file with no page numbers (DOCX, Markdown) counts as one page
            total = s["pages"] + (round(per_byte(s["pages"]) * left) if left else 0)
            progress.update(tasks["pages"], total=max(total, s["pages"], 1) if left or s["pages"] else 1)
        if "emb" in tasks:
            # chunks parsed but not yet taken up, and those of the bytes not parsed yet, at the
            # share of chunks that needed the embedder so far
            share = s["to_embed"] / s["chunks_parsed"] if s["chunks_parsed"] else 1.0
            ahead = s["chunks_seen"] - s["chunks_parsed"] + per_byte(s["chunks_seen"]) * left
            est = s["to_embed"] + round(max(ahead, 0) * share)
            progress.update(tasks["emb"], total=max(est, s["embedded"], 1))

    def on_event(kind: str, info: dict) -> None:
        if kind == "start":
            tasks["files"] = progress.add_task("files", total=info["files"], unit="files")
            started[tasks["files"]] = time.monotonic()
        elif kind == "plan" and info["parse"]:
            s["bytes"], s["parse_files"] = info["bytes"], info["parse"]
            tasks["pages"] = progress.add_task("pages parsed", total=None, unit="pages")
            tasks["emb"] = progress.add_task("chunks embedded", total=None, unit="chunks")
            started[tasks["pages"]] = started[tasks["emb"]] = time.monotonic()
        elif kind == "parse_done":
            s["bytes_done"] += info["bytes"]
            s["parsed_files"] += 1
            s["chunks_seen"] += info["chunks"]
            n = info["pages"] or 1
            s["pages"] += n
            if "pages" in tasks:
                progress.advance(tasks["pages"], n)
            totals()
        elif kind == "parsed":
            s["chunks_parsed"] += info["chunks"]
            s["to_embed"] += info.get("to_embed", info["chunks"])
            s["cached"] += info.get("from_cache", 0)
            if "emb" in tasks:
                cached = f" ({s['cached']} cached)" if s["cached"] else ""
                progress.update(tasks["emb"], description=f"chunks embedded{cached}")
            totals()
        elif kind == "embedded" and "emb" in tasks:
            s["embedded"] += info["n"]
            progress.advance(tasks["emb"], info["n"])
        elif kind == "file":
            if "files" in tasks:
                progress.advance(tasks["files"])
            if not as_json:
                progress.console.print(f"  {info['status']:<9} {Path(info['path']).name}" + (f"  ({info['chunks']} chunks)" if info.get("chunks") is not None and info["status"] != "unchanged" else ""), highlight=False)
        elif kind == "failed":
            if "files" in tasks and info["path"]:
                progress.advance(tasks["files"])
            progress.console.print(f"[red]  failed[/]    {info['path']}: {info['error']}", highlight=False)
        elif kind == "pruned" and not as_json:
            progress.console.print(f"  pruned    {info['path']}", highlight=False)

    return progress, on_event


def register(app: typer.Typer) -> None:
    @app.command()
    def ingest(
        paths: list[Path] = typer.Argument(..., help="files and folders (PDF, DOCX, MD, TXT)"),
        store: Optional[Path] = StoreOpt,
        prune: bool = typer.Option(False, "--prune", help="remove documents whose files are gone"),
        wait: float = typer.Option(0.0, "--wait", help="seconds to wait for another writer to finish"),
        workers: Optional[int] = typer.Option(
            None, "--workers", min=0, help="processes parsing files ahead of the embedder (0 = from the free cores)"
        ),
        cluster: Optional[str] = typer.Option(
            None, "--cluster", help="parse and embed on this Ray cluster (host:port of its head, or auto); setting cluster.address"
        ),
        as_json: bool = JsonOpt,
    ) -> None:
        """Ingest files and folders into the store. Unchanged files are skipped; bad files are reported and skipped."""
        from ragkit.ingest import ingest as run_ingest

        with command_errors(as_json, "interrupted: the store is consistent; run the same command again to finish"):
            settings = _settings(store)
            if workers is not None:
                settings.ingest.workers = workers
            address = cluster or settings.cluster.address
            progress, on_event = _progress_bars(as_json)
            with progress:
                if address:
                    from ragkit.cluster import ingest_on_cluster

                    report = ingest_on_cluster(list(paths), settings, address, prune=prune, wait_s=wait, on_event=on_event)
                else:
                    report = run_ingest(list(paths), settings, prune=prune, wait_s=wait, on_event=on_event)
        if as_json:
            _print_json(report.to_json())
        else:
            cache = ""
            if report.chunks:
                cache = (f" ({report.chunks_embedded} embedded, {report.chunks_from_cache} from the cache: "
                         f"{100 * report.chunks_from_cache / report.chunks:.0f}%)")
            err.print(
                f"added {report.added}, updated {report.updated}, unchanged {report.unchanged}, "
                f"failed {len(report.failed)}, chunks written {report.chunks}{cache}" + (f", pruned {report.removed}" if prune else ""),
                highlight=False,
            )
        raise typer.Exit(1 if report.failed else 0)
