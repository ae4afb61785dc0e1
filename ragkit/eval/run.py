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
from ragkit.eval import metrics as M
from ragkit.eval.answers import ANSWERS, read_answers  # noqa: F401  (the names this module always had)
from ragkit.eval.sets import EvalItem, load_set, set_digest

RUN_META = "run.json"
STAGES = ("retrieve_s", "prompt_s", "generate_s", "ttft_s", "total_s")


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
        from ragkit.answer.ask import ask, ask_choice
        from ragkit.retrieve import retrieve

        docs = [item.doc] if item.doc else None
        t0 = time.perf_counter()
        res = None
        finding = None
        try:
            if self.retrieval_only:
                r = retrieve(item.question, self.session, docs)
                prompt, timings = r.prompt, dict(r.timings)
                timings["total_s"] = time.perf_counter() - t0
            elif (check := self._checklist_item(item)) is not None:
                from ragkit.compare import check_item

                finding, res = check_item(item.doc, check, self.session)
                prompt, timings = res.prompt, dict(res.timings)
            elif item.label:  # an NLI question outside the checklist: the options scored as they are
                from ragkit.compare import YES_NO

                res = ask_choice(item.question, YES_NO, self.session, docs)
                prompt, timings = res.prompt, dict(res.timings)
            else:
                res = ask(item.question, self.session, docs)
                prompt, timings = res.prompt, dict(res.timings)
        except UsageError as exc:  # this question cannot be asked (e.g. its doc is not in the store)
            # scored as a miss in every metric it would have counted for (score_item);
            # the mode and the answering path say which those are
            return {"id": item.id, "status": "error", "error": str(exc), "question": item.question, "doc": item.doc,
                    "retrieval_only": self.retrieval_only,
                    "checklist": not self.retrieval_only and self._checklist_item(item) is not None}
        ctxs = list(prompt.contexts)
        scores = {c.chunk_id: c.score for c in ctxs}
        if ctxs and all(c.score == 0.0 for c in ctxs):
            scores.update(self._dense_scores(item.question, ctxs))
        ranked = sorted(ctxs, key=lambda c: (-scores.get(c.chunk_id, 0.0), c.n))
        rank_of = {c.chunk_id: i for i, c in enumerate(ranked, 1)}
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
            "contexts": [
                {"n": c.n, "rank": rank_of[c.chunk_id], "doc": c.doc, "chunk_index": c.chunk_index, "page": c.page_start, "page_end": c.page_end,
                 "section": c.section, "score": round(scores.get(c.chunk_id, 0.0), 4), "tokens": c.tokens,
                 "chunk_id": c.chunk_id, "text": c.text}
                for c in ctxs
            ],
        }
        if res is not None:
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
        if finding is not None:
            rec["answer"] = finding.label
            rec["quote"] = {"text": finding.quote, "page": finding.page, "section": finding.section,
                            "confidence": finding.confidence, "closest": finding.closest}
        return rec


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
    if not opts.corpus and opts.store is None:
        raise UsageError("say where the documents are: --corpus DIR (ingested into RUN_DIR/store) or --store DIR")
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


def run_eval(opts: RunOptions, *, on_event: Event | None = None,
             answer_many: Callable[[Settings, bool, list[EvalItem]], Iterable[dict]] | None = None) -> dict:
    """Ingest (when --corpus is given), answer every question not yet answered, score and
    write the reports. Returns the report dict.

    `answer_many(settings, retrieval_only, items)` answers elsewhere (ragkit.cluster: Ray
    actors), yielding each question's record as it lands; this process still writes every
    record to answers.jsonl, once per question."""
    from ragkit.eval.rows import write_run_files

    emit = on_event or (lambda kind, info: None)
    items, settings = prepare(opts)
    out = Path(opts.out)
    if opts.corpus:
        from ragkit.ingest import ingest

        emit("ingest", {"paths": [str(p) for p in opts.corpus], "store": str(settings.store)})
        rep = ingest(list(opts.corpus), settings)
        emit("ingested", rep.to_json())
    answers_path = out / ANSWERS
    done = read_answers(answers_path, repair=True)
    todo = [i for i in items if i.id not in done]
    concurrency = opts.concurrency
    if concurrency > 1 and not opts.retrieval_only and settings.generator.backend == "llama_cpp":
        emit("note", {"message": "--concurrency forced to 1: the in-process llama.cpp generator runs one question at a time"})
        concurrency = 1
    emit("start", {"total": len(items), "done": len(items) - len(todo), "todo": len(todo), "concurrency": concurrency})
    answerer = Answerer(settings, opts.retrieval_only)
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


