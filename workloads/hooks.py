"""Where the request lifecycle hands over to materialization (the cluster side).

Services call these after their transaction commits (``portal.events.after_commit``), with ids only.
They queue the Celery tasks of ``workloads/tasks.py``; if the broker is down they log and return,
and the materializer's periodic sweep picks up approved requests, so a lost message never loses a
request. (Queued by name: tasks.py imports the services that call these.)

Materializer runs are coalesced: an approval queues a run only when no run is waiting to look for approved
requests again. A run marks that it will look again (``RUN_PENDING``, in the shared cache) before each look
and removes the mark before its last one (``materialize.requests_materialize_until_done``), so an approval
that saw the mark was committed before a look that is still to come. Without the cache (an error), every
approval queues a run, as before.
"""

from __future__ import annotations

import logging

from django.core.cache import cache

from portal.events import enqueue

logger = logging.getLogger(__name__)

# "A materializer run is queued or running and will look for approved requests again." The time to live bounds the
# wait of an approval that saw the mark of a run that died: after it, the next approval queues a run (which claims
# every approved request, not only its own); the housekeeping sweep covers the rest.
RUN_PENDING = "workloads:materialize:run-pending"
RUN_PENDING_SECONDS = 10


def run_wanted() -> bool:
    """True when the caller must queue a materializer run (and the mark now says one is coming); False when a run
    that will look again after this moment is queued or running."""
    try:
        return bool(cache.add(RUN_PENDING, 1, RUN_PENDING_SECONDS))
    except Exception:  # the cache is down: queue a run, as without coalescing
        logger.warning("materializer mark unreadable; queueing a run", exc_info=True)
        return True


def run_will_look() -> None:
    """A run is about to look for approved requests (and will look again): approvals from now on need no run."""
    try:
        cache.set(RUN_PENDING, 1, RUN_PENDING_SECONDS)
    except Exception:
        logger.warning("could not set the materializer mark", exc_info=True)


def run_last_look() -> None:
    """A run is about to take its last look: approvals from now on queue a run of their own."""
    try:
        cache.delete(RUN_PENDING)
    except Exception:  # the mark lapses after RUN_PENDING_SECONDS; until then approvals may wait for the sweep
        logger.warning("could not remove the materializer mark", exc_info=True)


def request_approved(request_id: int) -> None:
    """An approved request (new, or restarted) should be created in the cluster: queue a materializer run unless
    one that will still look for it is queued or running."""
    if not run_wanted():
        return
    try:
        enqueue("workloads.tasks.request_materialize_task", request_id)
    except Exception:  # the broker is down: the row is committed, the sweep will find it
        run_last_look()  # no run is coming after all: the next approval tries again
        logger.exception("could not queue materialization of request %s", request_id)


def request_changed(request_id: int, action: str) -> None:
    """A lifecycle action changed a request: ``stop``, ``cancel``, ``delete``, ``extend``, ``scale``.

    The cluster side makes the objects match: remove them (stop, cancel), remove them with their
    volumes (delete), update the deadline (extend) or the replica count (scale).
    """
    try:
        enqueue("workloads.tasks.request_changed_task", request_id, action)
    except Exception:
        logger.exception("could not queue %s of request %s", action, request_id)
