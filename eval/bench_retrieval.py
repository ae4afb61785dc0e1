"""Benchmark: hybrid retrieval latency at scale (a script that prints figures, not a test).

    .venv/bin/python eval/bench_retrieval.py --chunks 10000 100000 --queries 200

Builds a store of N synthetic legal-sounding chunks (random 384-dim unit vectors, so the
embedder's time is not measured: the query vector is precomputed), a BM25 index over
the same texts, and times the dense query, the BM25 query and the fused hybrid path
(RRF + fetching the texts of BM25-only hits), with and without a one-document filter.
"""

from __future__ import annotations

import argparse
import random
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

import ragkit  # noqa: F401
from ragkit.retrieve import bm25
from ragkit.retrieve.search import hybrid_search
from ragkit.store import ChromaStore, DocRecord

WORDS = (
    "confidential information recipient discloser obligations survive termination agreement party "
    "governing law jurisdiction court notice written consent employees advisors return destroy copies "
    "trade secret license warranty liability indemnify term years months effective date breach remedy "
    "injunctive relief assignment successor affiliate subsidiary revenue net sales income tax quarter "
    "fiscal operating expenses cash equivalents securities segment product services region total"
).split()


def pct(xs: list[float], p: float) -> float:
    return float(np.percentile(np.asarray(xs), p)) * 1000


def run(n: int, queries: int, dim: int = 384) -> None:
    rng = random.Random(n)
    tmp = Path(tempfile.mkdtemp(prefix=f"bench-{n}-"))
    store = ChromaStore(tmp, url=None, collection="bench", embedder_name="bench", dim=dim, create=True)
    n_docs = max(1, n // 200)
    texts, ids, metas = [], [], []
    for i in range(n):
        doc = f"doc{i % n_docs:05d}"
        texts.append(" ".join(rng.choice(WORDS) for _ in range(rng.randint(60, 180))))
        ids.append(f"{doc}:{i:07d}")
        metas.append({"doc_id": doc, "doc_name": f"{doc}.pdf", "chunk_index": i, "section": f"{i % 40}. Clause"})
    vecs = np.random.default_rng(n).standard_normal((n, dim)).astype(np.float32)
    vecs /= np.linalg.norm(vecs, axis=1, keepdims=True)
    t0 = time.perf_counter()
    for s in range(0, n, 5000):
        store.add_chunks(ids[s : s + 5000], vecs[s : s + 5000].tolist(), texts[s : s + 5000], metas[s : s + 5000])
    for d in range(n_docs):
        doc = f"doc{d:05d}"
        store.commit_document(DocRecord(key=doc, doc_id=doc, name=f"{doc}.pdf", path=doc, sha256=doc, n_chunks=0, n_sections=0, n_pages=None, ingested_at=0))
    t_add = time.perf_counter() - t0
    t0 = time.perf_counter()
    ix = bm25.BM25Index.build(ids, texts, [m["doc_id"] for m in metas], "bench")
    t_bm25 = time.perf_counter() - t0
    records = store.documents()
    qs = [" ".join(rng.choice(WORDS) for _ in range(8)) for _ in range(queries)]
    qv = np.random.default_rng(1).standard_normal((queries, dim)).astype(np.float32)
    qv /= np.linalg.norm(qv, axis=1, keepdims=True)
    res: dict[str, list[float]] = {"dense": [], "dense_prefilter": [], "bm25": [], "hybrid": [], "hybrid_1doc": []}
    one = [records[0]]
    for q, v in zip(qs, qv.tolist()):
        t = time.perf_counter(); store.query(v, 40, [r.doc_id for r in records], all_live=True); res["dense"].append(time.perf_counter() - t)
        t = time.perf_counter(); store.query(v, 40, [r.doc_id for r in records]); res["dense_prefilter"].append(time.perf_counter() - t)
        t = time.perf_counter(); ix.search(q, 40); res["bm25"].append(time.perf_counter() - t)
        t = time.perf_counter(); hybrid_search(store, q, v, records, 40, lexical=ix, all_docs=True); res["hybrid"].append(time.perf_counter() - t)
        t = time.perf_counter(); hybrid_search(store, q, v, one, 40, lexical=ix); res["hybrid_1doc"].append(time.perf_counter() - t)
    print(f"\n{n:,} chunks ({n_docs} documents): store add {t_add:.1f}s ({n / t_add:.0f}/s), BM25 build {t_bm25:.1f}s")
    for k, xs in res.items():
        print(f"  {k:12s} p50 {pct(xs, 50):7.1f} ms   p95 {pct(xs, 95):7.1f} ms   (n={len(xs)})")


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--chunks", type=int, nargs="+", default=[10000, 100000])
    ap.add_argument("--queries", type=int, default=200)
    a = ap.parse_args()
    for n in a.chunks:
        run(n, a.queries)
