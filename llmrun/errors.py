"""The exceptions llmrun shows to users.

Every failure a user can cause or meet ends up as one :class:`LlmrunError`:
a one-line ``message`` saying what is wrong, a ``hint`` saying what to do, and
the process ``exit_code``. The CLI prints exactly these two lines; anything else
that escapes is a bug and is reported as such (with the traceback under --debug).

Core code names a parameter in backticks, by its field name (`n_ctx`, `temperature`),
never by a command-line flag: each adapter words it its own way through :func:`word`
(the CLI as ``--ctx``, the server as its JSON field or the operator's option).
"""

from __future__ import annotations

import re
from collections.abc import Mapping

_MENTION = re.compile(r"`([a-z][a-z0-9_]*)`")


def word(text: str, words: Mapping[str, str]) -> str:
    """``text`` with each parameter it mentions in an adapter's words; a name the adapter
    does not know is left as it is."""
    return _MENTION.sub(lambda m: words.get(m.group(1), m.group(0)), text)


def mentions(text: str) -> set[str]:
    """The parameter names ``text`` mentions."""
    return set(_MENTION.findall(text))


class LlmrunError(Exception):
    """Base class: an error with a message, a hint and an exit code."""

    exit_code: int = 1

    def __init__(self, message: str, hint: str = "") -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint

    def __str__(self) -> str:
        return self.message

    def worded(self, words: Mapping[str, str]) -> tuple[str, str]:
        """The message and the hint in an adapter's words."""
        return word(self.message, words), word(self.hint, words)


class UsageError(LlmrunError):
    """A bad flag value or argument (exit code 2, like click's usage errors)."""

    exit_code = 2


class InvalidParameter(UsageError):
    """A sampling or load parameter outside its valid range.

    ``name`` is the field name (``top_p``); each adapter words it as what set it
    (``--top-p``, ``/set top_p``, the JSON field ``top_p``).
    """

    def __init__(self, name: str, value: object, expected: str) -> None:
        self.name = name
        self.value = value
        self.expected = expected
        super().__init__(f"`{name}` must be {expected}, got {value!r}")


class ContextFull(UsageError):
    """A prompt (with the room its answer needs) that does not fit the context."""


class ShuttingDown(LlmrunError):
    """A request refused or ended because the engine is stopping."""


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


class RemoteError(LlmrunError):
    """A remote engine (an OpenAI-compatible server) that could not answer.

    ``retryable``: another endpoint may well answer the same request (the host is down, overloaded
    or failing), as opposed to a request the endpoint rejects (a bad setting, a missing model, a key)."""

    def __init__(
        self,
        message: str,
        hint: str = "",
        *,
        retryable: bool = False,
        status: int | None = None,
        setting: str | None = None,
        down: bool = False,
    ) -> None:
        super().__init__(message, hint)
        self.retryable = retryable or down
        self.status = status
        self.setting = setting  # the sampling setting the endpoint rejected, when it named one
        self.down = down  # the endpoint cannot be reached at all (send it nothing more)


def backend_cannot(what: str) -> UsageError:
    """A model whose backend lacks a capability (a remote engine has no logits): one line saying so."""
    return UsageError(f"this model's backend cannot {what}", "use a GGUF or MLX model for this")
