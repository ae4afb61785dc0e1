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

import hashlib
import json
import math
import shutil
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

from ragkit.config import Settings
from ragkit.errors import UsageError

KIMI_K2 = dict(
    n_vocab=163840, n_embd=7168, n_ff=18432, n_ff_exp=2048, n_layer=61, n_dense=1, n_head=64,
    q_lora_rank=1536, kv_lora_rank=512, qk_rope=64, qk_nope=128, v_head=128,
    n_expert=384, n_expert_used=8, n_expert_shared=1, routed_scaling_factor=2.827,
    rope_theta=50000.0, yarn_factor=32.0, yarn_orig_ctx=4096, rms_eps=1e-6,
)

# Tensor kinds (the name after "blk.N.", or the whole name outside the layers).
ATTN = ("attn_q_a.weight", "attn_q_b.weight", "attn_kv_a_mqa.weight", "attn_k_b.weight", "attn_v_b.weight",
        "attn_output.weight")
DENSE = ("ffn_gate.weight", "ffn_up.weight", "ffn_down.weight")
SHEXP = ("ffn_gate_shexp.weight", "ffn_up_shexp.weight", "ffn_down_shexp.weight")
EXPS = ("ffn_gate_exps.weight", "ffn_up_exps.weight", "ffn_down_exps.weight")


def _mix(embd: str, out: str, attn: str, dense: str, shexp: str, gate_up: str, down: str) -> dict[str, str]:
    m = {"token_embd.weight": embd, "output.weight": out}
    m.update({k: attn for k in ATTN})
    m["attn_k_b.weight"] = "Q8_0"  # rows of qk_nope (128) elements: too short for 256-element blocks
    m.update({k: dense for k in DENSE})
    m.update({k: shexp for k in SHEXP})
    m.update({"ffn_gate_exps.weight": gate_up, "ffn_up_exps.weight": gate_up, "ffn_down_exps.weight": down})
    return m


# The type mix of the published unsloth quants, approximately: the routed experts (98.9%
# of the weights) in the quant's low-bit type, their down projection one step higher,
# everything else at 4-6 bits. The real files vary the expert types from layer to layer;
# when the shards are at hand their headers are read instead (`mix_from_shards`).
# `published_gb` is the published download size; `estimate_bytes` of the whole model
# from the mix lands within 10% of it (checked in the tests).
QUANT_MIXES: dict[str, dict] = {
    "UD-TQ1_0": {"published_gb": 245, "mix": _mix("Q4_K", "Q6_K", "Q4_K", "Q4_K", "Q4_K", "TQ1_0", "IQ2_XXS")},
    "UD-IQ1_S": {"published_gb": 281, "mix": _mix("Q4_K", "Q6_K", "Q4_K", "Q4_K", "Q4_K", "IQ1_M", "Q2_K")},
    "UD-Q2_K_XL": {"published_gb": 381, "mix": _mix("Q4_K", "Q6_K", "Q6_K", "Q6_K", "Q6_K", "Q2_K", "Q3_K")},
}
DEFAULT_QUANT = "UD-TQ1_0"

# Byte offsets of the fp16 fields (scales) inside one block of each quantized type
# (ggml-common.h, block_* structs). Everything else in a block is quant bits, valid for
# any value. IQ1_M keeps its fp16 scale in the top nibbles of its last 8 bytes.
_FP16_FIELDS: dict[str, tuple[int, ...]] = {
    "Q4_0": (0,), "Q4_1": (0, 2), "Q5_0": (0,), "Q5_1": (0, 2), "Q8_0": (0,),
    "Q2_K": (80, 82), "Q3_K": (108,), "Q4_K": (0, 2), "Q5_K": (0, 2), "Q6_K": (208,),
    "TQ1_0": (52,), "TQ2_0": (64,),
    "IQ1_S": (0,), "IQ2_XXS": (0,), "IQ2_XS": (0,), "IQ2_S": (0,), "IQ3_XXS": (0,), "IQ3_S": (0,),
    "IQ4_XS": (0,), "IQ4_NL": (0,),
}
_SCALE_F16 = 0x1419  # fp16 0.00102: small and finite


# ---------------------------------------------------------------------- layout

@dataclass(frozen=True)
class TensorSpec:
    name: str
    shape: tuple[int, ...]  # ggml order: ne0 (row length) first
    type: str  # ggml type name

    @property
    def n_elements(self) -> int:
        return math.prod(self.shape)


