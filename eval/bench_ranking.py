"""Benchmark: how early the gold evidence comes in the ranked sources (a script that
prints figures, not a test).

    .venv/bin/python eval/bench_ranking.py                      # build (once) and measure every set
    .venv/bin/python eval/bench_ranking.py --sets contractnli --methods baseline,default
    .venv/bin/python eval/bench_ranking.py --build-only
    .venv/bin/python eval/bench_ranking.py --json

Stores are built once and cached outside the repository (`--cache`, default
/tmp/ragkit-rank/), each through the real ingest path (real embedder, real Chroma, real
BM25 index):

- contractnli: ContractNLI dev, all 1,037 items over its 61 NDAs. The NDAs' texts exist
  only inside `dev.json`, so each is written to `NAME.txt` where NAME is the file name the
  set's `doc` uses (`--doc NAME` matches the stored file without its last extension).
- sec: the SEC 10-Q single-document questions (the items with a `doc`) of
  `sets/sec-10q-aapl-amzn-nvda.jsonl` over the 12 filings (PDF).
- cuad: `sets/cuad.jsonl` (items with a gold clause) over the 10 CUAD contracts (PDF).

Each item is retrieved as `ragkit eval run --retrieval-only` retrieves it
(`ragkit.retrieve.retrieve(question, settings, docs=[doc])`) and scored by
`ragkit.eval.run.score_item`, so the figures are the eval report's. Per set and method it
prints: the strict evidence rule (a contiguous run of >= 80% of the evidence's tokens in
one source; the headline) and the loose one (90% of its words anywhere in a source), MRR
under both, gold evidence within the first N prompt tokens of the ranked sources (N =
1,000 ContractNLI, 2,000 CUAD; counted with the generator's tokenizer, the numbered
source blocks as the prompt holds them), the tokens paid up to the evidence, a gold
figure within the top 5 sources (SEC), and the prompt tokens of the prompt as built.

A method is a set of `retrieve` settings (see METHODS). `--split` scores the two halves of
the documents apart (documents ordered by name, alternate ones in each half), so a
setting tuned on one half is checked on the other.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import ragkit  # noqa: E402,F401  (offline switches)

SHARED = Path(os.environ.get("RAGKIT_SHARED_CORPORA", "/work/shared/corpora"))

SETS = {
    "contractnli": {"set": ROOT / "eval/sets/contractnli-dev.jsonl", "within": 1000},
    "sec": {"set": ROOT / "eval/sets/sec-10q-aapl-amzn-nvda.jsonl", "within": 2000},
    "cuad": {"set": ROOT / "eval/sets/cuad.jsonl", "within": 2000},
}

# retrieve settings per method; "baseline" is the ranking before issue 14, "default" the
# shipped settings
METHODS: dict[str, dict] = {
    "default": {},
    "hybrid_only": {"unit_rank": False, "dedupe": 0.0},  # the new tokenizer and heading field alone
    "units_dense": {"unit_dense_weight": 1.0},  # + the best unit by the embedder (units embedded at query time)
    "no_dedupe": {"dedupe": 0.0},
    "raw_query": {"search_instructions": True},
    "no_opening": {"opening_first": False},  # no first-chunk rule for title / parties / date questions  # search with the question as asked, instructions and all
}


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


# ---------------------------------------------------------------------- corpora and stores

def contractnli_corpus(folder: Path) -> Path:
    """The 61 dev NDAs as text files named after the set's `doc` (NAME.txt)."""
    dev = json.loads((SHARED / "contractnli-dev/dev.json").read_text(encoding="utf-8"))
    rendered: dict[int, str] = {}
    rpath = SHARED / "contractnli-dev/rendered/labels_rendered8.jsonl"
    if rpath.exists():
        for line in rpath.read_text(encoding="utf-8").splitlines():
            if line.strip():
                r = json.loads(line)
                rendered[int(r["doc_id"])] = r["rendered_basename"] + ".pdf"
    folder.mkdir(parents=True, exist_ok=True)
    for d in dev["documents"]:
        name = rendered.get(int(d["id"]), d["file_name"])
        p = folder / f"{name}.txt"
        if not p.exists() or p.read_text(encoding="utf-8") != d["text"]:
            p.write_text(d["text"], encoding="utf-8")
    return folder


