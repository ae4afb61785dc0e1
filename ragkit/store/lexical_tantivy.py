"""The lexical index (BM25) on tantivy: the same surface as `ragkit.store.lexical`'s
(`open_index`, `refresh`, an index with `.search`, `.ids`, `.fp`, `.segments`), with
tantivy's segments, deletes, merges and crash-safe commits instead of hand-written ones.

What is indexed is ragkit's own analysis: each chunk's `lexical.index_text`, tokenized by
`lexical.tokenize` (stemmed words, CJK bigrams) and joined by spaces into a field that
tantivy's `whitespace` tokenizer splits back into exactly those tokens; a query is the
same tokens as term queries, so tantivy never analyses a word itself. Beside each chunk: its
`doc_id` (a raw fast field: deletes, and the filter of a restricted search, which scores
nothing) and its chunk id (stored).

Staleness. Beside tantivy's own commit point (`meta.json`) lies `ragkit-lexical.json`,
written durably after each commit: the analyzer, the commit's opstamp and the documents it
holds (and their fingerprint). A reader trusts that list only when its opstamp is the
committed one; a writer killed between the two (the commit done, the list not) leaves an
older opstamp, and the reader then counts the documents of the commit itself (a terms
aggregation over `doc_id`). Whatever the index holds, a reader whose store does not match
brings it in step, adding and deleting only the documents that changed (under tantivy's
writer lock, so a Chroma-server reader with no saved index builds one in its cache dir
once); where it cannot write (another writer holds the lock for long, a read-only folder)
it leaves out what is gone by a filter and, if something is missing, searches an index
built in memory over exactly the live documents. A stale index is never used.

Scores: tantivy's BM25 (k1 = 1.2, b = 0.75, document lengths kept as one byte each, the
statistics of a deleted row counted until its segment is merged), not bm25s's k1 = 1.5 with
exact lengths that `lexical` reproduces: the same best chunk almost always, a top 10 that
differs in order (the figures of eval/bench_ranking.py --lexical: ragkit/config.py, beside
`retrieve.lexical`).
"""

from __future__ import annotations

import json
import os
import time
from collections import Counter
from pathlib import Path

from ragkit.errors import StoreError
from ragkit.store import lexical
from ragkit.store.durable import replace_durably, writing

FORMAT = 1
STATE = "ragkit-lexical.json"
WRITER_HEAP = 64_000_000  # bytes; tantivy commits a segment when its buffer fills
LOCK_WAIT_S = 60.0  # a writer waits this long for another process's tantivy writer lock
READER_LOCK_WAIT_S = 2.0  # a reader waits less, then uses the filter or the in-memory index


def index_dir(store_path: Path, url: str | None, collection: str, cache_dir: Path) -> Path:
    """Beside the segments index's folder, never inside it (each cleans its own folder)."""
    if url:
        safe = "".join(c if c.isalnum() else "_" for c in f"{url}_{collection}")
        return Path(cache_dir) / "lexical-tantivy" / safe
    return Path(store_path) / "lexical-tantivy"


def _tv():
    import tantivy  # lazy: a Rust extension, loaded only where a lexical search or sync runs

    return tantivy


_SCHEMA = None


def _schema():
    global _SCHEMA
    if _SCHEMA is None:
        tv = _tv()
        sb = tv.SchemaBuilder()
        sb.add_text_field("text", tokenizer_name="whitespace", index_option="freq")
        sb.add_text_field("doc_id", fast=True, tokenizer_name="raw", index_option="basic")
        sb.add_text_field("id", stored=True, tokenizer_name="raw", index_option="basic")
        _SCHEMA = sb.build()
    return _SCHEMA


def _doc(tv, chunk_id: str, doc_id: str, text: str):
    return tv.Document(text=" ".join(lexical.tokenize(text)), doc_id=doc_id, id=chunk_id)


# ---------------------------------------------------------------- the state beside the commit

def _read_state(folder: Path) -> dict | None:
    try:
        st = json.loads((folder / STATE).read_text())
    except (OSError, ValueError):
        return None
    if st.get("format") != FORMAT or st.get("analyzer") != lexical.analyzer_id():
        return None
    return st


def _write_state(folder: Path, opstamp: int, docs) -> None:
    docs = sorted(docs)
    st = {"format": FORMAT, "analyzer": lexical.analyzer_id(), "opstamp": opstamp,
          "fingerprint": lexical.fingerprint(docs), "docs": docs}
    tmp = folder / f".{STATE}.{os.getpid()}.tmp"
    with writing(folder / STATE):
        try:
            with open(tmp, "w") as f:
                f.write(json.dumps(st))
                f.flush()
                os.fsync(f.fileno())
            replace_durably(tmp, folder / STATE)
        except OSError:
            tmp.unlink(missing_ok=True)
            raise


