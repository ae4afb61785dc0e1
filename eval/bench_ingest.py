"""Ingest benchmark on the 12 SEC 10-Q filings (prints figures; not a test).

    .venv/bin/python eval/bench_ingest.py [--docs DIR] [--embed minilm] [--skip-floor] [--skip-engines]

1. ingest into a fresh store: pages/s, sections/s, parse / embed / store time, chunks;
2. the share of text embedded (chunks are bounded by the embedder's limit: every token
   is counted with the embedder's tokenizer, none is truncated);
3. the floor: raw encode() of the same texts, and total ingest wall time / floor;
4. re-ingest of the unchanged corpus;
5. parsing alone: pypdfium2 (text layer, with and without table detection) vs pypdf,
   and pypdf's layout mode on one filing (the table alternative that was measured).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import ragkit  # noqa: E402,F401  (offline switches)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--docs", type=Path, default=ROOT.parent / "shared" / "corpora" / "sec-10q-docugami" / "docs")
    ap.add_argument("--embed", default="minilm")
    ap.add_argument("--skip-floor", action="store_true")
    ap.add_argument("--skip-engines", action="store_true")
    args = ap.parse_args()

    from ragkit.config import load_settings
    from ragkit.embed import load_embedder
    from ragkit.ingest import ingest, loaders, pipeline
    from ragkit.store import ChromaStore

    pdfs = sorted(args.docs.glob("*.pdf"))
    if not pdfs:
        sys.exit(f"no PDFs in {args.docs}")
    tmp = Path(tempfile.mkdtemp(prefix="ragkit-bench-"))
    settings = load_settings(store=tmp / "store", embed={"model": args.embed}, cache_dir=tmp / "cache")
    emb = load_embedder(settings)

    t = {"parse": 0.0, "embed": 0.0, "store": 0.0}
    counts = {"sections": 0, "pages": 0, "chunks": 0}
    texts: list[str] = []

    real_chunk_file = pipeline.chunk_file

    def chunk_file(path, s, e):
        t0 = time.perf_counter()
        out = real_chunk_file(path, s, e)
        t["parse"] += time.perf_counter() - t0
        chunks, n_sections, n_pages = out
        counts["sections"] += n_sections
        counts["pages"] += n_pages or 0
        counts["chunks"] += len(chunks)
        return out

    real_embed = emb.embed_documents

    def embed_documents(batch, progress=None):
        t0 = time.perf_counter()
        out = real_embed(batch, progress=progress)
        t["embed"] += time.perf_counter() - t0
        texts.extend(batch)
        return out

    def timed(fn):
        def wrapper(*a, **k):
            t0 = time.perf_counter()
            try:
                return fn(*a, **k)
            finally:
                t["store"] += time.perf_counter() - t0
        return wrapper

    pipeline.chunk_file = chunk_file
    emb.embed_documents = embed_documents
    for name in ("add_chunks", "commit_document", "has_chunks", "gc", "documents", "_delete_unreferenced"):
        setattr(ChromaStore, name, timed(getattr(ChromaStore, name)))
    for k in loaders.STATS:
        loaders.STATS[k] = 0

    print(f"corpus: {len(pdfs)} PDFs in {args.docs}; embedder {emb.name} (max {emb.max_tokens} tokens); store {tmp}")
    if emb.name == "minilm":
        emb._load()  # model load is a one-off, not ingest work
    t0 = time.perf_counter()
    report = ingest(pdfs, settings)
    wall = time.perf_counter() - t0
    if report.failed:
        print("FAILED:", report.failed)
    st = loaders.STATS
    other = wall - t["parse"] - t["embed"] - t["store"]
    print("\n== ingest (fresh store)")
    print(f"wall {wall:.1f} s  | parse {t['parse']:.1f} s (text layer {st['pdf_text_s']:.1f} s, tables {st['table_s']:.1f} s, "
          f"sections+chunking {t['parse'] - st['pdf_text_s'] - st['table_s']:.1f} s) | embed {t['embed']:.1f} s | "
          f"store {t['store']:.1f} s | other {other:.1f} s (incl. BM25 index, if any)")
    print(f"pages {counts['pages']} -> {counts['pages'] / wall:.2f} pages/s overall, {counts['pages'] / t['parse']:.1f} pages/s parsing")
    print(f"sections {counts['sections']} -> {counts['sections'] / wall:.2f} sections/s; tables found {st['tables']:.0f}")
    print(f"chunks {counts['chunks']} (written {report.chunks}); embedded {len(texts)} texts, {len(texts) / t['embed']:.1f} chunks/s")

    # share of the text the embedder actually reads
    toks = emb.count_tokens(texts)
    over = [n for n in toks if n > emb.max_tokens]
    cut = sum(n - emb.max_tokens for n in over)
    total = sum(toks)
    print("\n== text embedded")
    print(f"tokens {total} over {len(toks)} chunks (median {statistics.median(toks):.0f}, max {max(toks)}, limit {emb.max_tokens});"
          f" chunks over the limit: {len(over)}; share of text embedded: {100 * (total - cut) / total:.1f}%")

    if not args.skip_floor and emb.name == "minilm":
        model = emb._load()
        t0 = time.perf_counter()
        model.encode(texts, batch_size=settings.embed.batch_size, normalize_embeddings=True, show_progress_bar=False)
        floor = time.perf_counter() - t0
        print("\n== floor")
        print(f"raw encode() of the same {len(texts)} texts: {floor:.1f} s; ingest wall / floor = {wall / floor:.2f}")

    t0 = time.perf_counter()
    again = ingest(pdfs, settings)
    print("\n== re-ingest (unchanged)")
    print(f"{time.perf_counter() - t0:.2f} s; unchanged {again.unchanged}, added {again.added}, chunks written {again.chunks}")

    if not args.skip_engines:
        print("\n== parsing alone (load(), all pages)")
        n_pages = counts["pages"]
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
            print(f"{label:34s} {dt:6.1f} s  {n_pages / dt:6.1f} pages/s  table blocks {n_tables}")
        import pypdf

        one = pdfs[0]
        reader = pypdf.PdfReader(str(one))
        t0 = time.perf_counter()
        for page in reader.pages:
            page.extract_text(extraction_mode="layout")
        dt = time.perf_counter() - t0
        print(f"{'pypdf layout mode (' + one.name + ')':34s} {dt:6.1f} s  {len(reader.pages) / dt:6.1f} pages/s  (columns as runs of spaces; no table blocks)")


if __name__ == "__main__":
    main()