def corpus_for(name: str, cache: Path) -> list[Path]:
    if name == "contractnli":
        return [contractnli_corpus(cache / "contractnli" / "docs")]
    if name == "sec":
        return [SHARED / "sec-10q-docugami/docs"]
    if name == "cuad":
        return [SHARED / "cuad-10/pdf"]
    raise SystemExit(f"unknown set {name!r}; choose from {', '.join(SETS)}")


def settings_for(name: str, cache: Path, **retrieve):
    from ragkit.config import load_settings

    s = load_settings(store=cache / name / "store")
    if retrieve:
        s = s.model_copy(update={"retrieve": s.retrieve.model_copy(update=retrieve)})
    return s


def lexical_signature() -> str:
    """What the BM25 index depends on besides the store: the tokenizer and the indexed
    text. A store whose saved index was built with another one gets it rebuilt."""
    import inspect

    from ragkit.retrieve import bm25

    src = inspect.getsource(bm25.tokenize) + inspect.getsource(getattr(bm25, "index_text", lambda t, m: t))
    return hashlib.sha256(src.encode()).hexdigest()[:16]


def build(name: str, cache: Path) -> None:
    from ragkit.ingest import ingest
    from ragkit.retrieve import bm25
    from ragkit.store import open_store
    from ragkit.embed import load_embedder

    settings = settings_for(name, cache)
    marker = cache / name / "built.json"
    paths = corpus_for(name, cache)
    if not marker.exists():
        t0 = time.perf_counter()
        log(f"[{name}] ingesting {', '.join(map(str, paths))} into {settings.store} ...")
        rep = ingest(paths, settings)
        if rep.failed:
            raise SystemExit(f"[{name}] ingest failed for {rep.failed}")
        marker.write_text(json.dumps({"chunks": rep.chunks, "ingest_s": round(time.perf_counter() - t0, 1)}))
        log(f"[{name}] {rep.chunks} chunks in {time.perf_counter() - t0:.0f} s")
    sig_path = cache / name / "lexical.sig"
    sig = lexical_signature()
    if not sig_path.exists() or sig_path.read_text() != sig:
        store = open_store(settings, load_embedder(settings), create=False)
        folder = bm25.index_dir(settings.store, settings.store_url, settings.collection, settings.cache_dir)
        import shutil

        shutil.rmtree(folder, ignore_errors=True)  # built with another tokenizer: rebuild
        bm25.refresh(store, folder)
        sig_path.write_text(sig)


# ---------------------------------------------------------------------- scoring

SKIP = 0  # --skip: leave out the first N items of each set (e.g. the ones a setting was chosen on)


def items_for(name: str, limit: int | None = None):
    from ragkit.eval.sets import load_set

    items = load_set(SETS[name]["set"])
    if name == "sec":
        items = [i for i in items if i.doc]  # single-document questions
    if name == "cuad":
        items = [i for i in items if i.evidence]
    items = items[SKIP:]
    return items[:limit] if limit else items


def record(item, r) -> dict:
    """The record `Answerer.answer` writes for a retrieval-only question."""
    prompt = r.prompt
    ctxs = list(prompt.contexts)
    ranked = sorted(ctxs, key=lambda c: (-c.score, c.n))
    rank_of = {c.chunk_id: i for i, c in enumerate(ranked, 1)}
    return {
        "id": item.id, "status": "ok", "retrieval_only": True, "mode": prompt.mode,
        "prompt_tokens": len(prompt.ids), "contexts": [
            {"n": c.n, "rank": rank_of[c.chunk_id], "doc": c.doc, "chunk_index": c.chunk_index, "page": c.page_start,
             "page_end": c.page_end, "section": c.section, "score": c.score, "tokens": c.tokens, "chunk_id": c.chunk_id,
             "text": c.text} for c in ctxs],
        "citations": [], "invalid_citations": [], "timings": dict(r.timings),
    }


