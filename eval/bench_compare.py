"""Two checkouts side by side in one run: ingest, retrieval at 100K chunks, time to first
token (prints figures; not a test). How a change shows it made nothing slower.

    .venv/bin/python eval/bench_compare.py OLD NEW [--parts ingest,retrieval,ttft] [--repeat 3]
        [--docs DIR] [--chunks 100000] [--set eval/sets/fda-guidance.jsonl --corpus FILE...]
        [--work DIR] [--json]

OLD and NEW are git revisions of this repository (a detached worktree is made for each under
--work) or checkout folders. Both run on this checkout's .venv (the same torch, Chroma and
llama.cpp builds), each with its own source first on PYTHONPATH, in its own subprocesses,
offline. The runs alternate (OLD NEW, then NEW OLD, ...) so that a machine getting slower or
a warmer page cache favours neither side.

- ingest: ingest() of the 12 SEC 10-Q filings into a fresh store, in a process of its own with
  the checkout's settings and its embedder (MiniLM) loaded before the clock, as bench_peers.py
  times it; with --peer-python, LlamaIndex's default pipeline once per repeat too (bench_peers.py's
  side) and each ingest as a ratio to it (the issue-41 target: at most 0.4);
- retrieval: each checkout's own `eval/bench_retrieval.py --chunks N --json` on its own store of
  N chunks (built once per checkout under --work and kept: the store format moves between
  versions), hybrid p50 / p95, one document p50 and the process's resident memory;
- ttft: each checkout ingests --corpus into its own store once, then `ragkit eval run SET
  --store S` with the default (laptop) profile, one process for the set; a question's time to
  first token is retrieve_s + prompt_s + ttft_s from its record (retrieval, the reranker stage
  where there is one, building the prompt, prefill). The first question of each run warms the
  generator and is left out.

Printed per figure: OLD and NEW medians over the repeats and NEW / OLD (median of the per-repeat
ratios, with their range). `--json` prints the same as one object.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PY = ROOT / ".venv" / "bin" / "python"
SHARED = ROOT.parent / "shared" / "corpora"
DOCS = SHARED / "sec-10q-docugami" / "docs"
TTFT_SET = ROOT / "eval" / "sets" / "fda-guidance.jsonl"
TTFT_CORPUS = sorted((SHARED / "regulatory" / "fda-guidance" / "rendered").glob("*.pdf"))  # the set's documents
OFFLINE = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
           "ANONYMIZED_TELEMETRY": "False", "DO_NOT_TRACK": "1", "TQDM_DISABLE": "1"}


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def checkout(rev: str, work: Path) -> Path:
    """A folder holding `rev`: itself when it is a folder, else a detached worktree of it."""
    p = Path(rev)
    if p.is_dir() and (p / "ragkit").is_dir():
        return p.resolve()
    sha = subprocess.run(["git", "rev-parse", "--verify", f"{rev}^{{commit}}"], cwd=ROOT, check=True,
                         capture_output=True, text=True).stdout.strip()
    tree = work / f"tree-{sha[:10]}"
    if not (tree / "ragkit").is_dir():
        subprocess.run(["git", "worktree", "add", "--detach", str(tree), sha], cwd=ROOT, check=True,
                       capture_output=True)
    return tree


def env_for(tree: Path, **extra: str) -> dict:
    env = {**os.environ, **OFFLINE, **extra, "PYTHONPATH": str(tree)}
    env.pop("RAGKIT_STORE", None)
    env.pop("RAGKIT_PROFILE", None)
    return env


def run(cmd: list[str], tree: Path, **extra: str) -> tuple[float, str]:
    t0 = time.perf_counter()
    p = subprocess.run(cmd, cwd=tree, env=env_for(tree, **extra), capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if p.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} in {tree} exited {p.returncode}:\n{p.stderr[-3000:]}")
    return wall, p.stdout


# The ingest driver, run in each checkout's own process: its settings, its embedder loaded and
# warmed before the clock (a one-off, as in bench_peers.py), then ingest() into a fresh store.
# Versions before the Session cached the embedder per process; later ones take it as an argument.
INGEST_DRIVER = r"""
import inspect, json, sys, time
from pathlib import Path
import ragkit
from ragkit.config import load_settings
from ragkit.embed import load_embedder
from ragkit.ingest import ingest
docs, store = Path(sys.argv[1]), Path(sys.argv[2])
settings = load_settings(store=store, embed={"model": "minilm"}, cache_dir=store / "cache")
emb = load_embedder(settings)
emb.embed_documents(["warm-up"])
kw = {"embedder": emb} if "embedder" in inspect.signature(ingest).parameters else {}
t0 = time.perf_counter()
rep = ingest(sorted(docs.glob("*.pdf")), settings, **kw)
wall = time.perf_counter() - t0
print(json.dumps({"ingest_s": round(wall, 2), "chunks": rep.chunks, "failed": len(rep.failed)}))
"""


def ingest_once(tree: Path, docs: Path, work: Path) -> dict:
    store = Path(tempfile.mkdtemp(prefix="store-", dir=work))
    try:
        _, out = run([str(PY), "-c", INGEST_DRIVER, str(docs), str(store)], tree)
        return json.loads(out.strip().splitlines()[-1])
    finally:
        shutil.rmtree(store, ignore_errors=True)


def peer_once(peer_python: str, docs: Path, work: Path) -> float:
    """LlamaIndex's default pipeline on the same PDFs and model (eval/bench_peers.py's side),
    its ingest wall time with the model loaded before the clock."""
    from ragkit.models import resolve

    side = Path(tempfile.mkdtemp(prefix="peer-", dir=work))
    try:
        (side / "qvecs.json").write_text("[]")
        model_dir = resolve("minilm", "embedder", Path.home() / ".cache" / "ragkit")
        env = {**os.environ, **OFFLINE}
        env.pop("PYTHONPATH", None)
        p = subprocess.run([peer_python, str(ROOT / "eval" / "bench_peers.py"), "--side", "llamaindex", "--docs", str(docs),
                            "--work", str(side), "--model-dir", str(model_dir)], env=env, capture_output=True, text=True)
        if p.returncode != 0:
            raise SystemExit(f"the LlamaIndex side exited {p.returncode}:\n{p.stderr[-3000:]}")
        return round(json.loads((side / "llamaindex.json").read_text())["wall_s"], 2)
    finally:
        shutil.rmtree(side, ignore_errors=True)


def retrieval_once(tree: Path, chunks: int, work: Path, label: str) -> dict:
    bench = work / f"retrieval-{label}"
    _, out = run([str(PY), str(tree / "eval" / "bench_retrieval.py"), "--chunks", str(chunks), "--json"], tree,
                 RAGKIT_BENCH_DIR=str(bench))
    r = json.loads(out)[str(chunks)]
    return {k: r[k] for k in ("hybrid_p50_ms", "hybrid_p95_ms", "one_doc_p50_ms", "dense_p50_ms", "bm25_p50_ms",
                              "rss_mb")}


def ttft_once(tree: Path, qset: Path, corpus: list[Path], work: Path, label: str) -> dict:
    store = work / f"ttft-store-{label}"
    if not (store / ".ragkit-ready").exists():
        shutil.rmtree(store, ignore_errors=True)
        run([str(PY), "-m", "ragkit.cli", "ingest", *map(str, corpus), "--store", str(store), "--json"], tree)
        (store / ".ragkit-ready").write_text("")
    out_dir = Path(tempfile.mkdtemp(prefix="ttft-", dir=work))
    try:
        run([str(PY), "-m", "ragkit.cli", "eval", "run", str(qset), "--store", str(store), "--out", str(out_dir),
             "--json"], tree)
        recs = [json.loads(line) for line in (out_dir / "answers.jsonl").read_text().splitlines() if line.strip()]
    finally:
        shutil.rmtree(out_dir, ignore_errors=True)
    recs = recs[1:]  # the first question warms the generator
    t = [r.get("timings") or {} for r in recs]
    first = [x.get("retrieve_s", 0) + x.get("prompt_s", 0) + x.get("ttft_s", 0) for x in t if "ttft_s" in x]
    return {"ttft_p50_s": round(statistics.median(first), 2),
            "retrieve_p50_s": round(statistics.median(x.get("retrieve_s", 0) for x in t), 3),
            # the cross-encoder stage inside retrieve_s (0 where the checkout has none)
            "rerank_p50_s": round(statistics.median(x.get("rerank_s", 0) for x in t), 3),
            "prefill_p50_s": round(statistics.median(x.get("ttft_s", 0) for x in t), 2),
            "prompt_tokens_p50": statistics.median(int(r.get("prompt_tokens") or 0) for r in recs),
            "questions": len(first)}


def summarize(runs: dict[str, list[dict]]) -> dict:
    out: dict[str, dict] = {}
    keys = [k for k in runs["old"][0] if isinstance(runs["old"][0][k], (int, float))]
    for k in keys:
        old = [r[k] for r in runs["old"]]
        new = [r[k] for r in runs["new"]]
        ratios = [n / o for o, n in zip(old, new) if o]
        out[k] = {"old": round(statistics.median(old), 3), "new": round(statistics.median(new), 3),
                  "ratio": round(statistics.median(ratios), 3) if ratios else None,
                  "ratio_min": round(min(ratios), 3) if ratios else None,
                  "ratio_max": round(max(ratios), 3) if ratios else None,
                  "old_runs": old, "new_runs": new}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("old")
    ap.add_argument("new")
    ap.add_argument("--parts", default="ingest,retrieval,ttft")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--docs", type=Path, default=DOCS)
    ap.add_argument("--chunks", type=int, default=100000)
    ap.add_argument("--set", dest="qset", type=Path, default=TTFT_SET)
    ap.add_argument("--corpus", type=Path, nargs="+", default=TTFT_CORPUS)
    ap.add_argument("--work", type=Path, default=Path("/tmp/ragkit-bench-compare"))
    ap.add_argument("--peer-python", help="a python with LlamaIndex (eval/bench_peers.py): ingest also as a ratio to it, "
                                          "the peer run once per repeat beside the two checkouts")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    a.work.mkdir(parents=True, exist_ok=True)
    trees = {"old": checkout(a.old, a.work), "new": checkout(a.new, a.work)}
    labels = {side: trees[side].name if Path(getattr(a, side)).is_dir() else getattr(a, side) for side in trees}
    parts = [p.strip() for p in a.parts.split(",") if p.strip()]
    result: dict[str, dict] = {"old": str(trees["old"]), "new": str(trees["new"])}
    for part in parts:
        runs: dict[str, list[dict]] = {"old": [], "new": []}
        peer: list[float] = []
        for i in range(a.repeat):
            if part == "ingest" and a.peer_python:
                log(f"ingest {i + 1}/{a.repeat}: LlamaIndex")
                peer.append(peer_once(a.peer_python, a.docs, a.work))
                log(f"  {peer[-1]} s")
            for side in (("old", "new") if i % 2 == 0 else ("new", "old")):
                tag = f"{side}-{trees[side].name}"
                log(f"{part} {i + 1}/{a.repeat}: {side} ({labels[side]})")
                if part == "ingest":
                    r = ingest_once(trees[side], a.docs, a.work)
                elif part == "retrieval":
                    r = retrieval_once(trees[side], a.chunks, a.work, tag)
                elif part == "ttft":
                    r = ttft_once(trees[side], a.qset, a.corpus, a.work, tag)
                else:
                    raise SystemExit(f"unknown part {part!r} (ingest, retrieval, ttft)")
                if peer:
                    r["per_llamaindex"] = round(r["ingest_s"] / peer[-1], 3)
                log(f"  {r}")
                runs[side].append(r)
        result[part] = summarize(runs)
        if peer:
            result[part]["llamaindex_s"] = {"runs": peer, "median": round(statistics.median(peer), 2)}
    if a.json:
        print(json.dumps(result, indent=1))
        return
    print(f"OLD {labels['old']} ({trees['old']})\nNEW {labels['new']} ({trees['new']})\n")
    print(f"{'figure':<22} {'OLD':>10} {'NEW':>10} {'NEW/OLD':>8}  range")
    for part in parts:
        for k, s in result[part].items():
            if "ratio" not in s:
                print(f"{part + '.' + k:<22} {s['median']:>10}  (runs {s['runs']})")
                continue
            rng = f"{s['ratio_min']:.2f}-{s['ratio_max']:.2f}" if s["ratio"] is not None else ""
            ratio = f"{s['ratio']:.2f}" if s["ratio"] is not None else "-"
            print(f"{part + '.' + k:<22} {s['old']:>10} {s['new']:>10} {ratio:>8}  {rng}")


if __name__ == "__main__":
    main()
