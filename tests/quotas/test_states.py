"""The quota request state machine (``quotas/states.py``): allowed and refused moves, and
concurrent moves of which exactly one wins (real transactions, one connection per thread)."""

from __future__ import annotations

from collections import Counter
from datetime import timedelta

import pytest
from django.utils import timezone

from quotas import services, states
from quotas.models import QuotaRequest
from tenants.access import Actor
from tenants.models import AuditEntry

from .factories import GPU, make_fleet
from .test_concurrency import kinds, run_at_once

S = QuotaRequest.Status


def _ask(cast, fleet, *, until=None) -> QuotaRequest:
    services.quota_set(actor=cast.actor("ops"), tenant=cast.acme, flavor=fleet.h100, resource=GPU, nominal=10)
    return services.quota_request_create(actor=cast.actor("carol"), project=cast.vision, flavor=fleet.h100,
                                         resource=GPU, amount=1, reason="a run", until=until)


def test_the_table() -> None:
    assert states.can_move(S.PENDING, S.APPROVED) and states.can_move(S.APPROVED, S.REVERTED)
    for final in states.FINAL:
        assert not any(states.can_move(final, to) for to in S.values)
    assert not states.can_move(S.PENDING, S.REVERTED) and not states.can_move(S.APPROVED, S.REJECTED)
    assert states.sources_of(S.REJECTED) == [S.PENDING]
    with pytest.raises(ValueError):
        states.move(QuotaRequest(pk=1), to=S.PENDING, actor=Actor.system(), action="x")  # nothing moves back to pending


@pytest.mark.django_db
def test_allowed_moves_are_audited_and_refused_ones_write_nothing(cast) -> None:
    request = _ask(cast, make_fleet())
    moved = states.move(request, to=S.REJECTED, actor=cast.actor("bob"), action="quota_request.reject",
                        fields={"comment": "no"})
    assert moved is not None and (moved.status, moved.comment) == (S.REJECTED, "no")
    entry = AuditEntry.objects.get(action="quota_request.reject")
    assert (entry.before, entry.after, entry.actor_label) == ({"status": "pending"}, {"status": "rejected"}, "bob")
    for to in (S.APPROVED, S.CANCELLED, S.REVERTED):
        assert states.move(request, to=to, actor=cast.actor("ops"), action=f"quota_request.{to}") is None
    request.refresh_from_db()
    assert request.status == S.REJECTED and AuditEntry.objects.filter(action__startswith="quota_request.").count() == 2


@pytest.mark.django_db
def test_a_condition_of_the_compare_is_part_of_the_move(cast) -> None:
    until = timezone.now() + timedelta(days=1)
    request = _ask(cast, make_fleet(), until=until)
    assert states.move(request, to=S.REJECTED, actor=Actor.system(), action="quota_request.lapse",
                       where={"until__lte": timezone.now()}) is None
    request.refresh_from_db()
    assert request.status == S.PENDING


@pytest.mark.django_db
def test_an_effect_that_fails_undoes_the_move(cast) -> None:
    request = _ask(cast, make_fleet())

    def fail(_: QuotaRequest) -> None:
        raise RuntimeError("quota write failed")

    with pytest.raises(RuntimeError):
        states.move(request, to=S.APPROVED, actor=Actor.system(), action="quota_request.approve", effect=fail)
    request.refresh_from_db()
    assert request.status == S.PENDING and not AuditEntry.objects.filter(action="quota_request.approve").exists()


@pytest.mark.django_db(transaction=True)
def test_concurrent_moves_exactly_one_wins(cast) -> None:
    """Twenty workers race a pending request to rejected, cancelled and approved: one moves it."""
    request = _ask(cast, make_fleet())
    targets = [S.REJECTED, S.CANCELLED, S.APPROVED]

    outcomes = run_at_once(lambda i: states.move(QuotaRequest(pk=request.pk), to=targets[i % 3], actor=Actor.system(),
                                                 action=f"quota_request.{targets[i % 3]}"))

    assert kinds(outcomes) == Counter({"ok": 20})
    winners = [value for _, value in outcomes if value is not None]
    assert len(winners) == 1
    request.refresh_from_db()
    assert request.status == winners[0].status
    assert AuditEntry.objects.filter(action__startswith="quota_request.", target_id=str(request.pk)).exclude(
        action="quota_request.create").count() == 1


@pytest.mark.django_db(transaction=True)
def test_the_expiry_job_twice_at_once_reverts_once(cast) -> None:
    until = timezone.now() + timedelta(days=1)
    request = _ask(cast, make_fleet(), until=until)
    services.quota_request_approve(actor=cast.actor("alice"), request=request)

    outcomes = run_at_once(lambda i: services.quota_request_revert(request_id=request.pk, now=until), n=8)

    assert Counter(value for _, value in outcomes) == Counter({True: 1, False: 7})
    assert AuditEntry.objects.filter(action="quota_request.revert").count() == 1
