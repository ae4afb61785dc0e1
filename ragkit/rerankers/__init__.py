"""Rerankers (cross-encoders): the protocol (base.py), the backends (onnx.py: a registry model
or an ONNX folder, the default; crossencoder.py: a user's sentence-transformers folder;
openai.py: an engine's /v1/rerank) and the factory that picks one (factory.py, its BACKENDS
table), shaped as ragkit.embed and ragkit.generate are. Importing it loads no engine
(onnxruntime, torch and the openai client load with the reranker that needs them). The stage
that fuses their order with the ranking is `ragkit.retrieve.rerank`."""

from __future__ import annotations

from ragkit.rerankers.base import DEFAULT_MODEL, Reranker, RerankerError
from ragkit.rerankers.factory import BACKENDS, backend_class, backend_of, load_reranker

__all__ = ["BACKENDS", "DEFAULT_MODEL", "Reranker", "RerankerError", "backend_class", "backend_of", "load_reranker"]
