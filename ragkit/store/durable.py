"""Files that survive a crash or a power cut: written in full, flushed to the disk, then
renamed into place, with the folder's entry flushed too. And the one message a write
failure (a full disk, a read-only folder, a quota) becomes: a StoreError (exit 4) that
names the file and the reason, instead of a traceback.

Written by hand because the standard library has the pieces (os.fsync, os.replace) but no
function that joins them, and the store's own files (sidecars, the lexical index's
segments and manifest) need exactly this and nothing more.
"""

from __future__ import annotations

import os
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from ragkit.errors import StoreError


def fsync_file(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_dir(path: Path) -> None:
    """Flush a folder's entries (a rename into it); a no-op where folders cannot be opened."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass  # some filesystems refuse fsync on a folder; the data itself was flushed
    finally:
        os.close(fd)


def replace_durably(tmp: Path, dest: Path) -> None:
    """Rename a fully written and flushed `tmp` over `dest`, and flush the folder."""
    os.replace(tmp, dest)
    fsync_dir(dest.parent)


def disk_error(path: Path | str, exc: OSError) -> StoreError:
    reason = exc.strerror or str(exc)
    hint = "free some disk space, then run the command again" if exc.errno in (28, 122) else \
        "check the folder's permissions and free space, then run the command again"
    return StoreError(f"cannot write {path}: {reason}", hint=hint)


@contextmanager
def writing(path: Path | str) -> Iterator[None]:
    """Turn an OSError raised while writing the store's files into a clear StoreError."""
    try:
        yield
    except OSError as exc:
        raise disk_error(path, exc) from None
