"""`ragkit tune embedder`: fine-tune the embedder behind retrieval's first stage on labelled
documents (questions with their gold clauses), the data `ragkit tune reranker` reads.

On long contracts the clause is lost before the cross-encoder reads anything: the first
stage's top 10 (the reranker's pool) misses it (eval/README.md "where the gold clause is
lost"). The first stage is the embedder and BM25; this trains the embedder's half.

1. Labelled sets are read into queries by `ragkit.tune.reranker.read_queries` (CUAD's
   `master_clauses.csv`, ContractNLI JSON, eval sets) and sampled by document.
2. Each document is chunked as ingest chunks it (`ragkit.ingest.sources.chunk_file`, the
   embedder's tokenizer): the passages are the texts the store embeds (`Chunk.embed_text`:
   section path, then body). Nothing is embedded or stored for this.
3. The documents are split once (`ragkit.tune.training.split_documents`): `held_share`
   of them train nothing and give the model card's figures.
4. A question's positive is a chunk that holds one of its gold spans (the eval's strict
   rule); its hard negative, the best chunk of the same document by BM25 (bm25s, the
   lexical half of the first stage) that holds none. The other passages of a batch are
   the in-batch negatives of sentence-transformers' MultipleNegativesRankingLoss.
5. MiniLM-L6 (the registry's `minilm`) is fine-tuned in fp32 by SentenceTransformerTrainer
   and saved as a sentence-transformers folder (`embed.model` takes its path).
6. On the held-out documents both models rank every chunk of the question's document by
   cosine: gold within the top 10 / 50, rank 1, mean reciprocal rank.

A store keeps the vectors of the embedder that made it (the store's `embed.model` is
recorded and checked), so a store made with another embedder is re-embedded by ingesting
its files into a new store with `embed.model` set to the trained folder.
"""

from __future__ import annotations

import json
import random
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

from ragkit.errors import UsageError


@dataclass
class EmbedTuneOptions:
    max_docs: int = 300  # per labelled set
    per_doc: int = 6  # answerable questions a document
    held_share: float = 0.1
    epochs: float = 1.0
    batch_size: int = 32
    lr: float = 3e-5
    max_length: int = 256
    seed: int = 24
    base: str | None = None  # minilm (default) or a sentence-transformers folder


def chunk_texts(texts: dict[str, str], work: Path, session) -> dict[str, list[str]]:
    """Each document (name -> text) chunked as ingest chunks a text file: the texts the
    store would embed, in document order."""
    from ragkit.ingest.sources import chunk_file

    folder = work / "docs"
    folder.mkdir(parents=True, exist_ok=True)
    out: dict[str, list[str]] = {}
    for name, text in texts.items():
        p = folder / f"{name}.txt"
        if not p.exists() or p.read_text(encoding="utf-8") != text:
            p.write_text(text, encoding="utf-8")
        chunks, _, _ = chunk_file(p, session.settings, session.embedder)
        out[name] = [c.embed_text() for c in chunks]
    return out


def _holds(passage: str, spans: list[str]) -> bool:
    from ragkit.eval.metrics_text import evidence_in_text_strict

    return any(evidence_in_text_strict(s, passage) for s in spans if s.strip())


def triplets(queries, chunks: dict[str, list[str]], seed: int) -> list[tuple[str, str, str]]:
    """(search text, a chunk holding a gold span, the best BM25 chunk of the same document
    holding none) for each answerable query whose gold lies whole in a chunk."""
    import bm25s

    from ragkit.retrieve.query import search_query

    rng = random.Random(seed)
    by_doc: dict[str, list] = {}
    for q in queries:
        if q.spans and q.doc in chunks:
            by_doc.setdefault(q.doc, []).append(q)
    out = []
    for doc, qs in sorted(by_doc.items()):
        passages = chunks[doc]
        if len(passages) < 2:
            continue
        index = bm25s.BM25()
        index.index(bm25s.tokenize(passages, stopwords="en", show_progress=False), show_progress=False)
        for q in qs:
            gold = [k for k, p in enumerate(passages) if _holds(p, q.spans)]
            if not gold:
                continue  # the gold clause is split across chunks: no whole positive
            asked = search_query(q.question)
            ids, _ = index.retrieve(bm25s.tokenize([asked], stopwords="en", show_progress=False),
                                    k=min(20, len(passages)), show_progress=False)
            neg = next((int(k) for k in ids[0] if int(k) not in gold), None)
            if neg is None:
                neg = rng.choice([k for k in range(len(passages)) if k not in gold] or [gold[0]])
            out.append((asked, passages[rng.choice(gold)], passages[neg]))
    rng.shuffle(out)
    return out


