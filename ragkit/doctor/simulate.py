"""`ragkit doctor --simulate`: measure Kimi K2's prefill and decode speed on this machine
without the 245-381 GB of shards.

A *slice* of the model is built at its real width: the embedding, the first (dense)
layer, the output head, and zero or one MoE layer with all 384 routed experts, each
tensor in the quantization type of the quant the user plans to run (read from the shard
headers when the shards are at hand, else from `QUANT_MIXES`). The weights are random:
the cost of a quantized matmul does not depend on the values, and every block is valid
(its fp16 scales are set to a small finite value, the rest is random bits), so the
file is written block by block, never as an f16 tensor that would not fit.

Both slices are loaded through the same path as the `kimi-k2` profile
(`LlamaCppGenerator`: tensor overrides, n_gpu_layers, n_batch/n_ubatch, KV cache types,
flash attention, mmap setting) and timed on prompts of a few lengths and on decoding.
The MoE layer's cost is the difference between the two slices; the projection to the
whole model is

    T(model) = T(base) + n_moe_layers x (T(base + 1 MoE) - T(base))

(base = embedding, the dense layer and the output head: Kimi K2 has one dense layer and
60 MoE layers). `validate()` checks that rule where a whole model can run: a random
model of N layers at a reduced width, measured whole, against the projection from its
own slices.

Kimi K2's dimensions are those of its published config.json (moonshotai/Kimi-K2-Instruct,
architecture DeepseekV3): hidden_size 7168, intermediate_size 18432,
moe_intermediate_size 2048, num_hidden_layers 61, first_k_dense_replace 1,
num_attention_heads 64, q_lora_rank 1536, kv_lora_rank 512, qk_rope_head_dim 64,
qk_nope_head_dim 128, v_head_dim 128, n_routed_experts 384, num_experts_per_tok 8,
n_shared_experts 1, vocab_size 163840, rope_theta 50000, yarn factor 32 over 4096,
routed_scaling_factor 2.827.
"""

from __future__ import annotations

import shutil
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

from ragkit.config import Settings

# by job: the slices (ragkit.doctor.slices), timing and projection (ragkit.doctor.timing),
# the validation (ragkit.doctor.validation); this module runs the command
from ragkit.doctor.slices import (  # noqa: F401
    _FP16_FIELDS,
    _SCALE_F16,
    ATTN,
    DEFAULT_QUANT,
    DENSE,
    EXPS,
    KIMI_K2,
    QUANT_MIXES,
    SHEXP,
    SPECIAL_TOKENS,
    TensorSpec,
    _byte_symbols,
    _mix,
    _random_tensor,
    _slice_key,
    add_deepseek2_metadata,
    bpe_vocab,
    estimate_bytes,
    layer_tensors,
    mix_from_shards,
    model_tensors,
    tensor_bytes,
    write_model,
)
from ragkit.doctor.timing import (  # noqa: F401
    Projection,
    Timing,
    _close,
    _decode_once,
    _fit,
    _load,
    _prefill_once,
    measure,
    measure_many,
    project,
)
from ragkit.doctor.validation import SMALL, SMALL_MIX, validate  # noqa: F401
from ragkit.errors import UsageError

# ---------------------------------------------------------------------- the command

# Typical prompt sizes: compare's clause prompt (216 tokens, eval/README.md), ask's
# retrieved prompt (about 1,500), and the whole-document mode at 16K and 32K.
TYPICAL_PROMPTS = {"compare clause (216 tok)": 216, "ask, retrieved (1,500 tok)": 1500,
                   "whole document 16K": 16384, "whole document 32K": 32768}


@dataclass
class Simulation:
    quant: str
    mix_source: str
    slice_dir: str
    slices: dict[str, dict]  # name -> {"path", "bytes", "built"}
    settings: dict
    lengths: list[int]
    projection: dict
    measured: dict
    recommendations: list[str]
    skipped: list[str]
    seconds: float

    def to_json(self) -> dict:
        return asdict(self)



def slice_dir(settings: Settings) -> Path:
    return Path(settings.cache_dir) / "simulate"


