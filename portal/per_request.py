"""Values read once per HTTP request instead of at every use: ``once(key, look_up)``.

Some values a page writes many times are read from context-local state that is slow to reach (asgiref's ``Local``,
several microseconds a read on a small machine): the URLconf and script prefix every link is reversed under, the
time zone every date is written in. Within one request they do not change: the handler sets the prefix before
``request_started``, and the portal activates no time zone or URLconf in a view. ``once`` looks such a value up at its
first use in the request and answers the same until ``request_finished``; outside a request (a Celery task, the
shell, a test rendering a template) it looks up at every call, as before.

The portal serves requests from sync workers (one request per thread at a time), so the values are kept per thread.
A view that activated a time zone or URLconf after a page had written its first date or link would not see the
change: do it in a middleware, before the view.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from django.core.signals import request_finished, request_started

_state = threading.local()  # .values: this thread's request's kept values; None (or unset) outside a request
_MISSING = object()


def _started(**kwargs: Any) -> None:
    _state.values = {}


def _finished(**kwargs: Any) -> None:
    _state.values = None


request_started.connect(_started, dispatch_uid="portal-per-request-started")
request_finished.connect(_finished, dispatch_uid="portal-per-request-finished")


def once[T](key: str, look_up: Callable[[], T]) -> T:
    """``look_up()``, called once per request for ``key`` (at every call outside a request)."""
    values = getattr(_state, "values", None)
    if values is None:
        return look_up()
    found = values.get(key, _MISSING)
    if found is _MISSING:
        found = values[key] = look_up()
    return found
