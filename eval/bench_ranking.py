"""Benchmark: how early the gold evidence comes in the ranked sources (a script that
prints figures, not a test).

    .venv/bin/python eval/bench_ranking.py                      # build (once) and measure every set
    .venv/bin/python eval/bench_ranking.py --sets contractnli --methods baseline,default
    .venv/bin/python eval/bench_ranking.py --build-only
    .venv/bin/python eval/bench_ranking.py --json
    .venv/bin/python eval/bench_ranking.py --lexical tantivy    # the lexical index on tantivy (retrieve.lexical)
    .venv/bin/python eval/bench_ranking.py --methods ms_marco,legal --half held   # the two rerankers, held-out halves
    .venv/bin/python eval/bench_ranking.py --sets cuad --methods default --lost-where   # where the evidence is lost, stage by stage
    .venv/bin/python eval/bench_ranking.py --sets financebench,cuad,sec,contractnli --seeded-split --lost-where  # per half

Stores are built once and cached outside the repository (`--cache`, default
/tmp/ragkit-rank/), each through the real ingest path (real embedder, real Chroma, real
BM25 index):

- contractnli: ContractNLI dev, all 1,037 items over its 61 NDAs. The NDAs' texts exist
  only inside `dev.json`, so each is written to `NAME.txt` where NAME is the file name the
  set's `doc` uses (`--doc NAME` matches the stored file without its last extension).
- sec: the SEC 10-Q single-document questions (the items with a `doc`) of
  `sets/sec-10q-aapl-amzn-nvda.jsonl` over the 12 filings (PDF).
- cuad: `sets/cuad.jsonl` (items with a gold clause) over the 10 CUAD contracts (PDF).
- financebench: `sets/financebench-dev.jsonl` over its 15 long filings (PDF), scored by the
  gold page(s) among the prompt's pages.

`--half tune|held` and `--seeded-split` take a set's halves from its split files where it
has them (ContractNLI: contractnli-dev-tune34 / held27; financebench-dev: -tune / -held),
the one split every tool reads; CUAD and SEC from `seeded_halves` (seed 24).

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
import random
import re
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import ragkit  # noqa: E402,F401  (offline switches)

SHARED = Path(os.environ.get("RAGKIT_SHARED_CORPORA", "/work/shared/corpora"))

SETS = {
    # the one ContractNLI split (eval/bench_checklist.py --split 24 wrote it): 34 NDAs choose, 27 are held out
    "contractnli": {"set": ROOT / "eval/sets/contractnli-dev.jsonl", "within": 1000,
                    "halves": (ROOT / "eval/sets/contractnli-dev-tune34.jsonl", ROOT / "eval/sets/contractnli-dev-held27.jsonl")},
    "sec": {"set": ROOT / "eval/sets/sec-10q-aapl-amzn-nvda.jsonl", "within": 2000},
    "cuad": {"set": ROOT / "eval/sets/cuad.jsonl", "within": 2000},
    # 15 long SEC filings (99-503 pages), scored by the gold page(s); split by company in the
    # set files themselves (ragkit.eval.sets.financebench_split), the one split every tool reads
    "financebench": {"set": ROOT / "eval/sets/financebench-dev.jsonl", "within": 2000,
                     "halves": (ROOT / "eval/sets/financebench-dev-tune.jsonl", ROOT / "eval/sets/financebench-dev-held.jsonl")},
    # 20 CUAD training contracts no model read (the review's one split, sets/cuad-review-split.json:
    # 10 tuning, 10 held out), asked as `cuad` asks, their gold clauses from master_clauses.csv
    # (`--make-cuadkept` writes the set files)
    "cuadkept": {"set": ROOT / "eval/sets/cuad-kept.jsonl", "within": 2000,
                 "halves": (ROOT / "eval/sets/cuad-kept-tune.jsonl", ROOT / "eval/sets/cuad-kept-held.jsonl")},
}


def make_cuadkept() -> None:
    """Write sets/cuad-kept{,-tune,-held}.jsonl: one item a (contract, category) with gold
    clauses, for the 20 kept cuad-train contracts of the review's split, worded as
    ragkit.eval.sets.convert_cuad words cuad-10's (ragkit/tune/cuad_questions.json). Items
    with no gold clause are left out (retrieval is scored on the gold clause)."""
    import ast
    import csv

    from ragkit.eval.sets import EvalItem, write_set

    split = json.loads((ROOT / "eval/sets/cuad-review-split.json").read_text())["cuadkept"]
    questions = json.loads((ROOT / "ragkit/tune/cuad_questions.json").read_text())["questions"]
    csv.field_size_limit(1 << 30)
    halves: dict[str, list] = {"tune": [], "held": []}
    with open(SHARED / "cuad-train" / "master_clauses.csv", encoding="utf-8", newline="") as f:
        for row in csv.DictReader(f):
            name = row["txt_file"]
            half = next((h for h in ("tune", "held") if name in split[h]), None)
            if half is None:
                continue
            for col, question in questions.items():
                cell = (row.get(col) or "").strip()
                clauses = [c.strip() for c in ast.literal_eval(cell) if c.strip()] if cell else []
                if not clauses:
                    continue
                slug = re.sub(r"[^a-z0-9]+", "-", f"{Path(name).stem[:40]}-{col}".lower()).strip("-")
                halves[half].append(EvalItem(id=f"cuadkept-{slug}", question=question, doc=name, answers=clauses,
                                             evidence=clauses[0], evidence_all=clauses if len(clauses) > 1 else [],
                                             tags=[f"category:{col}"]))
    for half, items in halves.items():
        write_set(items, ROOT / f"eval/sets/cuad-kept-{half}.jsonl")
    write_set(halves["tune"] + halves["held"], ROOT / "eval/sets/cuad-kept.jsonl")
    log(f"cuad-kept: {len(halves['tune'])} tuning items, {len(halves['held'])} held out")

# retrieve settings per method; "baseline" is the ranking before issue 14, "default" the
# shipped settings
METHODS: dict[str, dict] = {
    "default": {},
    "hybrid_only": {"unit_rank": False, "dedupe": 0.0},  # the new tokenizer and heading field alone
    "units_dense": {"unit_dense_weight": 1.0},  # + the best unit by the embedder (units embedded at query time)
    "no_dedupe": {"dedupe": 0.0},
    "raw_query": {"search_instructions": True},
    "no_opening": {"opening_first": False},  # no first-chunk rule for title / parties / date questions  # search with the question as asked, instructions and all
    "no_rerank": {"rerank": "off"},  # the ranking without the cross-encoder stage (issue 24)
    "rerank": {"rerank": "onnx"},  # the cross-encoder at the shipped pool and weight
    # the reranker trained on contracts (`ragkit tune reranker`, registry legal-minilm-l12) in the same place
    "legal": {"rerank": "onnx", "rerank_model": "legal-minilm-l12"},
    "ms_marco": {"rerank": "onnx", "rerank_model": "ms-marco-minilm-l12"},
}


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def _value(v: str):
    """An ad-hoc method's value: JSON (2.0, true, null) or else the word itself (onnx)."""
    try:
        return json.loads(v)
    except ValueError:
        return v


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
    if name == "financebench":
        return [SHARED / "financebench-dev/pdfs"]
    if name == "cuadkept":
        split = json.loads((ROOT / "eval/sets/cuad-review-split.json").read_text())["cuadkept"]
        return [SHARED / "cuad-train/txt" / n for n in split["tune"] + split["held"]]
    raise SystemExit(f"unknown set {name!r}; choose from {', '.join(SETS)}")


