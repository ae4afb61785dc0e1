"""Ingest on a local Ray cluster against the single-process ingest (prints figures; not a test).

    .venv/bin/python eval/bench_cluster.py [--docs DIR] [--nodes 1,2] [--json]
    .venv/bin/python eval/bench_cluster.py --slope --docs DIR     # Ray's cost per file
    .venv/bin/python eval/bench_cluster.py --eval 100 --docs DIR --set SET   # batch eval, one engine

For each node count: a loopback cluster of that many nodes (1 CPU each; ragkit.cluster.local),
then a fresh-store ingest of DIR on it (`ingest_on_cluster`), beside a fresh-store local ingest
(`ingest`, the embedder loaded before the clock). Printed: wall time, files/s, and the
difference per file. The cluster run pays fixed costs the local one does not: connecting the
driver, starting the embedder actors and loading a model in each (on the clock, as a user
pays them), so on a small corpus the difference is mostly those; Ray's own per-file cost is the
slope between two corpus sizes, not measured yet (the figure printed is an upper bound). Two cores
cannot show a speed-up: `project` gives the wall time for 30,000 filings on N nodes of K cores
from the measured per-file work and driver share (the model is in its docstring and eval/README.md).
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
import time
from pathlib import Path

import ragkit  # noqa: F401  (offline switches)

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--docs", type=Path, default=ROOT / "corpora" / "nda")
    ap.add_argument("--nodes", default="1,2")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--eval", type=int, default=0, metavar="N",
                    help="batch evaluation instead: N questions of --set over a store of DIR, answered through one "
                         "real llama_cpp.server engine, locally and on a 1-node cluster")
    ap.add_argument("--ray-per-file", type=float, default=None, metavar="S",
                    help="Ray's extra seconds a file for the projection (the --slope figure); default: the "
                         "2-node run's difference from the local one, fixed costs included (an upper bound)")
    ap.add_argument("--set", type=Path, default=ROOT / "eval" / "sets" / "sec-10q.jsonl")
    ap.add_argument("--slope", action="store_true",
                    help="Ray's own cost per file: the first half of DIR and all of it, locally (one parse worker "
                         "beside the embedder) and on a 1-node cluster; the fixed costs cancel in the difference")
    a = ap.parse_args()
    if a.eval:
        return eval_bench(a.docs, a.set, a.eval, a.json)
    if a.slope:
        return slope(a.docs, a.json)
    from ragkit.cluster import ingest_on_cluster, local
    from ragkit.config import load_settings
    from ragkit.embed import load_embedder
    from ragkit.ingest import ingest

    tmp = Path(tempfile.mkdtemp(prefix="rk-bench-cluster-"))
    out: dict = {"docs": str(a.docs), "runs": []}
    try:
        s = load_settings(store=tmp / "local")
        emb = load_embedder(s)
        emb.embed_documents(["warm up"])
        cpu0 = _cpu_s()
        t0 = time.perf_counter()
        rep = ingest([a.docs], s, overlap=False, embedder=emb)  # sequential: parse_s and embed_s are the per-file work
        wall = time.perf_counter() - t0
        cpu = _cpu_s() - cpu0  # core-seconds: the embedder's threads counted on every core they ran on
        files = rep.added
        tm = rep.timings
        out["local"] = {"wall_s": round(wall, 2), "cpu_s": round(cpu, 2), "files": files, "chunks": rep.chunks, "pages": rep.pages,
                        **{k: round(tm.get(k, 0.0), 2) for k in ("parse_s", "embed_s", "store_s", "index_s")}}
        for n in (int(x) for x in a.nodes.split(",")):
            cluster = local.start(Path(f"/tmp/rk-bench-ray-{n}"), nodes=n, cpus_per_node=1)
            try:
                s = load_settings(store=tmp / f"cluster{n}")
                t0 = time.perf_counter()
                rep = ingest_on_cluster([a.docs], s, cluster.address)
                cwall = time.perf_counter() - t0
            finally:
                cluster.stop(5)
                shutil.rmtree(f"/tmp/rk-bench-ray-{n}", ignore_errors=True)
            out["runs"].append({"nodes": n, "wall_s": round(cwall, 2), "files": rep.added, "chunks": rep.chunks,
                                "embed_actors": rep.timings.get("embed_actors"),
                                "extra_per_file_s": round((cwall - wall) / max(files, 1), 3),
                                "extra_per_chunk_s": round((cwall - wall) / max(rep.chunks, 1), 4)})
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    out["projection"] = project(out, over=a.ray_per_file)
    if a.json:
        print(json.dumps(out, indent=2))
        return
    lo = out["local"]
    print(f"{a.docs}: {lo['files']} files, {lo['pages']} pages, {lo['chunks']} chunks")
    print(f"  local (one process, model warm):  {lo['wall_s']:6.1f} s  {lo['files'] / lo['wall_s']:.2f} files/s")
    for r in out["runs"]:
        print(f"  cluster, {r['nodes']} node(s), {r['embed_actors']} actor(s): {r['wall_s']:6.1f} s  "
              f"{r['files'] / r['wall_s']:.2f} files/s  (+{r['extra_per_file_s']:.2f} s a file, "
              f"+{r['extra_per_chunk_s'] * 1000:.0f} ms a chunk, fixed costs included)")
    pr = out["projection"]
    print(f"projection for {pr['filings']} filings (model in eval/README.md): work {pr['work_per_file_s']:.2f} s a file, "
          f"driver {pr['driver_per_file_s']:.3f} s a file (bound {pr['driver_bound_h']:.1f} h)")
    for row in pr["rows"]:
        print(f"  N={row['nodes']:3d} K={row['cores']:2d}: {row['hours']:6.2f} h")


def _cpu_s() -> float:
    import resource

    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


def slope(docs: Path, as_json: bool) -> None:
    """Ray's per-file cost as a slope: wall(all) - wall(half) on the cluster against the same
    difference locally, over the files added. Startup, connection and model loads are paid
    in both runs of a pair, so they cancel."""
    from ragkit.cluster import ingest_on_cluster, local
    from ragkit.config import load_settings
    from ragkit.ingest import ingest

    files = sorted(p for p in docs.iterdir() if p.is_file())
    tmp = Path(tempfile.mkdtemp(prefix="rk-bench-slope-"))
    half = tmp / "half"
    half.mkdir()
    for p in files[: len(files) // 2]:
        shutil.copy(p, half / p.name)
    sets = {"half": (half, len(files) // 2), "all": (docs, len(files))}
    walls: dict = {}
    try:
        for name, (where, _) in sets.items():
            s = load_settings(store=tmp / f"local-{name}", ingest={"workers": 1})
            t0 = time.perf_counter()
            ingest([where], s)
            walls[("local", name)] = time.perf_counter() - t0
        cluster = local.start(Path("/tmp/rk-bench-ray-slope"), nodes=1, cpus_per_node=1)
        try:
            for name, (where, _) in sets.items():
                s = load_settings(store=tmp / f"cluster-{name}")
                t0 = time.perf_counter()
                ingest_on_cluster([where], s, cluster.address)
                walls[("cluster", name)] = time.perf_counter() - t0
        finally:
            cluster.stop(5)
            shutil.rmtree("/tmp/rk-bench-ray-slope", ignore_errors=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    added = sets["all"][1] - sets["half"][1]
    work = (walls[("local", "all")] - walls[("local", "half")]) / added
    ray = (walls[("cluster", "all")] - walls[("cluster", "half")]) / added
    out = {"files": {k: v[1] for k, v in sets.items()}, "wall_s": {f"{a}_{b}": round(v, 2) for (a, b), v in walls.items()},
           "local_per_file_s": round(work, 3), "cluster_per_file_s": round(ray, 3),
           "ray_overhead_per_file_s": round(ray - work, 3), "overhead_share": round((ray - work) / work, 3)}
    if as_json:
        print(json.dumps(out, indent=2))
        return
    print(f"{docs}: {out['files']['half']} and {out['files']['all']} files")
    for k, v in out["wall_s"].items():
        print(f"  {k:14s} {v:7.1f} s")
    print(f"  per added file: local {work:.2f} s, 1-node cluster {ray:.2f} s; Ray's extra {ray - work:+.2f} s "
          f"= {100 * (ray - work) / work:+.1f}% of the per-file work")


def _engine(log: Path, n_ctx: int):
    """A real `python -m llama_cpp.server` on loopback with the registry's small model, on both
    cores (a question's retrieval and its generation take turns)."""
    import subprocess
    import sys

    import httpx

    from ragkit.cluster.local import free_port
    from ragkit.config import load_settings
    from ragkit.models import resolve

    port = free_port()
    model = resolve("qwen2.5-coder-0.5b", "generator", load_settings().cache_dir)
    proc = subprocess.Popen([sys.executable, "-m", "llama_cpp.server", "--model", str(model), "--host", "127.0.0.1",
                             "--port", str(port), "--n_ctx", str(n_ctx), "--n_threads", "2", "--n_threads_batch", "2",
                             "--logits_all", "false"], stdout=open(log, "wb"), stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            if httpx.get(url + "/v1/models", timeout=2, trust_env=False).status_code == 200:
                return proc, url
        except httpx.TransportError:
            pass
        time.sleep(0.5)
    proc.kill()
    raise SystemExit(f"llama_cpp.server did not start: {log.read_text()[-1000:]}")


def eval_bench(docs: Path, set_path: Path, n: int, as_json: bool) -> None:
    """N questions through one engine, locally (`run_eval`) and on a 1-node loopback cluster
    (`answer_on_cluster`): wall times, and the steady rate (seconds between the first and the
    last recorded answer, over N - 1), which leaves out both runs' start-up (the cluster's:
    connecting, starting the answering actor, loading its retrieval)."""
    import os

    from ragkit.cluster import local
    from ragkit.cluster.eval import answer_on_cluster
    from ragkit.config import load_settings
    from ragkit.eval.run import RunOptions, run_eval
    from ragkit.ingest import ingest

    tmp = Path(tempfile.mkdtemp(prefix="rk-bench-evalc-"))
    # short prompts and answers: Ray's cost per question does not grow with them, so its share of
    # the per-question time is the larger (the conservative side)
    env = {"RAGKIT_GENERATOR__BACKEND": "openai", "RAGKIT_GENERATOR__MAX_TOKENS": "48",
           "RAGKIT_GENERATOR__N_CTX": "4096", "RAGKIT_RETRIEVE__TOP_K": "3"}
    out: dict = {"set": str(set_path), "docs": str(docs), "questions": n, "env": env}
    proc = None
    try:
        store = tmp / "store"
        t0 = time.perf_counter()
        ingest([docs], load_settings(store=store))
        out["ingest_s"] = round(time.perf_counter() - t0, 1)
        proc, url = _engine(tmp / "engine.log", 4096)
        os.environ.update(env, RAGKIT_GENERATOR__BASE_URL=url)

        def timed(name: str, **kw) -> None:
            landed: list[float] = []

            def on_event(kind: str, info: dict) -> None:
                if kind == "answered":
                    landed.append(time.perf_counter())

            t = time.perf_counter()
            rep = run_eval(RunOptions(set_path=set_path, out=tmp / name, store=store, limit=n), on_event=on_event, **kw)
            wall = time.perf_counter() - t
            steady = (landed[-1] - landed[0]) / max(len(landed) - 1, 1) if len(landed) > 1 else wall
            out[name] = {"wall_s": round(wall, 1), "answered": len(landed), "steady_per_question_s": round(steady, 3),
                         "first_answer_s": round(landed[0] - t, 1) if landed else None,
                         "errors": rep["metrics"].get("n_errors"),
                         "page_hit": rep["metrics"].get("page_hit")}

        timed("local")
        root = Path("/tmp/rk-bench-ray-eval")
        cluster = local.start(root, nodes=1, cpus_per_node=1)
        try:
            timed("cluster", answer_many=answer_on_cluster(cluster.address))
        finally:
            cluster.stop(5)
            shutil.rmtree(root, ignore_errors=True)
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait(10)
        for k in [*env, "RAGKIT_GENERATOR__BASE_URL"]:
            os.environ.pop(k, None)
        shutil.rmtree(tmp, ignore_errors=True)
    lo, cl = out["local"], out["cluster"]
    out["ray_extra_per_question_s"] = round(cl["steady_per_question_s"] - lo["steady_per_question_s"], 3)
    out["ray_extra_share"] = round(out["ray_extra_per_question_s"] / lo["steady_per_question_s"], 3)
    if as_json:
        print(json.dumps(out, indent=2))
        return
    print(f"{set_path.name}: {n} questions over {docs} (store built in {out['ingest_s']} s), one llama_cpp.server engine")
    for name in ("local", "cluster"):
        r = out[name]
        print(f"  {name:8s} wall {r['wall_s']:7.1f} s, first answer at {r['first_answer_s']} s, "
              f"steady {r['steady_per_question_s']:.2f} s a question, {r['answered']} answered")
    print(f"  Ray's extra a question (steady): {out['ray_extra_per_question_s']:+.3f} s = "
          f"{100 * out['ray_extra_share']:+.1f}% of the local per-question time")


def project(out: dict, filings: int = 30_000, over: float | None = None) -> dict:
    """T(N, K) = F * max(c / (N * K), w + o): the parse and embed work per file in core-seconds
    (c: the CPU time of the sequential local run a file, the embedder's threads counted on every
    core, store writes included) spread over N*K cores, bounded below by the one
    driver's serial share per file (w: its store writes, o: Ray's extra per file, measured as
    the 2-node run's wall time over the local one's, fixed costs included, so an upper bound,
    unless `over` gives the slope's figure)."""
    lo = out["local"]
    f = max(lo["files"], 1)
    work = lo["cpu_s"] / f if lo.get("cpu_s") else (lo["parse_s"] + lo["embed_s"]) / f
    runs = [r for r in out["runs"] if r["nodes"] == max(x["nodes"] for x in out["runs"])] if out["runs"] else []
    if over is None:
        over = max(runs[0]["extra_per_file_s"], 0.0) if runs else 0.0
    driver = (lo["store_s"] + lo["index_s"]) / f + over
    rows = [{"nodes": n, "cores": k, "hours": round(filings * max(work / (n * k), driver) / 3600, 2)}
            for n in (1, 4, 16, 64) for k in (2, 16)]
    return {"filings": filings, "work_per_file_s": round(work, 3), "driver_per_file_s": round(driver, 4),
            "overhead_per_file_s": over, "driver_bound_h": round(filings * driver / 3600, 2), "rows": rows}


if __name__ == "__main__":
    main()
