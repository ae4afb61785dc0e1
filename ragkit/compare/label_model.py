"""The checklist's label model: Yes / No / Not mentioned decided by a classifier trained on
labelled NDAs (`ragkit tune checklist`), not by word lists or the generator.

How an item is labelled for one document:

1. `candidates`: the document's sentences (every chunk of it in the store, each list item
   with its lead-in) nearest the item's hypothesis by the store's embedder, `candidates`
   of them (the model's `label_model.json`).
2. The model reads (hypothesis, sentence) for each candidate and gives three
   probabilities: the sentence entails the hypothesis, contradicts it, or is not about it
   (it was trained with the gold evidence spans as Entailment / Contradiction and every
   other sentence as not about the item).
3. `decide`: the sentence most likely about the item is the evidence. Below the model's
   `threshold` (chosen on documents that trained nothing) the item is Not mentioned, and
   that sentence is only the closest one; above it the label is Contradiction (No) when
   that sentence's Contradiction probability is at least `contradiction_share` of its
   Entailment and Contradiction together (also chosen there), else Entailment (Yes), and
   the sentence is the quote. The label's probability
   is shown; under `low_confidence` the reader is told.

The model is a cross-encoder body with a three-way head, exported to ONNX INT8 and run by
onnxruntime (`ragkit.rerankers.onnx.OnnxCrossEncoder`): about 17 x 24 sentence pairs a
document, a second or two on 2 cores.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from ragkit.errors import ConfigError

if TYPE_CHECKING:
    from ragkit.session import Session

NLI_TO_LABEL = {"Entailment": "Yes", "Contradiction": "No", "NotMentioned": "Not mentioned"}
CONFIG = "label_model.json"


@dataclass
class Candidate:
    unit: str  # the sentence or list item alone (the quote a lawyer reads)
    text: str  # what the model reads: the unit with its lead-in
    hit: object  # the stored chunk it is in (page, section)
    cos: float  # cosine to the hypothesis (the store's embedder)


@dataclass
class LabelDecision:
    label: str  # Entailment / Contradiction / NotMentioned
    probabilities: dict[str, float]  # of the evidence sentence: Entailment, Contradiction, NotMentioned
    evidence: Candidate | None  # the sentence the label rests on (for NotMentioned: the closest)
    about: float  # P(the evidence sentence is about the item) = 1 - P(NotMentioned)
    low_confidence: bool

    @property
    def checklist_label(self) -> str:
        return NLI_TO_LABEL[self.label]

    @property
    def confidence(self) -> float:
        p = self.probabilities
        return round(1.0 - self.about if self.label == "NotMentioned" else p[self.label], 3)


class LabelModel:
    """A trained label model folder: `model.onnx`, `tokenizer.json` and `label_model.json`
    (its labels in output order, max_length, candidates, threshold, low_confidence)."""

    def __init__(self, folder: Path, *, name: str | None = None, threads: int = 0):
        from ragkit.rerankers.onnx import OnnxCrossEncoder, model_config

        self.folder = Path(folder)
        if not (self.folder / CONFIG).is_file():
            raise ConfigError(f"label model folder {self.folder} has no {CONFIG}",
                              hint="a folder written by `ragkit tune checklist`")
        # its threshold and share were fitted on its model.onnx: refused with another file
        cfg = model_config(self.folder, CONFIG)
        try:
            self.labels: list[str] = list(cfg["labels"])
            self.max_length = int(cfg.get("max_length", 256))
            self.candidates = int(cfg.get("candidates", 24))
            self.threshold = float(cfg["threshold"])
            self.low_confidence = float(cfg.get("low_confidence", 0.6))
            # No when Contradiction's share of (Entailment + Contradiction) on the evidence reaches this
            self.contradiction_share = float(cfg.get("contradiction_share", 0.5))
            self.hypotheses: dict[str, str] = dict(cfg.get("hypotheses", {}))
        except (KeyError, TypeError, ValueError) as exc:
            raise ConfigError(f"{self.folder / CONFIG} is not valid: {exc}") from None
        if sorted(self.labels) != sorted(NLI_TO_LABEL):
            raise ConfigError(f"{self.folder / CONFIG}: labels must be {', '.join(NLI_TO_LABEL)}, not {self.labels}")
        self.name = name or self.folder.name
        self.config = cfg
        self._encoder = OnnxCrossEncoder(self.folder, name=self.name, threads=threads, batch_size=32,
                                         max_length=self.max_length, segment_ids=cfg.get("segment_ids", "pair"))

    def probabilities(self, hypothesis: str, texts: list[str]) -> list[dict[str, float]]:
        """Each text's three probabilities against the hypothesis (softmax of the logits)."""
        import numpy as np

        if not texts:
            return []
        logits = self._encoder.logits(hypothesis, texts)
        z = logits - logits.max(axis=1, keepdims=True)
        p = np.exp(z) / np.exp(z).sum(axis=1, keepdims=True)
        return [{lab: float(row[i]) for i, lab in enumerate(self.labels)} for row in p]

    def decide(self, hypothesis: str, cands: list[Candidate]) -> LabelDecision:
        """The label from the candidates (see the module's docstring)."""
        probs = self.probabilities(hypothesis, [c.text for c in cands])
        i, label = decide_probabilities(probs, self.threshold, self.contradiction_share)
        if i is None:
            return LabelDecision("NotMentioned", {"Entailment": 0.0, "Contradiction": 0.0, "NotMentioned": 1.0}, None, 0.0, False)
        p = probs[i]
        d = LabelDecision(label, {k: round(v, 4) for k, v in p.items()}, cands[i], round(1.0 - p["NotMentioned"], 4), False)
        d.low_confidence = d.confidence < self.low_confidence
        return d


