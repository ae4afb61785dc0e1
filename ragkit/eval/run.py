"""Batch evaluation runs: answer every question of a set, checkpoint each answer, score.

A run lives in one folder:

    RUN_DIR/run.json       what was run (set, its digest, mode); a resumed run must match
    RUN_DIR/answers.jsonl  one line per answered question, appended and fsynced as it goes
    RUN_DIR/store/         the store, when the run ingested --corpus itself
    RUN_DIR/report.{json,md,html}

A killed run continues where it stopped: questions already in answers.jsonl are not
asked again (a line cut short by the kill is dropped and that question asked again).
"""

from __future__ import annotations

import json
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable

from ragkit.config import Settings
from ragkit.errors import UsageError
from ragkit.eval.answers import ANSWERS, read_answers  # noqa: F401  (the names this module always had)
from ragkit.eval.sets import EvalItem, load_set, set_digest

RUN_META = "run.json"
from ragkit.eval.scoring import STAGES  # noqa: E402,F401


@dataclass
class RunOptions:
    set_path: Path
    out: Path
    corpus: list[Path] = field(default_factory=list)
    store: Path | None = None
    profile: str | None = None
    limit: int | None = None
    retrieval_only: bool = False
    concurrency: int = 1


Event = Callable[[str, dict], None]


# ---------------------------------------------------------------------- checkpoint file

class Checkpoint:
    def __init__(self, path: Path):
        self.path = path
        self.lock = threading.Lock()

    def append(self, rec: dict) -> None:
        line = (json.dumps(rec, ensure_ascii=False) + "\n").encode("utf-8")
        with self.lock:
            with open(self.path, "ab") as f:
                f.write(line)
                f.flush()
                os.fsync(f.fileno())


# ---------------------------------------------------------------------- answering

class Answerer:
    def __init__(self, settings: Settings, retrieval_only: bool):
        from ragkit.session import Session

        self.settings = settings
        self.session = Session(settings)  # embedder, store, reranker, generator: loaded once for the run
        self.retrieval_only = retrieval_only
        self._lock = threading.Lock()
        self._checklist: dict | None = None

    def _dense_scores(self, question: str, contexts) -> dict[str, float]:
        """Similarity of each context to the question. Used when the prompt holds the
        named documents whole (their contexts carry no retrieval score), so MRR and
        page hit@k still rank by retrieval, not by document order."""
        with self._lock:
            qvec = self.session.embedder.embed_query(question)
            doc_ids = sorted({c.doc_id for c in contexts})
            hits = self.session.store.query(qvec, len(contexts), doc_ids)
        return {h.id: h.score for h in hits}

    def _checklist_item(self, item: EvalItem):
        """The built-in NDA checklist item an NLI question is scored through (its tag is
        the ContractNLI hypothesis id, nda-1 ... nda-20), so the figures measure what
        `ragkit compare` shows; None for other sets."""
        if not item.label or not item.doc:
            return None
        if self._checklist is None:
            from ragkit.compare import load_checklist

            self._checklist = {i.id: i for i in load_checklist("nda")[1] if i.hypothesis}
        return next((self._checklist[t] for t in item.tags if t in self._checklist), None)

    def answer(self, item: EvalItem) -> dict:
        """The record answers.jsonl keeps for `item`: asked on the path its set is scored
        through (`_ask`), its contexts ranked by retrieval, the answer or the checklist's
        finding; a question that cannot be asked comes back as an error record."""
        try:
            prompt, timings, res, finding = self._ask(item)
        except UsageError as exc:  # this question cannot be asked (e.g. its doc is not in the store)
            # scored as a miss in every metric it would have counted for (score_item);
            # the mode and the answering path say which those are
            return {"id": item.id, "status": "error", "error": str(exc), "question": item.question, "doc": item.doc,
                    "retrieval_only": self.retrieval_only,
                    "checklist": not self.retrieval_only and self._checklist_item(item) is not None}
        rec = {
            "id": item.id,
            "status": "ok",
            "question": item.question,
            "doc": item.doc,
            "retrieval_only": self.retrieval_only,
            "mode": prompt.mode,
            "prompt_tokens": len(prompt.ids),
            "prefix_tokens": prompt.prefix_tokens,
            "cached_tokens": 0,
            "completion_tokens": 0,
            "answer": None,
            "abstained": None,
            "citations": [],
            "invalid_citations": [],
            "timings": {k: round(v, 4) for k, v in timings.items()},
            "contexts": self._ranked_contexts(item.question, list(prompt.contexts)),
        }
        if res is not None:
            _add_answer(rec, res)
        if finding is not None:
            rec["answer"] = finding.label
            rec["quote"] = {"text": finding.quote, "page": finding.page, "section": finding.section,
                            "confidence": finding.confidence, "closest": finding.closest,
                            "decided_by": finding.decided_by, "probabilities": finding.probabilities}
        return rec

    def _ask(self, item: EvalItem) -> tuple:
        """(prompt, timings, answer or None, checklist finding or None) for `item`: retrieval
        only, the checklist item it is scored through, the yes/no options of another NLI
        question, or an ordinary question."""
        from ragkit.answer.ask import ask, ask_choice
        from ragkit.retrieve import retrieve

        docs = [item.doc] if item.doc else None
        t0 = time.perf_counter()
        if self.retrieval_only:
            r = retrieve(item.question, self.session, docs)
            timings = dict(r.timings)
            timings["total_s"] = time.perf_counter() - t0
            return r.prompt, timings, None, None
        if (check := self._checklist_item(item)) is not None:
            from ragkit.compare import check_item

            finding, res = check_item(item.doc, check, self.session)
            return res.prompt, dict(res.timings), res, finding
        if item.label:  # an NLI question outside the checklist: the options scored as they are
            from ragkit.compare import YES_NO

            res = ask_choice(item.question, YES_NO, self.session, docs)
        else:
            res = ask(item.question, self.session, docs)
        return res.prompt, dict(res.timings), res, None

    def _ranked_contexts(self, question: str, contexts: list) -> list[dict]:
        """The prompt's contexts as recorded, each with its retrieval rank and score (a
        prompt that holds the named documents whole carries none: ranked by similarity)."""
        scores = {c.chunk_id: c.score for c in contexts}
        if contexts and all(c.score == 0.0 for c in contexts):
            scores.update(self._dense_scores(question, contexts))
        ranked = sorted(contexts, key=lambda c: (-scores.get(c.chunk_id, 0.0), c.n))
        rank_of = {c.chunk_id: i for i, c in enumerate(ranked, 1)}
        return [
            {"n": c.n, "rank": rank_of[c.chunk_id], "doc": c.doc, "chunk_index": c.chunk_index, "page": c.page_start,
             "page_end": c.page_end, "section": c.section, "score": round(scores.get(c.chunk_id, 0.0), 4),
             "tokens": c.tokens, "chunk_id": c.chunk_id, "text": c.text}
            for c in contexts
        ]


