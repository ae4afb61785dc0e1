"""Scoring a run: each question's record against its gold answer and evidence (`score_item`),
the figures over a set and per tag (`_agg`, `score`). `ragkit.eval.run` answers; this reads
what it recorded."""

from __future__ import annotations

from ragkit.config import Settings
from ragkit.eval import metrics as M
from ragkit.eval.answers import ANSWERS, read_answers  # noqa: F401  (the names this module always had)
from ragkit.eval.sets import EvalItem

STAGES = ("retrieve_s", "prompt_s", "generate_s", "ttft_s", "total_s")


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
    contexts = rec.get("contexts", [])
    ranked = sorted(contexts, key=lambda c: c.get("rank", c.get("n", 0)))
    row.update(mode=rec.get("mode"), n_contexts=len(contexts))
    row.update(_evidence_scores(item, ranked))
    row.update(_source_scores(item, ranked, contexts))
    row.update(_cost_fields(rec, ranked, rate_tok_s))
    why = _retrieval_misses(item, row)
    if not rec.get("retrieval_only") and rec.get("answer") is not None:  # the run generated an answer
        answer = rec.get("answer") or ""
        scores, misses = _label_scores(item, rec, answer) if item.label else _answer_scores(item, rec, answer)
        row.update(scores)
        why += misses
        row.update(_citation_scores(item, rec, contexts))
        row.update(M.claim_counts(rec.get("claims") or [], item.evidence_all or ([item.evidence] if item.evidence else [])))
    row["failed"] = bool(why)
    row["why"] = "; ".join(why)
    return row


def _evidence_spans(item: EvalItem) -> list[str]:
    """Every annotated evidence span (ContractNLI marks several; `evidence` is the first in document order)."""
    return [e for e in (item.evidence_all or []) if e] or ([item.evidence] if item.evidence else [])


def _evidence_scores(item: EvalItem, ranked: list[dict]) -> dict:
    """Where the gold evidence is among the ranked contexts: its rank (loose and strict, a
    clause the chunker split included), and the prompt tokens through it."""
    texts = [c["text"] for c in ranked]
    has_evidence = bool(item.evidence)
    rank = M.evidence_rank(item.evidence, texts)
    split = False
    if item.evidence and rank is None:  # a long clause the chunker split over adjacent chunks
        rank = M.evidence_rank_split(item.evidence, [{**c, "chunk_index": _chunk_index(c)} for c in ranked])
        split = rank is not None
    # the strict rule (the headline): a contiguous run of 80% of the evidence in one source
    # (or in the joined text of consecutive chunks of one document, a clause the chunker split)
    strict = M.evidence_rank(item.evidence, texts, strict=True)
    if item.evidence and strict is None:
        strict = M.evidence_rank_split(item.evidence, [{**c, "chunk_index": _chunk_index(c)} for c in ranked], strict=True)
    tokens = [c.get("tokens") for c in ranked]
    to_evidence = M.tokens_through_rank(tokens, strict)
    any_ranks = [r for r in (M.evidence_rank(e, texts, strict=True) for e in _evidence_spans(item)) if r]
    any_rank = min(any_ranks) if any_ranks else None
    to_any = M.tokens_through_rank(tokens, any_rank)
    return {
        "evidence_in_context": (rank is not None) if item.evidence else None,
        "evidence_rank": rank,
        "evidence_split": split,
        "rr": M.reciprocal_rank(rank) if item.evidence else None,
        "evidence_strict": (strict is not None) if item.evidence else None,
        "evidence_rank_strict": strict,
        "rr_strict": M.reciprocal_rank(strict) if item.evidence else None,
        "tokens_to_evidence": to_evidence,  # prompt tokens of the ranked sources through the evidence (strict)
        "evidence_within_1000_tokens": M.within_tokens(to_evidence, 1000, has_evidence),
        "evidence_within_2000_tokens": M.within_tokens(to_evidence, 2000, has_evidence),
        "rr_strict_any_span": M.reciprocal_rank(any_rank) if item.evidence else None,
        "any_span_within_1000_tokens": M.within_tokens(to_any, 1000, has_evidence),
        "any_span_within_2000_tokens": M.within_tokens(to_any, 2000, has_evidence),
    }


