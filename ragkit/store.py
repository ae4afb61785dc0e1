"""The vector store: Chroma, embedded (PersistentClient) by default or a Chroma server.

Two collections:
- `<name>`: one record per chunk (embedding, text, metadata);
- `<name>-docs`: one record per document (the manifest). Writing a document's record is
  the commit point of its ingest: readers only see chunks whose `doc_id` (content hash)
  a document record points to, so a reader sees the old or the new version, never a mix,
  and chunks left behind by a crash are invisible until `gc()` removes them.
"""

from __future__ import annotations

import fcntl
import json
import os
import threading
import time
from collections import OrderedDict
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator, Protocol, TypeVar

from ragkit import __version__
from ragkit.durable import replace_durably, writing
from ragkit.errors import RagkitError, StoreError, StoreLocked

# 2: the store-version row (`_VERSION_ID`) in the -docs collection, bumped by every commit
# and removal, which readers key their record list on. A schema-1 store (no such row, or
# one an older writer never bumps) is read in full on every call and migrated to 2 by the
# first writer that opens it; from then on an older ragkit refuses it (it reads schema 1).
SCHEMA_VERSION = 2
MIGRATABLE = {1}
T = TypeVar("T")


@dataclass
class DocRecord:
    key: str  # stable key: absolute path of the source file
    doc_id: str  # content hash of the current version
    name: str  # file name shown in citations
    path: str
    sha256: str
    n_chunks: int
    n_sections: int
    n_pages: int | None
    ingested_at: float

    def to_meta(self) -> dict[str, Any]:
        d = {k: v for k, v in self.__dict__.items() if v is not None and k != "key"}
        return d

    @classmethod
    def from_meta(cls, key: str, m: dict[str, Any]) -> "DocRecord":
        return cls(
            key=key,
            doc_id=m["doc_id"],
            name=m["name"],
            path=m["path"],
            sha256=m["sha256"],
            n_chunks=int(m["n_chunks"]),
            n_sections=int(m.get("n_sections", 0)),
            n_pages=m.get("n_pages"),
            ingested_at=float(m.get("ingested_at", 0)),
        )


@dataclass
class Hit:
    id: str
    text: str
    meta: dict[str, Any]
    score: float  # higher is better


class VectorStore(Protocol):
    def documents(self) -> list[DocRecord]: ...
    def add_chunks(self, ids: list[str], embeddings: list[list[float]], texts: list[str], metas: list[dict]) -> None: ...
    def read_consistent(self, read: Callable[[list[DocRecord]], T], attempts: int = 5) -> T: ...
    def commit_document(self, record: DocRecord) -> None: ...
    def remove_document(self, key: str) -> DocRecord | None: ...
    def query(self, embedding: list[float], k: int, doc_ids: list[str], *, all_live: bool = False) -> list[Hit]: ...
    def chunks(self, doc_ids: list[str]) -> list[Hit]: ...
    def gc(self) -> int: ...
    def count(self) -> int: ...


_VERSION_ID = "__ragkit_store_version__"  # a row of the -docs collection, not a document
_DOC_CACHE: dict[tuple, tuple[str, list]] = {}  # (store, collection) -> (version, records)


