"""Meaning, calibrated: cosines of the store's embedder read against sentences about nothing.

Cosines of one embedder are not comparable with another's: MiniLM puts unrelated
sentences near 0.1 and paraphrases near 0.7, e5 puts them near 0.75 and 0.9. A text's
cosine is therefore read against that same text's cosine to sentences about nothing in
any document (the floor, `ANCHORS` embedded with the embedder in use):
`calibrated_cosine(cos, floor)` = (cos - floor) / (1 - floor) is near 0 for an unrelated
sentence and near 1 for the text itself, with either embedder. The claims check
(ragkit.answer.claims) and the passages of `ask` (ragkit.answer.passages) read it.

numpy is imported when a function runs, not with the module.
"""

from __future__ import annotations

ANCHORS = [
    "The recipe calls for two cups of flour and a pinch of salt.",
    "The football match ended in a draw after extra time.",
    "Jupiter is the largest planet in the solar system.",
    "The museum opens at nine in the morning on weekdays.",
    "She painted the fence blue last summer.",
    "The train to the coast was delayed by heavy snow.",
    "Photosynthesis converts light into chemical energy in plants.",
    "The band released its third album in the spring.",
    "Mix the paint thoroughly before applying the second coat.",
    "The mountain trail is closed during the winter months.",
    "He learned to play the violin as a child.",
    "The bakery sells fresh bread every morning.",
]


def embed_docs(embedder, texts: list[str]):
    """Document-side vectors (normalised). A Session's embedder remembers them: a follow-up
    in a chat cites the same sources, and re-embedding them would cost the turn."""
    import numpy as np

    dim = int(getattr(embedder, "dim", 0) or 0)
    if not texts:
        return np.zeros((0, dim), dtype=np.float32)
    return np.stack([unit_vector(np.asarray(v, dtype=np.float32)) for v in embedder.embed_documents(list(texts))])


def unit_vector(v):
    """`v` scaled to length 1 (a zero vector as it is)."""
    import numpy as np

    n = float(np.linalg.norm(v))
    return v / n if n > 0 else v


def calibrated_cosine(cos, floor):
    """(cos - floor) / (1 - floor), clipped to [0, 1]: see the module's doc."""
    import numpy as np

    return np.clip((cos - floor) / np.maximum(1e-6, 1.0 - floor), 0.0, 1.0)


__all__ = ["ANCHORS", "calibrated_cosine", "embed_docs", "unit_vector"]
