"""`ragkit ingest PATH...`: files and folders into the store."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Optional

import typer

from ragkit.commands._common import JsonOpt, StoreOpt, _print_json, _settings, command_errors, err


def _progress_bars(as_json: bool):
    """Three bars: files (committed), pages parsed and chunks embedded, each with its rate
    and time left. Totals not known in advance are estimated from what is done so far:
    pages from the bytes still to parse, chunks to embed from the chunks per byte parsed
    (the cache share included), and become exact as parsing finishes."""
    bars = _IngestBars(as_json)
    return bars.progress, bars.on_event


def _rate_columns(started: dict[Any, float]) -> tuple:
    """The rate and time-left columns. Both read the whole run, from our own clock
    (`started`: task id -> when it was added): rich's own estimate is reset each time a
    task's total changes, and these totals grow as files are parsed."""
    from rich.progress import ProgressColumn
    from rich.text import Text

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

    return Rate(), Left()


class _IngestBars:
    """The ingest's bars, fed by its events (`on_event`), and the counts behind their
    estimated totals; a file's outcome is printed above them (with `as_json`, failures only)."""

    def __init__(self, as_json: bool):
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

        self.as_json = as_json
        self.started: dict[Any, float] = {}  # task id -> when it was added
        self.progress = Progress(
            TextColumn("{task.description:<16}"), BarColumn(), MofNCompleteColumn(), *_rate_columns(self.started),
            console=err, transient=True, disable=not err.is_terminal,
        )
        self.tasks: dict[str, Any] = {}
        self.counts = {"bytes": 0, "bytes_done": 0, "pages": 0, "parse_files": 0, "parsed_files": 0,
                       "to_embed": 0, "embedded": 0, "chunks_parsed": 0, "chunks_seen": 0, "cached": 0}

    def on_event(self, kind: str, info: dict) -> None:
        """One event of `ragkit.ingest.ingest` (its on_event) on the bars."""
        if kind == "start":
            self.tasks["files"] = self.progress.add_task("files", total=info["files"], unit="files")
            self.started[self.tasks["files"]] = time.monotonic()
        elif kind == "plan" and info["parse"]:
            self._planned(info)
        elif kind == "parse_done":
            self._parse_done(info)
        elif kind == "parsed":
            self._parsed(info)
        elif kind == "embedded" and "emb" in self.tasks:
            self.counts["embedded"] += info["n"]
            self.progress.advance(self.tasks["emb"], info["n"])
        elif kind == "file":
            self._file_done(info)
        elif kind == "failed":
            if "files" in self.tasks and info["path"]:
                self.progress.advance(self.tasks["files"])
            self.progress.console.print(f"[red]  failed[/]    {info['path']}: {info['error']}", highlight=False)
        elif kind == "pruned" and not self.as_json:
            self.progress.console.print(f"  pruned    {info['path']}", highlight=False)

    def _planned(self, info: dict) -> None:
        """Files to parse: the pages and chunks bars start, their totals not known yet."""
        self.counts["bytes"], self.counts["parse_files"] = info["bytes"], info["parse"]
        self.tasks["pages"] = self.progress.add_task("pages parsed", total=None, unit="pages")
        self.tasks["emb"] = self.progress.add_task("chunks embedded", total=None, unit="chunks")
        self.started[self.tasks["pages"]] = self.started[self.tasks["emb"]] = time.monotonic()

    def _parse_done(self, info: dict) -> None:
        counts = self.counts
        counts["bytes_done"] += info["bytes"]
        counts["parsed_files"] += 1
        counts["chunks_seen"] += info["chunks"]
        n = info["pages"] or 1
        counts["pages"] += n
        if "pages" in self.tasks:
            self.progress.advance(self.tasks["pages"], n)
        self._estimate_totals()

    def _parsed(self, info: dict) -> None:
        counts = self.counts
        counts["chunks_parsed"] += info["chunks"]
        counts["to_embed"] += info.get("to_embed", info["chunks"])
        counts["cached"] += info.get("from_cache", 0)
        if "emb" in self.tasks:
            cached = f" ({counts['cached']} cached)" if counts["cached"] else ""
            self.progress.update(self.tasks["emb"], description=f"chunks embedded{cached}")
        self._estimate_totals()

    def _file_done(self, info: dict) -> None:
        if "files" in self.tasks:
            self.progress.advance(self.tasks["files"])
        if not self.as_json:
            chunks = f"  ({info['chunks']} chunks)" if info.get("chunks") is not None and info["status"] != "unchanged" else ""
            self.progress.console.print(f"  {info['status']:<9} {Path(info['path']).name}" + chunks, highlight=False)

    def _estimate_totals(self) -> None:
        """The pages and chunks totals from what is done so far: pages from the bytes still
        to parse, chunks to embed from the chunks per byte parsed at the cache share so far."""
        counts, tasks = self.counts, self.tasks
        left = max(counts["bytes"] - counts["bytes_done"], 0)
        per_byte = lambda n: n / counts["bytes_done"] if counts["bytes_done"] else 0.0  # noqa: E731
        if "pages" in tasks:
            # a file with no page numbers (DOCX, Markdown) counts as one page
            total = counts["pages"] + (round(per_byte(counts["pages"]) * left) if left else 0)
            self.progress.update(tasks["pages"], total=max(total, counts["pages"], 1) if left or counts["pages"] else 1)
        if "emb" in tasks:
            # chunks parsed but not yet taken up, and those of the bytes not parsed yet, at the
            # share of chunks that needed the embedder so far
            share = counts["to_embed"] / counts["chunks_parsed"] if counts["chunks_parsed"] else 1.0
            ahead = counts["chunks_seen"] - counts["chunks_parsed"] + per_byte(counts["chunks_seen"]) * left
            est = counts["to_embed"] + round(max(ahead, 0) * share)
            self.progress.update(tasks["emb"], total=max(est, counts["embedded"], 1))


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
