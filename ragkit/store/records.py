"""Records of the store: a document (`DocRecord`), a search hit (`Hit`), the schema, and
the protocol every store backend meets."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Protocol, TypeVar

if TYPE_CHECKING:
    from concurrent.futures import Future

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
    # a Word file's unaccepted tracked changes (ragkit.ingest.changes): how many, by whom, when
    tracked_changes: int = 0
    change_authors: str = ""
    change_dates: str = ""  # "2026-12-01" or "2026-11-28 to 2026-12-01"

    def to_meta(self) -> dict[str, Any]:
        d = {k: v for k, v in self.__dict__.items() if v is not None and k != "key"}
        if not self.tracked_changes:  # a record without changes reads as it did before they were kept
            for k in ("tracked_changes", "change_authors", "change_dates"):
                d.pop(k, None)
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
            tracked_changes=int(m.get("tracked_changes") or 0),
            change_authors=str(m.get("change_authors") or ""),
            change_dates=str(m.get("change_dates") or ""),
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
    def query_ids(self, embedding, k: int, doc_ids: list[str], *, all_live: bool = False,
                  expect: dict[str, int] | None = None) -> list[tuple[str, float]]: ...
    def query_ids_beside(self, embedding, k: int, doc_ids: list[str], **kw) -> Future[list[tuple[str, float]]]: ...
    def hits(self, ids: list[str], expect: dict[str, int] | None = None) -> dict[str, Hit]: ...
    def chunks(self, doc_ids: list[str]) -> list[Hit]: ...
    def vectors(self, doc_id: str, n_chunks: int | None = None) -> tuple[list[str], Any] | None: ...
    def gc(self) -> int: ...
    def count(self) -> int: ...


_VERSION_ID = "__ragkit_store_version__"  # a row of the -docs collection, not a document
