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
        from ragkit.cluster.actors import fan_out
        from ragkit.cluster.connect import alive_nodes
        from ragkit.errors import ConfigError

        where = address or settings.cluster.address
        if not where:
            raise ConfigError("no Ray cluster to answer on", hint="give --cluster ADDRESS or set cluster.address")
        engines = settings.cluster.engines
        yield from fan_out(where, settings, _AnswerActor, lambda j: (engine_settings(settings, j), retrieval_only), "answer",
                           items, count=lambda: settings.cluster.embedders or max(1, len(alive_nodes()), len(engines)),
                           retries=ANSWER_RETRIES, in_flight=IN_FLIGHT)

    return answer_many
