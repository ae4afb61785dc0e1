"""The ingest job: idempotent per file (keyed by content hash), one writer at a time,
each document committed by a single record write, bad files reported and skipped."""

from __future__ import annotations

import hashlib
import os
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from ragkit.config import Settings
from ragkit.embed import Embedder, load_embedder
from ragkit.errors import DocumentError, UsageError
from ragkit.ingest.loaders import SUPPORTED, load
from ragkit.ingest.model import Chunk
from ragkit.ingest.sections import build_sections, chunk_sections
from ragkit.store import ChromaStore, DocRecord, StoreWriter, open_store


@dataclass
class IngestReport:
    added: int = 0
    updated: int = 0
    unchanged: int = 0
    failed: list[dict] = field(default_factory=list)
    chunks: int = 0  # chunks written in this run
    removed: int = 0  # documents pruned
    files: list[dict] = field(default_factory=list)  # per-file outcome, for humans

    def to_json(self) -> dict:
        return {
            "added": self.added,
            "updated": self.updated,
            "unchanged": self.unchanged,
            "failed": self.failed,
            "chunks": self.chunks,
            "removed": self.removed,
        }


def doc_id_for(sha256: str) -> str:
    return sha256[:24]


def discover(paths: list[Path]) -> tuple[list[Path], list[dict]]:
    """Expand files and folders. Folders are walked without following symlinks (no loops);
    only supported types are taken from folders, while a file named explicitly is always
    tried so the user hears why it was refused."""
    files: list[Path] = []
    failed: list[dict] = []
    seen: set[str] = set()

    def add(p: Path) -> None:
        key = os.path.abspath(p)
        if key not in seen:
            seen.add(key)
            files.append(Path(key))

    for p in paths:
        try:
            if p.is_dir():
                for root, dirs, names in os.walk(p, followlinks=False, onerror=None):
                    dirs[:] = sorted(d for d in dirs if not d.startswith("."))
                    for n in sorted(names):
                        fp = Path(root) / n
                        if n.startswith((".", "~$")) or fp.suffix.lower() not in SUPPORTED:
                            continue
                        add(fp)
            elif p.exists() or p.is_symlink():
                add(p)
            else:
                failed.append({"path": str(p), "error": "no such file or folder"})
        except OSError as exc:
            failed.append({"path": str(p), "error": f"cannot read: {exc.strerror or exc}"})
    return files, failed


def _hash_file(path: Path) -> str:
    h = hashlib.sha256()
    if os.path.islink(path):
        try:
            os.stat(path)
        except FileNotFoundError:
            raise DocumentError(str(path), f"broken symbolic link (points to {os.readlink(path)})") from None
        except OSError as exc:
            if exc.errno == 40:  # ELOOP
                raise DocumentError(str(path), "symbolic link loop") from None
    try:
        with open(path, "rb") as f:
            while block := f.read(1 << 20):
                h.update(block)
    except FileNotFoundError:
        raise DocumentError(str(path), "file vanished before it could be read") from None
    except PermissionError:
        raise DocumentError(str(path), "permission denied") from None
    except IsADirectoryError:
        raise DocumentError(str(path), "is a folder") from None
    except OSError as exc:
        if exc.errno == 40:  # ELOOP
            raise DocumentError(str(path), "symbolic link loop") from None
        raise DocumentError(str(path), f"cannot read file: {exc.strerror or exc}") from None
    return h.hexdigest()


def chunk_file(path: Path, settings: Settings, embedder: Embedder) -> tuple[list[Chunk], int, int | None]:
    """Parse one file into chunks. Returns (chunks, n_sections, n_pages)."""
    try:
        size = path.stat().st_size
    except OSError:
        size = 0
    if size > settings.ingest.max_file_mb * 1024 * 1024:
        raise DocumentError(str(path), f"file is {size / 1e6:.0f} MB, over the limit of {settings.ingest.max_file_mb} MB (setting ingest.max_file_mb)")
    blocks = load(
        path,
        pdf_engine=settings.ingest.pdf_engine,
        max_pages=settings.ingest.max_pages,
        max_docx_inflated_mb=settings.ingest.max_docx_inflated_mb,
        ocr_lang=settings.ingest.ocr_lang,
        tables=settings.ingest.tables,
    )
    sections = build_sections(blocks)
    max_tokens = settings.ingest.chunk_tokens or embedder.max_tokens
    max_tokens = min(max_tokens, embedder.max_tokens)
    chunks = chunk_sections(sections, embedder.count_tokens, max_tokens, settings.ingest.min_chunk_tokens)
    pages = [b.page for b in blocks if b.page is not None]
    return chunks, len(sections), (max(pages) if pages else None)


