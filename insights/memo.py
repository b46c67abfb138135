"""One page's shared reads: the metrics of an overview or a report ask the same small questions (the labels of the
same tenants, which days are rolled up, which sample hours are clean); inside ``one_page()`` each is asked once
and remembered until the page is rendered. Outside it (the API's one metric, tasks, tests) nothing is remembered.

Only answers that cannot change meaningfully within one page's render are kept (names, the rollup plan of one
period), in a context variable, so nothing outlives the request or leaks across threads."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

_memo: ContextVar[dict[Any, Any] | None] = ContextVar("insights_memo", default=None)


@contextmanager
def one_page() -> Iterator[None]:
    """Remember the shared reads until the block ends."""
    token = _memo.set({})
    try:
        yield
    finally:
        _memo.reset(token)


def remembered[T](key: Any, compute: Callable[[], T]) -> T:
    """``compute()``, once per ``key`` inside ``one_page()``; every time outside it."""
    memo = _memo.get()
    if memo is None:
        return compute()
    if key not in memo:
        memo[key] = compute()
    return memo[key]


def names(model: Any, column: str, pks: set[Any], fetch: Callable[[set[Any]], dict[Any, Any]]) -> dict[Any, Any]:
    """pk -> ``column`` of ``model`` for ``pks``: inside ``one_page()`` only the pks not read yet are fetched."""
    memo = _memo.get()
    if memo is None:
        return fetch(pks)
    known = memo.setdefault(("names", model, column), {})
    missing = {pk for pk in pks if pk not in known}
    if missing:
        known.update(fetch(missing))
    return {pk: known[pk] for pk in pks if pk in known}
