"""Evaluation metrics: pure functions, no model and no store.

Text comparison goes through `normalize`: Unicode NFKC, curly quotes and dashes made
plain, soft hyphens dropped, hyphens between word characters removed (so a PDF's
line-break hyphenation "confi-\\ndential" and a real compound "third-party" both compare
equal to their unhyphenated form on either side), case folded, whitespace collapsed.
"""

from __future__ import annotations

import math
import re
import string
import unicodedata
from collections import Counter
from typing import Iterable, Sequence

# the number reader is the pipeline's (ragkit.retrieve.figures): the claims check and the
# metrics read figures the same way
from ragkit.retrieve.figures import _QUOTES, Quantity, extract_numbers, same_number  # noqa: F401

# ---------------------------------------------------------------------- normalization

_HYPHEN = re.compile(r"(?<=\w)-\s*(?=\w)")
_WS = re.compile(r"\s+")
_TOKEN = re.compile(r"\w+", re.U)


def normalize(text: str | None) -> str:
    if not text:
        return ""
    t = unicodedata.normalize("NFKC", text).translate(_QUOTES)
    t = _HYPHEN.sub("", t)
    return _WS.sub(" ", t).strip().casefold()


def tokens(text: str | None) -> list[str]:
    return _TOKEN.findall(normalize(text))


# ---------------------------------------------------------------------- retrieval

TOKEN_COVERAGE = 0.9


def evidence_in_text(evidence: str, text: str, coverage: float = TOKEN_COVERAGE) -> bool:
    """True when the normalized evidence is a substring of the normalized text, or when at
    least `coverage` (90%) of the evidence's tokens, counted with multiplicity, occur in
    the text. The second rule accepts evidence that a chunk boundary, a page header or a
    PDF extraction quirk (a dropped footnote mark, a split number) breaks up slightly."""
    ev, tx = normalize(evidence), normalize(text)
    if not ev:
        return False
    if ev in tx:
        return True
    et = Counter(_TOKEN.findall(ev))
    total = sum(et.values())
    if total == 0:
        return False
    tt = Counter(_TOKEN.findall(tx))
    have = sum(min(n, tt[w]) for w, n in et.items())
    return have / total >= coverage


# The strict rule (the headline figure): the evidence counts as found in a source only when
# a contiguous run of at least this share of its tokens lies inside that one source. The
# loose rule above accepts 90% of the evidence's words scattered anywhere in a long text.
STRICT_RUN = 0.8


def longest_shared_run(a: Sequence[str], b: Sequence[str]) -> int:
    """Length of the longest run of tokens that occurs contiguously in both sequences
    (difflib's longest-match search, with its "popular element" heuristic off so that
    frequent words such as "the" still match)."""
    from difflib import SequenceMatcher

    if not a or not b:
        return 0
    sm = SequenceMatcher(None, a, b, autojunk=False)
    return sm.find_longest_match(0, len(a), 0, len(b)).size


def evidence_in_text_strict(evidence: str, text: str, share: float = STRICT_RUN) -> bool:
    """True when a contiguous run of at least `share` (80%) of the evidence's tokens (after
    `normalize`) occurs, in order and unbroken, inside the text. A page header or a
    dropped footnote mark inside the evidence still passes; the same words scattered over
    a long text do not."""
    ev, tx = normalize(evidence), normalize(text)
    if not ev:
        return False
    if ev in tx:
        return True
    et = _TOKEN.findall(ev)
    if not et:
        return False
    need = math.ceil(share * len(et))
    tt = _TOKEN.findall(tx)
    if len(tt) < need:
        return False
    return longest_shared_run(et, tt) >= need


def evidence_in(evidence: str, text: str, coverage: float = TOKEN_COVERAGE, *, strict: bool = False) -> bool:
    """The strict rule (`evidence_in_text_strict`) or the loose one (`evidence_in_text`)."""
    return evidence_in_text_strict(evidence, text) if strict else evidence_in_text(evidence, text, coverage)


