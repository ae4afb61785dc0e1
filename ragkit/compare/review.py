"""A review of many contracts against one checklist (a data room): for every contract and
every item, the clauses that answer it, each with its page, section and score, into one
matrix a lawyer filters (`write_review`: xlsx, CSV, JSON).

    from ragkit.compare.review import review
    rv = review(["a.pdf", "b.pdf"], session, "cuad")
    rv.contracts[0].findings["governing-law"][0].text

Nothing is generated. A checklist with a kinds model (`kind_model`, ragkit.compare.kinds)
has every sentence and list item of a contract read by it at once: each kind's best units,
each in its clause, are its findings, scored by the model's logit (its probability shown). An
item the model does not know is asked through retrieval (`ragkit.retrieve.retrieve`, the
document named): the units the cross-encoder scored in its pool, by its score. A kind the
contract lacks still has near misses: a cell shows only the findings whose logit reaches the
kinds model's floor (fitted on CUAD tuning contracts: eval/README.md "Data-room review";
`compare.review_floor`), and every finding is kept with its score in the findings sheet and
the JSON, so a reader or a metric can set another threshold.

Resumable: each contract's findings are appended to a JSONL file as it ends
(`ReviewLog`), keyed by the document's content and what decides its findings (the
checklist's items, the retrieval settings, the models); a second run reads them back and
reviews only the rest.
"""

from __future__ import annotations

import hashlib
import json
import re
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Callable

from ragkit.compare.checklist import ChecklistItem, load_checklist
from ragkit.config import Settings
from ragkit.errors import ConfigError, UsageError
from ragkit.session import Session

if TYPE_CHECKING:
    from ragkit.compare.kinds import KindsModel

# findings kept per item of a contract (the cell shows those over the floor; the metric reads
# all): 3 / 5 / 8 on the CUAD tuning contracts of eval/bench_review.py, AUPR 0.151 / 0.158 /
# 0.168 by retrieval (the kinds model, 8 / 15 / 25: 0.344 / 0.345 / 0.351, for more cells to read)
PER_ITEM = 8
# a unit is shown in its clause when the clause's paragraph has at most this many words (a
# numbered clause, a definition); a longer paragraph gives the unit and its lead-in
CLAUSE_WORDS = 80


@dataclass
class Excerpt:
    """One finding: a clause of the contract for one item, and where it is."""

    item: str  # the checklist item's id
    text: str
    score: float  # the cross-encoder's logit for the item's question and the clause's best unit
    page: int | None = None
    page_end: int | None = None
    section: str | None = None
    chunk_index: int | None = None
    # what scored it: "kinds" (the kinds model's logit; `confidence` is its probability that the
    # clause is of the kind) or "reranker" (the cross-encoder's logit for the item's question)
    by: str = "kinds"
    clause: str | None = None  # for a date or a name: the clause that states it (text holds the date or name)

    @property
    def confidence(self) -> float | None:
        import math

        return 1.0 / (1.0 + math.exp(-self.score)) if self.by == "kinds" else None


@dataclass
class ContractReview:
    doc: str  # the document's name in the store
    doc_id: str
    path: str | None = None
    findings: dict[str, list[Excerpt]] = field(default_factory=dict)  # item id -> best first
    seconds: float = 0.0
    pages: int | None = None

    def to_json(self) -> dict:
        return {"doc": self.doc, "doc_id": self.doc_id, "path": self.path, "seconds": round(self.seconds, 2),
                "pages": self.pages, "findings": {k: [asdict(e) for e in v] for k, v in self.findings.items()}}

    @classmethod
    def from_json(cls, d: dict) -> "ContractReview":
        return cls(doc=d["doc"], doc_id=d["doc_id"], path=d.get("path"), seconds=float(d.get("seconds") or 0.0),
                   pages=d.get("pages"),
                   findings={k: [Excerpt(**e) for e in v] for k, v in (d.get("findings") or {}).items()})


