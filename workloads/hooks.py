"""Where the request lifecycle hands over to materialization (the cluster side).

Services call these after their transaction commits (``portal.events.after_commit``), with ids only.
They queue the Celery tasks of ``workloads/tasks.py``; if the broker is down they log and return,
and the materializer's periodic sweep picks up approved requests, so a lost message never loses a
request. (Queued by name: tasks.py imports the services that call these.)
"""

from __future__ import annotations

import logging

from portal.events import enqueue

logger = logging.getLogger(__name__)


def request_approved(request_id: int) -> None:
    """An approved request (new, or restarted) should be created in the cluster."""
    try:
        enqueue("workloads.tasks.request_materialize_task", request_id)
    except Exception:  # the broker is down: the row is committed, the sweep will find it
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
