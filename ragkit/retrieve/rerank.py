"""The reranker stage: a cross-encoder (`ragkit.rerankers`: the backends and their loader)
reads the question together with each candidate passage and gives one
relevance score per pair; its order is fused with the ranking the earlier stages made
(reciprocal rank fusion), so neither signal alone decides.

The candidates are the first `retrieve.rerank_pool` of the ranking so far: the hybrid top-N
over the store, or for named documents the best N of all their chunks (the sentence
ranking runs over every chunk of a document up to `retrieve.unit_pool_max`), optionally
cut short by a time budget (`retrieve.rerank_budget_s`). Figures: eval/README.md
"Reranker", from eval/bench_ranking.py.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from ragkit.evidence.figures import table_rows
from ragkit.rerankers import Reranker
from ragkit.retrieve.rank import _leaf
from ragkit.store import Hit

# ---------------------------------------------------------------------- the stage

def fuse(order: list[str], scores: dict[str, float], weight: float, k: int = 60) -> list[tuple[str, float]]:
    """Reciprocal rank fusion of the ranking so far (`order`, weight 1) and the
    cross-encoder's order of the ids it scored (`scores`, weight `weight`):
    `1/(k + rank) + weight/(k + rank by score)`. Ids without a score keep only their first
    term. Best first; ties keep the earlier order."""
    by_score = sorted(scores, key=lambda i: -scores[i])
    ce_rank = {i: r for r, i in enumerate(by_score, 1)}
    fused = [(i, 1.0 / (k + r) + (weight / (k + ce_rank[i]) if i in ce_rank else 0.0)) for r, i in enumerate(order, 1)]
    return sorted(fused, key=lambda t: -t[1])  # sorted() is stable


def fuse_lane(ranked: list[Hit], lane: list[str], weight: float, k: int = 60) -> list[Hit]:
    """`ranked` (scored by a fusion) with a lane's order of some of its ids fused in: each id
    at rank r of `lane` gains `weight/(k + r)`. Best first; ties keep the earlier order."""
    at = {i: r for r, i in enumerate(lane, 1)}
    out = [Hit(id=h.id, text=h.text, meta=h.meta, score=h.score + (weight / (k + at[h.id]) if h.id in at else 0.0))
           for h in ranked]
    return sorted(out, key=lambda h: -h.score)


def passage_text(h: Hit) -> str:
    """What the cross-encoder reads for a chunk: its clause heading (the leaf of its
    section path) before its text, as the embedder reads it, unless the text starts with it."""
    leaf = _leaf(h.meta.get("section"))
    return f"{leaf}\n{h.text}" if leaf and not h.text.lstrip().startswith(leaf) else h.text


@dataclass
class RerankInfo:
    backend: str
    pool: int  # candidates offered
    scored: int  # candidates scored (fewer when the time budget ran out)
    best: float | None  # highest cross-encoder score over the pool, the table lane's not included (the evidence for not_found)
    cpu_s: float  # process CPU time spent (all threads)
    wall_s: float
    scores: dict[str, float] = field(default_factory=dict)  # chunk id -> score
    pairs: int = 0  # (question, passage) pairs scored
    tables: list[str] = field(default_factory=list)  # the table lane's chunk ids, best cross-encoder score first
    floors: dict[str, float] = field(default_factory=dict)  # the reranker's own floors on its scores ("not_found", "quote", "table")
    # rerank_units: chunk id -> (unit, score) of each sentence or list item scored, in text order
    # (what the prompt is packed from: ragkit.retrieve.packing)
    units: dict[str, list[tuple[str, float]]] = field(default_factory=dict)

    def floor(self, setting, key: str) -> float | None:
        """A floor on this reranker's scores: `setting` as the retrieve settings give it (a
        number, "off"/None, or "model": the reranker's own `floors[key]`, None when it ships
        none). A logit floor means nothing for another model, so it travels with the model."""
        if setting is None or setting == "off":
            return None
        if setting == "model":
            return self.floors.get(key)
        return float(setting)

    def to_json(self) -> dict:
        return {"backend": self.backend, "pool": self.pool, "scored": self.scored, "pairs": self.pairs,
                "best": None if self.best is None else round(self.best, 4), "cpu_s": round(self.cpu_s, 4),
                "wall_s": round(self.wall_s, 4)}


def passage_units(h: Hit, raw: list[str] | None = None) -> list[str]:
    """The sentences and list items of a chunk (ragkit.retrieve.rank.units, or `raw`), each
    under the chunk's clause heading: what `retrieve.rerank_units` scores, the chunk taking
    its best."""
    from ragkit.retrieve.rank import units

    leaf = _leaf(h.meta.get("section"))
    return [f"{leaf}\n{u}" if leaf and not u.startswith(leaf) else u for u in (raw or units(h.text, h.meta) or [h.text])]


def table_digest(h: Hit) -> str:
    """What the cross-encoder reads for a table chunk in the table lane: its clause heading,
    its column headings and its row labels (the first cell of each row), not its figures.
    A statement table is mostly numbers the question does not name; its headings and row
    labels ("Total net sales", "Three Months Ended July 1, 2023") are what it is about, and
    the digest is one short pair where the rows would be dozens."""
    leaf = _leaf(h.meta.get("section"))
    rows = table_rows(h.text)
    if not rows:
        return passage_text(h)
    heads = " ".join(c for c in rows[0] if c)
    labels = "; ".join(r[0] for r in rows[1:] if r and r[0])
    return "\n".join(p for p in (leaf, heads, labels) if p)


def table_lane(ranked: list[Hit], pool: int, n: int) -> list[Hit]:
    """The table lane's candidates: the first `n` table chunks (ingest's `kind`) of the
    ranking after its first `pool`, best-ranked first."""
    if n <= 0:
        return []
    return [h for h in ranked[max(pool, 0):] if h.meta.get("kind") == "table"][:n]


def rerank_hits(query: str, ranked: list[Hit], reranker: Reranker, *, pool: int, weight: float, k: int = 60,
                budget_s: float = 0.0, batch: int = 16, by_units: bool = False,
                tables: int = 0, added: set[str] | None = None) -> tuple[list[Hit], RerankInfo]:
    """Score the first `pool` of `ranked` with `reranker` (in batches of `batch` chunks,
    best-ranked first, stopping once `budget_s` seconds are spent when it is > 0) and fuse
    with the current order (`fuse`). `by_units`: a chunk scores as its best sentence or list
    item (`passage_units`) instead of as a whole. `tables`: also score that many table chunks
    from beyond the pool (`table_lane`), each by its digest (`table_digest`), so a statement
    table the hybrid stages ranked low can still rise (and the best of them gets a place in the
    prompt: `ragkit.retrieve.pipeline.retrieve`). `added`: ids in the pool that the kind lane
    added, left out of the pool's best. Every hit comes back, scored by its
    fused score, so later stages and the prompt's "best first" read the fused order."""
    head = ranked[: max(pool, 0)]
    lane = table_lane(ranked, pool, tables)
    c0, w0 = time.process_time(), time.perf_counter()
    scores: dict[str, float] = {}
    pairs = 0
    unit_scores: dict[str, list[tuple[str, float]]] = {}
    if lane:  # one pair a table; scored first, since the pool's batches may stop at the time budget
        for h, s in zip(lane, reranker.score(query, [table_digest(h) for h in lane])):
            scores[h.id] = s
        pairs += len(lane)
    tables = [h.id for h in sorted(lane, key=lambda h: -scores[h.id])]
    for b in range(0, len(head), batch):
        part = head[b : b + batch]
        if by_units:
            from ragkit.retrieve.rank import units

            raw = [units(h.text, h.meta) or [h.text] for h in part]
            per = [passage_units(h, r) for h, r in zip(part, raw)]
            flat = reranker.score(query, [u for us in per for u in us])
            pairs += len(flat)
            at = 0
            for h, us, r in zip(part, per, raw):
                got = [float(x) for x in flat[at : at + len(us)]]
                scores[h.id] = max(got)
                unit_scores[h.id] = list(zip(r, got))
                at += len(us)
        else:
            for h, s in zip(part, reranker.score(query, [passage_text(h) for h in part])):
                scores[h.id] = s
            pairs += len(part)
        if budget_s > 0 and time.perf_counter() - w0 >= budget_s:
            break
    # the not_found floor (retrieve.rerank_abstain_below) reads the pool's best only: a table of
    # the lane is scored by its digest, not as a passage, and has a floor of its own
    # (retrieve.rerank_table_floor) for its place beside the top_k sources
    # (nor the kind lane's chunks, `added`: the floor was fitted on the first stage's pool, and a
    # contract that lacks a kind still has chunks the kinds model rates highest for it)
    pooled = [scores[h.id] for h in head if h.id in scores and h.id not in (added or ())]
    info = RerankInfo(backend=getattr(reranker, "name", type(reranker).__name__), pool=len(head) + len(lane), scored=len(scores),
                      best=max(pooled) if pooled else None, cpu_s=time.process_time() - c0,
                      wall_s=time.perf_counter() - w0, scores=scores, pairs=pairs, tables=tables,
                      floors=dict(getattr(reranker, "floors", None) or {}), units=unit_scores)
    if not scores:
        return ranked, info
    by_id = {h.id: h for h in ranked}
    out = [Hit(id=i, text=by_id[i].text, meta=by_id[i].meta, score=s) for i, s in fuse([h.id for h in ranked], scores, weight, k)]
    return out, info