@dataclass
class Review:
    checklist: str
    items: list[ChecklistItem]
    contracts: list[ContractReview] = field(default_factory=list)
    floor: float | None = None  # a cell shows the findings scoring at least this (None: every finding)
    failed: list[tuple[str, str]] = field(default_factory=list)  # (file or document, why) skipped
    resumed: int = 0  # contracts read back from an earlier run's log
    seconds: float = 0.0

    def shown(self, found: list[Excerpt]) -> list[Excerpt]:
        """The findings a cell shows: those at or over the floor (the floor is on the kinds
        model's logit: a finding the cross-encoder scored is always shown)."""
        return [e for e in found if self.floor is None or e.by != "kinds" or e.score >= self.floor]

    def to_json(self) -> dict:
        return {"checklist": self.checklist, "floor": self.floor, "seconds": round(self.seconds, 2),
                "resumed": self.resumed,
                "items": [{"id": i.id, "title": i.title, "question": i.question, "finding": i.finding,
                           "evidence": i.evidence} for i in self.items],
                "contracts": [c.to_json() for c in self.contracts],
                "failed": [{"file": f, "error": why} for f, why in self.failed]}


# ---------------------------------------------------------------------- one contract

_MONTH = (r"(?:Jan(?:uary)?|Feb(?:ruary)?|Mar(?:ch)?|Apr(?:il)?|May|June?|July?|Aug(?:ust)?|Sep(?:t(?:ember)?)?|"
          r"Oct(?:ober)?|Nov(?:ember)?|Dec(?:ember)?)\.?")
DATE = re.compile(
    rf"\b(?:\d{{1,2}}\s*(?:st|nd|rd|th|t\s?h)?\s+day\s+of\s+{_MONTH},?\s+\d{{4}}|{_MONTH}\s+\d{{1,2}}(?:st|nd|rd|th)?,?\s+\d{{4}}"
    rf"|\d{{1,2}}(?:st|nd|rd|th)?\s+{_MONTH},?\s+\d{{4}}|\d{{1,2}}/\d{{1,2}}/\d{{2,4}})", re.I)
_KIND_WORD = r"(?:AGREEMENT|CONTRACT|LICEN[CS]E|ADDENDUM|AMENDMENT|MEMORANDUM|PLAN|TERMS|ARRANGEMENT|DEED|LEASE|NOTE)S?"
# a title in capitals ending in a kind of instrument ("SPONSORSHIP AND SERVICES AGREEMENT")
TITLE = re.compile(rf"\b(?:[A-Z][A-Z0-9&,\-'/]*\s+){{0,8}}{_KIND_WORD}\b")
# the instrument as the preamble names it ("This Development Agreement (the ...")
NAMED = re.compile(r"\b[Tt]his\s+((?:[A-Z][\w\-&/]*\s+|(?:and|of|for|on)\s+){0,8}(?:Agreement|Contract|License|Licence))\b")


def phrase(item: ChecklistItem, text: str) -> str | None:
    """For an item whose finding is one thing the clause states, that thing: the date ("December
    19, 2018"), the contract's name (its title in capitals, else "Development Agreement" as the
    preamble names it); None when the clause states none (the clause is the finding)."""
    if item.finding == "date":
        m = DATE.search(text)
        return m.group(0) if m else None
    if item.finding == "name":
        m = TITLE.search(text)
        if m and len(m.group(0).split()) >= 2:
            return m.group(0).strip()
        m = NAMED.search(text)
        return m.group(1).strip() if m else None
    return None


@dataclass
class Candidate:
    """A unit scored for an item (by the kinds model or the cross-encoder): its score, the
    chunk it is in (text and metadata), and its place among the chunk's units."""

    score: float
    chunk_text: str
    meta: dict
    units: list[str]  # the chunk's units, as the reranker scored them
    index: int  # which of them


