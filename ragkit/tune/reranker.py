"""`ragkit tune reranker`: fine-tune the cross-encoder that reorders retrieval's candidates
on labelled documents (questions with their gold clauses).

1. Labelled sets are read into queries (a document, a question, its gold spans; no span:
   the document does not hold the answer): CUAD's `master_clauses.csv` (the contract texts
   in `txt/` beside it; each category asked as ragkit's CUAD set asks it), ContractNLI JSON
   (each hypothesis asked as the ContractNLI set asks it, the evidence spans as gold), or a
   ragkit eval set (JSONL) over documents given with `--corpus`. The documents are ingested
   by the product's ingest into a work store.
2. Documents are sampled with the seed (`max_docs`, `per_doc` answerable questions each and
   some unanswerable ones), then split once, by document: `held_share` of them train
   nothing and give the model card's figures.
3. Each question is retrieved by the product's `retrieve` over its document with a
   reranker that scores nothing and keeps what it is asked (`PoolRecorder`): the pool's
   passages exactly as the reranker reads them (heading and sentence, `rerank_units`).
   Those holding a gold span (`quote_matches_evidence`, the eval's own test) are positives;
   gold sentences the pool missed are added; the others, hard negatives mined by today's
   retrieval from the same document, are negatives; an unanswerable question gives
   negatives only (what the not_found floor reads).
4. The cross-encoder (ms-marco MiniLM-L12 by default, dequantized from the shipped INT8
   ONNX) is fine-tuned in fp32 with one logit and binary cross-entropy by
   sentence-transformers' CrossEncoderTrainer, exported to ONNX and quantized to INT8.
5. On the held-out documents both the starting model and the trained one rank every pool
   (INT8, as they ship): gold first, mean reciprocal rank, and how well the pool's best
   score tells answerable questions from unanswerable ones (ROC AUC). `MODEL_CARD.md` and
   `training.json` record data, licences, command, seed, figures and sha256 of each file.
"""

from __future__ import annotations

import ast
import csv
import json
import random
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

from ragkit.errors import UsageError
from ragkit.tune.labelled import safe_name
from ragkit.tune.training import BASES, base_model, export_onnx, inputs_key, shown_path, split_documents, train

CUAD_QUESTIONS = Path(__file__).with_name("cuad_questions.json")
LICENCES = {"cuad": "CUAD v1 (The Atticus Project; Hendrycks et al., NeurIPS 2021), CC BY 4.0",
            "contractnli": "ContractNLI (Koreeda and Manning, Findings of EMNLP 2021), CC BY 4.0"}


@dataclass
class Query:
    doc: str  # the document's name as the store knows it
    question: str
    spans: list[str] = field(default_factory=list)  # gold evidence, verbatim; [] = not in the document
    source: str = ""


@dataclass
class QuerySet:
    queries: list[Query]
    texts: dict[str, str] = field(default_factory=dict)  # name -> text of documents to ingest
    source: str = ""
    kind: str = ""  # cuad / contractnli / eval


# ---------------------------------------------------------------------- readers

