"""The vector store: Chroma, embedded (PersistentClient) by default or a Chroma server.

Two collections:
- `<name>`: one record per chunk (embedding, text, metadata);
- `<name>-docs`: one record per document (the manifest). Writing a document's record is
  the commit point of its ingest: readers only see chunks whose `doc_id` (content hash)
  a document record points to, so a reader sees the old or the new version, never a mix,
  and chunks left behind by a crash are invisible until `gc()` removes them.
"""

from __future__ import annotations

import os
import re
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator

from ragkit import __version__
from ragkit.errors import RagkitError, StoreError
from ragkit.store.durable import writing
from ragkit.store.records import (
    _VERSION_ID,
    MIGRATABLE,
    SCHEMA_VERSION,
    DocRecord,
    Hit,
    T,
)
from ragkit.store.sidecars import Sidecars


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
                 cache_dir: Path | None = None, token: str | None = None):
        import chromadb
        from chromadb.config import Settings as ChromaSettings

        self.path = path
        self.url = url
        self._records: tuple[str, list] | None = None  # (store version, records) of the last documents()
        self._search_thread = None  # (pid, one-thread executor) for query_ids_beside, made on first use
        chroma_settings = ChromaSettings(anonymized_telemetry=False, allow_reset=False)
        try:
            if url:
                self.client = self.connect(url, token)
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
    def connect(url: str, token: str | None = None):
        """A client for the Chroma server at `url` ("http://host:port", or "host:port"), sending
        `token` as a bearer token on every request when given (setting store_token)."""
        from urllib.parse import urlparse

        import chromadb
        from chromadb.config import Settings as ChromaSettings

        u = urlparse(url if "://" in url else f"http://{url}")  # "127.0.0.1:8000" has no scheme
        if u.scheme not in ("http", "https"):
            raise StoreError(f"store_url {url!r} is not an http:// or https:// URL")
        try:
            client = chromadb.HttpClient(
                host=u.hostname or "127.0.0.1",
                port=u.port or (443 if u.scheme == "https" else 8000),
                ssl=u.scheme == "https",
                headers={"Authorization": f"Bearer {token}"} if token else None,
                settings=ChromaSettings(anonymized_telemetry=False, allow_reset=False),
            )
            client.heartbeat()
            client.list_collections(limit=1)  # a proxy may answer the heartbeat without the token
        except Exception as exc:  # connection refused, TLS, a token refused ...
            text = str(exc).strip()
            first = (text.splitlines() or [type(exc).__name__])[0][:200]
            # a proxy's refusal comes back as its page ("<html>...<title>401 Authorization Required")
            code = re.search(r"\b(401|403)\b", text)
            refused = code is not None
            if refused:
                first = f"the server refused the request ({code.group(1)} {'Unauthorized' if code.group(1) == '401' else 'Forbidden'})"
            raise StoreError(f"cannot open the Chroma store at {url}: {first}",
                             hint=("the server asks for a token: set store_token (RAGKIT_STORE_TOKEN)" if refused and not token
                                   else "check store_token (RAGKIT_STORE_TOKEN)" if refused else None)) from None
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
        hit = self._records
        if version is not None and hit is not None and hit[0] == version:
            return list(hit[1])
        got = self.docs.get(include=["metadatas"])
        recs = [DocRecord.from_meta(i, m) for i, m in zip(got["ids"], got["metadatas"] or []) if i != _VERSION_ID]
        recs = sorted(recs, key=lambda r: (r.name, r.key))
        if version is not None:
            self._records = (version, recs)  # this open store's: a Session holds the store, so it lasts
        return list(recs)

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
        self._records = None

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

    def query_ids_beside(self, embedding, k: int, doc_ids: list[str], **kw):
        """query_ids in the store's own search thread, as a Future: Chroma's HNSW search (and
        numpy's dot product over sidecars) let go of the GIL, so the lexical search runs beside
        it in the caller's thread. 100K chunks, 2 cores: the two rankings 3.5 ms one after the
        other, 2.0 ms side by side (eval/bench_retrieval.py)."""
        # made again in a forked child, which has the executor but not its thread
        if self._search_thread is None or self._search_thread[0] != os.getpid():
            from concurrent.futures import ThreadPoolExecutor

            self._search_thread = (os.getpid(), ThreadPoolExecutor(1, thread_name_prefix="ragkit-search"))
        return self._search_thread[1].submit(self.query_ids, embedding, k, doc_ids, **kw)

    def hits(self, ids: list[str], expect: dict[str, int] | None = None) -> dict[str, Hit]:
        """Text and metadata of chunks by id: from the sidecars, else from Chroma."""
        by_doc: dict[str, list[str]] = {}
        for i in ids:
            by_doc.setdefault(self.doc_of(i), []).append(i)
        out: dict[str, Hit] = {}
        missing: list[str] = []
        for d, cids in by_doc.items():
            got = self.sidecars.hits_by_id(d, cids)
            if got is None and self.sidecars.count(d) is None and expect and self.ensure_sidecar(d, expect.get(d)):
                got = self.sidecars.hits_by_id(d, cids)
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

    def vectors(self, doc_id: str, n_chunks: int | None = None):
        """(chunk ids, vectors n x dim as float32) of one document: from its sidecar, else
        Chroma; None when neither holds them."""
        import numpy as np

        got = self.sidecars.vectors(doc_id) if self.ensure_sidecar(doc_id, n_chunks) else None
        if got is not None:
            return list(got[0]), got[1]
        rows = self.col.get(where={"doc_id": doc_id}, include=["embeddings"])
        if not rows["ids"] or rows.get("embeddings") is None:
            return None
        return list(rows["ids"]), np.asarray(rows["embeddings"], dtype=np.float32)

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


def iter_batches(items: list, n: int) -> Iterator[list]:
    for i in range(0, len(items), n):
        yield items[i : i + n]


def recorded_embedder(settings) -> str | None:
    """The embedder an embedded store at `settings.store` records (its collection's
    identity), read without loading a model; None when there is no such store (or it is a
    server's: `store_url`)."""
    if settings.store_url or not (settings.store / "chroma" / "chroma.sqlite3").exists():
        return None
    import chromadb
    from chromadb.config import Settings as ChromaSettings

    try:
        client = chromadb.PersistentClient(path=str(settings.store / "chroma"),
                                           settings=ChromaSettings(anonymized_telemetry=False, allow_reset=False))
        return (client.get_collection(settings.collection, embedding_function=None).metadata or {}).get("embedder")
    except Exception:  # no such collection, an unreadable file: open_store says why when it opens it
        return None


def follow_store_embedder(settings):
    """`settings` with `embed.model` set to the registry embedder an existing store was built
    with, when the user chose none (`embed.model` left at its default): a store made before
    the default changed keeps working, and files added to it are embedded by the same model.
    A model the user names is kept, and a store built with another is refused by open_store."""
    from ragkit.models import REGISTRY

    e = settings.embed
    if "model" in e.model_fields_set or e.backend in ("hash", "openai") or e.base_url:
        return settings
    have = recorded_embedder(settings)
    if not have or have == e.model or have not in REGISTRY or REGISTRY[have].kind != "embedder":
        return settings
    return settings.model_copy(update={"embed": e.model_copy(update={"model": have})})


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
        token=store_token(settings),
    )


def store_token(settings) -> str | None:
    """The bearer token for the Chroma server, if one is set."""
    return settings.store_token.get_secret_value() if settings.store_token is not None else None