def candidates_for(item: ChecklistItem, doc: str, session: Session) -> list[Candidate]:
    """Every unit the reranker scored in its pool for the item's question over `doc`, best first."""
    from ragkit.retrieve.pipeline import retrieve

    r = retrieve(item.question, session, [doc], contract_text=True)
    if r.rerank is None or not r.rerank.units:
        return []
    by_id = {h.id: h for h in r.ranked}
    out = []
    for cid, scored in r.rerank.units.items():
        h = by_id.get(cid)
        if h is None:
            continue
        units = [u for u, _ in scored]
        out += [Candidate(float(s), h.text, dict(h.meta), units, k) for k, (_, s) in enumerate(scored)]
    return sorted(out, key=lambda c: -c.score)


def choose_findings(item: ChecklistItem, cands: list[Candidate], *, per_item: int = PER_ITEM,
                    clause_words: int = CLAUSE_WORDS, by: str = "reranker", phrases: bool = True) -> list[Excerpt]:
    """The findings of an item from its scored units, best first (at most `per_item`): each
    unit in its clause (`ragkit.evidence.spans.excerpt`), one finding per clause (a clause's
    best unit gives its score); for an item whose finding is a date or the contract's name, the
    phrase the unit states (`phrase`), its clause kept beside it."""
    from ragkit.evidence.quotes import is_heading
    from ragkit.evidence.spans import excerpt, unit_spans

    out: list[Excerpt] = []
    seen: list[str] = []
    spans_of: dict[int, list] = {}
    for c in cands:
        key = id(c.units)
        if key not in spans_of:
            spans_of[key] = unit_spans(c.chunk_text, c.units)
        spans = spans_of[key]
        at = next((i for i, sp in enumerate(spans) if sp.index == c.index), None)
        text = (excerpt(c.chunk_text, spans, [at], clause_words) if at is not None else c.units[c.index]).strip()
        if at is not None and at + 1 < len(spans) and is_heading(c.units[c.index]) and len(text.split()) <= 12:
            # a clause heading alone ("5.6. Governing Law; Jurisdiction.") says where, not what: with its first sentence
            text = excerpt(c.chunk_text, spans, [at, at + 1], clause_words).strip()
        said = phrase(item, c.units[c.index]) if phrases else None
        clause, text = (text, said) if said else (None, text)
        # one finding a clause: a unit whose clause an earlier (better) finding holds adds nothing
        if not text or any(text in t or t in text for t in seen):
            continue
        seen.append(text)
        m = c.meta
        out.append(Excerpt(item=item.id, text=text, score=round(c.score, 4), page=m.get("page_start"),
                           page_end=m.get("page_end"), section=m.get("section") or None,
                           chunk_index=m.get("chunk_index"), by=by, clause=clause))
        if len(out) >= per_item:
            break
    return out


def findings_for(item: ChecklistItem, doc: str, session: Session, *, per_item: int = PER_ITEM,
                 clause_words: int = CLAUSE_WORDS) -> list[Excerpt]:
    """The clauses of `doc` that answer `item`, best first (at most `per_item`)."""
    return choose_findings(item, candidates_for(item, doc, session), per_item=per_item, clause_words=clause_words)


def kind_candidates(model: "KindsModel", doc_id: str, session: Session, *, top: int) -> dict[str, list[Candidate]]:
    """Every unit of the document (its chunks' sentences and list items; reviewers' comments
    left out) read by the kinds model at once: kind -> its `top` units by the model's logit,
    best first."""
    import numpy as np

    from ragkit.compare.kinds import embedder_for
    from ragkit.retrieve.rank import units as unit_split

    chunks = [h for h in session.store.chunks([doc_id]) if h.meta.get("kind") != "comment"]
    flat: list[tuple[object, list[str], int]] = []
    for h in chunks:
        us = unit_split(h.text, h.meta) or [h.text]
        flat += [(h, us, k) for k in range(len(us))]
    if not flat:
        return {}
    vecs = embedder_for(model.embedder, session).embed_documents([us[k] for _, us, k in flat])
    logits = model.logits(vecs)
    out: dict[str, list[Candidate]] = {}
    for j, kind in enumerate(model.kinds):
        col = logits[:, j]
        out[kind] = [Candidate(float(col[r]), flat[r][0].text, dict(flat[r][0].meta), flat[r][1], flat[r][2])
                     for r in np.argsort(-col, kind="stable")[:top]]
    return out


