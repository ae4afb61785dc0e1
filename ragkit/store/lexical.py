"""Lexical retrieval (BM25), persisted next to the store and kept in sync with it, incrementally.

The index is a list of immutable segments (an inverted index over some documents' chunks)
and a manifest naming them and the live documents of each. An ingest indexes what it
added into a new segment and drops what it removed from the live lists; global statistics
are combined over the live rows at query time, so the result equals an index built from
scratch over the live chunks. The manifest records the fingerprint of the live document
versions it covers; a reader whose store does not match (a writer between its commit and
its index update, or one killed there) leaves out what is no longer live and indexes in
memory what is missing, so BM25 and Chroma never disagree about which chunks exist.
"""

from __future__ import annotations

import bisect
import json
import math
import os
import shutil
from pathlib import Path

import numpy as np

from ragkit.store.durable import replace_durably, writing
from ragkit.store.lexical_segment import _PROBE, FORMAT, K1, B, Segment, _new_name, analyzer_id  # noqa: E402,F401
from ragkit.store.lexical_text import (  # noqa: E402,F401  (re-exported: the names this module always had)
    _CJK,
    _CJK_RE,
    _STEMMERS,
    _STOP,
    _TOKEN,
    _doc_chunks,
    _stopwords,
    _word,
    fingerprint,
    index_dir,
    index_text,
    rrf,
    tokenize,
)