UNCACHED = False  # --uncached: no score memo, so the reranker runs for every pair and its wall time is measured
OVER_STORE = False  # --over-store: each question asked of the whole store, its document not named
SEEDED_SPLIT = False  # --seeded-split: also score seeded_halves apart ("tune", "held")
GRID_MODEL: str | None = None  # --grid-model: the reranker the grid's pools and weights are tried with
EMBED_MODEL: str | None = None  # --embed-model: another embedder (its own stores: use another --cache)


def settings_for(name: str, cache: Path, **retrieve):
    from ragkit.config import load_settings

    s = load_settings(store=cache / name / "store", **({"embed": {"model": EMBED_MODEL}} if EMBED_MODEL else {}))
    if retrieve:
        s = s.model_copy(update={"retrieve": s.retrieve.model_copy(update=retrieve)})
    return s


def lexical_signature() -> str:
    """What the BM25 index depends on besides the store: the tokenizer and the indexed
    text. A store whose saved index was built with another one gets it rebuilt."""
    import inspect

    from ragkit.store import lexical

    src = inspect.getsource(lexical.tokenize) + inspect.getsource(getattr(lexical, "index_text", lambda t, m: t))
    return hashlib.sha256(src.encode()).hexdigest()[:16]


LEXICAL = "segments"  # --lexical: the lexical index's engine (retrieve.lexical); records get a suffix for tantivy


def use_lexical(name: str) -> None:
    """Route the product's lexical calls (`retrieve`, ingest's sync, this script's build) to
    the engine `name`, through the dispatcher's table (ragkit/store/lexical_backend.py)."""
    global LEXICAL
    LEXICAL = name
    if name == "segments":
        return
    from ragkit.store import lexical, lexical_backend

    mod = lexical_backend.module_for(name)
    lexical.index_dir, lexical.open_index, lexical.refresh = mod.index_dir, mod.open_index, mod.refresh


def build(name: str, cache: Path) -> None:
    from ragkit.embed import load_embedder
    from ragkit.ingest import ingest
    from ragkit.store import lexical, open_store

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
    sig_path = cache / name / ("lexical.sig" if LEXICAL == "segments" else f"lexical-{LEXICAL}.sig")
    sig = lexical_signature()
    if not sig_path.exists() or sig_path.read_text() != sig:
        store = open_store(settings, load_embedder(settings), create=False)
        folder = lexical.index_dir(settings.store, settings.store_url, settings.collection, settings.cache_dir)
        import shutil

        shutil.rmtree(folder, ignore_errors=True)  # built with another tokenizer: rebuild
        lexical.refresh(store, folder)
        sig_path.write_text(sig)


# ---------------------------------------------------------------------- scoring

SKIP = 0  # --skip: leave out the first N items of each set (e.g. the ones a setting was chosen on)


def items_for(name: str, limit: int | None = None):
    from ragkit.eval.sets import load_set

    items = load_set(SETS[name]["set"])
    if name == "sec":
        items = [i for i in items if i.doc]  # single-document questions
    if name in ("cuad", "cuadkept"):
        items = [i for i in items if i.evidence]
    items = items[SKIP:]
    return items[:limit] if limit else items


def own_pages(item, rec: dict) -> dict:
    """`rec` as scored over the store (--over-store): a source's page counts for the gold page
    only in the question's own document."""
    return {**rec, "contexts": [c if c["doc"] == item.doc else {**c, "page": None, "page_end": None}
                                for c in rec.get("contexts", [])]}


def record(item, r) -> dict:
    """The record `Answerer.answer` writes for a retrieval-only question (and the
    reranker's report, when it ran)."""
    prompt = r.prompt
    ctxs = list(prompt.contexts)
    ranked = sorted(ctxs, key=lambda c: (-c.score, c.n))
    rank_of = {c.chunk_id: i for i, c in enumerate(ranked, 1)}
    ce = dict(getattr(getattr(r, "rerank", None), "scores", None) or {})  # chunk id -> cross-encoder logit
    return {"rerank": r.rerank.to_json() if getattr(r, "rerank", None) else None,
        "id": item.id, "status": "ok", "retrieval_only": True, "mode": prompt.mode,
        "prompt_tokens": len(prompt.ids), "contexts": [
            {"n": c.n, "rank": rank_of[c.chunk_id], "doc": c.doc, "chunk_index": c.chunk_index, "page": c.page_start,
             "page_end": c.page_end, "section": c.section, "score": c.score, "tokens": c.tokens, "chunk_id": c.chunk_id,
             "ce": ce.get(c.chunk_id), "text": c.text} for c in ctxs],
        "citations": [], "invalid_citations": [], "timings": dict(r.timings),
        "routed": {"names": list(r.routed), "documents": [d.name for d in r.docs]} if getattr(r, "routed", None) else None,
    }


_SESSIONS: dict[int, object] = {}


def session_for(settings):
    """One `ragkit.session.Session` per Settings object (its embedder, store, reranker and
    lexical index loaded once for every item, as `eval run` holds one), or the Settings
    itself on a checkout without sessions."""
    try:
        from ragkit.session import Session
    except ImportError:
        return settings
    key = id(settings)
    if key not in _SESSIONS:
        _SESSIONS[key] = (settings, Session(settings))
    return _SESSIONS[key][1]


def prime_queries(settings, items) -> None:
    """Embed every question of the set in one batch and answer `embed_query` from those
    vectors: the same model and normalization, one batch instead of one call per
    question (a single-text encode costs ~1.7 s under load here, most of a retrieve)."""
    from ragkit.embed import load_embedder

    emb = session_for(settings).embedder if hasattr(session_for(settings), "memo") else load_embedder(settings)
    emb = getattr(emb, "inner", emb)  # a Session's embedder remembers vectors around the model's
    if not hasattr(emb, "_encode"):
        return
    from ragkit.retrieve.abstain import PROBES
    from ragkit.retrieve.query import search_query

    # the questions, their search texts, and the abstention gate's probes (asked once per document)
    primed = getattr(emb, "_primed", None)
    qs = list(dict.fromkeys([i.question for i in items] + [search_query(i.question) for i in items] + PROBES))
    qs = [q for q in qs if primed is None or q not in primed]
    if primed is None:
        primed = {}
        orig = emb.embed_query
        emb._primed = primed
        emb.embed_query = lambda text: primed[text] if text in primed else orig(text)
    emb._load()
    pre = getattr(emb, "query_prefix", "")  # bge-small-en: queries take an instruction prefix
    for k in range(0, len(qs), 32):  # embed_query is `_encode([prefix + text])[0]`: the same call, batched
        for q, v in zip(qs[k : k + 32], emb._encode([pre + q for q in qs[k : k + 32]])):
            primed[q] = v.tolist()


class ScoreMemo:
    """The cross-encoder's scores of (query, passage) pairs, kept on disk
    (CACHE/NAME/rerank-scores.jsonl), so a grid of pool sizes and weights scores each pair
    once. Each pair's line keeps the process CPU time its batch cost per pair (all
    onnxruntime threads; `time.process_time`) and its tokens, so the cost of a question at
    any pool size is the sum over the pairs it asked for, cached or not."""

    def __init__(self, path: Path, inner):
        self.path, self.inner = path, inner
        self.known: dict[str, tuple[float, float, int]] = {}
        if path.exists():
            for line in path.read_text(encoding="utf-8").splitlines():
                if line.strip():
                    d = json.loads(line)
                    self.known[d["k"]] = (d["s"], d["cpu"], d["tok"])
        self.asked_cpu = 0.0  # CPU of the pairs asked since the last reset (as measured when first scored)
        self.asked_pairs = 0
        self.asked_tokens = 0

    @staticmethod
    def key(query: str, passage: str) -> str:
        return hashlib.sha1(f"{query}\x00{passage}".encode()).hexdigest()

    def score(self, query: str, passages: list[str]) -> list[float]:
        keys = [self.key(query, p) for p in passages]
        missing = [i for i, k in enumerate(keys) if k not in self.known]
        if missing:
            texts = [passages[i] for i in missing]
            c0 = time.process_time()
            scores = self.inner.score(query, texts)
            per = (time.process_time() - c0) / len(missing)
            toks = self.inner.count_tokens(query, texts) if hasattr(self.inner, "count_tokens") else [0] * len(texts)
            with open(self.path, "a", encoding="utf-8") as f:
                for i, sc, t in zip(missing, scores, toks):
                    self.known[keys[i]] = (float(sc), per, int(t))
                    f.write(json.dumps({"k": keys[i], "s": float(sc), "cpu": per, "tok": int(t)}) + "\n")
        for k in keys:
            self.asked_cpu += self.known[k][1]
            self.asked_tokens += self.known[k][2]
        self.asked_pairs += len(keys)
        return [self.known[k][0] for k in keys]

    def reset(self) -> tuple[float, int, int]:
        out = (self.asked_cpu, self.asked_pairs, self.asked_tokens)
        self.asked_cpu, self.asked_pairs, self.asked_tokens = 0.0, 0, 0
        return out