class Sidecars:
    """Per-document copies of what the store holds for each `doc_id`: chunk ids, unit
    vectors, texts and metadata, one file per doc_id beside the store (or in the cache
    folder for a Chroma server store).

    A doc_id is the content hash of its file, and its chunks are written once, before its
    record is committed, so a sidecar never goes stale; it is written by `add_chunks`, from
    the very lists given to Chroma. What it buys: a query restricted to a few documents is
    a numpy dot product over their few vectors (Chroma's `where` pre-filter cost 509 ms at
    100K chunks), and texts and metadata of hits are read without a Chroma round trip
    (Chroma's `include=["documents", "metadatas"]` costs about 0.1 ms per result). A doc_id
    without a sidecar (a store written before they existed, or a document another machine
    wrote to a server) is built from Chroma, one document at a time, on first use.

    File layout (hand-written rather than `.npz`: a zip container costs a member lookup per
    array, and a hit needs only a few hundred bytes of the file): magic, header length,
    a JSON header, then the vectors (float32, n x dim), the chunk texts and the metadata
    (JSON) as UTF-8 blobs with their offsets in the header.
    """

    MAGIC = b"RKSIDE01"

    def __init__(self, folder: Path | None, cache_size: int = 4096):
        self.folder = folder
        self._headers: "OrderedDict[str, tuple]" = OrderedDict()
        self._vecs: "OrderedDict[str, tuple]" = OrderedDict()
        self.cache_size = cache_size
        self._lock = threading.Lock()

    def path(self, doc_id: str) -> Path:
        assert self.folder is not None
        return self.folder / f"{doc_id}.side"

    # ---------------------------------------------------------------- writing

    def write(self, doc_id: str, ids: list[str], vectors, texts: list[str], metas: list[dict]) -> None:
        """Write (atomically) the sidecar of one doc_id; rows are ordered by chunk_index."""
        import numpy as np

        if self.folder is None:
            return
        order = sorted(range(len(ids)), key=lambda i: (int(metas[i].get("chunk_index", 0)), ids[i]))
        vec = np.asarray(vectors, dtype=np.float32).reshape(len(ids), -1)[order] if ids else np.zeros((0, 0), np.float32)
        norms = np.linalg.norm(vec, axis=1, keepdims=True) if len(vec) else np.zeros((0, 1), np.float32)
        vec = vec / np.where(norms == 0, 1, norms)
        tb = [texts[i].encode() for i in order]
        mb = [json.dumps(metas[i], separators=(",", ":")).encode() for i in order]
        t_off = np.cumsum([0] + [len(b) for b in tb]).tolist()
        m_off = np.cumsum([0] + [len(b) for b in mb]).tolist()
        vbytes = vec.astype(np.float32).tobytes()
        header = {"doc_id": doc_id, "n": len(ids), "dim": int(vec.shape[1]) if len(vec) else 0,
                  "ids": [ids[i] for i in order], "text_off": t_off, "meta_off": m_off}
        hb = json.dumps(header, separators=(",", ":")).encode()
        base = 16 + len(hb)
        pad = (-base) % 64
        body = self.MAGIC + len(hb).to_bytes(8, "little") + hb + b"\0" * pad
        tmp = self.folder / f".{doc_id}.{os.getpid()}.{threading.get_ident()}.tmp"
        with writing(self.path(doc_id)):
            try:
                self.folder.mkdir(parents=True, exist_ok=True)
                with open(tmp, "wb") as f:
                    f.write(body)
                    f.write(vbytes)
                    f.write(b"".join(tb))
                    f.write(b"".join(mb))
                    f.flush()
                    os.fsync(f.fileno())
                replace_durably(tmp, self.path(doc_id))
            except OSError:
                tmp.unlink(missing_ok=True)
                raise

    def add(self, ids, embeddings, texts, metas) -> None:
        """Mirror an upsert of chunks into the sidecars of their doc_ids (merging with what
        a sidecar already holds, as Chroma's upsert does)."""
        groups: dict[str, list[int]] = {}
        for i, m in enumerate(metas):
            groups.setdefault(str(m.get("doc_id", "")), []).append(i)
        for doc_id, rows in groups.items():
            if not doc_id:
                continue
            have = self.read_all(doc_id)
            merged: dict[str, tuple] = {}
            if have is not None:
                for h, v in zip(have[0], have[1]):
                    merged[h.id] = (v, h.text, h.meta)
            for i in rows:
                merged[ids[i]] = (embeddings[i], texts[i], {k: v for k, v in metas[i].items() if v is not None})
            keys = list(merged)
            self.write(doc_id, keys, [merged[k][0] for k in keys], [merged[k][1] for k in keys], [merged[k][2] for k in keys])

    def remove(self, doc_id: str) -> None:
        if self.folder is None:
            return
        with writing(self.path(doc_id)):
            try:
                os.unlink(self.path(doc_id))
            except FileNotFoundError:
                pass
        with self._lock:
            self._headers.pop(doc_id, None)
            self._vecs.pop(doc_id, None)

    def doc_ids(self) -> set[str]:
        if self.folder is None or not self.folder.is_dir():
            return set()
        return {n[:-5] for n in os.listdir(self.folder) if n.endswith(".side") and not n.startswith(".")}

    # ---------------------------------------------------------------- reading

    def _header(self, doc_id: str):
        """(stat key, header, data offset) of a sidecar, cached while the file is unchanged;
        None when there is none."""
        if self.folder is None:
            return None
        p = self.path(doc_id)
        try:
            st = os.stat(p)
        except OSError:
            return None
        key = (st.st_ino, st.st_mtime_ns, st.st_size)
        with self._lock:
            got = self._headers.get(doc_id)
            if got is not None and got[0] == key:
                self._headers.move_to_end(doc_id)
                return got
        try:
            with open(p, "rb") as f:
                head = f.read(65536)
                if head[:8] != self.MAGIC:
                    return None
                hl = int.from_bytes(head[8:16], "little")
                if 16 + hl > len(head):
                    head += f.read(16 + hl - len(head))
            header = json.loads(head[16 : 16 + hl])
        except (OSError, ValueError):
            return None
        base = 16 + hl + ((-(16 + hl)) % 64)
        header["index"] = {cid: i for i, cid in enumerate(header["ids"])}
        got = (key, header, base)
        with self._lock:
            self._headers[doc_id] = got
            while len(self._headers) > self.cache_size:
                self._headers.popitem(last=False)
        return got

    def count(self, doc_id: str) -> int | None:
        h = self._header(doc_id)
        return None if h is None else h[1]["n"]

    def vectors(self, doc_id: str):
        """(ids, unit vectors n x dim) of one doc_id, or None."""
        import numpy as np

        h = self._header(doc_id)
        if h is None:
            return None
        key, header, base = h
        with self._lock:
            got = self._vecs.get(doc_id)
            if got is not None and got[0] == key:
                self._vecs.move_to_end(doc_id)
                return header["ids"], got[1]
        n, dim = header["n"], header["dim"]
        try:
            with open(self.path(doc_id), "rb") as f:
                f.seek(base)
                raw = f.read(n * dim * 4)
        except OSError:
            return None
        if len(raw) != n * dim * 4:
            return None
        vec = np.frombuffer(raw, dtype=np.float32).reshape(n, dim) if n else np.zeros((0, dim), np.float32)
        with self._lock:
            self._vecs[doc_id] = (key, vec)
            while len(self._vecs) > 64:
                self._vecs.popitem(last=False)
        return header["ids"], vec

    def hits(self, doc_id: str, rows: list[int] | None = None) -> list[Hit] | None:
        """Hits (text and metadata) of the given rows of one doc_id (all rows when None)."""
        h = self._header(doc_id)
        if h is None:
            return None
        _, header, base = h
        n, dim = header["n"], header["dim"]
        to, mo = header["text_off"], header["meta_off"]
        tbase = base + n * dim * 4
        mbase = tbase + to[-1]
        rows = list(range(n)) if rows is None else rows
        out = []
        try:
            with open(self.path(doc_id), "rb") as f:
                if len(rows) > 8:  # most of the file: one read
                    f.seek(tbase)
                    blob = f.read(to[-1] + mo[-1])
                    for r in rows:
                        out.append(Hit(id=header["ids"][r], text=blob[to[r] : to[r + 1]].decode(),
                                       meta=json.loads(blob[to[-1] + mo[r] : to[-1] + mo[r + 1]]), score=0.0))
                else:
                    fd = f.fileno()
                    for r in rows:
                        t = os.pread(fd, to[r + 1] - to[r], tbase + to[r]).decode()
                        m = json.loads(os.pread(fd, mo[r + 1] - mo[r], mbase + mo[r]))
                        out.append(Hit(id=header["ids"][r], text=t, meta=m, score=0.0))
        except (OSError, ValueError):
            return None
        return out

    def row_of(self, doc_id: str, chunk_id: str) -> int | None:
        h = self._header(doc_id)
        return None if h is None else h[1]["index"].get(chunk_id)

    def read_all(self, doc_id: str):
        """(hits, vectors) of one doc_id, or None."""
        got = self.vectors(doc_id)
        hits = self.hits(doc_id)
        if got is None or hits is None:
            return None
        return hits, got[1]


