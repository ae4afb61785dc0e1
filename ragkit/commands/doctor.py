"""`ragkit doctor`: will the generator fit this machine at these settings?"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer


def _human(n: float | None) -> str:
    if n is None:
        return "unknown"
    for unit, size in (("GiB", 1024**3), ("MiB", 1024**2), ("KiB", 1024)):
        if abs(n) >= size:
            return f"{n / size:.1f} {unit}"
    return f"{int(n)} B"


def register(app: typer.Typer) -> None:
    from ragkit.commands._common import JsonOpt, ProfileOpt, _fail, _print_json, _settings, err, out

    @app.command()
    def doctor(
        profile: Optional[str] = ProfileOpt,
        model: Optional[str] = typer.Option(None, "--model", help="a GGUF (first shard of a split model) or a registry name; default: the settings'"),
        as_json: bool = JsonOpt,
    ) -> None:
        """Check that the generator fits this machine: sizes from the GGUF headers, where each part goes
        (GPU or CPU RAM) under n_gpu_layers and tensor overrides, the KV cache at n_ctx, and what to change
        when it does not fit. Exits 0 when it fits (or when host RAM cannot be read: verdict "unknown"),
        3 when it does not fit this machine."""
        from ragkit.errors import RagkitError
        from ragkit.generate.doctor import DoesNotFit, diagnose

        try:
            settings = _settings(None, profile)
            plan = diagnose(settings, model)
        except RagkitError as exc:
            _fail(exc, as_json)
            return
        # README: exit 3 for "a plan that does not fit this machine", as `ask` exits on DoesNotFit
        code = DoesNotFit.exit_code if plan.fits is False else 0
        if as_json:
            _print_json(plan.to_json())
            raise typer.Exit(code)
        m, kv, s, h = plan.model, plan.kv_cache, plan.settings, plan.host
        out.print(f"[bold]model[/]  {Path(m['path']).name}  ({m['arch']}, {len(m['shards'])} file(s), {_human(m['file_bytes'])})", highlight=False)
        out.print(f"  weights {_human(m['tensor_bytes'])}: experts {_human(m['expert_bytes'])}, other {_human(m['non_expert_bytes'])}", highlight=False)
        out.print(
            f"  KV cache {_human(kv['bytes'])} at n_ctx {s['n_ctx']} ({s['type_k']}; {_human(kv['bytes_per_token'])} per token"
            + (", MLA latent" if m["is_mla"] else "") + ")",
            highlight=False,
        )
        for dev in ("gpu", "cpu"):
            d = getattr(plan, dev)
            out.print(
                f"  {dev.upper()}: {_human(d['total'])} = weights {_human(d['weights'])} (experts {_human(d['expert_weights'])})"
                f" + KV {_human(d['kv'])} + compute ~{_human(d['compute'])}",
                highlight=False,
            )
        gpus = ", ".join(f"{g['name']} {_human(g['free'])} free of {_human(g['total'])}" for g in h["gpus"]) or "none"
        limit = f" (cgroup limit {_human(h['ram_limit'])})" if h.get("ram_limit") else ""
        out.print(f"[bold]host[/]  RAM {_human(h['ram_available'])} available of {_human(h['ram_total'])}{limit}; GPUs: {gpus}; "
                  f"disk free {_human(h['disk_free'])} at {h['disk_path']}", highlight=False)
        colour = {"fits": "green", "unknown": "yellow"}.get(plan.verdict, "red")
        out.print(f"[bold {colour}]{plan.verdict}[/]", highlight=False)
        for r in plan.reasons:
            out.print(f"  - {r}", highlight=False)
        for r in plan.recommendations:
            out.print(f"  fix: {r['text']}", highlight=False)
        for n in plan.notes:
            err.print(f"  note: {n}", highlight=False)
        raise typer.Exit(code)
