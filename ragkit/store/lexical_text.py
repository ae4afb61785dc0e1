"""What the lexical index reads, whichever engine holds it (`retrieve.lexical`: the segments
of ragkit.store.lexical, or tantivy, ragkit.store.lexical_tantivy): the analysis of a text
into tokens (stemmed words in their script, CJK bigrams, the heading as a field), the
fingerprint of a live document set, where an index lives, a document's chunks to index,
and the fusion of rankings."""

from __future__ import annotations

import hashlib
import re
import unicodedata
from functools import lru_cache
from pathlib import Path

# Scripts written without spaces between words: CJK ideographs, kana and Hangul syllables
# are indexed as overlapping character bigrams (no dictionary needed; jieba's is 20 MB).
_CJK = "\u3040-\u30ff\u31f0-\u31ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\uac00-\ud7af"
_CJK_RE = re.compile(rf"[{_CJK}]")
# any other letters or digits, in any script (accented Latin, Cyrillic, Greek ...), with
# the separators that keep "1,200.50" and "don't" one token
_TOKEN = re.compile(rf"[{_CJK}]+|[^\W_]+(?:[.,'’][^\W_]+)*")


def _stopwords() -> frozenset[str]:
    try:
        from bm25s.stopwords import STOPWORDS_EN

        return frozenset(STOPWORDS_EN)
    except ImportError:  # pragma: no cover
        return frozenset()


_STOP = _stopwords()
_STEMMERS: dict[str, object] = {}


@lru_cache(maxsize=500_000)
def _word(s: str) -> str:
    """One non-CJK word, lower case: Latin accents folded ("résiliation" ~ "resiliation"), then
    stemmed with Snowball for its script (English for Latin letters, Russian for
    Cyrillic, Greek for Greek; "obligations" ~ "obligation", "confidentiality" ~
    "confidential"). Cached: a corpus has few distinct words and Snowball is pure Python."""
    if not s.isascii():  # fold the accents of Latin letters only (Cyrillic "й" is a letter of its own)
        kept: list[str] = []
        for ch in unicodedata.normalize("NFD", s):
            if not (unicodedata.combining(ch) and kept and kept[-1].isascii()):
                kept.append(ch)
        s = unicodedata.normalize("NFC", "".join(kept))
    if s.endswith(("'s", "’s")):
        s = s[:-2]
    s = s.replace("’", "'")
    if s.isdigit() or not s[:1].isalpha():
        return s
    first = s[0]
    lang = "english" if first.isascii() else "russian" if "\u0400" <= first <= "\u04ff" else \
        "greek" if "\u0370" <= first <= "\u03ff" else None
    if lang is None:
        return s
    if lang not in _STEMMERS:
        import snowballstemmer

        _STEMMERS[lang] = snowballstemmer.stemmer(lang)
    return _STEMMERS[lang].stemWord(s)


def tokenize(text: str) -> list[str]:
    """Stemmed words (English stopwords dropped) for alphabetic scripts and character
    bigrams for CJK, kana and Hangul. bm25s's own tokenizer keeps only [a-z0-9] words and
    treats a whole Chinese sentence as one token, so this one is written here. The same
    tokens serve BM25, citation inference and compare's word matching."""
    text = unicodedata.normalize("NFKC", text).lower()
    out: list[str] = []
    for m in _TOKEN.finditer(text):
        s = m.group()
        if _CJK_RE.match(s):
            out.extend([s] if len(s) == 1 else [s[i : i + 2] for i in range(len(s) - 1)])
        elif s not in _STOP:
            w = _word(s)
            if w:
                out.append(w)
    return out


def index_text(text: str, meta: dict) -> str:
    """The text BM25 indexes for one chunk: its section path as a field of its own (the
    deepest heading repeated, so a question in the heading's words, "return or
    destruction", finds a clause whose body says "deliver up"), then the body."""
    section = (meta or {}).get("section") or ""
    if not section:
        return text
    leaf = section.rsplit(" > ", 1)[-1]
    return f"{section}\n{leaf}\n{text}"


def fingerprint(doc_ids) -> str:
    return hashlib.sha256("\n".join(sorted(set(doc_ids))).encode()).hexdigest()[:32]


def rrf(rankings: list[list[str]], k: int = 60, weights: list[float] | None = None) -> list[tuple[str, float]]:
    """Reciprocal rank fusion (Cormack et al. 2009): score = sum of w / (k + rank)."""
    scores: dict[str, float] = {}
    for n, ranking in enumerate(rankings):
        w = weights[n] if weights else 1.0
        for rank, item in enumerate(ranking, 1):
            scores[item] = scores.get(item, 0.0) + w / (k + rank)
    return sorted(scores.items(), key=lambda kv: -kv[1])


def index_dir(store_path: Path, url: str | None, collection: str, cache_dir: Path) -> Path:
    if url:
        safe = "".join(c if c.isalnum() else "_" for c in f"{url}_{collection}")
        return cache_dir / "bm25" / safe
    return store_path / "bm25"


def _doc_chunks(store, doc_id: str, n_chunks: int | None) -> tuple[list[str], list[str]]:
    """(chunk ids, texts to index) of one document: from its sidecar, else from Chroma."""
    hits = store.sidecars.hits(doc_id) if store.ensure_sidecar(doc_id, n_chunks) else None
    if hits is None:
        got = store.col.get(where={"doc_id": doc_id}, include=["documents", "metadatas"])
        from ragkit.store import Hit

        hits = sorted((Hit(id=i, text=t, meta=m, score=0.0) for i, t, m in zip(got["ids"], got["documents"], got["metadatas"])),
                      key=lambda h: (int(h.meta.get("chunk_index", 0)), h.id))
    return [h.id for h in hits], [index_text(h.text, h.meta) for h in hits]
