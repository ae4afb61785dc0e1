"""A checklist's kinds model: which clause kind each sentence or list item of a contract is,
read from the unit's embedding by one logistic regression per kind (trained by `ragkit tune
kinds` on labelled contracts: CUAD's master_clauses.csv). A review reads every unit of a
contract at once, so every kind sees the whole contract, not the first stage's top 10: on
the 15 CUAD tuning contracts of eval/bench_review.py, AUPR 0.168 (retrieval and the
cross-encoder, per kind) -> 0.344 (eval/README.md "Data-room review").

The folder: `kinds.npz` (W: kinds x dim, b: kinds), `kinds.json` (the kinds in W's order,
the embedder the vectors come from, the review floor fitted on the model's scores with the
sha256 of the kinds.npz it was fitted on), MODEL_CARD.md.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from ragkit.errors import ConfigError

if TYPE_CHECKING:
    from ragkit.session import Session


@dataclass
class KindsModel:
    folder: Path
    kinds: list[str]
    W: "object"  # numpy array, kinds x dim
    b: "object"  # numpy array, kinds
    embedder: str  # the registry embedder its vectors are read with
    floor: float | None  # a cell's floor on the model's logit (fitted on tuning contracts), or None
    name: str | None = None

    def logits(self, vectors) -> "object":
        """units x kinds logits for unit vectors (units x dim)."""
        import numpy as np

        return np.asarray(vectors, dtype=np.float32) @ self.W.T + self.b


def load_kinds_model(name_or_path: str, session: "Session") -> KindsModel:
    """A kinds model by registry name (pinned files checked before loading) or folder; its
    floor only when kinds.npz is the file it was fitted on."""
    import numpy as np

    from ragkit.models import REGISTRY, file_matches, resolve

    folder = resolve(name_or_path, "kinds-model", session.settings.cache_dir)
    try:
        meta = json.loads((folder / "kinds.json").read_text(encoding="utf-8"))
        arrays = np.load(folder / "kinds.npz")
        W, b = arrays["W"].astype(np.float32), arrays["b"].astype(np.float32)
    except (OSError, ValueError, KeyError) as exc:
        raise ConfigError(f"kinds model {name_or_path}: cannot read {folder}: {exc}",
                          hint="a kinds model folder holds kinds.npz and kinds.json (`ragkit tune kinds`)") from None
    kinds = list(meta.get("kinds") or [])
    if W.shape[0] != len(kinds) or b.shape[0] != len(kinds):
        raise ConfigError(f"kinds model {name_or_path}: kinds.npz has {W.shape[0]} kinds, kinds.json names {len(kinds)}")
    floor = meta.get("floor")
    if floor is not None:
        fitted = meta.get("fitted_model_sha256")
        if not fitted or not file_matches(folder / "kinds.npz", fitted):
            raise ConfigError(f"kinds model {name_or_path}: kinds.npz is not the file its floor was fitted on",
                              hint="fit the floor again on this file (eval/bench_review.py --fit-floor) or remove it")
    return KindsModel(folder=folder, kinds=kinds, W=W, b=b, embedder=str(meta.get("embedder") or "minilm"),
                      floor=None if floor is None else float(floor),
                      name=name_or_path if name_or_path in REGISTRY else None)


def embedder_for(name: str, session: "Session"):
    """The embedder a kinds model reads (`name`, a registry embedder): the session's when it is
    the same model, else that one loaded for the review (the store's embedder may be another)."""
    if session.settings.embed.model == name:
        return session.embedder
    from ragkit.embed import load_embedder

    settings = session.settings.model_copy(update={"embed": session.settings.embed.model_copy(update={"model": name})})
    return load_embedder(settings)
