"""Evaluation metrics on answers and labels (ragkit.eval.metrics re-exports them): answer
text against the gold, NLI labels, abstention, citations and claims. Pure functions."""

from __future__ import annotations

import re
import string
import unicodedata
from collections import Counter
from typing import Sequence

from ragkit.eval.metrics_numbers import numeric_match
from ragkit.eval.metrics_text import evidence_in_text, normalize, quote_matches_evidence
from ragkit.evidence.figures import QUOTES

# ---------------------------------------------------------------------- answers

_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCT = str.maketrans("", "", string.punctuation)


_CITE = re.compile(r"\s*\[\d+(?:\s*[,;\u2013-]\s*\d+)*\]")


def strip_citations(answer: str | None) -> str:
    """The answer without its [n] source markers (they are scored as citations, not as
    answer text)."""
    return _CITE.sub("", answer or "").strip()


# the head of an unverified answer (ragkit.answer.ask.UNVERIFIED_HEAD): not part of what it says
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
    """A record's outcome (ragkit.answer.ask: supported | unverified | not_found); records written
    before outcomes existed: not_found when abstained, supported when they answered,
    "none" when they hold no answer (a question that errored, scored as a miss)."""
    if rec.get("outcome"):
        return str(rec["outcome"])
    if rec.get("abstained"):
        return "not_found"
    return "supported" if (rec.get("answer") or "").strip() else "none"


def squad_normalize(text: str) -> str:
    t = unicodedata.normalize("NFKC", text or "").translate(QUOTES).lower()
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