@contextmanager
def chroma_write(store: "ChromaStore") -> Iterator[None]:
    """A write to Chroma that fails (a full disk under the embedded store, a server that went
    away) is a store error naming the store, not a traceback; nothing was committed."""
    try:
        yield
    except RagkitError:
        raise
    except Exception as exc:
        where = store.url or str(store.path)
        first = (str(exc).splitlines() or [type(exc).__name__])[0][:200]
        raise StoreError(f"cannot write to the Chroma store at {where}: {first}",
                         hint="free some disk space (or check the server), then run the command again; "
                         "documents already committed are kept") from None


class ChromaStore:
    # a query restricted to documents holding at most this many chunks is an exact numpy
    # search over their sidecars instead of Chroma's (slow) `where` pre-filter
    SIDECAR_SEARCH_MAX = 20000

    def __init__(self, path: Path, *, url: str | None, collection: str, embedder_name: str, dim: int, create: bool,
                 cache_dir: Path | None = None):
        import chromadb
        from chromadb.config import Settings as ChromaSettings

        self.path = path
        self.url = url
        chroma_settings = ChromaSettings(anonymized_telemetry=False, allow_reset=False)
        try:
            if url:
                self.client = self.connect(url)
            else:
                if not create and not (path / "chroma").exists():
                    raise StoreError(f"no ragkit store at {path}", hint="run `ragkit ingest PATH` first, or pass --store")
                path.mkdir(parents=True, exist_ok=True)
                self.client = chromadb.PersistentClient(path=str(path / "chroma"), settings=chroma_settings)
        except StoreError:
            raise
        except Exception as exc:  # connection refused, bad sqlite file...
            where = url or str(path)
            raise StoreError(f"cannot open the Chroma store at {where}: {str(exc).splitlines()[0][:200]}") from None
        self.name = collection
        identity = {"embedder": embedder_name, "dim": dim, "schema": SCHEMA_VERSION, "ragkit": __version__}
        try:
            existing = {c.name if hasattr(c, "name") else c for c in self.client.list_collections()}
        except Exception as exc:
            raise StoreError(f"cannot list collections: {exc}") from None
        self.schema = SCHEMA_VERSION
        if collection in existing:
            self.col = self.client.get_collection(collection, embedding_function=None)
            self._check_identity(self.col.metadata or {}, identity)
            self.schema = int((self.col.metadata or {}).get("schema", SCHEMA_VERSION))
        elif create:
            self.col = self.client.create_collection(
                collection, embedding_function=None, configuration={"hnsw": {"space": "cosine"}}, metadata=identity
            )
        else:
            raise StoreError(f"the store at {url or path} has no collection {collection!r}", hint="run `ragkit ingest` first")
        self.docs = self.client.get_or_create_collection(
            f"{collection}-docs", embedding_function=None, metadata={"schema": SCHEMA_VERSION}
        )
        if create and self.schema < SCHEMA_VERSION:
            self.migrate()
        # derived, per-machine data (sidecars, the write journal) lives beside an embedded
        # store, and in the cache folder for a server store
        if url:
            safe = "".join(c if c.isalnum() else "_" for c in f"{url}_{collection}")
            local = (cache_dir / "stores" / safe) if cache_dir is not None else None
        else:
            local = path
        self.local = local
        self.sidecars = Sidecars(local / "sidecars" if local is not None else None)
        self.written: set[str] = set()  # doc_ids whose chunks this process wrote (the lexical index re-reads them)
        # a writer's check before each write (StoreWriter.check: the server lease still held)
        self.guard: Callable[[], None] | None = None

    @staticmethod
    def connect(url: str):
        """A client for the Chroma server at `url` ("http://host:port", or "host:port")."""
        import chromadb
        from chromadb.config import Settings as ChromaSettings
        from urllib.parse import urlparse

        u = urlparse(url if "://" in url else f"http://{url}")  # "127.0.0.1:8000" has no scheme
        if u.scheme not in ("http", "https"):
            raise StoreError(f"store_url {url!r} is not an http:// or https:// URL")
        try:
            client = chromadb.HttpClient(
                host=u.hostname or "127.0.0.1",
                port=u.port or (443 if u.scheme == "https" else 8000),
                ssl=u.scheme == "https",
                settings=ChromaSettings(anonymized_telemetry=False, allow_reset=False),
            )
            client.heartbeat()
        except Exception as exc:  # connection refused, TLS...
            raise StoreError(f"cannot open the Chroma store at {url}: {str(exc).splitlines()[0][:200]}") from None
        return client

    def _check_identity(self, have: dict, want: dict) -> None:
        if have.get("schema", SCHEMA_VERSION) > SCHEMA_VERSION:
            raise StoreError(
                f"this store was written by a newer ragkit (schema {have.get('schema')}, ragkit {have.get('ragkit')}); "
                f"this ragkit {__version__} reads schema {SCHEMA_VERSION}",
                hint="upgrade ragkit",
            )
        if have.get("schema", SCHEMA_VERSION) < SCHEMA_VERSION and int(have.get("schema")) not in MIGRATABLE:
            raise StoreError(f"this store uses an old schema {have.get('schema')}", hint="re-ingest into a new --store")
        if have.get("embedder") != want["embedder"] or int(have.get("dim", -1)) != want["dim"]:
            raise StoreError(
                f"this store was built with embedder {have.get('embedder')!r} ({have.get('dim')}-dim), "
                f"but the settings use {want['embedder']!r} ({want['dim']}-dim); vectors of two models cannot be mixed",
                hint=f"set embed.model = {have.get('embedder')!r}, or ingest into another --store",
            )

    def _check_writer(self) -> None:
        if self.guard is not None:
            self.guard()

    def migrate(self) -> None:
        """Schema 1 -> 2, by a writer (it holds the store's write lock): a fresh version row,
        then the new schema on both collections. The records and chunks are unchanged. A
        crash between the steps leaves schema 1, which the next writer migrates again."""
        self.bump_version()
        for col in (self.docs, self.col):
            meta = {k: v for k, v in (col.metadata or {}).items() if not k.startswith("hnsw:")}
            col.modify(metadata={**meta, "schema": SCHEMA_VERSION, "ragkit": __version__})
        self.schema = SCHEMA_VERSION

    # ------------------------------------------------------------ documents

    def documents(self) -> list[DocRecord]:
        """Every document record, sorted by name. Reading them all costs about 47 ms at 500
        documents and 480 ms at 5,000 (Chroma returns every record's metadata), and
        `retrieve` reads them twice per question (`read_consistent`); so the list is kept
        per store, keyed by the store's version: a record every writer replaces with a new
        random value on each commit and removal (`bump_version`), read by id (one row). A store
        with no version record yet (written before it existed) is read in full each time."""
        version = self._version()
        key = self._cache_key()
        hit = _DOC_CACHE.get(key)
        if version is not None and hit is not None and hit[0] == version:
            return list(hit[1])
        got = self.docs.get(include=["metadatas"])
        recs = [DocRecord.from_meta(i, m) for i, m in zip(got["ids"], got["metadatas"] or []) if i != _VERSION_ID]
        recs = sorted(recs, key=lambda r: (r.name, r.key))
        if version is not None:
            if len(_DOC_CACHE) > 64:
                _DOC_CACHE.clear()
            _DOC_CACHE[key] = (version, recs)
        return list(recs)

    def _cache_key(self) -> tuple:
        return (self.url or str(Path(self.path).resolve()), self.name)

    def _version(self) -> str | None:
        if self.schema < 2:  # an older writer may commit without bumping the row: read in full
            return None
        got = self.docs.get(ids=[_VERSION_ID], include=["metadatas"])
        return str((got["metadatas"] or [{}])[0].get("nonce")) if got["ids"] else None

    def bump_version(self) -> None:
        """A new store version: after a record is committed or removed, and before the
        chunks it replaced are deleted, so a reader holding the old version's records
        (and chunks) sees the change when `read_consistent` checks again."""
        import uuid

        self.docs.upsert(ids=[_VERSION_ID], embeddings=[[0.0]], metadatas=[{"nonce": uuid.uuid4().hex}])
        _DOC_CACHE.pop(self._cache_key(), None)

    def read_consistent(self, read: Callable[[list[DocRecord]], T], attempts: int = 5) -> T:
        """`read(records)` on one version of the store. A writer commits a document by
        replacing its record, then deletes the old version's chunks; if the records
        changed while we read, read again, so what `read` saw comes from one version of
        each document (the old or the new, never a mix)."""
        out: T
        for _ in range(max(1, attempts)):
            records = self.documents()
            out = read(records)
            if [(r.key, r.doc_id) for r in self.documents()] == [(r.key, r.doc_id) for r in records]:
                break
        return out

    def commit_document(self, record: DocRecord) -> None:
        """The commit point: one upsert of one record. The version it replaces is noted in
        the journal first, so a crash before its chunks are deleted leaves work for `gc`."""
        self._check_writer()
        got = self.docs.get(ids=[record.key], include=["metadatas"])
        if got["ids"]:
            old = (got["metadatas"] or [{}])[0].get("doc_id")
            if old and old != record.doc_id:
                self._journal([old])
        with chroma_write(self):
            self.docs.upsert(ids=[record.key], embeddings=[[0.0]], metadatas=[record.to_meta()])
            self.bump_version()

    def remove_document(self, key: str) -> DocRecord | None:
        self._check_writer()
        got = self.docs.get(ids=[key], include=["metadatas"])
        if not got["ids"]:
            return None
        rec = DocRecord.from_meta(key, got["metadatas"][0])
        self._journal([rec.doc_id])
        self.docs.delete(ids=[key])
        self.bump_version()
        self._delete_unreferenced([rec.doc_id])
        return rec

    # ------------------------------------------------------------ the journal
    # doc_ids whose chunks may be left without a record by a crash: those about to be
    # written (before their record is committed) and those about to be replaced or removed.
    # `gc` reads it instead of scanning the whole collection. Append-only: a line torn by a
    # crash is a partial doc_id, which matches no chunk.

    def _journal_path(self) -> Path | None:
        return self.local / "pending.log" if self.local is not None else None

    def _journal(self, doc_ids) -> None:
        p = self._journal_path()
        if p is None or not doc_ids:
            return
        with writing(p):
            p.parent.mkdir(parents=True, exist_ok=True)
            with open(p, "a") as f:
                f.write("".join(f"{d}\n" for d in doc_ids))
                f.flush()
                os.fsync(f.fileno())  # the journal must be on disk before the chunks it names

    def _pending(self) -> set[str]:
        p = self._journal_path()
        try:
            return {line.strip() for line in p.read_text().splitlines() if line.strip()} if p is not None else set()
        except OSError:
            return set()

    # ------------------------------------------------------------ chunks

    def add_chunks(self, ids, embeddings, texts, metas) -> None:
        self._check_writer()
        doc_ids = sorted({str(m.get("doc_id", "")) for m in metas} - {""})
        self._journal(doc_ids)
        with chroma_write(self):
            for i in range(0, len(ids), 1000):
                self.col.upsert(
                    ids=ids[i : i + 1000],
                    embeddings=embeddings[i : i + 1000],
                    documents=texts[i : i + 1000],
                    metadatas=[{k: v for k, v in m.items() if v is not None} for m in metas[i : i + 1000]],
                )
        self.sidecars.add(ids, embeddings, texts, metas)
        self.written.update(doc_ids)

    def has_chunks(self, doc_id: str) -> int:
        got = self.col.get(where={"doc_id": doc_id}, include=[])
        return len(got["ids"])

    def _delete_unreferenced(self, doc_ids: list[str]) -> None:
        live = {r.doc_id for r in self.documents()}
        for d in doc_ids:
            if d not in live:
                self.col.delete(where={"doc_id": d})
                self.sidecars.remove(d)

    def gc(self, *, full: bool = False) -> int:
        """Remove chunks no document record points to (left by an interrupted ingest) and
        sidecars of doc_ids no record points to. Only the doc_ids in the journal are looked
        at (a crash can leave no others), so the cost does not grow with the store; `full`
        scans every chunk's metadata instead (for a store whose writer kept no journal)."""
        self._check_writer()
        live = {r.doc_id for r in self.documents()}
        n = 0
        if full:
            got = self.col.get(include=["metadatas"])
            suspects = {m.get("doc_id") for m in got["metadatas"] or []} - {None}
        else:
            suspects = self._pending()
        for d in sorted(suspects - live):
            n += len(self.col.get(where={"doc_id": d}, include=[])["ids"])
            self.col.delete(where={"doc_id": d})
            self.sidecars.remove(d)
        for d in self.sidecars.doc_ids() - live:
            self.sidecars.remove(d)
        p = self._journal_path()
        if p is not None and p.exists():
            # keep the lines of what is live only until it is dropped: nothing left to do
            try:
                p.unlink()
            except OSError:
                pass
        return n

    def count(self) -> int:
        return self.col.count()

    @staticmethod
    def _where(doc_ids: list[str]) -> dict:
        return {"doc_id": doc_ids[0]} if len(doc_ids) == 1 else {"doc_id": {"$in": doc_ids}}

    @staticmethod
    def doc_of(chunk_id: str) -> str:
        """The doc_id of a chunk id ("<doc_id>:<index>", as ingest writes them)."""
        return chunk_id.rpartition(":")[0]

    def ensure_sidecar(self, doc_id: str, n_chunks: int | None) -> bool:
        """Whether `doc_id` has a sidecar, building it from Chroma (one document's records)
        when it has none and Chroma holds exactly the `n_chunks` its record says (a live
        document's chunks are complete; a count that differs is a write in progress)."""
        if self.sidecars.folder is None:
            return False
        if self.sidecars.count(doc_id) is not None:
            return True
        if n_chunks is None:
            return False
        got = self.col.get(where={"doc_id": doc_id}, include=["embeddings", "documents", "metadatas"])
        if len(got["ids"]) != n_chunks or got.get("embeddings") is None:
            return False
        try:
            self.sidecars.write(doc_id, list(got["ids"]), got["embeddings"], list(got["documents"]), list(got["metadatas"]))
        except OSError:  # a read-only store: search without it
            return False
        return True

    def query_ids(self, embedding, k: int, doc_ids: list[str], *, all_live: bool = False,
                  expect: dict[str, int] | None = None) -> list[tuple[str, float]]:
        """(chunk id, cosine similarity) of the top-k chunks of `doc_ids`, best first.

        - documents holding few chunks in all: an exact dot product over their sidecars'
          unit vectors (`expect`, doc_id -> n_chunks from their records, lets a missing
          sidecar be built from Chroma first);
        - `all_live` (doc_ids are all the live documents): Chroma's search with the filter
          applied after it instead of inside it (Chroma's `$in` pre-filter cost 180 ms per
          query at 10K chunks here, the plain search a few ms). Chunks of other versions
          are rare (they exist only until the next write finishes), so over-fetch a little
          and fall back to the filtered query when too many were dropped. Only distances
          are asked for: a chunk's doc_id is in its id, and texts come from the sidecars;
        - otherwise Chroma's filtered search."""
        import numpy as np

        if not doc_ids:
            return []
        counts = {} if all_live else {d: self.sidecars.count(d) for d in doc_ids}
        if counts and None in counts.values() and expect:  # no sidecar yet: build it from Chroma
            counts = {d: c if c is not None else (expect.get(d) if self.ensure_sidecar(d, expect.get(d)) else None)
                      for d, c in counts.items()}
        if counts and None not in counts.values() and sum(counts.values()) <= self.SIDECAR_SEARCH_MAX:
            parts = [self.sidecars.vectors(d) for d in doc_ids]
            if all(p is not None for p in parts):
                ids = [i for p in parts for i in p[0]]
                if not ids:
                    return []
                mat = parts[0][1] if len(parts) == 1 else np.concatenate([p[1] for p in parts])
                q = np.asarray(embedding, dtype=np.float32)
                q = q / (np.linalg.norm(q) or 1.0)
                sims = mat @ q
                kk = min(k, len(ids))
                top = np.argpartition(-sims, kk - 1)[:kk] if kk < len(ids) else np.arange(len(ids))
                top = top[np.lexsort((top, -sims[top]))]
                return [(ids[i], float(sims[i])) for i in top]
        if all_live:
            wanted = set(doc_ids)
            res = self.col.query(query_embeddings=[embedding], n_results=k + 16, include=["distances"])
            rows = [(i, 1.0 - d) for i, d in zip(res["ids"][0], res["distances"][0]) if self.doc_of(i) in wanted]
            if len(rows) >= k or len(res["ids"][0]) < k + 16:
                return rows[:k]
        res = self.col.query(query_embeddings=[embedding], n_results=k, where=self._where(doc_ids), include=["distances"])
        return [(i, 1.0 - d) for i, d in zip(res["ids"][0], res["distances"][0])]

    def hits(self, ids: list[str], expect: dict[str, int] | None = None) -> dict[str, Hit]:
        """Text and metadata of chunks by id: from the sidecars, else from Chroma."""
        by_doc: dict[str, list[str]] = {}
        for i in ids:
            by_doc.setdefault(self.doc_of(i), []).append(i)
        out: dict[str, Hit] = {}
        missing: list[str] = []
        for d, cids in by_doc.items():
            if self.sidecars.count(d) is None and not (expect and self.ensure_sidecar(d, expect.get(d))):
                missing += cids
                continue
            rows = [self.sidecars.row_of(d, c) for c in cids]
            got = self.sidecars.hits(d, [r for r in rows if r is not None]) if None not in rows else None
            if got is None:
                missing += cids
                continue
            out.update((h.id, h) for h in got)
        if missing:
            got = self.col.get(ids=missing, include=["documents", "metadatas"])
            out.update((i, Hit(id=i, text=t, meta=m, score=0.0)) for i, t, m in zip(got["ids"], got["documents"], got["metadatas"]))
        return out

    def query(self, embedding: list[float], k: int, doc_ids: list[str], *, all_live: bool = False,
              expect: dict[str, int] | None = None) -> list[Hit]:
        """Top-k chunks of `doc_ids` by cosine similarity, with their texts (see `query_ids`)."""
        scored = self.query_ids(embedding, k, doc_ids, all_live=all_live, expect=expect)
        known = self.hits([i for i, _ in scored], expect)
        return [Hit(id=i, text=known[i].text, meta=known[i].meta, score=s) for i, s in scored if i in known]

    def chunks(self, doc_ids: list[str], expect: dict[str, int] | None = None) -> list[Hit]:
        """Every chunk of `doc_ids`, in document order: from the sidecars, else Chroma."""
        if not doc_ids:
            return []
        hits: list[Hit] = []
        rest = []
        for d in sorted(set(doc_ids)):
            got = self.sidecars.hits(d) if self.ensure_sidecar(d, (expect or {}).get(d)) else None
            if got is None:
                rest.append(d)
            else:
                hits += got
        if rest:
            got = self.col.get(where=self._where(rest), include=["documents", "metadatas"])
            hits += [Hit(id=i, text=t, meta=m, score=0.0) for i, t, m in zip(got["ids"], got["documents"], got["metadatas"])]
        return sorted(hits, key=lambda h: (h.meta.get("doc_id", ""), int(h.meta.get("chunk_index", 0))))

    # --- embedding cache (helper I) ---
    # A chunk record carries `text_hash` (ragkit.ingest.embcache.text_hash: the embedder's
    # identity and the exact text it embedded). The vector lives in the same record as its
    # text, written by one upsert, so there is no second store that could disagree with it.

    def vectors_by_text_hash(self, hashes: list[str], batch: int = 500) -> dict[str, list[float]]:
        """Stored vectors for the given text hashes (any record that has one; duplicates
        hold the same vector). Hashes no record has are absent from the answer."""
        out: dict[str, list[float]] = {}
        want = sorted(set(hashes))
        for i in range(0, len(want), batch):
            part = want[i : i + batch]
            where = {"text_hash": part[0]} if len(part) == 1 else {"text_hash": {"$in": part}}
            got = self.col.get(where=where, include=["embeddings", "metadatas"])
            embs = got.get("embeddings")
            if embs is None:
                continue
            for m, e in zip(got["metadatas"] or [], embs):
                h = (m or {}).get("text_hash")
                if h and h not in out and e is not None:
                    out[h] = e.tolist() if hasattr(e, "tolist") else [float(x) for x in e]
        return out


