"""The ingest job's sources (ragkit.ingest.pipeline re-exports them): files and folders
expanded, hashed, and parsed into chunks; the document id of a stored version."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from ragkit.config import Settings
from ragkit.embed import Embedder
from ragkit.errors import DocumentError
from ragkit.ingest.blocks import Chunk
from ragkit.ingest.loaders import SUPPORTED, load
from ragkit.ingest.sections import build_sections, chunk_sections

# How a format is read, where it changed since `chunking_key`'s version: a file of that
# format ingested before is read again, the others are left as they are.
# docx2: every text a reader sees, tracked changes, notes and comments (ragkit/ingest/docx.py)
# pdf2: a table's headers carried onto its parts (a statement run onto the next page, or broken by
# label lines) and "$ —" read as a cell (ragkit/ingest/tables.py); contents pages open no section
# pdf3: a statement's title in sentence case after the company's name, or with its status in
# brackets ("JPMorgan Chase & Co. Consolidated statements of income (unaudited)"), opens its section
READER_VERSIONS = {".docx": "docx2", ".pdf": "pdf3"}


def doc_id_for(sha256: str, chunking: str = "", suffix: str = "") -> str:
    """A stored version of a document: its content and how it was cut into chunks
    (`chunking_key`, and the reader of its format, `READER_VERSIONS`). The same bytes
    chunked another way are another version, with chunks of their own, so re-chunking
    never leaves a longer old version's tail chunks live under the id. 24 hex digits."""
    if chunking and suffix.lower() in READER_VERSIONS:
        chunking = f"{chunking}|{READER_VERSIONS[suffix.lower()]}"
    if not chunking:
        return sha256[:24]
    return hashlib.sha256(f"{sha256}\x00{chunking}".encode()).hexdigest()[:24]


def chunking_key(settings: Settings, embedder: Embedder) -> str:
    """What decides the chunks of a file besides its bytes (the settings `chunk_file` reads)."""
    i = settings.ingest
    max_tokens = min(i.chunk_tokens or embedder.max_tokens, embedder.max_tokens)
    # v2: pdfium's U+FFFE read as a hyphen (ragkit/ingest/loaders.py): a PDF ingested before is re-read
    # v3: long blocks cut at the sentences of ragkit.evidence.sentences (abbreviations kept whole)
    return (f"v3|{i.pdf_engine}|{max_tokens}|{i.min_chunk_tokens}|{i.max_pages}|{i.ocr_lang}|{i.tables}|"
            f"{embedder.name}")


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


def check_size(path: Path, settings: Settings) -> None:
    """A file over `ingest.max_file_mb` is refused before it is read."""
    try:
        size = path.stat().st_size
    except OSError:
        size = 0
    if size > settings.ingest.max_file_mb * 1024 * 1024:
        raise DocumentError(str(path), f"file is {size / 1e6:.0f} MB, over the limit of {settings.ingest.max_file_mb} MB (setting ingest.max_file_mb)")


def chunk_file(path: Path, settings: Settings, embedder: Embedder) -> tuple[list[Chunk], int, int | None]:
    """Parse one file into chunks. Returns (chunks, n_sections, n_pages)."""
    check_size(path, settings)
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



def _stat_key(path: Path) -> tuple | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_size, st.st_mtime_ns, st.st_ino)