def read_cuad(path: Path) -> QuerySet:
    """CUAD's `master_clauses.csv` (one row a contract, a column per category holding its
    excerpts as a Python list literal; `txt_file` names the text in `txt/` beside the file):
    a query per contract and category, asked as ragkit's CUAD set asks it."""
    path = Path(path)
    questions = json.loads(CUAD_QUESTIONS.read_text(encoding="utf-8"))["questions"]
    csv.field_size_limit(1 << 30)
    try:
        with open(path, encoding="utf-8", newline="") as f:
            rows = list(csv.DictReader(f))
    except (OSError, UnicodeDecodeError, csv.Error) as exc:
        raise UsageError(f"cannot read {path}: {exc}") from None
    if not rows or "txt_file" not in rows[0]:
        raise UsageError(f"{path} is not CUAD's master_clauses.csv with a txt_file column",
                         hint="the file of ../shared/corpora/cuad-train/: one row a contract, txt_file naming its text in txt/")
    out = QuerySet(queries=[], source=str(path), kind="cuad")
    for row in rows:
        txt = path.parent / "txt" / row["txt_file"]
        if not txt.is_file():
            raise UsageError(f"{path}: {row['txt_file']} is not in {txt.parent}")
        name = safe_name(Path(row["txt_file"]).stem)
        out.texts[name] = txt.read_text(encoding="utf-8", errors="replace")
        for cat, question in questions.items():
            cell = (row.get(cat) or "").strip()
            try:
                excerpts = [e.strip() for e in ast.literal_eval(cell)] if cell else []
            except (ValueError, SyntaxError):
                raise UsageError(f"{path}: {row['txt_file']} {cat}: not a list of excerpts: {cell[:60]!r}") from None
            out.queries.append(Query(name, question, [e for e in excerpts if e], "cuad"))
    return out


def read_contractnli(path: Path) -> QuerySet:
    """A ContractNLI JSON file: a query per NDA and hypothesis, asked as ragkit's ContractNLI
    set asks it; NotMentioned items have no gold span."""
    from ragkit.eval.sets import nli_question  # noqa: PLC0415  (the sets' wording lives with the harness)
    from ragkit.tune.labelled import read_contractnli as read_items

    p = Path(path)
    items = read_items(p, prefix=f"{p.stem}-")
    hyps = json.loads(p.read_text(encoding="utf-8")).get("labels") or {}
    out = QuerySet(queries=[], texts=items.texts, source=str(p), kind="contractnli")
    for it in items.items:
        if it.item in hyps:
            spans = it.spans if it.label != "NotMentioned" else []
            out.queries.append(Query(it.doc, nli_question(hyps[it.item]["hypothesis"]), spans, "contractnli"))
    return out


def read_eval_set(path: Path) -> QuerySet:
    """A ragkit eval set (JSONL): its items with a document and gold evidence, and the
    unanswerable ones (`answerable: false`); the documents are given with --corpus."""
    from ragkit.eval.sets import load_set  # noqa: PLC0415

    out = QuerySet(queries=[], source=str(path), kind="eval")
    for it in load_set(Path(path)):
        spans = list(it.evidence_all) or ([it.evidence] if it.evidence else [])
        if it.doc and (spans or it.answerable is False):
            out.queries.append(Query(it.doc, it.question, spans, Path(path).stem))
    if not out.queries:
        raise UsageError(f"{path} has no item with a document and gold evidence (or answerable: false)")
    return out


def read_queries(path: Path) -> QuerySet:
    """Any of the three, by the file: master_clauses.csv, a ContractNLI .json, an eval set .jsonl."""
    p = Path(path)
    if not p.exists():
        raise UsageError(f"no such file: {p}")
    if p.suffix == ".csv":
        return read_cuad(p)
    if p.suffix == ".json":
        return read_contractnli(p)
    if p.suffix == ".jsonl":
        return read_eval_set(p)
    raise UsageError(f"{p}: a labelled set is CUAD's master_clauses.csv, a ContractNLI .json or an eval set .jsonl")


# ---------------------------------------------------------------------- sampling and mining

def sample(queries: list[Query], *, max_docs: int, per_doc: int, unanswerable: float, seed: int) -> list[Query]:
    """At most `max_docs` documents (shuffled with the seed), each with at most `per_doc`
    answerable questions and `unanswerable` x that many unanswerable ones, chosen at random."""
    rng = random.Random(seed)
    by_doc: dict[str, list[Query]] = {}
    for q in queries:
        by_doc.setdefault(q.doc, []).append(q)
    docs = sorted(by_doc)
    rng.shuffle(docs)
    out = []
    for d in docs[: max_docs or None]:
        yes = [q for q in by_doc[d] if q.spans]
        no = [q for q in by_doc[d] if not q.spans]
        out += rng.sample(yes, min(per_doc, len(yes)))
        out += rng.sample(no, min(round(per_doc * unanswerable), len(no)))
    return out


