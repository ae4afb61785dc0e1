"""Run reports: report.json (metrics, settings, versions, git revision), report.md, and a
self-contained report.html (figures embedded as base64 PNG), plus comparing two runs."""

from __future__ import annotations

import base64
import html
import io
import json
import subprocess
import time
from pathlib import Path

from ragkit.config import Settings
from ragkit.errors import UsageError

# metrics where lower is better (cost and latency); every other number: higher is better
LOWER_IS_BETTER_SUFFIX = ("_s_p50", "_s_p95", "_s_mean")
LOWER_IS_BETTER = {"prompt_tokens_mean", "prompt_tokens_p50", "prompt_tokens_p95", "completion_tokens_mean",
                   "nli_unparsed", "n_errors", "n_missing", "abstain_rate", "citations_inferred_share",
                   "tokens_to_evidence_mean", "unsupported_claim_share", "wrongly_refused", "wrongly_refused_rate"}
# properties of the set or the run, not of the system: shown, never flagged
NOT_COMPARED = {"n_questions", "n_answered", "cached_tokens_mean", "abstain_rate", "completion_tokens_mean",
                "nli_majority_accuracy", "claims_per_answer", "n_claims_cited_marked", "n_claims_cited_inferred",
                "n_answerable", "n_supported", "n_unverified", "n_not_found", "unverified_with_evidence"}
RATE_METRICS = ("evidence_strict", "mrr_strict", "evidence_within_1000_tokens", "evidence_within_2000_tokens",
                "gold_figure_at_5", "evidence_in_context", "page_hit", "page_hit_at_1", "page_hit_at_3", "mrr", "doc_recall",
                "answer_numbers_in_context", "answer_match", "token_f1", "nli_accuracy", "abstain_precision",
                "abstain_recall", "citation_precision", "valid_citation_rate", "nli_f1_contradiction", "nli_macro_f1",
                "quote_has_evidence", "passage_has_evidence", "claim_citation_precision", "inferred_claim_citation_precision")


def _versions() -> dict:
    from importlib.metadata import PackageNotFoundError, version

    out = {}
    for pkg in ("ragkit", "chromadb", "llama_cpp_python", "sentence-transformers", "torch", "transformers",
                "pypdfium2", "pydantic", "typer", "matplotlib"):
        try:
            out[pkg] = version(pkg)
        except PackageNotFoundError:
            out[pkg] = None
    import platform

    out["python"] = platform.python_version()
    return out


def _git() -> dict:
    root = Path(__file__).resolve().parents[2]
    try:
        rev = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, timeout=10)
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=root,
                               capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return {"revision": None, "dirty": None}
    if rev.returncode != 0:
        return {"revision": None, "dirty": None}
    return {"revision": rev.stdout.strip(), "dirty": bool(dirty.stdout.strip())}


def _settings_json(settings: Settings) -> dict:
    d = settings.model_dump(mode="json")
    gen = d.get("generator", {})
    if gen.get("api_key"):
        gen["api_key"] = "***"
    return d


def write_reports(out: Path, report: dict, settings: Settings) -> None:
    out = Path(out)
    report["settings"] = _settings_json(settings)
    report["versions"] = _versions()
    report["git"] = _git()
    report["created"] = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    (out / "report.json").write_text(json.dumps(report, ensure_ascii=False, indent=2) + "\n", encoding="utf-8")
    (out / "report.md").write_text(render_md(report), encoding="utf-8")
    (out / "report.html").write_text(render_html(report), encoding="utf-8")


# ---------------------------------------------------------------------- text

def fmt(v) -> str:
    if v is None:
        return "–"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, float):
        return f"{v:.3f}" if abs(v) < 100 else f"{v:.0f}"
    return str(v)