def _source_scores(item: EvalItem, ranked: list[dict], contexts: list[dict]) -> dict:
    """The gold page, the gold documents (a question over several) and the gold figures among the contexts."""
    texts = [c["text"] for c in ranked]
    pages = [(c.get("page"), c.get("page_end")) for c in ranked]
    figures = item.answerable and not item.label
    every = item.pages or ([item.page] if item.page else [])
    def hit(k=None):  # any gold page within the top k contexts
        return any(M.page_hit(p, pages, k) for p in every) if every else None

    return {
        "page_hit": hit(),
        # every gold page among the contexts (the strict figure: a ratio of two statements needs both)
        "pages_all_hit": all(M.page_hit(p, pages) for p in every) if every else None,
        "page_hit_at_1": hit(1),
        "page_hit_at_3": hit(3),
        "doc_recall": M.doc_recall(item.sources(), [c["doc"] for c in contexts]) if not item.doc else None,
        "answer_numbers_in_context": M.answer_numbers_in_context(item.answers, texts) if figures else None,
        "gold_figure_at_5": M.gold_figure_in(item.answers, texts[:5]) if figures else None,
    }


def _cost_fields(rec: dict, ranked: list[dict], rate_tok_s: float) -> dict:
    """What the answer cost (tokens, the projected prefill, the stage timings), the answer
    and where its top context is: the fields a question never answered has none of (_COST_KEYS)."""
    return {
        "prompt_tokens": rec.get("prompt_tokens"),
        "cached_tokens": rec.get("cached_tokens"),
        "completion_tokens": rec.get("completion_tokens"),
        "projected_prefill_s": M.projected_prefill_s(rec.get("prompt_tokens") or 0, rate_tok_s),
        "timings": rec.get("timings", {}),
        "answer": rec.get("answer"),
        "top_context": _where(ranked[0]) if ranked else None,
    }


def _retrieval_misses(item: EvalItem, row: dict) -> list[str]:
    """Why the retrieval scores in `row` count as a miss, one reason each."""
    why: list[str] = []
    if item.evidence and row["evidence_rank"] is None:
        why.append("evidence not retrieved")
    elif item.evidence and row["evidence_rank_strict"] is None:
        why.append("evidence only as scattered words (strict rule)")
    if row["page_hit"] is False:
        why.append("page not retrieved")
    if row["doc_recall"] is not None and row["doc_recall"] < 1:
        why.append(f"source documents retrieved {row['doc_recall']:.0%}")
    if row["answer_numbers_in_context"] == 0:
        why.append("no answer figure in context")
    return why


def _label_scores(item: EvalItem, rec: dict, answer: str) -> tuple[dict, list[str]]:
    """A labelled (NLI) question: the label the answer names, and the quote its cell shows
    against the evidence; with why it is a miss."""
    pred = M.nli_label(answer)
    scores = {"nli_gold": item.label, "nli_pred": pred}
    quote = rec.get("quote")
    if quote is not None:
        spans = item.evidence_all or ([item.evidence] if item.evidence else [])
        # headline: the quote the cell shows; a cell judged "not on point" shows none, so it
        # is a miss when there was evidence. passage_has_evidence also counts the
        # closest passage kept beside it (did retrieval find the clause at all)
        scores.update(quote=quote.get("text"), quote_has_evidence=M.quote_matches_evidence(quote.get("text"), spans),
                      passage_has_evidence=M.quote_matches_evidence(quote.get("text") or quote.get("closest"), spans),
                      nli_confidence=quote.get("confidence"))
    misses = [f"NLI {pred or 'unparsed'} != {item.label}"] if pred != item.label else []
    return scores, misses


def _answer_scores(item: EvalItem, rec: dict, answer: str) -> tuple[dict, list[str]]:
    """A question answered in words: the outcome against whether it should abstain, and the
    answer (or the passages it shows) against the gold answers; with why it is a miss."""
    should = not item.answerable
    outcome = M.outcome_of(rec)
    # abstained: the documents do not say (not_found); an unverified answer is no refusal
    scores = {"should_abstain": should, "abstained": outcome == "not_found", "answer_outcome": outcome}
    passages = [p.get("quote") or "" for p in rec.get("passages") or []]
    spans = _evidence_spans(item)
    misses: list[str] = []
    if item.answerable:
        scores["unverified_with_evidence"] = outcome == "unverified" and _gold_shown(item, passages, spans)
        scores["wrongly_refused"] = outcome != "supported" and not scores["unverified_with_evidence"]
    if item.answerable and item.answers:
        clean = M.answer_body(answer)
        scores["answer_match"] = M.answer_match(clean, item.answers, item.answers_mode)
        scores["token_f1"] = M.token_f1(clean, item.answers)
        # the answer, or the quote it shows (a quoted or unverified answer), holds a gold clause
        scores["answer_or_quote_match"] = bool(scores["answer_match"]) or any(
            M.quote_matches_evidence(q, [a for a in item.answers if len(a.split()) >= 4] + spans) for q in passages)
        if scores["answer_match"] is False:
            misses.append("answer does not match")
    if should != scores["abstained"]:
        misses.append("should have abstained" if should else "abstained wrongly")
    elif scores.get("wrongly_refused"):
        misses.append(f"answerable, outcome {outcome} without the gold evidence")
    return scores, misses