def layer_tensors(dims: dict, i: int, moe: bool, mix: dict[str, str]) -> list[TensorSpec]:
    """The tensors of layer `i`, names and shapes as llama.cpp's deepseek2 loader wants
    them (`llama_model::load_tensors`, LLM_ARCH_DEEPSEEK2)."""
    d = dims
    e, h = d["n_embd"], d["n_head"]
    k_mla = d["qk_nope"] + d["qk_rope"]

    def t(kind, *shape, typ=None):
        return TensorSpec(f"blk.{i}.{kind}", tuple(shape), typ or mix.get(kind, "F32"))

    out = [
        t("attn_norm.weight", e, typ="F32"),
        t("attn_q_a_norm.weight", d["q_lora_rank"], typ="F32"),
        t("attn_kv_a_norm.weight", d["kv_lora_rank"], typ="F32"),
        t("attn_q_a.weight", e, d["q_lora_rank"]),
        t("attn_q_b.weight", d["q_lora_rank"], h * k_mla),
        t("attn_kv_a_mqa.weight", e, d["kv_lora_rank"] + d["qk_rope"]),
        t("attn_k_b.weight", d["qk_nope"], d["kv_lora_rank"], h),
        t("attn_v_b.weight", d["kv_lora_rank"], d["v_head"], h),
        t("attn_output.weight", h * d["v_head"], e),
        t("ffn_norm.weight", e, typ="F32"),
    ]
    if not moe:
        out += [t("ffn_gate.weight", e, d["n_ff"]), t("ffn_down.weight", d["n_ff"], e), t("ffn_up.weight", e, d["n_ff"])]
    else:
        ne, nf, ns = d["n_expert"], d["n_ff_exp"], d["n_expert_shared"]
        out += [
            t("ffn_gate_inp.weight", e, ne, typ="F32"),
            t("exp_probs_b.bias", ne, typ="F32"),
            t("ffn_gate_exps.weight", e, nf, ne),
            t("ffn_down_exps.weight", nf, e, ne),
            t("ffn_up_exps.weight", e, nf, ne),
            t("ffn_gate_shexp.weight", e, nf * ns),
            t("ffn_down_shexp.weight", nf * ns, e),
            t("ffn_up_shexp.weight", e, nf * ns),
        ]
    return out


def model_tensors(dims: dict, mix: dict[str, str], n_dense: int, n_moe: int) -> list[TensorSpec]:
    e, v = dims["n_embd"], dims["n_vocab"]
    out = [TensorSpec("token_embd.weight", (e, v), mix["token_embd.weight"])]
    for i in range(n_dense + n_moe):
        out += layer_tensors(dims, i, i >= n_dense, mix)
    out += [TensorSpec("output_norm.weight", (e,), "F32"), TensorSpec("output.weight", (e, v), mix["output.weight"])]
    return out


def tensor_bytes(spec: TensorSpec) -> int:
    import gguf

    block, size = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[spec.type]]
    if spec.shape[0] % block:
        raise UsageError(f"{spec.name}: rows of {spec.shape[0]} elements do not fit {spec.type} blocks of {block}")
    return spec.n_elements // block * size


def estimate_bytes(dims: dict, mix: dict[str, str]) -> int:
    """Weight bytes of the whole model (all its layers) under `mix`."""
    n_dense = dims["n_dense"]
    return sum(tensor_bytes(t) for t in model_tensors(dims, mix, n_dense, dims["n_layer"] - n_dense))


def mix_from_shards(first_shard: Path) -> dict[str, str]:
    """The type of each tensor kind in the user's own shards: per kind, the type most of
    the layers use (unsloth's dynamic quants vary the expert types by layer)."""
    import gguf

    from ragkit.generate.gguf_files import check_shards, read_header

    names = {int(t): t.name for t in gguf.GGMLQuantizationType}
    seen: dict[str, Counter] = {}
    for shard in check_shards(Path(first_shard)):
        for t in read_header(shard).tensors:
            kind = t.name.split(".", 2)[2] if t.name.startswith("blk.") else t.name
            seen.setdefault(kind, Counter())[names.get(t.ggml_type, str(t.ggml_type))] += 1
    mix = {k: c.most_common(1)[0][0] for k, c in seen.items()}
    missing = [k for k in ("token_embd.weight", "output.weight", *EXPS) if k not in mix]
    if missing:
        raise UsageError(f"{first_shard} does not look like Kimi K2 / DeepSeek V3 (no {', '.join(missing)})")
    return mix


