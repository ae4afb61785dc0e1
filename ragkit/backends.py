"""Backend tables: a backend name -> "module:Class", imported only when chosen, so importing a
protocol's package loads none of its engines. The embedder and generator factories (and any
new kind of backend) look their classes up here."""

from __future__ import annotations

from importlib import import_module

from ragkit.errors import ConfigError


def import_target(table: dict[str, str], name: str, *, what: str, setting: str) -> type:
    """The class `table` names for `name` ("module:Class"), imported now. An unknown name is
    a ConfigError naming the `setting` and the choices."""
    try:
        target = table[name]
    except KeyError:
        raise ConfigError(f"unknown {what} {name!r}", hint=f"{setting} is one of {', '.join(sorted(table))}") from None
    module, _, attr = target.partition(":")
    return getattr(import_module(module), attr)