class BM25Index:
    """BM25 over the live documents of some segments.

    Why not bm25s (which this replaced): bm25s precomputes each posting's final score, which
    depends on N, the average length and document frequencies over the whole collection,
    so adding one document changes every stored score and it has no incremental update;
    rebuilding it from the store's texts made each ingest read the whole collection. Here
    a segment stores term frequencies and lengths only (an inverted index in numpy arrays,
    small enough to write by hand), and the scoring is bm25s's "lucene" BM25 with its
    defaults, computed from statistics of the live rows at query time: the result equals
    a from-scratch index over the live chunks (tests/test_bm25_incremental.py checks it
    against bm25s itself)."""

    def __init__(self, segments: list[Segment], live: dict[str, set[str]], fp: str | None = None):
        # live: segment name -> the documents whose rows count in that segment
        self.segments = segments
        self.live = live
        self.docs: dict[str, tuple[int, int, int]] = {}  # doc_id -> (segment index, first row, end row)
        masks = []
        n = 0
        total = 0.0
        for si, seg in enumerate(segments):
            keep = live.get(seg.name, set())
            if keep >= set(seg.doc_ids):
                masks.append(None)
                n += seg.n_rows
                total += float(np.asarray(seg.dl, dtype=np.float64).sum())
            else:
                m = np.zeros(seg.n_rows, dtype=bool)
                for d in keep:
                    a, b = seg.where[d]
                    m[a:b] = True
                masks.append(m)
                n += int(m.sum())
                total += float(np.asarray(seg.dl, dtype=np.float64)[m].sum())
            for d in keep:
                a, b = seg.where[d]
                self.docs[d] = (si, a, b)
        self.masks = masks
        self.n = n
        self.avgdl = total / n if n else 1.0
        self.offsets = np.cumsum([0] + [s.n_rows for s in segments]).tolist()
        self.fp = fp if fp is not None else fingerprint(self.docs)

    @property
    def ids(self) -> list[str]:
        """Every live chunk id (for tests and tools; a search does not need it)."""
        out = []
        for d, (si, a, b) in self.docs.items():
            out.extend(x.decode() for x in self.segments[si].ids[a:b])
        return out

    @classmethod
    def build(cls, ids: list[str], texts: list[str], doc_ids: list[str], fp: str | None = None) -> "BM25Index":
        """An in-memory index over chunks given as (id, text to index, doc_id)."""
        groups: dict[str, tuple[list[str], list[str]]] = {}
        for i, t, d in sorted(zip(ids, texts, doc_ids), key=lambda r: (r[2], r[0])):
            g = groups.setdefault(d, ([], []))
            g[0].append(i)
            g[1].append(t)
        seg = Segment.build([(d, g[0], g[1]) for d, g in groups.items()])
        return cls([seg], {seg.name: set(groups)})

    def save(self, folder: Path) -> None:
        """Write this index as the folder's whole content (segments, then the manifest)."""
        folder.mkdir(parents=True, exist_ok=True)
        for seg in self.segments:
            if not (folder / seg.name).exists():
                seg.save(folder)
        _write_manifest(folder, self.segments, self.live)

    @classmethod
    def load(cls, folder: Path) -> "BM25Index | None":
        """The index the folder's manifest describes, or None (no manifest, another
        tokenizer, a segment unreadable)."""
        got = _load_saved(folder)
        return None if got is None else got[0]

    def search(self, query: str, k: int, doc_ids: list[str] | None = None) -> list[tuple[str, float]]:
        """(chunk id, score) best first, only chunks of `doc_ids` when given, score > 0 only.
        Scores use the whole collection's statistics either way, so a restricted search
        returns the unrestricted ranking's hits of those documents."""
        from collections import Counter

        if not self.n or k <= 0:
            return []
        q = Counter(tokenize(query))
        if not q:
            return []
        # per query term: its postings in each segment and its document frequency over live rows
        terms = []
        for t, mult in q.items():
            per = []
            df = 0
            for si, seg in enumerate(self.segments):
                tid = seg.vocab.get(t)
                if tid is None:
                    continue
                a, b = int(seg.term_ptr[tid]), int(seg.term_ptr[tid + 1])
                m = self.masks[si]
                df += (b - a) if m is None else int(m[seg.post_rows[a:b]].sum())
                per.append((si, a, b))
            if df:
                idf = math.log(1 + (self.n - df + 0.5) / (df + 0.5))
                terms.append((mult * idf, per, df))
        if not terms:
            return []
        # float32 throughout: a Python float would make every posting's arithmetic float64
        c1, c2 = np.float32(K1 * (1 - B)), np.float32(K1 * B / self.avgdl)
        terms = [(np.float32(w), per, df) for w, per, df in terms]
        if doc_ids is None:
            scores = np.zeros(self.offsets[-1], dtype=np.float32)
            for w, per, _ in terms:
                for si, a, b in per:
                    seg = self.segments[si]
                    tf = seg.post_tf[a:b].astype(np.float32)
                    rows = seg.post_rows[a:b]
                    scores[self.offsets[si] + rows] += w * tf / (tf + c1 + c2 * seg.post_dl[a:b])
            for si, m in enumerate(self.masks):
                if m is not None:
                    scores[self.offsets[si] : self.offsets[si + 1]][~m] = 0
            cand = np.flatnonzero(scores > 0)
        else:
            spans = sorted(self.docs[d] for d in set(doc_ids) if d in self.docs)
            if not spans:
                return []
            acc: dict[int, np.ndarray] = {}
            for w, per, _ in terms:
                for si, a, b in per:
                    seg = self.segments[si]
                    rows = seg.post_rows[a:b]
                    for ssi, lo, hi in spans:
                        if ssi != si:
                            continue
                        x, y = np.searchsorted(rows, [lo, hi])
                        if x == y:
                            continue
                        tf = seg.post_tf[a + x : a + y].astype(np.float32)
                        key = self.offsets[si] + lo
                        buf = acc.setdefault(key, np.zeros(hi - lo, dtype=np.float32))
                        buf[np.asarray(rows[x:y]) - lo] += w * tf / (tf + c1 + c2 * seg.post_dl[a + x : a + y])
            if not acc:
                return []
            keys = sorted(acc)
            rowidx = np.concatenate([np.arange(key, key + len(acc[key])) for key in keys])
            flat = np.concatenate([acc[key] for key in keys])
            pos = np.flatnonzero(flat > 0)
            return self._top(rowidx[pos], flat[pos], k)
        return self._top(cand, scores[cand], k)

    def _top(self, rows, vals, k: int) -> list[tuple[str, float]]:
        if len(rows) > k:  # the k best (and any tied with the k-th)
            kth = np.partition(vals, len(vals) - k)[len(vals) - k]
            part = np.flatnonzero(vals >= kth)
            rows, vals = rows[part], vals[part]
        out = []
        for r, v in zip(rows.tolist(), vals.tolist()):
            si = bisect.bisect_right(self.offsets, r) - 1
            out.append((self.segments[si].ids[r - self.offsets[si]].decode(), v))
        out.sort(key=lambda h: (-h[1], h[0]))  # equal scores by chunk id: the same whatever the segments
        return out[:k]


