"""`ragkit eval`: convert labelled sets, run a set against a store, compare two runs."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, List, Optional

import typer

eval_app = typer.Typer(help="Evaluate: convert labelled sets, run them, compare runs.", no_args_is_help=True)

JsonOpt = typer.Option(False, "--json", help="print machine-readable JSON on stdout")


def register(app: typer.Typer) -> None:
    app.add_typer(eval_app, name="eval")


def _cli():
    """The shared command helpers (`_fail`, `_print_json`, `err`, `out`)."""
    from ragkit.commands import _common

    return _common


@eval_app.command("convert")
def convert_cmd(
    name: str = typer.Argument(..., help="contractnli-dev, contractnli-rendered8, cuad, sec-10q, sec-10q-aapl-amzn-nvda"),
    out: Path = typer.Option(..., "--out", help="the JSONL file to write"),
    corpora: Optional[Path] = typer.Option(None, "--corpora", help="the shared corpora folder (default: ../shared/corpora)"),
    as_json: bool = JsonOpt,
) -> None:
    """Convert a labelled set from the shared corpora into ragkit's eval JSONL."""
    from ragkit.errors import RagkitError
    from ragkit.eval.sets import convert, write_set

    cli = _cli()
    try:
        items = convert(name, corpora)
        n = write_set(items, out)
    except RagkitError as exc:
        cli._fail(exc, as_json)
        return
    except OSError as exc:
        from ragkit.errors import UsageError

        cli._fail(UsageError(f"cannot write {out}: {exc.strerror or exc}"), as_json)
        return
    if as_json:
        cli._print_json({"set": name, "out": str(out), "questions": n})
    else:
        cli.err.print(f"wrote {n} questions to {out}", highlight=False)


@eval_app.command("run")
def run_cmd(
    set_path: Path = typer.Argument(..., metavar="SET", help="a set file (JSONL), e.g. eval/sets/nda-demo.jsonl"),
    corpus: List[Path] = typer.Option([], "--corpus", help="documents to ingest first (into RUN_DIR/store unless --store); repeatable"),
    store: Optional[Path] = typer.Option(None, "--store", help="an existing store to ask (or to ingest --corpus into)"),
    profile: Optional[str] = typer.Option(None, "--profile", help="settings profile: laptop (default) or kimi-k2"),
    limit: Optional[int] = typer.Option(None, "--limit", help="only the first N questions of the set"),
    retrieval_only: bool = typer.Option(False, "--retrieval-only", help="build prompts only and score retrieval (no generation)"),
    concurrency: int = typer.Option(1, "--concurrency", help="questions in flight at once (1 for the in-process llama.cpp backend)"),
    out: Path = typer.Option(..., "--out", help="run folder: answers.jsonl (checkpoint), report.json/.md/.html, rows.csv/.xlsx"),
    cluster: Optional[str] = typer.Option(None, "--cluster", help="answer on this Ray cluster (host:port of its head, or auto)"),
    as_json: bool = JsonOpt,
) -> None:
    """Answer every question of a set, checkpointing as it goes (rerun to resume), then score and report."""
    from ragkit.errors import RagkitError
    from ragkit.eval.run import RunOptions, run_eval

    cli = _cli()
    progress = _questions_progress(cli.err)
    try:
        with progress:
            report = run_eval(
                RunOptions(set_path=set_path, out=out, corpus=list(corpus), store=store, profile=profile, limit=limit,
                           retrieval_only=retrieval_only, concurrency=concurrency),
                on_event=_RunEvents(cli.err, progress), answer_many_for=lambda settings: _cluster_answerer(cluster, settings),
            )
    except RagkitError as exc:
        cli._fail(exc, as_json)
        return
    except KeyboardInterrupt:
        cli.err.print("interrupted: answers so far are saved; run the same command again to continue")
        raise typer.Exit(130)
    if as_json:
        cli._print_json({"out": str(out), "notes": report.get("notes", []), "metrics": report["metrics"],
                         "nli": report.get("nli"), "files": report["files"], "rows": report["rows"]})
        return
    _say_report(cli, report, out)