class PoolRecorder:
    """A reranker that keeps what retrieval asks it to score and scores every pair 0.0, so the
    order stays the hybrid stages' own: the pool of passages a reranker reads at that point,
    as it reads them. Used only to mine training pairs, never to answer."""

    name = "pool-recorder"

    def __init__(self) -> None:
        self.asked: list[tuple[str, list[str]]] = []

    def score(self, query: str, passages: list[str]) -> list[float]:
        self.asked.append((query, list(passages)))
        return [0.0] * len(passages)


@dataclass
class Mined:
    doc: str
    question: str  # as the reranker reads it (the searched text)
    spans: list[str]
    pool: list[str]  # the pool's passages, best-ranked chunk first
    gold: list[bool]  # which hold a gold span
    missed: list[str] = field(default_factory=list)  # gold passages of the document the pool did not hold


def _is_gold(passage: str, spans: list[str]) -> bool:
    from ragkit.eval.metrics_text import quote_matches_evidence

    if not spans:
        return False
    head, sep, body = passage.partition("\n")
    return bool(quote_matches_evidence(passage, spans) or (sep and quote_matches_evidence(body, spans)))


def mine(queries: list[Query], session, pool: int, on_progress: Callable[[int, int], None] | None = None) -> list[Mined]:
    """Each query's pool, retrieved by the product over its document (see PoolRecorder)."""
    from ragkit.retrieve import retrieve
    from ragkit.retrieve.rerank import passage_units
    from ragkit.retrieve.search import resolve_docs
    from ragkit.session import Session

    rs = session.settings.retrieve.model_copy(update={"rerank": "onnx", "rerank_pool": pool, "rerank_tables": 0,
                                                     "rerank_budget_s": 0.0, "rerank_abstain_below": None})
    recorder = PoolRecorder()
    mining = Session(session.settings.model_copy(update={"retrieve": rs}), embedder=session.embedder,
                     store=session.store, reranker=recorder)
    docs = session.store.documents()
    units: dict[str, list[str]] = {}
    out = []
    for n, q in enumerate(queries, 1):
        (rec,) = resolve_docs(docs, [q.doc])
        recorder.asked.clear()
        retrieve(q.question, mining, docs=[q.doc])
        asked = recorder.asked[0][0] if recorder.asked else q.question
        passages = list(dict.fromkeys(p for _q, ps in recorder.asked for p in ps))
        m = Mined(q.doc, asked, q.spans, passages, [_is_gold(p, q.spans) for p in passages])
        if q.spans:
            if rec.doc_id not in units:
                units[rec.doc_id] = list(dict.fromkeys(u for h in session.store.chunks([rec.doc_id]) for u in passage_units(h)))
            have = set(passages)
            m.missed = [u for u in units[rec.doc_id] if u not in have and _is_gold(u, q.spans)]
        out.append(m)
        if on_progress:
            on_progress(n, len(queries))
    mining.close()
    return out


def training_pairs(mined: list[Mined], *, negatives: int, positives: int, missed: int, seed: int) -> list[tuple[str, str, float]]:
    """(question, passage, 1.0 | 0.0): per question at most `positives` gold passages of the
    pool and `missed` the pool missed, and `negatives` of its other passages at random."""
    rng = random.Random(seed)
    pairs = []
    for m in mined:
        gold = [p for p, g in zip(m.pool, m.gold) if g]
        other = [p for p, g in zip(m.pool, m.gold) if not g]
        for p in gold[:positives] + m.missed[:missed]:
            pairs.append((m.question, p, 1.0))
        for p in rng.sample(other, min(negatives, len(other))):
            pairs.append((m.question, p, 0.0))
    rng.shuffle(pairs)
    return pairs