def ingest(
    paths: list[Path],
    settings: Settings,
    *,
    prune: bool = False,
    wait_s: float = 0.0,
    on_event: Callable[[str, dict], None] | None = None,
) -> IngestReport:
    """Ingest files and folders into the store named by `settings`."""
    if not paths:
        raise UsageError("nothing to ingest: give at least one file or folder")
    emit = on_event or (lambda kind, info: None)
    files, failed = discover(paths)
    report = IngestReport(failed=list(failed))
    for f in failed:
        emit("failed", f)
    embedder = load_embedder(settings)
    with StoreWriter(settings, wait_s):
        store = open_store(settings, embedder, create=True)
        store.gc()  # finish what an interrupted run left behind
        existing = {r.key: r for r in store.documents()}
        emit("start", {"files": len(files)})
        for path in files:
            key = str(path)
            try:
                sha = _hash_file(path)
                doc_id = doc_id_for(sha)
                old = existing.get(key)
                if old is not None and old.doc_id == doc_id and store.has_chunks(doc_id) == old.n_chunks:
                    report.unchanged += 1
                    report.files.append({"path": key, "status": "unchanged", "chunks": old.n_chunks})
                    emit("file", {"path": key, "status": "unchanged"})
                    continue
                t0 = time.perf_counter()
                chunks, n_sections, n_pages = chunk_file(path, settings, embedder)
                t_parse = time.perf_counter() - t0
                emit("parsed", {"path": key, "chunks": len(chunks)})
                n_existing = store.has_chunks(doc_id)
                if n_existing != len(chunks):  # same content may already be stored under another path
                    vectors = embedder.embed_documents(
                        [c.embed_text() for c in chunks], progress=lambda n: emit("embedded", {"n": n})
                    )
                    ids = [f"{doc_id}:{i:05d}" for i in range(len(chunks))]
                    metas = [
                        {
                            "doc_id": doc_id,
                            "doc_name": path.name,
                            "section": c.section,
                            "page_start": c.page_start,
                            "page_end": c.page_end,
                            "chunk_index": i,
                            "char_start": c.char_start,
                            "char_end": c.char_end,
                            "kind": c.kind,
                            "tokens": c.tokens,
                        }
                        for i, c in enumerate(chunks)
                    ]
                    store.add_chunks(ids, vectors, [c.text for c in chunks], metas)
                    report.chunks += len(chunks)
                record = DocRecord(
                    key=key, doc_id=doc_id, name=path.name, path=key, sha256=sha, n_chunks=len(chunks),
                    n_sections=n_sections, n_pages=n_pages, ingested_at=time.time(),
                )
                store.commit_document(record)  # the commit point
                if old is not None and old.doc_id != doc_id:
                    store._delete_unreferenced([old.doc_id])
                    report.updated += 1
                    status = "updated"
                else:
                    report.added += 1
                    status = "added"
                existing[key] = record
                report.files.append({"path": key, "status": status, "chunks": len(chunks), "parse_s": round(t_parse, 3)})
                emit("file", {"path": key, "status": status, "chunks": len(chunks)})
            except DocumentError as exc:
                item = {"path": key, "error": exc.reason}
                report.failed.append(item)
                emit("failed", item)
            except (KeyboardInterrupt, SystemExit):
                raise
            except Exception as exc:  # a bug or a library failure on one file must not stop the batch
                item = {"path": key, "error": f"could not be read ({type(exc).__name__}: {str(exc)[:160]})"}
                report.failed.append(item)
                emit("failed", item)
                if os.environ.get("RAGKIT_DEBUG"):
                    traceback.print_exc()
        if prune:
            wanted = {str(p) for p in files}
            for rec in list(existing.values()):
                if rec.key not in wanted and not Path(rec.key).exists():
                    store.remove_document(rec.key)
                    report.removed += 1
                    emit("pruned", {"path": rec.key})
        sync_lexical_index(store, settings)
    return report


def sync_lexical_index(store: ChromaStore, settings: Settings) -> None:
    """Bring the BM25 index in line with the store (under the write lock)."""
    from ragkit.retrieve import bm25

    bm25.refresh(store, bm25.index_dir(settings.store, settings.store_url, settings.collection, settings.cache_dir))
