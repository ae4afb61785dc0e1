"""Labelled sets: one JSONL schema, and converters from the shared corpora.

Each line of a set is one `EvalItem`:

    {"id", "question", "doc"?, "answers": [str], "answers_mode"?: "any"|"all",
     "evidence"?: str, "page"?: int, "pages"?: [int], "answerable"?: bool, "label"?: str, "tags"?: [str]}

- `doc`: a file name, with or without extension; the question is asked of that document only.
- `evidence`: a quote the retrieved context must contain (compared after normalizing
  whitespace, case, hyphenation and quotes; see ragkit.eval.metrics).
- `page`: 1-based page of the evidence; `pages`: every gold page (1-based) when the
  evidence lies on several (FinanceBench: a ratio's income statement and balance sheet).
- `answerable: false`: the right answer is to abstain.
- `label`: NLI label (Entailment / Contradiction / NotMentioned); the generated answer is
  mapped to a label by `ragkit.eval.metrics.nli_label`.
- `tags`: free-form kinds (e.g. `multi-doc`, `table`) and `source:FILE` for every document
  that holds the answer (used for the document-recall metric).

Unknown fields are refused, so a typo in a hand-written set is caught.
"""

from __future__ import annotations

import csv
import hashlib
import json
import re
from pathlib import Path
from typing import Callable, Iterable, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from ragkit.errors import UsageError

NLI_LABELS = ("Entailment", "Contradiction", "NotMentioned")


class EvalItem(BaseModel):
    model_config = ConfigDict(extra="forbid")

    id: str = Field(min_length=1)
    question: str = Field(min_length=1)
    doc: str | None = None
    answers: list[str] = Field(default_factory=list)
    answers_mode: Literal["any", "all"] = "any"
    evidence: str | None = None
    evidence_all: list[str] = Field(default_factory=list)  # every annotated span (ContractNLI, CUAD); a quote may match any
    page: int | None = Field(None, ge=1)
    pages: list[int] = Field(default_factory=list)  # every gold page when there are several (`page` is the first)
    answerable: bool = True
    label: str | None = None
    tags: list[str] = Field(default_factory=list)

    @field_validator("label")
    @classmethod
    def _label(cls, v: str | None) -> str | None:
        if v is not None and v not in NLI_LABELS:
            raise ValueError(f"label must be one of {', '.join(NLI_LABELS)}")
        return v

    def sources(self) -> list[str]:
        """Documents that hold the answer: `source:` tags, else `doc`."""
        src = [t[len("source:"):] for t in self.tags if t.startswith("source:")]
        return src or ([self.doc] if self.doc else [])

    def to_line(self) -> str:
        d = self.model_dump(exclude_defaults=True)
        d.setdefault("answers", [])
        order = ["id", "question", "doc", "answers", "answers_mode", "evidence", "evidence_all", "page", "pages", "answerable", "label", "tags"]
        return json.dumps({k: d[k] for k in order if k in d}, ensure_ascii=False)