def evidence_in_context(evidence: str | None, contexts: Sequence[str], coverage: float = TOKEN_COVERAGE) -> bool | None:
    """Does any one context contain the evidence? None when there is no evidence to look for."""
    if not evidence:
        return None
    return any(evidence_in_text(evidence, c, coverage) for c in contexts)


def evidence_rank(evidence: str | None, ranked_contexts: Sequence[str], coverage: float = TOKEN_COVERAGE, *,
                  strict: bool = False) -> int | None:
    """1-based rank of the first context (best first) that contains the evidence, or None.
    `strict`: by the strict rule (a contiguous run, `evidence_in_text_strict`)."""
    if not evidence:
        return None
    for i, c in enumerate(ranked_contexts, 1):
        if evidence_in(evidence, c, coverage, strict=strict):
            return i
    return None


def evidence_rank_split(evidence: str | None, contexts: Sequence[dict], coverage: float = TOKEN_COVERAGE, *,
                        strict: bool = False) -> int | None:
    """For evidence that no single context holds: is it in the joined text of a run of
    contexts that are consecutive chunks of one document (the chunker split a long clause)?
    `contexts` are dicts with `doc`, `chunk_index`, `rank` and `text`. Returns the worst
    rank in the shortest such run (all of its chunks are needed), or None."""
    if not evidence:
        return None
    by_doc: dict[str, list[dict]] = {}
    for c in contexts:
        if c.get("chunk_index") is not None:
            by_doc.setdefault(c.get("doc", ""), []).append(c)
    best: int | None = None
    for cs in by_doc.values():
        cs = sorted(cs, key=lambda c: c["chunk_index"])
        for i in range(len(cs)):
            for j in range(i + 1, len(cs)):
                if cs[j]["chunk_index"] - cs[j - 1]["chunk_index"] != 1:
                    break
                run = cs[i: j + 1]
                if evidence_in(evidence, " ".join(c["text"] for c in run), coverage, strict=strict):
                    worst = max(c["rank"] for c in run)
                    best = worst if best is None else min(best, worst)
                    break
    return best


def tokens_through_rank(ranked_tokens: Sequence[int | None], rank: int | None) -> int | None:
    """Prompt tokens of the ranked sources up to and including the one at `rank` (1-based):
    what must be prefilled to reach the evidence when the sources go in best first.
    None when the evidence was not found."""
    if not rank:
        return None
    return sum(int(t or 0) for t in ranked_tokens[:rank])


def within_tokens(tokens_to_evidence: int | None, n: int, has_evidence: bool) -> bool | None:
    """Is the evidence (the whole source that holds it) within the first `n` prompt tokens
    of the ranked sources? None when there is no evidence to look for."""
    if not has_evidence:
        return None
    return tokens_to_evidence is not None and tokens_to_evidence <= n


def reciprocal_rank(rank: int | None) -> float:
    return 0.0 if not rank else 1.0 / rank


def mrr(ranks: Iterable[int | None]) -> float | None:
    """Mean reciprocal rank; a question whose evidence was not retrieved counts 0."""
    rr = [reciprocal_rank(r) for r in ranks]
    return sum(rr) / len(rr) if rr else None


def page_hit(gold_page: int | None, ranked_pages: Sequence[tuple[int | None, int | None]], k: int | None = None) -> bool | None:
    """Is the gold page within the page range (start, end) of one of the top-k contexts?
    None when there is no gold page."""
    if gold_page is None:
        return None
    top = ranked_pages if k is None else ranked_pages[:k]
    for start, end in top:
        if start is None:
            continue
        if start <= gold_page <= (end if end is not None else start):
            return True
    return False


