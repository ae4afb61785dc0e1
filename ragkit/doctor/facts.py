"""The facts `ragkit doctor` plans with (ragkit.doctor.fit re-exports them): sizes, the
model's shape and its tensors from GGUF headers (no weights loaded), and the host's
memory, disk and GPUs as plain records (fit.host_facts reads them on this machine)."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

GiB = 1024**3
MiB = 1024**2
EXPERTS_TO_CPU = ".ffn_.*_exps.=CPU"
GPU_RESERVE = 512 * MiB  # per GPU: CUDA context and fragmentation
HOST_RESERVE = 1 * GiB  # runtime, tokenizer, Python
_CACHE_TYPE_SIZE = {"f16": (1, 2), "q8_0": (32, 34), "q4_0": (32, 18)}  # (block elements, block bytes), ggml
_EXPERT_RE = re.compile(r"\.ffn_(gate|up|down|gate_up)_exps\.")
_LAYER_RE = re.compile(r"^blk\.(\d+)\.")


# ---------------------------------------------------------------------- facts

@dataclass
class ModelFacts:
    path: str
    arch: str
    n_layer: int
    n_ctx_train: int
    n_embd: int
    n_vocab: int
    n_head: int
    n_expert: int
    k_per_layer: int  # K cache elements per cell and layer
    v_per_layer: int  # V cache elements per cell and layer (0 for MLA)
    is_mla: bool
    kv_lora_rank: int = 0
    rope_dim: int = 0
    tensors: list[tuple[str, int]] = field(default_factory=list)  # (name, bytes)
    shards: list[tuple[str, int]] = field(default_factory=list)  # (path, file bytes)


@dataclass
class GPU:
    name: str
    total: int  # bytes
    free: int


@dataclass
class HostFacts:
    ram_total: int | None  # None: could not tell (never 0 for "unknown")
    ram_available: int | None
    disk_free: int | None
    disk_path: str
    gpus: list[GPU] = field(default_factory=list)
    gpu_offload: bool = True  # whether this llama.cpp build can use a GPU at all
    ram_limit: int | None = None  # the cgroup memory limit, when one applies
    ram_source: str = ""  # where the RAM figures come from


def is_expert(name: str) -> bool:
    return _EXPERT_RE.search(name) is not None


def tensor_layer(name: str) -> int | str:
    """blk.N.* -> N; token_embd -> "input"; output*, anything else -> "output"."""
    m = _LAYER_RE.match(name)
    if m:
        return int(m.group(1))
    return "input" if name.startswith("token_embd") else "output"


def model_facts(first_shard: Path) -> ModelFacts:
    """Facts from the headers of every shard (ggml's C reader; no weights are read)."""
    from ragkit.generate.gguf_files import check_shards, read_header

    shards = check_shards(Path(first_shard))
    headers = [read_header(p) for p in shards]
    h = headers[0]
    arch = h.arch or "?"

    def per_layer(v: Any) -> int:
        return int(max(v)) if isinstance(v, list) else int(v or 0)

    n_head_kv = per_layer(h.key("attention.head_count_kv", h.key("attention.head_count", 1)))
    n_head = per_layer(h.key("attention.head_count", 1))
    n_embd = int(h.key("embedding_length", 0))
    key_len = int(h.key("attention.key_length", 0) or (n_embd // max(n_head, 1)))
    val_len = int(h.key("attention.value_length", 0) or (n_embd // max(n_head, 1)))
    is_mla = bool(h.key("attention.key_length_mla")) and bool(h.key("attention.value_length_mla"))
    n_vocab = h.key("vocab_size") or h.metadata.get("tokenizer.ggml.tokens") or 0
    return ModelFacts(
        path=str(shards[0]),
        arch=arch,
        n_layer=int(h.key("block_count", 0)),
        n_ctx_train=int(h.key("context_length", 0)),
        n_embd=n_embd,
        n_vocab=int(n_vocab),
        n_head=n_head,
        n_expert=int(h.key("expert_count", 0) or 0),
        k_per_layer=key_len * n_head_kv,
        v_per_layer=0 if is_mla else val_len * n_head_kv,
        is_mla=is_mla,
        kv_lora_rank=int(h.key("attention.kv_lora_rank", 0) or 0),
        rope_dim=int(h.key("rope.dimension_count", 0) or 0),
        tensors=[(t.name, t.nbytes) for hd in headers for t in hd.tensors],
        shards=[(str(hd.path), hd.file_size) for hd in headers],
    )