# ---------------------------------------------------------------------- writing

def _random_tensor(spec: TensorSpec, rng) -> "object":
    """Valid random data for one tensor: floats for float types, else whole blocks of
    random bits with every fp16 scale set to a small finite value."""
    import numpy as np

    if spec.type == "F32":
        if spec.name.endswith(("norm.weight",)):
            return np.ones(spec.shape[::-1], dtype=np.float32)
        if spec.name.endswith("exp_probs_b.bias"):
            return np.zeros(spec.shape[::-1], dtype=np.float32)
        return (rng.standard_normal(spec.shape[::-1], dtype=np.float32) * 0.05)
    if spec.type in ("F16", "BF16"):
        return (rng.standard_normal(spec.shape[::-1], dtype=np.float32) * 0.05).astype(np.float16)
    import gguf

    block, size = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[spec.type]]
    n_blocks = spec.n_elements // block
    data = np.frombuffer(rng.bytes(n_blocks * size), dtype=np.uint8).reshape(n_blocks, size).copy()
    if spec.type == "IQ1_M":
        data[:, size - 8:] = 0x11  # scales: nibbles 1, so the packed fp16 scale is 0x1111 (finite)
    else:
        fields = _FP16_FIELDS.get(spec.type)
        if fields is None:
            raise UsageError(f"simulating {spec.type} tensors is not supported (known: {', '.join(sorted(_FP16_FIELDS))})")
        scale = np.array([_SCALE_F16], dtype="<u2").view(np.uint8)
        for off in fields:
            data[:, off:off + 2] = scale
    return data.reshape(-1)


def _byte_symbols() -> list[str]:
    # GPT-2's byte-to-unicode table: printable bytes map to themselves, the rest to 256+
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return [chr(c) for _, c in sorted(zip(bs, cs))]


SPECIAL_TOKENS = ["[BOS]", "[EOS]", "<|im_end|>", "<|im_user|>", "<|im_assistant|>", "<|im_system|>", "<|im_middle|>"]


