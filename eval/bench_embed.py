"""Embedder backends on real chunk texts (prints figures; not a test).

    .venv/bin/python eval/bench_embed.py [--docs DIR] [--files 3] [--texts 384] [--rounds 2] [--threads 0] [--json]

Chunks the first --files SEC 10-Q filings with ragkit's own chunker (chunks bounded by
MiniLM's 256 word-pieces, as ingest makes them), samples --texts of them, and embeds them
with each variant: torch fp32 (the reference), torch bf16 (autocast), ONNX fp32, ONNX
int8; each with length-sorted batching, and torch fp32 / ONNX int8 also without it.
Variants run interleaved for --rounds rounds (best round kept), so a burst of other work
on a shared machine costs each alike. Prints texts/s, the thread count, and the cosine of
each variant's vectors to the fp32 ones (mean and min); also texts per CPU-second of
the process (all threads), which a shared machine disturbs less than wall time. The ONNX export into a temporary
cache happens before timing.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import ragkit  # noqa: E402,F401  (offline switches)

VARIANTS = [  # (label, embed settings, sort_by_length)
    ("torch fp32", {"backend": "torch", "precision": "fp32"}, True),
    ("torch bf16", {"backend": "torch", "precision": "bf16"}, True),
    ("onnx fp32", {"backend": "onnx", "precision": "fp32"}, True),
    ("onnx int8", {"backend": "onnx", "precision": "int8"}, True),
    ("torch fp32 unsorted", {"backend": "torch", "precision": "fp32"}, False),
    ("onnx int8 unsorted", {"backend": "onnx", "precision": "int8"}, False),
]


def chunk_texts(docs: Path, files: int, settings, emb) -> list[str]:
    from ragkit.ingest.pipeline import chunk_file

    pdfs = sorted(docs.glob("*.pdf"))[:files]
    if not pdfs:
        sys.exit(f"no PDFs in {docs}")
    out: list[str] = []
    for p in pdfs:
        chunks = chunk_file(p, settings, emb)[0]
        out.extend(c.embed_text() for c in chunks)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--docs", type=Path, default=ROOT.parent / "shared" / "corpora" / "sec-10q-docugami" / "docs")
    ap.add_argument("--files", type=int, default=3, help="filings to chunk")
    ap.add_argument("--texts", type=int, default=384, help="chunks sampled from them (0 = all)")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--threads", type=int, default=0, help="intra-op threads; 0 = the libraries' default")
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--only", default="", help="comma-separated labels to run (torch fp32 always runs)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()

    import numpy as np
    import torch

    from ragkit.config import load_settings
    from ragkit.embed import load_embedder

    cache = Path(tempfile.mkdtemp(prefix="ragkit-bench-embed-"))
    base = load_settings(cache_dir=cache, embed={"backend": "torch"})
    texts = chunk_texts(args.docs, args.files, base, load_embedder(base))
    random.Random(0).shuffle(texts)
    if args.texts:
        texts = texts[: args.texts]
    wanted = {w.strip() for w in args.only.split(",") if w.strip()}
    variants = [v for v in VARIANTS if not wanted or v[0] in wanted or v[0] == "torch fp32"]
    embedders = {}
    for label, kw, sort in variants:
        s = load_settings(cache_dir=cache, embed={**kw, "threads": args.threads, "batch_size": args.batch_size})
        e = load_embedder(s)
        if not sort:  # a second object: the sorted one stays in load_embedder's cache
            e = type(e).__new__(type(e))
            e.__dict__.update(load_embedder(s).__dict__)
            e.sort_by_length = False
        t0 = time.perf_counter()
        e.embed_documents(texts[:8])  # load (and export) outside the timing
        embedders[label] = (e, time.perf_counter() - t0)
    toks = embedders["torch fp32"][0].count_tokens(texts)
    best: dict[str, float] = {}
    best_cpu: dict[str, float] = {}  # CPU seconds of all threads: steadier than wall time on a shared machine
    vecs: dict[str, np.ndarray] = {}
    for _ in range(max(1, args.rounds)):
        for label, (e, _) in embedders.items():
            t0, c0 = time.perf_counter(), time.process_time()
            v = np.asarray(e.embed_documents(texts), dtype=np.float32)
            dt, dc = time.perf_counter() - t0, time.process_time() - c0
            best[label] = min(best.get(label, dt), dt)
            best_cpu[label] = min(best_cpu.get(label, dc), dc)
            vecs[label] = v
    ref = vecs["torch fp32"]
    threads = args.threads or torch.get_num_threads()
    rows = []
    for label, (e, load_s) in embedders.items():
        cos = (vecs[label] * ref).sum(1)
        rows.append({"variant": label, "texts_per_s": round(len(texts) / best[label], 2), "seconds": round(best[label], 3),
                     "texts_per_cpu_s": round(len(texts) / best_cpu[label], 2), "cosine_mean": round(float(cos.mean()), 6), "cosine_min": round(float(cos.min()), 6),
                     "load_s": round(load_s, 2)})
    fp32 = next(r for r in rows if r["variant"] == "torch fp32")["texts_per_s"]
    for r in rows:
        r["speedup_vs_torch_fp32"] = round(r["texts_per_s"] / fp32, 2)
    info = {"texts": len(texts), "files": args.files, "tokens_median": int(np.median(toks)), "tokens_max": int(max(toks)),
            "threads": threads, "cpus": os.cpu_count(), "batch_size": args.batch_size, "rounds": args.rounds,
            "load_avg_1m": round(os.getloadavg()[0], 2)}
    if args.json:
        print(json.dumps({"info": info, "variants": rows}, indent=1))
        return
    print(f"{info['texts']} chunks of {args.files} filings (median {info['tokens_median']} word-pieces, max {info['tokens_max']}); "
          f"{threads} threads of {info['cpus']} CPUs; batch {args.batch_size}; best of {args.rounds} interleaved rounds; "
          f"load average {info['load_avg_1m']}")
    print(f"{'variant':22s} {'texts/s':>8s} {'x fp32':>7s} {'texts/CPU-s':>12s} {'cos mean':>9s} {'cos min':>8s}")
    for r in rows:
        print(f"{r['variant']:22s} {r['texts_per_s']:8.1f} {r['speedup_vs_torch_fp32']:7.2f} {r['texts_per_cpu_s']:12.1f} "
              f"{r['cosine_mean']:9.5f} {r['cosine_min']:8.5f}")


if __name__ == "__main__":
    main()
