from __future__ import annotations

from typing import Any

import pytest

from tenants.models import Role

from ..factories import make_member
from .factories import Catalogue, make_catalogue


@pytest.fixture
def cat(cast) -> Catalogue:  # noqa: ANN001
    """The catalogue and quotas; carol is also a member of acme-nlp (to submit in two projects)."""
    make_member(cast.carol, cast.acme, Role.MEMBER, cast.nlp)
    return make_catalogue(cast)


@pytest.fixture
def hooks_called(monkeypatch) -> list[tuple[Any, ...]]:  # noqa: ANN001
    """Records what the services hand to materialization (workloads.hooks), instead of queueing it."""
    from workloads import hooks

    calls: list[tuple[Any, ...]] = []
    monkeypatch.setattr(hooks, "request_approved", lambda request_id: calls.append(("approved", request_id)))
    monkeypatch.setattr(hooks, "request_changed", lambda request_id, action: calls.append((action, request_id)))
    return calls