def _add_answer(rec: dict, res) -> None:
    """An answer's generation, text, citations, claims and outcome into its record (`res`:
    a ragkit.answer.ask result); a scored choice's prompt and option log-probabilities."""
    g = res.generation
    rec.update({
        "cached_tokens": g.cached_tokens if g else 0,
        "completion_tokens": g.completion_tokens if g else 0,
        "answer": res.answer,
        "abstained": res.abstained,
        "citations": [c.to_json() for c in res.citations],
        "invalid_citations": list(res.invalid_citations),
        "claims": [c.to_json() for c in getattr(res, "claims", [])],
        "abstain_reason": res.abstain_reason,
        # the three outcomes (ragkit.answer.ask), with the model's own text kept
        "outcome": getattr(res, "outcome", None),
        "answer_kind": getattr(res, "answer_kind", None),
        "model_answer": getattr(res, "model_answer", None),
        "passages": [p.to_json() for p in getattr(res, "passages", [])],
    })
    if res.choice is not None:
        rec["prompt_tokens"] = res.choice.prompt_tokens or rec["prompt_tokens"]  # the prompt scored (clause mode: the quote)
        rec["choice"] = {"option": res.choice.option, "scored": res.choice.scored,
                         "logprobs": {k: round(v, 4) for k, v in res.choice.logprobs.items()}}


# ---------------------------------------------------------------------- the run

def _meta(opts: RunOptions) -> dict:
    return {"set": str(opts.set_path), "set_digest": set_digest(opts.set_path), "retrieval_only": opts.retrieval_only}


def prepare(opts: RunOptions) -> tuple[list[EvalItem], Settings]:
    from ragkit.config import load_settings

    items = load_set(opts.set_path)
    if opts.limit is not None:
        if opts.limit < 1:
            raise UsageError("--limit must be at least 1")
        items = items[: opts.limit]
    if not opts.corpus and opts.store is None and not load_settings().store_url:
        raise UsageError("say where the documents are: --corpus DIR (ingested into RUN_DIR/store), --store DIR, "
                         "or a Chroma server (setting store_url)")
    if opts.concurrency < 1:
        raise UsageError("--concurrency must be at least 1")
    out = Path(opts.out)
    if out.exists() and not out.is_dir():
        raise UsageError(f"--out {out} is a file, not a folder")
    out.mkdir(parents=True, exist_ok=True)
    meta_path = out / RUN_META
    meta = _meta(opts)
    if meta_path.exists():
        try:
            old = json.loads(meta_path.read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError):
            old = {}
        for k in ("set_digest", "retrieval_only"):
            if old.get(k) != meta[k]:
                raise UsageError(
                    f"{out} holds a run of another set or mode ({k} differs)",
                    hint="give a new --out folder, or delete the old one",
                )
    else:
        meta_path.write_text(json.dumps(meta, indent=2) + "\n", encoding="utf-8")
    overrides: dict = {"store": opts.store if opts.store is not None else out / "store"}
    if opts.profile is not None:
        overrides["profile"] = opts.profile
    settings = load_settings(**overrides)
    return items, settings


AnswerMany = Callable[[Settings, bool, list[EvalItem]], Iterable[dict]]


