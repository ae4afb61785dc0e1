"""Benchmark: retrieval latency and memory at 10K / 100K / 1M chunks (prints figures; not a test).

    .venv/bin/python eval/bench_retrieval.py [--chunks 10000 100000 1000000] [--queries 200] [--json] [--cached-only]
        [--lexical segments|tantivy]

Stores of real legal text (eval/bench_corpus.py: sentences of the CUAD, ContractNLI and
FDA texts in the shared corpora, random unit vectors, 200 chunks per document), built
once and cached under /tmp/ragkit-bench (RAGKIT_BENCH_DIR); the 1M store takes about
30 min to build on 2 idle cores (570 vectors/s into Chroma). Each store is opened the way
ragkit opens it, its sidecars and lexical index brought up to date by the product's own
sync (timed: the first time this is the upgrade of a store written without them), then
each query runs every variant in turn, in process and warm (20 queries of warm-up):

- dense: Chroma's search over all live documents, with texts (ChromaStore.query);
- bm25: the lexical index alone;
- hybrid: both, fused (hybrid_search over all documents, as `ragkit ask` without --doc);
- one_doc / few_docs: hybrid restricted to one random document / to three (per document,
  as `ask --doc A --doc B --doc C`), which use the sidecars;
- documents: the store's record list, which `retrieve` reads twice per question before
  searching (cached per store version: one row read while no document changes);
- chroma_prefilter: Chroma's own `where` filter for one document (what a restricted query
  cost before the sidecars; 20 queries only, it is slow).

`rss_mb` is the resident memory of the process after the queries (VmRSS), with the store,
its index and the caches loaded. `--json` prints one object keyed by chunk count.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_corpus as bc  # noqa: E402


def rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def pct(xs: list[float], p: float) -> float:
    return round(float(np.percentile(np.asarray(xs), p)) * 1000, 2) if xs else float("nan")


def run(n: int, queries: int, log, engine: str = "segments") -> dict:
    from ragkit.retrieve.search import hybrid_search
    from ragkit.store import ChromaStore
    from ragkit.store.lexical_backend import module_for

    bm25 = module_for(engine)  # the lexical index's engine (retrieve.lexical)

    t0 = time.perf_counter()
    path = bc.build(n, log=log)
    t_build = time.perf_counter() - t0
    t0 = time.perf_counter()
    store = ChromaStore(path, url=None, collection=bc.COLLECTION, embedder_name=bc.EMBEDDER, dim=bc.DIM, create=False)
    folder = path / ("bm25" if engine == "segments" else f"lexical-{engine}")
    wrote = bm25.refresh(store, folder)  # the writer's sync (the first time: sidecars and segments for every document)
    t_sync = time.perf_counter() - t0
    if store._version() is None:
        store.bump_version()  # a store written by Chroma alone has no version record yet (what the writer adds)
    t0 = time.perf_counter()
    records = store.documents()
    live = [r.doc_id for r in records]
    lexical = bm25.open_index(store, folder, live)
    t_open = time.perf_counter() - t0
    rng = random.Random(n)
    qs = bc.queries(queries + 20)
    qv = np.random.default_rng(1).standard_normal((len(qs), bc.DIM)).astype(np.float32)
    qv /= np.linalg.norm(qv, axis=1, keepdims=True)
    res: dict[str, list[float]] = {k: [] for k in ("dense", "bm25", "hybrid", "one_doc", "few_docs", "chroma_prefilter",
                                                    "documents")}
    for qi, (q, v) in enumerate(zip(qs, qv.tolist())):
        one = [rng.choice(records)]
        few = rng.sample(records, min(3, len(records)))
        timed = [
            ("dense", lambda: store.query(v, 40, live, all_live=True)),
            ("bm25", lambda: lexical.search(q, 40)),
            ("documents", store.documents),  # the record list `retrieve` reads (twice) before searching
            ("hybrid", lambda: hybrid_search(store, q, v, records, 40, lexical=lexical, all_docs=True)),
            ("one_doc", lambda: hybrid_search(store, q, v, one, 40, lexical=lexical)),
            ("few_docs", lambda: hybrid_search(store, q, v, few, 40, lexical=lexical, per_doc=True)),
        ]
        if 20 <= qi < 40:
            timed.append(("chroma_prefilter", lambda: store.col.query(query_embeddings=[v], n_results=40,
                                                                      where={"doc_id": one[0].doc_id},
                                                                      include=["documents", "metadatas", "distances"])))
        for name, fn in timed:
            t = time.perf_counter()
            fn()
            if qi >= 20:
                res[name].append(time.perf_counter() - t)
    out = {
        "chunks": store.count(),
        "documents": len(records),
        "build_s": round(t_build, 1),
        "sync_s": round(t_sync, 2),
        "sync_wrote": wrote,
        "open_s": round(t_open, 3),
        "segments": len(lexical.segments),
        "hybrid_p50_ms": pct(res["hybrid"], 50),
        "hybrid_p95_ms": pct(res["hybrid"], 95),
        "dense_p50_ms": pct(res["dense"], 50),
        "bm25_p50_ms": pct(res["bm25"], 50),
        "one_doc_p50_ms": pct(res["one_doc"], 50),
        "one_doc_p95_ms": pct(res["one_doc"], 95),
        "few_docs_p50_ms": pct(res["few_docs"], 50),
        "chroma_prefilter_p50_ms": pct(res["chroma_prefilter"], 50),
        "documents_p50_ms": pct(res["documents"], 50),
        "queries": len(res["hybrid"]),
        "rss_mb": round(rss_mb(), 1),
    }
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--chunks", type=int, nargs="+", default=[10000, 100000, 1000000])
    ap.add_argument("--queries", type=int, default=200)
    ap.add_argument("--json", action="store_true", help="print one JSON object keyed by chunk count")
    ap.add_argument("--cached-only", action="store_true", help="skip sizes whose store is not built yet")
    ap.add_argument("--lexical", choices=("segments", "tantivy"), default="segments", help="the lexical index's engine")
    a = ap.parse_args()
    log = (lambda *x, **k: print(*x, file=sys.stderr, **k)) if a.json else print
    results: dict[str, dict] = {}
    for n in a.chunks:
        if a.cached_only and not (bc.store_path(n) / "built.json").exists():
            log(f"{n:,} chunks: not built yet ({bc.store_path(n)}), skipped")
            continue
        results[str(n)] = run(n, a.queries, log, a.lexical)
        if not a.json:
            r = results[str(n)]
            print(f"\n{n:,} chunks ({r['documents']:,} documents, {r['segments']} lexical segments): "
                  f"sync {r['sync_s']} s ({'wrote' if r['sync_wrote'] else 'up to date'}), open {r['open_s']} s, "
                  f"rss {r['rss_mb']:.0f} MB")
            for k in ("hybrid", "dense", "bm25", "one_doc", "few_docs", "chroma_prefilter", "documents"):
                p95 = r.get(f"{k}_p95_ms")
                print(f"  {k:17s} p50 {r[f'{k}_p50_ms']:8.2f} ms" + (f"   p95 {p95:8.2f} ms" if p95 is not None else ""))
    if a.json:
        print(json.dumps(results))
    elif len(results) > 1:
        print("\n  chunks     hybrid p50  hybrid p95  one-doc p50  few-docs p50  dense p50  bm25 p50  rss MB")
        for n, r in results.items():
            print(f"  {int(n):>9,}  {r['hybrid_p50_ms']:9.2f}  {r['hybrid_p95_ms']:10.2f}  {r['one_doc_p50_ms']:11.2f}  "
                  f"{r['few_docs_p50_ms']:12.2f}  {r['dense_p50_ms']:9.2f}  {r['bm25_p50_ms']:8.2f}  {r['rss_mb']:6.0f}")


if __name__ == "__main__":
    main()