def _committed_opstamp(folder: Path) -> int | None:
    try:
        return int(json.loads((folder / "meta.json").read_text())["opstamp"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _key(folder: Path):
    out = []
    for name in ("meta.json", STATE):
        try:
            s = os.stat(folder / name)
            out.append((s.st_ino, s.st_mtime_ns, s.st_size))
        except OSError:
            out.append(None)
    return tuple(out)


def _alive_docs(searcher) -> set[str]:
    """The documents with live rows in the commit the searcher sees (deleted rows do not count)."""
    tv = _tv()
    n = int(searcher.num_docs)
    if not n:
        return set()
    try:
        got = searcher.aggregate(tv.Query.all_query(), {"d": {"terms": {"field": "doc_id", "size": n}}})
        return {b["key"] for b in got["d"]["buckets"]}
    except ValueError:  # more documents than an aggregation's buckets: read every row's chunk id
        res = searcher.search(tv.Query.all_query(), n, count=False)
        return {searcher.doc(a)["id"][0].rpartition(":")[0] for _, a in res.hits}


def _index(folder: Path, create: bool, opened: dict | None = None):
    """The tantivy index in `folder`, or None. With `create`, one is made (a folder that
    holds an index of another analyzer or format is emptied first). `opened`: indexes
    opened before, by folder (a Session's memo)."""
    tv = _tv()
    opened = {} if opened is None else opened
    key = str(folder)
    if key in opened and (folder / "meta.json").exists():
        return opened[key]
    opened.pop(key, None)
    has = (folder / "meta.json").exists()
    if not has and not create:
        return None
    if has and create and _read_state(folder) is None and (folder / STATE).exists():
        _wipe(folder, opened)  # built by another tokenizer or format: start again
        has = False
    if not has:
        with writing(folder):
            folder.mkdir(parents=True, exist_ok=True)
    try:
        idx = tv.Index(_schema(), path=str(folder), reuse=True)
    except ValueError as exc:
        if not create:
            return None
        if not has or _read_state(folder) is not None:  # ours, and yet unreadable: a disk error, not a rebuild
            raise StoreError(f"cannot open the lexical index at {folder}: {exc}",
                             hint="check the folder's permissions and free space, then run the command again") from None
        _wipe(folder, opened)  # another schema, with no state of ours beside it: start again
        try:
            idx = tv.Index(_schema(), path=str(folder), reuse=True)
        except ValueError as exc2:
            raise StoreError(f"cannot create the lexical index at {folder}: {exc2}",
                             hint="check the folder's permissions and free space, then run the command again") from None
    opened[key] = idx
    return idx


def _wipe(folder: Path, opened: dict) -> None:
    import shutil

    opened.pop(str(folder), None)
    with writing(folder):
        for name in os.listdir(folder):
            p = folder / name
            shutil.rmtree(p, ignore_errors=True) if p.is_dir() else p.unlink(missing_ok=True)


class _View:
    """One consistent look at the saved index: its searcher and the documents it holds."""

    def __init__(self, idx, searcher, docs: set[str], key):
        self.idx, self.searcher, self.docs, self.key = idx, searcher, docs, key


def _view(folder: Path, opened: dict | None = None) -> _View | None:
    if _read_state(folder) is None and (folder / STATE).exists():
        return None  # another analyzer: its tokens are not this code's
    for _ in range(5):
        k1 = _key(folder)
        if k1[0] is None:
            return None
        st = _read_state(folder)
        op = _committed_opstamp(folder)
        idx = _index(folder, create=False, opened=opened)
        if idx is None:
            return None
        try:
            idx.reload()
            searcher = idx.searcher()
        except ValueError:
            continue
        if _key(folder) != k1:
            continue  # a commit or a merge landed meanwhile: look again
        if st is not None and st["opstamp"] == op:
            docs = set(st["docs"])
        else:  # killed between tantivy's commit and the state (or no state yet): count the commit itself
            docs = _alive_docs(searcher)
        return _View(idx, searcher, docs, k1)
    return None


# ---------------------------------------------------------------- the index a search uses

class TantivyIndex:
    """BM25 over a tantivy searcher, restricted to `keep` (the live documents) when the
    commit also holds documents that are gone."""

    def __init__(self, idx, searcher, docs: set[str], keep: set[str] | None = None, fp: str | None = None):
        self.idx, self.searcher = idx, searcher
        self.docs = set(docs) if keep is None else set(docs) & set(keep)
        self.keep = None if keep is None or set(docs) <= set(keep) else set(keep)
        self.fp = fp if fp is not None else lexical.fingerprint(self.docs)

    @property
    def segments(self) -> list[int]:
        return list(range(int(self.searcher.num_segments)))

    @property
    def n(self) -> int:
        return int(self.searcher.num_docs)

    @property
    def ids(self) -> list[str]:
        """Every live chunk id (for tests and tools; a search does not need it)."""
        tv = _tv()
        q = tv.Query.all_query() if self.keep is None else self._filter(self.docs)
        if not self.docs or not self.n:
            return []
        res = self.searcher.search(q, self.n, count=False)
        return [self.searcher.doc(a)["id"][0] for _, a in res.hits]

    def _filter(self, docs):
        """Rows of `docs`, scoring 0. A few documents as term queries (a TermSetQuery costs
        about 0.2 ms more on 100K chunks), many as one TermSetQuery."""
        tv = _tv()
        schema = _schema()
        if len(docs) <= 16:
            terms = [tv.Query.term_query(schema, "doc_id", d, index_option="basic") for d in sorted(docs)]
            q = terms[0] if len(terms) == 1 else tv.Query.boolean_query([(tv.Occur.Should, t) for t in terms])
        else:
            q = tv.Query.term_set_query(schema, "doc_id", sorted(docs))
        return tv.Query.const_score_query(q, 0.0)

    def search(self, query: str, k: int, doc_ids: list[str] | None = None) -> list[tuple[str, float]]:
        """(chunk id, score) best first, only chunks of `doc_ids` when given, score > 0 only;
        scores use the whole collection's statistics either way (the filter scores 0)."""
        if k <= 0 or not self.n or not self.docs:
            return []
        q = Counter(lexical.tokenize(query))
        if not q:
            return []
        tv = _tv()
        schema = _schema()
        should = []
        for t, mult in q.items():
            tq = tv.Query.term_query(schema, "text", t, index_option="freq")
            should.append((tv.Occur.Should, tv.Query.boost_query(tq, float(mult)) if mult > 1 else tq))
        text = tv.Query.boolean_query(should)
        allowed = self.keep if doc_ids is None else set(doc_ids) & self.docs
        if allowed is not None:
            if not allowed:
                return []
            text = tv.Query.boolean_query([(tv.Occur.Must, text), (tv.Occur.Must, self._filter(allowed))])
        limit = 2 * k + 1  # room for ties (one-byte lengths make many): one search nearly always
        while True:  # the k best and every hit tied with the k-th (ties go by chunk id, as in `lexical`)
            hits = self.searcher.search(text, limit, count=False).hits
            if len(hits) < limit or hits[-1][0] < hits[k - 1][0]:
                break
            limit *= 4
        if not hits:
            return []
        kth = hits[min(k, len(hits)) - 1][0]
        out = [(self.searcher.doc(a)["id"][0], float(s)) for s, a in hits if s >= kth and s > 0]
        out.sort(key=lambda h: (-h[1], h[0]))
        return out[:k]


def _in_memory(store, live: dict[str, int | None]) -> TantivyIndex:
    """An index in RAM over exactly the live documents (the saved one cannot be brought in step)."""
    tv = _tv()
    idx = tv.Index(_schema())
    w = idx.writer(heap_size=WRITER_HEAP, num_threads=1)
    for d in sorted(live):
        ids, texts = lexical._doc_chunks(store, d, live[d])
        for i, t in zip(ids, texts):
            w.add_document(_doc(tv, i, d, t))
    w.commit()
    w.wait_merging_threads()
    idx.reload()
    return TantivyIndex(idx, idx.searcher(), set(live))


# ---------------------------------------------------------------- bringing the saved index in step

class _Busy(Exception):
    pass


def _writer(idx, wait_s: float):
    deadline = time.monotonic() + wait_s
    while True:
        try:
            return idx.writer(heap_size=WRITER_HEAP, num_threads=1)
        except ValueError as exc:
            if "LockBusy" not in str(exc):
                raise
            if time.monotonic() >= deadline:
                raise _Busy() from None
            time.sleep(0.05)


def _sync(store, folder: Path, live: dict[str, int | None], rewritten: set[str], wait_s: float,
          opened: dict | None = None) -> bool:
    """Make the saved index hold exactly `live` (doc_id -> n_chunks): delete the documents
    gone and the `rewritten` ones, add the missing ones, commit, then write the state.
    Returns whether it committed. Raises _Busy when another process keeps the writer lock."""
    tv = _tv()
    idx = _index(folder, create=True, opened=opened)
    w = _writer(idx, wait_s)
    try:
        idx.reload()
        st = _read_state(folder)
        op = _committed_opstamp(folder)
        if st is not None and st["opstamp"] == op:
            indexed = set(st["docs"])
        else:
            indexed = _alive_docs(idx.searcher()) if op is not None else set()
        want = set(live)
        gone = indexed - want
        redo = rewritten & indexed & want
        todo = sorted((want - indexed) | (rewritten & want))
        if not gone and not todo and st is not None and st["opstamp"] == op:
            return False  # nothing to do (the writer is rolled back and its lock let go below)
        try:
            for d in sorted(gone | redo):
                w.delete_documents_by_term("doc_id", d)
            for d in todo:
                ids, texts = lexical._doc_chunks(store, d, live[d])
                for i, t in zip(ids, texts):
                    w.add_document(_doc(tv, i, d, t))
            opstamp = w.commit()
        except ValueError as exc:  # tantivy reports an I/O failure (a full disk) as ValueError
            raise StoreError(f"cannot write the lexical index at {folder}: {exc}",
                             hint="free some disk space, then run the command again") from None
        _write_state(folder, opstamp, want)
        w.wait_merging_threads()  # merges finish here (the writer is spent)
        w = None
        return True
    finally:
        if w is not None:
            try:
                w.rollback()
            except ValueError:
                pass
        del w


def refresh(store, folder: Path, memo: dict | None = None) -> bool:
    """Bring the saved index in line with the store's live documents (the writer, after
    its commits): only the documents added, rewritten by this process or removed change.
    Returns whether it wrote."""
    live = {r.doc_id: r.n_chunks for r in store.documents()}
    rewritten = set(getattr(store, "written", set())) & set(live)
    try:
        wrote = _sync(store, folder, live, rewritten, LOCK_WAIT_S, (memo or {}).setdefault("tantivy_indexes", {}))
    except _Busy:
        raise StoreError(f"the lexical index at {folder} stayed locked by another process for {LOCK_WAIT_S:.0f} s",
                         hint="run the command again once the other ragkit process is done") from None
    if hasattr(store, "written"):
        store.written.clear()
    return wrote


def open_index(store, folder: Path, live_doc_ids: list[str], memo: dict | None = None) -> TantivyIndex:
    """An index over exactly the live documents: the saved one when it holds them; else the
    saved one brought in step (only the changed documents); else, where it cannot be
    written, the saved one filtered to the live documents, or one in memory when some are
    missing. Kept in `memo` (a Session's) while tantivy's commit, the state and the live set stay."""
    memo = {} if memo is None else memo
    last = memo.setdefault("tantivy_open", {})  # folder -> (files' key, live fingerprint, index)
    ram_of = memo.setdefault("tantivy_ram", {})  # folder -> (live fingerprint, in-memory index)
    opened = memo.setdefault("tantivy_indexes", {})  # folder -> tantivy.Index
    folder = Path(folder)
    fp = lexical.fingerprint(live_doc_ids)
    key = _key(folder)
    cached = last.get(str(folder))
    if cached is not None and cached[0] == key and cached[1] == fp:
        return cached[2]
    want = set(live_doc_ids)
    view = _view(folder, opened)
    if view is None or view.docs != want:
        n_chunks = {}
        if hasattr(store, "documents"):
            n_chunks = {r.doc_id: r.n_chunks for r in store.documents() if r.doc_id in want}
        live = {d: n_chunks.get(d) for d in want}
        try:
            _sync(store, folder, live, set(), READER_LOCK_WAIT_S, opened)
            view = _view(folder, opened)
        except (_Busy, OSError, StoreError, ValueError):
            pass  # cannot write here now: filter, or search in memory
    if view is not None and view.docs == want:
        out = TantivyIndex(view.idx, view.searcher, view.docs, fp=fp)
    elif view is not None and want <= view.docs:
        out = TantivyIndex(view.idx, view.searcher, view.docs, keep=want, fp=fp)
    else:
        ram = ram_of.get(str(folder))
        if ram is None or ram[0] != fp:
            ram = (fp, _in_memory(store, {d: n_chunks.get(d) for d in want}))
            ram_of[str(folder)] = ram
        out = ram[1]
    last[str(folder)] = (view.key if view is not None else _key(folder), fp, out)
    return out
