"""Labelled documents for training a checklist label model: each document's text (or its
name in a store) and, per checklist item, the gold label and evidence spans.

Two formats are read:
- ContractNLI's JSON (`dev.json`, `train.json`): `documents[]` with `text`, `spans` (char
  offsets) and `annotation_sets[0].annotations[item] = {choice, spans}`; the texts come with
  the file, so the documents are ingested from it.
- ragkit's eval set (JSONL, `ragkit.eval.sets`): items with `doc`, `label` and the checklist
  item's id among `tags`, evidence in `evidence` / `evidence_all`; the documents are the
  store's (`--store`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from ragkit.errors import UsageError

LABELS = ("Entailment", "Contradiction", "NotMentioned")


@dataclass
class LabelledItem:
    doc: str  # the document's name (as the store knows it)
    item: str  # the checklist item's id
    label: str  # Entailment / Contradiction / NotMentioned
    spans: list[str] = field(default_factory=list)  # the gold evidence, verbatim


@dataclass
class LabelledSet:
    items: list[LabelledItem]
    texts: dict[str, str] = field(default_factory=dict)  # name -> text, for documents to ingest
    source: str = ""

    def docs(self) -> list[str]:
        return sorted({i.doc for i in self.items})


def safe_name(name: str) -> str:
    """A file name for a document title ("DBT%20Mutual NDA.pdf" -> "DBT_20Mutual_NDA.pdf.txt")."""
    keep = "".join(ch if ch.isalnum() or ch in "._-" else "_" for ch in name).strip("._") or "document"
    return keep[:120] + ".txt"


def read_contractnli(path: Path, prefix: str = "") -> LabelledSet:
    """A ContractNLI JSON file: one LabelledItem per document and hypothesis, the document
    named `prefix + safe_name(file_name)` (so two files' documents never share a name)."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
        docs = data["documents"]
    except FileNotFoundError:
        raise UsageError(f"no such file: {path}") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, KeyError, TypeError) as exc:
        raise UsageError(f"{path} is not a ContractNLI JSON file ({type(exc).__name__}: {exc})",
                         hint="expected {\"documents\": [{\"text\", \"spans\", \"annotation_sets\"}], \"labels\": {...}}") from None
    out = LabelledSet(items=[], source=str(path))
    for d in docs:
        try:
            name = prefix + safe_name(str(d["file_name"]))
            text, spans = d["text"], d["spans"]
            annotations = d["annotation_sets"][0]["annotations"]
        except (KeyError, IndexError, TypeError) as exc:
            raise UsageError(f"{path}: document {d.get('id', '?')} lacks {exc}") from None
        out.texts[name] = text
        for item, a in annotations.items():
            if a["choice"] not in LABELS:
                raise UsageError(f"{path}: {name} {item}: unknown label {a['choice']!r}")
            out.items.append(LabelledItem(name, item, a["choice"], [text[spans[i][0]:spans[i][1]] for i in a["spans"]]))
    return out


def read_eval_set(path: Path, item_ids: set[str]) -> LabelledSet:
    """An eval set (JSONL): its items with a `label` and a tag naming a checklist item."""
    from ragkit.eval.sets import load_set  # noqa: PLC0415  (the set format lives with the harness)

    out = LabelledSet(items=[], source=str(path))
    for it in load_set(Path(path)):
        tag = next((t for t in it.tags if t in item_ids), None)
        if it.label is None or tag is None or not it.doc:
            continue
        spans = list(it.evidence_all) or ([it.evidence] if it.evidence else [])
        out.items.append(LabelledItem(it.doc, tag, it.label, spans))
    if not out.items:
        raise UsageError(f"{path} has no item with a label, a document and a tag naming a checklist item",
                         hint=f"tags: one of {', '.join(sorted(item_ids))}")
    return out


def read_labelled(path: Path, item_ids: set[str]) -> LabelledSet:
    """Either format, by its extension (.json: ContractNLI, .jsonl: an eval set)."""
    p = Path(path)
    if p.suffix == ".json":
        return read_contractnli(p, prefix=f"{p.stem}-")
    if p.suffix == ".jsonl":
        return read_eval_set(p, item_ids)
    raise UsageError(f"{p}: a labelled set is a ContractNLI .json or an eval set .jsonl")