def miss_note(m: dict) -> str | None:
    """The line a report opens with when questions errored or were not answered: they
    are counted as misses in every metric they would have counted for."""
    n, err, missing = m.get("n_questions", 0), m.get("n_errors", 0), m.get("n_missing", 0)
    parts = []
    if err:
        parts.append(f"{err} of {n} questions errored")
    if missing:
        parts.append(f"{missing} of {n} questions were not answered")
    if not parts:
        return None
    return "; ".join(parts) + "; counted as misses"


def rows_line(rows: dict) -> str:
    """Which row files the run folder holds (rows.csv, rows.xlsx), and why one is not there."""
    names = " and ".join(n for n in (rows.get("csv"), rows.get("xlsx")) if n)
    return f"one row per question: {names}" + (f" ({rows['note']})" if rows.get("note") else "")


def _notes(report: dict) -> list[str]:
    notes = report.get("notes")
    if notes is None:  # a report written before notes existed
        note = miss_note(report.get("metrics", {}))
        notes = [note] if note else []
    return list(notes)


def _failures_first(rows: list[dict]) -> list[dict]:
    return sorted(rows, key=lambda r: (not r.get("failed"), r.get("status") == "ok", r["id"]))


def render_md(report: dict) -> str:
    m = report["metrics"]
    run = report.get("run", {})
    lines = [f"# Eval report: {Path(run.get('set', '?')).name}", ""]
    for note in _notes(report):
        lines += [f"> **{note}** (every metric they would have counted for; n_errors / n_missing below)", ""]
    lines.append(f"- mode: {'retrieval only' if run.get('retrieval_only') else 'generating'}; questions {m['n_questions']}, "
                 f"answered {m['n_answered']}, errors {m['n_errors']}")
    gen = report.get("settings", {}).get("generator", {})
    lines.append(f"- generator {gen.get('model')} n_ctx {gen.get('n_ctx')} max_tokens {gen.get('max_tokens')}; "
                 f"top_k {report.get('settings', {}).get('retrieve', {}).get('top_k')}; git {str(report.get('git', {}).get('revision'))[:10]}"
                 f"{' (dirty)' if report.get('git', {}).get('dirty') else ''}")
    lines.append(f"- projected prefill at {report.get('prompt_rate_tok_s')} tok/s (generator.prompt_rate_tok_s)")
    if report.get("rows"):  # one row per question for a spreadsheet (ragkit.eval.rows)
        lines.append(f"- {rows_line(report['rows'])}")
    lines += ["", "| metric | value |", "|---|---|"]
    for k, v in m.items():
        lines.append(f"| {k} | {fmt(v)} |")
    nli = report.get("nli")
    if nli:
        lines += ["", "## NLI", "", "| class | precision | recall | F1 | support | predicted |", "|---|---|---|---|---|---|"]
        for c, s in nli["per_class"].items():
            lines.append(f"| {c} | {fmt(s['precision'])} | {fmt(s['recall'])} | {fmt(s['f1'])} | {s['support']} | {s['predicted']} |")
        lines += ["", f"Accuracy {fmt(nli.get('accuracy'))}; always answering the majority class "
                  f"({nli.get('majority_class', '?')}) scores {fmt(nli.get('majority_accuracy'))}. "
                  f"Macro F1 {fmt(nli.get('macro_f1'))} (a class with gold items and no prediction has F1 0)."]
    if report.get("by_tag"):
        keys = [k for k in next(iter(report["by_tag"].values()))]
        lines += ["", "## By tag", "", "| tag | " + " | ".join(keys) + " |", "|---" * (len(keys) + 1) + "|"]
        for t, s in report["by_tag"].items():
            lines.append(f"| {t} | " + " | ".join(fmt(s[k]) for k in keys) + " |")
    rows = _failures_first(report["questions"])
    lines += ["", "## Questions (failures first)", "", "| id | status | why | evidence rank | page hit | prompt tok | answer |",
              "|---|---|---|---|---|---|---|"]
    for r in rows:
        ans = (r.get("answer") or "").replace("\n", " ").replace("|", "\\|")[:120]
        lines.append(f"| {r['id']} | {r.get('status')} | {r.get('why', '')} | {fmt(r.get('evidence_rank'))} | "
                     f"{fmt(r.get('page_hit'))} | {fmt(r.get('prompt_tokens'))} | {ans} |")
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------- html