def ranking_figures(encode: Callable[[list[str]], "object"], queries, chunks: dict[str, list[str]]) -> dict:
    """Every chunk of the question's document ranked by cosine: the first gold chunk within
    the top 10 / 50, at rank 1, mean reciprocal rank (answerable questions whose gold lies
    whole in a chunk)."""
    import numpy as np

    from ragkit.retrieve.query import search_query

    ranks = []
    vecs: dict[str, object] = {}
    for q in queries:
        if not q.spans or q.doc not in chunks:
            continue
        passages = chunks[q.doc]
        gold = {k for k, p in enumerate(passages) if _holds(p, q.spans)}
        if not gold:
            continue
        if q.doc not in vecs:
            vecs[q.doc] = np.asarray(encode(passages))
        qv = np.asarray(encode([search_query(q.question)]))[0]
        order = np.argsort(-(vecs[q.doc] @ qv))
        ranks.append(next(r for r, k in enumerate(order, 1) if int(k) in gold))
    n = max(len(ranks), 1)
    return {"questions": len(ranks), "top10": round(sum(r <= 10 for r in ranks) / n, 3),
            "top50": round(sum(r <= 50 for r in ranks) / n, 3), "rank1": round(sum(r == 1 for r in ranks) / n, 3),
            "mrr": round(sum(1 / r for r in ranks) / n, 3)}


