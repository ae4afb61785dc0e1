"""Will this model run here? Sizes from GGUF headers (no weights loaded), placement under
n_gpu_layers and tensor overrides, the KV cache at the chosen context, and host facts.

`plan()` is a pure function of (model facts, generator settings, host facts), so it can be
tested with synthetic metadata the size of real Kimi K2 quants. `diagnose()` gathers the
facts on this machine; `check_fit()` refuses a plan that does not fit.

Host RAM is the machine's (psutil) capped by this process's cgroup memory limit (v2
`memory.max`, v1 `memory.limit_in_bytes`, the tightest along its cgroup path): inside a
container /proc/meminfo shows the host. What cannot be read is None and reported as
"unknown" (verdict "unknown", `fits` None), never as 0 bytes.

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


CGROUP_ROOT = Path("/sys/fs/cgroup")
PROC_SELF_CGROUP = Path("/proc/self/cgroup")
_CGROUP_UNLIMITED = 2**60  # v1 writes "no limit" as 2^63 rounded down to a page; v2 writes "max"


@dataclass
class CgroupMemory:
    limit: int  # bytes this process's cgroup (or an ancestor) may use
    usage: int | None  # bytes charged to it now, less inactive page cache; None when unreadable
    version: int  # 1 or 2
    path: str  # the file the limit came from


def _read_int(path: Path) -> int | None:
    try:
        text = path.read_text().strip()
    except (OSError, UnicodeDecodeError):
        return None
    try:
        return int(text)
    except ValueError:
        return None  # v2 "max": no limit


def _stat_value(path: Path, *keys: str) -> int:
    try:
        lines = path.read_text().splitlines()
    except (OSError, UnicodeDecodeError):
        return 0
    values = dict(ln.split(None, 1) for ln in lines if " " in ln)
    for k in keys:
        if k in values:
            try:
                return int(values[k])
            except ValueError:
                pass
    return 0


def _own_cgroup(proc_cgroup: Path, version: int) -> str:
    """This process's cgroup path from /proc/self/cgroup ("0::/a/b" for v2,
    "N:memory:/a/b" for v1's memory controller); "/" when unreadable."""
    try:
        lines = proc_cgroup.read_text().splitlines()
    except (OSError, UnicodeDecodeError):
        return "/"
    for line in lines:
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        hid, controllers, path = parts
        if version == 2 and hid == "0" and controllers == "":
            return path or "/"
        if version == 1 and "memory" in controllers.split(","):
            return path or "/"
    return "/"


def _cgroup_dirs(base: Path, own: str) -> list[Path]:
    """The process's cgroup folder under `base`, then each ancestor up to `base`: a limit
    on any of them applies. A path that is not there (a container that shows the host's
    path) falls back to `base` alone, which is then the container's own cgroup."""
    leaf = base / own.strip("/") if own.strip("/") else base
    if not leaf.is_dir():
        return [base]
    dirs = [leaf]
    while dirs[-1] != base and base in dirs[-1].parents:
        dirs.append(dirs[-1].parent)
    return dirs


def cgroup_memory(root: Path | None = None, proc_cgroup: Path | None = None) -> CgroupMemory | None:
    """The tightest cgroup memory limit on this process, or None when there is none (or no
    cgroup file system). cgroup v2 (`root/cgroup.controllers` exists): `memory.max`,
    `memory.current`; v1: `root/memory/memory.limit_in_bytes`, `memory.usage_in_bytes`.
    Usage leaves out inactive file cache (`inactive_file`), which the kernel reclaims
    before it would kill anything (what `docker stats` does)."""
    root = Path(root or CGROUP_ROOT)
    proc_cgroup = Path(proc_cgroup or PROC_SELF_CGROUP)
    if (root / "cgroup.controllers").exists():
        version, base, limit_f, usage_f, stat_keys = 2, root, "memory.max", "memory.current", ("inactive_file",)
    elif (root / "memory").is_dir():
        version, base, limit_f, usage_f, stat_keys = 1, root / "memory", "memory.limit_in_bytes", "memory.usage_in_bytes", (
            "total_inactive_file", "inactive_file")
    else:
        return None
    best: CgroupMemory | None = None
    for d in _cgroup_dirs(base, _own_cgroup(proc_cgroup, version)):
        limit = _read_int(d / limit_f)
        if limit is None or limit <= 0 or limit >= _CGROUP_UNLIMITED:
            continue
        if best is None or limit < best.limit:
            usage = _read_int(d / usage_f)
            if usage is not None:
                usage = max(usage - _stat_value(d / "memory.stat", *stat_keys), 0)
            best = CgroupMemory(limit, usage, version, str(d / limit_f))
    return best


def physical_memory() -> tuple[int | None, int | None]:
    """(total, available) bytes of the machine's RAM through psutil; None for what it
    cannot tell (never 0)."""
    try:
        import psutil

        vm = psutil.virtual_memory()
        return int(vm.total) or None, int(vm.available) or None
    except Exception:  # psutil missing, or no /proc (or the platform's equivalent)
        return None, None


def ram(cgroup_root: Path | None = None, proc_cgroup: Path | None = None) -> tuple[int | None, int | None, int | None, str]:
    """(total, available, cgroup limit, source) for this process: the machine's RAM,
    capped by its cgroup's memory limit (inside a container /proc/meminfo and psutil see
    the host). None where it cannot tell."""
    total, avail = physical_memory()
    cg = cgroup_memory(cgroup_root, proc_cgroup)
    if cg is None:
        return total, avail, None, "psutil" if total is not None else "unknown"
    cg_avail = cg.limit - cg.usage if cg.usage is not None else None
    total = cg.limit if total is None else min(total, cg.limit)
    if avail is None:
        avail = max(cg_avail, 0) if cg_avail is not None else None
    elif cg_avail is not None:
        avail = max(min(avail, cg_avail), 0)
    return total, avail, cg.limit, f"cgroup v{cg.version} {cg.path}"


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


def host_facts(disk_path: Path, *, cgroup_root: Path | None = None, proc_cgroup: Path | None = None) -> HostFacts:
    total, avail, limit, source = ram(cgroup_root, proc_cgroup)
    p = Path(disk_path)
    while not p.exists() and p != p.parent:
        p = p.parent
    try:
        free: int | None = shutil.disk_usage(p).free
    except OSError:
        free = None
    try:
        import llama_cpp

        offload = bool(llama_cpp.llama_supports_gpu_offload())
    except Exception:
        offload = False
    return HostFacts(total, avail, free, str(p), _nvidia_gpus(), offload, ram_limit=limit, ram_source=source)


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


# ---------------------------------------------------------------------- on this machine

def diagnose(settings: Settings, model: str | None = None) -> Plan:
    from ragkit.models import resolve

    cfg = settings.generator
    path = resolve(model or cfg.model, "generator", settings.cache_dir)
    facts = model_facts(path)
    return plan(facts, cfg, host_facts(path.parent))


def check_fit(settings: Settings) -> Plan:
    """The plan for the generator at these settings on this machine. Raises DoesNotFit (a
    RagkitError) with the reason and the first fix when it does not fit; a plan that
    cannot be judged (host RAM unknown, verdict "unknown") is returned, not refused."""
    p = diagnose(settings)
    if p.fits is not False:
        return p
    fix = p.recommendations[0]["text"] if p.recommendations else None
    raise DoesNotFit(f"{Path(p.model['path']).name} does not fit here: {'; '.join(p.reasons)}", hint=fix)
