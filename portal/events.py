"""After-commit side effects: the one way product code schedules work for when its transaction commits.

``after_commit(fn, *args, **kwargs)`` runs ``fn(*args, **kwargs)`` once the current transaction commits
(at once outside a transaction) and never when it rolls back. A handler that raises is logged and
skipped: the commit stands and the other handlers still run. Services use it to queue Celery tasks and
send notifications, with ids and plain values only (the rows are re-read by whoever handles them).

``once=True`` drops a handler equal to one already waiting in the same transaction (same function,
same arguments): a change that touches a cluster's quotas twice queues one reconcile.
``tests/test_events.py`` checks that nothing else in the product calls ``transaction.on_commit``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from django.db import DEFAULT_DB_ALIAS, connections, transaction

logger = logging.getLogger(__name__)


class Handler:
    """``fn(*args, **kwargs)``, run after commit; equal to another with the same function and arguments."""

    def __init__(self, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]):
        self.fn = fn
        self.args = args
        self.kwargs = kwargs
        # Django names a failed hook by its __qualname__; ours says which function and arguments.
        self.__qualname__ = self.name

    @property
    def name(self) -> str:
        fn = getattr(self.fn, "__qualname__", None) or type(self.fn).__name__
        module = getattr(self.fn, "__module__", None)
        shown = [repr(a) for a in self.args] + [f"{k}={v!r}" for k, v in self.kwargs.items()]
        return f"{module + '.' if module else ''}{fn}({', '.join(shown)[:200]})"

    def __call__(self) -> None:
        try:
            self.fn(*self.args, **self.kwargs)
        except Exception:  # committed already: log, never undo, let the next handlers run
            logger.exception("after-commit handler %s failed; the transaction stays committed", self.name)

    def __eq__(self, other: object) -> bool:
        return (isinstance(other, Handler) and other.fn == self.fn and other.args == self.args
                and other.kwargs == self.kwargs)

    def __hash__(self) -> int:
        return hash(self.fn)

    def __repr__(self) -> str:
        return f"<after commit: {self.name}>"


def after_commit(fn: Callable[..., Any], *args: Any, using: str = DEFAULT_DB_ALIAS, once: bool = False,
                 **kwargs: Any) -> None:
    """Run ``fn(*args, **kwargs)`` after the transaction on ``using`` commits; a failure is logged, not raised.

    ``using`` and ``once`` belong to this helper, every other keyword goes to ``fn``.
    """
    handler = Handler(fn, args, kwargs)
    if once and handler in pending(using=using):
        return
    transaction.on_commit(handler, using=using, robust=True)


def pending(*, using: str = DEFAULT_DB_ALIAS) -> list[Handler]:
    """The handlers waiting for the current transaction on ``using`` to commit, in order."""
    connection = connections[using]
    if not connection.in_atomic_block:
        return []
    return [func for _, func, _ in connection.run_on_commit if isinstance(func, Handler)]


def enqueue(task_name: str, *args: Any) -> None:
    """Queue the Celery task registered as ``task_name`` (``"app.tasks.function"``) with ``args``.

    By name, so a service that queues work need not import the task module, which imports the
    services back (tasks are thin wrappers around them): no import cycle, even a deferred one. In a
    process that has the task loaded (a worker) the task's own ``apply_async`` runs; elsewhere the
    message goes to the broker by name. Raises what the broker raises; callers that run after commit
    log it (the periodic sweeps catch up).
    """
    from celery import current_app

    current_app.signature(task_name, args=args).delay()


def enqueue_chain(*steps: tuple[str, tuple[Any, ...]]) -> None:
    """Queue tasks by name, one after the other (a Celery chain); each step is ``(task_name, args)``."""
    from celery import chain, current_app

    chain(*(current_app.signature(name, args=args, immutable=True) for name, args in steps)).delay()
