"""Ranking stages after hybrid search, at query time (nothing extra is stored at ingest).

- **Retrieve small, return whole** (`unit_rank`): each candidate chunk is cut into its
  heading and its sentences / list items; the question is scored against every unit by
  the embedder (cosine) and by words (stemmed, IDF-weighted over the candidates), and a
  chunk ranks by its best unit beside its hybrid rank (reciprocal rank fusion). The match
  is precise (one sentence, or the heading "Return or Destruction" of a clause whose body
  says "deliver up") and the source returned is the whole chunk. With named documents
  that are small enough, every chunk of them is a candidate, not only the hybrid top-k.
- **Diversity** (`drop_near_duplicates`): a candidate whose words are almost all those of
  a better-ranked one (running text repeated across quarterly filings, a table printed
  twice) is dropped before packing, so the budget is not spent twice.

Unit vectors are cached in process by text (a checklist asks one document many
questions; a conversation asks again), so a document's units are embedded once.
"""

from __future__ import annotations

import math
import re

from ragkit.store import Hit

MAX_UNITS_PER_CHUNK = 40


def units(text: str, meta: dict | None = None) -> list[str]:
    """Sentences and list items of a chunk (ragkit.evidence.sentences, the one splitter), pieces
    shorter than a few words joined to the next: those ingest stored beside the chunk
    (`meta["units"]`, ragkit.evidence.spans), else split now."""
    from ragkit.evidence.sentences import merge_short, split_units
    from ragkit.evidence.spans import stored_spans

    stored = stored_spans(text, (meta or {}).get("units"))
    if stored:
        return [s.text for s in stored][:MAX_UNITS_PER_CHUNK]
    return merge_short(split_units(text))[:MAX_UNITS_PER_CHUNK]


def _leaf(section: str | None) -> str:
    return (section or "").rsplit(" > ", 1)[-1].strip()


def _vectors(embedder, texts: list[str]) -> list[list[float]]:
    """Document-side vectors for `texts` (a Session's embedder remembers those it made)."""
    return embedder.embed_documents(list(texts)) if texts else []


def _rrf_scores(rankings: list[tuple[list[str], float]], k: int) -> dict[str, float]:
    scores: dict[str, float] = {}
    for ranking, w in rankings:
        for r, cid in enumerate(ranking, 1):
            scores[cid] = scores.get(cid, 0.0) + w / (k + r)
    return scores


def unit_rank(question: str, qvec: list[float] | None, ranked: list[Hit], pool: list[Hit], embedder, *,
              dense_weight: float = 1.0, lexical_weight: float = 0.5, hybrid_weight: float = 1.0,
              heading_weight: float = 0.5, rrf_k: int = 60) -> list[Hit]:
    """Rank `pool` (candidate chunks; `ranked` is the hybrid order, a subset of it) by the
    best-matching unit of each chunk, fused with the hybrid rank. Returns the pool best
    first, each Hit scored by the fused score."""
    import numpy as np

    from ragkit.store.lexical import tokenize

    if not pool:
        return ranked
    by_id = {h.id: h for h in pool}
    for h in ranked:
        by_id.setdefault(h.id, h)
    hits = list(by_id.values())
    chunk_units: list[list[str]] = []
    heads: list[str] = []
    for h in hits:
        heads.append(_leaf(h.meta.get("section")))
        chunk_units.append(units(h.text, h.meta) or [h.text])

    # words: IDF over the pool's units and headings, each unit scored by the IDF mass of
    # the question's words it holds (a heading counts `heading_weight` times)
    qwords = set(tokenize(question))
    unit_words = [[set(tokenize(u)) for u in us] for us in chunk_units]
    head_words = [set(tokenize(hd)) for hd in heads]
    df: dict[str, int] = {}
    n_units = 0
    for us, hw in zip(unit_words, head_words):
        for ws in us + [hw]:
            n_units += 1
            for w in ws & qwords:
                df[w] = df.get(w, 0) + 1
    idf = {w: math.log(1 + (n_units - df.get(w, 0) + 0.5) / (df.get(w, 0) + 0.5)) for w in qwords}
    total = sum(idf.values()) or 1.0

    def lex(ws: set[str]) -> float:
        return sum(idf[w] for w in ws & qwords) / total

    lex_scores = []
    for us, hw in zip(unit_words, head_words):
        best = max((lex(ws) for ws in us), default=0.0)
        lex_scores.append(best + heading_weight * lex(hw))

    rankings: list[tuple[list[str], float]] = []
    order = sorted(range(len(hits)), key=lambda i: -lex_scores[i])
    rankings.append(([hits[i].id for i in order if lex_scores[i] > 0], lexical_weight))
    if qvec is not None and dense_weight > 0:
        flat: list[str] = []
        owner: list[int] = []
        for i, (us, hd) in enumerate(zip(chunk_units, heads)):
            for u in us:
                flat.append(f"{hd}\n{u}" if hd else u)  # the unit in its clause's name, as chunks are embedded
                owner.append(i)
        vecs = np.asarray(_vectors(embedder, flat), dtype=np.float32)
        sims = vecs @ np.asarray(qvec, dtype=np.float32)
        best = np.full(len(hits), -1.0, dtype=np.float32)
        np.maximum.at(best, np.asarray(owner), sims)
        order = sorted(range(len(hits)), key=lambda i: -float(best[i]))
        rankings.append(([hits[i].id for i in order], dense_weight))
    rankings.append(([h.id for h in ranked], hybrid_weight))
    fused = _rrf_scores(rankings, rrf_k)
    out = sorted(hits, key=lambda h: -fused.get(h.id, 0.0))
    return [Hit(id=h.id, text=h.text, meta=h.meta, score=fused.get(h.id, 0.0)) for h in out]