def doc_recall(sources: Sequence[str], context_docs: Sequence[str]) -> float | None:
    """Share of the documents that hold the answer that appear among the contexts
    (file names compared without case and extension)."""
    if not sources:
        return None

    def key(n: str) -> str:
        n = n.lower()
        return n.rsplit(".", 1)[0] if "." in n[-6:] else n

    have = {key(d) for d in context_docs}
    return sum(key(s) in have for s in sources) / len(sources)


# ---------------------------------------------------------------------- numbers

def numeric_match(gold: str, pred: str, rel_tol: float = 5e-3) -> bool | None:
    """Every number of the gold text occurs in the prediction (same value after scale
    and sign, within a relative tolerance for rounding: "$1.2 billion" == "1,200 million"
    == "$1,200,000,000"). None when the gold text has no number."""
    g = extract_numbers(gold)
    if not g:
        return None
    p = extract_numbers(pred)
    return all(any(same_number(x, y, rel_tol) for y in p) for x in g)


def _informative(q: Quantity) -> bool:
    v = abs(q.value)
    if q.percent:
        return True
    if v == int(v) and (v < 10 or 1900 <= v <= 2100):  # counts, quarters, years
        return False
    return True


def _same_up_to_scale(a: Quantity, b: Quantity, rel_tol: float = 5e-3) -> bool:
    if a.percent != b.percent:
        return False
    for f in (1.0, 1e3, 1e6, 1e9, 1e-3, 1e-6, 1e-9):
        if math.isclose(abs(a.value), abs(b.value) * f, rel_tol=rel_tol):
            return True
    return False


def answer_numbers_in_context(golds: Sequence[str], contexts: Sequence[str]) -> float | None:
    """A retrieval proxy for sets without evidence quotes (SEC 10-Q): the share of the
    gold answer's figures that occur in the retrieved context. Figures are compared by
    absolute value up to a factor of 1e3/1e6/1e9, because a filing's table says "82,959"
    under "(in millions)" where the answer says "$82,959 million"; years 1900-2100 and
    integers below 10 are skipped. None when the gold answer states no such figure."""
    gold = [q for g in golds for q in extract_numbers(g) if _informative(q)]
    gold = list(dict.fromkeys(gold))
    if not gold:
        return None
    have = [q for c in contexts for q in extract_numbers(c)]
    return sum(any(_same_up_to_scale(g, h) for h in have) for g in gold) / len(gold)


def gold_figure_in(golds: Sequence[str], contexts: Sequence[str]) -> bool | None:
    """At least one of the gold answer's figures (as `answer_numbers_in_context` counts
    them) occurs in the contexts. None when the gold answer states no such figure."""
    share = answer_numbers_in_context(golds, contexts)
    return None if share is None else share > 0


# ---------------------------------------------------------------------- answers

_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCT = str.maketrans("", "", string.punctuation)


_CITE = re.compile(r"\s*\[\d+(?:\s*[,;\u2013-]\s*\d+)*\]")


def strip_citations(answer: str | None) -> str:
    """The answer without its [n] source markers (they are scored as citations, not as
    answer text)."""
    return _CITE.sub("", answer or "").strip()


# the head of an unverified answer (ragkit.ask.UNVERIFIED_HEAD): not part of what it says
_UNVERIFIED_HEAD = re.compile(r"^\s*Not verified against the sources\.(?: The passages that answer the question best:)?\s*")


_QUOTE_PLACE = re.compile(r"”\s*\[\d+\]\s*\(.*\)[ \t]*$", re.M)


def answer_body(answer: str | None) -> str:
    """What an answer says, for matching against the gold: without its [n] markers and
    without the "Not verified against the sources." head of an unverified answer (whose
    body is the quoted passages) and the places of quoted passages (a page number is no
    figure of the answer)."""
    text = _UNVERIFIED_HEAD.sub("", answer or "")
    text = _QUOTE_PLACE.sub("”", text)  # a quoted passage's "[n] (doc, p. 3, § 7)": where it is, not what it says
    return strip_citations(text)