# ---------------------------------------------------------------------- figures

def ranking_figures(model, mined: list[Mined]) -> dict:
    """How `model` (a reranker: `score(query, passages)`) ranks each held-out pool: the gold
    passage first (of the questions whose pool holds one), mean reciprocal rank of the first
    gold passage, and the ROC AUC of the pool's best score for answerable (a gold passage in
    the pool) against unanswerable questions."""
    from sklearn.metrics import roc_auc_score  # sentence-transformers' own dependency

    first, rr, best, answerable = [], [], [], []
    for m in mined:
        if not m.pool:
            continue
        scores = model.score(m.question, m.pool)
        order = sorted(range(len(scores)), key=lambda i: -scores[i])
        if any(m.gold):
            rank = next(r for r, i in enumerate(order, 1) if m.gold[i])
            first.append(rank == 1)
            rr.append(1.0 / rank)
        if any(m.gold) or not m.spans:
            best.append(max(scores))
            answerable.append(bool(m.spans))
    auc = roc_auc_score(answerable, best) if len(set(answerable)) == 2 else None
    return {"questions": len(first), "gold_first": round(sum(first) / len(first), 3) if first else None,
            "mrr": round(sum(rr) / len(rr), 3) if rr else None,
            "answerable_auc": None if auc is None else round(float(auc), 3),
            "unanswerable": answerable.count(False)}


def save_mined(path: Path, mined: list[Mined]) -> None:
    path.write_text("\n".join(json.dumps(asdict(m)) for m in mined) + "\n", encoding="utf-8")


def load_mined(path: Path) -> list[Mined]:
    return [Mined(**json.loads(line)) for line in Path(path).read_text(encoding="utf-8").splitlines() if line.strip()]


# ---------------------------------------------------------------------- the command

@dataclass
class RerankTuneOptions:
    base: str | None = "ms-marco-minilm-l12"  # a registry cross-encoder, minilm, or a BERT folder
    epochs: float = 1.0
    seed: int = 24
    held_share: float = 0.1
    max_docs: int = 0  # documents of each set (0 = every document)
    per_doc: int = 8  # answerable questions per document
    unanswerable: float = 0.25  # unanswerable questions per answerable one
    pool: int = 20  # candidates retrieved per question (the product reranks 10)
    negatives: int = 6
    positives: int = 2
    missed: int = 1
    max_length: int = 256
    batch_size: int = 16
    lr: float = 2e-5


