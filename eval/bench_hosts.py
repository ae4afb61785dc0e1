"""Ingest across separate hosts against the same ingest on one host (prints figures; not a
test; root, like `make cluster-test`).

    .venv/bin/python eval/bench_hosts.py [--docs DIR] [--repeat 2] [--embedders N] [--json]

The hosts of tests/hosts.py (network, mount, UTS and PID namespaces on a test network of their
own, all on this machine's cores): A holds the documents and runs the driver, B and C are Ray
nodes (C the head, with its Ray Client server), D a `chroma run` server. Each repeat ingests DIR
into a fresh collection of D twice, in turn:

- one host: `ragkit ingest DIR` on A (parse workers and the embedder on A), and
- across hosts: `ragkit ingest DIR --cluster ray://C` (the file's bytes to Ray, parsed and
  embedded on B and C, written to D by the driver on A),

and reads the bytes each host sent and received from its link's counters (the switch's side of
its veth pair). Printed: wall time and the difference a file, and the bytes a file by host and
direction, the driver's own counters (`timings`) beside them. All four hosts share this
machine's cores, so the cluster cannot be faster here: the difference a file is Ray's extra.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

import hosts as hostlib  # noqa: E402  (the test harness: tests/hosts.py)


def link_bytes(h: hostlib.Hosts) -> dict[str, dict[str, int]]:
    """Bytes each host sent and received, from the switch's side of its veth (its rx is the
    host's tx)."""
    out = {}
    for name, host in h.hosts.items():
        port = f"{h.tag[:8]}{name}0"[:15]
        got = json.loads(subprocess.run(["ip", "netns", "exec", h.switch, "ip", "-s", "-j", "link", "show", port],
                                        capture_output=True, text=True, check=True).stdout)[0]["stats64"]
        out[name] = {"sent": got["rx"]["bytes"], "received": got["tx"]["bytes"]}
    return out


def run(net: hostlib.Net, collection: str, cluster: bool, embedders: int = 0) -> dict:
    before = link_bytes(net.hosts)
    args = ["ingest", "/tmp/docs", "--json"] + (["--cluster", net.client] if cluster else [])
    extra = {"RAGKIT_CLUSTER__EMBEDDERS": str(embedders)} if cluster and embedders else {}
    t0 = time.perf_counter()
    res = net.a.run([hostlib.RAGKIT, *args], env=net.driver_env(net.a, collection, **extra), timeout=3600)
    wall = time.perf_counter() - t0
    if res.returncode not in (0, 1):
        raise SystemExit(f"ingest failed ({res.returncode}): {res.stderr[-3000:]}")
    after = link_bytes(net.hosts)
    report = json.loads(res.stdout)
    moved = {n: {k: after[n][k] - before[n][k] for k in ("sent", "received")} for n in after}
    return {"wall_s": wall, "report": report, "bytes": moved}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--docs", type=Path, default=ROOT.parent / "shared" / "corpora" / "sec-10q-docugami" / "docs")
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--embedders", type=int, default=0,
                    help="embedder actors on the cluster (cluster.embedders; 0: one per node). On one machine's two cores "
                         "two actors of two threads each contend for them, which a cluster of real machines does not")
    ap.add_argument("--json", action="store_true")
    opts = ap.parse_args()
    why = hostlib.available()
    if why:
        raise SystemExit(f"separate hosts cannot be made here: {why}")
    files = sorted(p for p in opts.docs.iterdir() if p.is_file() and p.suffix.lower() in (".pdf", ".docx", ".md", ".txt"))
    h = hostlib.Hosts().start()
    try:
        net = hostlib.start_net(h, None)
        docs = net.a.path("/tmp/docs")
        docs.mkdir()
        for p in files:
            shutil.copy(p, docs / p.name)
        rows = []
        for i in range(opts.repeat):
            one = run(net, f"one-host-{i}", cluster=False)
            across = run(net, f"across-{i}", cluster=True, embedders=opts.embedders)
            rows.append({"one_host": one, "across": across})
            print(f"repeat {i + 1}: one host {one['wall_s']:.1f} s, across hosts {across['wall_s']:.1f} s", file=sys.stderr)
    finally:
        h.close()
    n = len(files)
    pages = rows[0]["one_host"]["report"]["pages"]
    diff = [(r["across"]["wall_s"] - r["one_host"]["wall_s"]) / n for r in rows]
    per_file = {side: {host: {k: statistics.median(r[side]["bytes"][host][k] for r in rows) / n for k in ("sent", "received")}
                       for host in "abcd"} for side in ("one_host", "across")}
    out = {
        "embedders": opts.embedders or "one per node",
        "files": n, "pages": pages, "bytes_of_files": sum(p.stat().st_size for p in files),
        "one_host_wall_s": [round(r["one_host"]["wall_s"], 2) for r in rows],
        "across_wall_s": [round(r["across"]["wall_s"], 2) for r in rows],
        "extra_per_file_s": round(statistics.median(diff), 3),
        "extra_share": round(statistics.median((r["across"]["wall_s"] / r["one_host"]["wall_s"]) - 1 for r in rows), 3),
        "bytes_per_file": {side: {h_: {k: round(v) for k, v in d.items()} for h_, d in s.items()} for side, s in per_file.items()},
        "chunks": rows[0]["one_host"]["report"]["chunks"],
        "nodes": rows[-1]["across"]["report"].get("nodes"),
        "timings_one_host": rows[-1]["one_host"]["report"]["timings"],
        "timings_across": rows[-1]["across"]["report"]["timings"],
    }
    if opts.json:
        print(json.dumps(out, indent=2))
        return
    print(f"{n} files, {pages} pages, {out['chunks']} chunks, {out['bytes_of_files'] / 1e6:.1f} MB")
    print(f"one host:     {out['one_host_wall_s']} s")
    print(f"across hosts: {out['across_wall_s']} s")
    print(f"Ray's extra a file: {out['extra_per_file_s']:+.3f} s ({out['extra_share']:+.1%})")
    for side in ("one_host", "across"):
        print(f"bytes a file, {side}:")
        for host, d in out["bytes_per_file"][side].items():
            print(f"  {host}: sent {d['sent'] / 1e3:9.1f} kB   received {d['received'] / 1e3:9.1f} kB")
    print("nodes:", out["nodes"])


if __name__ == "__main__":
    main()
