"""The slices `ragkit doctor --simulate` measures (ragkit.doctor.simulate re-exports them):
Kimi K2's dimensions, the type mix of the published quants, the deepseek2 tensor layout,
and a random-weight GGUF written block by block (see ragkit.doctor.simulate)."""

from __future__ import annotations

import hashlib
import json
import math
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

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


def _slice_key(dims: dict, mix: dict, n_dense: int, n_moe: int) -> str:
    blob = json.dumps([dims, sorted(mix.items()), n_dense, n_moe, 1], sort_keys=True).encode()
    return hashlib.sha256(blob).hexdigest()[:16]