def _gold_shown(item: EvalItem, passages: list[str], spans: list[str]) -> bool:
    """The gold evidence (or, with no evidence spans, a gold answer) among the passages an unverified answer shows."""
    return bool(passages) and (
        any(M.quote_matches_evidence(q, spans) for q in passages) if spans
        else bool(M.answer_match(" ".join(passages), item.answers, "any")))


def _citation_scores(item: EvalItem, rec: dict, contexts: list[dict]) -> dict:
    """The answer's citations against the evidence: a citation the model marked [n] is
    scored apart from one ragkit inferred from the answer's wording (the model gave no
    marker): an inferred citation is never counted as precise."""
    by_n = {c["n"]: c["text"] for c in contexts}
    cites = [c for c in rec.get("citations", []) if c.get("n") in by_n]
    marked = [by_n[c["n"]] for c in cites if not c.get("inferred")]
    inferred = [by_n[c["n"]] for c in cites if c.get("inferred")]
    precision, valid = M.citation_scores(marked, item.evidence)
    return {"citation_precision": precision, "valid_citation": valid, "n_citations": len(marked),
            "n_inferred_citations": len(inferred),
            "inferred_citation_precision": M.citation_scores(inferred, item.evidence)[0],
            "invalid_citations": len(rec.get("invalid_citations", []))}


def _agg(rows: list[dict]) -> dict:
    """Quality metrics over every question (one that errored or was not answered holds
    miss values, see `_miss_row`); cost and latency over the answered ones. Returns the
    figures, the NLI scores and the abstention scores."""
    ok = [r for r in rows if r.get("status") == "ok"]
    nli_rows = [r for r in rows if r.get("nli_gold")]
    nli = M.nli_scores([r["nli_gold"] for r in nli_rows], [r["nli_pred"] for r in nli_rows]) if nli_rows else None
    ab_rows = [r for r in rows if "should_abstain" in r]
    ab = M.abstention_scores([r["should_abstain"] for r in ab_rows], [r["abstained"] for r in ab_rows])
    out = {
        "n_questions": len(rows),
        "n_answered": len(ok),
        "n_errors": sum(r.get("status") == "error" for r in rows),
        "n_missing": sum(r.get("status") == "missing" for r in rows),
        **_retrieval_figures(rows, ok),
        "answer_match": _mean(rows, "answer_match"),
        "token_f1": _mean(rows, "token_f1"),
        **_label_figures(rows, nli_rows, nli),
        **_abstention_figures(rows, ab_rows, ab),
        **_citation_figures(rows),
        **_cost_figures(ok),
    }
    for st in STAGES:
        vals = [r["timings"][st] for r in ok if st in r.get("timings", {})]
        out[f"{st}_p50"] = M.percentile(vals, 50)
        out[f"{st}_p95"] = M.percentile(vals, 95)
    return out, nli, ab


def _mean(rows: list[dict], key: str):
    return M.mean(r.get(key) for r in rows)


def _retrieval_figures(rows: list[dict], ok: list[dict]) -> dict:
    """Where the evidence, the page, the documents and the gold figures were among the
    contexts, over every question (`ok`: the answered ones, for the tokens to the evidence)."""
    ev_rows = [r for r in rows if r.get("rr") is not None]
    return {
        "evidence_in_context": _mean(rows, "evidence_in_context"),
        "page_hit": _mean(rows, "page_hit"),
        "pages_all_hit": _mean(rows, "pages_all_hit"),
        "page_hit_at_1": _mean(rows, "page_hit_at_1"),
        "page_hit_at_3": _mean(rows, "page_hit_at_3"),
        "mrr": M.mrr(r["evidence_rank"] for r in ev_rows) if ev_rows else None,
        "evidence_strict": _mean(rows, "evidence_strict"),
        "mrr_strict": M.mrr(r.get("evidence_rank_strict") for r in ev_rows) if ev_rows else None,
        "evidence_within_1000_tokens": _mean(rows, "evidence_within_1000_tokens"),
        "evidence_within_2000_tokens": _mean(rows, "evidence_within_2000_tokens"),
        "mrr_strict_any_span": _mean(rows, "rr_strict_any_span"),
        "any_span_within_1000_tokens": _mean(rows, "any_span_within_1000_tokens"),
        "any_span_within_2000_tokens": _mean(rows, "any_span_within_2000_tokens"),
        "tokens_to_evidence_mean": M.mean(r.get("tokens_to_evidence") for r in ok),
        "gold_figure_at_5": _mean(rows, "gold_figure_at_5"),
        "doc_recall": _mean(rows, "doc_recall"),
        "answer_numbers_in_context": _mean(rows, "answer_numbers_in_context"),
    }


