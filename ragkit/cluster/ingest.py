"""`ingest --cluster`: the pipeline's ingest job with Ray doing the parsing and the embedding.

What runs where:
- Ray tasks (any node, one CPU each) run the pipeline's own per-file job on the file's
  bytes, `ragkit.ingest.pipeline.parse_bytes` (sections, token-bounded chunks), retried by
  Ray when the worker process or its node dies (`max_retries`);
- Ray actors (spread over the nodes) each load the embedder once (`load_embedder`, the backend
  chosen as today) and embed batches of texts; an actor that dies is restarted and its
  batch retried;
- this process, the driver, runs `ragkit.ingest.ingest` itself: it holds the one writer lease,
  looks every text up in the embed-once cache (the store) before anything is sent to an
  actor, writes each document's chunks and then its record, in file order, and reports
  progress. Nothing on the cluster writes to the store.

Files are read by the driver and their bytes sent with the task (through Ray's object
store): a node never opens the driver's paths, so the documents need exist only where the
driver runs (tests/test_hosts.py runs it on hosts that share no filesystem)."""

from __future__ import annotations

import time
from collections import deque
from pathlib import Path
from typing import Callable

from ragkit.config import Settings
from ragkit.errors import ConfigError, DocumentError
from ragkit.ingest.pipeline import IngestReport, error_reason, file_bytes, ingest, parse_bytes

PARSE_RETRIES = 3  # Ray re-runs a parse whose worker died this many times
EMBED_RETRIES = 3  # an embedder actor is restarted (and its batch re-sent) this many times


def _here() -> str:
    """This node's address, as the cluster knows it."""
    import ray

    return ray.util.get_node_ip_address()


def _parse_sent(name: str, data: bytes, settings: Settings) -> tuple:
    """The Ray task: one file's bytes parsed on whichever node runs it, and that node."""
    return parse_bytes(name, data, settings), _here()


class _EmbedActor:
    """One embedder per actor, loaded once (lazily: on the first batch)."""

    def __init__(self, settings: Settings):
        import os

        import ragkit  # noqa: F401  (offline switches, before any model library)
        from ragkit.embed import load_embedder

        if not settings.embed.threads:
            # Ray starts a worker with OMP_NUM_THREADS=1 when its actor asks for no CPUs: torch
            # then embeds on one thread (400 texts: 1.00 s against 0.67 s on this machine's two
            # cores). The embedder is the node's main work: it gets the node's cores, as the local
            # embedder does.
            n = len(os.sched_getaffinity(0))
            os.environ["OMP_NUM_THREADS"] = str(n)
            settings = settings.model_copy(update={"embed": settings.embed.model_copy(update={"threads": n})})
        self.embedder = load_embedder(settings)

    def identity(self) -> tuple:
        e = self.embedder
        return (e.name, int(e.dim), getattr(e, "variant", None) or type(e).__name__, int(e.max_tokens))

    def embed(self, texts: list[str]):
        import numpy as np

        return np.asarray(self.embedder.embed_documents(texts), dtype=np.float32), _here()