def _questions_progress(err):
    """The questions' progress bar on stderr (count, elapsed, eta), drawn only on a terminal."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

    return Progress(
        TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
        TextColumn("eta"), TimeRemainingColumn(), console=err, transient=False, disable=not err.is_terminal,
    )


class _RunEvents:
    """run_eval's events said on stderr: the ingest of --corpus, notes, and each question
    answered (on the bar, or a line with elapsed and eta where stderr is not a terminal)."""

    def __init__(self, err, progress) -> None:
        self.err = err
        self.progress = progress
        self.state: dict[str, Any] = {}

    def __call__(self, kind: str, info: dict) -> None:
        err = self.err
        if kind == "ingest":
            err.print(f"ingesting {', '.join(info['paths'])} into {info['store']}", highlight=False)
        elif kind == "ingested":
            err.print(f"  added {info['added']}, updated {info['updated']}, unchanged {info['unchanged']}, failed {len(info['failed'])}", highlight=False)
        elif kind == "note":
            err.print(f"[yellow]note:[/] {info['message']}", highlight=False)
        elif kind == "start":
            self.start(info)
        elif kind == "answered":
            self.answered(info)
        elif kind == "done":
            self.progress.stop()

    def start(self, info: dict) -> None:
        """The run's questions counted (resuming: those already answered) and its bar started."""
        state = self.state
        state.update(total=info["total"], done=info["done"], t0=time.monotonic(), n=0)
        if info["done"]:
            self.err.print(f"resuming: {info['done']} of {info['total']} already answered", highlight=False)
        state["task"] = self.progress.add_task("questions", total=info["total"], completed=info["done"])

    def answered(self, info: dict) -> None:
        """One question answered: the bar advanced, an error said, and off a terminal a line
        with the count, elapsed time and eta (from this run's own pace)."""
        state = self.state
        state["n"] += 1
        state["done"] += 1
        self.progress.advance(state["task"])
        if info["status"] != "ok":
            self.progress.console.print(f"[red]  error[/] {info['id']}: {info['error']}", highlight=False)
        if not self.err.is_terminal:
            el = time.monotonic() - state["t0"]
            left = state["total"] - state["done"]
            eta = el / state["n"] * left
            self.err.print(f"[{state['done']}/{state['total']}] {info['id']} {info['status']} "
                           f"elapsed {el:.0f}s eta {eta:.0f}s", highlight=False)


def _say_report(cli, report: dict, out: Path) -> None:
    """The run's notes, then its metrics as a table, where the report went and the rows."""
    from rich.markup import escape
    from rich.table import Table

    from ragkit.eval.report import fmt

    metrics = report["metrics"]
    for note in report.get("notes", []):  # before the figures: errored questions are misses in them
        cli.out.print(f"[bold red]{escape(note)}[/] (every metric they would have counted for)", highlight=False)
    table = Table("metric", "value")
    for k, v in metrics.items():
        if v is not None:
            table.add_row(k, fmt(v))
    cli.out.print(table)
    cli.err.print(f"report: {out / 'report.html'}", highlight=False)
    _say_rows(cli, report)


def _cluster_answerer(cluster: Optional[str], settings):
    """The Ray cluster's answerer when --cluster (or the run's setting cluster.address, read
    from the settings the run resolved: its --profile and --store) names one, else None (local)."""
    if cluster is None:
        cluster = settings.cluster.address
    if not cluster:
        return None
    from ragkit.cluster.eval import answer_on_cluster

    return answer_on_cluster(cluster)


