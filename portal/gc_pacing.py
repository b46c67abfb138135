"""The cyclic garbage collector run between a web worker's requests, not in the middle of them.

A page holds a few thousand container objects while it is built (rows, model instances, forms, template contexts).
With Python's default threshold (a collection of the youngest generation every 2,000 new containers) a page met one
or two collections mid-render, each walking everything the page still held, ~0.7 ms, and promoting it all to the
next generation, whose collections then cost 3-10 ms once every twenty-odd pages: the pages' p95
(docs/performance.md). Here the youngest generation's threshold is high enough that a page does not trigger a
collection, and each request, as it starts, collects what the request before it left behind: by then only that
request's reference cycles, unreachable (a few hundred objects, ~0.15 ms), every tenth request also the middle
generation, every thousandth all of them. A request that makes more than ``THRESHOLD`` containers still meets
Python's own collections.

As a request starts, not as the one before finishes: when ``request_finished`` is sent the server still holds the
finished request's response and environment, so a collection then found most of its objects alive and moved them to
the middle generation, where every tenth request collected them (measured in a gunicorn worker: ~1.9 ms median,
3.4 ms at the 90th percentile, against ~0.16 ms now, and a quarter less time in the collector overall).

Installed by ``portal/wsgi.py`` through :func:`start_web_worker` (the web workers: gunicorn, ``make run``), not by
Celery workers or tests. ``tests/bench/speed.py`` calls the same function before it times submissions in its own
process, so that they meet the collector as a web worker's requests do.
"""

from __future__ import annotations

import gc
import itertools
from typing import Any

from django.core.signals import request_started

THRESHOLD = 50_000  # new containers before Python collects on its own (its default: 2,000)
MIDDLE_EVERY, ALL_EVERY = 10, 1000  # requests between collections of the middle generation, of all of them

_installed: list[Any] = []


def install() -> None:
    """Raise the youngest generation's threshold and collect as every request starts (once per process)."""
    if _installed:
        return
    previous = gc.get_threshold()
    gc.set_threshold(THRESHOLD, previous[1], previous[2])
    served = itertools.count(1)

    def collect(**kwargs: Any) -> None:
        n = next(served)
        gc.collect(2 if n % ALL_EVERY == 0 else 1 if n % MIDDLE_EVERY == 0 else 0)

    request_started.connect(collect, weak=False, dispatch_uid="portal.gc_pacing")
    _installed.append(previous)


def start_web_worker() -> None:
    """What a web worker does once its application is made: load the URLconf (every view module), then move
    everything alive now out of the collector's sight (``gc.freeze``), then :func:`install`.

    Django, the apps and their modules live as long as the worker, yet each full collection walked them all (about
    180,000 objects, 200-300 ms on the bench machine, once every hundred-odd pages: the pages' p95). Garbage made by
    requests is collected as before (docs/performance.md)."""
    from django.urls import get_resolver

    len(get_resolver().url_patterns)  # imports the views, forms and serializers
    gc.collect()
    gc.freeze()
    install()


def uninstall() -> None:
    """Back to Python's own pacing (tests)."""
    if _installed:
        gc.set_threshold(*_installed.pop())
        request_started.disconnect(dispatch_uid="portal.gc_pacing")