# ---------------------------------------------------------------------- scoring

def _where(c: dict) -> str:
    parts = [c.get("doc", "?")]
    if c.get("page") is not None:
        parts.append(f"p. {c['page']}")
    if c.get("section"):
        parts.append(f"§ {c['section']}")
    return " ".join(parts)


def _chunk_index(c: dict) -> int | None:
    if c.get("chunk_index") is not None:
        return int(c["chunk_index"])
    tail = str(c.get("chunk_id", "")).rsplit(":", 1)[-1]  # ids are DOCID:NNNNN
    return int(tail) if tail.isdigit() else None


_CHECKLIST_IDS: frozenset[str] | None = None


def _checklist_ids() -> frozenset[str]:
    """The hypothesis ids of the built-in NDA checklist (the items `Answerer` scores
    through `ragkit compare`)."""
    global _CHECKLIST_IDS
    if _CHECKLIST_IDS is None:
        from ragkit.compare import load_checklist

        _CHECKLIST_IDS = frozenset(i.id for i in load_checklist("nda")[1] if i.hypothesis)
    return _CHECKLIST_IDS


# what a question that was never answered has no figure for: cost, latency and the answer
_COST_KEYS = ("mode", "n_contexts", "prompt_tokens", "cached_tokens", "completion_tokens", "projected_prefill_s",
              "timings", "answer", "top_context")


def _miss_row(item: EvalItem, rec: dict | None, rate_tok_s: float, retrieval_only: bool) -> dict:
    """A question that errored (or was never answered) scored as a miss in every metric it
    would have counted for: it is scored as an answer that retrieved nothing and said
    nothing, so evidence, page, document recall, answer match, token F1, NLI label (None:
    wrong), abstention (did not abstain) and valid citation all count it as a miss. It has
    no cost or latency figures (those are over answered questions only)."""
    ro = bool((rec or {}).get("retrieval_only", retrieval_only))
    empty = {"id": item.id, "status": "ok", "retrieval_only": ro, "answer": None if ro else "", "abstained": False,
             "contexts": [], "citations": [], "invalid_citations": []}
    row = score_item(item, empty, rate_tok_s)
    for k in _COST_KEYS:
        row.pop(k, None)
    if not ro and item.label and item.doc:
        checklist = (rec or {}).get("checklist")
        if checklist is None:  # a record written before the flag: the same join as Answerer
            checklist = any(t in _checklist_ids() for t in item.tags)
        if checklist and (item.evidence_all or item.evidence):
            row["quote_has_evidence"] = False
            row["passage_has_evidence"] = False
    if rec is None:
        row.update(status="missing", why="not answered; counted as a miss")
    else:
        row.update(status=rec.get("status", "error"), why=f"{rec.get('error', 'error')}; counted as a miss")
    row.update(failed=True, counted_as_miss=True)
    return row


