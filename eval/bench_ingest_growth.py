"""Benchmark: what ingesting one more document costs in a 100K-chunk store against an empty
one (prints figures; not a test). The issue's bar: at most 2x.

    .venv/bin/python eval/bench_ingest_growth.py [--chunks 100000] [--doc PDF] [--reps 2] [--json]

The big store is the cached benchmark store of eval/bench_corpus.py (real legal text,
random unit vectors, recorded as embedder minilm so a real document can go in); it is
built the first time (about 3 min for 100K on 2 idle cores). The document (default: a
short CUAD contract from the shared corpora, so the fixed costs weigh the most) is ingested
with the real pipeline and the real minilm embedder, alternately into a fresh empty store
and into the big store (`--reps` times each, medians reported); after each ingest into the
big store the document is removed again and the index synced, so every run starts from
the same store. The embedder's model is loaded before the first run.

Printed: wall time of `ingest()` for each, the ratio, and the part that is not parsing
or embedding (store writes and the lexical index: the part that could grow with the store).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_corpus as bc  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--chunks", type=int, default=100000)
    default_doc = bc.shared_corpora() / "cuad-10" / "pdf" / "BIOPURECORP_06_30_1999-EX-10.13-AGENCY AGREEMENT.PDF"
    ap.add_argument("--doc", type=Path, default=default_doc)
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    log = (lambda *x, **k: print(*x, file=sys.stderr, **k)) if a.json else print
    if not a.doc.is_file():
        sys.exit(f"no such document: {a.doc}")

    from ragkit.config import load_settings
    from ragkit.embed import load_embedder
    from ragkit.ingest import ingest
    from ragkit.ingest.pipeline import sync_lexical_index
    from ragkit.store import open_store

    big = bc.build(a.chunks, log=log)
    tmp = Path(tempfile.mkdtemp(prefix="ragkit-growth-"))
    doc = tmp / a.doc.name  # a copy: the document's key is its path
    doc.write_bytes(a.doc.read_bytes())
    big_settings = load_settings(store=big, collection=bc.COLLECTION)
    emb = load_embedder(big_settings)
    if hasattr(emb, "_load"):
        emb._load()
    st = open_store(big_settings, emb, create=False)
    # bring the big store's derived data up to date first (not part of the measured ingest)
    from ragkit.store import lexical

    lexical.refresh(st, lexical.index_dir(big, None, bc.COLLECTION, big_settings.cache_dir))
    n_big = st.count()

    def one(settings) -> dict:
        t0 = time.perf_counter()
        rep = ingest([doc], settings)
        wall = time.perf_counter() - t0
        if rep.failed or rep.added != 1:
            sys.exit(f"ingest failed: {rep.to_json()}")
        tm = dict(getattr(rep, "timings", {}) or {})
        fixed = wall - tm.get("parse_s", 0.0) - tm.get("wait_parse_s", 0.0) - tm.get("embed_s", 0.0) - tm.get("hash_s", 0.0)
        return {"wall_s": wall, "not_parse_embed_s": fixed, "chunks": rep.chunks, "timings": tm}

    runs: dict[str, list[dict]] = {"empty": [], "big": []}
    for r in range(a.reps):
        empty = load_settings(store=tmp / f"empty-{r}", collection=bc.COLLECTION)
        runs["empty"].append(one(empty))
        runs["big"].append(one(big_settings))
        # put the big store back as it was
        s2 = open_store(big_settings, emb, create=False)
        s2.remove_document(str(doc))
        sync_lexical_index(s2, big_settings)
        log(f"  rep {r + 1}: empty {runs['empty'][-1]['wall_s']:.2f} s, {n_big:,}-chunk store {runs['big'][-1]['wall_s']:.2f} s")

    def med(k: str, key: str) -> float:
        return round(statistics.median(x[key] for x in runs[k]), 3)

    out = {
        "document": a.doc.name,
        "chunks_added": runs["empty"][0]["chunks"],
        "store_chunks": n_big,
        "empty_s": med("empty", "wall_s"),
        "big_s": med("big", "wall_s"),
        "ratio": round(med("big", "wall_s") / med("empty", "wall_s"), 2),
        "empty_not_parse_embed_s": med("empty", "not_parse_embed_s"),
        "big_not_parse_embed_s": med("big", "not_parse_embed_s"),
        "reps": a.reps,
        "timings_empty": runs["empty"][-1]["timings"],
        "timings_big": runs["big"][-1]["timings"],
    }
    if a.json:
        print(json.dumps(out))
        return
    print(f"\none document ({out['document']}, {out['chunks_added']} chunks), median of {a.reps}:")
    print(f"  into an empty store:          {out['empty_s']:.2f} s  (store + index part {out['empty_not_parse_embed_s']:.2f} s)")
    print(f"  into a {n_big:,}-chunk store:  {out['big_s']:.2f} s  (store + index part {out['big_not_parse_embed_s']:.2f} s)")
    print(f"  ratio {out['ratio']:.2f}x (the bar: at most 2x)")
    print(f"  timings, empty: {out['timings_empty']}")
    print(f"  timings, big:   {out['timings_big']}")


if __name__ == "__main__":
    main()
