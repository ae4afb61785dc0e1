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

import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from ragkit.config import Settings

# by job: the facts (ragkit.doctor.facts), the plan (ragkit.doctor.placement); this module
# reads the host and judges the generator at these settings on this machine
from ragkit.doctor.facts import (  # noqa: F401
    _CACHE_TYPE_SIZE,
    _EXPERT_RE,
    _LAYER_RE,
    EXPERTS_TO_CPU,
    GPU,
    GPU_RESERVE,
    HOST_RESERVE,
    GiB,
    HostFacts,
    MiB,
    ModelFacts,
    is_expert,
    model_facts,
    tensor_layer,
)
from ragkit.doctor.placement import (  # noqa: F401
    _OK,
    Plan,
    _cache_types,
    _check,
    _compute_estimate,
    _gib,
    _largest_ctx,
    _largest_ngl,
    _place,
    kv_cache,
    plan,
)
from ragkit.errors import RagkitError


class DoesNotFit(RagkitError):
    """The model, at these settings, does not fit this machine's memory."""

    exit_code = 3


# ---------------------------------------------------------------------- this host

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