class WriteLock:
    """One writer per store. A second writer gets a clear message instead of waiting forever."""

    def __init__(self, path: Path, wait_s: float = 0.0):
        self.path = path
        self.wait_s = wait_s
        self.fd: int | None = None

    def __enter__(self) -> "WriteLock":
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        deadline = time.monotonic() + self.wait_s
        while True:
            try:
                fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    holder = ""
                    try:
                        info = json.loads(os.pread(self.fd, 4096, 0) or b"{}")
                        holder = f" (pid {info.get('pid')})"
                    except (ValueError, OSError):
                        pass
                    os.close(self.fd)
                    self.fd = None
                    raise StoreLocked(
                        f"another ragkit process{holder} is writing to this store ({self.path.parent})",
                        hint="wait for it to finish, or use --wait SECONDS",
                    ) from None
                time.sleep(0.2)
        os.ftruncate(self.fd, 0)
        os.pwrite(self.fd, json.dumps({"pid": os.getpid(), "since": time.time()}).encode(), 0)
        return self

    def __exit__(self, *exc) -> None:
        if self.fd is not None:
            fcntl.flock(self.fd, fcntl.LOCK_UN)
            os.close(self.fd)
            self.fd = None


class ServerLease:
    """One writer per Chroma server collection, across machines: a lock record that lives
    with the store (collection `<name>-lock`, id "writer") and carries a lease.

    Chroma has no compare-and-swap, but `add` of an existing id is ignored by the server,
    so the first `add` wins: a writer adds its own record, reads it back, and holds the
    lock only if the record is its own. A holder renews the lease every `lease_s / 3`; a
    lease not renewed for `lease_s` (a writer that crashed or lost the network) expires,
    and the next writer deletes it — conditionally on its owner, so a fresh holder's record
    is never deleted — and takes the lock.

    Renewal is conditional too: a holder renews only while its own lease is at least
    `lease_s / 6` from expiry by its clock (only after expiry may another writer take it), and
    only if the record is still its own; otherwise the lease is *lost*, and `check()`, which
    the store calls before every write, stops the writer with exit 5. Chroma has no
    compare-and-swap, so one window remains: a pause of more than `lease_s / 6` between the
    last check and the update itself (a few microseconds of code)."""

    RECORD = "writer"

    def __init__(self, client, collection: str, *, wait_s: float = 0.0, lease_s: float = 60.0):
        import socket
        import uuid

        self.col = client.get_or_create_collection(f"{collection}-lock", embedding_function=None)
        self.where = collection
        self.wait_s = wait_s
        self.lease_s = lease_s
        self.owner = uuid.uuid4().hex
        self.info = {"owner": self.owner, "host": socket.gethostname(), "pid": os.getpid()}
        self._stop = None
        self._thread = None
        self._expires = 0.0  # when the lease this writer last wrote runs out (its own clock)
        self.lost: str | None = None  # why this writer no longer holds the lease

    def _holder(self) -> dict | None:
        got = self.col.get(ids=[self.RECORD], include=["metadatas"])
        return (got["metadatas"] or [None])[0] if got["ids"] else None

    def _meta(self) -> dict:
        return {**self.info, "expires": time.time() + self.lease_s}

    def __enter__(self) -> "ServerLease":
        import threading

        deadline = time.monotonic() + self.wait_s
        while True:
            held = self._holder()
            if held is not None and float(held.get("expires", 0)) < time.time():
                self.col.delete(ids=[self.RECORD], where={"owner": held["owner"]})  # expired lease
                held = None
            if held is None:
                meta = self._meta()
                self.col.add(ids=[self.RECORD], embeddings=[[0.0]], metadatas=[meta])
                held = self._holder()
            if held is not None and held.get("owner") == self.owner:
                self._expires = float(held.get("expires", 0))
                break
            if time.monotonic() >= deadline:
                who = f" (host {held.get('host')}, pid {held.get('pid')})" if held else ""
                raise StoreLocked(
                    f"another ragkit process{who} is writing to the Chroma collection {self.where!r} on this server",
                    hint="wait for it to finish, or use --wait SECONDS; a crashed writer's lease expires "
                    f"after {self.lease_s:.0f} s",
                ) from None
            time.sleep(0.5)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._renew, name="ragkit-lease", daemon=True)
        self._thread.start()
        return self

    def _renew(self) -> None:
        while not self._stop.wait(self.lease_s / 3):
            try:
                if not self.renew_once():
                    return
            except Exception:  # the server is unreachable: the writer's own calls will fail and say so
                pass

    def renew_once(self) -> bool:
        """One renewal; False (and `lost` set) when this writer no longer holds the lease."""
        margin = self.lease_s / 6
        if self.lost:
            return False
        if time.time() >= self._expires - margin:
            self.lost = f"its {self.lease_s:.0f} s lease ran out before it was renewed (the process was paused or cut off)"
            return False
        held = self._holder()
        if held is None or held.get("owner") != self.owner:
            self.lost = "another writer took the lease over"
            return False
        meta = self._meta()
        if time.time() >= self._expires - margin:  # paused while reading: the lease may be another's now
            self.lost = f"its {self.lease_s:.0f} s lease ran out before it was renewed (the process was paused or cut off)"
            return False
        self.col.update(ids=[self.RECORD], metadatas=[meta])
        self._expires = meta["expires"]
        return True

    def check(self) -> None:
        """Called before every write: a writer whose lease is lost or run out stops (exit 5)
        rather than write beside the writer that may hold it now."""
        if self.lost is None and time.time() >= self._expires:
            self.lost = f"its {self.lease_s:.0f} s lease ran out before it was renewed (the process was paused or cut off)"
        if self.lost:
            raise StoreLocked(
                f"this ragkit process stopped writing to the Chroma collection {self.where!r}: {self.lost}, "
                "so another writer may be at work",
                hint="run the command again: documents already committed are kept, the one being written was not committed",
            )

    def __exit__(self, *exc) -> None:
        if self._stop is not None:
            self._stop.set()
            self._thread.join(5)
        if self.lost:
            return  # never delete a record: it may be the new holder's (the delete is by owner, but be plain)
        try:
            self.col.delete(ids=[self.RECORD], where={"owner": self.owner})
        except Exception:
            pass  # unreachable server: the lease expires on its own


