"""One writer per store: the local file lock and, for a Chroma server, the lease that lives
in the server (one writer across machines)."""

from __future__ import annotations

import fcntl
import json
import os
import threading
import time
from pathlib import Path

from ragkit.errors import StoreLocked


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

    Every clock reading that another machine compares is the server's (its heartbeat: the
    record's expiry is the server's time plus `lease_s`, and a waiter asks the server what
    time it is now), so writers whose clocks disagree with each other or with the server
    still agree on when a lease runs out. The holder's own view of its lease is its
    monotonic clock, started before it asked the server the time, so it never believes
    itself to hold a lease the others think has run out.

    Renewal is conditional too: a holder renews only while its own lease is at least
    `lease_s / 6` from expiry (only after expiry may another writer take it), and only if
    the record is still its own; otherwise the lease is *lost*, and `check()`, which the
    store calls before every write, stops the writer with exit 5. Chroma has no
    compare-and-swap, so one window remains: a pause of more than `lease_s / 6` between the
    last check and the update itself (a few microseconds of code)."""

    RECORD = "writer"

    def __init__(self, client, collection: str, *, wait_s: float = 0.0, lease_s: float = 60.0):
        import socket
        import uuid

        self.client = client
        self.col = client.get_or_create_collection(f"{collection}-lock", embedding_function=None)
        self.where = collection
        self.wait_s = wait_s
        self.lease_s = lease_s
        self.owner = uuid.uuid4().hex
        self.info = {"owner": self.owner, "host": socket.gethostname(), "pid": os.getpid()}
        self._stop = None
        self._thread = None
        self._deadline = 0.0  # when the lease this writer last wrote runs out (time.monotonic(), this process)
        self.lost: str | None = None  # why this writer no longer holds the lease

    def _server_now(self) -> float:
        """The server's time, in seconds since the epoch (its heartbeat is in nanoseconds)."""
        return self.client.heartbeat() / 1e9

    def _holder(self) -> dict | None:
        got = self.col.get(ids=[self.RECORD], include=["metadatas"])
        return (got["metadatas"] or [None])[0] if got["ids"] else None

    def _meta(self) -> tuple[dict, float]:
        """A record of this writer whose lease runs `lease_s` from now by the server's clock,
        and when it runs out by this process's monotonic clock (read first: never later)."""
        started = time.monotonic()
        return {**self.info, "expires": self._server_now() + self.lease_s}, started + self.lease_s

    def __enter__(self) -> "ServerLease":
        give_up = time.monotonic() + self.wait_s
        while True:
            held = self._holder()
            if held is not None and float(held.get("expires", 0)) < self._server_now():
                self.col.delete(ids=[self.RECORD], where={"owner": held["owner"]})  # expired lease
                held = None
            if held is None:
                meta, runs_out = self._meta()
                self.col.add(ids=[self.RECORD], embeddings=[[0.0]], metadatas=[meta])
                held = self._holder()
                if held is not None and held.get("owner") == self.owner:
                    self._deadline = runs_out
                    break
            if time.monotonic() >= give_up:
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
        if time.monotonic() >= self._deadline - margin:
            self.lost = f"its {self.lease_s:.0f} s lease ran out before it was renewed (the process was paused or cut off)"
            return False
        held = self._holder()
        if held is None or held.get("owner") != self.owner:
            self.lost = "another writer took the lease over"
            return False
        meta, runs_out = self._meta()
        if time.monotonic() >= self._deadline - margin:  # paused while reading: the lease may be another's now
            self.lost = f"its {self.lease_s:.0f} s lease ran out before it was renewed (the process was paused or cut off)"
            return False
        self.col.update(ids=[self.RECORD], metadatas=[meta])
        self._deadline = runs_out
        return True

    def check(self) -> None:
        """Called before every write: a writer whose lease is lost or run out stops (exit 5)
        rather than write beside the writer that may hold it now."""
        if self.lost is None and time.monotonic() >= self._deadline:
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
                from ragkit.store.chroma import ChromaStore, store_token

                client = ChromaStore.connect(self.settings.store_url, store_token(self.settings))
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


