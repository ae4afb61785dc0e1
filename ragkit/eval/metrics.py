"""Evaluation metrics: pure functions, no model and no store.

Text comparison goes through `normalize`: Unicode NFKC, curly quotes and dashes made
plain, soft hyphens dropped, hyphens between word characters removed (so a PDF's
line-break hyphenation "confi-\\ndential" and a real compound "third-party" both compare
equal to their unhyphenated form on either side), case folded, whitespace collapsed.

By job: text and retrieval (`metrics_text`), figures (`metrics_numbers`), answers and
labels (`metrics_answers`); this module re-exports them all and holds cost and latency.
"""

from __future__ import annotations

import math
from typing import Iterable, Sequence

from ragkit.eval.metrics_answers import (  # noqa: F401
    NLI,
    abstention_scores,
    answer_body,
    answer_contains,
    answer_match,
    citation_scores,
    claim_counts,
    claim_scores,
    nli_label,
    nli_scores,
    outcome_of,
    squad_normalize,
    strip_citations,
    token_f1,
)
from ragkit.eval.metrics_numbers import (  # noqa: F401
    _informative,
    _same_up_to_scale,
    answer_numbers_in_context,
    gold_figure_in,
    numeric_match,
)

# the metrics by job: text and retrieval, figures, answers and labels
from ragkit.eval.metrics_text import (  # noqa: F401
    _TOKEN,
    STRICT_RUN,
    TOKEN_COVERAGE,
    doc_recall,
    evidence_in,
    evidence_in_context,
    evidence_in_text,
    evidence_in_text_strict,
    evidence_rank,
    evidence_rank_split,
    longest_shared_run,
    mrr,
    normalize,
    page_hit,
    quote_matches_evidence,
    reciprocal_rank,
    tokens,
    tokens_through_rank,
    within_tokens,
)

# the number reader is the pipeline's (ragkit.evidence.figures): the claims check and the
# metrics read figures the same way
from ragkit.evidence.figures import QUOTES, Quantity, extract_numbers, same_number  # noqa: F401

# ---------------------------------------------------------------------- cost and latency

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
