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
        from ragkit.compare.review import kinds_model_for

        self.kinds = kinds_model_for(self.items, self.session)

    def review(self, name: str):
        from ragkit.compare.review import review_contract

        return review_contract(name, self.items, self.session, kinds_model=self.kinds).to_json()


def review_on_cluster(address: str | None) -> Callable:
    """A `review_many` for `ragkit.compare.review.review`: connects on first use, one actor per
    alive node (cluster.embedders, when set, is the count), and disconnects at the end."""

    def review_many(settings: Settings, checklist: str, item_ids: list[str], names: list[str]) -> Iterator:
        from ragkit.cluster.actors import fan_out
        from ragkit.cluster.connect import alive_nodes
        from ragkit.compare.review import ContractReview
        from ragkit.errors import ConfigError

        where = address or settings.cluster.address
        if not where:
            raise ConfigError("no Ray cluster to review on", hint="give --cluster ADDRESS or set cluster.address")
        for got in fan_out(where, settings, _ReviewActor, lambda j: (settings, checklist, item_ids), "review", names,
                           count=lambda: settings.cluster.embedders or len(alive_nodes()),
                           retries=REVIEW_RETRIES, in_flight=IN_FLIGHT):
            yield ContractReview.from_json(got)

    return review_many
