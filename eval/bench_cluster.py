"""Ingest on a local Ray cluster against the single-process ingest (prints figures; not a test).

    .venv/bin/python eval/bench_cluster.py [--docs DIR] [--nodes 1,2] [--json]
    .venv/bin/python eval/bench_cluster.py --steady --repeat 3 --docs DIR    # Ray's cost per file, steady state
    .venv/bin/python eval/bench_cluster.py --slope --repeat 3 --docs DIR     # the same as a slope between two sizes
    .venv/bin/python eval/bench_cluster.py --actor-probe --docs DIR          # the actor's embedding alone
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
    ap.add_argument("--repeat", type=int, default=1, help="--slope: runs of the whole comparison (the median is printed)")
    ap.add_argument("--no-lookahead", action="store_true",
                    help="--slope: the cluster's ingest without lookahead (the control: embedding waits on each write)")
    ap.add_argument("--actor-probe", action="store_true",
                    help="the same texts embedded in this process and in one embedder actor on an idle cluster")
    ap.add_argument("--steady", action="store_true",
                    help="Ray's own cost per file in one run's steady state (first commit to last, over n - 1), "
                         "locally and on a 1-node cluster, --repeat rounds")
    ap.add_argument("--slope", action="store_true",
                    help="Ray's own cost per file: the first half of DIR and all of it, locally (one parse worker "
                         "beside the embedder) and on a 1-node cluster; the fixed costs cancel in the difference")
    a = ap.parse_args()
    if a.eval:
        return eval_bench(a.docs, a.set, a.eval, a.json)
    if a.actor_probe:
        return actor_probe(a.docs)
    if a.steady:
        return steady(a.docs, a.json, a.repeat, False if a.no_lookahead else None)
    if a.slope:
        return slope(a.docs, a.json, a.repeat, False if a.no_lookahead else None)
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


def _cpu_by_kind(holder: list) -> dict:
    """CPU seconds so far of this process (the driver) and of the cluster's live processes,
    by kind: Ray's own (GCS, raylet, agents, client server, launchers), the embedder actor,
    the other workers (parse tasks)."""
    import os

    import psutil

    out = {"driver": 0.0, "embed_actor": 0.0, "parse_workers": 0.0, "ray_system": 0.0}
    me = psutil.Process(os.getpid())
    t = me.cpu_times()
    out["driver"] = t.user + t.system
    for p in holder[0].processes():
        try:
            t, name = p.cpu_times(), " ".join(p.cmdline()[:1])
        except psutil.Error:
            continue
        kind = ("embed_actor" if "_EmbedActor" in name else
                "parse_workers" if name.startswith("ray::") and "Agent" not in name else "ray_system")
        out[kind] += t.user + t.system
    return out


def _busy_s() -> float:
    """The machine's busy CPU seconds so far, every process counted (a worker that exited
    included, which per-process accounting would lose): /proc/stat through psutil."""
    import psutil

    t = psutil.cpu_times()
    return sum(t) - t.idle - getattr(t, "iowait", 0.0)


def slope(docs: Path, as_json: bool, repeat: int = 1, lookahead: bool | None = None) -> None:
    """Ray's per-file cost as a slope: wall(all) - wall(half) on the cluster against the same
    difference locally, over the files added. Startup, connection and model loads are paid
    in both runs of a pair, so they cancel.

    `repeat` runs the whole comparison that many times, alternating (local, then a fresh
    1-node cluster, then local again...), and prints every run and the median: one pair of
    runs moves by about +-0.25 s a file on 2 cores. Three local variants: the default ingest
    (one parse worker beside the embedder), the same with `lookahead` (the next file embedded
    while this one is written, what the cluster's ingest does), and the cluster. `lookahead`
    False/True runs the cluster without/with it (None: the cluster's default, on)."""
    import statistics

    from ragkit.cluster import ingest_on_cluster, local
    from ragkit.config import load_settings
    from ragkit.ingest import ingest
    from ragkit.ingest.pipeline import auto_workers

    files = sorted(p for p in docs.iterdir() if p.is_file())
    tmp = Path(tempfile.mkdtemp(prefix="rk-bench-slope-"))
    half = tmp / "half"
    half.mkdir()
    for p in files[: len(files) // 2]:
        shutil.copy(p, half / p.name)
    sets = {"half": (half, len(files) // 2), "all": (docs, len(files))}
    added = sets["all"][1] - sets["half"][1]
    runs: list[dict] = []
    try:
        for r in range(repeat):
            walls: dict = {}
            busy: dict = {}  # the machine's busy CPU seconds (every process: driver, workers, Ray's own)
            for variant, la in (("local", False), ("local_lookahead", True)):
                for name, (where, _) in sets.items():
                    s = load_settings(store=tmp / f"{variant}-{name}-{r}", ingest={"workers": 1})
                    t0, c0 = time.perf_counter(), _busy_s()
                    ingest([where], s, lookahead=la)
                    walls[(variant, name)] = time.perf_counter() - t0
                    busy[(variant, name)] = _busy_s() - c0
                    shutil.rmtree(tmp / f"{variant}-{name}-{r}", ignore_errors=True)
            cluster = local.start(Path("/tmp/rk-bench-ray-slope"), nodes=1, cpus_per_node=1)
            try:
                for name, (where, _) in sets.items():
                    s = load_settings(store=tmp / f"cluster-{name}-{r}")
                    t0, c0 = time.perf_counter(), _busy_s()
                    ingest_on_cluster([where], s, cluster.address, lookahead=lookahead)
                    walls[("cluster", name)] = time.perf_counter() - t0
                    busy[("cluster", name)] = _busy_s() - c0
                    shutil.rmtree(tmp / f"cluster-{name}-{r}", ignore_errors=True)
            finally:
                cluster.stop(5)
                shutil.rmtree("/tmp/rk-bench-ray-slope", ignore_errors=True)
            per = {v: (walls[(v, "all")] - walls[(v, "half")]) / added for v in ("local", "local_lookahead", "cluster")}
            cpu = {v: (busy[(v, "all")] - busy[(v, "half")]) / added for v in ("local", "local_lookahead", "cluster")}
            runs.append({"wall_s": {f"{a}_{b}": round(v, 2) for (a, b), v in walls.items()},
                         "busy_cpu_s": {f"{a}_{b}": round(v, 2) for (a, b), v in busy.items()},
                         "cpu_per_file_s": {k: round(v, 3) for k, v in cpu.items()},
                         "ray_extra_cpu_s": round(cpu["cluster"] - cpu["local"], 3),
                         "ray_extra_cpu_share": round((cpu["cluster"] - cpu["local"]) / cpu["local"], 3),
                         "per_file_s": {k: round(v, 3) for k, v in per.items()},
                         "ray_extra_s": round(per["cluster"] - per["local"], 3),
                         "ray_extra_share": round((per["cluster"] - per["local"]) / per["local"], 3),
                         "ray_extra_vs_lookahead_s": round(per["cluster"] - per["local_lookahead"], 3)})
            if not as_json:
                w = runs[-1]["wall_s"]
                print(f"run {r + 1}: " + ", ".join(f"{k} {v:.1f} s" for k, v in w.items()), flush=True)
                print(f"  per added file: local {per['local']:.2f} s, local with lookahead {per['local_lookahead']:.2f} s, "
                      f"1-node cluster {per['cluster']:.2f} s; Ray's extra {per['cluster'] - per['local']:+.2f} s "
                      f"= {100 * (per['cluster'] - per['local']) / per['local']:+.1f}% of the per-file work", flush=True)
                print(f"  CPU a added file (the machine's busy seconds): local {cpu['local']:.2f}, local with lookahead "
                      f"{cpu['local_lookahead']:.2f}, cluster {cpu['cluster']:.2f}; Ray's extra {cpu['cluster'] - cpu['local']:+.2f} "
                      f"core-s = {100 * (cpu['cluster'] - cpu['local']) / cpu['local']:+.1f}%", flush=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    med = lambda k: statistics.median(x[k] for x in runs)  # noqa: E731
    out = {"files": {k: v[1] for k, v in sets.items()}, "parse_workers_local": 1, "auto_workers": auto_workers(),
           "cluster_lookahead": True if lookahead is None else lookahead, "runs": runs,
           "median": {"local_per_file_s": statistics.median(x["per_file_s"]["local"] for x in runs),
                      "local_lookahead_per_file_s": statistics.median(x["per_file_s"]["local_lookahead"] for x in runs),
                      "cluster_per_file_s": statistics.median(x["per_file_s"]["cluster"] for x in runs),
                      "ray_extra_s": med("ray_extra_s"), "ray_extra_share": med("ray_extra_share"),
                      "ray_extra_vs_lookahead_s": med("ray_extra_vs_lookahead_s"),
                      "local_cpu_per_file_s": statistics.median(x["cpu_per_file_s"]["local"] for x in runs),
                      "cluster_cpu_per_file_s": statistics.median(x["cpu_per_file_s"]["cluster"] for x in runs),
                      "ray_extra_cpu_s": med("ray_extra_cpu_s"), "ray_extra_cpu_share": med("ray_extra_cpu_share")},
           "range": {k: [min(x[k] for x in runs), max(x[k] for x in runs)] for k in ("ray_extra_share", "ray_extra_cpu_share")}}
    if as_json:
        print(json.dumps(out, indent=2))
        return
    m = out["median"]
    print(f"{docs}: {out['files']['half']} and {out['files']['all']} files, {repeat} run(s); median per added file: "
          f"local {m['local_per_file_s']:.2f} s, local with lookahead {m['local_lookahead_per_file_s']:.2f} s, "
          f"cluster {m['cluster_per_file_s']:.2f} s; Ray's extra {m['ray_extra_s']:+.2f} s = "
          f"{100 * m['ray_extra_share']:+.1f}% (range {100 * out['range']['ray_extra_share'][0]:+.1f}% .. "
          f"{100 * out['range']['ray_extra_share'][1]:+.1f}%); against the local lookahead {m['ray_extra_vs_lookahead_s']:+.2f} s")
    print(f"  CPU: local {m['local_cpu_per_file_s']:.2f} core-s a file, cluster {m['cluster_cpu_per_file_s']:.2f}; Ray's extra "
          f"{m['ray_extra_cpu_s']:+.2f} core-s = {100 * m['ray_extra_cpu_share']:+.1f}% (range "
          f"{100 * out['range']['ray_extra_cpu_share'][0]:+.1f}% .. {100 * out['range']['ray_extra_cpu_share'][1]:+.1f}%)")


def steady(docs: Path, as_json: bool, repeat: int = 3, lookahead: bool | None = None) -> None:
    """Ray's per-file cost in the steady state of one run: the time from the first file's
    commit to the last one's, over the files between (n - 1), for the same files locally and
    on a fresh 1-node loopback cluster. Start-up (connecting, starting the actors, loading the
    models, the first parse) falls before the first commit, so it is outside the window, as in
    `eval_bench`'s steady seconds a question; unlike `slope`, no two runs are subtracted.
    Also the machine's busy CPU seconds over the same window (every process). Three variants:
    the local ingest (one parse worker beside the embedder), the same with `lookahead` (what
    the cluster's ingest does), the cluster; `repeat` rounds, the order reversed every other
    round, the median printed."""
    import statistics

    from ragkit.cluster import ingest_on_cluster, local
    from ragkit.config import load_settings
    from ragkit.ingest import ingest

    n = sum(1 for p in docs.iterdir() if p.is_file())
    tmp = Path(tempfile.mkdtemp(prefix="rk-bench-steady-"))
    rounds: list[dict] = []
    variants = ["local", "local_lookahead", "cluster"]
    try:
        for r in range(repeat):
            got: dict = {}
            for v in (variants if r % 2 == 0 else variants[::-1]):
                marks: list[tuple[float, float]] = []
                shares: list[dict] = []  # CPU seconds by process kind at the first and the last commit (cluster)
                procs: list = []

                def on_event(kind: str, info: dict, marks=marks, shares=shares, procs=procs) -> None:
                    if kind == "file":
                        marks.append((time.perf_counter(), _busy_s()))
                        if procs and len(marks) in (1, n):
                            shares.append(_cpu_by_kind(procs))

                store = tmp / f"{v}-{r}"
                t0 = time.perf_counter()
                if v == "cluster":
                    cluster = local.start(Path("/tmp/rk-bench-ray-steady"), nodes=1, cpus_per_node=1)
                    procs.append(cluster)
                    try:
                        t0 = time.perf_counter()
                        ingest_on_cluster([docs], load_settings(store=store), cluster.address, on_event=on_event,
                                          lookahead=lookahead)
                    finally:
                        cluster.stop(5)
                        shutil.rmtree("/tmp/rk-bench-ray-steady", ignore_errors=True)
                else:
                    ingest([docs], load_settings(store=store, ingest={"workers": 1}), on_event=on_event,
                           lookahead=v == "local_lookahead")
                wall = (marks[-1][0] - t0) if marks else 0.0
                shutil.rmtree(store, ignore_errors=True)
                if len(marks) != n:
                    raise SystemExit(f"{v}: {len(marks)} of {n} files committed")
                got[v] = {"wall_s": round(wall, 2), "first_commit_s": round(marks[0][0] - t0, 2),
                          "steady_s_a_file": round((marks[-1][0] - marks[0][0]) / (n - 1), 3),
                          "steady_cpu_s_a_file": round((marks[-1][1] - marks[0][1]) / (n - 1), 3)}
                if len(shares) == 2:
                    got[v]["steady_cpu_s_a_file_by_process"] = {
                        k: round((shares[1].get(k, 0.0) - shares[0].get(k, 0.0)) / (n - 1), 3) for k in shares[1]}
                if not as_json:
                    g = got[v]
                    print(f"round {r + 1} {v:16s} wall {g['wall_s']:6.1f} s, first commit {g['first_commit_s']:5.1f} s, "
                          f"steady {g['steady_s_a_file']:.2f} s a file, {g['steady_cpu_s_a_file']:.2f} core-s a file",
                          flush=True)
                    if "steady_cpu_s_a_file_by_process" in g:
                        print("    by process, core-s a file: " + ", ".join(
                            f"{k} {x:.2f}" for k, x in g["steady_cpu_s_a_file_by_process"].items()), flush=True)
            base = got["local"]["steady_s_a_file"]
            got["ray_extra_s"] = round(got["cluster"]["steady_s_a_file"] - base, 3)
            got["ray_extra_share"] = round(got["ray_extra_s"] / base, 3)
            cbase = got["local"]["steady_cpu_s_a_file"]
            got["ray_extra_cpu_s"] = round(got["cluster"]["steady_cpu_s_a_file"] - cbase, 3)
            got["ray_extra_cpu_share"] = round(got["ray_extra_cpu_s"] / cbase, 3)
            rounds.append(got)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    med = {f"{v}_{k}": statistics.median(x[v][k] for x in rounds) for v in variants
           for k in ("steady_s_a_file", "steady_cpu_s_a_file", "wall_s")}
    for k in ("ray_extra_s", "ray_extra_share", "ray_extra_cpu_s", "ray_extra_cpu_share"):
        med[k] = statistics.median(x[k] for x in rounds)
    out = {"docs": str(docs), "files": n, "cluster_lookahead": True if lookahead is None else lookahead,
           "rounds": rounds, "median": med,
           "range": {k: [min(x[k] for x in rounds), max(x[k] for x in rounds)]
                     for k in ("ray_extra_share", "ray_extra_cpu_share")}}
    if as_json:
        print(json.dumps(out, indent=2))
        return
    print(f"{docs}: {n} files, {repeat} round(s), medians: steady a file local {med['local_steady_s_a_file']:.2f} s, "
          f"local with lookahead {med['local_lookahead_steady_s_a_file']:.2f} s, cluster {med['cluster_steady_s_a_file']:.2f} s; "
          f"Ray's extra {med['ray_extra_s']:+.2f} s = {100 * med['ray_extra_share']:+.1f}% of the per-file work (rounds "
          f"{', '.join(f'{100 * x:+.1f}%' for x in (r['ray_extra_share'] for r in rounds))}); CPU {med['ray_extra_cpu_s']:+.2f} "
          f"core-s = {100 * med['ray_extra_cpu_share']:+.1f}%")


def actor_probe(docs: Path, files: int = 4) -> None:
    """The same chunk texts (the first `files` of DIR) embedded twice in this process and twice
    in one embedder actor of an otherwise idle 1-node loopback cluster: wall time and the
    embedding process's CPU, so the actor's own cost is seen apart from the ingest's contention."""
    import os
    import resource

    import psutil

    from ragkit.cluster import local
    from ragkit.cluster.connect import connect, disconnect
    from ragkit.cluster.ingest import ClusterEmbedder
    from ragkit.config import load_settings
    from ragkit.embed import load_embedder
    from ragkit.ingest.sources import chunk_file

    s = load_settings()
    emb = load_embedder(s)
    texts = [c.embed_text() for p in sorted(x for x in docs.iterdir() if x.is_file())[:files]
             for c in chunk_file(p, s, emb)[0]]
    emb.embed_documents(texts[:64])  # loaded and warm

    def own_cpu() -> float:
        r = resource.getrusage(resource.RUSAGE_SELF)
        return r.ru_utime + r.ru_stime

    print(f"{len(texts)} texts from {files} files of {docs}")
    for _ in range(2):
        t0, c0 = time.perf_counter(), own_cpu()
        emb.embed_documents(texts)
        print(f"  this process: {time.perf_counter() - t0:.2f} s wall, {own_cpu() - c0:.2f} core-s", flush=True)
    temp = Path("/tmp/rk-bench-ray-probe")
    cluster = local.start(temp, nodes=1, cpus_per_node=1)
    try:
        connect(cluster.address)
        ce = ClusterEmbedder(s, emb, 1)
        ce.embed_documents(texts[:64])  # the actor started, its model loaded and warm
        import ray

        actor = psutil.Process(ray.get(ce.actors[0].__ray_call__.remote(lambda self: os.getpid())))
        for _ in range(2):
            t0, c0 = time.perf_counter(), sum(actor.cpu_times()[:2])
            ce.embed_documents(texts)
            print(f"  embedder actor: {time.perf_counter() - t0:.2f} s wall, {sum(actor.cpu_times()[:2]) - c0:.2f} core-s "
                  f"in the actor (nice {actor.nice()}, {len(actor.cpu_affinity())} cores)", flush=True)
        ce.close()
        disconnect()
    finally:
        cluster.stop(5)
        shutil.rmtree(temp, ignore_errors=True)


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
