"""A checklist's kinds model: which clause kind each sentence or list item of a contract is,
read from the unit's embedding by one logistic regression per kind (trained by `ragkit tune
kinds` on labelled contracts: CUAD's master_clauses.csv). A review reads every unit of a
contract at once, so every kind sees the whole contract, not the first stage's top 10: on
the 15 CUAD tuning contracts of eval/bench_review.py, AUPR 0.168 (retrieval and the
cross-encoder, per kind) -> 0.344 (eval/README.md "Data-room review").

The model and its loader live below retrieval (ragkit.retrieve.kinds: retrieval's kind lane
reads the same model); here, the embedder a review reads units with.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ragkit.retrieve.kinds import KindsModel, load_kinds_model

__all__ = ["KindsModel", "embedder_for", "load_kinds_model"]

if TYPE_CHECKING:
    from ragkit.session import Session


def embedder_for(name: str, session: "Session"):
    """The embedder a kinds model reads (`name`, a registry embedder): the session's when it is
    the same model, else that one loaded for the review (the store's embedder may be another)."""
    if session.settings.embed.model == name:
        return session.embedder
    from ragkit.embed import load_embedder

    settings = session.settings.model_copy(update={"embed": session.settings.embed.model_copy(update={"model": name})})
    return load_embedder(settings)
