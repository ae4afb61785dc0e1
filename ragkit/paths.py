"""Where ragkit's data files live: prompts/ in a checkout, or the copy bundled in the wheel."""

from __future__ import annotations

from pathlib import Path

from ragkit.errors import ConfigError

_PKG = Path(__file__).resolve().parent


def prompts_dir() -> Path:
    checkout = _PKG.parent / "prompts"  # a source checkout (editable install)
    if (checkout / "system.txt").is_file():
        return checkout
    bundled = _PKG / "_prompts"  # a wheel install
    if bundled.is_dir():
        return bundled
    raise ConfigError("prompt templates not found (expected prompts/ next to the ragkit package)")


def read_prompt(name: str) -> str:
    return (prompts_dir() / name).read_text(encoding="utf-8")


def chat_template_source(name_or_path: str | None, metadata: dict) -> str:
    """A chat template by name (prompts/chat/NAME.jinja), by path, or the GGUF's own."""
    if name_or_path:
        p = Path(name_or_path)
        if p.suffix == ".jinja" and p.exists():
            return p.read_text(encoding="utf-8")
        candidate = prompts_dir() / "chat" / f"{name_or_path}.jinja"
        if candidate.exists():
            return candidate.read_text(encoding="utf-8")
        raise ConfigError(f"chat template {name_or_path!r} not found in {prompts_dir() / 'chat'}")
    tmpl = metadata.get("tokenizer.chat_template")
    if not tmpl:
        raise ConfigError(
            "this GGUF has no chat template (tokenizer.chat_template)",
            hint="set generator.chat_template to a file in prompts/chat",
        )
    return tmpl
