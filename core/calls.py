"""Services and resolvers: how they are named, loaded and called.

A service or resolver is a Python callable taking the document, or the document and a
CallContext.  Trigger files name them by a built-in name or "package.module:function".
"""

from __future__ import annotations

import importlib
import inspect
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from .errors import ConfigError
from .pickling import by_fields
from .tomltext import toml_text

NEW: Final = "NEW"
DUPLICATE: Final = "DUPLICATE"
IN_DOUBT: Final = "IN_DOUBT"


@dataclass(init=False, slots=True)
class CallContext:
    """What a service or resolver may want to know beside the document itself."""

    trigger: str
    identity: str
    activation: str | None
    delivery_count: int
    attempt: int
    message_id: str
    history: dict[str, Any] | None

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        return by_fields(self)

    # Written out, not generated: compiled, a dataclass __init__ stays interpreted.
    def __init__(self, trigger: str, identity: str, activation: str | None,
                 delivery_count: int, attempt: int = 1, message_id: str = "",
                 history: dict[str, Any] | None = None) -> None:
        self.trigger = trigger
        self.identity = identity
        self.activation = activation
        self.delivery_count = delivery_count
        self.attempt = attempt
        self.message_id = message_id
        self.history = history


@dataclass(frozen=True, slots=True)
class Callee:
    """A loaded callable, with whether it takes the context and whether it is async."""

    spec: str
    function: Callable[..., Any]
    takes_context: bool
    is_async: bool

    def call(self, document: Any, context: CallContext) -> Any:
        """Call it (an async callable returns its coroutine)."""
        if self.takes_context:
            return self.function(document, context)
        return self.function(document)


def load_callee(spec: str, builtins: dict[str, Callable[..., Any]], *, source: str,
                where: str, base_dir: Path | None = None) -> Callee:
    """Load a built-in by name or "package.module:function"; ConfigError says what failed."""
    function = builtins.get(spec)
    if function is None:
        if ":" not in spec:
            known = ", ".join(sorted(builtins))
            raise ConfigError(source, where,
                              f'expected a built-in ({known}) or "package.module:function", '
                              f"got {toml_text(spec)}")
        module_name, _, attr = spec.partition(":")
        if base_dir is not None and str(base_dir) not in sys.path:
            # Services usually sit beside the trigger file that names them.
            sys.path.insert(0, str(base_dir))
        try:
            module = importlib.import_module(module_name)
        except Exception as exc:
            raise ConfigError(source, where,
                              f"cannot import module {module_name!r}: {exc}") from None
        function = getattr(module, attr, None)
        if function is None or not callable(function):
            raise ConfigError(source, where,
                              f"module {module_name!r} has no callable {attr!r}")
    # A callable returning an awaitable must be declared `async def`: the runners decide
    # once, at load time, whether to await it.
    return Callee(spec, function, _takes_context(function),
                  inspect.iscoroutinefunction(function)
                  or inspect.iscoroutinefunction(type(function).__call__))


def _takes_context(function: Callable[..., Any]) -> bool:
    try:
        signature = inspect.signature(function)
    except (TypeError, ValueError):
        return False
    positional = [
        p for p in signature.parameters.values()
        if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
    ]
    variadic = any(p.kind == p.VAR_POSITIONAL for p in signature.parameters.values())
    return variadic or len(positional) >= 2
