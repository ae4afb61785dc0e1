"""Local models from a sentence-transformers folder: what every such backend shares
(FolderModel: identity, dimension and token counts from the folder's files, length-sorted
batching), and the PyTorch backend (SentenceTransformerEmbedder). The ONNX backends on
the same folder model are in ragkit.embed.onnx."""

from __future__ import annotations

from pathlib import Path

from ragkit.embed.base import length_sorted


class FolderModel:
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
                    cfg = json.loads(cfg_path.read_text())  # sentence-transformers 6 renamed the key
                    dim = cfg.get("word_embedding_dimension") or cfg.get("embedding_dimension")
                if mod.get("type", "").endswith("Dense"):
                    dim = None  # a projection changes the dimension: ask the model
                    break
            max_len = json.loads((path / "sentence_bert_config.json").read_text()).get("max_seq_length")
            if max_len is None:  # sentence-transformers 6 keeps the length in the tokenizer's config
                max_len = json.loads((path / "tokenizer_config.json").read_text()).get("model_max_length")
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
            self._after_batch()
        return out  # type: ignore[return-value]

    def _after_batch(self) -> None:
        """Called after each batch of embed_documents (a backend's own housekeeping)."""

    def embed_query(self, text: str) -> list[float]:
        self._load()
        return self._encode([text])[0].tolist()


def _linear_weights_bf16(model) -> None:
    """Store the Linear layers' weights in bf16 once. Under `torch.autocast` a Linear runs in
    bf16 whatever its weights hold, and autocast casts fp32 weights on every call: the
    vectors are bit for bit those of autocast over fp32 weights, 6% faster (800 SEC chunks,
    2 cores: 131 -> 139 texts/s). LayerNorm and the embeddings stay fp32, as autocast keeps
    them (casting the whole model to bf16 is 20% faster again, but its vectors fall to
    cosine 0.996 of fp32)."""
    import torch

    with torch.no_grad():
        for layer in model.modules():
            if isinstance(layer, torch.nn.Linear):
                layer.weight.data = layer.weight.data.to(torch.bfloat16)
                if layer.bias is not None:
                    layer.bias.data = layer.bias.data.to(torch.bfloat16)


def _malloc_trim():
    """glibc's malloc_trim, or None where the C library has none (musl, macOS)."""
    import ctypes

    try:
        return ctypes.CDLL(None).malloc_trim  # the process's own C library (no ldconfig lookup)
    except (OSError, AttributeError):
        return None


class SentenceTransformerEmbedder(FolderModel):
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
        self._trim = False  # glibc's malloc_trim once looked up (None: none here)
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
            if self.precision == "bf16":
                _linear_weights_bf16(self._model)
        return self._model

    def _after_batch(self) -> None:
        """Give the heap's free pages back to the system. torch's CPU tensors come from glibc's
        malloc, and batches of growing length (length_sorted) leave the heap fragmented: a
        503-page 10-K's ingest grew to 1.73 GB peak RSS, 1.07 GB with a trim after each batch,
        at the same speed (embed 36.4-39.5 s either way, 2026-12-07, docs/benchmarks.md "Long
        filings"). No library does this for torch on CPU; glibc only (elsewhere a no-op)."""
        if self._trim is False:
            self._trim = _malloc_trim()  # looked up once
        if self._trim is not None:
            self._trim(0)

    def _encode(self, texts: list[str]):
        import numpy as np
        import torch

        model = self._load()
        device_type = torch.device(self.device).type
        with torch.autocast(device_type, dtype=torch.bfloat16, enabled=self.precision == "bf16"):
            vecs = model.encode(texts, batch_size=self.batch_size, normalize_embeddings=True,
                                convert_to_numpy=True, show_progress_bar=False)
        return np.asarray(vecs, dtype=np.float32)