def prime_queries(settings, items) -> None:
    """Embed every question of the set in one batch and answer `embed_query` from those
    vectors: the same model and normalization, one batch instead of one call per
    question (a single-text encode costs ~1.7 s under load here, most of a retrieve)."""
    from ragkit.embed import load_embedder

    emb = load_embedder(settings)
    if getattr(emb, "_primed", None) is not None or not hasattr(emb, "_encode"):
        return
    from ragkit.retrieve.query import search_query

    qs = list(dict.fromkeys([i.question for i in items] + [search_query(i.question) for i in items]))
    emb._load()
    primed = {}
    for k in range(0, len(qs), 32):  # embed_query is `_encode([text])[0]`: the same call, batched
        for q, v in zip(qs[k : k + 32], emb._encode(qs[k : k + 32])):
            primed[q] = v.tolist()
    orig = emb.embed_query
    emb._primed = primed
    emb.embed_query = lambda text: primed[text] if text in primed else orig(text)


def halves(items) -> tuple[set[str], set[str]]:
    docs = sorted({i.doc for i in items})
    return set(docs[0::2]), set(docs[1::2])


KEYS = ("evidence_strict", "evidence_in_context", "mrr_strict", "mrr", "evidence_within_tokens", "tokens_to_evidence_mean",
        "gold_figure_at_5", "answer_numbers_in_context", "prompt_tokens_mean", "mrr_strict_any_span",
        "any_span_within_tokens")
SHORT = {"mrr_strict_any_span": "mrr_any_span", "any_span_within_tokens": "any_span_N", "evidence_strict": "ev_strict", "evidence_in_context": "ev_loose", "mrr_strict": "mrr_strict", "mrr": "mrr_loose",
         "evidence_within_tokens": "ev_within_N", "tokens_to_evidence_mean": "tok_to_ev", "gold_figure_at_5": "fig@5",
         "answer_numbers_in_context": "fig_share_ctx", "prompt_tokens_mean": "prompt_tok", "n": "n",
         "n_with_evidence": "n_evid"}


def summarize(rows: list[dict], within: int) -> dict:
    from ragkit.eval.run import _agg

    agg = _agg(rows)[0]
    out = {k: agg.get(k) for k in KEYS if k != "evidence_within_tokens"}
    out["evidence_within_tokens"] = agg.get(f"evidence_within_{within}_tokens")
    out["any_span_within_tokens"] = agg.get(f"any_span_within_{within}_tokens")
    out["n"] = len(rows)
    out["n_with_evidence"] = sum(r.get("evidence_strict") is not None for r in rows)
    return out


def measure(name: str, cache: Path, method: str, gen, limit: int | None, split: bool, from_records: Path | None = None) -> dict:
    """Retrieve and score every item with `method`'s settings (records written to
    CACHE/NAME/records-METHOD.jsonl), or, with `from_records`, score records written
    before (e.g. by this script run on an older checkout: the baseline)."""
    from ragkit.eval.run import score_item
    from ragkit.retrieve import retrieve

    settings = settings_for(name, cache, **METHODS.get(method, {}))
    within = SETS[name]["within"]
    items = items_for(name, limit)
    old: dict[str, dict] = {}
    if from_records is not None:
        for line in from_records.read_text(encoding="utf-8").splitlines():
            if line.strip():
                rec = json.loads(line)
                old[rec["id"]] = rec
        items = [i for i in items if i.id in old]
    if from_records is None:
        prime_queries(settings, items_for(name))
    rows = []
    out_path = cache / name / f"records-{method}.jsonl"
    sink = open(out_path, "w", encoding="utf-8") if from_records is None else None
    t0 = time.perf_counter()
    for n, item in enumerate(items, 1):
        if from_records is None:
            rec = record(item, retrieve(item.question, settings, [item.doc] if item.doc else None, generator=gen))
            sink.write(json.dumps(rec, ensure_ascii=False) + "\n")
            sink.flush()
        else:
            rec = old[item.id]
        row = score_item(item, rec, settings.generator.prompt_rate_tok_s)
        row["doc"] = item.doc
        rows.append(row)
        if n % 100 == 0:
            log(f"[{name}/{method}] {n}/{len(items)} ({time.perf_counter() - t0:.0f} s)")
    if sink is not None:
        sink.close()
    res = {"all": summarize(rows, within), "retrieve_s_per_item": (time.perf_counter() - t0) / max(len(items), 1)}
    if split:
        a, b = halves(items)
    res["rows"] = [{k: r.get(k) for k in ("id", "evidence_rank_strict", "tokens_to_evidence", "gold_figure_at_5")} for r in rows]
    if split:
        res["half_a"] = summarize([r for r in rows if r["doc"] in a], within)
        res["half_b"] = summarize([r for r in rows if r["doc"] in b], within)
    return res


