"""`ragkit review PATH... --cluster ADDRESS`: contracts fanned out to Ray actors, each loading
the session (embedder, store, reranker) and the checklist's kinds model once
(`ragkit.compare.review.review_contract`); each contract's review comes back to the driver,
which logs it (the resumable review log) and writes the workbook, exactly as a local run.

The store must be readable from every node: a Chroma server (`store_url`), or, on one
machine, the embedded store's folder."""

from __future__ import annotations

from typing import Callable, Iterator

from ragkit.config import Settings

REVIEW_RETRIES = 3  # a reviewing actor is restarted (and its contract reviewed again) this many times
IN_FLIGHT = 2  # contracts queued per actor, so none idles between two


class _ReviewActor:
    def __init__(self, settings: Settings, checklist: str, item_ids: list[str]):
        import ragkit  # noqa: F401  (offline switches, before any model library)
        from ragkit.compare.checklist import load_checklist
        from ragkit.session import Session

        self.session = Session(settings)
        _, items = load_checklist(checklist)
        self.items = [i for i in items if i.id in set(item_ids)]
        self.kinds = None
        if self.items and self.items[0].kind_model:
            from ragkit.compare.kinds import load_kinds_model

            self.kinds = load_kinds_model(self.items[0].kind_model, self.session)

    def review(self, name: str):
        from ragkit.compare.review import review_contract

        return review_contract(name, self.items, self.session, kinds_model=self.kinds).to_json()


def review_on_cluster(address: str | None) -> Callable:
    """A `review_many` for `ragkit.compare.review.review`: connects on first use, one actor per
    alive node (cluster.embedders, when set, is the count), and disconnects at the end."""

    def review_many(settings: Settings, checklist: str, item_ids: list[str], names: list[str]) -> Iterator:
        import ray

        from ragkit.cluster.connect import alive_nodes, connect, disconnect
        from ragkit.compare.review import ContractReview
        from ragkit.errors import ConfigError

        where = address or settings.cluster.address
        if not where:
            raise ConfigError("no Ray cluster to review on", hint="give --cluster ADDRESS or set cluster.address")
        if not names:
            return
        ours = connect(where, settings.cluster.connect_timeout_s)
        actors: list = []
        try:
            n = min(settings.cluster.embedders or max(1, len(alive_nodes())), len(names))
            cls = ray.remote(_ReviewActor).options(max_restarts=REVIEW_RETRIES, max_task_retries=REVIEW_RETRIES,
                                                   scheduling_strategy="SPREAD")
            actors = [cls.remote(settings, checklist, item_ids) for _ in range(n)]
            todo = list(reversed(names))
            pending: dict = {}  # ref -> actor index

            def submit(j: int) -> None:
                pending[actors[j].review.remote(todo.pop())] = j

            for _ in range(IN_FLIGHT):
                for j in range(n):
                    if todo:
                        submit(j)
            while pending:
                done, _ = ray.wait(list(pending), num_returns=1)
                for ref in done:
                    j = pending.pop(ref)
                    got = ray.get(ref)
                    if todo:
                        submit(j)
                    yield ContractReview.from_json(got)
        finally:
            for a in actors:
                try:
                    ray.kill(a)
                except Exception:
                    pass
            if ours:
                disconnect()

    return review_many