def bpe_vocab(n_vocab: int) -> tuple[list[str], list[str]]:
    base = _byte_symbols()
    n_bpe = n_vocab - len(SPECIAL_TOKENS)
    tokens, merges = list(base), []
    for a in base:
        for b in base:
            if len(tokens) >= n_bpe:
                break
            tokens.append(a + b)
            merges.append(f"{a} {b}")
    i = 0
    while len(tokens) < n_bpe:  # triples "ab" + "c"
        ab, c = tokens[256 + i // 256], base[i % 256]
        tokens.append(ab + c)
        merges.append(f"{ab} {c}")
        i += 1
    return tokens[:n_bpe] + SPECIAL_TOKENS, merges


def add_deepseek2_metadata(w, d: dict, n_dense: int, n_layer: int) -> None:
    """The architecture keys llama.cpp's convert_hf_to_gguf.py writes for Kimi K2 /
    DeepSeek V3 (GGUF arch `deepseek2`), from a dims dict shaped like KIMI_K2."""
    import gguf

    w.add_block_count(n_layer)
    w.add_context_length(int(d["yarn_orig_ctx"] * d["yarn_factor"]))
    w.add_embedding_length(d["n_embd"])
    w.add_feed_forward_length(d["n_ff"])
    w.add_head_count(d["n_head"])
    w.add_head_count_kv(1)  # MLA is stored as MQA over the latent
    w.add_rope_freq_base(d["rope_theta"])
    w.add_layer_norm_rms_eps(d["rms_eps"])
    w.add_expert_count(d["n_expert"])
    w.add_expert_used_count(d["n_expert_used"])
    w.add_expert_group_count(1)
    w.add_expert_group_used_count(1)
    w.add_expert_gating_func(gguf.ExpertGatingFuncType.SIGMOID)
    w.add_rope_scaling_type(gguf.RopeScalingType.YARN)
    w.add_rope_scaling_factor(d["yarn_factor"])
    w.add_rope_scaling_orig_ctx_len(d["yarn_orig_ctx"])
    w.add_rope_scaling_yarn_beta_fast(1.0)
    w.add_rope_scaling_yarn_beta_slow(1.0)
    w.add_leading_dense_block_count(n_dense)
    w.add_vocab_size(d["n_vocab"])
    w.add_q_lora_rank(d["q_lora_rank"])
    w.add_kv_lora_rank(d["kv_lora_rank"])
    w.add_key_length(d["kv_lora_rank"] + d["qk_rope"])
    w.add_value_length(d["kv_lora_rank"])
    w.add_key_length_mla(d["qk_nope"] + d["qk_rope"])
    w.add_value_length_mla(d["v_head"])
    w.add_expert_feed_forward_length(d["n_ff_exp"])
    w.add_expert_shared_count(d["n_expert_shared"])
    w.add_expert_weights_scale(d["routed_scaling_factor"])
    w.add_expert_weights_norm(True)
    w.add_rope_dimension_count(d["qk_rope"])
    w.add_rope_scaling_yarn_log_mul(0.1)  # 0.1 * mscale_all_dim (1.0), as the converter does


def write_model(path: Path, dims: dict, mix: dict[str, str], n_dense: int, n_moe: int, *, seed: int = 0,
                on_progress: Callable[[int, int], None] | None = None) -> Path:
    """Write a random-weight deepseek2 GGUF with `n_dense` dense and `n_moe` MoE layers,
    streamed tensor by tensor (memory: the largest tensor, not the file)."""
    import gguf
    import numpy as np

    specs = model_tensors(dims, mix, n_dense, n_moe)
    total = sum(tensor_bytes(s) if s.type not in ("F32", "F16", "BF16") else s.n_elements * (4 if s.type == "F32" else 2)
                for s in specs)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".partial")
    d = dims
    w = gguf.GGUFWriter(tmp, "deepseek2")
    w.add_name("ragkit doctor --simulate slice (random weights, Kimi K2 layout)")
    add_deepseek2_metadata(w, d, n_dense, n_dense + n_moe)
    w.add_file_type(gguf.LlamaFileType.GUESSED)
    tokens, merges = bpe_vocab(d["n_vocab"])
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("kimi-k2")
    w.add_token_list(tokens)
    w.add_token_types([gguf.TokenType.NORMAL] * (len(tokens) - len(SPECIAL_TOKENS)) + [gguf.TokenType.CONTROL] * len(SPECIAL_TOKENS))
    w.add_token_merges(merges)
    w.add_bos_token_id(len(tokens) - len(SPECIAL_TOKENS))
    w.add_eos_token_id(len(tokens) - len(SPECIAL_TOKENS) + 1)
    w.add_add_bos_token(False)
    for s in specs:
        raw = None if s.type in ("F32", "F16") else gguf.GGMLQuantizationType[s.type]
        nbytes = tensor_bytes(s) if raw is not None else s.n_elements * (4 if s.type == "F32" else 2)
        dtype = np.uint8 if raw is not None else (np.float32 if s.type == "F32" else np.float16)
        shape = list(s.shape[::-1])
        if raw is not None:  # the writer takes a quantized tensor's shape in bytes per row
            block, size = gguf.GGML_QUANT_SIZES[raw]
            shape[-1] = shape[-1] // block * size
        w.add_tensor_info(s.name, shape, np.dtype(dtype), nbytes, raw_dtype=raw)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    rng = np.random.default_rng(seed)
    done = 0
    for s in specs:
        arr = _random_tensor(s, rng)
        w.write_tensor_data(arr)
        done += arr.nbytes
        if on_progress:
            on_progress(done, total)
        del arr
    w.close()
    tmp.replace(path)
    return path


# ---------------------------------------------------------------------- measuring

@dataclass
class Timing:
    prefill_s: dict[int, float]  # prompt length -> seconds (best of `repeats`)
    decode_s_per_token: float
    ubatch_prefill_s: dict[int, float] = field(default_factory=dict)  # n_ubatch -> seconds at the longest prompt


def _load(path: Path, cfg):
    from ragkit.generate.llama import LlamaCppGenerator

    return LlamaCppGenerator(path, cfg, name=path.name)


def _prefill_once(llm, n: int, rng) -> float:
    ids = rng.integers(0, llm.n_vocab() - len(SPECIAL_TOKENS), n).tolist()
    llm.reset()
    t0 = time.perf_counter()
    llm.eval(ids)
    return time.perf_counter() - t0


