"""One immutable segment of the hand-written lexical index (ragkit.store.lexical): an
inverted index over some documents' chunks, built, merged, saved and loaded, with the
analysis it was built by (`analyzer_id`)."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from collections import Counter
from functools import lru_cache
from pathlib import Path

import numpy as np

from ragkit.store.durable import fsync_dir, fsync_file, replace_durably, writing
from ragkit.store.lexical_text import index_text, tokenize

K1, B = 1.5, 0.75  # bm25s's defaults (its "lucene" method), so scores equal a bm25s index's
FORMAT = 2
_PROBE = ("The Recipient's obligations survive termination; résiliation 1,200.50 don't 第三条 乙方应当保密 "
          "Обязательства ΕΜΠΙΣΤΕΥΤΙΚΟΤΗΤΑ", {"section": "1. Definitions > 1.2 Return or Destruction"})


@lru_cache(maxsize=1)
def analyzer_id() -> str:
    """What the tokens of a text depend on: a saved segment built by another tokenizer or
    another `index_text` is not used (a change there changes this probe's tokens)."""
    toks = tokenize(index_text(*_PROBE))
    return hashlib.sha256(json.dumps([FORMAT, K1, B, toks]).encode()).hexdigest()[:16]


class Segment:
    """An immutable inverted index over the chunks of some documents: per term, the rows
    that hold it with the term's frequency there and the row's length. Statistics that
    depend on the whole collection (N, average length, document frequency) are not stored:
    they are combined over the live rows of all segments at query time, so adding or
    removing a document never rewrites a segment.

    Rows are grouped by document (`doc_ptr`), in chunk order, so the rows of one document
    are one range, and a query restricted to a few documents scores only their postings.
    """

    def __init__(self, name: str, doc_ids: list[str], doc_ptr, ids, dl, vocab: list[str], term_ptr, post_rows, post_tf, post_dl):
        self.name = name
        self.doc_ids = list(doc_ids)
        self.doc_ptr = np.asarray(doc_ptr, dtype=np.int64)
        self.ids = ids  # numpy bytes array, one chunk id per row
        self.dl = dl
        self.terms = vocab
        self.vocab = {t: i for i, t in enumerate(vocab)}
        self.term_ptr = term_ptr
        self.post_rows = post_rows
        self.post_tf = post_tf
        self.post_dl = post_dl
        self.where = {d: (int(self.doc_ptr[i]), int(self.doc_ptr[i + 1])) for i, d in enumerate(self.doc_ids)}

    @property
    def n_rows(self) -> int:
        return int(self.doc_ptr[-1]) if len(self.doc_ptr) else 0

    @classmethod
    def build(cls, docs: list[tuple[str, list[str], list[str]]], name: str | None = None) -> "Segment":
        """`docs`: (doc_id, chunk ids, texts to index) per document."""

        vocab: dict[str, int] = {}
        tids: list[int] = []
        rows: list[int] = []
        tfs: list[int] = []
        dls: list[int] = []
        ids: list[str] = []
        doc_ptr = [0]
        doc_ids = []
        for doc_id, cids, texts in docs:
            doc_ids.append(doc_id)
            for cid, text in zip(cids, texts):
                toks = tokenize(text)
                r = len(ids)
                ids.append(cid)
                dls.append(len(toks))
                for t, n in Counter(toks).items():
                    tids.append(vocab.setdefault(t, len(vocab)))
                    rows.append(r)
                    tfs.append(n)
            doc_ptr.append(len(ids))
        return cls._from_postings(name or _new_name(), doc_ids, doc_ptr, ids, np.asarray(dls, dtype=np.uint32),
                                  list(vocab), np.asarray(tids, dtype=np.int64), np.asarray(rows, dtype=np.int64),
                                  np.asarray(tfs, dtype=np.uint32))

    @classmethod
    def _from_postings(cls, name, doc_ids, doc_ptr, ids, dl, terms, tids, rows, tfs) -> "Segment":
        order = np.lexsort((rows, tids))
        tids, rows, tfs = tids[order], rows[order], tfs[order]
        term_ptr = np.searchsorted(tids, np.arange(len(terms) + 1)).astype(np.int64)
        dl16 = np.minimum(dl, 65535).astype(np.uint16)
        idarr = np.asarray([i.encode() for i in ids], dtype=bytes) if len(ids) else np.zeros(0, dtype="S1")
        return cls(name, doc_ids, doc_ptr, idarr, dl16, terms, term_ptr, rows.astype(np.int32),
                   np.minimum(tfs, 65535).astype(np.uint16), dl16[rows] if len(rows) else np.zeros(0, np.uint16))

    @classmethod
    def merge(cls, parts: list[tuple["Segment", set[str]]]) -> "Segment":
        """One segment holding the documents `keep` of each (segment, keep), from their
        postings (nothing is tokenized again)."""
        terms: dict[str, int] = {}
        doc_ids, doc_ptr, ids, dls = [], [0], [], []
        all_t, all_r, all_f = [], [], []
        base = 0
        for seg, keep in parts:
            rowmap = np.full(seg.n_rows, -1, dtype=np.int64)
            for i, d in enumerate(seg.doc_ids):
                if d not in keep:
                    continue
                a, b = int(seg.doc_ptr[i]), int(seg.doc_ptr[i + 1])
                rowmap[a:b] = np.arange(base, base + b - a)
                base += b - a
                doc_ids.append(d)
                doc_ptr.append(base)
                ids.extend(x.decode() for x in seg.ids[a:b])
                dls.append(np.asarray(seg.dl[a:b], dtype=np.uint32))
            remap = np.asarray([terms.setdefault(t, len(terms)) for t in seg.terms], dtype=np.int64)
            ptid = np.repeat(np.arange(len(seg.terms)), np.diff(np.asarray(seg.term_ptr)))
            newrows = rowmap[np.asarray(seg.post_rows, dtype=np.int64)] if len(seg.post_rows) else np.zeros(0, np.int64)
            ok = newrows >= 0
            all_t.append(remap[ptid[ok]] if len(remap) else np.zeros(0, np.int64))
            all_r.append(newrows[ok])
            all_f.append(np.asarray(seg.post_tf)[ok].astype(np.uint32))
        cat = lambda xs, dt: np.concatenate(xs).astype(dt) if xs else np.zeros(0, dt)  # noqa: E731
        return cls._from_postings(_new_name(), doc_ids, doc_ptr, ids, cat(dls, np.uint32), list(terms),
                                  cat(all_t, np.int64), cat(all_r, np.int64), cat(all_f, np.uint32))

    def save(self, folder: Path) -> None:
        """Write to `folder/<name>` (a temp folder renamed into place)."""
        tmp = folder / f".{self.name}.tmp"
        with writing(folder / self.name):
            try:
                shutil.rmtree(tmp, ignore_errors=True)
                tmp.mkdir(parents=True)
                for k in ("ids", "dl", "term_ptr", "post_rows", "post_tf", "post_dl"):
                    np.save(tmp / f"{k}.npy", np.asarray(getattr(self, k)))
                (tmp / "meta.json").write_text(json.dumps({"doc_ids": self.doc_ids, "doc_ptr": self.doc_ptr.tolist(),
                                                           "terms": self.terms, "analyzer": analyzer_id()}))
                for f in os.listdir(tmp):  # every file on disk before the folder is renamed in
                    fsync_file(tmp / f)
                fsync_dir(tmp)
                replace_durably(tmp, folder / self.name)
            except OSError:
                shutil.rmtree(tmp, ignore_errors=True)
                raise

    @classmethod
    def load(cls, path: Path) -> "Segment":
        meta = json.loads((path / "meta.json").read_text())
        if meta.get("analyzer") != analyzer_id():
            raise ValueError("built by another tokenizer")
        arr = {k: np.load(path / f"{k}.npy", mmap_mode="r") for k in ("ids", "dl", "term_ptr", "post_rows", "post_tf", "post_dl")}
        return cls(path.name, meta["doc_ids"], meta["doc_ptr"], arr["ids"], arr["dl"], meta["terms"], arr["term_ptr"],
                   arr["post_rows"], arr["post_tf"], arr["post_dl"])


def _new_name() -> str:
    import uuid

    return f"seg-{uuid.uuid4().hex[:16]}"