def review_contract(doc: str, items: list[ChecklistItem], session: Session, *, per_item: int = PER_ITEM,
                    kinds_model: "KindsModel | None" = None,
                    on_item: Callable[[str], None] | None = None) -> ContractReview:
    """Every item of the checklist asked of one document of the store: the items the kinds
    model knows from its reading of every unit, the others by retrieval and the cross-encoder."""
    from ragkit.retrieve.search import resolve_docs

    rec = resolve_docs(session.store.documents(), [doc])[0]
    t0 = time.perf_counter()
    cr = ContractReview(doc=rec.name, doc_id=rec.doc_id, path=rec.path, pages=getattr(rec, "n_pages", None))
    known = set(kinds_model.kinds) if kinds_model is not None else set()
    by_kind = (kind_candidates(kinds_model, rec.doc_id, session, top=per_item * 4)
               if kinds_model is not None and any(i.id in known for i in items) else {})
    for item in items:
        if item.id in known:
            cr.findings[item.id] = choose_findings(item, by_kind.get(item.id, []), per_item=per_item, by="kinds")
        else:
            cr.findings[item.id] = findings_for(item, rec.name, session, per_item=per_item)
        if on_item:
            on_item(item.id)
    cr.seconds = time.perf_counter() - t0
    return cr


# ---------------------------------------------------------------------- many, resumable

def kinds_model_for(items: list[ChecklistItem], session: Session) -> "KindsModel | None":
    """The checklist's kinds model, loaded once for the review (None without one). An item it
    does not know is asked through retrieval, so the reranker must be on for it; the
    reranker is loaded only then."""
    kinds_model = None
    if items and items[0].kind_model:
        from ragkit.compare.kinds import load_kinds_model

        kinds_model = load_kinds_model(items[0].kind_model, session)
    known = set(kinds_model.kinds) if kinds_model is not None else set()
    if any(i.id not in known for i in items) and session.reranker is None:
        raise ConfigError("a review ranks the clauses of a kind its checklist's kinds model does not know with the "
                          "reranker, and none is set", hint="set retrieve.rerank_model (the default is legal-minilm-l12)")
    return kinds_model


def review_key(items: list[ChecklistItem], session: Session, kinds_model: "KindsModel | None" = None) -> str:
    """What decides a contract's findings besides its text: the items' ids and questions, the
    retrieval settings (the reranker's name among them), the embedder and the kinds model's
    weights (their sha256). A log written under another key is not read back."""
    from ragkit.models import sha256_file

    s = session.settings
    parts = {"items": [(i.id, i.question) for i in items], "retrieve": s.retrieve.model_dump(mode="json"),
             "embed": s.embed.model_dump(mode="json"), "per_item": PER_ITEM, "clause_words": CLAUSE_WORDS,
             "kinds": None if kinds_model is None else sha256_file(kinds_model.folder / "kinds.npz")}
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:16]


class ReviewLog:
    """The contracts reviewed so far, one JSON line each, appended as each one ends (a run
    stopped at any point keeps every contract it finished)."""

    def __init__(self, path: Path, key: str):
        self.path = Path(path)
        self.key = key

    def read(self) -> dict[str, ContractReview]:
        """doc_id -> the review logged under this key (a torn last line, from a run killed
        while writing, is skipped)."""
        out: dict[str, ContractReview] = {}
        if not self.path.exists():
            return out
        for line in self.path.read_text(encoding="utf-8").splitlines():
            try:
                d = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(d, dict) and d.get("key") == self.key and d.get("doc_id"):
                out[d["doc_id"]] = ContractReview.from_json(d)
        return out

    def append(self, cr: ContractReview) -> None:
        try:
            with open(self.path, "a", encoding="utf-8") as f:
                f.write(json.dumps({"key": self.key, **cr.to_json()}, ensure_ascii=False) + "\n")
        except OSError as exc:
            raise UsageError(f"cannot write the review log {self.path}: {exc.strerror or exc}") from None


