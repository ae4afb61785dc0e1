"""Backend selection: settings -> the class that implements the Reranker protocol
(ragkit.rerankers.base). As for embedders and generators, BACKENDS names each engine as a
"module:Class" string and the one chosen is imported only when a reranker is loaded; each
class makes itself from the settings (`from_settings`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ragkit.config import Settings
    from ragkit.rerankers.base import Reranker

# engine name (retrieve.rerank) -> "module:Class"
BACKENDS: dict[str, str] = {
    "onnx": "ragkit.rerankers.onnx:OnnxCrossEncoder",  # a registry model (the default) or an ONNX folder
    "crossencoder": "ragkit.rerankers.crossencoder:SentenceTransformersCrossEncoder",  # a user's own folder
    "openai": "ragkit.rerankers.openai:OpenAIReranker",  # an engine's /v1/rerank
}


def backend_class(name: str) -> type:
    """The reranker class registered for an engine name (imported now, not before)."""
    from ragkit.backends import import_target

    return import_target(BACKENDS, name, what="reranker backend", setting="retrieve.rerank")


def backend_of(settings: "Settings") -> str:
    """The backend `retrieve.rerank` names, `auto` resolved: openai when rerank_base_url is
    set, crossencoder when retrieve.reranker is, else onnx (the registry's model)."""
    rs = settings.retrieve
    if rs.rerank != "auto":
        return rs.rerank
    if rs.rerank_base_url:
        return "openai"
    if rs.reranker:
        return "crossencoder"
    return "onnx"


def load_reranker(settings: "Settings") -> "Reranker | None":
    """A new reranker as configured (a Session holds it: nothing here keeps it), or None when
    `retrieve.rerank` is off."""
    backend = backend_of(settings)
    if backend == "off":
        return None
    return backend_class(backend).from_settings(settings)