class StoreWriter:
    """The writer's lock for the store `settings` names: the local file lock (one writer
    per store folder, or per server collection on this machine) and, for a Chroma server,
    the lease that lives in the server (one writer across machines)."""

    def __init__(self, settings, wait_s: float = 0.0):
        self.settings = settings
        self.wait_s = wait_s
        self.local = WriteLock(lock_path(settings.store, settings.store_url, settings.collection, settings.cache_dir), wait_s)
        self.lease: ServerLease | None = None

    def __enter__(self) -> "StoreWriter":
        self.local.__enter__()
        if self.settings.store_url:
            try:
                client = ChromaStore.connect(self.settings.store_url)
                self.lease = ServerLease(client, self.settings.collection, wait_s=self.wait_s).__enter__()
            except BaseException:
                self.local.__exit__(None, None, None)
                raise
        return self

    def check(self) -> None:
        """Before each write: stop (StoreLocked, exit 5) if the server lease was lost."""
        if self.lease is not None:
            self.lease.check()

    def __exit__(self, *exc) -> None:
        try:
            if self.lease is not None:
                self.lease.__exit__(*exc)
        finally:
            self.local.__exit__(*exc)


def lock_path(store: Path, url: str | None, collection: str, cache_dir: Path) -> Path:
    if url:
        safe = "".join(c if c.isalnum() else "_" for c in f"{url}_{collection}")
        return cache_dir / "locks" / f"{safe}.lock"
    return store / "ingest.lock"


def iter_batches(items: list, n: int) -> Iterator[list]:
    for i in range(0, len(items), n):
        yield items[i : i + n]


def open_store(settings, embedder, *, create: bool) -> ChromaStore:
    """The store named by `settings`, checked against `embedder` (name and dimension)."""
    return ChromaStore(
        settings.store,
        url=settings.store_url,
        collection=settings.collection,
        embedder_name=embedder.name,
        dim=embedder.dim,
        create=create,
        cache_dir=settings.cache_dir,
    )
