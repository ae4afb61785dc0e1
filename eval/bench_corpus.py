"""Benchmark stores built from real text, cached and reused (used by bench_retrieval.py and
bench_ingest_growth.py; not a test).

Text: sentences of real contracts and guidance, from the shared corpora (not committed):
the 10 CUAD contracts (`cuad-10/txt`), the 61 ContractNLI dev NDAs (`contractnli-dev/dev.json`)
and the two FDA guidance documents (`regulatory/fda-guidance/*.md`), about 9K sentences.
A chunk is a run of consecutive sentences (60-180 words) starting at a random place in
one source text, with a section heading taken from a short sentence; so word frequencies,
lengths and vocabulary are those of real legal text. Vectors are random unit vectors
(384-dim, the minilm width): the embedder's time is not what is measured, and a query
vector is precomputed. Queries: the ContractNLI hypotheses, the CUAD category questions and
fragments of the source sentences.

A built store is cached at `/tmp/ragkit-bench/chroma-<N>` (override: RAGKIT_BENCH_DIR),
marked complete by `built.json`; the build is resumable (documents are committed in
batches, and a rerun skips those already committed). The store is written with Chroma
alone, as a store written before the sidecars and the incremental lexical index existed;
`prepare()` then derives them through the product's own sync (the upgrade path).

    nice -n 15 .venv/bin/python eval/bench_corpus.py --chunks 1000000   # build only
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import re
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import ragkit  # noqa: E402,F401  (offline switches)

DIM = 384
CHUNKS_PER_DOC = 200
EMBEDDER = "minilm"  # the identity recorded in the store, so a real document can be ingested into it
COLLECTION = "ragkit"


def shared_corpora() -> Path:
    env = os.environ.get("RAGKIT_SHARED_CORPORA")
    for cand in ([Path(env)] if env else []) + [ROOT.parent / "shared" / "corpora", Path("/work/shared/corpora")]:
        if cand.is_dir():
            return cand
    sys.exit("the shared corpora are not here: set RAGKIT_SHARED_CORPORA")


def bench_dir() -> Path:
    return Path(os.environ.get("RAGKIT_BENCH_DIR", "/tmp/ragkit-bench"))


_SENT = re.compile(r"(?<=[.;:!?])\s+(?=[A-Z(\"“0-9])")


def source_texts() -> list[list[str]]:
    """Each source document as its list of sentences."""
    base = shared_corpora()
    texts: list[str] = [p.read_text(errors="replace") for p in sorted((base / "cuad-10" / "txt").glob("*.txt"))]
    dev = json.loads((base / "contractnli-dev" / "dev.json").read_text())
    texts += [d["text"] for d in dev["documents"]]
    texts += [p.read_text(errors="replace") for p in sorted((base / "regulatory" / "fda-guidance").glob("*.md"))]
    out = []
    for t in texts:
        sents = [" ".join(s.split()) for s in _SENT.split(t)]
        sents = [s for s in sents if len(s.split()) >= 3]
        if len(sents) > 20:
            out.append(sents)
    return out


def queries(n: int, seed: int = 7) -> list[str]:
    base = shared_corpora()
    rng = random.Random(seed)
    dev = json.loads((base / "contractnli-dev" / "dev.json").read_text())
    qs = [v["hypothesis"] for v in dev["labels"].values()]
    seen = set()
    for line in (base / "cuad-10" / "cuad_qa.jsonl").read_text().splitlines():
        row = json.loads(line)
        if row["category"] not in seen:
            seen.add(row["category"])
            qs.append(f"Which clause covers {row['category'].lower()}?")
    srcs = source_texts()
    while len(qs) < n:
        s = rng.choice(rng.choice(srcs)).split()
        a = rng.randrange(max(1, len(s) - 6))
        qs.append(" ".join(s[a : a + rng.randint(5, 12)]))
    rng.shuffle(qs)
    return qs[:n]


def doc_id(n: int, d: int) -> str:
    return hashlib.sha256(f"bench-{n}-{d}".encode()).hexdigest()[:24]


def make_doc(srcs: list[list[str]], n: int, d: int) -> tuple[list[str], list[str], list[dict], np.ndarray]:
    """ids, texts, metas and unit vectors of document `d` of the N-chunk store (deterministic)."""
    rng = random.Random(f"{n}-{d}")
    did = doc_id(n, d)
    src = rng.choice(srcs)
    ids, texts, metas = [], [], []
    pos = rng.randrange(len(src))
    section = "1. Definitions"
    for i in range(CHUNKS_PER_DOC):
        if i % 5 == 0:
            head = rng.choice(src).split()[: rng.randint(2, 6)]
            section = f"{i // 5 + 1}. " + " ".join(head).rstrip(".,;:")
        want = rng.randint(60, 180)
        words: list[str] = []
        while len(words) < want:
            words += src[pos % len(src)].split()
            pos += 1
        if rng.random() < 0.1:
            pos = rng.randrange(len(src))
        texts.append(" ".join(words))
        ids.append(f"{did}:{i:05d}")
        metas.append({"doc_id": did, "doc_name": f"bench-{d:06d}.pdf", "section": section, "page_start": 1 + i // 4,
                      "page_end": 1 + i // 4, "chunk_index": i, "char_start": 0, "char_end": len(texts[-1]),
                      "kind": "text", "tokens": len(words)})
    vecs = np.random.default_rng(n * 1_000_003 + d).standard_normal((CHUNKS_PER_DOC, DIM)).astype(np.float32)
    vecs /= np.linalg.norm(vecs, axis=1, keepdims=True)
    return ids, texts, metas, vecs


def store_path(n: int) -> Path:
    return bench_dir() / f"chroma-{n}"


def build(n: int, log=print):
    """The cached N-chunk store (built, or resumed, when not complete). Returns its path."""
    from ragkit.store import ChromaStore, DocRecord

    path = store_path(n)
    if (path / "built.json").exists():
        return path
    n_docs = max(1, n // CHUNKS_PER_DOC)
    store = ChromaStore(path, url=None, collection=COLLECTION, embedder_name=EMBEDDER, dim=DIM, create=True)
    done = {r.key for r in store.documents()}
    srcs = source_texts()
    t0 = time.perf_counter()
    added = 0
    batch = 25
    for first in range(0, n_docs, batch):
        todo = [d for d in range(first, min(n_docs, first + batch)) if f"/bench/bench-{d:06d}.pdf" not in done]
        if not todo:
            continue
        recs = []
        for d in todo:
            ids, texts, metas, vecs = make_doc(srcs, n, d)
            for s in range(0, len(ids), 1000):  # raw Chroma: a store as written before sidecars existed
                store.col.upsert(ids=ids[s : s + 1000], embeddings=vecs[s : s + 1000], documents=texts[s : s + 1000],
                                 metadatas=metas[s : s + 1000])
            recs.append(DocRecord(key=f"/bench/bench-{d:06d}.pdf", doc_id=metas[0]["doc_id"], name=f"bench-{d:06d}.pdf",
                                  path=f"/bench/bench-{d:06d}.pdf", sha256=metas[0]["doc_id"], n_chunks=len(ids),
                                  n_sections=CHUNKS_PER_DOC // 5, n_pages=CHUNKS_PER_DOC // 4, ingested_at=time.time()))
            added += len(ids)
        for r in recs:
            store.commit_document(r)
        el = time.perf_counter() - t0
        log(f"  build {n:,}: {first + len(todo):,}/{n_docs:,} documents, {added / el:.0f} vectors/s", flush=True)
    (path / "built.json").write_text(json.dumps({"chunks": n, "documents": n_docs, "chunks_per_doc": CHUNKS_PER_DOC}))
    return path


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--chunks", type=int, nargs="+", default=[10000, 100000])
    a = ap.parse_args()
    for n in a.chunks:
        print(f"{n:,} chunks: {build(n)}", flush=True)