def clean(settings: Settings) -> int:
    """Remove every slice written by `simulate`; returns the bytes freed."""
    d = slice_dir(settings)
    n = sum(p.stat().st_size for p in d.rglob("*") if p.is_file()) if d.exists() else 0
    shutil.rmtree(d, ignore_errors=True)
    return n


def simulate(settings: Settings, *, quant: str | None = None, shards: Path | None = None,
             lengths: list[int] | None = None, decode_tokens: int = 16, ubatches: list[int] | None = None,
             dims: dict | None = None, on_progress: Callable[[str], None] | None = None) -> Simulation:
    """Build (or reuse) the slices, measure them with the generator settings, project."""
    from ragkit.doctor.fit import ram

    t_start = time.perf_counter()
    say = on_progress or (lambda msg: None)
    dims = dict(dims or KIMI_K2)
    if shards is not None:
        mix, source, qname = mix_from_shards(shards), f"headers of {Path(shards).name}", Path(shards).name
    else:
        qname = quant or DEFAULT_QUANT
        if qname not in QUANT_MIXES:
            raise UsageError(f"unknown quant {qname!r}", hint=f"one of {', '.join(QUANT_MIXES)}, or --shards FIRST.gguf")
        mix, source = QUANT_MIXES[qname]["mix"], f"table of published quants ({qname}, approximate)"
    cfg = settings.generator
    lengths = sorted(lengths or [256, 1024, 4096])
    if ubatches is None:  # the user's n_ubatch and llama.cpp's default, when they differ
        ubatches = [512] if cfg.n_ubatch != 512 else []
    n_ctx = min(max(cfg.n_ctx, 256), 1 << 16)
    need_ctx = max(lengths) + decode_tokens + 64
    mcfg = cfg.model_copy(update={"n_ctx": max(256, -(-need_ctx // 256) * 256), "n_batch": max(cfg.n_batch, 1),
                                  "chat_template": "kimi-k2", "model": "simulate"})
    n_dense = dims["n_dense"]
    plan = {"base": (n_dense, 0), "one_moe": (n_dense, 1)}
    specs = {k: model_tensors(dims, mix, nd, nm) for k, (nd, nm) in plan.items()}
    sizes = {k: sum(tensor_bytes(s) if s.type not in ("F32", "F16") else s.n_elements * (4 if s.type == "F32" else 2)
                    for s in v) for k, v in specs.items()}
    _total, avail, _limit, _src = ram()
    out_dir = slice_dir(settings)
    slices: dict[str, dict] = {}
    skipped: list[str] = []
    free_disk = shutil.disk_usage(out_dir.parent if out_dir.parent.exists() else Path.home()).free
    for k, (nd, nm) in plan.items():
        path = out_dir / f"slice-{_slice_key(dims, mix, nd, nm)}.gguf"
        slices[k] = {"path": str(path), "bytes": sizes[k], "built": False}
        # the memory plan: the slice is read into RAM (mmap off in the kimi-k2 profile)
        if avail is not None and sizes[k] * 1.15 + (1 << 30) > avail:
            skipped.append(f"slice {k} ({sizes[k] / 2**30:.1f} GiB) does not fit the {avail / 2**30:.1f} GiB of RAM available")
            continue
        if not path.exists():
            if sizes[k] + (2 << 30) > free_disk:
                skipped.append(f"slice {k} ({sizes[k] / 2**30:.1f} GiB) does not fit the free disk under {out_dir}")
                continue
            say(f"writing slice {k} ({sizes[k] / 2**30:.1f} GiB, {nm} MoE layer(s) at real width) to {path}")
            write_model(path, dims, mix, nd, nm)
            slices[k]["built"] = True
    if skipped:
        raise UsageError("cannot simulate on this machine: " + "; ".join(skipped),
                         hint="free memory or disk, or pick a smaller quant (--quant UD-TQ1_0)")
    timings = {}
    for k in plan:
        say(f"measuring slice {k}: prefill at {', '.join(map(str, lengths))} tokens, {decode_tokens} decoded")
        timings[k] = measure(Path(slices[k]["path"]), mcfg, lengths, decode_tokens,
                             ubatches=ubatches if k == "one_moe" else None, repeats=1 if max(lengths) >= 4096 else 2)
    n_moe = dims["n_layer"] - n_dense
    proj = project(timings["base"], timings["one_moe"], n_moe, TYPICAL_PROMPTS)
    recs = recommend(proj, cfg, settings)
    sim = Simulation(
        quant=qname, mix_source=source, slice_dir=str(out_dir), slices=slices,
        settings={"n_threads": cfg.n_threads, "n_batch": cfg.n_batch, "n_ubatch": cfg.n_ubatch,
                  "n_gpu_layers": cfg.n_gpu_layers, "tensor_overrides": cfg.tensor_overrides, "type_k": cfg.type_k,
                  "type_v": cfg.type_v, "flash_attn": cfg.flash_attn, "use_mmap": cfg.use_mmap, "n_ctx_measured": mcfg.n_ctx,
                  "n_ctx": n_ctx},
        lengths=lengths,
        projection={"prefill_tok_s": {str(p): round(v, 2) for p, v in proj.prefill_tok_s.items()},
                    "decode_tok_s": round(proj.decode_tok_s, 3),
                    "ttft_s": {k: round(v, 1) for k, v in proj.ttft_s.items()},
                    "ttft_extrapolated": [k for k, n in TYPICAL_PROMPTS.items() if n > max(lengths)],
                    "moe_layers": n_moe, "moe_share_of_prefill": round(proj.moe_layer_share, 3),
                    "model_bytes": estimate_bytes(dims, mix)},
        measured={k: {"prefill_s": {str(p): round(v, 6) for p, v in t.prefill_s.items()},
                      "decode_s_per_token": round(t.decode_s_per_token, 6),
                      "prefill_s_by_ubatch": {str(u): round(v, 4) for u, v in t.ubatch_prefill_s.items()}}
                  for k, t in timings.items()},
        recommendations=recs, skipped=skipped, seconds=round(time.perf_counter() - t_start, 1),
    )
    return sim


def recommend(proj: Projection, cfg, settings: Settings) -> list[str]:
    """Which setting would help most, from what was measured."""
    recs: list[str] = []
    ub = proj.one_moe.ubatch_prefill_s
    if len(ub) > 1:
        best = min(ub, key=ub.get)
        if best != cfg.n_ubatch and ub[best] < 0.9 * ub[cfg.n_ubatch]:
            recs.append(f"n_ubatch {best}: prefill {ub[cfg.n_ubatch] / ub[best]:.2f}x faster than {cfg.n_ubatch} here")
    gpu = _gpu_usable()
    if proj.moe_layer_share > 0.8 and not gpu:
        recs.append(f"the routed experts take {proj.moe_layer_share:.0%} of prefill and no usable GPU was found "
                    "(nvidia-smi, and a llama.cpp build with GPU offload): on this machine speed scales with the "
                    "free CPU cores and memory bandwidth; a GPU holding attention and the shared layers while the "
                    "experts stay in CPU RAM is the published hybrid setup (106 tok/s prefill)")
    if proj.moe_layer_share > 0.8 and gpu:
        gain = proj.moe_layer_share
        recs.append(f"the routed experts take {gain:.0%} of prefill: each MoE layer whose experts move to the GPU "
                    f"(a narrower tensor override, e.g. blk.(1[0-9]|[2-6][0-9]).ffn_.*_exps.=CPU) saves about "
                    f"1/{proj.n_moe_layers} of that, where VRAM allows (`ragkit doctor` shows what fits)")
    if cfg.type_k in (None, "f16"):
        recs.append("KV cache q8_0 (generator.type_k) halves the cache; Kimi K2's MLA cache is already small "
                    "(68.6 KiB per token at f16), so this matters only at long contexts on a full GPU")
    return recs


def _gpu_usable() -> bool:
    try:
        import llama_cpp

        from ragkit.doctor.fit import _nvidia_gpus

        return bool(llama_cpp.llama_supports_gpu_offload()) and bool(_nvidia_gpus())
    except Exception:
        return False
