from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tenants.models import Role

from ..factories import make_member
from .factories import Catalogue, make_catalogue


@pytest.fixture
def cat(cast) -> Catalogue:
    """The catalogue and quotas; carol is also a member of acme-nlp (to submit in two projects)."""
    make_member(cast.carol, cast.acme, Role.MEMBER, cast.nlp)
    return make_catalogue(cast)


@pytest.fixture
def hooks_called() -> Iterator[list[tuple[Any, ...]]]:
    """What the services handed to materialization: the Celery tasks really published to the broker.

    Observed through Celery's ``before_task_publish`` signal, as ("approved", id) for a
    materialization and (action, id) for a lifecycle change. Nothing of ours is replaced.
    """
    from celery.signals import before_task_publish

    calls: list[tuple[Any, ...]] = []

    def record(sender: str | None = None, body: Any = None, **kwargs: Any) -> None:
        args = body[0] if isinstance(body, (tuple, list)) else ()
        if sender == "workloads.tasks.request_materialize_task":
            calls.append(("approved", args[0]))
        elif sender == "workloads.tasks.request_changed_task":
            calls.append((args[1], args[0]))

    before_task_publish.connect(record, weak=False)
    yield calls
    before_task_publish.disconnect(record)
