"""`eval run SET --cluster ADDRESS`: questions fanned out to Ray actors, each loading the
retrieval (embedder, lexical index, reranker) and the generator once (`ragkit.eval.run.Answerer`);
the records come back to the driver, which writes them to the run's resumable answers.jsonl
(ragkit.eval.run.run_eval) and scores them exactly as a local run.

The store must be readable from every node: a Chroma server (`store_url`), or, on one
machine, the embedded store's folder."""

from __future__ import annotations

from typing import Callable, Iterator

from ragkit.config import Settings

ANSWER_RETRIES = 3  # an answering actor is restarted (and its question re-asked) this many times
IN_FLIGHT = 2  # questions queued per actor, so none idles between two


def engine_settings(settings: Settings, j: int) -> Settings:
    """The settings of answering actor `j`: its engine of `cluster.engines` (round robin), or
    the settings as they are when no pool is named."""
    engines = settings.cluster.engines
    if not engines:
        return settings
    gen = settings.generator.model_copy(update={"backend": "openai", "base_url": engines[j % len(engines)]})
    return settings.model_copy(update={"generator": gen})


class _AnswerActor:
    def __init__(self, settings: Settings, retrieval_only: bool):
        import ragkit  # noqa: F401  (offline switches, before any model library)
        from ragkit.eval.run import Answerer

        self.answerer = Answerer(settings, retrieval_only)

    def answer(self, item) -> dict:
        return self.answerer.answer(item)


def answer_on_cluster(address: str | None) -> Callable:
    """An `answer_many` for `run_eval`: connects on first use, one actor per alive node or per
    engine of `cluster.engines`, whichever is more (cluster.embedders, when set, is the
    count), and disconnects at the end."""

    def answer_many(settings: Settings, retrieval_only: bool, items: list) -> Iterator[dict]:
        import ray

        from ragkit.cluster.connect import alive_nodes, connect, disconnect
        from ragkit.errors import ConfigError

        where = address or settings.cluster.address
        if not where:
            raise ConfigError("no Ray cluster to answer on", hint="give --cluster ADDRESS or set cluster.address")
        if not items:
            return
        ours = connect(where, settings.cluster.connect_timeout_s)
        actors: list = []
        try:
            engines = settings.cluster.engines
            n = min(settings.cluster.embedders or max(1, len(alive_nodes()), len(engines)), len(items))
            cls = ray.remote(_AnswerActor).options(max_restarts=ANSWER_RETRIES, max_task_retries=ANSWER_RETRIES,
                                                   scheduling_strategy="SPREAD")
            actors = [cls.remote(engine_settings(settings, j), retrieval_only) for j in range(n)]
            todo = list(reversed(items))
            pending: dict = {}  # ref -> actor index
            load = [0] * n

            def submit(j: int) -> None:
                item = todo.pop()
                pending[actors[j].answer.remote(item)] = j
                load[j] += 1

            for _ in range(IN_FLIGHT):
                for j in range(n):
                    if todo:
                        submit(j)
            while pending:
                done, _ = ray.wait(list(pending), num_returns=1)
                for ref in done:
                    j = pending.pop(ref)
                    load[j] -= 1
                    rec = ray.get(ref)
                    if todo:
                        submit(j)
                    yield rec
        finally:
            for a in actors:
                try:
                    ray.kill(a)
                except Exception:
                    pass
            if ours:
                disconnect()

    return answer_many
