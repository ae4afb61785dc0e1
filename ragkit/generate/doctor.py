"""Will this model run here? Sizes from GGUF headers (no weights loaded), placement under
n_gpu_layers and tensor overrides, the KV cache at the chosen context, and host facts.

`plan()` is a pure function of (model facts, generator settings, host facts), so it can be
tested with synthetic metadata the size of real Kimi K2 quants. `diagnose()` gathers the
facts on this machine; `check_fit()` refuses a plan that does not fit.

Placement follows llama.cpp 0.3.36 (llama-model.cpp `load_tensors`): the token embeddings
always stay on the CPU; with n_gpu_layers = g, layer i goes to the GPU when
i >= n_layer + 1 - g, and the output layer when g >= 1; a tensor matched by an override
goes where the override says. The KV cache of a layer lives with the layer (offload_kqv).
KV cache size follows llama-kv-cache.cpp: cells = n_ctx padded up to 256; per cell and
layer K holds key_length x head_count_kv elements; V the same with value_length, except
for MLA models (deepseek2 with key_length_mla), where llama.cpp caches only the compressed
latent (kv_lora_rank + rope dims) as K and allocates no V at all.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ragkit.config import GeneratorSettings, Settings
from ragkit.errors import RagkitError
from ragkit.generate.overrides import matches, parse_overrides

GiB = 1024**3
MiB = 1024**2
EXPERTS_TO_CPU = ".ffn_.*_exps.=CPU"
GPU_RESERVE = 512 * MiB  # per GPU: CUDA context and fragmentation
HOST_RESERVE = 1 * GiB  # runtime, tokenizer, Python
_CACHE_TYPE_SIZE = {"f16": (1, 2), "q8_0": (32, 34), "q4_0": (32, 18)}  # (block elements, block bytes), ggml
_EXPERT_RE = re.compile(r"\.ffn_(gate|up|down|gate_up)_exps\.")
_LAYER_RE = re.compile(r"^blk\.(\d+)\.")


class DoesNotFit(RagkitError):
    """The model, at these settings, does not fit this machine's memory."""

    exit_code = 3


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
    ram_total: int
    ram_available: int
    disk_free: int
    disk_path: str
    gpus: list[GPU] = field(default_factory=list)
    gpu_offload: bool = True  # whether this llama.cpp build can use a GPU at all


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


def _meminfo() -> dict[str, int]:
    out = {}
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                k, _, rest = line.partition(":")
                parts = rest.split()
                if parts:
                    out[k] = int(parts[0]) * 1024
    except OSError:
        pass
    return out


def _nvidia_gpus() -> list[GPU]:
    exe = shutil.which("nvidia-smi")
    if not exe:
        return []
    try:
        res = subprocess.run(
            [exe, "--query-gpu=name,memory.total,memory.free", "--format=csv,noheader,nounits"],
            capture_output=True, text=True, timeout=20,
        )
    except (OSError, subprocess.SubprocessError):
        return []
    gpus = []
    for line in res.stdout.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) == 3:
            try:
                gpus.append(GPU(parts[0], int(float(parts[1])) * MiB, int(float(parts[2])) * MiB))
            except ValueError:
                continue
    return gpus


def host_facts(disk_path: Path) -> HostFacts:
    mem = _meminfo()
    total = mem.get("MemTotal", 0)
    avail = mem.get("MemAvailable", mem.get("MemFree", 0))
    p = Path(disk_path)
    while not p.exists() and p != p.parent:
        p = p.parent
    try:
        free = shutil.disk_usage(p).free
    except OSError:
        free = 0
    try:
        import llama_cpp

        offload = bool(llama_cpp.llama_supports_gpu_offload())
    except Exception:
        offload = False
    return HostFacts(total, avail, free, str(p), _nvidia_gpus(), offload)


# ---------------------------------------------------------------------- the plan