def _decode_once(llm, n: int, rng) -> float:
    """Seconds per token decoding `n` tokens one at a time after a short prompt."""
    ids = rng.integers(0, llm.n_vocab() - len(SPECIAL_TOKENS), 32 + n).tolist()
    llm.reset()
    llm.eval(ids[:32])
    t0 = time.perf_counter()
    for tok in ids[32:]:
        llm.eval([tok])
    return (time.perf_counter() - t0) / max(n, 1)


def measure_many(paths: dict[str, Path], cfg, lengths: list[int], decode_tokens: int, *, repeats: int = 2,
                 seed: int = 0) -> dict[str, Timing]:
    """Like `measure` for several models held loaded together, the repeats interleaved
    (model A, B, C, A, B, C...) so a burst of other work on the machine costs every model
    alike; the best of the repeats is kept."""
    import numpy as np

    rng = np.random.default_rng(seed)
    gens = {k: _load(p, cfg) for k, p in paths.items()}
    try:
        pre = {k: {n: float("inf") for n in lengths} for k in gens}
        dec = {k: float("inf") for k in gens}
        for _ in range(repeats):
            for k, g in gens.items():
                for n in sorted(lengths):
                    pre[k][n] = min(pre[k][n], _prefill_once(g.llm, n, rng))
                dec[k] = min(dec[k], _decode_once(g.llm, decode_tokens, rng))
    finally:
        for g in gens.values():
            _close(g)
    return {k: Timing(prefill_s=pre[k], decode_s_per_token=dec[k], ubatch_prefill_s={cfg.n_ubatch: pre[k][max(lengths)]})
            for k in gens}


def measure(path: Path, cfg, lengths: list[int], decode_tokens: int, *, repeats: int = 2,
            ubatches: list[int] | None = None, seed: int = 0) -> Timing:
    """Time prefill at each prompt length and decode, loading `path` with generator
    settings `cfg` exactly as ragkit loads a model (`LlamaCppGenerator`)."""
    import numpy as np

    t = measure_many({"m": path}, cfg, lengths, decode_tokens, repeats=repeats, seed=seed)["m"]
    rng = np.random.default_rng(seed + 1)
    for u in ubatches or []:
        if u == cfg.n_ubatch:
            continue
        g2 = _load(path, cfg.model_copy(update={"n_ubatch": u, "n_batch": max(cfg.n_batch, u)}))
        try:
            t.ubatch_prefill_s[u] = min(_prefill_once(g2.llm, max(lengths), rng) for _ in range(repeats))
        finally:
            _close(g2)
    t.ubatch_prefill_s = dict(sorted(t.ubatch_prefill_s.items()))
    return t


def _close(gen) -> None:
    try:
        gen.llm.close()
    except Exception:
        pass


def _fit(lengths: list[int], seconds: list[float]) -> tuple[float, float]:
    """t(P) = a*P + b*P^2 (linear work per token, attention growing with the context),
    least squares with a, b >= 0."""
    import numpy as np

    P = np.array(lengths, dtype=float)
    t = np.array(seconds, dtype=float)
    A = np.stack([P, P * P], axis=1)
    (a, b), *_ = np.linalg.lstsq(A, t, rcond=None)
    if b < 0 or a < 0:  # fall back to the linear fit
        a, b = float((P @ t) / (P @ P)), 0.0
    return float(max(a, 0.0)), float(max(b, 0.0))


@dataclass
class Projection:
    n_moe_layers: int
    base: Timing
    one_moe: Timing
    prefill_tok_s: dict[int, float]  # measured lengths, whole model
    decode_tok_s: float
    ttft_s: dict[str, float]  # typical prompts, whole model
    moe_layer_share: float  # of prefill time at the longest measured prompt

    def prefill_s(self, n: int) -> float:
        lens = sorted(self.base.prefill_s)
        a0, b0 = _fit(lens, [self.base.prefill_s[p] for p in lens])
        a1, b1 = _fit(lens, [max(self.one_moe.prefill_s[p] - self.base.prefill_s[p], 0.0) for p in lens])
        return (a0 * n + b0 * n * n) + self.n_moe_layers * (a1 * n + b1 * n * n)