def outcome_of(rec: dict) -> str:
    """A record's outcome (ragkit.ask: supported | unverified | not_found); records written
    before outcomes existed: not_found when abstained, supported when they answered,
    "none" when they hold no answer (a question that errored, scored as a miss)."""
    if rec.get("outcome"):
        return str(rec["outcome"])
    if rec.get("abstained"):
        return "not_found"
    return "supported" if (rec.get("answer") or "").strip() else "none"


def squad_normalize(text: str) -> str:
    t = unicodedata.normalize("NFKC", text or "").translate(_QUOTES).lower()
    t = t.translate(_PUNCT)
    t = _ARTICLES.sub(" ", t)
    return " ".join(t.split())


def token_f1(pred: str, golds: Sequence[str]) -> float | None:
    """SQuAD-style token F1 (lower case, punctuation and articles removed), the best over
    the gold answers. None when there is no gold answer."""
    golds = [g for g in golds if g and g.strip()]
    if not golds:
        return None
    pt = squad_normalize(pred).split()
    best = 0.0
    for g in golds:
        gt = squad_normalize(g).split()
        if not pt or not gt:
            f = float(pt == gt)
        else:
            common = Counter(pt) & Counter(gt)
            same = sum(common.values())
            if same == 0:
                f = 0.0
            else:
                p, r = same / len(pt), same / len(gt)
                f = 2 * p * r / (p + r)
        best = max(best, f)
    return best


def _has_phrase(text: str, phrase: str) -> bool:
    """`phrase` occurs in `text` as whole words and whole numbers: "no" is not in "not",
    "14" is not in "140" nor in "14.5"."""
    if not phrase:
        return False
    return re.search(r"(?<!\w)(?<!\d[.,])" + re.escape(phrase) + r"(?!\w)(?![.,]\d)", text) is not None


def answer_contains(pred: str, gold: str) -> bool:
    """The normalized gold answer occurs in the normalized prediction as whole words and
    numbers (gold "no" does not match "The documents do not say.", gold "14" does not
    match "140"), or the gold is a number (with units/scale) that the prediction states."""
    g, p = normalize(gold), normalize(pred)
    if g and _has_phrase(p, g):
        return True
    sg = squad_normalize(gold)
    if sg and _has_phrase(squad_normalize(pred), sg):
        return True
    num = numeric_match(gold, pred)
    return bool(num)


def answer_match(pred: str, golds: Sequence[str], mode: str = "any") -> bool | None:
    """`any`: one gold answer occurs in the prediction; `all`: every one does. None when
    there is no gold answer."""
    golds = [g for g in golds if g and g.strip()]
    if not golds:
        return None
    hits = [answer_contains(pred, g) for g in golds]
    return all(hits) if mode == "all" else any(hits)


# ---------------------------------------------------------------------- NLI

NLI = ("Entailment", "Contradiction", "NotMentioned")
_NOT_MENTIONED = re.compile(
    r"\bnot (?:be )?(?:mentioned|stated|specified|addressed|covered)\b|\bdoes not (?:mention|say|state|specify|address)\b"
    r"|\bdo not (?:mention|say|state|specify)\b|\bno mention\b|\bis silent\b",
    re.I,
)


def nli_label(answer: str | None) -> str | None:
    """Map a generated answer to an NLI label. The question asks the model to start with
    Yes, No or Not mentioned. Rules, on the first sentence (markup and leading
    punctuation stripped):
    1. a not-mentioned phrase ("not mentioned", "does not say/mention/specify",
       "no mention", "is silent", and the pipeline's abstention "The documents do not say")
       -> NotMentioned;
    2. starts with "yes" -> Entailment;
    3. starts with "no" -> Contradiction;
    4. otherwise None (unparseable; scored as wrong)."""
    if not answer:
        return None
    t = normalize(answer).lstrip(" *_#>\"'-:[(")
    first = re.split(r"(?<=[.!?])\s|\n", t, maxsplit=1)[0]
    if _NOT_MENTIONED.search(first):
        return "NotMentioned"
    if re.match(r"yes\b", first):
        return "Entailment"
    if re.match(r"no\b", first):
        return "Contradiction"
    return None