def kv_cache(model: ModelFacts, n_ctx: int, type_k: str, type_v: str) -> dict[str, int]:
    cells = -(-max(n_ctx or model.n_ctx_train, 1) // 256) * 256  # llama.cpp pads n_ctx to 256
    bk, sk = _CACHE_TYPE_SIZE[type_k]
    bv, sv = _CACHE_TYPE_SIZE[type_v]
    k_layer = -(-model.k_per_layer // bk) * sk  # bytes per cell and layer
    v_layer = -(-model.v_per_layer // bv) * sv
    per_token = (k_layer + v_layer) * model.n_layer
    return {
        "cells": cells,
        "bytes_per_token": per_token,
        "k_bytes": k_layer * model.n_layer * cells,
        "v_bytes": v_layer * model.n_layer * cells,
        "bytes": per_token * cells,
        "per_layer_bytes": (k_layer + v_layer) * cells,
    }


def _cache_types(model: ModelFacts, cfg: GeneratorSettings) -> tuple[str, str]:
    k = cfg.type_k or "f16"
    v = cfg.type_v or (cfg.type_k if model.is_mla else None) or "f16"  # MLA: one cache type (overrides.cache_kwargs)
    return k, v


def _compute_estimate(model: ModelFacts, cfg: GeneratorSettings, n_ctx: int) -> int:
    """Rough size of llama.cpp's compute buffer: logits and activations of one micro-batch,
    plus the attention score matrix when flash attention is off. An estimate, not a measurement."""
    ub = min(cfg.n_ubatch, cfg.n_batch, n_ctx or model.n_ctx_train)
    est = ub * 4 * (model.n_vocab + 16 * model.n_embd)
    if not cfg.flash_attn:
        est += model.n_head * ub * n_ctx * 4
    return est


@dataclass
class Plan:
    fits: bool
    verdict: str  # "fits" | "runs-from-disk" | "no-fit"
    reasons: list[str]
    recommendations: list[dict]
    notes: list[str]
    model: dict
    settings: dict
    kv_cache: dict
    gpu: dict
    cpu: dict
    host: dict

    def to_json(self) -> dict:
        return asdict(self)


def _place(model: ModelFacts, cfg: GeneratorSettings, host: HostFacts) -> tuple[dict, dict, dict, list[str]]:
    n_ctx = cfg.n_ctx or model.n_ctx_train
    notes: list[str] = []
    use_gpu = bool(host.gpus) and host.gpu_offload
    if host.gpus and not host.gpu_offload:
        notes.append("this llama-cpp-python build has no GPU support; everything runs on the CPU")
    ngl = cfg.n_gpu_layers if cfg.n_gpu_layers >= 0 else model.n_layer + 1
    ngl = min(ngl, model.n_layer + 1) if use_gpu else 0
    gpu_start = model.n_layer + 1 - ngl

    def on_gpu(layer: int | str) -> bool:
        if not ngl:
            return False
        if layer == "input":
            return False
        if layer == "output":
            return model.n_layer >= gpu_start
        return int(layer) >= gpu_start

    overrides = parse_overrides(cfg.tensor_overrides)
    gpu = {"weights": 0, "expert_weights": 0, "kv": 0, "compute": 0, "total": 0}
    cpu = {"weights": 0, "expert_weights": 0, "kv": 0, "compute": 0, "total": 0}
    for name, nbytes in model.tensors:
        where = gpu if on_gpu(tensor_layer(name)) else cpu
        for pattern, buft in overrides:
            if matches(pattern, name):
                where = cpu if buft.upper().startswith("CPU") else (gpu if use_gpu else cpu)
                break
        where["weights"] += nbytes
        if is_expert(name):
            where["expert_weights"] += nbytes
    kv = kv_cache(model, n_ctx, *_cache_types(model, cfg))
    gpu_layers = sum(1 for il in range(model.n_layer) if on_gpu(il))
    gpu["kv"] = kv["per_layer_bytes"] * gpu_layers
    cpu["kv"] = kv["per_layer_bytes"] * (model.n_layer - gpu_layers)
    compute = _compute_estimate(model, cfg, n_ctx)
    (gpu if ngl else cpu)["compute"] = compute
    for d in (gpu, cpu):
        d["total"] = d["weights"] + d["kv"] + d["compute"]
    return gpu, cpu, kv, notes


def _gib(n: float) -> str:
    return f"{n / GiB:.1f} GiB"


def _check(model: ModelFacts, cfg: GeneratorSettings, host: HostFacts) -> tuple[str, list[str], dict, dict, dict, list[str]]:
    gpu, cpu, kv, notes = _place(model, cfg, host)
    reasons = []
    gpu_free = sum(g.free for g in host.gpus) - GPU_RESERVE * len(host.gpus)
    if gpu["total"] and gpu["total"] > gpu_free:
        reasons.append(
            f"GPU needs {_gib(gpu['total'])} (weights {_gib(gpu['weights'])}, of which experts {_gib(gpu['expert_weights'])}; "
            f"KV cache {_gib(gpu['kv'])}; compute ~{_gib(gpu['compute'])}) but {_gib(max(gpu_free, 0))} is free"
        )
    ram = host.ram_available - HOST_RESERVE
    verdict = "fits"
    if cpu["total"] > ram:
        need = (
            f"host RAM needs {_gib(cpu['total'])} (weights {_gib(cpu['weights'])}, KV cache {_gib(cpu['kv'])}, "
            f"compute ~{_gib(cpu['compute'])}) but {_gib(max(host.ram_available, 0))} is available"
        )
        if cfg.use_mmap and cpu["kv"] + cpu["compute"] <= ram:
            reasons.append(need + "; with use_mmap the weights would be re-read from disk on every token")
            verdict = "runs-from-disk"
        else:
            reasons.append(need)
            verdict = "no-fit"
    if reasons and verdict == "fits":
        verdict = "no-fit"
    if any("GPU needs" in r for r in reasons):
        verdict = "no-fit"
    return verdict, reasons, gpu, cpu, kv, notes


def _largest_ctx(model: ModelFacts, cfg: GeneratorSettings, host: HostFacts) -> int:
    lo, hi = 0, max(cfg.n_ctx or model.n_ctx_train, 256) // 256
    while lo < hi:  # largest multiple of 256 that fits
        mid = (lo + hi + 1) // 2
        if _check(model, cfg.model_copy(update={"n_ctx": mid * 256}), host)[0] == "fits":
            lo = mid
        else:
            hi = mid - 1
    return lo * 256


def _largest_ngl(model: ModelFacts, cfg: GeneratorSettings, host: HostFacts) -> int:
    top = min(cfg.n_gpu_layers if cfg.n_gpu_layers >= 0 else model.n_layer + 1, model.n_layer + 1)
    for ngl in range(top - 1, 0, -1):
        if _check(model, cfg.model_copy(update={"n_gpu_layers": ngl}), host)[0] == "fits":
            return ngl
    return 0


def plan(model: ModelFacts, cfg: GeneratorSettings, host: HostFacts) -> Plan:
    """The placement, sizes, verdict, and changes that would make it fit. Pure."""
    verdict, reasons, gpu, cpu, kv, notes = _check(model, cfg, host)
    recs: list[dict] = []
    exps_on_cpu = any(matches(p, "blk.1.ffn_up_exps.weight") and b.upper().startswith("CPU") for p, b in parse_overrides(cfg.tensor_overrides))
    use_gpu = bool(host.gpus) and host.gpu_offload

    def rec(change: dict, text: str) -> None:
        recs.append({"change": change, "text": text})

    if verdict != "fits":
        if use_gpu and model.n_expert and not exps_on_cpu:
            alt = cfg.model_copy(update={"tensor_overrides": [*cfg.tensor_overrides, EXPERTS_TO_CPU]})
            if _check(model, alt, host)[0] == "fits":
                rec({"tensor_overrides": alt.tensor_overrides},
                    f'move the routed experts to CPU RAM: tensor_overrides = ["{EXPERTS_TO_CPU}"] '
                    f"({_gib(gpu['expert_weights'])} of experts leave the GPU)")
        kv_now = cfg.type_k or "f16"
        if kv_now == "f16":
            alt = cfg.model_copy(update={"type_k": "q8_0", "type_v": "q8_0", "flash_attn": True})
            if _check(model, alt, host)[0] == "fits":
                rec({"type_k": "q8_0", "type_v": "q8_0", "flash_attn": True},
                    f"quantize the KV cache to q8_0 (type_k = type_v = q8_0, flash_attn = true): "
                    f"{_gib(kv['bytes'])} -> {_gib(kv_cache(model, cfg.n_ctx, 'q8_0', 'q8_0')['bytes'])}")
        n = _largest_ctx(model, cfg, host)
        if n >= 256 and n < (cfg.n_ctx or model.n_ctx_train):
            rec({"n_ctx": n}, f"lower n_ctx to {n} (KV cache {_gib(kv_cache(model, n, *_cache_types(model, cfg))['bytes'])})")
        if use_gpu and cfg.n_gpu_layers != 0:
            g = _largest_ngl(model, cfg, host)
            if g:
                rec({"n_gpu_layers": g}, f"lower n_gpu_layers to {g} (the rest of the layers run on the CPU)")
        if verdict == "no-fit" and not cfg.use_mmap and cpu["weights"] > host.ram_available - HOST_RESERVE:
            alt = cfg.model_copy(update={"use_mmap": True})
            if _check(model, alt, host)[0] == "runs-from-disk":
                rec({"use_mmap": True},
                    f"use_mmap = true would let it start, paging {_gib(cpu['weights'])} of CPU-resident weights from disk "
                    f"(expect seconds per token); more RAM or a smaller quant is the real fix")
        if not recs:
            total = sum(b for _, b in model.tensors)
            rec({}, f"no setting makes it fit: the weights alone are {_gib(total)}; this machine has "
                    f"{_gib(host.ram_available)} RAM available and {_gib(sum(g.free for g in host.gpus))} free GPU memory. "
                    f"Use a smaller quant or a bigger machine")
    elif cfg.use_mmap and exps_on_cpu and use_gpu:
        notes.append("llama.cpp advises use_mmap = false with CPU tensor overrides (faster prompt processing)")

    expert = sum(b for n, b in model.tensors if is_expert(n))
    total = sum(b for _, b in model.tensors)
    return Plan(
        fits=verdict == "fits",
        verdict=verdict,
        reasons=reasons,
        recommendations=recs,
        notes=notes,
        model={
            "path": model.path, "arch": model.arch, "n_layer": model.n_layer, "n_expert": model.n_expert,
            "is_mla": model.is_mla, "kv_lora_rank": model.kv_lora_rank, "rope_dim": model.rope_dim,
            "n_ctx_train": model.n_ctx_train,
            "shards": [{"path": p, "bytes": b} for p, b in model.shards],
            "file_bytes": sum(b for _, b in model.shards),
            "tensor_bytes": total, "expert_bytes": expert, "non_expert_bytes": total - expert,
            "n_tensors": len(model.tensors),
        },
        settings={
            "n_ctx": cfg.n_ctx, "n_ubatch": cfg.n_ubatch, "type_k": _cache_types(model, cfg)[0], "type_v": _cache_types(model, cfg)[1],
            "n_gpu_layers": cfg.n_gpu_layers, "tensor_overrides": cfg.tensor_overrides, "use_mmap": cfg.use_mmap,
            "flash_attn": cfg.flash_attn,
        },
        kv_cache=kv,
        gpu=gpu,
        cpu=cpu,
        host={
            "ram_total": host.ram_total, "ram_available": host.ram_available, "disk_free": host.disk_free,
            "disk_path": host.disk_path, "gpu_offload": host.gpu_offload, "gpus": [asdict(g) for g in host.gpus],
        },
    )


# ---------------------------------------------------------------------- on this machine

def diagnose(settings: Settings, model: str | None = None) -> Plan:
    from ragkit.models import resolve

    cfg = settings.generator
    path = resolve(model or cfg.model, "generator", settings.cache_dir)
    facts = model_facts(path)
    return plan(facts, cfg, host_facts(path.parent))


def check_fit(settings: Settings) -> None:
    """Raise DoesNotFit (a RagkitError) with the reason and the first fix when the
    generator at these settings does not fit this machine."""
    p = diagnose(settings)
    if p.fits:
        return
    fix = p.recommendations[0]["text"] if p.recommendations else None
    raise DoesNotFit(f"{Path(p.model['path']).name} does not fit here: {'; '.join(p.reasons)}", hint=fix)
