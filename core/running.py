"""Running a trigger's service: attempts, transient-error retries, and their end.

The same policy serves every runner: `run_service` for synchronous runners (replay,
Spark; retries do not wait on simulated time), `run_service_async` for the worker.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Final

from .calls import CallContext, Callee
from .errors import TransientError
from .triggers import ON_FAILURE_SUSPEND, TriggerDef

OK: Final = "ok"
ERROR: Final = "error"
SUSPEND: Final = "suspend"
RETRY: Final = "retry"


@dataclass(init=False, slots=True)
class ServiceResult:
    """How a run ended, after how many attempts, and the failures on the way."""

    outcome: str
    value: Any
    attempts: int
    error_type: str
    error_message: str
    retries: list[tuple[int, str]]

    # Written out, not generated: compiled, a dataclass __init__ stays interpreted.
    def __init__(self, outcome: str, value: Any = None, attempts: int = 1,
                 error_type: str = "", error_message: str = "",
                 retries: list[tuple[int, str]] | None = None) -> None:
        self.outcome = outcome
        self.value = value
        self.attempts = attempts
        self.error_type = error_type
        self.error_message = error_message
        self.retries = [] if retries is None else retries


def after_failure(trigger: TriggerDef, attempt: int, exc: BaseException) -> str:
    """What follows a failed attempt: RETRY, ERROR (a service error) or SUSPEND."""
    if isinstance(exc, TransientError):
        if attempt <= trigger.max_retry_attempts:
            return RETRY
        if trigger.on_retry_failure == ON_FAILURE_SUSPEND:
            return SUSPEND
    return ERROR


def _failed(outcome: str, exc: BaseException, attempt: int,
            retries: list[tuple[int, str]]) -> ServiceResult:
    message = str(exc) or type(exc).__name__
    if isinstance(exc, TransientError) and outcome == ERROR:
        message = f"retries exhausted after {attempt} attempt(s): {message}"
    return ServiceResult(outcome, None, attempt, type(exc).__name__, message, retries)


class Attempts:
    """The attempts of one run: which comes next, the failures so far, and how it ends.

    The retry policy, once for every runner: a run loop calls the service with
    `context(...)`, and ends with `succeeded(value)`, or asks `failed(exc)`, which gives
    the run's end or None (wait `wait` seconds, then make the next attempt).
    """

    __slots__ = ("trigger", "number", "retries")

    def __init__(self, trigger: TriggerDef) -> None:
        self.trigger = trigger
        self.number = 1
        self.retries: list[tuple[int, str]] = []

    def context(self, context: CallContext) -> CallContext:
        """The call context of the attempt to make (its number in `attempt`)."""
        return _with_attempt(context, self.number)

    def succeeded(self, value: Any) -> ServiceResult:
        """The end of a run whose attempt returned value."""
        return ServiceResult(OK, value, self.number, retries=self.retries)

    def failed(self, exc: BaseException) -> ServiceResult | None:
        """The end of the run after this attempt raised exc, or None: retry it."""
        step = after_failure(self.trigger, self.number, exc)
        if step != RETRY:
            return _failed(step, exc, self.number, self.retries)
        self.retries.append((self.number, f"{type(exc).__name__}: {exc}"))
        self.number += 1
        return None

    @property
    def wait(self) -> float:
        """Seconds to wait before the next attempt (retry_interval)."""
        return self.trigger.retry_interval / 1000


def run_service(
    trigger: TriggerDef,
    service: Callee,
    payload: Any,
    context: CallContext,
    *,
    run_coroutine: Callable[[Awaitable[Any]], Any],
    sleep: Callable[[float], None] | None = None,
) -> ServiceResult:
    """Call the service until it succeeds, fails for good, or the trigger must suspend.

    `run_coroutine` runs an async service's coroutine to its end (an AwaitRunner's `run`).
    """
    attempts = Attempts(trigger)
    while True:
        try:
            value = service.call(payload, attempts.context(context))
            if service.is_async:
                value = run_coroutine(value)
            return attempts.succeeded(value)
        except Exception as exc:
            end = attempts.failed(exc)
            if end is not None:
                return end
            if sleep is not None:
                sleep(attempts.wait)


async def run_service_async(
    trigger: TriggerDef,
    service: Callee,
    payload: Any,
    context: CallContext,
    *,
    sleep: Callable[[float], Awaitable[None]] | None = None,
    before_retry: Callable[[int], Awaitable[None]] | None = None,
    attempt: Callable[[Any, CallContext], Awaitable[Any]] | None = None,
    first_failure: Exception | None = None,
) -> ServiceResult:
    """The async twin of run_service: waits retry_interval between attempts.

    `sleep` defaults to asyncio.sleep (asyncio is imported when first needed: the
    synchronous runners never load it).  `attempt(payload, context)` makes one call (the
    worker runs a plain function in a thread through it); by default the service is called
    here and awaited when async.  `first_failure`: attempt 1 was already made elsewhere and
    raised this; the policy goes on from there.
    """
    attempts = Attempts(trigger)
    failure = first_failure
    while True:
        if failure is None:
            try:
                call_context = attempts.context(context)
                if attempt is not None:
                    value = await attempt(payload, call_context)
                else:
                    value = service.call(payload, call_context)
                    if service.is_async:
                        value = await value
                return attempts.succeeded(value)
            except Exception as exc:
                failure = exc
        end = attempts.failed(failure)
        if end is not None:
            return end
        failure = None
        if sleep is None:
            import asyncio

            sleep = asyncio.sleep
        await sleep(attempts.wait)
        if before_retry is not None:
            await before_retry(attempts.number)


def _with_attempt(context: CallContext, attempt: int) -> CallContext:
    if context.attempt == attempt:
        return context
    return CallContext(context.trigger, context.identity, context.activation,
                       context.delivery_count, attempt, context.message_id, context.history)


class AwaitRunner:
    """The event loop in which a synchronous runner runs async services, made when needed.

    asyncio is imported then: a replay of synchronous services never pays its 20 ms of
    imports.  Keep one where the runner's state is not: a runner holding a bound method
    of itself is a reference cycle, and all its state would wait for a full collection.
    """

    def __init__(self) -> None:
        self._loop: Any = None

    def run(self, awaitable: Awaitable[Any]) -> Any:
        """Run one awaitable to its end in this runner's loop."""
        if self._loop is None:
            import asyncio

            self._loop = asyncio.new_event_loop()

        async def wait() -> Any:
            return await awaitable

        return self._loop.run_until_complete(wait())

    def close(self) -> None:
        """Close the loop, if one was made."""
        if self._loop is not None:
            self._loop.close()
            self._loop = None