def nli_scores(gold: Sequence[str], pred: Sequence[str | None]) -> dict:
    """Accuracy, per-class precision/recall/F1 over the labels in NLI, macro F1 and the
    accuracy of the majority-class baseline. A None prediction (unparsed, or a question
    that errored) is wrong and counts as no class: a miss for its gold class, a false
    positive for none.

    Per class c: precision = tp / predicted (None when c is never predicted), recall =
    tp / support (None when c is never gold), F1 = 2 tp / (2 tp + fp + fn), so a class
    with gold items and no prediction has F1 0 (it is not left out), and so does a class
    predicted but never gold. F1 is None only for a class neither gold nor predicted.
    `macro_f1` is the mean F1 over the classes where it is defined (as scikit-learn's
    `f1_score(average="macro")` over the labels present). `majority_accuracy` is the
    accuracy of always answering the most frequent gold class: a model below it has
    learnt less than the class prior."""
    n = len(gold)
    out: dict = {"n": n, "accuracy": (sum(g == p for g, p in zip(gold, pred)) / n) if n else None, "per_class": {}}
    for c in NLI:
        tp = sum(g == c and p == c for g, p in zip(gold, pred))
        npred = sum(p == c for p in pred)
        ngold = sum(g == c for g in gold)
        fp, fn = npred - tp, ngold - tp
        prec = tp / npred if npred else None
        rec = tp / ngold if ngold else None
        f1 = 2 * tp / (2 * tp + fp + fn) if (tp + fp + fn) else None
        out["per_class"][c] = {"precision": prec, "recall": rec, "f1": f1, "support": ngold, "predicted": npred}
    f1s = [v["f1"] for v in out["per_class"].values() if v["f1"] is not None]
    out["macro_f1"] = sum(f1s) / len(f1s) if f1s else None
    counts = Counter(gold)
    if counts:
        top, k = max(counts.items(), key=lambda kv: (kv[1], -NLI.index(kv[0]) if kv[0] in NLI else 0))
        out["majority_class"], out["majority_accuracy"] = top, k / n
    else:
        out["majority_class"], out["majority_accuracy"] = None, None
    return out


# ---------------------------------------------------------------------- abstention and citations

def abstention_scores(should_abstain: Sequence[bool], abstained: Sequence[bool]) -> dict:
    """Precision: of the answers that abstained, the share that should have.
    Recall: of the questions that should be abstained on, the share that were."""
    tp = sum(s and a for s, a in zip(should_abstain, abstained))
    npred = sum(bool(a) for a in abstained)
    ngold = sum(bool(s) for s in should_abstain)
    return {
        "precision": tp / npred if npred else None,
        "recall": tp / ngold if ngold else None,
        "abstained": npred,
        "should_abstain": ngold,
    }


def citation_scores(cited_texts: Sequence[str], evidence: str | None) -> tuple[float | None, bool | None]:
    """(precision, has_valid): the share of cited passages that contain the evidence, and
    whether at least one does. (None, None) when there is no evidence; (None, False) when
    nothing was cited."""
    if not evidence:
        return None, None
    if not cited_texts:
        return None, False
    ok = [evidence_in_text(evidence, t) for t in cited_texts]
    return sum(ok) / len(ok), any(ok)


# ---------------------------------------------------------------------- cost and latency

def quote_matches_evidence(quote: str | None, spans: Sequence[str], coverage: float = 0.6) -> bool | None:
    """Whether a quote shown to the reader is (mostly) gold evidence: at least `coverage`
    of the shorter of the two, in tokens with multiplicity, is shared with one gold span.
    A quote is a sentence or list item, a span can be a whole clause, or the reverse.
    None when there is no gold span (NotMentioned)."""
    spans = [s for s in spans if s]
    if not spans:
        return None
    if not quote:
        return False
    q = Counter(tokens(quote.replace("\u2026", " ")))
    for s in spans:
        e = Counter(tokens(s))
        shared = sum((q & e).values())
        if shared and shared >= coverage * min(sum(q.values()), sum(e.values())):
            return True
    return False