# ---------------------------------------------------------------- the saved index
# `manifest.json` is the commit point: the segments in use and, per segment, the documents
# whose rows count (a document removed or replaced is dropped from that list, its rows stay
# until a merge). It is replaced atomically after the segments it names are written; a
# reader sees the old manifest or the new one, and a segment folder is deleted only once no
# manifest names it.

MERGE_FACTOR = 8  # segments of about the same size merged together (a log-structured merge)


def _write_manifest(folder: Path, segments: list[Segment], live: dict[str, set[str]]) -> None:
    docs = sorted(d for s in segments for d in live.get(s.name, ()))
    man = {"format": FORMAT, "analyzer": analyzer_id(), "fingerprint": fingerprint(docs),
           "segments": [{"name": s.name, "live": sorted(live.get(s.name, ()))} for s in segments]}
    tmp = folder / f".manifest.{os.getpid()}.tmp"
    with writing(folder / "manifest.json"):
        try:
            with open(tmp, "w") as f:
                f.write(json.dumps(man))
                f.flush()
                os.fsync(f.fileno())
            replace_durably(tmp, folder / "manifest.json")  # the commit point of the index
        except OSError:
            tmp.unlink(missing_ok=True)
            raise
    keep = {s.name for s in segments} | {"manifest.json"}
    for name in os.listdir(folder):  # segments no manifest names, and an older format's files
        if name not in keep and not name.startswith("."):
            p = folder / name
            shutil.rmtree(p, ignore_errors=True) if p.is_dir() else p.unlink(missing_ok=True)



def _read_manifest(folder: Path):
    try:
        st = os.stat(folder / "manifest.json")
        man = json.loads((folder / "manifest.json").read_text())
    except (OSError, ValueError):
        return None, None
    if man.get("format") != FORMAT or man.get("analyzer") != analyzer_id():
        return None, None
    return (st.st_ino, st.st_mtime_ns, st.st_size), man


def _load_saved(folder: Path, loaded: dict[str, Segment] | None = None):
    """(index, manifest key) of the saved index, or None. A segment that vanished under a
    concurrent writer's cleanup means a newer manifest: read again. `loaded`: segments read
    before, by path (a segment is immutable), kept by the caller."""
    segments = {} if loaded is None else loaded
    for _ in range(3):
        key, man = _read_manifest(folder)
        if man is None:
            return None
        try:
            segs = []
            for entry in man["segments"]:
                p = str(folder / entry["name"])
                if p not in segments:
                    segments[p] = Segment.load(Path(p))
                segs.append(segments[p])
        except (OSError, ValueError, KeyError):
            continue
        live = {e["name"]: set(e["live"]) for e in man["segments"]}
        names = {str(folder / e["name"]) for e in man["segments"]}
        for p in [p for p in segments if p.startswith(str(folder) + os.sep) and p not in names]:
            segments.pop(p, None)
        return BM25Index(segs, live), key
    return None


def _build_docs(store, doc_ids, n_chunks: dict[str, int]) -> Segment:
    return Segment.build([(d, *_doc_chunks(store, d, n_chunks.get(d))) for d in sorted(doc_ids)])


def _with_live(index: BM25Index, store, live: dict[str, int], rewritten: set[str] = frozenset()) -> tuple[list[Segment], dict[str, set[str]], bool]:
    """Segments and live lists covering exactly `live` (doc_id -> n_chunks): documents no
    longer live are dropped, `rewritten` ones and those not indexed are indexed into a new
    segment. Returns (segments, live lists, changed)."""
    segs = list(index.segments) if index is not None else []
    lv = {s.name: set(index.live.get(s.name, ())) if index is not None else set() for s in segs}
    changed = False
    covered: set[str] = set()
    for s in reversed(segs):  # a document in two segments counts in the newest
        keep = {d for d in lv[s.name] if d in live and d not in rewritten and d not in covered}
        if keep != lv[s.name]:
            changed = True
        lv[s.name] = keep
        covered |= keep
    for s in segs:  # a document removed and ingested again: its rows are still there
        revive = {d for d in s.doc_ids if d in live and d not in covered and d not in rewritten}
        if revive:
            lv[s.name] |= revive
            covered |= revive
            changed = True
    todo = set(live) - covered
    if todo:
        seg = _build_docs(store, todo, live)
        segs.append(seg)
        lv[seg.name] = set(todo)
        changed = True
    segs = [s for s in segs if lv[s.name]]
    return segs, {s.name: lv[s.name] for s in segs}, changed