def run_eval(opts: RunOptions, *, on_event: Event | None = None, answer_many: AnswerMany | None = None,
             answer_many_for: Callable[[Settings], AnswerMany | None] | None = None) -> dict:
    """Ingest (when --corpus is given), answer every question not yet answered, score and
    write the reports. Returns the report dict.

    `answer_many(settings, retrieval_only, items)` answers elsewhere (ragkit.cluster: Ray
    actors), yielding each question's record as it lands; this process still writes every
    record to answers.jsonl, once per question. `answer_many_for(settings)` chooses one from
    the run's settings (--profile and --store applied), or None to answer here."""
    from ragkit.eval.rows import write_run_files

    emit = on_event or (lambda kind, info: None)
    items, settings = prepare(opts)
    if answer_many is None and answer_many_for is not None:
        answer_many = answer_many_for(settings)
    out = Path(opts.out)
    answerer = Answerer(settings, opts.retrieval_only)
    if opts.corpus:
        from ragkit.ingest import ingest

        emit("ingest", {"paths": [str(p) for p in opts.corpus], "store": str(settings.store)})
        # the run's one embedder: the answering session's, which then asks the store it filled
        rep = ingest(list(opts.corpus), settings, embedder=answerer.session.embedder.inner)
        emit("ingested", rep.to_json())
    answers_path = out / ANSWERS
    done = read_answers(answers_path, repair=True)
    todo = [i for i in items if i.id not in done]
    concurrency = opts.concurrency
    if concurrency > 1 and not opts.retrieval_only and settings.generator.backend == "llama_cpp":
        emit("note", {"message": "--concurrency forced to 1: the in-process llama.cpp generator runs one question at a time"})
        concurrency = 1
    emit("start", {"total": len(items), "done": len(items) - len(todo), "todo": len(todo), "concurrency": concurrency})
    ck = Checkpoint(answers_path)

    def one(item: EvalItem) -> dict:
        rec = answerer.answer(item)
        ck.append(rec)
        return rec

    if answer_many is not None:
        recorded = set(done)
        for rec in answer_many(settings, opts.retrieval_only, todo):
            if rec.get("id") in recorded:  # a question answered twice (a retried task) is recorded once
                continue
            recorded.add(rec.get("id"))
            ck.append(rec)
            emit("answered", {"id": rec.get("id"), "status": rec["status"], "error": rec.get("error")})
    elif concurrency == 1:
        for item in todo:
            rec = one(item)
            emit("answered", {"id": item.id, "status": rec["status"], "error": rec.get("error")})
    else:
        with ThreadPoolExecutor(max_workers=concurrency) as pool:
            futs = {pool.submit(one, item): item for item in todo}
            for fut in as_completed(futs):
                rec = fut.result()
                emit("answered", {"id": futs[fut].id, "status": rec["status"], "error": rec.get("error")})
    records = read_answers(answers_path)
    report = score(items, records, settings, retrieval_only=opts.retrieval_only)
    report["run"] = {**_meta(opts), "out": str(out), "limit": opts.limit, "corpus": [str(p) for p in opts.corpus],
                     "store": str(settings.store), "profile": settings.profile, "concurrency": concurrency}
    report["files"] = write_run_files(out, report, settings, items, records)  # reports, then rows.csv / .xlsx
    emit("done", {"out": str(out)})
    return report


# ---------------------------------------------------------------------- scoring (ragkit.eval.scoring)

from ragkit.eval.scoring import (  # noqa: E402,F401  (re-exported: the names this module always had)
    BY_TAG_KEYS,
    _agg,
    _checklist_ids,
    _chunk_index,
    _miss_row,
    _where,
    score,
    score_item,
)


def rescore(run_dir: Path) -> dict:
    """Score an existing run folder again (e.g. after a metric changed)."""
    from ragkit.config import load_settings
    from ragkit.eval.rows import write_run_files

    run_dir = Path(run_dir)
    meta_path = run_dir / RUN_META
    if not meta_path.exists():
        raise UsageError(f"{run_dir} is not a run folder (no {RUN_META})")
    meta = json.loads(meta_path.read_text(encoding="utf-8"))
    items = load_set(Path(meta["set"]))
    records = read_answers(run_dir / ANSWERS)
    items = [i for i in items if i.id in records] or items
    settings = load_settings()
    old_report = run_dir / "report.json"
    prev_run: dict = {}
    if old_report.exists():  # keep the settings the run was made with
        try:
            prev = json.loads(old_report.read_text(encoding="utf-8"))
            settings = Settings.model_validate(prev["settings"])
            prev_run = prev.get("run", {})
        except (OSError, ValueError, KeyError):
            pass
    report = score(items, records, settings, retrieval_only=bool(meta.get("retrieval_only")))
    report["run"] = {**prev_run, **meta, "out": str(run_dir)}
    report["files"] = write_run_files(run_dir, report, settings, items, records)  # reports, then rows.csv / .xlsx
    return report


__all__ = ["RunOptions", "run_eval", "score", "score_item", "read_answers", "rescore"]