def fmt(v) -> str:
    return "-" if v is None else (f"{v:.3f}" if isinstance(v, float) and abs(v) < 10 else f"{v:.0f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sets", default="contractnli,sec,cuad")
    ap.add_argument("--methods", default="baseline,default", help=f"comma list of {', '.join(METHODS)}, or of retrieve settings joined by + (bm25_weight=1+rrf_k=20)")
    ap.add_argument("--cache", type=Path, default=Path("/tmp/ragkit-rank"))
    ap.add_argument("--limit", type=int, default=None, help="first N items of each set")
    ap.add_argument("--skip", type=int, default=0, help="leave out the first N items of each set (checked apart from them)")
    ap.add_argument("--split", action="store_true", help="also score the two halves of the documents apart")
    ap.add_argument("--build-only", action="store_true")
    ap.add_argument("--baseline-cache", type=Path, default=None,
                    help="a --cache folder where this script ran on the code before issue 14 (method default): "
                         "its records are scored here as the method 'before'")
    ap.add_argument("--json", action="store_true", help="one JSON object: {set: {method: figures}}")
    args = ap.parse_args()
    global SKIP
    SKIP = args.skip
    names = [s for s in args.sets.split(",") if s]
    methods = [m for m in args.methods.split(",") if m]
    for m in methods:
        if "=" in m and m not in METHODS:  # an ad-hoc method: "bm25_weight=1+rrf_k=20"
            METHODS[m] = {k: json.loads(v) for k, v in (kv.split("=", 1) for kv in m.split("+"))}
        if m not in METHODS and m != "before":
            raise SystemExit(f"unknown method {m!r}; choose from {', '.join(METHODS)}")
    for name in names:
        build(name, args.cache)
    if args.build_only:
        return
    from ragkit.generate import load_generator

    gen = load_generator(settings_for(names[0], args.cache), vocab_only=True)
    out: dict = {}
    for name in names:
        out[name] = {}
        base = args.baseline_cache / name / "records-default.jsonl" if args.baseline_cache else None
        if base is not None and base.exists():
            out[name]["before"] = measure(name, args.cache, "before", gen, args.limit, args.split, from_records=base)
        for m in methods:
            if m != "before":
                out[name][m] = measure(name, args.cache, m, gen, args.limit, args.split)
    if args.json:
        print(json.dumps({s: {m: {k: v for k, v in r.items() if k != "rows"} for m, r in ms.items()} for s, ms in out.items()},
                         indent=2))
        return
    cols = ("n", "n_with_evidence") + KEYS
    for name, ms in out.items():
        print(f"\n{name} (evidence within the first {SETS[name]['within']} prompt tokens; strict rule is the headline)")
        print("method".ljust(12) + "part".ljust(8) + "".join(SHORT[c].rjust(13) for c in cols) + "  s/item")
        for m, r in ms.items():
            for part in ("all", "half_a", "half_b"):
                if part in r:
                    print(m.ljust(12) + part.ljust(8) + "".join(fmt(r[part].get(c)).rjust(13) for c in cols)
                          + (f"  {r['retrieve_s_per_item']:.3f}" if part == "all" else ""))


if __name__ == "__main__":
    main()