def decide_probabilities(probs: list[dict[str, float]], threshold: float, share: float) -> tuple[int | None, str]:
    """(the index of the evidence sentence, the label) from each candidate's probabilities:
    the sentence most likely about the item (the first on a tie); NotMentioned below
    `threshold`, else Contradiction when its share of Entailment + Contradiction reaches
    `share`, else Entailment. `LabelModel.decide` and the training's replay on stored
    probabilities (ragkit.tune.checklist.decide_row) both decide here."""
    if not probs:
        return None, "NotMentioned"
    i = max(range(len(probs)), key=lambda j: 1.0 - probs[j]["NotMentioned"])
    p = probs[i]
    if 1.0 - p["NotMentioned"] < threshold:
        return i, "NotMentioned"
    c = p["Contradiction"] / max(p["Entailment"] + p["Contradiction"], 1e-9)
    return i, "Contradiction" if c >= share else "Entailment"


def hypothesis_of(item, model: LabelModel | None = None) -> str:
    """What the model reads as the item: its hypothesis (the training set's wording when the
    model was trained on another wording of the same item), else its question."""
    if model is not None and item.id in model.hypotheses:
        return model.hypotheses[item.id]
    return item.hypothesis or item.question


def candidates(hypothesis: str, contexts, session: "Session", k: int) -> list[Candidate]:
    """The document's `k` sentences nearest the hypothesis by the store's embedder (the
    vectors are remembered by the session's embedder, so `evidence` reuses them), each with
    its lead-in when it is a list item."""
    import numpy as np

    from ragkit.compare.quotes import document_sentences
    from ragkit.evidence.quotes import with_lead_in
    from ragkit.evidence.sentences import split_units

    sents = document_sentences(contexts, session)
    if not sents:
        return []
    emb = session.embedder
    vecs = np.asarray(emb.embed_documents([u for u, _ in sents]), dtype=np.float32)
    q = np.asarray(emb.embed_query(hypothesis), dtype=np.float32)
    cos = vecs @ q
    units_of: dict[int, list[str]] = {}
    out = []
    for i in np.argsort(-cos, kind="stable")[:k]:
        unit, hit = sents[int(i)]
        units = units_of.setdefault(id(hit), split_units(hit.text))
        text = with_lead_in(units, units.index(unit)) if unit in units else unit
        out.append(Candidate(unit, text, hit, float(cos[int(i)])))
    return out


def load_label_model(name_or_path: str, session: "Session") -> LabelModel:
    """A label model by registry name (pinned files checked before loading) or folder."""
    from ragkit.models import REGISTRY, resolve

    folder = resolve(name_or_path, "label-model", session.settings.cache_dir)
    return LabelModel(folder, name=name_or_path if name_or_path in REGISTRY else None,
                      threads=session.settings.retrieve.rerank_threads)


def probability_line(d: LabelDecision) -> str:
    """The probabilities as a reader sees them: "Yes 0.91 · No 0.05 · Not mentioned 0.04"."""
    p = d.probabilities
    if d.label == "NotMentioned":
        shown = {"Not mentioned": 1.0 - d.about, "Yes": p["Entailment"], "No": p["Contradiction"]}
    else:
        shown = {NLI_TO_LABEL[k]: v for k, v in p.items()}
    return " · ".join(f"{k} {v:.2f}" for k, v in sorted(shown.items(), key=lambda kv: -kv[1]) if not math.isnan(v))