def score_item(item: EvalItem, rec: dict | None, rate_tok_s: float, *, retrieval_only: bool = False) -> dict:
    """Per-question scores. None means "does not apply". A question that errored or was
    not answered is a miss (`_miss_row`); `retrieval_only` is the run's mode, for records
    that do not say."""
    if rec is None or rec.get("status", "ok") != "ok":
        return _miss_row(item, rec, rate_tok_s, retrieval_only)
    row: dict = {"id": item.id, "question": item.question, "doc": item.doc, "tags": item.tags, "status": "ok"}
    ctxs = rec.get("contexts", [])
    ranked = sorted(ctxs, key=lambda c: c.get("rank", c.get("n", 0)))
    texts = [c["text"] for c in ranked]
    generating = not rec.get("retrieval_only") and rec.get("answer") is not None
    answer = rec.get("answer") or ""
    ev_rank = M.evidence_rank(item.evidence, texts)
    ev_split = False
    if item.evidence and ev_rank is None:  # a long clause the chunker split over adjacent chunks
        ev_rank = M.evidence_rank_split(item.evidence, [{**c, "chunk_index": _chunk_index(c)} for c in ranked])
        ev_split = ev_rank is not None
    # the strict rule (the headline): a contiguous run of 80% of the evidence in one source
    # (or in the joined text of consecutive chunks of one document, a clause the chunker split)
    ev_strict = M.evidence_rank(item.evidence, texts, strict=True)
    if item.evidence and ev_strict is None:
        ev_strict = M.evidence_rank_split(item.evidence, [{**c, "chunk_index": _chunk_index(c)} for c in ranked], strict=True)
    to_ev = M.tokens_through_rank([c.get("tokens") for c in ranked], ev_strict)
    # any annotated span (ContractNLI marks several; `evidence` is the first in document order)
    spans = [e for e in (item.evidence_all or []) if e] or ([item.evidence] if item.evidence else [])
    any_ranks = [r for r in (M.evidence_rank(e, texts, strict=True) for e in spans) if r]
    ev_any = min(any_ranks) if any_ranks else None
    pages = [(c.get("page"), c.get("page_end")) for c in ranked]
    row.update({
        "mode": rec.get("mode"),
        "n_contexts": len(ctxs),
        "evidence_in_context": (ev_rank is not None) if item.evidence else None,
        "evidence_rank": ev_rank,
        "evidence_split": ev_split,
        "rr": M.reciprocal_rank(ev_rank) if item.evidence else None,
        "evidence_strict": (ev_strict is not None) if item.evidence else None,
        "evidence_rank_strict": ev_strict,
        "rr_strict": M.reciprocal_rank(ev_strict) if item.evidence else None,
        "tokens_to_evidence": to_ev,  # prompt tokens of the ranked sources through the evidence (strict)
        "evidence_within_1000_tokens": M.within_tokens(to_ev, 1000, bool(item.evidence)),
        "evidence_within_2000_tokens": M.within_tokens(to_ev, 2000, bool(item.evidence)),
        "rr_strict_any_span": M.reciprocal_rank(ev_any) if item.evidence else None,
        "any_span_within_1000_tokens": M.within_tokens(M.tokens_through_rank([c.get("tokens") for c in ranked], ev_any),
                                                       1000, bool(item.evidence)),
        "any_span_within_2000_tokens": M.within_tokens(M.tokens_through_rank([c.get("tokens") for c in ranked], ev_any),
                                                       2000, bool(item.evidence)),
        "page_hit": M.page_hit(item.page, pages),
        "page_hit_at_1": M.page_hit(item.page, pages, 1),
        "page_hit_at_3": M.page_hit(item.page, pages, 3),
        "doc_recall": M.doc_recall(item.sources(), [c["doc"] for c in ctxs]) if not item.doc else None,
        "answer_numbers_in_context": M.answer_numbers_in_context(item.answers, texts) if item.answerable and not item.label else None,
        "gold_figure_at_5": M.gold_figure_in(item.answers, texts[:5]) if item.answerable and not item.label else None,
        "prompt_tokens": rec.get("prompt_tokens"),
        "cached_tokens": rec.get("cached_tokens"),
        "completion_tokens": rec.get("completion_tokens"),
        "projected_prefill_s": M.projected_prefill_s(rec.get("prompt_tokens") or 0, rate_tok_s),
        "timings": rec.get("timings", {}),
        "answer": rec.get("answer"),
        "top_context": _where(ranked[0]) if ranked else None,
    })
    why: list[str] = []
    if item.evidence and ev_rank is None:
        why.append("evidence not retrieved")
    elif item.evidence and ev_strict is None:
        why.append("evidence only as scattered words (strict rule)")
    if row["page_hit"] is False:
        why.append("page not retrieved")
    if row["doc_recall"] is not None and row["doc_recall"] < 1:
        why.append(f"source documents retrieved {row['doc_recall']:.0%}")
    if row["answer_numbers_in_context"] == 0:
        why.append("no answer figure in context")
    if generating:
        if item.label:
            pred = M.nli_label(answer)
            row.update(nli_gold=item.label, nli_pred=pred)
            if rec.get("quote") is not None:
                q = rec["quote"]
                spans = item.evidence_all or ([item.evidence] if item.evidence else [])
                # headline: the quote the cell shows; a cell judged "not on point" shows none, so it
                # is a miss when there was evidence. passage_has_evidence also counts the
                # closest passage kept beside it (did retrieval find the clause at all)
                row.update(quote=q.get("text"), quote_has_evidence=M.quote_matches_evidence(q.get("text"), spans),
                           passage_has_evidence=M.quote_matches_evidence(q.get("text") or q.get("closest"), spans),
                           nli_confidence=q.get("confidence"))
            if pred != item.label:
                why.append(f"NLI {pred or 'unparsed'} != {item.label}")
        else:
            should = not item.answerable
            outcome = M.outcome_of(rec)
            # abstained: the documents do not say (not_found); an unverified answer is no refusal
            row.update(should_abstain=should, abstained=outcome == "not_found", answer_outcome=outcome)
            passages = [p.get("quote") or "" for p in rec.get("passages") or []]
            spans = [e for e in (item.evidence_all or []) if e] or ([item.evidence] if item.evidence else [])
            if item.answerable:
                # the gold evidence (or a gold answer) among the passages an unverified answer shows
                gold_shown = bool(passages) and (
                    any(M.quote_matches_evidence(q, spans) for q in passages) if spans
                    else bool(M.answer_match(" ".join(passages), item.answers, "any")))
                row["unverified_with_evidence"] = outcome == "unverified" and gold_shown
                row["wrongly_refused"] = outcome != "supported" and not row["unverified_with_evidence"]
            if item.answerable and item.answers:
                clean = M.answer_body(answer)
                row["answer_match"] = M.answer_match(clean, item.answers, item.answers_mode)
                row["token_f1"] = M.token_f1(clean, item.answers)
                # the answer, or the quote it shows (a quoted or unverified answer), holds a gold clause
                row["answer_or_quote_match"] = bool(row["answer_match"]) or any(
                    M.quote_matches_evidence(q, [a for a in item.answers if len(a.split()) >= 4] + spans) for q in passages)
                if row["answer_match"] is False:
                    why.append("answer does not match")
            if should != row["abstained"]:
                why.append("should have abstained" if should else "abstained wrongly")
            elif row.get("wrongly_refused"):
                why.append(f"answerable, outcome {outcome} without the gold evidence")
        # a citation the model marked [n] is scored apart from one ragkit inferred from
        # the answer's wording (the model gave no marker): an inferred citation is never
        # counted as precise
        by_n = {c["n"]: c["text"] for c in ctxs}
        cites = [c for c in rec.get("citations", []) if c.get("n") in by_n]
        marked = [by_n[c["n"]] for c in cites if not c.get("inferred")]
        inferred = [by_n[c["n"]] for c in cites if c.get("inferred")]
        prec, valid = M.citation_scores(marked, item.evidence)
        row.update(citation_precision=prec, valid_citation=valid, n_citations=len(marked),
                   n_inferred_citations=len(inferred),
                   inferred_citation_precision=M.citation_scores(inferred, item.evidence)[0],
                   invalid_citations=len(rec.get("invalid_citations", [])))
        row.update(M.claim_counts(rec.get("claims") or [], item.evidence_all or ([item.evidence] if item.evidence else [])))
    row["failed"] = bool(why)
    row["why"] = "; ".join(why)
    return row