def memo_path(settings, cache: Path, name: str) -> Path:
    """The score memo of the settings' reranker model (one file per model: the scores are its own)."""
    model = settings.retrieve.rerank_model
    tag = "" if model == "ms-marco-minilm-l12" else "-" + hashlib.sha1(model.encode()).hexdigest()[:8]
    return cache / name / f"rerank-scores{tag}.jsonl"


def prime_reranker(settings, path: Path):
    """Wrap the process's reranker (the one `retrieve` loads) in a ScoreMemo; None when the
    settings turn reranking off."""
    from ragkit.rerankers import load_reranker

    sess = session_for(settings)
    r = sess.reranker if hasattr(sess, "memo") else load_reranker(settings)
    if r is None:
        return None
    if not isinstance(getattr(r, "_memo", None), ScoreMemo):
        memo = ScoreMemo(path, _Unwrapped(r))
        r._memo = memo
        r.score = memo.score
    return r._memo


class _Unwrapped:
    """The reranker's own score method, kept before ScoreMemo replaces it on the instance."""

    def __init__(self, r):
        self._score = r.score
        self._r = r

    def score(self, query, passages):
        return self._score(query, passages)

    def count_tokens(self, query, passages):
        return self._r.count_tokens(query, passages) if hasattr(self._r, "count_tokens") else [0] * len(passages)


# The split that chooses the reranker's pool and weight: each set's documents, sorted by name
# and shuffled with this seed; the first half (rounded down) chooses, the other reports.
SPLIT_SEED = 24


