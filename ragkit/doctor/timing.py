"""Timing the slices and projecting the whole model (ragkit.doctor.simulate re-exports
them): prefill and decode measured through the generator's own load path
(`LlamaCppGenerator`), and T(model) = T(base) + n_moe_layers x (T(base + 1 MoE) - T(base))."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

from ragkit.doctor.slices import SPECIAL_TOKENS


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