def _agg(rows: list[dict]) -> dict:
    """Quality metrics over every question (one that errored or was not answered holds
    miss values, see `_miss_row`); cost and latency over the answered ones."""
    ok = [r for r in rows if r.get("status") == "ok"]

    def m(key: str):
        return M.mean(r.get(key) for r in rows)

    def cost(key: str):
        return M.mean(r.get(key) for r in ok)

    nli_rows = [r for r in rows if r.get("nli_gold")]
    nli = M.nli_scores([r["nli_gold"] for r in nli_rows], [r["nli_pred"] for r in nli_rows]) if nli_rows else None
    nli_ok = [r for r in nli_rows if r.get("status") == "ok"]
    ab_rows = [r for r in rows if "should_abstain" in r]
    n_marked = sum(r.get("n_citations") or 0 for r in rows)
    n_inferred = sum(r.get("n_inferred_citations") or 0 for r in rows)
    ab = M.abstention_scores([r["should_abstain"] for r in ab_rows], [r["abstained"] for r in ab_rows])
    has_unanswerable = ab["should_abstain"] > 0
    ev_rows = [r for r in rows if r.get("rr") is not None]
    tokens = [r["prompt_tokens"] for r in ok if r.get("prompt_tokens") is not None]
    out = {
        "n_questions": len(rows),
        "n_answered": len(ok),
        "n_errors": sum(r.get("status") == "error" for r in rows),
        "n_missing": sum(r.get("status") == "missing" for r in rows),
        "evidence_in_context": m("evidence_in_context"),
        "page_hit": m("page_hit"),
        "page_hit_at_1": m("page_hit_at_1"),
        "page_hit_at_3": m("page_hit_at_3"),
        "mrr": M.mrr(r["evidence_rank"] for r in ev_rows) if ev_rows else None,
        "evidence_strict": m("evidence_strict"),
        "mrr_strict": M.mrr(r.get("evidence_rank_strict") for r in ev_rows) if ev_rows else None,
        "evidence_within_1000_tokens": m("evidence_within_1000_tokens"),
        "evidence_within_2000_tokens": m("evidence_within_2000_tokens"),
        "mrr_strict_any_span": m("rr_strict_any_span"),
        "any_span_within_1000_tokens": m("any_span_within_1000_tokens"),
        "any_span_within_2000_tokens": m("any_span_within_2000_tokens"),
        "tokens_to_evidence_mean": M.mean(r.get("tokens_to_evidence") for r in ok),
        "gold_figure_at_5": m("gold_figure_at_5"),
        "doc_recall": m("doc_recall"),
        "answer_numbers_in_context": m("answer_numbers_in_context"),
        "answer_match": m("answer_match"),
        "token_f1": m("token_f1"),
        "nli_accuracy": nli["accuracy"] if nli else None,
        "nli_majority_accuracy": nli["majority_accuracy"] if nli else None,
        # answers that name no label, among the answered (an errored question is counted in n_errors)
        "nli_unparsed": (sum(r["nli_pred"] is None for r in nli_ok) / len(nli_ok)) if nli_ok else None,
        "nli_f1_contradiction": (nli["per_class"]["Contradiction"]["f1"] if nli else None),
        "nli_macro_f1": nli["macro_f1"] if nli else None,
        "quote_has_evidence": m("quote_has_evidence"),
        "passage_has_evidence": m("passage_has_evidence"),
        "abstain_precision": ab["precision"] if has_unanswerable else None,
        "abstain_recall": ab["recall"] if has_unanswerable else None,
        "abstain_rate": (ab["abstained"] / len(ab_rows)) if ab_rows else None,
        # answerable questions not answered: outcome not supported, and not unverified with the
        # gold evidence among its passages (ragkit.answer.ask: the three outcomes)
        "wrongly_refused": sum(bool(r.get("wrongly_refused")) for r in rows) if ab_rows else None,
        "n_answerable": sum(not r["should_abstain"] for r in ab_rows) if ab_rows else None,
        "wrongly_refused_rate": m("wrongly_refused"),
        "unverified_with_evidence": sum(bool(r.get("unverified_with_evidence")) for r in rows) if ab_rows else None,
        "answer_or_quote_match": m("answer_or_quote_match"),
        **{f"n_{o}": (sum(r.get("answer_outcome") == o for r in ab_rows) if ab_rows else None)
           for o in ("supported", "unverified", "not_found")},
        "citation_precision": m("citation_precision"),  # [n] markers the model wrote, valid ones only
        "valid_citation_rate": m("valid_citation"),  # a marked citation holds the evidence
        "citations_inferred_share": (n_inferred / (n_marked + n_inferred)) if (n_marked + n_inferred) else None,
        "inferred_citation_precision": m("inferred_citation_precision"),  # citations ragkit inferred from wording
        **M.claim_scores(rows),  # claims tied to source sentences (ragkit.answer.claims)
        "prompt_tokens_mean": M.mean(tokens),
        "prompt_tokens_p50": M.percentile(tokens, 50),
        "prompt_tokens_p95": M.percentile(tokens, 95),
        "cached_tokens_mean": cost("cached_tokens"),
        "completion_tokens_mean": cost("completion_tokens"),
        "projected_prefill_s_mean": cost("projected_prefill_s"),
        "projected_prefill_s_p95": M.percentile([r["projected_prefill_s"] for r in ok], 95),
    }
    for st in STAGES:
        vals = [r["timings"][st] for r in ok if st in r.get("timings", {})]
        out[f"{st}_p50"] = M.percentile(vals, 50)
        out[f"{st}_p95"] = M.percentile(vals, 95)
    return out, nli, ab