def tune_reranker(sources: list[Path], out: Path, session, opts: RerankTuneOptions, *, corpus: list[Path] | None = None,
                  command: str = "", log: Callable[[str], None] = print) -> dict:
    """Train a reranker from labelled documents into `out` (see the module's docstring);
    returns what the model card says. `session` is over the work store (`out/work/store`)."""
    from ragkit.ingest import ingest
    from ragkit.models import sha256_file
    from ragkit.rerankers.onnx import OnnxCrossEncoder
    from ragkit.tune.checklist import ingest_texts

    t_start = time.perf_counter()
    sets = [read_queries(p) for p in sources]
    queries = [q for s in sets for q in sample(s.queries, max_docs=opts.max_docs, per_doc=opts.per_doc,
                                               unanswerable=opts.unanswerable, seed=opts.seed)]
    keep = {q.doc for q in queries}
    work = out / "work"
    work.mkdir(parents=True, exist_ok=True)
    for s in sets:
        s.texts = {k: v for k, v in s.texts.items() if k in keep}
        if s.texts:
            log(f"ingesting {len(s.texts)} documents of {s.source} ...")
            ingest_texts(s, work / "docs", session)
    if corpus:
        rep = ingest([Path(c) for c in corpus], session.settings, embedder=session.embedder)
        if rep.failed:
            raise UsageError(f"ingest failed for {rep.failed}")
        session.reopen_store()
    # the pools depend on the sets, the documents, the sample and the retrieval that mined them
    key = (f"pool{opts.pool}-seed{opts.seed}-docs{opts.max_docs}-per{opts.per_doc}-u{opts.unanswerable}-"
           + inputs_key([*sources, *(corpus or [])], session.settings.embed.model_dump(mode="json"),
                        session.settings.retrieve.model_dump(mode="json"), session.settings.ingest.model_dump(mode="json")))
    cache = work / f"mined-{key}.jsonl"
    if cache.exists():
        mined = load_mined(cache)
    else:
        log(f"retrieving the pools of {len(queries)} questions over {len(keep)} documents ...")
        t0 = time.perf_counter()

        def progress(n: int, total: int) -> None:
            if n % 100 == 0 or n == total:
                el = time.perf_counter() - t0
                log(f"  {n}/{total}  {el / 60:.1f} min, about {el / n * (total - n) / 60:.1f} min left")

        mined = mine(queries, session, opts.pool, on_progress=progress)
        save_mined(cache, mined)
    # (training documents, held-out documents); seed + 1: the split the shipped model was trained on
    train_docs, held_docs = split_documents((q.doc for q in queries), opts.held_share, opts.seed + 1)
    train_m = [m for m in mined if m.doc in train_docs]
    held_m = [m for m in mined if m.doc in held_docs]
    answerable = [m for m in mined if m.spans]
    recall = sum(any(m.gold) for m in answerable) / max(1, len(answerable))
    pairs = training_pairs(train_m, negatives=opts.negatives, positives=opts.positives, missed=opts.missed, seed=opts.seed)
    log(f"{len(mined)} questions over {len(keep)} documents; training on {len(train_docs)} documents "
        f"({len(pairs)} pairs, {sum(p[2] for p in pairs):.0f} positive), {len(held_docs)} held out; "
        f"a gold passage in the pool of {opts.pool} for {recall:.3f} of the answerable questions")
    if not pairs or not any(p[2] for p in pairs):
        raise UsageError("no training pair holds gold evidence: check that the spans are verbatim text of the documents")
    base = base_model(opts.base, work, session.settings.cache_dir, num_labels=1)
    t0 = time.perf_counter()
    torch_dir = train(pairs, base, work, labels=["relevance"], epochs=opts.epochs, seed=opts.seed,
                      batch_size=opts.batch_size, max_length=opts.max_length, lr=opts.lr, log=log)
    train_s = time.perf_counter() - t0
    export_onnx(torch_dir, out, opts.max_length)
    (out / "reranker.json").write_text(json.dumps({"kind": "reranker", "max_length": opts.max_length, "segment_ids": "pair"}, indent=2) + "\n",
                                       encoding="utf-8")
    figures = {}
    if held_m:
        log(f"ranking the {len(held_m)} held-out pools with the starting model and the trained one ...")
        starting = session.settings.retrieve.rerank_model if opts.base in (None, "minilm") else opts.base
        from ragkit.models import REGISTRY, resolve

        if starting in REGISTRY and REGISTRY[starting].kind == "reranker":
            figures["start"] = ranking_figures(OnnxCrossEncoder(resolve(starting, "reranker", session.settings.cache_dir),
                                                                name=starting), held_m)
            figures["start"]["model"] = starting  # what it is set against: the base, or today's reranker for minilm
        figures["trained"] = ranking_figures(OnnxCrossEncoder(out, name=out.name, max_length=opts.max_length), held_m)
    card = {
        "sources": [shown_path(s.source) for s in sets], "licences": sorted({LICENCES[s.kind] for s in sets if s.kind in LICENCES}),
        "corpus": [shown_path(c) for c in corpus or []], "questions": len(mined), "documents": len(keep),
        "train_documents": len(train_docs), "held_documents": sorted(held_docs), "pairs": len(pairs),
        "positive_pairs": int(sum(p[2] for p in pairs)), "pool_recall": round(recall, 3),
        "base": BASES.get(opts.base or "minilm", str(opts.base)), "starting_model": opts.base,
        "options": asdict(opts), "held_out": figures, "train_s": round(train_s, 1),
        "total_s": round(time.perf_counter() - t_start, 1), "command": command,
        "files": {f: sha256_file(out / f) for f in ("model.onnx", "tokenizer.json", "reranker.json")},
        "size_mb": round((out / "model.onnx").stat().st_size / 1e6, 1),
    }
    (out / "training.json").write_text(json.dumps(card, indent=2) + "\n", encoding="utf-8")
    (out / "MODEL_CARD.md").write_text(model_card(card), encoding="utf-8")
    return card


