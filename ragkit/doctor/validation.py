"""`ragkit doctor --simulate --validate` (ragkit.doctor.simulate re-exports it): the
projection rule checked where a whole model can run, a random model of several layers at
a reduced width measured whole against the projection from its own slices."""

from __future__ import annotations

from pathlib import Path

from ragkit.config import Settings
from ragkit.doctor.slices import KIMI_K2, _mix, _slice_key, write_model
from ragkit.doctor.timing import measure_many, project

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