def seeded_halves(items, seed: int = SPLIT_SEED, name: str | None = None) -> tuple[set[str], set[str]]:
    """(tuning documents, held-out documents). A set whose split is written as two set files
    (SETS[name]["halves"]) takes it from them: one split for every tool."""
    files = SETS.get(name or "", {}).get("halves")
    if files:
        from ragkit.eval.sets import load_set

        return tuple({i.doc for i in load_set(f)} for f in files)  # type: ignore[return-value]
    docs = sorted({i.doc for i in items})
    random.Random(seed).shuffle(docs)
    return set(docs[: len(docs) // 2]), set(docs[len(docs) // 2 :])


def halves(items) -> tuple[set[str], set[str]]:
    docs = sorted({i.doc for i in items})
    return set(docs[0::2]), set(docs[1::2])


KEYS = ("rank1_strict", "page_hit", "pages_all_hit", "page_hit_at_3", "gold_figure_in_prompt", "evidence_strict", "evidence_in_context", "mrr_strict", "mrr", "evidence_within_tokens", "tokens_to_evidence_mean",
        "gold_figure_at_5", "answer_numbers_in_context", "prompt_tokens_mean", "mrr_strict_any_span",
        "any_span_within_tokens", "own_doc_first")
SHORT = {"own_doc_first": "own_doc@1", "rank1_strict": "rank1", "page_hit": "page_in_prompt", "pages_all_hit": "all_pages", "page_hit_at_3": "page@3", "gold_figure_in_prompt": "fig_in_prompt", "mrr_strict_any_span": "mrr_any_span", "any_span_within_tokens": "any_span_N", "evidence_strict": "ev_strict", "evidence_in_context": "ev_loose", "mrr_strict": "mrr_strict", "mrr": "mrr_loose",
         "evidence_within_tokens": "ev_within_N", "tokens_to_evidence_mean": "tok_to_ev", "gold_figure_at_5": "fig@5",
         "answer_numbers_in_context": "fig_share_ctx", "prompt_tokens_mean": "prompt_tok", "n": "n",
         "n_with_evidence": "n_evid"}


def lost_where(name: str, cache: Path, method: str, gen, limit: int | None, docs: set[str] | None = None) -> dict:
    """Where the gold evidence is lost, stage by stage, for the items with evidence text (or,
    financebench, gold pages) and a named document (measured, nothing chosen): whole in
    some chunk of the document (the strict rule; a set scored by pages: a chunk on a gold
    page; else chunking lost it), in the first stage's order (hybrid search and the
    sentence ranking, over every chunk of a document up to `unit_pool_max`, else the
    hybrid top `candidates`: the order the reranker's pool is cut from) within its first
    10 / 50 / at all, within the reranked top 10, and in the prompt. Per document size:
    up to `unit_pool_max` chunks, and over."""
    from ragkit.eval.metrics_text import evidence_in_text_strict
    from ragkit.retrieve import retrieve

    settings = settings_for(name, cache, **METHODS.get(method, {}))
    from ragkit.eval.metrics import gold_figure_in

    # the gold: evidence text (strict rule), else gold pages (financebench), else a gold figure (SEC)
    items = [i for i in items_for(name, limit)
             if i.doc and (i.evidence or i.evidence_all or i.page or (name == "sec" and i.answers))]
    if docs is not None:
        items = [i for i in items if i.doc in docs]
    session = session_for(settings)
    chunks_of: dict[str, list] = {}
    rows = []
    t0 = time.perf_counter()
    for n, item in enumerate(items, 1):
        r = retrieve(item.question, session, [item.doc], generator=gen)
        rec = r.docs[0]
        if rec.doc_id not in chunks_of:
            chunks_of[rec.doc_id] = session.store.chunks([rec.doc_id])
        hits = chunks_of[rec.doc_id]
        spans = [e for e in (item.evidence_all or []) if e] or [item.evidence]
        if item.evidence or item.evidence_all:
            gold = {h.id for h in hits if any(evidence_in_text_strict(e, h.text) for e in spans)}
        elif item.page:  # a set scored by its gold pages (financebench): a chunk on any of them
            gold = {h.id for h in hits if any(_on_page(h.meta, p) for p in (item.pages or [item.page]))}
        else:  # a set scored by its gold figure (SEC 10-Q): a chunk that holds one
            gold = {h.id for h in hits if gold_figure_in(item.answers, [h.text])}
        first = r.orders.get("first_stage", [])
        reranked = r.orders.get("reranked", first)

        def rank(order: list[str]) -> int | None:
            return next((k for k, cid in enumerate(order, 1) if cid in gold), None)

        fr, rr = rank(first), rank(reranked)
        # the cross-encoder's pool: the first stage's first rerank_pool, and the kind lane's chunks
        pool = set(first[: settings.retrieve.rerank_pool]) | set(r.orders.get("kinds", []))
        rows.append({"doc": item.doc, "long": len(hits) > settings.retrieve.unit_pool_max, "in_a_chunk": bool(gold),
                     "first_10": fr is not None and fr <= 10, "first_50": fr is not None and fr <= 50,
                     "first_any": fr is not None, "in_pool": bool(gold & pool), "reranked_10": rr is not None and rr <= 10,
                     "in_prompt": any(c.chunk_id in gold for c in r.prompt.contexts)})
        if n % 100 == 0:
            log(f"[{name}/{method} lost-where] {n}/{len(items)} ({time.perf_counter() - t0:.0f} s)")
    out = {}
    parts = [("all", rows), ("up to unit_pool_max chunks", [x for x in rows if not x["long"]]),
             ("over unit_pool_max chunks", [x for x in rows if x["long"]])]
    if SEEDED_SPLIT:  # --seeded-split: the halves apart (the held-out one first: it chose nothing)
        tune, held = seeded_halves(items_for(name), SPLIT_SEED, name)
        parts = [("held-out half", [x for x in rows if x["doc"] in held]),
                 ("tuning half", [x for x in rows if x["doc"] in tune])] + parts
    for part, sel in parts:
        if sel:
            out[part] = {"n": len(sel), **{k: round(sum(x[k] for x in sel) / len(sel), 3) for k in
                                           ("in_a_chunk", "first_10", "first_50", "first_any", "in_pool", "reranked_10",
                                            "in_prompt")}}
    return out


def _on_page(meta: dict, page: int) -> bool:
    start = meta.get("page_start")
    return start is not None and start <= page <= (meta.get("page_end") or start)


def print_lost_where(name: str, method: str, res: dict) -> None:
    print(f"{name} / {method}: gold evidence (strict rule) at each stage, share of items")
    print("| part | n | whole in a chunk | first stage top 10 | top 50 | anywhere in it | the cross-encoder's pool "
          "(with the kind lane) | reranked top 10 | in the prompt |")
    print("|---|---|---|---|---|---|---|---|---|")
    for part, f in res.items():
        print(f"| {part} | {f['n']} | {f['in_a_chunk']:.3f} | {f['first_10']:.3f} | {f['first_50']:.3f} | "
              f"{f['first_any']:.3f} | {f['in_pool']:.3f} | {f['reranked_10']:.3f} | {f['in_prompt']:.3f} |")


def summarize(rows: list[dict], within: int) -> dict:
    from ragkit.eval.run import _agg

    agg = _agg(rows)[0]
    out = {k: agg.get(k) for k in KEYS if k != "evidence_within_tokens"}
    out["evidence_within_tokens"] = agg.get(f"evidence_within_{within}_tokens")
    out["any_span_within_tokens"] = agg.get(f"any_span_within_{within}_tokens")
    out["n"] = len(rows)
    out["n_with_evidence"] = sum(r.get("evidence_strict") is not None for r in rows)
    ev = [r for r in rows if r.get("evidence_strict") is not None]
    out["rank1_strict"] = sum(r.get("evidence_rank_strict") == 1 for r in ev) / len(ev) if ev else None
    figs = [r["gold_figure_in_prompt"] for r in rows if r.get("gold_figure_in_prompt") is not None]
    out["gold_figure_in_prompt"] = sum(figs) / len(figs) if figs else None
    own = [r["own_doc_first"] for r in rows if "own_doc_first" in r]
    out["own_doc_first"] = sum(own) / len(own) if own else None
    return out


def measure(name: str, cache: Path, method: str, gen, limit: int | None, split: bool, from_records: Path | None = None,
            docs: set[str] | None = None, evidence_only: bool = False) -> dict:
    """Retrieve and score every item with `method`'s settings (records written to
    CACHE/NAME/records-METHOD.jsonl), or, with `from_records`, score records written
    before (e.g. by this script run on an older checkout: the baseline). `docs`: only the
    items of these documents; `evidence_only`: only items with gold evidence (SEC: all)."""
    from ragkit.eval.metrics import gold_figure_in
    from ragkit.eval.run import score_item
    from ragkit.retrieve import retrieve

    settings = settings_for(name, cache, **METHODS.get(method, {}))
    within = SETS[name]["within"]
    items = items_for(name, limit)
    if docs is not None:
        items = [i for i in items if i.doc in docs]
    if evidence_only and name != "sec":
        items = [i for i in items if i.evidence]
    old: dict[str, dict] = {}
    if from_records is not None:
        for line in from_records.read_text(encoding="utf-8").splitlines():
            if line.strip():
                rec = json.loads(line)
                old[rec["id"]] = rec
        items = [i for i in items if i.id in old]
    memo = None
    if from_records is None:
        prime_queries(settings, items_for(name))
        if not UNCACHED:
            memo = prime_reranker(settings, memo_path(settings, cache, name))
    rows = []
    costs: list[tuple[float, int, int]] = []
    measured: list[tuple[float, float]] = []  # --uncached: each question's reranker (wall s, CPU s) as it ran
    safe = method.replace("/", "_")
    safe += "-store" if OVER_STORE else ""
    out_path = cache / name / (f"records-{safe}.jsonl" if LEXICAL == "segments" else f"records-{safe}-{LEXICAL}.jsonl")
    sink = open(out_path, "w", encoding="utf-8") if from_records is None else None
    t0 = time.perf_counter()
    for n, item in enumerate(items, 1):
        if from_records is None:
            if memo is not None:
                memo.reset()
            named = [item.doc] if item.doc and not OVER_STORE else None
            rec = record(item, retrieve(item.question, session_for(settings), named, generator=gen))
            if memo is not None:
                costs.append(memo.reset())
            if memo is None and rec.get("rerank"):
                measured.append((rec["rerank"]["wall_s"], rec["rerank"]["cpu_s"]))
            sink.write(json.dumps(rec, ensure_ascii=False) + "\n")
            sink.flush()
        else:
            rec = old[item.id]
        row = score_item(item, own_pages(item, rec) if OVER_STORE else rec, settings.generator.prompt_rate_tok_s)
        row["doc"] = item.doc
        if OVER_STORE:  # the best source from the question's own document
            ctxs = sorted(rec.get("contexts", []), key=lambda c: c["rank"])
            row["own_doc_first"] = bool(ctxs) and ctxs[0]["doc"] == item.doc
        if name == "sec":  # a gold figure anywhere in the prompt (the set has no pages: the figure stands for its page)
            row["gold_figure_in_prompt"] = gold_figure_in(item.answers, [c["text"] for c in rec.get("contexts", [])])
        if name == "sec":  # the question's type: single- or multi-chunk, table or text
            row["type"] = "/".join(t for t in item.tags if t in ("single-chunk", "multi-chunk", "table", "text"))
        rows.append(row)
        if n % 100 == 0:
            log(f"[{name}/{method}] {n}/{len(items)} ({time.perf_counter() - t0:.0f} s)")
    if sink is not None:
        sink.close()
    res = {"all": summarize(rows, within), "retrieve_s_per_item": (time.perf_counter() - t0) / max(len(items), 1)}
    if costs:
        cpu = sorted(c[0] for c in costs)
        res["rerank_cost"] = {"questions": len(costs), "pairs_mean": statistics.fmean(c[1] for c in costs),
                              "pair_tokens_mean": sum(c[2] for c in costs) / max(sum(c[1] for c in costs), 1),
                              "cpu_s_p50": statistics.median(cpu), "cpu_s_mean": statistics.fmean(cpu),
                              "cpu_s_p90": cpu[int(0.9 * (len(cpu) - 1))]}
    if measured:
        wall, cpu = sorted(m[0] for m in measured), sorted(m[1] for m in measured)
        res["rerank_uncached"] = {"questions": len(measured), "wall_s_p50": statistics.median(wall),
                                  "wall_s_p90": wall[int(0.9 * (len(wall) - 1))], "cpu_s_p50": statistics.median(cpu)}
    if split:
        a, b = halves(items)
    res["rows"] = [{k: r.get(k) for k in ("id", "evidence_rank_strict", "tokens_to_evidence", "gold_figure_at_5")} for r in rows]
    if split:
        res["half_a"] = summarize([r for r in rows if r["doc"] in a], within)
        res["half_b"] = summarize([r for r in rows if r["doc"] in b], within)
    if SEEDED_SPLIT:  # the halves the reranker's settings were chosen and reported on
        tune, held = seeded_halves(items_for(name), SPLIT_SEED, name)
        res["tune"] = summarize([r for r in rows if r["doc"] in tune], within)
        res["held"] = summarize([r for r in rows if r["doc"] in held], within)
    if name == "sec":  # per question type (all items: too few per type for halves)
        res["by_type"] = {t: summarize([r for r in rows if r["type"] == t], within)
                          for t in sorted({r["type"] for r in rows})}
        # per filing length (the part measured): a 10-Q runs 20-80 pages, a 10-K 100-300

        pages = {d.name: d.n_pages or 0 for d in session_for(settings).store.documents()}
        bands = ((0, 40), (40, 60), (60, 10_000))
        res["by_pages"] = {f"{lo}-{hi - 1 if hi < 10_000 else ''} pages": {
            **summarize([r for r in rows if lo <= pages.get(r["doc"], 0) < hi], within),
            "filings": len({r["doc"] for r in rows if lo <= pages.get(r["doc"], 0) < hi})}
            for lo, hi in bands if any(lo <= pages.get(r["doc"], 0) < hi for r in rows)}
    return res


# What a pool and weight are chosen by, per set: the targets (the strict gold evidence
# within the first N prompt tokens; SEC: a gold figure in the top 5 sources).
OBJECTIVE = {"contractnli": "evidence_within_tokens", "cuad": "evidence_within_tokens", "sec": "gold_figure_at_5"}


def rerank_grid(names: list[str], cache: Path, gen, pools: list[int], weights: list[float], seed: int,
                units: bool = False) -> dict:
    """Choose the reranker's pool and fusion weight on one half of each set's documents
    (seeded_halves) and report the choice, and the ranking without the reranker, on the
    other half. One choice for every set (a user's documents are of no known kind): the
    highest mean of the sets' OBJECTIVE on their tuning halves."""
    out: dict = {"seed": seed, "pools": pools, "weights": weights, "units": units, "sets": {}}
    tail = ("+rerank_units=true" if units else "") + (f"+rerank_model={GRID_MODEL}" if GRID_MODEL else "")
    combos = [(p, w) for p in pools for w in weights]
    tune_scores: dict[tuple[int, float], list[float]] = {c: [] for c in combos}
    for name in names:
        items = [i for i in items_for(name) if i.evidence or name == "sec"]
        tune, held = seeded_halves(items_for(name), seed, name)
        res = {"tune_docs": sorted(tune), "held_docs": sorted(held), "tune": {}, "held": {}}
        log(f"[{name}] tuning on {len(tune)} documents ({sum(i.doc in tune for i in items)} items), "
            f"reporting on {len(held)} ({sum(i.doc in held for i in items)} items)")
        base = measure(name, cache, "no_rerank", gen, None, False, docs=tune, evidence_only=True)
        res["tune"]["no_rerank"] = {k: v for k, v in base.items() if k != "rows"}
        for p, w in combos:
            m = f"rerank=onnx+rerank_pool={p}+rerank_weight={w}{tail}"
            METHODS.setdefault(m, {"rerank": "onnx", "rerank_pool": p, "rerank_weight": w, "rerank_units": units,
                                   **({"rerank_model": GRID_MODEL} if GRID_MODEL else {})})
            r = measure(name, cache, m, gen, None, False, docs=tune, evidence_only=True)
            res["tune"][m] = {k: v for k, v in r.items() if k != "rows"}
            tune_scores[(p, w)].append(r["all"][OBJECTIVE[name]] or 0.0)
            log(f"[{name}] tune pool {p} weight {w}: {OBJECTIVE[name]} {r['all'][OBJECTIVE[name]]:.3f} "
                f"(without: {base['all'][OBJECTIVE[name]]:.3f})")
        out["sets"][name] = res
    best = max(combos, key=lambda c: (statistics.fmean(tune_scores[c]), -c[0]))  # ties: the smaller pool
    METHODS.setdefault(f"rerank=onnx+rerank_pool={best[0]}+rerank_weight={best[1]}{tail}",
                       {"rerank": "onnx", "rerank_pool": best[0], "rerank_weight": best[1], "rerank_units": units,
                        **({"rerank_model": GRID_MODEL} if GRID_MODEL else {})})
    out["chosen"] = {"pool": best[0], "weight": best[1], "units": units, "model": GRID_MODEL,
                     "tune_objective_mean": statistics.fmean(tune_scores[best])}
    chosen = f"rerank=onnx+rerank_pool={best[0]}+rerank_weight={best[1]}{tail}"
    for name in names:
        held = set(out["sets"][name]["held_docs"])
        for m in ("no_rerank", chosen):
            r = measure(name, cache, m, gen, None, False, docs=held, evidence_only=False)
            out["sets"][name]["held"][m] = {k: v for k, v in r.items() if k != "rows"}
    return out


def print_grid(g: dict) -> None:
    cols = ("n", "n_with_evidence", "mrr_strict", "evidence_within_tokens", "gold_figure_at_5", "prompt_tokens_mean")
    c = g["chosen"]
    print(f"\nReranker: pool {c['pool']}, weight {c['weight']}, units {c.get('units', False)} (chosen on the tuning halves, split seed {g['seed']}; "
          f"mean objective {c['tune_objective_mean']:.3f})")
    for part, title in (("held", "HELD-OUT half (not used for choosing)"), ("tune", "tuning half")):
        print(f"\n== {title}")
        for name, res in g["sets"].items():
            print(f"\n{name} (within {SETS[name]['within']} tokens; {len(res[part + '_docs'])} documents)")
            print("method".ljust(46) + "".join(SHORT[k].rjust(12) for k in cols) + "  fig_in_prompt  rank1  cpu_s_p50  pairs")
            for m, r in res[part].items():
                a = r["all"]
                rc = r.get("rerank_cost") or {}
                extra = f"  {fmt(a.get('gold_figure_in_prompt')):>13}  {fmt(a.get('rank1_strict')):>5}"
                extra += f"  {fmt(rc.get('cpu_s_p50')):>9}  {fmt(rc.get('pairs_mean')):>5}"
                print(m.ljust(46) + "".join(fmt(a.get(k)).rjust(12) for k in cols) + extra)


# ---------------------------------------------------------------------- not_found evidence

def _offtopic_questions() -> list[str]:
    """The off-topic questions of tests/test_tuned_constants.py (about nothing in a contract,
    and about other kinds of contract), written there before any measurement."""
    import ast

    tree = ast.parse((ROOT / "tests/test_tuned_constants.py").read_text(encoding="utf-8"))
    out: list[str] = []
    for node in tree.body:
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", "") in ("OFF_TOPIC", "OTHER_CONTRACTS"):
            out += ast.literal_eval(node.value)
    return [q for q in out if not q.startswith("What royalty")]  # a CUAD contract may hold a royalty clause


def not_found(names: list[str], cache: Path, gen, seed: int, method: str, docs_per_half: int, offtopic_docs: int,
              max_refused: float) -> dict:
    """The cross-encoder's best score over the pool as the evidence for not_found. Per set,
    on the seeded document halves: the answerable questions (gold evidence / Entailment or
    Contradiction), the set's own unanswerable ones (CUAD categories without a clause,
    ContractNLI NotMentioned) and the off-topic questions of tests/test_tuned_constants.py
    asked of `offtopic_docs` documents per half. A floor on the best score is fitted on the
    tuning halves (the highest that refuses at most `max_refused` of their answerable
    questions) and reported on the held-out halves beside today's gate
    (retrieve.abstain_margin)."""
    from ragkit.eval.sets import load_set
    from ragkit.retrieve import retrieve

    settings = None
    rows: list[dict] = []
    offq = _offtopic_questions()
    rows_path = cache / f"notfound-rows-{method.replace('/', '_')}.jsonl"
    done: dict[tuple, dict] = {}
    if rows_path.exists():
        for line in rows_path.read_text(encoding="utf-8").splitlines():
            if line.strip():
                d = json.loads(line)
                done[(d["set"], d["doc"], d["question"])] = d
    sink = open(rows_path, "a", encoding="utf-8")
    for name in names:
        settings = settings_for(name, cache, **METHODS.get(method, {}))
        items = load_set(SETS[name]["set"])
        tune, held = seeded_halves(items_for(name), seed, name)
        chosen = {"tune": sorted(tune)[:docs_per_half], "held": sorted(held)[:docs_per_half]}
        asked = []
        for half, docs in chosen.items():
            for it in items:
                if it.doc in docs:
                    kind = "unanswerable" if (not it.answerable or it.label == "NotMentioned") else "answerable"
                    asked.append((half, it.doc, it.question, kind))
            for d in docs[:offtopic_docs]:
                asked += [(half, d, q, "offtopic") for q in offq]
        prime_queries(settings, [type("I", (), {"question": q})() for _, _, q, _ in asked])
        prime_reranker(settings, memo_path(settings, cache, name))
        log(f"[{name}] not_found: {len(asked)} questions over {sum(map(len, chosen.values()))} documents")
        for n, (half, doc, q, kind) in enumerate(asked, 1):
            key = (name, doc, q)
            if key not in done:
                r = retrieve(q, session_for(settings), [doc], generator=gen)
                done[key] = {"set": name, "doc": doc, "question": q, "kind": kind,
                             "best": r.rerank.best if r.rerank else None, "gate": r.abstain_reason is not None,
                             "similarity": r.prompt.best_similarity}
                sink.write(json.dumps(done[key]) + "\n")
                sink.flush()
            rows.append({**done[key], "half": half, "kind": kind})
            if n % 100 == 0:
                log(f"[{name}] not_found {n}/{len(asked)}")
    sink.close()

    def rates(rs: list[dict], rule) -> dict:
        out = {}
        for kind in ("answerable", "unanswerable", "offtopic"):
            k = [r for r in rs if r["kind"] == kind]
            out[kind] = {"n": len(k), "stopped": sum(bool(rule(r)) for r in k)}
        return out

    res: dict = {"method": method, "seed": seed, "max_refused": max_refused, "sets": {}}
    for name in names:
        tune_rows = [r for r in rows if r["set"] == name and r["half"] == "tune" and r["best"] is not None]
        ans = sorted(r["best"] for r in tune_rows if r["kind"] == "answerable")
        # the highest floor that refuses at most max_refused of the tuning half's answerable questions
        allowed = int(max_refused * len(ans))
        floor = ans[allowed] if ans else None
        res["sets"][name] = {"floor": floor}
        for half in ("tune", "held"):
            hr = [r for r in rows if r["set"] == name and r["half"] == half]
            res["sets"][name][half] = {
                "today": rates(hr, lambda r: r["gate"]),
                "reranker": rates(hr, lambda r: r["best"] is not None and floor is not None and r["best"] < floor),
                "either": rates(hr, lambda r: r["gate"] or (r["best"] is not None and floor is not None and r["best"] < floor)),
                "best_by_kind": {k: _quantiles([r["best"] for r in hr if r["kind"] == k and r["best"] is not None])
                                 for k in ("answerable", "unanswerable", "offtopic")},
            }
    # one floor for every set (a user's documents are of no known kind): fitted on all tuning halves
    both = [r for r in rows if r["half"] == "tune" and r["best"] is not None and r["kind"] == "answerable"]
    ans = sorted(r["best"] for r in both)
    g = res["floor_all_sets"] = ans[int(max_refused * len(ans))] if ans else None
    for name in names:
        for half in ("tune", "held"):
            hr = [r for r in rows if r["set"] == name and r["half"] == half]
            res["sets"][name][half]["reranker_all_sets_floor"] = rates(hr, lambda r: r["best"] is not None and g is not None
                                                                        and r["best"] < g)
            res["sets"][name][half]["either_all_sets_floor"] = rates(
                hr, lambda r: r["gate"] or (r["best"] is not None and g is not None and r["best"] < g))
    # the quote floor (retrieve.quote_floor): a question asking for the clause (CUAD's are all
    # extractive) is answered by a quote only from this score up, else unverified with the
    # closest passages shown. Not a refusal, so answerable and unanswerable weigh the same:
    # the floor with the highest Youden J (share of answerable quoted + share of unanswerable
    # not quoted - 1) on the tuning half, reported on the held-out half.
    from ragkit.retrieve.query import is_extractive

    for name in names:
        tr = [r for r in rows if r["set"] == name and r["half"] == "tune" and r["best"] is not None
              and r["kind"] != "offtopic" and is_extractive(r["question"])]
        if not tr or {r["kind"] for r in tr} != {"answerable", "unanswerable"}:
            continue

        def j(f, rs):
            a = [r for r in rs if r["kind"] == "answerable"]
            u = [r for r in rs if r["kind"] == "unanswerable"]
            return sum(r["best"] >= f for r in a) / len(a) + sum(r["best"] < f for r in u) / len(u) - 1

        qf = max(sorted({round(r["best"], 2) for r in tr}), key=lambda f: (j(f, tr), -abs(f)))
        res["sets"][name]["quote_floor"] = qf
        for half in ("tune", "held"):
            hr = [r for r in rows if r["set"] == name and r["half"] == half and r["best"] is not None
                  and r["kind"] != "offtopic" and is_extractive(r["question"])]
            res["sets"][name][half]["quote_floor"] = rates(hr, lambda r: r["best"] < qf)
    return res


# Packing rules for "fewer tokens" (--packing), each a function of a record's ranked sources
# (rank order, their tokens and cross-encoder logits) -> the sources kept. The prompt's other
# tokens (template, question: 163-183 on ContractNLI) stay, so a record's prompt tokens minus
# the dropped sources' tokens is the smaller prompt's size.
def _pack_top_k(k: int):
    return lambda ranked: ranked[:k]


def _pack_budget(budget: int):
    def rule(ranked):
        kept, used = [], 0
        for c in ranked:
            if kept and used + c["tokens"] > budget:
                break
            kept.append(c)
            used += c["tokens"]
        return kept
    return rule


def _pack_margin(margin: float):
    """Keep sources in rank order while the cross-encoder's logit stays within `margin` of
    the best one (the confident case packs few)."""
    def rule(ranked):
        ces = [c["ce"] for c in ranked if c.get("ce") is not None]
        if not ces:
            return ranked
        best = max(ces)
        kept = ranked[:1]
        for c in ranked[1:]:
            if c.get("ce") is None or c["ce"] < best - margin:
                break
            kept.append(c)
        return kept
    return rule


def _pack_gap(gap: float, few: int, many: int):
    """`few` sources when the best logit leads the second by `gap` or more, else `many`."""
    def rule(ranked):
        ces = sorted((c["ce"] for c in ranked if c.get("ce") is not None), reverse=True)
        return ranked[: few if len(ces) >= 2 and ces[0] - ces[1] >= gap else many]
    return rule


PACKING = {**{f"top_k={k}": _pack_top_k(k) for k in (2, 3, 4, 5, 6, 8)},
           **{f"budget={b}": _pack_budget(b) for b in (600, 800, 1000, 1200, 1500)},
           **{f"ce_margin={m}": _pack_margin(m) for m in (3, 4, 5, 6, 8)},
           **{f"ce_gap={g}:{a}/{b}": _pack_gap(g, a, b) for g in (2, 3) for a, b in ((1, 6), (2, 6), (2, 8))}}


def packing(names: list[str], cache: Path, seed: int, keep_share: float, method: str = "default") -> dict:
    """Fewer tokens: each packing rule applied to the default method's records (no retrieval
    run; `--methods default` writes them), scored as eval scores them. Per set and half: the
    strict gold evidence still in the prompt and the mean prompt tokens. Chosen on the tuning
    half: the rule and setting with the fewest tokens that keeps at least `keep_share` of the
    full prompt's evidence there; reported on the held-out half."""
    from ragkit.eval.metrics import gold_figure_in
    from ragkit.eval.run import score_item

    out: dict = {"seed": seed, "keep_share": keep_share, "method": method, "sets": {}}
    for name in names:
        path = cache / name / f"records-{method}.jsonl"
        recs = {r["id"]: r for r in map(json.loads, path.read_text(encoding="utf-8").splitlines()) if r}
        items = [i for i in items_for(name) if i.id in recs]
        tune, held = seeded_halves(items_for(name), seed, name)

        def run(rule, docs):
            kept_ev, toks = [], []
            for it in (i for i in items if i.doc in docs):
                rec = recs[it.id]
                ranked = sorted(rec["contexts"], key=lambda c: c["rank"])
                ids = {c["chunk_id"] for c in (rule(ranked) if rule else ranked)}
                ctxs = [c for c in rec["contexts"] if c["chunk_id"] in ids]
                small = dict(rec, contexts=ctxs, prompt_tokens=rec["prompt_tokens"] - sum(
                    c["tokens"] for c in rec["contexts"] if c["chunk_id"] not in ids))
                row = score_item(it, small, 106.0)
                toks.append(small["prompt_tokens"])
                if name == "sec":
                    fig = gold_figure_in(it.answers, [c["text"] for c in ctxs])
                    if fig is not None:
                        kept_ev.append(fig)
                elif row.get("evidence_strict") is not None:
                    kept_ev.append(row["evidence_strict"])
            return {"evidence_kept": sum(kept_ev) / len(kept_ev) if kept_ev else None,
                    "prompt_tokens_mean": statistics.fmean(toks) if toks else None, "n": len(toks)}

        res = {half: {"full": run(None, docs), **{k: run(rule, docs) for k, rule in PACKING.items()}}
               for half, docs in (("tune", tune), ("held", held))}
        floor = keep_share * res["tune"]["full"]["evidence_kept"]
        ok = [k for k in PACKING if res["tune"][k]["evidence_kept"] >= floor]
        chosen = min(ok, key=lambda k: res["tune"][k]["prompt_tokens_mean"]) if ok else None
        out["sets"][name] = {**res, "chosen": chosen}
    return out


def print_packing(res: dict) -> None:
    print(f"\nfewer tokens: packing rules over the {res['method']} records (split seed {res['seed']}); chosen on the tuning half "
          f"= fewest tokens keeping >= {res['keep_share']:.0%} of the full prompt's evidence")
    for name, r in res["sets"].items():
        print(f"\n{name} (SEC: a gold figure in the prompt; else the strict gold evidence)  chosen: {r['chosen']}")
        print("rule".ljust(22) + "held kept".rjust(11) + "held tok".rjust(10) + "tune kept".rjust(11) + "tune tok".rjust(10))
        for k in ("full", *PACKING):
            h, t = r["held"][k], r["tune"][k]
            mark = "  <- chosen" if k == r["chosen"] else ""
            print(k.ljust(22) + fmt(h["evidence_kept"]).rjust(11) + fmt(h["prompt_tokens_mean"]).rjust(10)
                  + fmt(t["evidence_kept"]).rjust(11) + fmt(t["prompt_tokens_mean"]).rjust(10) + mark)


def _quantiles(v: list[float]) -> dict:
    if not v:
        return {}
    v = sorted(v)
    q = lambda p: v[min(len(v) - 1, int(p * (len(v) - 1)))]  # noqa: E731
    return {"n": len(v), "min": v[0], "p10": q(0.1), "p50": q(0.5), "p90": q(0.9), "max": v[-1]}


def print_not_found(res: dict) -> None:
    print(f"\nnot_found evidence: the cross-encoder's best score ({res['method']}); floor fitted on the tuning halves "
          f"(at most {res['max_refused']:.0%} of their answerable questions refused), split seed {res['seed']}")
    for name, r in res["sets"].items():
        print(f"\n{name}: floor {fmt(r['floor'])} (this set's); the floor of all sets {fmt(res['floor_all_sets'])}")
        for half in ("held", "tune"):
            print(f"  {'HELD-OUT' if half == 'held' else 'tuning'} half" + "".join(
                f"  {k}: " + ", ".join(f"{rule} {r[half][rule][k]['stopped']}/{r[half][rule][k]['n']}"
                                      for rule in ("today", "reranker", "either", "either_all_sets_floor"))
                for k in ("answerable", "unanswerable", "offtopic")))
            if "quote_floor" in r[half]:
                q = r[half]["quote_floor"]
                print(f"    quote floor {r['quote_floor']:.2f} (Youden J, tuning half): not quoted, answerable "
                      f"{q['answerable']['stopped']}/{q['answerable']['n']}, unanswerable "
                      f"{q['unanswerable']['stopped']}/{q['unanswerable']['n']}")
            for k, q in r[half]["best_by_kind"].items():
                if q:
                    print(f"    best score, {k}: n {q['n']} min {q['min']:.2f} p10 {q['p10']:.2f} p50 {q['p50']:.2f} "
                          f"p90 {q['p90']:.2f} max {q['max']:.2f}")


def fmt(v) -> str:
    return "-" if v is None else (f"{v:.3f}" if isinstance(v, float) and abs(v) < 10 else f"{v:.0f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sets", default="contractnli,sec,cuad")
    ap.add_argument("--methods", default="no_rerank,default", help=f"comma list of {', '.join(METHODS)}, or of retrieve settings joined by + (bm25_weight=1+rrf_k=20)")
    ap.add_argument("--cache", type=Path, default=Path("/tmp/ragkit-rank"))
    ap.add_argument("--limit", type=int, default=None, help="first N items of each set")
    ap.add_argument("--skip", type=int, default=0, help="leave out the first N items of each set (checked apart from them)")
    ap.add_argument("--split", action="store_true", help="also score the two halves of the documents apart")
    ap.add_argument("--build-only", action="store_true")
    ap.add_argument("--baseline-cache", type=Path, default=None,
                    help="a --cache folder where this script ran on the code before issue 14 (method default): "
                         "its records are scored here as the method 'before'")
    ap.add_argument("--json", action="store_true", help="one JSON object: {set: {method: figures}}")
    ap.add_argument("--lexical", choices=("segments", "tantivy"), default="segments",
                    help="the lexical index's engine (retrieve.lexical); tantivy's records go to records-METHOD-tantivy.jsonl")
    ap.add_argument("--rerank-grid", action="store_true",
                    help="choose the reranker's pool and weight on one half of each set's documents (split by --seed) "
                         "and report the choice and the ranking without it on the other half (issue 24)")
    ap.add_argument("--pools", default="10,20,30,40", help="--rerank-grid: pool sizes to try")
    ap.add_argument("--weights", default="0.5,1,2,4", help="--rerank-grid: fusion weights to try")
    ap.add_argument("--embed-model", default=None, help="embed.model for the stores (e.g. bge-small-en; give it its own --cache)")
    ap.add_argument("--seeded-split", action="store_true",
                    help="also score the halves of --seed apart (tune / held, as --rerank-grid splits)")
    ap.add_argument("--grid-model", default=None, help="--rerank-grid: retrieve.rerank_model to try (default: the setting's)")
    ap.add_argument("--units", action="store_true", help="--rerank-grid: score each chunk's sentences (rerank_units)")
    ap.add_argument("--seed", type=int, default=SPLIT_SEED, help="--rerank-grid / --not-found: the seed of the document split")
    ap.add_argument("--not-found", action="store_true",
                    help="measure the reranker's best score as the evidence for not_found (answerable, the set's own "
                         "unanswerable and off-topic questions), the floor fitted on one half and reported on the other")
    ap.add_argument("--uncached", action="store_true",
                    help="score every pair with the reranker (no CACHE/NAME/rerank-scores.jsonl) and report its wall and "
                         "CPU seconds a question as they ran (run it on an otherwise idle machine)")
    ap.add_argument("--packing-method", default="default", help="--packing: whose records (a method run before: legal, ms_marco)")
    ap.add_argument("--packing", action="store_true",
                    help="fewer tokens: packing rules (top k, a token budget, cross-encoder confidence cuts) applied to "
                         "the default method's records, chosen on the tuning half and reported on the held-out half")
    ap.add_argument("--keep-share", type=float, default=0.97,
                    help="--packing: the share of the full prompt's evidence a chosen rule must keep (tuning half)")
    ap.add_argument("--nf-method", default="rerank", help="--not-found: the retrieve settings (a method)")
    ap.add_argument("--nf-docs", type=int, default=10, help="--not-found: documents per half and set")
    ap.add_argument("--nf-offtopic-docs", type=int, default=3, help="--not-found: documents per half asked the off-topic questions")
    ap.add_argument("--lost-where", action="store_true",
                    help="where the gold evidence is lost: in a chunk, the first stage's top 10 / 50 / all, reranked, the prompt")
    ap.add_argument("--over-store", action="store_true",
                    help="ask each question of the whole store, its document not named (a source's page counts in its own document only)")
    ap.add_argument("--half", choices=("tune", "held"), default=None,
                    help="only the documents of one seeded half (--seed): held = those that chose no setting")
    ap.add_argument("--nf-max-refused", type=float, default=0.01, help="--not-found: answerable share the floor may refuse (tuning half)")
    ap.add_argument("--make-cuadkept", action="store_true", help="write the cuadkept set files (sets/cuad-kept*.jsonl) and stop")
    args = ap.parse_args()
    if args.make_cuadkept:
        make_cuadkept()
        return
    global SKIP, EMBED_MODEL, SEEDED_SPLIT, UNCACHED, GRID_MODEL, OVER_STORE
    OVER_STORE = args.over_store
    GRID_MODEL = args.grid_model
    EMBED_MODEL = args.embed_model
    UNCACHED = args.uncached
    SEEDED_SPLIT = args.seeded_split
    SKIP = args.skip
    use_lexical(args.lexical)
    names = [s for s in args.sets.split(",") if s]
    methods = [m for m in args.methods.split(",") if m]
    for m in methods:
        if "=" in m and m not in METHODS:  # an ad-hoc method: "bm25_weight=1+rrf_k=20"
            METHODS[m] = {k: _value(v) for k, v in (kv.split("=", 1) for kv in m.split("+"))}
        if m not in METHODS and m != "before":
            raise SystemExit(f"unknown method {m!r}; choose from {', '.join(METHODS)}")
    if args.packing:
        res = packing(names, args.cache, args.seed, args.keep_share, args.packing_method)
        (args.cache / "packing.json").write_text(json.dumps(res, indent=1))
        print(json.dumps(res, indent=2)) if args.json else print_packing(res)
        return
    for name in names:
        build(name, args.cache)
    if args.build_only:
        return
    from ragkit.generate import load_generator

    gen = load_generator(settings_for(names[0], args.cache), vocab_only=True)
    if args.not_found:
        if "=" in args.nf_method and args.nf_method not in METHODS:
            METHODS[args.nf_method] = {k: _value(v) for k, v in (kv.split("=", 1) for kv in args.nf_method.split("+"))}
        res = not_found(names, args.cache, gen, args.seed, args.nf_method, args.nf_docs, args.nf_offtopic_docs,
                        args.nf_max_refused)
        (args.cache / "not-found.json").write_text(json.dumps(res, indent=1))
        print(json.dumps(res, indent=2)) if args.json else print_not_found(res)
        return
    if args.lost_where:
        res = {}
        for name in names:
            half = None if args.half is None else seeded_halves(items_for(name), args.seed, name)[args.half == "held"]
            res[name] = {m: lost_where(name, args.cache, m, gen, args.limit, docs=half) for m in methods if m != "before"}
        (args.cache / "lost-where.json").write_text(json.dumps(res, indent=1))
        if args.json:
            print(json.dumps(res, indent=2))
        else:
            for name, ms in res.items():
                for m, r in ms.items():
                    print_lost_where(name, m, r)
        return
    if args.rerank_grid:
        g = rerank_grid(names, args.cache, gen, [int(x) for x in args.pools.split(",")],
                        [float(x) for x in args.weights.split(",")], args.seed, units=args.units)
        (args.cache / f"rerank-grid{'-units' if args.units else ''}{'-' + args.grid_model.replace('/', '_') if args.grid_model else ''}.json").write_text(json.dumps(g, indent=1))
        if args.json:
            print(json.dumps(g, indent=2))
        else:
            print_grid(g)
        return
    out: dict = {}
    for name in names:
        out[name] = {}
        base = args.baseline_cache / name / "records-default.jsonl" if args.baseline_cache else None
        if base is not None and base.exists():
            out[name]["before"] = measure(name, args.cache, "before", gen, args.limit, args.split, from_records=base)
        for m in methods:
            if m != "before":
                half = None if args.half is None else seeded_halves(items_for(name), args.seed, name)[args.half == "held"]
                out[name][m] = measure(name, args.cache, m, gen, args.limit, args.split, docs=half)
    if args.json:
        print(json.dumps({s: {m: {k: v for k, v in r.items() if k != "rows"} for m, r in ms.items()} for s, ms in out.items()},
                         indent=2))
        return
    cols = ("n", "n_with_evidence") + KEYS
    for name, ms in out.items():
        print(f"\n{name} (evidence within the first {SETS[name]['within']} prompt tokens; strict rule is the headline)")
        print("method".ljust(12) + "part".ljust(8) + "".join(SHORT[c].rjust(13) for c in cols) + "  s/item")
        for m, r in ms.items():
            for part in ("all", "half_a", "half_b", "tune", "held"):
                if part in r:
                    print(m.ljust(12) + part.ljust(8) + "".join(fmt(r[part].get(c)).rjust(13) for c in cols)
                          + (f"  {r['retrieve_s_per_item']:.3f}" if part == "all" else ""))
            if r.get("rerank_uncached"):
                u = r["rerank_uncached"]
                print(f"{m.ljust(12)}reranker as it ran ({u['questions']} questions): wall s p50 {u['wall_s_p50']:.3f}, "
                      f"p90 {u['wall_s_p90']:.3f}; CPU s p50 {u['cpu_s_p50']:.3f}")
            for t, x in r.get("by_type", {}).items():
                print(f"{m.ljust(12)}{t}: " + ", ".join(f"{SHORT[c]} {fmt(x.get(c))}" for c in
                                                         ("n", "gold_figure_in_prompt", "gold_figure_at_5", "prompt_tokens_mean")))
            for t, x in r.get("by_pages", {}).items():
                print(f"{m.ljust(12)}{t} ({x['filings']} filings): " + ", ".join(
                    f"{SHORT[c]} {fmt(x.get(c))}" for c in ("n", "gold_figure_in_prompt", "gold_figure_at_5", "prompt_tokens_mean")))


if __name__ == "__main__":
    main()
