"""Abstention calibrated on the store: is the best source relevant, for this embedder?

A fixed cosine threshold does not carry from one embedder to another (MiniLM scores an
unrelated question against a contract near 0.1, e5 near 0.75) nor from one corpus to
another. Here the question's best score is read against the scores the same documents
give, with the same embedder, to questions about nothing any document could hold (the
probes below): `margin = (best - mean) / std` of the probes' best scores. The probes'
scores are computed once per (store, documents, embedder) and cached in memory.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

# Questions about nothing a contract, a filing or a guidance document holds, written
# before any measurement. Each is searched like a question; the best score each gets is a
# sample of what "nothing here is relevant" looks like for these documents.
# (None is among the off-topic questions the tests ask: those are measured, not fitted.)
PROBES = [
    "Who wrote the novel Pride and Prejudice?", "What is the speed of sound in air?",
    "How do I remove a red wine stain from a carpet?", "Which tree species grows the tallest?",
    "How do I bake sourdough bread at home?", "Which team won the football world cup in 1998?",
    "What is the best time of year to plant tomatoes?", "How tall is Mount Everest?",
    "What do koalas eat?", "How do you tune a guitar?", "What is the plot of Hamlet?",
    "Which planet has the most rings?", "How long should an egg be boiled?",
    "What language is spoken in Brazil?", "How do bees make honey?", "What causes a rainbow?",
]


@dataclass
class Calibration:
    mean: float
    std: float
    n: int

    def margin(self, best: float) -> float:
        return (best - self.mean) / max(self.std, 1e-3)


def calibrate(store, embedder, doc_ids: list[str], *, all_live: bool = False, memo: dict | None = None) -> Calibration:
    """The probes' best scores against `doc_ids`, kept in `memo` (a Session's, for one store)
    by the documents' ids: a re-ingested document has a new id, so it calibrates again."""
    ck = (getattr(embedder, "name", ""), tuple(sorted(doc_ids)), all_live)
    if memo is not None and ck in memo:
        return memo[ck]
    best = []
    for q in PROBES:
        top = store.query(embedder.embed_query(q), 1, doc_ids, all_live=all_live)
        best.append(top[0].score if top else 0.0)
    made = Calibration(statistics.fmean(best), statistics.pstdev(best), len(best))
    if memo is not None:
        if len(memo) > 256:
            memo.clear()
        memo[ck] = made
    return made


def reranker_reason(best: float | None, floor: float | None) -> str | None:
    """Why to abstain on the cross-encoder's evidence (ragkit.retrieve.rerank): its best score
    over the candidates is under `floor` (retrieve.rerank_abstain_below), or None. The score
    reads the question with each passage, so it can tell a clause that is about the question
    from one that only shares its subject, which a best cosine cannot."""
    if best is None or floor is None or best >= floor:
        return None
    return f"no source is relevant (the reranker's best score {best:.2f} is under {floor:g})"
