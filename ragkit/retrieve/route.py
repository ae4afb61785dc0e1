"""Routing: a question asked of the whole store that names a document by who or what it is
("What is the FY2022 unadjusted EBITDA % margin for PepsiCo?", "What does the Bonterms NDA
say about ...") is searched in the documents it names, as if they had been named with
`--doc`.

A document is known by its opening (its first `OPENING` chunks: a filing's cover page, a
contract's title and parties) and its file name. A name in the question is a capitalised
word of it (or two adjacent ones written as one, "General Mills" for GENERALMILLS_2020_10K)
that is found in the openings or names of at most a third of the store's documents: a
company, a party, a product, a quarter in a file name. The documents holding the most of
those names, weighted by how rare each is in the store, are searched; none are when no
word is that rare, so a question that names nothing is asked of the whole store as before.
When several documents hold them (a company's filings), the years and quarters the question
names ("FY 2021", "Q3 2022", "the first quarter of 2023") keep those of them whose openings
or names hold the most of those periods (a cover gives its period: "For the fiscal year
ended December 31, 2021"); a period all of them hold, or none, keeps them all.

A long store of filings from many companies is where it pays: over the 15 financebench
filings the first stage reads the whole store's candidates, most from other companies'
filings (eval/README.md "Routing"). The routing and the words that made it are shown with
the answer (`Retrieval.routed`).
"""

from __future__ import annotations

import math
import re
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ragkit.session import Session
    from ragkit.store import DocRecord

OPENING = 3  # chunks of a document's opening read for its names (a 10-K's cover page runs over about 3)
MAX_SHARE = 1 / 3  # a name is a word found in at most this share of the store's documents
MIN_DOCS = 3  # a store of fewer documents is not routed (no word can be rare in it)

_WORD = re.compile(r"[A-Za-z][A-Za-z0-9&]*|(?<!\d)(?:19|20)\d\d(?!\d)")  # words, and years


def words(text: str) -> set[str]:
    """The lowercased words of `text`."""
    return {w.lower() for w in _WORD.findall(text)}


def file_words(name: str) -> set[str]:
    """The lowercased words of a file name (split at "_", "-", "." and spaces), not stemmed and
    two letters kept: not `ragkit.evidence.words.name_words`, which stems and drops words under
    three letters, and a file name's quarter ("2023 Q1 AAPL.pdf") is two."""
    return words(re.sub(r"[_\W]+", " ", name))


def names_in(question: str) -> list[tuple[str, str, bool]]:
    """The question's capitalised words and adjacent capitalised pairs, stop words and each
    sentence's first word left out (a capital there names nothing: "What", "Using",
    "Calculate"), in the question's order: (the key matched, lowercased; the words as
    written; whether it is a pair written as one, which only a file name can hold)."""
    from bm25s.stopwords import STOPWORDS_EN

    out: dict[str, tuple[str, str, bool]] = {}
    for sentence in re.split(r"[.?!:;]\s+", question):
        toks = _WORD.findall(sentence)
        for i, t in enumerate(toks):
            if i == 0 or len(t) < 2 or not t[0].isupper() or t.lower() in STOPWORDS_EN:
                continue
            out.setdefault(t.lower(), (t.lower(), t, False))
            if i + 1 < len(toks) and len(toks[i + 1]) > 1 and toks[i + 1][0].isupper():
                key = (t + toks[i + 1]).lower()
                out.setdefault(key, (key, f"{t} {toks[i + 1]}", True))
    return list(out.values())