def review_floor(session: Session, kinds_model: "KindsModel | None" = None) -> float | None:
    """The score a finding must reach to fill a cell: `compare.review_floor` ("model": the
    kinds model's own floor, fitted on its logits; a number; "off": every finding). Items
    answered by retrieval score on the cross-encoder's scale, which has no review floor
    fitted: with "model" and no kinds model every finding fills its cell."""
    setting = session.settings.compare.review_floor
    if setting in (None, "off"):
        return None
    if setting == "model":
        return kinds_model.floor if kinds_model is not None else None
    return float(setting)


def review(docs: list[str], session: Session | Settings, checklist: str = "cuad", *, items: list[str] | None = None,
           log: Path | None = None, per_item: int = PER_ITEM,
           on_progress: Callable[[str, str | None], None] | None = None, review_many: Callable | None = None) -> Review:
    """Every item of `checklist` (or only `items`, by id) asked of each document of the
    store named in `docs`, one document at a time. With `log`, contracts already reviewed
    under the same key are read back, not reviewed again, and each new one is appended as it
    ends. `on_progress(doc, item_id)` after each item, `(doc, None)` after each document.
    `review_many(settings, checklist, item_ids, names)`: another executor that yields each
    contract's ContractReview (ragkit.cluster.review.review_on_cluster)."""
    name, all_items = load_checklist(checklist)
    chosen = [i for i in all_items if not items or i.id in items]
    if items and len(chosen) != len(set(items)):
        missing = sorted(set(items) - {i.id for i in chosen})
        raise UsageError(f"unknown checklist item(s): {', '.join(missing)}")
    session = Session.of(session)
    from ragkit.retrieve.search import resolve_docs

    records = resolve_docs(session.store.documents(), docs)
    t0 = time.perf_counter()
    kinds_model = kinds_model_for(chosen, session)
    rv = Review(checklist=name, items=chosen, floor=review_floor(session, kinds_model))
    book = ReviewLog(log, review_key(chosen, session, kinds_model)) if log else None
    done = book.read() if book else {}
    got: dict[str, ContractReview] = {}
    for rec in records:
        if rec.doc_id in done:
            got[rec.doc_id] = done[rec.doc_id]
            rv.resumed += 1
            if on_progress:
                on_progress(rec.name, None)
    todo = [r for r in records if r.doc_id not in got]
    if review_many is not None and todo:
        # another executor (ragkit.cluster.review: Ray actors, each with its own session) reviews
        # the contracts; they come back here, in the order they end, to be logged
        for cr in review_many(session.settings, checklist, [i.id for i in chosen], [r.name for r in todo]):
            got[cr.doc_id] = cr
            if book:
                book.append(cr)
            if on_progress:
                on_progress(cr.doc, None)
        todo = [r for r in todo if r.doc_id not in got]
    for rec in todo:
        cr = review_contract(rec.name, chosen, session, per_item=per_item, kinds_model=kinds_model,
                             on_item=(lambda i, d=rec.name: on_progress(d, i)) if on_progress else None)
        got[rec.doc_id] = cr
        if book:
            book.append(cr)
        if on_progress:
            on_progress(rec.name, None)
    rv.contracts = [got[r.doc_id] for r in records if r.doc_id in got]
    rv.seconds = time.perf_counter() - t0
    return rv


# ---------------------------------------------------------------------- the matrix a lawyer filters

