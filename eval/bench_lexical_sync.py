"""What a machine pays to get a lexical index that is never stale (issue 26): a reader of a
Chroma server builds its own tantivy index once from the server's chunks
(`retrieve.lexical = "tantivy"`, `ragkit.store.lexical_tantivy.open_index`), then keeps it
in step by adding and deleting only the documents that changed.

    .venv/bin/python eval/bench_lexical_sync.py [--chunks 100000 1000000] [--json]

For each size N it prints, on one core:

- `pull_s`: reading every chunk's text and metadata from Chroma, document by document, as a
  reader without sidecars does (`collection.get(where doc_id)`). Measured on the embedded
  100K-chunk bench store (`eval/bench_corpus.py`, `/tmp/ragkit-bench/chroma-100000`), which
  holds no HTTP hop: a server adds its own per-request cost. For sizes without a built
  store it is projected linearly from the 100K figure, and the output says so.
- `index_s`, `disk_mb`: tokenizing (ragkit's analysis) and indexing the N chunks into a
  new tantivy index, committed, on chunks generated exactly as the bench corpus makes them
  (real contract sentences, 200 chunks a document). The chunks come from a benchmark-only
  source object that answers `documents()` and `col.get(...)` like a store. It is a stand-in
  for the store here only; the product path reads the store.
- `step_s`: the cost of keeping in step. One document (200 chunks) is added and one
  removed, then `refresh` runs against the saved N-chunk index.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_corpus as bc  # noqa: E402


@dataclass
class _Rec:
    doc_id: str
    n_chunks: int


class _Col:
    def __init__(self, src):
        self.src = src

    def get(self, where: dict, include=None):
        ids, texts, metas, _ = bc.make_doc(self.src.srcs, self.src.n, self.src.index[where["doc_id"]])
        return {"ids": ids, "documents": texts, "metadatas": metas}


class GeneratedChunks:
    """BENCHMARK-ONLY source of chunks: the bench corpus's documents, generated on demand, with
    the two calls the lexical index makes of a store (`documents()`, `col.get`)."""

    def __init__(self, n: int, docs: range):
        self.n = n
        self.srcs = bc.source_texts()
        self.index = {bc.doc_id(n, d): d for d in docs}
        self.col = _Col(self)
        self.written: set[str] = set()

    def documents(self):
        return [_Rec(d, bc.CHUNKS_PER_DOC) for d in self.index]

    def ensure_sidecar(self, doc_id, n_chunks) -> bool:
        return False  # no sidecars: every document's chunks are read as from a server


def pull_100k() -> float | None:
    """Seconds to read every chunk of the cached 100K store from Chroma, a document at a time."""
    from ragkit.store import ChromaStore

    path = bc.store_path(100_000)
    if not (path / "chroma").exists():
        return None
    st = ChromaStore(path, url=None, collection=bc.COLLECTION, embedder_name=bc.EMBEDDER, dim=bc.DIM, create=False)
    t0 = time.perf_counter()
    n = 0
    for r in st.documents():
        got = st.col.get(where={"doc_id": r.doc_id}, include=["documents", "metadatas"])
        n += len(got["ids"])
    return time.perf_counter() - t0 if n else None


def run(n: int, pull_100k_s: float | None) -> dict:
    from ragkit.store import lexical_tantivy as LT

    n_docs = n // bc.CHUNKS_PER_DOC
    folder = Path(tempfile.mkdtemp(prefix=f"rk-lex-{n}-"))
    try:
        src = GeneratedChunks(n, range(n_docs))
        t0 = time.perf_counter()
        LT.refresh(src, folder)
        index_s = time.perf_counter() - t0
        disk = sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())
        # keeping in step: one document added, one removed
        src.index.pop(bc.doc_id(n, 0))
        src.index[bc.doc_id(n, n_docs)] = n_docs
        t1 = time.perf_counter()
        LT.refresh(src, folder)
        step_s = time.perf_counter() - t1
        ix = LT.open_index(src, folder, list(src.index))
        assert ix.n == n and bc.doc_id(n, 0) not in ix.docs
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    pull = None if pull_100k_s is None else pull_100k_s * n / 100_000
    return {"chunks": n, "index_s": round(index_s, 1), "disk_mb": round(disk / 1e6, 1), "step_s": round(step_s, 2),
            "pull_s": None if pull is None else round(pull, 1), "pull_measured": n == 100_000 and pull is not None}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--chunks", type=int, nargs="+", default=[100_000, 1_000_000])
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    pull = pull_100k()
    rows = [run(n, pull) for n in a.chunks]
    if a.json:
        print(json.dumps(rows, indent=2))
        return
    print("| chunks | pull from Chroma | tokenize + index | on disk | keep in step (1 doc in, 1 out) |")
    print("|---|---|---|---|---|")
    for r in rows:
        pull = "-" if r["pull_s"] is None else f"{r['pull_s']} s" + ("" if r["pull_measured"] else " (projected)")
        print(f"| {r['chunks']:,} | {pull} | {r['index_s']} s | {r['disk_mb']} MB | {r['step_s']} s |")


if __name__ == "__main__":
    main()
