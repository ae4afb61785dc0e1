"""What one `ragkit serve` process holds: its Session (the loaded embedder, reranker,
generator: one `Llama`, so its KV cache carries over from request to request, and the
open store), and the generation queue.

Routes reach it as `request.app.state.ragkit`:

    state = request.app.state.ragkit
    state.settings            # ragkit.config.Settings
    state.session             # ragkit.session.Session: what ask/compare/retrieve are given
    state.generator           # the loaded generator (ragkit.generate.Generator), or None
    state.embedder            # the loaded embedder, or None
    state.store()             # the session's open ragkit.store.ChromaStore (raises StoreError)
    state.documents()         # the ingested DocRecords ([] while no store exists yet)
    state.reload_documents()  # after an ingest or upload: reopen the store, list again
                              # (`state.invalidate()`: the same, without the listing)
    state.busy                # a generation is running
    with state.generator_lock:   # use the generator exclusively (e.g. a comparison),
        ...                      # after the chat requests already queued

One generation at a time: `run_generation(fn, job)` runs `fn` holding the generator,
after the jobs admitted before it (first come, first served). `admit()` refuses a job
when `max_queue` are already waiting (QueueFull -> HTTP 429).
"""

from __future__ import annotations

import math
import threading
import time
from collections import deque
from typing import Callable, TypeVar

from ragkit.config import Settings
from ragkit.errors import StoreError

T = TypeVar("T")


class Cancelled(Exception):
    """The client went away: the generation for it stops (raised from `on_text`)."""


class QueueFull(Exception):
    def __init__(self, waiting: int, retry_after: int):
        super().__init__(f"{waiting} requests are already waiting for the generator")
        self.waiting = waiting
        self.retry_after = retry_after


class Job:
    """One admitted request. Setting `cancel` stops it, waiting or generating."""

    def __init__(self) -> None:
        self.cancel = threading.Event()
        self.admitted_at = time.monotonic()


class ServeState:
    def __init__(self, settings: Settings, *, token: str | None = None, max_queue: int = 4):
        from ragkit.session import Session

        self.settings = settings
        self.session = Session(settings)
        self.token = token
        self.max_queue = max(0, int(max_queue))
        self.created = int(time.time())
        self.busy = False
        self.stats = {"answered": 0, "cancelled": 0, "refused": 0, "failed": 0}
        self._load_lock = threading.Lock()
        self._store_lock = threading.Lock()
        self._jobs: set[Job] = set()
        self._admit_lock = threading.Lock()
        self._cond = threading.Condition()
        self._waiting: deque[Job] = deque()
        self._durations: deque[float] = deque(maxlen=16)

    # ------------------------------------------------------------ models

    def load(self) -> None:
        """Load the session's embedder and generator now (the generator checked to fit).
        Raises ModelNotFound (and the like) when the model cannot load."""
        with self._load_lock:
            self.session.embedder
            self.session.generator

    @property
    def generator(self):
        return self.session.generator if self.session.has_generator else None

    @property
    def embedder(self):
        return self.session.embedder if self.session.has_embedder else None

    @property
    def loaded(self) -> bool:
        return self.session.has_generator and self.session.has_embedder

    @property
    def generator_name(self) -> str:
        return getattr(self.generator, "name", None) or self.settings.generator.model

    # ------------------------------------------------------------ store

    def has_store(self) -> bool:
        """False while there is no embedded store folder yet (nothing ingested)."""
        return bool(self.settings.store_url) or (self.settings.store / "chroma").exists()

    def store(self):
        """The session's open ChromaStore, opened once (a failure is not kept: the next call
        retries). Raises StoreError: no store yet, another embedder, a newer schema."""
        with self._store_lock:
            return self.session.store

    def documents(self) -> list:
        """The ingested documents ([] while no store exists); StoreError if it is unreadable."""
        if not self.has_store():
            return []
        try:
            return self.store().documents()
        except StoreError:
            raise
        except Exception as exc:  # a Chroma error on a store that changed under us
            self.session.reopen_store()
            raise StoreError(f"cannot read the store: {str(exc).splitlines()[0][:200]}") from None

    def invalidate(self) -> None:
        """The store changed (an upload, a removal): reopen it on next use."""
        with self._store_lock:
            self.session.reopen_store()

    def reload_documents(self) -> list:
        """Reopen the store (e.g. after an upload created it) and list its documents."""
        self.invalidate()
        return self.documents()

    # ------------------------------------------------------------ the generation queue

    @property
    def pending(self) -> int:
        """Admitted requests: the one generating plus those waiting."""
        return len(self._jobs)

    @property
    def waiting(self) -> int:
        """Requests admitted and waiting for the generator (not the one generating)."""
        return len(self._waiting)

    def admit(self) -> Job:
        """A job for a request that will generate, or QueueFull when `max_queue` requests
        already wait behind the one generating."""
        with self._admit_lock:
            if len(self._jobs) >= self.max_queue + 1:
                self.stats["refused"] += 1
                raise QueueFull(len(self._jobs), self.retry_after(len(self._jobs)))
            job = Job()
            self._jobs.add(job)
            return job

    def release(self, job: Job) -> None:
        with self._admit_lock:
            self._jobs.discard(job)

    def retry_after(self, ahead: int | None = None) -> int:
        """Seconds until a slot is likely free: the recent generation time per request."""
        per = sum(self._durations) / len(self._durations) if self._durations else 10.0
        ahead = self.pending if ahead is None else ahead
        return max(1, min(300, math.ceil(per * max(1, ahead - self.max_queue))))

    def run_generation(self, fn: Callable[[], T], job: Job) -> T:
        """Run `fn` (in the calling worker thread) holding the generator, after the jobs
        that started waiting before this one. Raises Cancelled if `job` is cancelled
        while it waits."""
        self._acquire(job)
        t0 = time.monotonic()
        try:
            return fn()
        finally:
            self._durations.append(time.monotonic() - t0)
            self._release_generator()

    @property
    def generator_lock(self) -> "GeneratorLock":
        """`with state.generator_lock:` holds the generator (blocking, in a worker thread)."""
        return GeneratorLock(self)

    def _acquire(self, job: Job) -> None:
        with self._cond:
            self._waiting.append(job)
            try:
                while self.busy or self._waiting[0] is not job:
                    if job.cancel.is_set():
                        raise Cancelled()
                    self._cond.wait(0.1)
                if job.cancel.is_set():
                    raise Cancelled()
            except BaseException:
                self._waiting.remove(job)
                self._cond.notify_all()
                raise
            self._waiting.popleft()
            self.busy = True

    def _release_generator(self) -> None:
        with self._cond:
            self.busy = False
            self._cond.notify_all()

    def cancel_all(self) -> None:
        """Stop every waiting and running job (server shutdown)."""
        with self._admit_lock:
            for job in self._jobs:
                job.cancel.set()


class GeneratorLock:
    """A context manager over ServeState's generator queue (not admitted, never refused)."""

    def __init__(self, state: ServeState):
        self.state = state

    def __enter__(self) -> "GeneratorLock":
        self.state._acquire(Job())
        return self

    def __exit__(self, *exc) -> None:
        self.state._release_generator()
