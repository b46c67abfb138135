"""Who waits ahead of a queued request is read again when the requests waiting in its queue change, not only when
the queue's usage does: a request withdrawn while it waits (the ClusterQueue's usage unchanged) moves the one
behind it up at the follower's next look (``workloads.status``, the pending sentences' refresh)."""

from __future__ import annotations

import pytest

from tenants.access import Actor
from workloads import services, status
from workloads.models import RequestState as S

from .test_lifecycle import World, _world, celery_worker_thread, worker  # noqa: F401 - fixtures

pytestmark = [pytest.mark.django_db(transaction=True)]


@pytest.fixture
def world(fresh_sandbox, cast, worker) -> World:  # noqa: F811 - the fixture imported above
    return _world(fresh_sandbox, cast, architecture="B")


def _run(on: World, req):  # approved where a rule asks for it
    if req.state == S.PENDING_APPROVAL:
        req = on.approve(req)
    return req


def test_a_request_leaving_the_queue_moves_the_one_behind_it_up(world: World, monkeypatch) -> None:
    monkeypatch.setattr(status, "PENDING_REFRESH_SECONDS", 0)  # every follower cycle looks (production: every 10 s)
    holder = _run(world, world.submit("carol", "training", "h100-80gb-offline", gpus=8, duration_hours=1))
    world.wait(holder, lambda r: r.state == S.RUNNING, advance=5, timeout=90)  # the project's 8 GPUs are taken
    first = _run(world, world.submit("carol", "training", "h100-80gb-offline", gpus=8, duration_hours=1))
    second = _run(world, world.submit("carol", "training", "h100-80gb-offline", gpus=8, duration_hours=1))
    second = world.wait(second, lambda r: r.state == S.QUEUED and r.pending_reason.endswith("1 request is ahead of you"),
                        advance=1, timeout=90, also=first)
    services.request_cancel(actor=Actor(user=world.cast.carol), request=first)
    second = world.wait(second, lambda r: r.pending_reason.endswith("nothing is ahead of you"), advance=1, timeout=60,
                        also=first)
    assert second.state == S.QUEUED and second.pending_reason.startswith("waiting for 8 x")
