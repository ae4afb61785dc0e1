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
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator, Protocol, TypeVar

from ragkit import __version__
from ragkit.errors import StoreError, StoreLocked

SCHEMA_VERSION = 1
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


class ChromaStore:
    def __init__(self, path: Path, *, url: str | None, collection: str, embedder_name: str, dim: int, create: bool):
        import chromadb
        from chromadb.config import Settings as ChromaSettings

        self.path = path
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
        if collection in existing:
            self.col = self.client.get_collection(collection, embedding_function=None)
            self._check_identity(self.col.metadata or {}, identity)
        elif create:
            self.col = self.client.create_collection(
                collection, embedding_function=None, configuration={"hnsw": {"space": "cosine"}}, metadata=identity
            )
        else:
            raise StoreError(f"the store at {url or path} has no collection {collection!r}", hint="run `ragkit ingest` first")
        self.docs = self.client.get_or_create_collection(
            f"{collection}-docs", embedding_function=None, metadata={"schema": SCHEMA_VERSION}
        )

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
        if have.get("schema", SCHEMA_VERSION) < SCHEMA_VERSION:
            raise StoreError(f"this store uses an old schema {have.get('schema')}", hint="re-ingest into a new --store")
        if have.get("embedder") != want["embedder"] or int(have.get("dim", -1)) != want["dim"]:
            raise StoreError(
                f"this store was built with embedder {have.get('embedder')!r} ({have.get('dim')}-dim), "
                f"but the settings use {want['embedder']!r} ({want['dim']}-dim); vectors of two models cannot be mixed",
                hint=f"set embed.model = {have.get('embedder')!r}, or ingest into another --store",
            )

    # ------------------------------------------------------------ documents

    def documents(self) -> list[DocRecord]:
        got = self.docs.get(include=["metadatas"])
        recs = [DocRecord.from_meta(i, m) for i, m in zip(got["ids"], got["metadatas"] or [])]
        return sorted(recs, key=lambda r: (r.name, r.key))

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
        """The commit point: one upsert of one record."""
        self.docs.upsert(ids=[record.key], embeddings=[[0.0]], metadatas=[record.to_meta()])

    def remove_document(self, key: str) -> DocRecord | None:
        got = self.docs.get(ids=[key], include=["metadatas"])
        if not got["ids"]:
            return None
        rec = DocRecord.from_meta(key, got["metadatas"][0])
        self.docs.delete(ids=[key])
        self._delete_unreferenced([rec.doc_id])
        return rec

    # ------------------------------------------------------------ chunks

    def add_chunks(self, ids, embeddings, texts, metas) -> None:
        for i in range(0, len(ids), 1000):
            self.col.upsert(
                ids=ids[i : i + 1000],
                embeddings=embeddings[i : i + 1000],
                documents=texts[i : i + 1000],
                metadatas=[{k: v for k, v in m.items() if v is not None} for m in metas[i : i + 1000]],
            )

    def has_chunks(self, doc_id: str) -> int:
        got = self.col.get(where={"doc_id": doc_id}, include=[])
        return len(got["ids"])

    def _delete_unreferenced(self, doc_ids: list[str]) -> None:
        live = {r.doc_id for r in self.documents()}
        for d in doc_ids:
            if d not in live:
                self.col.delete(where={"doc_id": d})

    def gc(self) -> int:
        """Remove chunks no document record points to (left by an interrupted ingest)."""
        live = {r.doc_id for r in self.documents()}
        got = self.col.get(include=["metadatas"])
        dead = sorted({m["doc_id"] for m in got["metadatas"] or [] if m.get("doc_id") not in live})
        n = 0
        for d in dead:
            n += sum(1 for m in got["metadatas"] if m.get("doc_id") == d)
            self.col.delete(where={"doc_id": d})
        return n

    def count(self) -> int:
        return self.col.count()

    @staticmethod
    def _where(doc_ids: list[str]) -> dict:
        return {"doc_id": doc_ids[0]} if len(doc_ids) == 1 else {"doc_id": {"$in": doc_ids}}

    def query(self, embedding: list[float], k: int, doc_ids: list[str], *, all_live: bool = False) -> list[Hit]:
        """Top-k chunks of `doc_ids` by cosine similarity. With `all_live` (doc_ids are all
        the live documents) the filter is applied after the search instead of inside it:
        Chroma's `$in` pre-filter cost 180 ms per query at 10K chunks here, the plain
        search a few ms. Chunks of other versions are rare (they exist only until the
        next write finishes), so over-fetch a little and fall back to the filtered query
        when too many were dropped."""
        if not doc_ids:
            return []
        include = ["documents", "metadatas", "distances"]
        if all_live:
            wanted = set(doc_ids)
            res = self.col.query(query_embeddings=[embedding], n_results=k + 16, include=include)
            rows = [r for r in zip(res["ids"][0], res["documents"][0], res["metadatas"][0], res["distances"][0]) if r[2].get("doc_id") in wanted]
            if len(rows) >= k or len(res["ids"][0]) < k + 16:
                return [Hit(id=i, text=t, meta=m, score=1.0 - d) for i, t, m, d in rows[:k]]
        res = self.col.query(query_embeddings=[embedding], n_results=k, where=self._where(doc_ids), include=include)
        return [
            Hit(id=i, text=t, meta=m, score=1.0 - d)
            for i, t, m, d in zip(res["ids"][0], res["documents"][0], res["metadatas"][0], res["distances"][0])
        ]

    def chunks(self, doc_ids: list[str]) -> list[Hit]:
        if not doc_ids:
            return []
        got = self.col.get(where=self._where(doc_ids), include=["documents", "metadatas"])
        hits = [Hit(id=i, text=t, meta=m, score=0.0) for i, t, m in zip(got["ids"], got["documents"], got["metadatas"])]
        return sorted(hits, key=lambda h: (h.meta.get("doc_id", ""), int(h.meta.get("chunk_index", 0))))


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
    is never deleted — and takes the lock."""

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
                self.col.add(ids=[self.RECORD], embeddings=[[0.0]], metadatas=[self._meta()])
                held = self._holder()
            if held is not None and held.get("owner") == self.owner:
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
                held = self._holder()
                if held is None or held.get("owner") != self.owner:
                    return  # expired and taken by another writer (a pause longer than the lease): stop renewing
                self.col.update(ids=[self.RECORD], metadatas=[self._meta()])
            except Exception:  # the server is unreachable: the writer's own calls will fail and say so
                pass

    def __exit__(self, *exc) -> None:
        if self._stop is not None:
            self._stop.set()
            self._thread.join(5)
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
    )