def projected_prefill_s(prompt_tokens: int, rate_tok_s: float) -> float:
    """Seconds to prefill the prompt at `rate_tok_s` (setting generator.prompt_rate_tok_s,
    106 tok/s by default: a published llama.cpp hybrid GPU/CPU Kimi K2 figure)."""
    if rate_tok_s <= 0:
        raise ValueError("prompt_rate_tok_s must be positive")
    return prompt_tokens / rate_tok_s


def percentile(values: Sequence[float], p: float) -> float | None:
    """Linear interpolation between closest ranks (numpy's default)."""
    v = sorted(x for x in values if x is not None)
    if not v:
        return None
    if len(v) == 1:
        return float(v[0])
    pos = (len(v) - 1) * p / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(v) - 1)
    return float(v[lo] + (v[hi] - v[lo]) * (pos - lo))


def mean(values: Iterable[float | bool | None]) -> float | None:
    v = [float(x) for x in values if x is not None]
    return sum(v) / len(v) if v else None


# ---------------------------------------------------------------------- claims

def claim_counts(claims: Sequence[dict], spans: Sequence[str]) -> dict:
    """Per answer: its claims, the unsupported ones, and among the supported ones those
    cited by the model's own marker ([n], `inferred` false) or only by attribution, with
    how many of each cite a sentence that is gold evidence (`quote_matches_evidence`;
    counted only when the item has gold evidence)."""
    out = {"n_claims": len(claims), "n_claims_unsupported": sum(not c.get("supported") for c in claims),
           "n_claims_marked": 0, "n_claims_marked_on_evidence": 0, "n_claims_inferred": 0,
           "n_claims_inferred_on_evidence": 0}
    spans = [s for s in spans if s]
    for c in claims:
        cites = c.get("citations") or []
        if not c.get("supported") or not cites:
            continue
        kind = "inferred" if all(x.get("inferred") for x in cites) else "marked"
        if not spans:
            continue
        out[f"n_claims_{kind}"] += 1
        use = [x for x in cites if x.get("inferred")] if kind == "inferred" else [x for x in cites if not x.get("inferred")]
        if any(quote_matches_evidence(x.get("quote"), spans) for x in use):
            out[f"n_claims_{kind}_on_evidence"] += 1
    return out


def claim_scores(rows: Sequence[dict]) -> dict:
    """Over all claims of a run (micro): the share no source sentence supports, and
    claim-level citation precision: of the supported claims cited by the model's marker,
    the share whose cited sentence is gold evidence; claims cited only by attribution
    (inferred) are scored apart and never counted as precise."""
    tot = {k: sum(r.get(k) or 0 for r in rows) for k in (
        "n_claims", "n_claims_unsupported", "n_claims_marked", "n_claims_marked_on_evidence", "n_claims_inferred",
        "n_claims_inferred_on_evidence")}
    answered = [r for r in rows if r.get("n_claims") is not None and r.get("status") == "ok"]
    return {
        "claims_per_answer": (tot["n_claims"] / len(answered)) if answered else None,
        "unsupported_claim_share": (tot["n_claims_unsupported"] / tot["n_claims"]) if tot["n_claims"] else None,
        "claim_citation_precision": (tot["n_claims_marked_on_evidence"] / tot["n_claims_marked"])
        if tot["n_claims_marked"] else None,
        "inferred_claim_citation_precision": (tot["n_claims_inferred_on_evidence"] / tot["n_claims_inferred"])
        if tot["n_claims_inferred"] else None,
        "n_claims_cited_marked": tot["n_claims_marked"],
        "n_claims_cited_inferred": tot["n_claims_inferred"],
    }
