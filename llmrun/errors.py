"""The exceptions llmrun shows to users.

Every failure a user can cause or meet ends up as one :class:`LlmrunError`:
a one-line ``message`` saying what is wrong, a ``hint`` saying what to do, and
the process ``exit_code``. The CLI prints exactly these two lines; anything else
that escapes is a bug and is reported as such (with the traceback under --debug).
"""

from __future__ import annotations


class LlmrunError(Exception):
    """Base class: an error with a message, a hint and an exit code."""

    exit_code: int = 1

    def __init__(self, message: str, hint: str = "") -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint

    def __str__(self) -> str:
        return self.message


class UsageError(LlmrunError):
    """A bad flag value or argument (exit code 2, like click's usage errors)."""

    exit_code = 2


class InvalidParameter(UsageError):
    """A sampling or load parameter outside its valid range.

    ``name`` is the field name (``top_p``); the CLI maps it to the flag that set it.
    """

    def __init__(self, name: str, value: object, expected: str) -> None:
        self.name = name
        self.value = value
        self.expected = expected
        super().__init__(f"{name} must be {expected}, got {value!r}")

    def for_flag(self, flag: str) -> UsageError:
        """The same error, worded for the flag (or slash command) that set it."""
        return UsageError(f"{flag} must be {self.expected}, got {self.value!r}", self.hint)


class ConfigError(LlmrunError):
    """A malformed or invalid models.toml / config file."""


class ModelNotFound(LlmrunError):
    """A model name that resolves to nothing."""


class ModelFileError(LlmrunError):
    """A model file that is missing, truncated, corrupt or not a GGUF."""


class InsufficientMemory(LlmrunError):
    """The model plus its KV cache will not fit in available memory."""


class TemplateError(LlmrunError):
    """A chat template that fails to render, loops, or tries to escape the sandbox."""


class BackendError(LlmrunError):
    """The inference backend failed (load or decode)."""


class StoreError(LlmrunError):
    """The local model store could not be read or written."""