def cell_text(found: list[Excerpt]) -> str:
    """A cell: each finding shown, best first, as "[p. 3 · p 0.91] the clause" (p: the kinds
    model's probability that the clause is of the kind; a cross-encoder's finding shows its
    score); empty when none."""
    from ragkit.evidence.location import format_location

    parts = []
    for e in found:
        where = format_location(e.page, None, e.page_end) or "no page"
        how = f"p {e.confidence:.2f}" if e.confidence is not None else f"score {e.score:.2f}"
        parts.append(f"[{where} · {how}] {e.text}" + (f"\n(in: {e.clause})" if e.clause else ""))
    return "\n\n".join(parts)


def matrix_rows(rv: Review) -> tuple[list[str], list[dict]]:
    """One row per contract, one column per item (its title): the findings over the floor."""
    cols = ["contract", "pages", *[i.title for i in rv.items]]
    rows = []
    for c in rv.contracts:
        row: dict = {"contract": c.doc, "pages": c.pages}
        for i in rv.items:
            text = cell_text(rv.shown(c.findings.get(i.id, [])))
            row[i.title] = text or None
        rows.append(row)
    return cols, rows


FINDING_COLUMNS = ["contract", "kind", "kind_id", "rank", "confidence", "score", "by", "shown", "page", "page_end",
                   "section", "text", "clause"]


def finding_rows(rv: Review) -> list[dict]:
    """Every finding in full, with its score and whether its cell shows it."""
    titles = {i.id: i.title for i in rv.items}
    out = []
    for c in rv.contracts:
        for i in rv.items:
            shown = {id(e) for e in rv.shown(c.findings.get(i.id, []))}
            for r, e in enumerate(c.findings.get(i.id, []), 1):
                conf = e.confidence
                out.append({"contract": c.doc, "kind": titles[i.id], "kind_id": i.id, "rank": r,
                            "confidence": None if conf is None else round(conf, 4), "score": e.score, "by": e.by,
                            "shown": int(id(e) in shown), "page": e.page, "page_end": e.page_end, "section": e.section,
                            "text": e.text, "clause": e.clause})
    return out


def write_review(rv: Review, out: Path, fmt: str) -> list[str]:
    """The review as `fmt` at `out`: "xlsx" (a matrix sheet, a findings sheet, and the files
    not reviewed with why), "csv" (the matrix at `out`, every finding beside it as
    NAME-findings.csv) or "json". Returns the paths written."""
    from ragkit.sheets import Sheet, write_csv, write_workbook, xlsx_available

    out = Path(out)
    cols, rows = matrix_rows(rv)
    found = finding_rows(rv)
    try:
        if fmt == "json":
            out.write_text(json.dumps(rv.to_json(), ensure_ascii=False, indent=1) + "\n", encoding="utf-8")
            return [str(out)]
        if fmt == "csv":
            side = out.with_name(out.stem + "-findings.csv")
            write_csv(out, cols, rows)
            write_csv(side, FINDING_COLUMNS, found)
            return [str(out), str(side)]
        if fmt != "xlsx":
            raise UsageError(f"unknown review format {fmt!r}: xlsx, csv or json")
        if not xlsx_available():
            raise UsageError("openpyxl is not installed: no xlsx", hint="pip install openpyxl, or --format csv")
        sheets = [
            Sheet("review", cols, rows, widths={"contract": 36, "pages": 7, **{i.title: 48 for i in rv.items}},
                  wrap={i.title for i in rv.items} | {"contract"}),
            Sheet("findings", FINDING_COLUMNS, found, widths={"contract": 36, "kind": 24, "section": 30, "text": 90, "clause": 60},
                  wrap={"text", "section", "clause"}, freeze="C2", number_format="0.00"),
        ]
        if rv.failed:
            sheets.append(Sheet("not reviewed", ["file", "error"], [{"file": f, "error": w} for f, w in rv.failed],
                                widths={"file": 50, "error": 80}, wrap={"error"}))
        write_workbook(out, sheets)
        return [str(out)]
    except OSError as exc:
        raise UsageError(f"cannot write {out}: {exc.strerror or exc}") from None
