"""The store: Chroma (embedded, or a Chroma server) with per-document sidecars, the write
lock and the server lease, and the lexical index.

- `records`: DocRecord, Hit, the schema and the VectorStore protocol;
- `chroma`: ChromaStore, `open_store`;
- `sidecars`: the per-document files beside the store;
- `locks`: WriteLock, ServerLease, StoreWriter;
- `durable`: files flushed and renamed into place, and disk errors as StoreError.
"""

from ragkit.store.chroma import ChromaStore, chroma_write, follow_store_embedder, iter_batches, open_store, recorded_embedder
from ragkit.store.locks import ServerLease, StoreWriter, WriteLock, lock_path
from ragkit.store.records import (
           _VERSION_ID,
           MIGRATABLE,
           SCHEMA_VERSION,
           DocRecord,
           Hit,
           VectorStore,
)
from ragkit.store.sidecars import Sidecars

__all__ = ["ChromaStore", "DocRecord", "Hit", "MIGRATABLE", "SCHEMA_VERSION", "ServerLease", "Sidecars", "StoreWriter",
           "VectorStore", "WriteLock", "_VERSION_ID", "chroma_write", "follow_store_embedder", "iter_batches", "lock_path", "open_store",
           "recorded_embedder"]
