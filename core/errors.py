"""The exceptions of onceflow: one root, with transient errors kept apart."""

from __future__ import annotations


class OnceflowError(Exception):
    """Root of every error onceflow raises on purpose."""


class TransientError(OnceflowError):
    """A failure that may correct itself: the service is retried (ISRuntimeException).

    Raise it from a service or a resolver when a resource it needs (a database, a
    remote API) is unavailable for now.  Every other exception is a service error.
    """


class HistoryUnavailable(TransientError):
    """The document history store could not be read or written.

    `cause`: the store's own failure, kept as the error's cause by the constructor, since
    compiled code (mypyc) drops the `from` of `raise ... from exc` (the worker's log then
    showed no cause for a history that could not be read).
    """

    def __init__(self, message: str, cause: BaseException | None = None) -> None:
        super().__init__(message)
        if cause is not None:
            self.__cause__ = cause


class ConfigError(OnceflowError):
    """A trigger file is wrong; the message names the file, the trigger and the key."""

    def __init__(self, source: str, where: str, problem: str, *,
                 details: tuple[str, ...] = ()) -> None:
        self.source = source
        self.where = where
        self.problem = problem
        self.details = details  # every problem, one by one, when there are several
        super().__init__(f"{source}: {where}: {problem}")


class ScenarioError(OnceflowError):
    """A scenario folder or one of its lines is malformed."""


class ScriptedFailure(OnceflowError):
    """The built-in `scripted` service or resolver was asked to fail."""