class ClusterEmbedder:
    """The driver's embedder: the local embedder's identity and token counts (no model is
    loaded here), `embed_documents` spread over the embedder actors. The actors start on the
    first texts to embed, so a re-ingest with nothing new starts none."""

    def __init__(self, settings: Settings, local, n_actors: int):
        self.settings = settings
        self.local = local
        self.n_actors = n_actors
        self.name = local.name
        self.dim = local.dim
        self.max_tokens = local.max_tokens
        self.variant = getattr(local, "variant", None) or type(local).__name__
        self.actors: list = []
        self.started = 0  # actors started in this run
        self.batches = 0
        self.embedded_on: dict[str, int] = {}  # node address -> texts embedded there

    def count_tokens(self, texts: list[str]) -> list[int]:
        return self.local.count_tokens(texts)

    def embed_query(self, text: str) -> list[float]:
        return self.local.embed_query(text)

    def _start(self) -> list:
        import ray

        if self.actors:
            return self.actors
        from ragkit.cluster.connect import placements

        cls = ray.remote(_EmbedActor)
        # the settings by value: a restarted actor needs its constructor's arguments again
        # (one .options() call: Ray Client's actor class has no second one)
        self.actors = [cls.options(max_restarts=EMBED_RETRIES, max_task_retries=EMBED_RETRIES, scheduling_strategy=where)
                       .remote(self.settings) for where in placements(self.n_actors)]
        self.started = len(self.actors)
        want = (self.name, int(self.dim), self.variant, int(self.max_tokens))
        for have in ray.get([a.identity.remote() for a in self.actors]):
            if tuple(have) != want:
                # a cached vector must be what this embedder computes (ragkit.ingest.embcache)
                raise ConfigError(f"an embedder on the cluster is {have[0]} {have[2]} (dim {have[1]}), the driver's is "
                                  f"{want[0]} {want[2]} (dim {want[1]})",
                                  hint="set embed.backend and embed.precision explicitly, the same on every node")
        return self.actors

    def embed_documents(self, texts: list[str], progress=None) -> list[list[float]]:
        import ray

        if not texts:
            return []
        actors = self._start()
        size = max(1, self.settings.embed.batch_size)
        # length-sorted batches (a batch pads to texts of its own length), dealt round robin
        order = sorted(range(len(texts)), key=self.count_tokens(texts).__getitem__)
        batches = [order[i : i + size] for i in range(0, len(order), size)]
        # dealt on from where the last call stopped: a file of one batch must not always go to
        # the first actor (small files one at a time left every other node idle)
        refs = [actors[(self.batches + j) % len(actors)].embed.remote([texts[i] for i in idx]) for j, idx in enumerate(batches)]
        self.batches += len(refs)
        out: list = [None] * len(texts)
        pending = dict(zip(refs, batches))
        while pending:  # streamed back as they finish
            done, _ = ray.wait(list(pending), num_returns=1)
            for ref in done:
                idx = pending.pop(ref)
                vectors, node = ray.get(ref)
                self.embedded_on[node] = self.embedded_on.get(node, 0) + len(idx)
                for i, v in zip(idx, vectors):
                    out[i] = v.tolist()
                if progress is not None:
                    progress(len(idx))
        return out

    def close(self) -> None:
        import ray

        for a in self.actors:
            try:
                ray.kill(a)
            except Exception:
                pass
        self.actors = []


class RayParsers:
    """The pipeline's parse pool, as Ray tasks: up to `in_flight` files parsed ahead, results
    taken in file order by the driver (`result`), finished parses reported as they land
    (`drain`). A parse whose worker keeps dying fails that file only."""

    def __init__(self, settings: Settings, on_done: Callable[[str, tuple], None], in_flight: int):
        import ray

        self.task = ray.remote(_parse_sent).options(max_retries=PARSE_RETRIES, retry_exceptions=False)
        self.settings = settings
        self.settings_ref = ray.put(settings)
        self.parsed_on: dict[str, int] = {}  # node address -> files parsed there
        self.on_done = on_done
        self.in_flight = max(1, in_flight)
        self.todo: deque[str] = deque()
        self.refs: dict[str, object] = {}  # path -> ObjectRef, not yet taken by result()
        self.landed: dict[str, tuple] = {}  # path -> result, reported by drain(), not yet taken

    def plan(self, paths: list[str]) -> None:
        self.todo.extend(paths)
        self._fill()

    def _send(self, path: str):
        """The file's parse task, its bytes sent with it (a file the driver cannot read fails
        here, in the local parse's words, and is never sent)."""
        import ray

        try:
            data = file_bytes(path, self.settings)
        except DocumentError as exc:
            return ray.put((("error", exc.reason), None))
        return self.task.remote(Path(path).name, data, self.settings_ref)

    def _fill(self) -> None:
        while self.todo and len(self.refs) < self.in_flight:
            path = self.todo.popleft()
            self.refs[path] = self._send(path)

    def _get(self, ref) -> tuple:
        import ray
        from ray.exceptions import RayError, RayTaskError

        try:
            result, node = ray.get(ref)
        except RayTaskError as exc:  # parse_one turns every file's failure into ("error", ...): a bug here
            return ("error", error_reason(exc.cause if getattr(exc, "cause", None) else exc))
        except RayError as exc:
            return ("error", f"the parser's Ray worker died on this file {PARSE_RETRIES + 1} times "
                             f"({type(exc).__name__}); the other files went on")
        if node is not None:
            self.parsed_on[node] = self.parsed_on.get(node, 0) + 1
        return result

    def drain(self) -> None:
        import ray

        waiting = [r for p, r in self.refs.items() if p not in self.landed]
        if not waiting:
            return
        done, _ = ray.wait(waiting, num_returns=len(waiting), timeout=0)
        done_ids = {d.hex() for d in done}
        for path, ref in list(self.refs.items()):
            if path not in self.landed and ref.hex() in done_ids:
                self.landed[path] = self._get(ref)
                self.on_done(path, self.landed[path])

    def result(self, path: str) -> tuple:
        if path in self.todo:
            self.todo.remove(path)
        ref = self.refs.get(path)
        if ref is None:  # asked again (the file changed since it was hashed): parse it again
            ref = self.refs[path] = self._send(path)
        self._fill()
        if path in self.landed:
            res = self.landed.pop(path)
        else:
            res = self._get(ref)
            self.on_done(path, res)
        del self.refs[path]
        self._fill()
        self.drain()
        return res

    def close(self, kill: bool = False) -> None:
        import ray

        for ref in self.refs.values():
            try:
                ray.cancel(ref, force=kill)
            except Exception:
                pass
        self.refs.clear()
        self.todo.clear()