def train_embedder(data: list[tuple[str, str, str]], base: Path, out: Path, opts: EmbedTuneOptions,
                   log: Callable[[str], None]) -> Path:
    """Fine-tune `base` on (query, positive, hard negative) triplets with in-batch negatives,
    fp32; saved as a sentence-transformers folder in `out/model`."""
    import contextlib
    import sys

    import torch
    from datasets import Dataset
    from sentence_transformers import SentenceTransformer, SentenceTransformerTrainer, SentenceTransformerTrainingArguments
    from sentence_transformers.sentence_transformer.losses import MultipleNegativesRankingLoss
    from transformers import set_seed

    from ragkit.tune.training import progress_callback

    set_seed(opts.seed)
    torch.manual_seed(opts.seed)
    model = SentenceTransformer(str(base), device="cpu", local_files_only=True)
    model.max_seq_length = opts.max_length
    ds = Dataset.from_dict({"anchor": [t[0] for t in data], "positive": [t[1] for t in data],
                            "negative": [t[2] for t in data]})
    steps = max(1, int(len(data) * opts.epochs / opts.batch_size))

    args = SentenceTransformerTrainingArguments(
        output_dir=str(out / "checkpoints"), num_train_epochs=opts.epochs, per_device_train_batch_size=opts.batch_size,
        learning_rate=opts.lr, warmup_ratio=0.1, weight_decay=0.01, seed=opts.seed, data_seed=opts.seed,
        logging_steps=max(1, steps // 40), save_strategy="no", report_to=[], use_cpu=True, bf16=False, fp16=False,
        dataloader_num_workers=0, disable_tqdm=True,
        batch_sampler="no_duplicates",  # two copies of one passage in a batch would be each other's false negative
    )
    trainer = SentenceTransformerTrainer(model=model, args=args, train_dataset=ds,
                                         loss=MultipleNegativesRankingLoss(model), callbacks=[progress_callback(log)])
    with contextlib.redirect_stdout(sys.stderr):  # the trainer prints its log dicts: stdout is for --json
        trainer.train()
    target = out / "model"
    model.save(str(target))
    return target


def tune_embedder(sources: list[Path], out: Path, session, opts: EmbedTuneOptions, *, command: str = "",
                  log: Callable[[str], None] = print) -> dict:
    """Train an embedder from labelled documents into `out` (see the module's docstring);
    returns what the model card says."""
    from sentence_transformers import SentenceTransformer

    from ragkit.tune.reranker import LICENCES, read_queries, sample
    from ragkit.tune.training import BASES, base_model, shown_path, split_documents

    t_start = time.perf_counter()
    sets = [read_queries(p) for p in sources]
    if any(not s.texts for s in sets):
        raise UsageError("tune embedder reads labelled sets that carry their texts: CUAD's master_clauses.csv "
                         "or ContractNLI .json")
    queries = [q for s in sets for q in sample(s.queries, max_docs=opts.max_docs, per_doc=opts.per_doc,
                                               unanswerable=0.0, seed=opts.seed)]
    keep = {q.doc for q in queries}
    work = out / "work"
    work.mkdir(parents=True, exist_ok=True)
    texts = {k: v for s in sets for k, v in s.texts.items() if k in keep}
    log(f"chunking {len(texts)} documents ...")
    chunks = chunk_texts(texts, work, session)
    train_docs, held_docs = split_documents(sorted(keep), opts.held_share, opts.seed)
    data = triplets([q for q in queries if q.doc in train_docs], chunks, opts.seed)
    if not data:
        raise UsageError("no question has its gold clause whole in a chunk of its document: nothing to train on")
    held = [q for q in queries if q.doc in held_docs]
    base = base_model(opts.base, work, session.settings.cache_dir)
    log(f"training on {len(data)} questions of {len(train_docs)} documents ({len(held_docs)} held out) ...")
    t0 = time.perf_counter()
    target = train_embedder(data, base, out, opts, log)
    train_min = (time.perf_counter() - t0) / 60
    figures = {}
    for label, folder in (("base", base), ("trained", target)):
        m = SentenceTransformer(str(folder), device="cpu", local_files_only=True)
        figures[label] = ranking_figures(lambda t, m=m: m.encode(t, batch_size=32, normalize_embeddings=True),
                                         held, chunks)
        log(f"held-out documents, {label}: {figures[label]}")
    card = {
        "kind": "embedder", "base": BASES.get(opts.base or "minilm", shown_path(base)), "options": asdict(opts), "command": command,
        "sources": [{"path": shown_path(s.source), "kind": s.kind, "licence": LICENCES.get(s.kind, "")} for s in sets],
        "documents": {"train": len(train_docs), "held_out": len(held_docs)}, "held_out_docs": sorted(held_docs),
        "training_questions": len(data),
        "held_out_figures": figures, "training_minutes": round(train_min, 1),
    }
    card |= export_shipped(target, out, held, chunks, log)
    card["total_minutes"] = round((time.perf_counter() - t_start) / 60, 1)
    (out / "training.json").write_text(json.dumps(card, indent=1), encoding="utf-8")
    (out / "MODEL_CARD.md").write_text(model_card(card), encoding="utf-8")
    return card


def export_shipped(target: Path, out: Path, held, chunks: dict[str, list[str]], log: Callable[[str], None]) -> dict:
    """The trained folder as the files ragkit ships (`out/model.onnx`, INT8, and its
    tokenizer.json; the registry's `onnx-prebuilt` engine runs them), the shipped file's own
    figures on the held-out documents, its agreement with the fp32 model and its pins."""
    import shutil

    import numpy as np
    from sentence_transformers import SentenceTransformer

    from ragkit.embed.onnx import OnnxSession, export_int8, st_layout
    from ragkit.models import sha256_file

    log("exporting INT8 ONNX ...")
    export_int8(target, out / "model.onnx")
    shutil.copy(target / "tokenizer.json", out / "tokenizer.json")
    layout = st_layout(target)
    onnx = OnnxSession(out / "model.onnx", out / "tokenizer.json", layout)
    # batches of one: dynamic quantization scales activations per batch, so one text alone is
    # what a query meets and the figures do not depend on batch-mates
    figures = ranking_figures(lambda t: np.concatenate([onnx.encode([x]) for x in t]), held, chunks)
    log(f"held-out documents, trained INT8 ONNX: {figures}")
    sample = [p for doc in sorted(chunks)[:20] for p in chunks[doc][:10]]
    fp32 = SentenceTransformer(str(target), device="cpu", local_files_only=True).encode(sample, normalize_embeddings=True)
    int8 = np.concatenate([onnx.encode([x]) for x in sample])
    cos = (fp32 * int8).sum(1)
    return {"shipped": {"held_out_figures": figures, "layout": layout,
                        "cosine_to_fp32": {"texts": len(sample), "mean": round(float(cos.mean()), 4),
                                           "min": round(float(cos.min()), 4)},
                        "size_mb": round((out / "model.onnx").stat().st_size / 1e6, 1),
                        "files": {n: sha256_file(out / n) for n in ("model.onnx", "tokenizer.json")}}}


def model_card(card: dict) -> str:
    o, ship = card["options"], card["shipped"]
    rows = [("before: " + card["base"].split(":")[0], card["held_out_figures"]["base"]),
            ("trained (fp32)", card["held_out_figures"]["trained"]), ("trained, INT8 ONNX as shipped", ship["held_out_figures"])]
    table = "\n".join(["| model | gold chunk in the top 10 | top 50 | first | MRR |", "|---|---|---|---|---|",
                       *(f"| {n} | {f['top10']:.3f} | {f['top50']:.3f} | {f['rank1']:.3f} | {f['mrr']:.3f} |" for n, f in rows)])
    cos = ship["cosine_to_fp32"]
    return f"""# Embedder trained by `ragkit tune embedder`

The embedder of retrieval's first stage (with BM25): it turns each chunk and each question
into a {ship['layout'].get('max_seq_length')}-token-window vector, {ship['layout']['pooling']} pooling, normalized; the store's
nearest chunks are the reranker's candidates. MiniLM-L6 fine-tuned on contract clauses.

- Base: {card['base']}
- Data: {', '.join(s['path'] for s in card['sources'])};
  at most {o['max_docs']} documents of each set and {o['per_doc']} answerable questions a document (seed {o['seed']}).
- Pairs: each question's chunk that holds a gold span whole (the eval's strict rule), against the
  best chunk of the same document by BM25 that holds none, and the batch's other passages
  (MultipleNegativesRankingLoss); {card['training_questions']} questions of {card['documents']['train']} documents.
- Split by document: {card['documents']['held_out']} documents ({o['held_share']:.0%}, by the seed) train nothing and give the figures below.
- Training: sentence-transformers SentenceTransformerTrainer, fp32, {o['epochs']} epoch(s), batch {o['batch_size']},
  learning rate {o['lr']}, max length {o['max_length']}; {card['training_minutes']} min ({card['total_minutes']} min in all) on
  the machine that trained it (2 cores). Exported to ONNX, INT8 (dynamic, per channel; the
  feed-forward output projections kept in fp32): {ship['size_mb']} MB; cosine to the fp32 model
  on {cos['texts']} training chunks: mean {cos['mean']}, min {cos['min']}.
- Command: `{card['command']}`
- Files (sha256): {'; '.join(f'`{k}` {v}' for k, v in ship['files'].items())}

## On the held-out documents

Every chunk of the question's document ranked by cosine to the question.

{table}

Inside the whole retrieval (hybrid search, sentence ranking, the reranker) on the dev sets,
which trained nothing: eval/README.md, from eval/bench_ranking.py.

Licences: the labelled data's ({'; '.join(sorted({s['licence'] for s in card['sources'] if s['licence']})) or 'the user’s own'})
and the base model's (the Base line above). A model trained on CC BY 4.0 data is released under
CC BY 4.0 with that attribution.
"""
