"""Errors a user can cause and fix. The CLI prints them as one line, never a traceback."""

from __future__ import annotations


class RagkitError(Exception):
    """A problem the user can act on. `exit_code` is what the CLI exits with."""

    exit_code = 1

    def __init__(self, message: str, *, hint: str | None = None):
        super().__init__(message)
        self.hint = hint

    def __str__(self) -> str:  # one line, with a hint when there is one
        base = super().__str__()
        return f"{base} ({self.hint})" if self.hint else base


class UsageError(RagkitError):
    exit_code = 2


class ConfigError(RagkitError):
    exit_code = 2


class ModelNotFound(RagkitError):
    exit_code = 3


class StoreError(RagkitError):
    exit_code = 4


class StoreLocked(StoreError):
    exit_code = 5


class DocumentError(RagkitError):
    """A single input file could not be ingested. The batch goes on."""

    def __init__(self, path: str, reason: str):
        super().__init__(f"{path}: {reason}")
        self.path = path
        self.reason = reason
