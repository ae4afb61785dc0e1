"""Lexical retrieval with bm25s, persisted next to the store and kept in sync with it.

The index is rebuilt from the store's live chunks after an ingest that changed anything
(bm25s has no incremental update; a rebuild of 10K chunks takes about a second). It
records a fingerprint of the live document versions it was built from; a reader whose
store no longer matches rebuilds in memory instead of using a stale index, so BM25 and
Chroma never disagree about which chunks exist.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import tempfile
import unicodedata
from pathlib import Path

import numpy as np

_CJK = "\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff"
_TOKEN = re.compile(rf"[{_CJK}]+|[a-z0-9]+(?:[.,'’][a-z0-9]+)*")


def _stopwords() -> frozenset[str]:
    try:
        from bm25s.stopwords import STOPWORDS_EN

        return frozenset(STOPWORDS_EN)
    except ImportError:  # pragma: no cover
        return frozenset()


_STOP = _stopwords()


def tokenize(text: str) -> list[str]:
    """Words for English (stopwords dropped, plurals folded) and character bigrams for
    Chinese. bm25s's own tokenizer treats a whole Chinese sentence as one token, so this
    one is written here; the bigram scheme needs no dictionary (jieba's is 20 MB)."""
    text = unicodedata.normalize("NFKC", text).lower()
    out: list[str] = []
    for m in _TOKEN.finditer(text):
        s = m.group()
        if "\u3400" <= s[0] <= "\ufaff":
            out.extend([s] if len(s) == 1 else [s[i : i + 2] for i in range(len(s) - 1)])
        elif s not in _STOP:
            if s.endswith(("'s", "’s")):
                s = s[:-2]
            if len(s) > 4 and s.endswith("s") and not s.endswith(("ss", "us", "is")):
                s = s[:-1]  # obligations -> obligation
            out.append(s.replace("’", "'"))
    return out


def fingerprint(doc_ids: list[str]) -> str:
    return hashlib.sha256("\n".join(sorted(set(doc_ids))).encode()).hexdigest()[:32]


class BM25Index:
    def __init__(self, retriever, ids: list[str], doc_ids: list[str], fp: str):
        self.retriever = retriever
        self.ids = ids
        self.doc_ids = np.asarray(doc_ids)
        self.fp = fp

    @classmethod
    def build(cls, ids: list[str], texts: list[str], doc_ids: list[str], fp: str) -> "BM25Index":
        import bm25s

        retriever = bm25s.BM25()
        if ids:
            retriever.index([tokenize(t) or ["\u2205"] for t in texts], show_progress=False)
        return cls(retriever, list(ids), list(doc_ids), fp)

    def save(self, folder: Path) -> None:
        """Write atomically: a temp folder, then a rename over the old one."""
        folder.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(dir=folder.parent, prefix=".bm25-"))
        try:
            if self.ids:
                self.retriever.save(str(tmp), show_progress=False)
            (tmp / "ragkit.json").write_text(json.dumps({"fingerprint": self.fp, "ids": self.ids, "doc_ids": self.doc_ids.tolist()}))
            old = folder.with_name(folder.name + ".old")
            if folder.exists():
                os.replace(folder, old)
            os.replace(tmp, folder)
            shutil.rmtree(old, ignore_errors=True)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)

    @classmethod
    def load(cls, folder: Path) -> "BM25Index | None":
        meta_path = folder / "ragkit.json"
        try:
            meta = json.loads(meta_path.read_text())
        except (OSError, ValueError):
            return None
        import bm25s

        if meta["ids"]:
            try:
                retriever = bm25s.BM25.load(str(folder), show_progress=False)
            except Exception:
                return None
        else:
            retriever = bm25s.BM25()
        return cls(retriever, meta["ids"], meta["doc_ids"], meta["fingerprint"])

    def search(self, query: str, k: int, doc_ids: list[str] | None = None) -> list[tuple[str, float]]:
        """(chunk id, score) best first, only chunks of `doc_ids` when given, score > 0 only."""
        if not self.ids:
            return []
        vocab = getattr(self.retriever, "vocab_dict", None) or {}
        q = [t for t in tokenize(query) if not vocab or t in vocab]
        if not q:
            return []
        mask = None
        if doc_ids is not None:
            mask = np.isin(self.doc_ids, list(doc_ids)).astype(np.float32)
            if not mask.any():
                return []
        k = min(k, len(self.ids))
        res, scores = self.retriever.retrieve([q], k=k, show_progress=False, weight_mask=mask, n_threads=1)
        return [(self.ids[int(i)], float(s)) for i, s in zip(res[0], scores[0]) if s > 0]


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


def live_corpus(store) -> tuple[list[str], list[str], list[str], str]:
    """ids, texts (section path + body, as embedded), doc ids and fingerprint of the
    chunks that the store's document records point to."""
    live = sorted({r.doc_id for r in store.documents()})
    fp = fingerprint(live)
    if not live:
        return [], [], [], fp
    got = store.col.get(include=["documents", "metadatas"])
    rows = [
        (i, f"{m.get('section', '')}\n{t}", m["doc_id"])
        for i, t, m in zip(got["ids"], got["documents"], got["metadatas"])
        if m.get("doc_id") in set(live)
    ]
    rows.sort()
    return [r[0] for r in rows], [r[1] for r in rows], [r[2] for r in rows], fp


def refresh(store, folder: Path) -> bool:
    """Rebuild and save the index when the store's live documents changed. Returns
    whether it rebuilt. Called by the writer, under the store's write lock."""
    live = sorted({r.doc_id for r in store.documents()})
    current = BM25Index.load(folder)
    if current is not None and current.fp == fingerprint(live):
        return False
    ids, texts, doc_ids, fp = live_corpus(store)
    BM25Index.build(ids, texts, doc_ids, fp).save(folder)
    return True


def open_index(store, folder: Path, live_doc_ids: list[str]) -> BM25Index:
    """The saved index when it matches the store, else one rebuilt in memory."""
    ix = BM25Index.load(folder)
    if ix is not None and ix.fp == fingerprint(live_doc_ids):
        return ix
    ids, texts, doc_ids, fp = live_corpus(store)
    return BM25Index.build(ids, texts, doc_ids, fp)