def load_set(path: Path) -> list[EvalItem]:
    """Read a set; a bad line is a one-line UsageError naming the file and line."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise UsageError(f"no such set file: {path}", hint="give a path to a .jsonl set, e.g. eval/sets/nda-demo.jsonl") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"cannot read set {path}: {exc}") from None
    items: list[EvalItem] = []
    seen: set[str] = set()
    for no, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            item = EvalItem.model_validate_json(line)
        except ValidationError as exc:
            e = exc.errors()[0]
            where = ".".join(str(p) for p in e["loc"]) or "line"
            raise UsageError(f"{path}:{no}: {where}: {e['msg']}") from None
        if item.id in seen:
            raise UsageError(f"{path}:{no}: duplicate id {item.id!r}")
        seen.add(item.id)
        items.append(item)
    if not items:
        raise UsageError(f"set {path} has no questions")
    return items


def write_set(items: Iterable[EvalItem], path: Path) -> int:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = [i.to_line() for i in items]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return len(lines)


def set_digest(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()[:16]


# ---------------------------------------------------------------------- converters

def default_corpora() -> Path:
    return Path(__file__).resolve().parents[2].parent / "shared" / "corpora"


def _need(path: Path) -> Path:
    if not path.exists():
        raise UsageError(f"missing source file {path}", hint="pass --corpora DIR pointing at the shared corpora")
    return path


# -- ContractNLI

NLI_ANSWER = {"Entailment": "Yes", "Contradiction": "No", "NotMentioned": "Not mentioned"}


def nli_question(hypothesis: str) -> str:
    h = hypothesis.strip().rstrip(".")
    first, _, rest = h.partition(" ")
    if first in ("All", "Some", "Any", "The", "Neither", "Each", "No"):
        h = f"{first.lower()} {rest}"
    return f"Does the agreement state that {h}? Start your answer with Yes, No or Not mentioned."


def _pdf_pages(pdf: Path) -> list[str]:
    import pypdfium2 as pdfium

    doc = pdfium.PdfDocument(str(pdf))
    try:
        out = []
        for i in range(len(doc)):
            page = doc[i]
            tp = page.get_textpage()
            out.append(tp.get_text_range())
            tp.close()
            page.close()
        return out
    finally:
        doc.close()


def find_page(pages: list[str], evidence: str) -> int | None:
    """1-based page on which the evidence starts (normalized text), or None."""
    from ragkit.eval.metrics import normalize

    norm = [normalize(p) for p in pages]
    ev = normalize(evidence)
    for probe in (ev, ev[:80], ev[:40]):
        if not probe:
            return None
        for i, p in enumerate(norm, 1):
            if probe in p:
                return i
    return None


def convert_contractnli(corpora: Path, *, rendered_only: bool = False) -> list[EvalItem]:
    """ContractNLI dev: one item per NDA x hypothesis. `doc` is the rendered file name
    (cnli_dev_NNN.pdf) for the 8 NDAs written out as files, else the original file name.
    `evidence` is the first annotated span in document order (retrieval is scored on it);
    `evidence_all` lists every span when there are several (a checklist quote is scored
    against any of them)."""
    base = corpora / "contractnli-dev"
    flat = _need(base / "dev_flat_hypothesis_labels.jsonl")
    dev = json.loads(_need(base / "dev.json").read_text(encoding="utf-8"))
    docs = {d["id"]: d for d in dev["documents"]}
    rendered: dict[int, str] = {}
    rpath = base / "rendered" / "labels_rendered8.jsonl"
    if rpath.exists():
        for line in rpath.read_text(encoding="utf-8").splitlines():
            if line.strip():
                r = json.loads(line)
                rendered[int(r["doc_id"])] = r["rendered_basename"]
    pages_cache: dict[int, list[str]] = {}
    items = []
    for line in flat.read_text(encoding="utf-8").splitlines():
        if not line.strip():
            continue
        r = json.loads(line)
        doc_id = int(r["doc_id"])
        if rendered_only and doc_id not in rendered:
            continue
        d = docs.get(doc_id)
        label = r["label"]
        evidence = None
        span_ids = sorted(r.get("evidence_span_ids") or [])
        if label != "NotMentioned" and span_ids and d is not None:
            a, b = d["spans"][span_ids[0]]
            evidence = d["text"][a:b].strip() or None
        elif label != "NotMentioned" and r.get("evidence_texts"):
            evidence = r["evidence_texts"][0].strip() or None
        spans = [d["text"][a:b].strip() for a, b in (d["spans"][i] for i in span_ids)] if d is not None and label != "NotMentioned" else []
        spans = [x for x in spans if x]
        doc = f"{rendered[doc_id]}.pdf" if doc_id in rendered else r["file_name"]
        page = None
        if evidence and doc_id in rendered:
            pdf = base / "rendered" / f"{rendered[doc_id]}.pdf"
            if pdf.exists():
                if doc_id not in pages_cache:
                    pages_cache[doc_id] = _pdf_pages(pdf)
                page = find_page(pages_cache[doc_id], evidence)
        items.append(EvalItem(
            id=f"cnli-{doc_id:03d}-{r['hypothesis_id']}",
            question=nli_question(r["hypothesis"]),
            doc=doc,
            answers=[NLI_ANSWER[label]],
            evidence=evidence,
            evidence_all=spans if len(spans) > 1 else [],
            page=page,
            label=label,
            tags=[r["hypothesis_id"], f"label:{label}"],
        ))
    return items


# -- CUAD

def _slug(s: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", s.lower()).strip("-")


def convert_cuad(corpora: Path) -> list[EvalItem]:
    """CUAD (10 contracts x 41 categories): the question asks for the clause of that
    category; the gold clauses are the answers (any of them) and the first one is the
    evidence. A category with no gold clause is unanswerable (the model should say the
    documents do not say)."""
    src = _need(corpora / "cuad-10" / "cuad_qa.jsonl")
    items = []
    for line in src.read_text(encoding="utf-8").splitlines():
        if not line.strip():
            continue
        r = json.loads(line)
        pdf = Path(r["contract_pdf"]).name
        details = r["question"].split("Details:", 1)[-1].strip()
        cat = r["category"]
        question = f"Which part of this contract concerns {cat} ({details.rstrip('.?')})? Quote it."
        clauses = [c.strip() for c in r.get("gold_clauses") or [] if c.strip()]
        answers = list(clauses)
        gold = (r.get("gold_answer") or "").strip()
        if gold and r.get("answer_format") != "Yes/No" and gold not in answers:
            answers.insert(0, gold)
        items.append(EvalItem(
            id=f"cuad-{_slug(Path(pdf).stem)[:40]}-{_slug(cat)}",
            question=question,
            doc=pdf,
            answers=answers if clauses else [],
            evidence=clauses[0] if clauses else None,
            evidence_all=clauses if len(clauses) > 1 else [],  # a category often has several gold clauses
            answerable=bool(clauses),
            tags=[f"category:{cat}", f"format:{r.get('answer_format', '')}"],
        ))
    return items


# -- SEC 10-Q (Docugami)

_SEC_KIND = {
    "Single-Doc Single-Chunk RAG": "single-chunk",
    "Single-Doc Multi-Chunk RAG": "multi-chunk",
    "Multi-Doc RAG": "multi-doc",
}


def convert_sec10q(corpora: Path, *, available_only: bool = False) -> list[EvalItem]:
    """Docugami SEC 10-Q QnA (195 questions). The question type and chunk type go into the
    id and the tags; `Source Docs` becomes `doc` when it names one filing, and `source:`
    tags for every filing it covers (a company pattern like *AAPL* expands to the filings
    of that company in docs/). There are no evidence quotes or pages in this set: it is
    scored by document recall, answer numbers in context, and answer match/F1.
    With `available_only`, only questions whose filings are all in docs/ are kept."""
    base = corpora / "sec-10q-docugami"
    src = _need(base / "sec-10-q_data_v1_qna_data.csv")
    files = sorted(p.name for p in (base / "docs").glob("*.pdf"))
    items = []
    with open(src, encoding="utf-8-sig", newline="") as f:
        for no, r in enumerate(csv.DictReader(f), 1):
            pattern = r["Source Docs"].strip().strip("*").strip()
            kind = _SEC_KIND.get(r["Question Type"].strip(), _slug(r["Question Type"]))
            chunk = r["Source Chunk Type"].strip().lower()
            ticker = pattern.split()[-1] if pattern else ""
            if re.fullmatch(r"\d{4} Q\d [A-Z]+", pattern):
                sources = [f"{pattern}.pdf"]
                doc = f"{pattern}.pdf"
            else:
                sources = [n for n in files if n.endswith(f" {ticker}.pdf")] or [f"*{pattern}*"]
                doc = None
            available = all(s in files for s in sources)
            if available_only and not available:
                continue
            tags = [kind, chunk, f"ticker:{ticker}"] + [f"source:{s}" for s in sources]
            if not available:
                tags.append("docs-missing")
            items.append(EvalItem(
                id=f"sec10q-{no:03d}-{kind}-{chunk}",
                question=r["Question"].strip(),
                doc=doc,
                answers=[r["Answer"].strip()],
                tags=tags,
            ))
    return items


# -- FinanceBench (the development slice: 15 long SEC filings, 31 questions)

# The one split of financebench-dev, by company (a company's filings and questions on one
# side): the companies sorted and shuffled with this seed, the first half (rounded down)
# chooses, the rest is held out. Every tool reads the two set files it writes
# (financebench-dev-tune.jsonl, financebench-dev-held.jsonl), never a split of its own.
FINANCEBENCH_SPLIT_SEED = 24


def financebench_split(companies: Iterable[str], seed: int = FINANCEBENCH_SPLIT_SEED) -> tuple[set[str], set[str]]:
    """(choosing companies, held-out companies)."""
    import random

    names = sorted(set(companies))
    random.Random(seed).shuffle(names)
    return set(names[: len(names) // 2]), set(names[len(names) // 2 :])


def convert_financebench(corpora: Path, part: Literal["all", "tune", "held"] = "all") -> list[EvalItem]:
    """FinanceBench's questions over the 15 filings of `financebench-dev/`: the answer (free
    text, figures scored numerically), every evidence page (upstream 0-based, here 1-based
    as `page` / `pages`), the question's type and reasoning and the company as tags. The
    upstream evidence text is left out: it was extracted by another PDF reader (tables read
    differently), so the strict quote rule would measure the reader, not retrieval; the
    page is the gold. `part`: the whole set, or one side of `financebench_split`."""
    base = corpora / "financebench-dev"
    rows = [json.loads(line) for line in _need(base / "questions.jsonl").read_text(encoding="utf-8").splitlines()
            if line.strip()]
    tune, held = financebench_split(r["company"] for r in rows)
    keep = {"all": tune | held, "tune": tune, "held": held}[part]
    items = []
    for r in rows:
        if r["company"] not in keep:
            continue
        pages = list(dict.fromkeys(int(e["evidence_page_num"]) + 1 for e in r["evidence"]
                                   if e.get("doc_name", r["doc_name"]) == r["doc_name"]))
        tags = [f"company:{r['company']}", f"type:{r['question_type']}"]
        if r.get("question_reasoning"):
            tags.append(f"reasoning:{r['question_reasoning']}")
        items.append(EvalItem(
            id=f"fb-{r['financebench_id'].rsplit('_', 1)[-1]}",
            question=r["question"].strip(),
            doc=f"{r['doc_name']}.pdf",
            answers=[r["answer"].strip()],
            page=pages[0] if pages else None,
            pages=pages if len(pages) > 1 else [],
            tags=tags,
        ))
    return items


CONVERTERS: dict[str, tuple[Callable[[Path], list[EvalItem]], str]] = {
    "contractnli-dev": (lambda c: convert_contractnli(c), "ContractNLI dev, 61 NDAs x 17 hypotheses (1,037)"),
    "contractnli-rendered8": (lambda c: convert_contractnli(c, rendered_only=True), "ContractNLI dev, the 8 NDAs rendered as files"),
    "cuad": (convert_cuad, "CUAD, 10 contracts x 41 clause categories (410)"),
    "sec-10q": (lambda c: convert_sec10q(c), "Docugami SEC 10-Q QnA (195)"),
    "sec-10q-aapl-amzn-nvda": (lambda c: convert_sec10q(c, available_only=True), "SEC 10-Q questions whose filings are in docs/"),
    "financebench-dev": (lambda c: convert_financebench(c), "FinanceBench, 31 questions over 15 long SEC filings"),
    "financebench-dev-tune": (lambda c: convert_financebench(c, "tune"), "financebench-dev: the companies that choose"),
    "financebench-dev-held": (lambda c: convert_financebench(c, "held"), "financebench-dev: the held-out companies"),
}


def convert(name: str, corpora: Path | None = None) -> list[EvalItem]:
    if name not in CONVERTERS:
        raise UsageError(f"unknown set {name!r}", hint=f"choose one of {', '.join(CONVERTERS)}")
    corpora = Path(corpora) if corpora else default_corpora()
    if not corpora.is_dir():
        raise UsageError(f"corpora folder {corpora} does not exist", hint="pass --corpora DIR")
    return CONVERTERS[name][0](corpora)