BY_TAG_KEYS = ("n_questions", "evidence_strict", "mrr_strict", "evidence_in_context", "page_hit", "mrr", "doc_recall", "answer_numbers_in_context",
               "answer_match", "token_f1", "nli_accuracy", "prompt_tokens_mean")


def score(items: list[EvalItem], records: dict[str, dict], settings: Settings, *,
          retrieval_only: bool | None = None) -> dict:
    """Score every item. `retrieval_only` is the run's mode (for questions that errored or
    were not answered); None: the mode of the answered records."""
    from ragkit.eval.report import miss_note

    rate = settings.generator.prompt_rate_tok_s
    if retrieval_only is None:
        modes = {bool(r.get("retrieval_only")) for r in records.values() if r.get("status", "ok") == "ok"}
        retrieval_only = modes == {True}
    rows = [score_item(i, records.get(i.id), rate, retrieval_only=retrieval_only) for i in items]
    metrics, nli, ab = _agg(rows)
    by_tag: dict[str, dict] = {}
    tags = sorted({t for i in items for t in i.tags if not t.startswith(("source:", "nda-", "category:"))})
    for t in tags:
        sub = [r for r in rows if t in r.get("tags", [])]
        if 0 < len(sub) < len(rows):
            agg = _agg(sub)[0]
            by_tag[t] = {k: agg[k] for k in BY_TAG_KEYS}
    keep = [k for k in BY_TAG_KEYS if any(v[k] is not None for v in by_tag.values())]
    by_tag = {t: {k: v[k] for k in keep} for t, v in by_tag.items()}
    note = miss_note(metrics)
    return {
        "notes": [note] if note else [],
        "metrics": metrics,
        "nli": nli,
        "abstention": ab,
        "by_tag": by_tag,
        "questions": rows,
        "prompt_rate_tok_s": rate,
    }


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
