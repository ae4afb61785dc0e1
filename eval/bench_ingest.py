"""Ingest benchmark on the 12 SEC 10-Q filings (prints figures; not a test).

    .venv/bin/python eval/bench_ingest.py [--docs DIR] [--limit N] [--embed minilm] [--workers N]
                                          [--sequential] [--skip-floor] [--skip-engines] [--json]

1. ingest into a fresh store (the embedder's model is loaded before the clock): wall time,
   pages/s, and the share of the wall time in each stage (hash, waiting for a parser,
   cache lookup, embedding, store writes, BM25 index), with the parsers' own time (in
   worker processes, overlapped with embedding) beside it;
2. the embedding cache on that fresh ingest: chunks written, texts embedded, chunks whose
   vector came from the cache (passages repeated across the filings);
3. the share of text embedded (every token counted with the embedder's tokenizer);
4. the floor: raw torch fp32 SentenceTransformer.encode() of ALL the chunk texts written
   (what a pipeline without the cache would embed), batch 32, and ingest wall / floor
   (issue 16's target: at most 0.6);
5. re-ingest of the unchanged corpus, then re-ingest after one changed file (one filing
   rewritten with pypdf, one page dropped: the pages after it keep their text, so only the
   chunks of that page and the sections around it change);
6. with --sequential: the same fresh ingest with parsing in-process, file by file
   (`overlap=False`), run right after, for the overlap's gain under the same load;
7. parsing alone per engine (unless --skip-engines);
8. with --lookup-at N: the embedding cache's lookup cost in a store of N chunk records
   (random unit vectors, real Chroma), for 50 / 300 / 1000 hashes, two thirds of them hits.

The machine is shared while this runs: figures are loaded-machine figures unless the
machine was idle; the ratios (wall / floor, overlap gain) are the more telling numbers.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import ragkit  # noqa: E402,F401  (offline switches)


def fresh_ingest(pdfs, settings, *, overlap: bool, embedder):
    """Ingest into a fresh store with the warmed embedder (loading a model is no ingest work)."""
    from ragkit.ingest import ingest

    t0 = time.perf_counter()
    report = ingest(pdfs, settings, overlap=overlap, embedder=embedder)
    return report, time.perf_counter() - t0


def stored_texts(settings, emb) -> list[str]:
    """Every chunk text whose vector is stored (embedded now, or taken from the embedding cache
    for a passage repeated across filings): what the share of text embedded is counted on."""
    from ragkit.store.chroma import ChromaStore

    store = ChromaStore(settings.store, url=None, collection=settings.collection, embedder_name=emb.name, dim=emb.dim,
                        create=False)
    return list(store.col.get(include=["documents"])["documents"])


def stages(report, wall: float) -> dict:
    tm = report.timings
    main = {k: tm.get(f"{k}_s", 0.0) for k in ("hash", "wait_parse", "lookup", "embed", "store", "index")}
    main["other"] = max(wall - sum(main.values()), 0.0)
    return {
        "seconds": {k: round(v, 2) for k, v in main.items()},
        "share": {k: round(v / wall, 3) for k, v in main.items()},
        "parse_in_workers_s": round(tm.get("parse_s", 0.0), 2),
        "pdf_text_s": round(tm.get("loader_pdf_text_s", 0.0), 2),
        "tables_s": round(tm.get("loader_table_s", 0.0), 2),
    }


def lookup_cost(n: int, folder: Path, say) -> list[dict]:
    import hashlib
    import random

    import numpy as np

    from ragkit.store import ChromaStore

    st = ChromaStore(folder, url=None, collection="lookup", embedder_name="bench", dim=384, create=True)
    rng = np.random.default_rng(0)
    hashes = [hashlib.sha256(str(i).encode()).hexdigest() for i in range(n)]
    t0 = time.perf_counter()
    for i in range(0, n, 1000):
        v = rng.standard_normal((min(1000, n - i), 384)).astype("float32")
        v /= np.linalg.norm(v, axis=1, keepdims=True)
        st.col.add(ids=[f"d{j // 300}:{j:05d}" for j in range(i, i + len(v))], embeddings=v,
                   documents=[f"text {j}" for j in range(i, i + len(v))],
                   metadatas=[{"doc_id": f"d{j // 300}", "text_hash": hashes[j]} for j in range(i, i + len(v))])
    say(f"\n== embedding cache lookup in a store of {n} records (built in {time.perf_counter() - t0:.0f} s)")
    rows = []
    for k in (50, 300, 1000):
        best = None
        for rep in range(3):
            q = random.Random(rep).sample(hashes, 2 * k // 3) + [hashlib.sha256(f"miss{rep}:{m}".encode()).hexdigest() for m in range(k - 2 * k // 3)]
            t0 = time.perf_counter()
            got = st.vectors_by_text_hash(q)
            dt = time.perf_counter() - t0
            best = dt if best is None else min(best, dt)
        rows.append({"hashes": k, "hits": len(got), "best_ms": round(1000 * best, 1), "us_per_hash": round(1e6 * best / k)})
        say(f"{k:5d} hashes ({len(got)} hits): {1000 * best:.1f} ms, {1e6 * best / k:.0f} us per hash (best of 3)")
    return rows


def drop_page(src: Path, dst: Path, page: int) -> None:
    import pypdf

    r = pypdf.PdfReader(str(src))
    w = pypdf.PdfWriter()
    for i, p in enumerate(r.pages):
        if i != page:
            w.add_page(p)
    with open(dst, "wb") as f:
        w.write(f)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--docs", type=Path, default=ROOT.parent / "shared" / "corpora" / "sec-10q-docugami" / "docs")
    ap.add_argument("--limit", type=int, default=0, help="first N filings only (a quick check)")
    ap.add_argument("--embed", default="minilm")
    ap.add_argument("--workers", type=int, default=0, help="parse processes (0 = from the free cores)")
    ap.add_argument("--sequential", action="store_true", help="also a fresh ingest parsing in-process (overlap off)")
    ap.add_argument("--skip-floor", action="store_true")
    ap.add_argument("--skip-engines", action="store_true")
    ap.add_argument("--lookup-at", type=int, default=0, help="also time cache lookups in a store of N records")
    ap.add_argument("--json", action="store_true", help="print one JSON object on stdout (text goes to stderr)")
    args = ap.parse_args()
    say = (lambda *a: print(*a, file=sys.stderr, flush=True)) if args.json else (lambda *a: print(*a, flush=True))

    from ragkit.config import load_settings
    from ragkit.embed import load_embedder
    from ragkit.ingest import loaders

    src = sorted(args.docs.glob("*.pdf"))[: args.limit or None]
    if not src:
        sys.exit(f"no PDFs in {args.docs}")
    tmp = Path(tempfile.mkdtemp(prefix="ragkit-bench-"))
    docs = tmp / "docs"
    docs.mkdir()
    for p in src:
        shutil.copy(p, docs / p.name)  # a copy: one of them is changed below
    pdfs = sorted(docs.glob("*.pdf"))

    def settings_for(name: str):
        return load_settings(store=tmp / name, embed={"model": args.embed}, cache_dir=tmp / "cache",
                             ingest={"workers": args.workers})

    settings = settings_for("store")
    emb = load_embedder(settings)
    emb.embed_documents(["warm-up: the model loads before the clock"])  # a one-off, not ingest work
    try:
        load = os.getloadavg()
    except OSError:
        load = None
    out: dict = {"corpus": {"dir": str(args.docs), "files": len(pdfs)}, "embedder": emb.name, "max_tokens": emb.max_tokens,
                 "cpus": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
                 "load_at_start": load}
    say(f"corpus: {len(pdfs)} PDFs from {args.docs}; embedder {emb.name} (max {emb.max_tokens} tokens); "
        f"work dir {tmp}; load average {load}")

    # 1-2. fresh ingest
    report, wall = fresh_ingest(pdfs, settings, overlap=True, embedder=emb)
    if report.failed:
        say("FAILED:", report.failed)
    texts = stored_texts(settings, emb)
    st = stages(report, wall)
    out["fresh"] = {"wall_s": round(wall, 2), "workers": report.workers, "pages": report.pages, "chunks": report.chunks,
                    "chunks_embedded": report.chunks_embedded, "chunks_from_cache": report.chunks_from_cache,
                    "cache_hit_share": round(report.chunks_from_cache / max(report.chunks, 1), 4), "stages": st}
    say("\n== ingest (fresh store)")
    say(f"wall {wall:.1f} s with {report.workers} parse worker(s); {report.pages} pages -> {report.pages / wall:.2f} pages/s")
    say("this process: " + " | ".join(f"{k} {v:.1f} s ({100 * st['share'][k]:.0f}%)" for k, v in st["seconds"].items()))
    say(f"parsers (worker processes, overlapped): {st['parse_in_workers_s']:.1f} s (text layer {st['pdf_text_s']:.1f} s, "
        f"tables {st['tables_s']:.1f} s); the embedder waited for them {st['seconds']['wait_parse']:.1f} s")
    say(f"chunks written {report.chunks}: embedded {report.chunks_embedded}, from the cache {report.chunks_from_cache} "
        f"({100 * out['fresh']['cache_hit_share']:.1f}%: passages repeated across the filings)")

    # 3. share of text embedded
    toks = emb.count_tokens(texts)
    over = [n for n in toks if n > emb.max_tokens]
    total = sum(toks)
    cut = sum(n - emb.max_tokens for n in over)
    out["text_embedded"] = {"tokens": total, "chunks_over_limit": len(over), "share": round((total - cut) / max(total, 1), 4),
                            "median_tokens": statistics.median(toks) if toks else None}
    say("\n== text embedded")
    say(f"tokens {total} over {len(toks)} chunks (median {out['text_embedded']['median_tokens']}, limit {emb.max_tokens}); "
        f"chunks over the limit: {len(over)}; share of text embedded: {100 * out['text_embedded']['share']:.1f}%")

    # 4. the floor: raw torch fp32 encode() of every chunk text written
    if not args.skip_floor and texts:
        from sentence_transformers import SentenceTransformer

        from ragkit.models import resolve

        model = SentenceTransformer(str(resolve(args.embed, "embedder", settings.cache_dir)), device="cpu", local_files_only=True)
        model.encode(texts[:32], batch_size=32, show_progress_bar=False)  # warm
        t0 = time.perf_counter()
        model.encode(texts, batch_size=32, normalize_embeddings=True, show_progress_bar=False)
        floor = time.perf_counter() - t0
        out["floor"] = {"encode_fp32_s": round(floor, 2), "texts": len(texts), "ratio": round(wall / floor, 3)}
        say("\n== floor")
        say(f"raw torch fp32 encode() of the same {len(texts)} chunk texts: {floor:.1f} s ({len(texts) / floor:.1f} texts/s); "
            f"ingest wall / floor = {wall / floor:.2f} (target <= 0.6)")
        del model

    # 5. re-ingest: unchanged, then one changed file
    from ragkit.ingest import ingest

    t0 = time.perf_counter()
    again = ingest(pdfs, settings)
    dt = time.perf_counter() - t0
    out["reingest_unchanged"] = {"wall_s": round(dt, 2), "unchanged": again.unchanged, "chunks": again.chunks}
    say("\n== re-ingest (unchanged)")
    say(f"{dt:.2f} s; unchanged {again.unchanged}, added {again.added}, chunks written {again.chunks}")
    victim = pdfs[len(pdfs) // 2]
    changed = tmp / "changed.pdf"
    drop_page(victim, changed, 2)
    os.replace(changed, victim)
    t0 = time.perf_counter()
    one = ingest(pdfs, settings)
    dt = time.perf_counter() - t0
    if one.failed:
        say("FAILED:", one.failed)
    out["reingest_one_changed"] = {"failed": one.failed, "file": victim.name, "wall_s": round(dt, 2), "updated": one.updated, "chunks": one.chunks,
                                   "chunks_embedded": one.chunks_embedded, "chunks_from_cache": one.chunks_from_cache}
    say("\n== re-ingest after one changed file")
    say(f"{victim.name} with its page 3 dropped: {dt:.1f} s; updated {one.updated}, unchanged {one.unchanged}; chunks "
        f"written {one.chunks}: embedded {one.chunks_embedded}, from the cache {one.chunks_from_cache}")

    # 6. sequential (no overlap), same corpus as the fresh run had
    if args.sequential:
        shutil.copy(src[len(src) // 2], victim)  # back to the original
        seq, swall = fresh_ingest(pdfs, settings_for("store-seq"), overlap=False, embedder=emb)
        sst = stages(seq, swall)
        out["sequential"] = {"wall_s": round(swall, 2), "stages": sst, "overlap_gain": round(swall / wall, 3)}
        say("\n== fresh ingest, parsing in-process (overlap off)")
        say(f"wall {swall:.1f} s vs {wall:.1f} s with workers (x{swall / wall:.2f}); "
            + " | ".join(f"{k} {v:.1f} s" for k, v in sst["seconds"].items()))

    # 7. parsing alone per engine
    if not args.skip_engines:
        say("\n== parsing alone (load(), all pages, this process)")
        out["engines"] = {}
        for label, kw in [
            ("pypdfium2 text layer + tables", {"pdf_engine": "pypdfium2"}),
            ("pypdfium2 text layer, no tables", {"pdf_engine": "pypdfium2", "tables": False}),
            ("pypdf extract_text()", {"pdf_engine": "pypdf"}),
        ]:
            t0 = time.perf_counter()
            n_tables = 0
            for p in pdfs:
                n_tables += sum(1 for b in loaders.load(p, **kw) if b.kind == "table")
            dt = time.perf_counter() - t0
            out["engines"][label] = {"s": round(dt, 2), "pages_s": round(report.pages / dt, 1), "tables": n_tables}
            say(f"{label:34s} {dt:6.1f} s  {report.pages / dt:6.1f} pages/s  table blocks {n_tables}")

    if args.lookup_at:
        out["lookup"] = lookup_cost(args.lookup_at, tmp / "lookup", say)

    if args.json:
        print(json.dumps(out, indent=2))
    shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