def project(base: Timing, one_moe: Timing, n_moe_layers: int, prompts: dict[str, int]) -> Projection:
    """The whole model from its slices: base + n_moe_layers x (one MoE layer)."""
    lens = sorted(base.prefill_s)
    whole = {p: base.prefill_s[p] + n_moe_layers * max(one_moe.prefill_s[p] - base.prefill_s[p], 0.0) for p in lens}
    dec = base.decode_s_per_token + n_moe_layers * max(one_moe.decode_s_per_token - base.decode_s_per_token, 0.0)
    longest = lens[-1]
    share = (whole[longest] - base.prefill_s[longest]) / whole[longest] if whole[longest] > 0 else 0.0
    proj = Projection(n_moe_layers=n_moe_layers, base=base, one_moe=one_moe,
                      prefill_tok_s={p: p / whole[p] for p in lens if whole[p] > 0},
                      decode_tok_s=1.0 / dec if dec > 0 else float("inf"), ttft_s={}, moe_layer_share=share)
    proj.ttft_s = {name: proj.prefill_s(n) for name, n in prompts.items()}
    return proj


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


def _slice_key(dims: dict, mix: dict, n_dense: int, n_moe: int) -> str:
    blob = json.dumps([dims, sorted(mix.items()), n_dense, n_moe, 1], sort_keys=True).encode()
    return hashlib.sha256(blob).hexdigest()[:16]


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


# ---------------------------------------------------------------------- validation

# A reduced width at which a whole model of several layers runs here in seconds, and whose
# MoE weights (113 MB a layer at Q4_K) do not fit the CPU caches, as Kimi K2's do not: at
# hidden 1024 / 32 experts the projection came out 20-40% fast, the whole model's weights
# sitting in the caches less than the slices' do.
SMALL = dict(KIMI_K2, n_vocab=8192, n_embd=2048, n_ff=4096, n_ff_exp=512, n_head=8, q_lora_rank=256,
             kv_lora_rank=256, qk_rope=64, qk_nope=64, v_head=64, n_expert=64, n_expert_used=4, n_layer=5)
SMALL_MIX = _mix("Q4_K", "Q6_K", "Q4_K", "Q4_K", "Q4_K", "Q4_K", "Q4_K")


def validate(settings: Settings, out_dir: Path, *, dims: dict | None = None, mix: dict | None = None,
             lengths: list[int] | None = None, decode_tokens: int = 16, repeats: int = 3) -> dict:
    """Measure a whole random model of n_layer layers at a reduced width, and the
    projection from its slices (base, base + 1 MoE layer); return both and the error."""
    dims = dict(dims or SMALL)
    mix = dict(mix or SMALL_MIX)
    lengths = sorted(lengths or [256, 1024])
    nd, n_moe = dims["n_dense"], dims["n_layer"] - dims["n_dense"]
    cfg = settings.generator.model_copy(update={"n_ctx": max(256, -(-(max(lengths) + decode_tokens + 64) // 256) * 256),
                                                "chat_template": "kimi-k2", "model": "validate"})
    paths = {}
    for k, nm in (("base", 0), ("one_moe", 1), ("whole", n_moe)):
        p = Path(out_dir) / f"validate-{_slice_key(dims, mix, nd, nm)}.gguf"
        if not p.exists():
            write_model(p, dims, mix, nd, nm)
        paths[k] = p
    t = measure_many(paths, cfg, lengths, decode_tokens, repeats=repeats)
    proj = project(t["base"], t["one_moe"], n_moe, {})
    whole_pre = {p: t["whole"].prefill_s[p] for p in lengths}
    proj_pre = {p: t["base"].prefill_s[p] + n_moe * max(t["one_moe"].prefill_s[p] - t["base"].prefill_s[p], 0.0)
                for p in lengths}
    proj_dec = 1.0 / proj.decode_tok_s
    err = {f"prefill_{p}": (proj_pre[p] - whole_pre[p]) / whole_pre[p] for p in lengths}
    err["decode"] = (proj_dec - t["whole"].decode_s_per_token) / t["whole"].decode_s_per_token
    return {"dims": {k: dims[k] for k in ("n_embd", "n_expert", "n_layer", "n_vocab")},
            "measured_whole_s": {**{f"prefill_{p}": round(v, 4) for p, v in whole_pre.items()},
                                 "decode_per_token": round(t["whole"].decode_s_per_token, 5)},
            "projected_s": {**{f"prefill_{p}": round(v, 4) for p, v in proj_pre.items()}, "decode_per_token": round(proj_dec, 5)},
            "relative_error": {k: round(v, 3) for k, v in err.items()}}