def route(question: str, records: list["DocRecord"], openings: dict[str, set[str]]) -> tuple[list["DocRecord"], list[str]]:
    """The documents `question` names and the names that chose them (as the question writes
    them); ([], []) when it names none or names every document. `openings`: doc_id -> the
    words of its opening (`words`)."""
    n = len(records)
    if n < MIN_DOCS:
        return [], []
    # by record (a key): one content ingested under two file names is two records of one doc_id
    in_name = {r.key: file_words(r.name) for r in records}
    known = {r.key: openings.get(r.doc_id, set()) | in_name[r.key] for r in records}
    scores: dict[str, float] = {}
    used: dict[str, list[str]] = {}
    for key, shown, pair in names_in(question):
        holders = [d for d, ws in (in_name if pair else known).items() if key in ws]
        if not holders or len(holders) > n * MAX_SHARE:
            continue
        weight = math.log(n / len(holders))
        for d in holders:
            scores[d] = scores.get(d, 0.0) + weight
            used.setdefault(d, []).append(shown)
    if not scores:
        return [], []
    best = max(scores.values())
    chosen = [r for r in records if scores.get(r.key, 0.0) >= best - 1e-9]
    if len(chosen) >= n:
        return [], []
    names = list(dict.fromkeys(w for r in chosen for w in used[r.key]))
    if len(chosen) > 1:  # a company's filings: the period the question names, when some of them hold it
        chosen, more = _narrow(question, chosen, known)
        names += [w for w in more if w not in names]
    return chosen, names


def periods_in(question: str) -> list[tuple[str, str]]:
    """The years and quarters a question names: (the key matched, as written). "FY2022",
    "FY 2022" and "fiscal 2022" give 2022; "Q3" and "third quarter" give q3."""
    out: dict[str, str] = {}
    for m in re.finditer(r"\b(?:FY\s?|fiscal\s+(?:year\s+)?)?((?:19|20)\d\d)\b", question, re.I):
        out.setdefault(m.group(1), m.group(0))
    for m in re.finditer(r"\bQ([1-4])\b|\b(first|second|third|fourth)\s+quarter\b", question, re.I):
        q = m.group(1) or str(_ORDINAL[m.group(2).lower()])
        out.setdefault(f"q{q}", m.group(0))
    return list(out.items())


_ORDINAL = {"first": 1, "second": 2, "third": 3, "fourth": 4}


def _narrow(question: str, chosen: list["DocRecord"], known: dict[str, set[str]]) -> tuple[list["DocRecord"], list[str]]:
    """Of several routed documents, those holding the most of the years and quarters the
    question names (in their openings or file names: a filing's cover gives its period,
    "For the quarterly period ended June 25, 2022"), each weighted by its rarity among them;
    a period every one of them holds, or none, does not narrow."""
    n = len(chosen)
    scores: dict[str, float] = {}
    used: dict[str, list[str]] = {}
    for key, shown in periods_in(question):
        holders = [r.key for r in chosen if key in known[r.key]]
        if not holders or len(holders) >= n:
            continue
        for d in holders:
            scores[d] = scores.get(d, 0.0) + math.log(n / len(holders))
            used.setdefault(d, []).append(shown)
    if not scores:
        return chosen, []
    best = max(scores.values())
    narrowed = [r for r in chosen if scores.get(r.key, 0.0) >= best - 1e-9]
    return narrowed, list(dict.fromkeys(w for r in narrowed for w in used[r.key]))


def openings(session: "Session", records: list["DocRecord"]) -> dict[str, set[str]]:
    """doc_id -> the words of its first `OPENING` chunks, read once per session and document
    version (a doc_id is its content's hash), so a question reads no text."""
    memo = session.memo("route-openings")
    want = [r for r in records if r.doc_id not in memo]
    if want:
        ids = [f"{r.doc_id}:{i:05d}" for r in want for i in range(min(OPENING, r.n_chunks))]  # ids as ingest writes them
        got = session.store.hits(ids, {r.doc_id: r.n_chunks for r in want})
        for r in want:
            memo[r.doc_id] = words(" ".join(got[i].text for i in (f"{r.doc_id}:{k:05d}" for k in range(OPENING))
                                            if i in got))
    return {r.doc_id: memo[r.doc_id] for r in records}
