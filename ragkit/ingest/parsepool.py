"""The parse workers of the ingest job (ragkit.ingest.pipeline re-exports them): a pool of
spawned processes that parse files ahead of the embedder, results taken in file order,
and a worker that crashes failing only its file. The parse job itself is
`ragkit.ingest.pipeline.parse_one`."""

from __future__ import annotations

import os
import time
from contextlib import contextmanager
from typing import Callable

from ragkit.config import Settings


def auto_workers() -> int:
    """Parse processes when `ingest.workers` is 0: the cores this process may use, less
    the load already on them, less one for the embedder's own process; at least one."""
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cores = os.cpu_count() or 1
    try:
        load = os.getloadavg()[0]
    except OSError:
        load = 0.0
    return max(1, min(8, int(cores - load) - 1))


def error_reason(exc: BaseException) -> str:
    """The per-file message for an unexpected failure (a bug or a library error)."""
    return f"could not be read ({type(exc).__name__}: {str(exc)[:160]})"


# ------------------------------------------------------------------ parse workers

# What a parse worker process holds (set by _worker_init; its embedder, for the token
# counts that bound a chunk, loaded on the worker's first file): the process's own state,
# gone with it; the main process never fills it.
_WORKER: dict = {}


def _worker_init(settings: Settings) -> None:
    import signal
    import threading

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle: it ends the workers
    _WORKER["settings"] = settings
    parent = os.getppid()

    def watch() -> None:
        # A parent killed with -9 never tells its pool: the workers would wait on their
        # queue forever (seen here). Leave when the parent is gone (re-parented).
        while os.getppid() == parent:
            time.sleep(0.5)
        os._exit(1)

    threading.Thread(target=watch, name="ragkit-parent-watch", daemon=True).start()


_SPAWN_LOCK = __import__("threading").Lock()


@contextmanager
def _main_hidden():
    """Spawn workers without re-running the caller's `__main__` in them.

    multiprocessing's spawn imports the parent's main module in every child so that
    functions defined there can be unpickled. The parse job lives in ragkit.ingest and needs
    nothing from `__main__`, while re-importing it breaks real callers: a script that calls
    ingest() at top level without an `if __name__ == "__main__"` guard (as in the README)
    would start ingest again in each worker, and code read from stdin has no file to import.
    So while a worker is being spawned, `__main__` is a blank module (a few milliseconds)."""
    import sys
    import types

    with _SPAWN_LOCK:
        real = sys.modules.get("__main__")
        sys.modules["__main__"] = types.ModuleType("__main__")
        try:
            yield
        finally:
            if real is not None:
                sys.modules["__main__"] = real


class _Parsers:
    """Files parsed ahead of the embedder, results taken in file order.

    A pool of `workers` processes (spawned, not forked: the parent may hold torch's
    threads) keeps up to 2 x workers files in flight. A worker that dies (a crash inside
    a parser, the OOM killer) breaks the pool: the pool is rebuilt and the file retried
    once alone; if it kills its worker again, that file fails with a clear reason and the
    others go on. With workers = 0 each file is parsed here, when its turn comes."""

    def __init__(self, settings: Settings, workers: int, on_done: Callable[[str, tuple], None], job: Callable):
        from collections import deque

        self.job = job  # a module-level function (it is pickled by name): ragkit.ingest.pipeline.parse_one
        self.settings = settings
        self.embedder = None  # set by ingest: the one it embeds with, for the files parsed in this process
        self.workers = workers
        self.on_done = on_done  # called in this thread, from drain()
        self.todo: deque[str] = deque()
        self.futures: dict[str, object] = {}
        self.pool = None
        import queue

        self.done: queue.SimpleQueue = queue.SimpleQueue()  # (path, result), filled by the pool's thread

    def _pool(self):
        if self.pool is None:
            import multiprocessing
            from concurrent.futures import ProcessPoolExecutor

            self.pool = ProcessPoolExecutor(
                self.workers, mp_context=multiprocessing.get_context("spawn"),
                initializer=_worker_init, initargs=(self.settings,),
            )
        return self.pool

    def plan(self, paths: list[str]) -> None:
        self.todo.extend(paths)
        self._fill()

    def _submit(self, path: str):
        with _main_hidden():  # submit() is where the pool spawns its workers
            fut = self._pool().submit(self.job, path)

        def done(f, path=path):
            if not f.cancelled() and f.exception() is None:
                self.done.put((path, f.result()))

        fut.add_done_callback(done)
        return fut

    def _fill(self) -> None:
        from concurrent.futures.process import BrokenProcessPool

        if self.workers <= 0:
            return
        while self.todo and len(self.futures) < 2 * self.workers:
            path = self.todo.popleft()
            try:
                self.futures[path] = self._submit(path)
            except BrokenProcessPool:  # a worker died since: result() finds out and rebuilds the pool
                self.todo.appendleft(path)
                return

    def drain(self) -> None:
        """Report the parses that finished since the last call (in this thread)."""
        while True:
            try:
                path, res = self.done.get_nowait()
            except Exception:
                return
            self.on_done(path, res)

    def result(self, path: str) -> tuple:
        """The parse of `path` (the next file in order, or any file again, parsed now)."""
        from concurrent.futures.process import BrokenProcessPool

        if self.workers <= 0:  # here, with the caller's embedder (its tokenizer bounds the chunks)
            res = self.job(path, self.settings, self.embedder) if self.embedder is not None else self.job(path, self.settings)
            self.on_done(path, res)
            return res
        if path in self.todo:
            self.todo.remove(path)
        try:
            fut = self.futures.pop(path, None) or self._submit(path)
            self._fill()  # keep the workers busy while this file embeds
            res = fut.result()
        except BrokenProcessPool:
            res = self._retry_alone(path)
        self.drain()
        return res

    def _retry_alone(self, path: str) -> tuple:
        from concurrent.futures.process import BrokenProcessPool

        self._restart()
        try:
            res = self._submit(path).result()
        except BrokenProcessPool:
            self._restart()
            res = ("error", "the parser crashed on this file (its worker process died); the other files went on")
        self._fill()
        return res

    def _restart(self) -> None:
        """A broken pool: drop it and resubmit what was in flight, in order (results that
        came back before it broke are kept)."""
        ok = lambda f: f.done() and not f.cancelled() and f.exception() is None  # noqa: E731
        pending = [p for p, f in self.futures.items() if not ok(f)]
        for p in pending:
            del self.futures[p]
        self.close(kill=True)
        self.todo.extendleft(reversed(pending))

    def close(self, kill: bool = False) -> None:
        if self.pool is None:
            return
        pool, self.pool = self.pool, None
        if not kill:
            pool.shutdown(wait=True)
            return
        # ProcessPoolExecutor has no public way to stop running workers before Python 3.14
        # (terminate_workers); a parse can take seconds, so end them instead of waiting.
        procs = list((getattr(pool, "_processes", None) or {}).values())
        pool.shutdown(wait=False, cancel_futures=True)
        for p in procs:
            try:
                p.kill()
            except Exception:
                pass
        for p in procs:
            p.join(5)