def _say_rows(cli, report: dict) -> None:
    """Where the rows for a spreadsheet went, and why the xlsx did not when it did not."""
    files = report["files"]
    names = [files[k] for k in ("rows_csv", "rows_xlsx") if files.get(k)]
    cli.err.print(f"rows: {', '.join(names)}", highlight=False)
    if report["rows"].get("note"):
        cli.err.print(f"[yellow]note:[/] {report['rows']['note']}", highlight=False)


@eval_app.command("compare")
def compare_cmd(
    run_a: Path = typer.Argument(..., help="baseline run folder (or its report.json)"),
    run_b: Path = typer.Argument(..., help="new run folder (or its report.json)"),
    threshold: float = typer.Option(0.02, "--threshold", help="a quality metric (0..1) that drops by more than this is a regression"),
    cost_threshold: float = typer.Option(0.10, "--cost-threshold", help="a token or projected-prefill metric that grows by more than this share is a regression"),
    latency: bool = typer.Option(False, "--latency", help="also flag measured latencies (p50/p95 per stage) that grow by more than --cost-threshold"),
    out: Optional[Path] = typer.Option(None, "--out", help="a folder to write compare_rows.csv/.xlsx into: every question of both runs side by side, with what changed"),
    as_json: bool = JsonOpt,
) -> None:
    """Print metric deltas B - A; exit 1 when a metric regressed by more than the threshold."""
    from ragkit.errors import RagkitError
    from ragkit.eval.report import compare, fmt, load_report

    cli = _cli()
    try:
        res = compare(load_report(run_a), load_report(run_b), threshold=threshold, cost_threshold=cost_threshold, latency=latency)
        if out is not None:
            from ragkit.eval.rows import write_compare_rows

            rows = write_compare_rows(out, run_a, run_b)
            res["files"] = rows.pop("files")
            res["compare_rows"] = rows
    except RagkitError as exc:
        cli._fail(exc, as_json)
        return
    res.setdefault("files", {})  # the row files written (with --out)
    if out is not None and not as_json:
        rows = res["compare_rows"]
        names = [p for p in res["files"].values() if p]
        cli.err.print(f"rows: {', '.join(names)} ({rows['n_changed']} of {rows['n_rows']} questions changed)", highlight=False)
        if rows["note"]:
            cli.err.print(f"[yellow]note:[/] {rows['note']}", highlight=False)
    if as_json:
        cli._print_json(res)
    else:
        from rich.table import Table

        if not res["same_set"]:
            cli.err.print("[yellow]warning:[/] the two runs used different sets (or set versions)")
        if not res["same_mode"]:
            cli.err.print("[yellow]warning:[/] one run is retrieval-only, the other generating")
        table = Table("metric", "A", "B", "delta", "")
        for r in res["rows"]:
            if r["a"] is None and r["b"] is None:
                continue
            d = r["delta"]
            table.add_row(r["metric"], fmt(r["a"]), fmt(r["b"]), "–" if d is None else f"{d:+.3f}",
                          "[red]REGRESSION[/]" if r["regression"] else "")
        cli.out.print(table)
        if res["regressions"]:
            cli.err.print(f"[red]regressions:[/] {', '.join(res['regressions'])}", highlight=False)
    raise typer.Exit(1 if res["regressions"] else 0)


@eval_app.command("rescore")
def rescore_cmd(
    run_dir: Path = typer.Argument(..., help="a run folder"),
    as_json: bool = JsonOpt,
) -> None:
    """Score a finished run folder again and rewrite its reports (no questions are asked)."""
    from ragkit.errors import RagkitError
    from ragkit.eval.run import rescore

    cli = _cli()
    try:
        report = rescore(run_dir)
    except RagkitError as exc:
        cli._fail(exc, as_json)
        return
    if as_json:
        cli._print_json({"out": str(run_dir), "metrics": report["metrics"], "files": report["files"], "rows": report["rows"]})
    else:
        cli.err.print(f"rewrote {run_dir / 'report.html'}", highlight=False)
        _say_rows(cli, report)
