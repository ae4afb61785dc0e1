"""Prompts packed from units: the cross-encoder scores each candidate's sentences and list
items (`retrieve.rerank_units`), and those scores decide what of a chunk enters the prompt.

Chunks stay the search index and the unit of ranking; what a source shows the model is
its chunk's units that the cross-encoder rated on the question, each in its smallest
whole clause (`ragkit.evidence.spans.excerpt`): the chunk's best `pack_per_chunk` units,
any unit within `pack_margin` logits of the best unit of the whole pool, and with
`pack_opening` the chunk's first sentence. A chunk whose best unit is more than `pack_drop`
logits under the pool's best is left out (once `pack_min_sources` sources are kept), so a
confident ranking packs fewer sources; an excerpt keeping more than `pack_keep_share` of its
chunk goes in as the whole chunk. A chunk the cross-encoder did not read (beyond its pool),
a table, and a document's opening for a question about its title, parties or date go in
whole (a preamble is one long sentence of names and addresses: its best-rated units are
"each a Party and, together, the Parties", not the names).

Figures: eval/README.md "Prompts packed from units", from eval/bench_ranking.py.
"""

from __future__ import annotations

from ragkit.evidence.spans import excerpt, stored_spans, unit_spans
from ragkit.store import Hit


def pack_units(hits: list[Hit], units: dict[str, list[tuple[str, float]]], *, margin: float, per_chunk: int,
               clause_words: int, drop: float | None = None, min_sources: int = 3, opening: bool = False,
               keep_share: float = 1.0, whole: set[str] | None = None) -> list[Hit]:
    """`hits` (ranked, best first) with each text cut to its chosen units; the hits
    `drop` leaves out are gone. `units`: chunk id -> (unit, cross-encoder score) in text order.
    `whole`: chunk ids that go in whole whatever their units' scores."""
    scored = [s for us in units.values() for _, s in us]
    if not scored:
        return hits
    best = max(scored)
    out: list[Hit] = []
    for h in hits:
        us = units.get(h.id)
        if not us or h.meta.get("kind") == "table" or h.id in (whole or ()):
            out.append(h)
            continue
        top = max(s for _, s in us)
        if drop is not None and len(out) >= min_sources and top < best - drop:
            continue
        # the units ingest stored beside the chunk (what the reranker scored, in its order),
        # else found back in the text (a store written before units were stored)
        stored = (stored_spans(h.text, h.meta.get("units")) or [])[: len(us)]
        spans = stored if [s.text for s in stored] == [u for u, _ in us] else unit_spans(h.text, [u for u, _ in us])
        if not spans:
            out.append(h)
            continue
        ranked = sorted(range(len(spans)), key=lambda i: -us[spans[i].index][1])
        chosen = set(ranked[: max(per_chunk, 1)]) | {i for i in ranked if us[spans[i].index][1] >= best - margin}
        if opening:  # a numbered clause's opening sentence says what the clause is ("8. Proprietary Information shall ...")
            chosen.add(0)
        text = excerpt(h.text, spans, sorted(chosen), clause_words)
        if len(text) > keep_share * len(h.text):
            text = h.text  # an excerpt that saves little is not worth a cut clause
        out.append(Hit(id=h.id, text=text or h.text, score=h.score, meta={**h.meta, "excerpt": text != h.text.strip()}))
    return out