class _ParsersFactory:
    def __init__(self, in_flight: int):
        self.workers = in_flight
        self.made: list[RayParsers] = []

    def __call__(self, settings: Settings, on_done):
        self.made.append(RayParsers(settings, on_done, self.workers))
        return self.made[-1]


def ingest_on_cluster(
    paths: list[Path],
    settings: Settings,
    address: str | None = None,
    *,
    prune: bool = False,
    wait_s: float = 0.0,
    on_event: Callable[[str, dict], None] | None = None,
    lookahead: bool | None = None,
) -> IngestReport:
    """`ragkit.ingest.ingest` with parsing in Ray tasks and embedding in Ray actors on the
    cluster at `address` (else setting cluster.address; "auto" = the cluster on this
    machine). The same report, events, store and commit rule as the local ingest. The next
    file's texts go to the actors while the driver writes this one (`lookahead`, on unless
    False: the control for eval/bench_cluster.py)."""
    from ragkit.cluster.connect import alive_nodes, connect, disconnect
    from ragkit.embed import load_embedder
    from ragkit.store import follow_store_embedder

    settings = follow_store_embedder(settings)  # the store's own embedder, as a local ingest
    address = address or settings.cluster.address
    if not address:
        raise ConfigError("no Ray cluster to ingest on", hint="give --cluster ADDRESS or set cluster.address")
    ours = connect(address, settings.cluster.connect_timeout_s)
    try:
        nodes = alive_nodes()
        cpus = int(sum(n.get("Resources", {}).get("CPU", 0) for n in nodes)) or 1
        embedder = ClusterEmbedder(settings, load_embedder(settings), settings.cluster.embedders or max(1, len(nodes)))
        t0 = time.perf_counter()
        parsers = _ParsersFactory(2 * cpus)
        try:
            report = ingest(paths, settings, prune=prune, wait_s=wait_s, on_event=on_event,
                            embedder=embedder, parsers=parsers,
                            # the actors never wait on the driver's store writes, whatever ingest.lookahead says
                            lookahead=True if lookahead is None else lookahead)
        finally:
            embedder.close()
        report.timings["cluster_nodes"] = len(nodes)
        report.timings["cluster_cpus"] = cpus
        report.timings["embed_actors"] = embedder.started
        report.timings["embed_batches"] = embedder.batches
        report.timings["cluster_wall_s"] = time.perf_counter() - t0
        for pool in parsers.made:
            for node, n in pool.parsed_on.items():
                report.nodes.setdefault(node, {"parsed": 0, "embedded": 0})["parsed"] += n
        for node, n in embedder.embedded_on.items():
            report.nodes.setdefault(node, {"parsed": 0, "embedded": 0})["embedded"] += n
        return report
    finally:
        if ours:
            disconnect()
