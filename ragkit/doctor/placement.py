"""The plan (ragkit.doctor.fit re-exports it): placement under n_gpu_layers and tensor
overrides, the KV cache at the chosen context, the verdict, and the changes that would make
a model fit. `plan()` is a pure function of (model facts, generator settings, host facts);
the placement and KV cache rules are described in ragkit.doctor.fit."""

from __future__ import annotations

from dataclasses import asdict, dataclass

from ragkit.config import GeneratorSettings
from ragkit.doctor.facts import (
    _CACHE_TYPE_SIZE,
    EXPERTS_TO_CPU,
    GPU_RESERVE,
    HOST_RESERVE,
    GiB,
    HostFacts,
    MiB,
    ModelFacts,
    is_expert,
    tensor_layer,
)
from ragkit.generate.llama_params import matches, parse_overrides

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
    fits: bool | None  # None: could not tell (host RAM unknown)
    verdict: str  # "fits" | "runs-from-disk" | "no-fit" | "unknown"
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


def _gib(n: float | None) -> str:
    return "unknown" if n is None else f"{n / GiB:.1f} GiB"


_OK = ("fits", "unknown")  # verdicts a candidate fix may end in: "unknown" = host RAM could not be read


def _check(model: ModelFacts, cfg: GeneratorSettings, host: HostFacts) -> tuple[str, list[str], dict, dict, dict, list[str]]:
    gpu, cpu, kv, notes = _place(model, cfg, host)
    reasons = []
    gpu_free = sum(g.free for g in host.gpus) - GPU_RESERVE * len(host.gpus)
    if gpu["total"] and gpu["total"] > gpu_free:
        reasons.append(
            f"GPU needs {_gib(gpu['total'])} (weights {_gib(gpu['weights'])}, of which experts {_gib(gpu['expert_weights'])}; "
            f"KV cache {_gib(gpu['kv'])}; compute ~{_gib(gpu['compute'])}) but {_gib(max(gpu_free, 0))} is free"
        )
    verdict = "fits"
    if host.ram_available is None:
        # Nothing to compare the CPU side with: say so, never pretend the machine has 0 bytes.
        verdict = "unknown"
        size = _gib(cpu["total"]) if cpu["total"] >= GiB else f"{cpu['total'] / MiB:.1f} MiB"
        notes.append(f"host RAM could not be read: the CPU side ({size}) was not checked")
    elif cpu["total"] > host.ram_available - HOST_RESERVE:
        ram = host.ram_available - HOST_RESERVE
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
    if reasons and verdict in _OK:
        verdict = "no-fit"
    if any("GPU needs" in r for r in reasons):
        verdict = "no-fit"
    return verdict, reasons, gpu, cpu, kv, notes


def _largest_ctx(model: ModelFacts, cfg: GeneratorSettings, host: HostFacts) -> int:
    lo, hi = 0, max(cfg.n_ctx or model.n_ctx_train, 256) // 256
    while lo < hi:  # largest multiple of 256 that fits
        mid = (lo + hi + 1) // 2
        if _check(model, cfg.model_copy(update={"n_ctx": mid * 256}), host)[0] in _OK:
            lo = mid
        else:
            hi = mid - 1
    return lo * 256


def _largest_ngl(model: ModelFacts, cfg: GeneratorSettings, host: HostFacts) -> int:
    top = min(cfg.n_gpu_layers if cfg.n_gpu_layers >= 0 else model.n_layer + 1, model.n_layer + 1)
    for ngl in range(top - 1, 0, -1):
        if _check(model, cfg.model_copy(update={"n_gpu_layers": ngl}), host)[0] in _OK:
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

    if verdict not in _OK:
        if use_gpu and model.n_expert and not exps_on_cpu:
            alt = cfg.model_copy(update={"tensor_overrides": [*cfg.tensor_overrides, EXPERTS_TO_CPU]})
            if _check(model, alt, host)[0] in _OK:
                rec({"tensor_overrides": alt.tensor_overrides},
                    f'move the routed experts to CPU RAM: tensor_overrides = ["{EXPERTS_TO_CPU}"] '
                    f"({_gib(gpu['expert_weights'])} of experts leave the GPU)")
        kv_now = cfg.type_k or "f16"
        if kv_now == "f16":
            alt = cfg.model_copy(update={"type_k": "q8_0", "type_v": "q8_0", "flash_attn": True})
            if _check(model, alt, host)[0] in _OK:
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
        if (verdict == "no-fit" and not cfg.use_mmap and host.ram_available is not None
                and cpu["weights"] > host.ram_available - HOST_RESERVE):
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
        fits=None if verdict == "unknown" else verdict == "fits",
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
            "ram_limit": host.ram_limit, "ram_source": host.ram_source,
        },
    )
