"""A kinds model (one logistic regression per clause kind over a unit's embedding, trained by
`ragkit tune kinds` on labelled contracts: CUAD's master_clauses.csv) and the kind lane it
gives retrieval.

The model reads a vector, so it can read every chunk of a named contract at the cost of one
matrix product over the vectors the store already holds (the sidecar beside the store): the
first stage's top 10 reads a few percent of a 60-page contract. When a question asks for a
kind the model knows (the question's vector against each kind's own text: its title and
CUAD's description of it), the chunks the model rates highest for that kind join the
cross-encoder's pool (`retrieve.kinds_lane`) and their order is fused with the others
(`retrieve.kinds_weight`). Figures: eval/README.md "The kind lane". A review
(ragkit.compare.review) reads the same model unit by unit.

The folder: `kinds.npz` (W: kinds x dim, b: kinds), `kinds.json` (the kinds in W's order,
each kind's text, the embedder the vectors come from, the review floor fitted on the model's
scores with the sha256 of the kinds.npz it was fitted on), MODEL_CARD.md.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
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
    texts: dict[str, str] = field(default_factory=dict)  # kind -> what it is ("Governing Law: Which state's law ...")

    def logits(self, vectors, kind: str | None = None) -> "object":
        """units x kinds logits for unit vectors (units x dim); with `kind`, that kind's column
        alone (one dot product per unit)."""
        import numpy as np

        v = np.asarray(vectors, dtype=np.float32)
        if kind is None:
            return v @ self.W.T + self.b
        j = self.kinds.index(kind)
        return v @ self.W[j] + self.b[j]


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
    texts = {k: str(v) for k, v in (meta.get("texts") or {}).items() if k in kinds}
    return KindsModel(folder=folder, kinds=kinds, W=W, b=b, embedder=str(meta.get("embedder") or "minilm"),
                      floor=None if floor is None else float(floor),
                      name=name_or_path if name_or_path in REGISTRY else None, texts=texts)


def session_kinds_model(session: "Session") -> KindsModel | None:
    """The kinds model of `retrieve.kinds_model`, loaded once for the session (None when the
    setting is unset)."""
    name = session.settings.retrieve.kinds_model
    if not name:
        return None
    memo = session.memo("kinds-model")
    if name not in memo:
        memo[name] = load_kinds_model(name, session)
    return memo[name]


def kind_asked(model: KindsModel, qvec, session: "Session") -> tuple[str | None, float]:
    """The kind a question asks for (the kind whose text is nearest the question's vector, by
    cosine) and that similarity; (None, 0.0) for a model whose kinds carry no text. The kinds'
    text vectors are embedded once for the session."""
    import numpy as np

    names = [k for k in model.kinds if k in model.texts]
    if not names or qvec is None:
        return None, 0.0
    memo = session.memo("kind-texts")
    key = (str(model.folder), model.embedder)
    if key not in memo:
        vecs = np.asarray(session.embedder.embed_documents([model.texts[k] for k in names]), dtype=np.float32)
        memo[key] = vecs / np.maximum(np.linalg.norm(vecs, axis=1, keepdims=True), 1e-9)
    q = np.asarray(qvec, dtype=np.float32)
    sims = memo[key] @ (q / (np.linalg.norm(q) or 1.0))
    j = int(np.argmax(sims))
    return names[j], float(sims[j])


def kind_lane(model: KindsModel, kind: str, ids: list[str], vectors, n: int) -> list[str]:
    """The `n` chunk ids (of `ids`, whose vectors are `vectors`) the model rates highest for
    `kind`, best first."""
    import numpy as np

    if n <= 0 or not ids or kind not in model.kinds:
        return []
    col = model.logits(vectors, kind)
    return [ids[i] for i in np.argsort(-col, kind="stable")[:n]]