def _shingles(text: str, n: int = 3) -> set[tuple[str, ...]]:
    words = re.findall(r"\w+", text.lower())
    if len(words) < n:
        return {tuple(words)} if words else set()
    return {tuple(words[i : i + n]) for i in range(len(words) - n + 1)}


def drop_near_duplicates(hits: list[Hit], threshold: float = 0.9) -> tuple[list[Hit], int]:
    """Keep the first of each group of near-duplicates: a hit is dropped when at least
    `threshold` of its word 3-grams occur in one better-ranked kept hit (containment, so a
    shorter repeat of a longer passage is dropped too). Written here: the candidates are a
    few dozen, so exact containment over word 3-grams is cheap and needs no MinHash
    library. Returns the kept hits and how many were dropped."""
    if threshold <= 0:
        return hits, 0
    kept: list[Hit] = []
    sets: list[set] = []
    dropped = 0
    for h in hits:
        s = _shingles(h.text)
        dup = bool(s) and any(len(s & k) >= threshold * len(s) for k in sets)
        if dup:
            dropped += 1
            continue
        kept.append(h)
        sets.append(s)
    return kept, dropped


# Questions about what a document's opening holds by convention: its title, its parties and
# its date (a contract's preamble, a filing's cover page). Words, not meaning: these
# questions share few words with the preamble ("Who signed?" vs "This Agreement is made
# between Acme Inc. and ..."), so neither BM25 nor the embedder ranks it first.
_OPENING = re.compile(
    r"(?:^\W*parties\b|\bparties (?:who|that) signed\b|\bwho (?:are|were) the parties\b|\bwho (?:signed|entered into)\b|"
    r"\bname of (?:the|this) (?:contract|agreement|document)\b|\b(?:document|contract|agreement) name\b|"
    r"\btitle of (?:the|this)\b|\bagreement date\b|\beffective date\b|\bdate of (?:the|this) (?:contract|agreement)\b|"
    r"\bwhen was (?:the|this) (?:contract|agreement) (?:signed|made|dated|entered))", re.I)


def asks_for_opening(question: str) -> bool:
    return bool(_OPENING.search(question))


OPENING_CHUNKS = 2  # a document's opening: its first chunks (a filing's exhibit legend, then the preamble)


def opening_first(question: str, ranked: list[Hit], pool: list[Hit] | None, n_first: int = OPENING_CHUNKS) -> list[Hit]:
    """For a question about a document's title, parties or date, the first `n_first` chunks
    of each document in `pool` (the named documents' chunks) go first: the opening is often
    a filing's exhibit legend before the preamble. The rest keep their order."""
    if not pool or not asks_for_opening(question):
        return ranked
    by_doc: dict[str, list[Hit]] = {}
    for h in pool:
        by_doc.setdefault(h.meta.get("doc_id", ""), []).append(h)
    heads = [h for hs in by_doc.values() for h in sorted(hs, key=lambda h: int(h.meta.get("chunk_index", 0)))[:n_first]]
    top = ranked[0].score if ranked else 1.0
    ids = {h.id for h in heads}
    return [Hit(id=h.id, text=h.text, meta=h.meta, score=top) for h in heads] + [h for h in ranked if h.id not in ids]
