"""A chat template split around its system and user contents: what a prompt builder puts
before, between and after them (ragkit.retrieve.prompt), and what a chat-only engine's
client recovers the two messages from (ragkit.generate.openai_compat)."""

from __future__ import annotations

from datetime import datetime

from jinja2.sandbox import ImmutableSandboxedEnvironment

from ragkit.errors import UsageError

_SYS = "\u2063RAGKIT_SYSTEM\u2063"
_USER = "\u2063RAGKIT_USER\u2063"


def render_chat_parts(chat_template: str, bos: str = "", eos: str = "") -> tuple[str, str, str]:
    """Render the chat template around two sentinels and return the template text before
    the system content, between system and user content, and after the user content."""
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)

    def raise_exception(msg: str) -> None:
        raise ValueError(msg)

    env.globals["raise_exception"] = raise_exception
    # Templates that print today's date (Llama 3 style) get the real one, as transformers
    # renders them; the Kimi K2 and Qwen templates ragkit ships do not use it, so their
    # prefixes (and KV caches) do not change from day to day.
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    rendered = env.from_string(chat_template).render(
        messages=[{"role": "system", "content": _SYS}, {"role": "user", "content": _USER}],
        add_generation_prompt=True,
        bos_token=bos,
        eos_token=eos,
    )
    if rendered.count(_SYS) != 1 or rendered.count(_USER) != 1:
        raise UsageError("the chat template does not render a system and a user message once each")
    pre, rest = rendered.split(_SYS)
    mid, post = rest.split(_USER)
    return pre, mid, post