def model_card(card: dict) -> str:
    o = card["options"]
    fig = card.get("held_out") or {}

    def row(name: str, f: dict | None) -> str:
        f = f or {}
        fmt = lambda v: "-" if v is None else f"{v:.3f}"  # noqa: E731
        return f"| {name} | {fmt(f.get('gold_first'))} | {fmt(f.get('mrr'))} | {fmt(f.get('answerable_auc'))} |"

    table = "\n".join(["| model | gold passage first | MRR | best score: answerable vs not (ROC AUC) |", "|---|---|---|---|",
                       *([row(f"before: {fig['start'].get('model', card['starting_model'])}", fig["start"])] if "start" in fig else []),
                       row("trained", fig.get("trained"))])
    held = fig.get("trained") or {}
    return f"""# Reranker trained by `ragkit tune reranker`

A cross-encoder that reads (a question, one passage: a clause heading and a sentence or list
item) and gives one relevance logit; ragkit's reranker stage orders retrieval's candidates by
it (`retrieve.rerank_model = "<this folder>"`).

- Base: {card['base']}
- Data: {', '.join(card['sources'])}{(' (documents: ' + ', '.join(card['corpus']) + ')') if card['corpus'] else ''};
  {card['questions']} questions over {card['documents']} documents (seed {o['seed']}: {('at most ' + str(o['max_docs']) + ' documents of each set, ') if o['max_docs'] else ''}at most {o['per_doc']} answerable
  questions a document and {o['unanswerable']} unanswerable ones per answerable one).
- Pairs: each question retrieved by ragkit's own retrieval over its document, a pool of {o['pool']} candidates;
  the pool held a gold passage for {card['pool_recall']:.3f} of the answerable questions. Per question at most
  {o['positives']} gold passages of the pool, {o['missed']} gold passage the pool missed, and {o['negatives']} other passages of
  the pool (hard negatives from the same document); {card['pairs']} pairs, {card['positive_pairs']} positive.
- Split by document: {card['train_documents']} documents train; {len(card['held_documents'])} train nothing and give the
  figures below ({held.get('questions', 0)} questions with a gold passage in the pool, {held.get('unanswerable', 0)} unanswerable).
- Training: sentence-transformers CrossEncoderTrainer, binary cross-entropy, fp32, {o['epochs']} epoch(s), batch
  {o['batch_size']}, learning rate {o['lr']}, max length {o['max_length']}; {card['train_s'] / 60:.1f} min
  ({card['total_s'] / 60:.1f} min in all) on the machine that trained it. Exported to ONNX, INT8 (dynamic, per channel):
  {card['size_mb']} MB.
- Command: `{card['command']}`
- Files (sha256): {'; '.join(f'`{k}` {v}' for k, v in card['files'].items())}

## On the held-out documents (INT8, as shipped)

{table}

The figures for whole questions over the dev sets (evidence within the prompt's first tokens,
not_found) are in eval/README.md, from eval/bench_ranking.py.

Licences: the labelled data's ({'; '.join(card['licences']) or 'the user’s own'}) and the base model's (the
Base line above). A model trained on CC BY 4.0 data is released under CC BY 4.0 with that attribution.
"""