def _merge_policy(segs: list[Segment], lv: dict[str, set[str]]) -> tuple[list[Segment], dict[str, set[str]]]:
    """Merge segments of about the same size (MERGE_FACTOR of one tier, by powers of
    MERGE_FACTOR in live rows), and compact one whose rows are mostly dead: a document's
    rows are rewritten O(log N) times over the life of the store, and one ingest writes
    what it added plus, now and then, a merge of segments no bigger than the new one's tier."""
    def live_rows(s):
        return sum(s.where[d][1] - s.where[d][0] for d in lv[s.name])

    while True:
        tiers: dict[int, list[Segment]] = {}
        for s in segs:
            tiers.setdefault(int(math.log(max(1, live_rows(s)), MERGE_FACTOR)), []).append(s)
        group = next((g for _, g in sorted(tiers.items()) if len(g) >= MERGE_FACTOR), None)
        if group is None:
            group = next(([s] for s in segs if live_rows(s) * 2 < s.n_rows), None)
        if group is None:
            return segs, lv
        merged = Segment.merge([(s, lv[s.name]) for s in group])
        segs = [s for s in segs if s not in group] + [merged]
        lv = {**{k: v for k, v in lv.items() if k not in {g.name for g in group}}, merged.name: set(merged.doc_ids)}


def refresh(store, folder: Path) -> bool:
    """Bring the saved index in line with the store's live documents: index the documents
    added (or rewritten by this process) into a new segment, drop the removed ones from
    the live lists, merge by the policy, then replace the manifest. Nothing is rebuilt
    that did not change, and nothing reads the whole collection. Returns whether it wrote.
    Called by the writer, under the store's write lock."""
    live = {r.doc_id: r.n_chunks for r in store.documents()}
    got = _load_saved(folder)
    index = got[0] if got is not None else None
    rewritten = set(getattr(store, "written", set())) & set(live)
    segs, lv, changed = _with_live(index, store, live, rewritten)
    if index is not None and not changed:
        return False
    segs, lv = _merge_policy(segs, lv)
    with writing(folder):
        folder.mkdir(parents=True, exist_ok=True)
    for s in segs:
        if not (folder / s.name).exists():
            s.save(folder)
    _write_manifest(folder, segs, lv)
    if hasattr(store, "written"):
        store.written.clear()
    return True


def open_index(store, folder: Path, live_doc_ids: list[str], memo: dict | None = None) -> BM25Index:
    """An index over exactly the live documents: the saved one when it matches the store;
    else the saved segments with the documents no longer live left out and the ones not
    indexed yet (a writer between its commit and its index update, or one that crashed
    there) indexed in memory. Kept in `memo` (a Session's) while the manifest and the live
    set stay the same, with the segments it loaded (immutable, so never stale)."""
    memo = {} if memo is None else memo
    opened = memo.setdefault("open", {})
    fp = fingerprint(live_doc_ids)
    try:
        st = os.stat(folder / "manifest.json")
        key = (st.st_ino, st.st_mtime_ns, st.st_size)
    except OSError:
        key = None
    cached = opened.get(str(folder))
    if cached is not None and cached[0] == key and cached[1] == fp:
        return cached[2]
    got = _load_saved(folder, memo.setdefault("segments", {}))
    index = got[0] if got is not None else None
    if index is not None and index.fp == fp:
        out = index
    else:
        n_chunks = {}
        if hasattr(store, "documents"):
            want = set(live_doc_ids)
            n_chunks = {r.doc_id: r.n_chunks for r in store.documents() if r.doc_id in want}
        live = {d: n_chunks.get(d) for d in live_doc_ids}
        segs, lv, _ = _with_live(index, store, live)
        out = BM25Index(segs, lv)
    opened[str(folder)] = (got[1] if got is not None else key, fp, out)
    return out