def _label_figures(rows: list[dict], nli_rows: list[dict], nli: dict | None) -> dict:
    """The labelled (NLI) questions: accuracy and F1 (`nli`: M.nli_scores over `nli_rows`),
    unparsed answers, and the quotes that hold the evidence."""
    nli_ok = [r for r in nli_rows if r.get("status") == "ok"]
    return {
        "nli_accuracy": nli["accuracy"] if nli else None,
        "nli_majority_accuracy": nli["majority_accuracy"] if nli else None,
        # answers that name no label, among the answered (an errored question is counted in n_errors)
        "nli_unparsed": (sum(r["nli_pred"] is None for r in nli_ok) / len(nli_ok)) if nli_ok else None,
        "nli_f1_contradiction": (nli["per_class"]["Contradiction"]["f1"] if nli else None),
        "nli_macro_f1": nli["macro_f1"] if nli else None,
        "quote_has_evidence": _mean(rows, "quote_has_evidence"),
        "passage_has_evidence": _mean(rows, "passage_has_evidence"),
    }


def _abstention_figures(rows: list[dict], ab_rows: list[dict], ab: dict) -> dict:
    """The questions answered in words (`ab_rows`): abstention against whether they should
    (`ab`: M.abstention_scores), wrong refusals and the three outcomes."""
    has_unanswerable = ab["should_abstain"] > 0
    return {
        "abstain_precision": ab["precision"] if has_unanswerable else None,
        "abstain_recall": ab["recall"] if has_unanswerable else None,
        "abstain_rate": (ab["abstained"] / len(ab_rows)) if ab_rows else None,
        # answerable questions not answered: outcome not supported, and not unverified with the
        # gold evidence among its passages (ragkit.answer.ask: the three outcomes)
        "wrongly_refused": sum(bool(r.get("wrongly_refused")) for r in rows) if ab_rows else None,
        "n_answerable": sum(not r["should_abstain"] for r in ab_rows) if ab_rows else None,
        "wrongly_refused_rate": _mean(rows, "wrongly_refused"),
        "unverified_with_evidence": sum(bool(r.get("unverified_with_evidence")) for r in rows) if ab_rows else None,
        "answer_or_quote_match": _mean(rows, "answer_or_quote_match"),
        **{f"n_{o}": (sum(r.get("answer_outcome") == o for r in ab_rows) if ab_rows else None)
           for o in ("supported", "unverified", "not_found")},
    }


def _citation_figures(rows: list[dict]) -> dict:
    """Citations marked by the model apart from those ragkit inferred, and the claims tied to source sentences."""
    n_marked = sum(r.get("n_citations") or 0 for r in rows)
    n_inferred = sum(r.get("n_inferred_citations") or 0 for r in rows)
    return {
        "citation_precision": _mean(rows, "citation_precision"),  # [n] markers the model wrote, valid ones only
        "valid_citation_rate": _mean(rows, "valid_citation"),  # a marked citation holds the evidence
        "citations_inferred_share": (n_inferred / (n_marked + n_inferred)) if (n_marked + n_inferred) else None,
        "inferred_citation_precision": _mean(rows, "inferred_citation_precision"),  # citations ragkit inferred from wording
        **M.claim_scores(rows),  # claims tied to source sentences (ragkit.answer.claims)
    }


def _cost_figures(ok: list[dict]) -> dict:
    """Prompt and completion tokens and the projected prefill, over the answered questions (`ok`)."""
    tokens = [r["prompt_tokens"] for r in ok if r.get("prompt_tokens") is not None]
    return {
        "prompt_tokens_mean": M.mean(tokens),
        "prompt_tokens_p50": M.percentile(tokens, 50),
        "prompt_tokens_p95": M.percentile(tokens, 95),
        "cached_tokens_mean": _mean(ok, "cached_tokens"),
        "completion_tokens_mean": _mean(ok, "completion_tokens"),
        "projected_prefill_s_mean": _mean(ok, "projected_prefill_s"),
        "projected_prefill_s_p95": M.percentile([r["projected_prefill_s"] for r in ok], 95),
    }


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