def _png(fig) -> str:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90, bbox_inches="tight")
    import matplotlib.pyplot as plt

    plt.close(fig)
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode("ascii")


def figures(report: dict) -> list[tuple[str, str]]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out: list[tuple[str, str]] = []
    m = report["metrics"]
    rates = [(k, m[k]) for k in RATE_METRICS if m.get(k) is not None]
    if rates:
        fig, ax = plt.subplots(figsize=(8, 0.35 * len(rates) + 1))
        names = [k for k, _ in rates][::-1]
        vals = [v for _, v in rates][::-1]
        bars = ax.barh(names, vals, color="#4a7bb7")
        for b, v in zip(bars, vals):
            inside = v > 0.85
            ax.text(v - 0.01 if inside else v + 0.01, b.get_y() + b.get_height() / 2, f"{v:.2f}", va="center",
                    ha="right" if inside else "left", fontsize=8, color="white" if inside else "black")
        ax.set_xlim(0, 1)
        ax.set_title("Quality metrics (higher is better)")
        out.append(("Quality metrics", _png(fig)))
    rows = [r for r in report["questions"] if r.get("status") == "ok"]
    stages = [s for s in ("retrieve_s", "prompt_s", "ttft_s", "generate_s", "total_s")
              if any(s in r.get("timings", {}) for r in rows)]
    if stages:
        fig, ax = plt.subplots(figsize=(8, 3.2))
        data = [[r["timings"][s] for r in rows if s in r["timings"]] for s in stages]
        ax.boxplot(data)
        ax.set_xticks(range(1, len(stages) + 1), stages)
        ax.set_ylabel("seconds")
        ax.set_title("Latency per stage (box: p25-p75, whiskers 1.5 IQR)")
        out.append(("Latency", _png(fig)))
    if rows:
        fig, ax = plt.subplots(figsize=(8, 3.2))
        toks = [r.get("prompt_tokens") or 0 for r in rows]
        cached = [r.get("cached_tokens") or 0 for r in rows]
        xs = range(len(rows))
        ax.bar(xs, toks, color="#9bb7d4", label="prompt tokens")
        if any(cached):
            ax.bar(xs, cached, color="#2e5c8a", label="of which cached")
        from matplotlib.ticker import MaxNLocator

        if len(rows) <= 25:
            ax.set_xticks(list(xs), [r["id"][:28] for r in rows], rotation=60, ha="right", fontsize=7)
        else:
            ax.xaxis.set_major_locator(MaxNLocator(integer=True))
            ax.set_xlabel("question (set order)")
        ax.set_ylabel("tokens")
        rate = report.get("prompt_rate_tok_s") or 106.0
        sec = ax.secondary_yaxis("right", functions=(lambda t: t / rate, lambda s: s * rate))
        sec.set_ylabel(f"projected prefill s @ {rate:g} tok/s")
        ax.legend(loc="upper left", fontsize=8)
        ax.set_title("Prompt tokens per question")
        out.append(("Tokens", _png(fig)))
    return out


_CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,sans-serif;margin:24px;color:#222;max-width:1150px}
h1{font-size:22px} h2{font-size:17px;margin-top:28px}
table{border-collapse:collapse;font-size:13px;width:100%} td,th{border:1px solid #ccc;padding:3px 6px;text-align:left;vertical-align:top}
th{background:#f0f3f7} tr.fail td{background:#fff1f0} tr.err td{background:#fde2e1}
.kv td:first-child{font-family:monospace;width:260px} .muted{color:#777;font-size:12px}
img{max-width:100%;border:1px solid #eee;margin:6px 0} details summary{cursor:pointer}
pre{white-space:pre-wrap;font-size:12px;background:#f7f7f7;padding:6px;margin:4px 0}
.warn{background:#fde2e1;border:1px solid #e0a0a0;padding:6px 8px}
"""


def render_html(report: dict) -> str:
    e = html.escape
    m = report["metrics"]
    run = report.get("run", {})
    gen = report.get("settings", {}).get("generator", {})
    git = report.get("git", {})
    parts = [f"<!doctype html><html><head><meta charset='utf-8'><title>ragkit eval: {e(Path(run.get('set', '?')).name)}</title>"
             f"<style>{_CSS}</style></head><body>"]
    parts.append(f"<h1>ragkit eval: {e(Path(run.get('set', '?')).name)}</h1>")
    for note in _notes(report):
        parts.append(f"<p class='warn'><b>{e(note)}</b> (every metric they would have counted for; n_errors / "
                     f"n_missing below)</p>")
    parts.append(
        f"<p class='muted'>{'retrieval only' if run.get('retrieval_only') else 'generating'} · {m['n_questions']} questions, "
        f"{m['n_answered']} answered, {m['n_errors']} errors · generator {e(str(gen.get('model')))} n_ctx {gen.get('n_ctx')} "
        f"max_tokens {gen.get('max_tokens')} · git {e(str(git.get('revision'))[:10])}{' (dirty)' if git.get('dirty') else ''} · "
        f"{e(str(report.get('created', '')))}</p>")
    if report.get("rows"):
        parts.append(f"<p class='muted'>{e(rows_line(report['rows']))}</p>")
    for title, src in figures(report):
        parts.append(f"<h2>{e(title)}</h2><img alt='{e(title)}' src='{src}'>")
    parts.append("<h2>Metrics</h2><table class='kv'>")
    for k, v in m.items():
        parts.append(f"<tr><td>{e(k)}</td><td>{e(fmt(v))}</td></tr>")
    parts.append("</table>")
    nli = report.get("nli")
    if nli:
        parts.append("<h2>NLI per class</h2><table><tr><th>class</th><th>precision</th><th>recall</th><th>F1</th><th>support</th><th>predicted</th></tr>")
        for c, s in nli["per_class"].items():
            parts.append(f"<tr><td>{c}</td><td>{fmt(s['precision'])}</td><td>{fmt(s['recall'])}</td><td>{fmt(s['f1'])}</td>"
                         f"<td>{s['support']}</td><td>{s['predicted']}</td></tr>")
        parts.append("</table>")
        parts.append(f"<p>Accuracy {fmt(nli.get('accuracy'))}; always answering the majority class "
                     f"({e(str(nli.get('majority_class', '?')))}) scores {fmt(nli.get('majority_accuracy'))}. "
                     f"Macro F1 {fmt(nli.get('macro_f1'))} (a class with gold items and no prediction has F1 0).</p>")
    if report.get("by_tag"):
        keys = list(next(iter(report["by_tag"].values())))
        parts.append("<h2>By tag</h2><table><tr><th>tag</th>" + "".join(f"<th>{e(k)}</th>" for k in keys) + "</tr>")
        for t, s in report["by_tag"].items():
            parts.append(f"<tr><td>{e(t)}</td>" + "".join(f"<td>{e(fmt(s[k]))}</td>" for k in keys) + "</tr>")
        parts.append("</table>")
    rows = _failures_first(report["questions"])
    parts.append(f"<h2>Questions ({sum(bool(r.get('failed')) for r in rows)} failing first)</h2>"
                 "<table><tr><th>id</th><th>status</th><th>why</th><th>evidence rank</th><th>page hit</th>"
                 "<th>answer / NLI</th><th>top context</th><th>prompt tok</th><th>total s</th><th>question and answer</th></tr>")
    for r in rows:
        cls = "err" if r.get("status") != "ok" else ("fail" if r.get("failed") else "")
        verdict = r.get("nli_pred") if r.get("nli_gold") else (fmt(r.get("answer_match")) if "answer_match" in r else "–")
        if r.get("nli_gold"):
            verdict = f"{r.get('nli_pred') or 'unparsed'} / gold {r['nli_gold']}"
        qa = f"<details><summary>{e(r['question'][:90])}</summary><pre>{e(r['question'])}</pre>"
        if r.get("answer"):
            qa += f"<pre>{e(r['answer'])}</pre>"
        qa += "</details>"
        parts.append(
            f"<tr class='{cls}'><td>{e(r['id'])}</td><td>{e(str(r.get('status')))}</td><td>{e(r.get('why', ''))}</td>"
            f"<td>{fmt(r.get('evidence_rank'))}</td><td>{fmt(r.get('page_hit'))}</td><td>{e(str(verdict))}</td>"
            f"<td>{e(r.get('top_context') or '–')}</td><td>{fmt(r.get('prompt_tokens'))}</td><td>{fmt(r.get('timings', {}).get('total_s'))}</td><td>{qa}</td></tr>")
    parts.append("</table>")
    parts.append("<h2>Settings and versions</h2><pre>" + e(json.dumps(
        {"run": run, "versions": report.get("versions"), "git": git, "settings": report.get("settings")}, indent=2)) + "</pre>")
    parts.append("</body></html>")
    return "\n".join(parts)


# ---------------------------------------------------------------------- compare

def load_report(path: Path) -> dict:
    p = Path(path)
    if p.is_dir():
        p = p / "report.json"
    try:
        return json.loads(p.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise UsageError(f"no report at {p}", hint="give a run folder made by `ragkit eval run`") from None
    except (OSError, json.JSONDecodeError) as exc:
        raise UsageError(f"cannot read report {p}: {exc}") from None


def lower_is_better(key: str) -> bool:
    return key in LOWER_IS_BETTER or key.endswith(LOWER_IS_BETTER_SUFFIX)


def is_wall_clock(key: str) -> bool:
    return key.endswith(("_s_p50", "_s_p95")) and not key.startswith("projected_")


def compare(a: dict, b: dict, *, threshold: float = 0.02, cost_threshold: float = 0.10, latency: bool = False) -> dict:
    """Deltas B - A for every metric both runs have. A quality metric (0..1) regresses when
    it drops by more than `threshold` (absolute); a lower-is-better metric (tokens,
    projected prefill, unparsed labels) regresses when it grows by more than
    `cost_threshold` (relative), or, from a base of 0 where a relative change has no
    meaning, by more than `threshold` (absolute: `nli_unparsed` 0 -> 0.05). Measured
    wall-clock latencies are noisy on a shared machine: they are shown, and only flagged
    with `latency=True`."""
    ma, mb = a.get("metrics", {}), b.get("metrics", {})
    rows = []
    for k in ma:
        if k not in mb or k in NOT_COMPARED:
            continue
        va, vb = ma[k], mb[k]
        if not isinstance(va, (int, float)) or not isinstance(vb, (int, float)) or isinstance(va, bool):
            rows.append({"metric": k, "a": va, "b": vb, "delta": None, "regression": False})
            continue
        delta = vb - va
        if k in ("n_errors", "n_missing"):
            reg = vb > va
        elif is_wall_clock(k) and not latency:
            reg = False
        elif lower_is_better(k):
            reg = (vb - va) / va > cost_threshold if va > 0 else delta > threshold
        else:
            reg = -delta > threshold
        rows.append({"metric": k, "a": va, "b": vb, "delta": delta, "regression": bool(reg)})
    same_set = a.get("run", {}).get("set_digest") == b.get("run", {}).get("set_digest")
    same_mode = a.get("run", {}).get("retrieval_only") == b.get("run", {}).get("retrieval_only")
    return {"rows": rows, "regressions": [r["metric"] for r in rows if r["regression"]], "same_set": same_set,
            "same_mode": same_mode, "latency_checked": latency,
            "threshold": threshold, "cost_threshold": cost_threshold}
