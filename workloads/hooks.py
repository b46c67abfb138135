"""Where the request lifecycle hands over to materialization (the cluster side).

Services call these after their transaction commits (``transaction.on_commit``), with ids only.
They queue the Celery tasks of ``workloads/tasks.py`` when that module provides them; until then
(and if the broker is down) they log and return, and the materializer's periodic sweep picks up
approved requests, so a lost message never loses a request.
"""

from __future__ import annotations

import importlib
import logging
from typing import Any

logger = logging.getLogger(__name__)


def _task(name: str) -> Any | None:
    try:
        module = importlib.import_module("workloads.tasks")
    except ModuleNotFoundError as exc:
        if exc.name != "workloads.tasks":
            raise  # a broken import inside tasks.py is a bug, not "not written yet"
        return None
    return getattr(module, name, None)


def request_approved(request_id: int) -> None:
    """An approved request (new, or restarted) should be created in the cluster."""
    task = _task("request_materialize_task")
    if task is None:
        logger.info("request %s approved; no materialize task installed yet", request_id)
        return
    try:
        task.delay(request_id)
    except Exception:  # the broker is down: the row is committed, the sweep will find it
        logger.exception("could not queue materialization of request %s", request_id)


def request_changed(request_id: int, action: str) -> None:
    """A lifecycle action changed a request: ``stop``, ``cancel``, ``delete``, ``extend``, ``scale``.

    The cluster side makes the objects match: remove them (stop, cancel), remove them with their
    volumes (delete), update the deadline (extend) or the replica count (scale).
    """
    task = _task("request_changed_task")
    if task is None:
        logger.info("request %s: %s; no change task installed yet", request_id, action)
        return
    try:
        task.delay(request_id, action)
    except Exception:
        logger.exception("could not queue %s of request %s", action, request_id)
