"""A quota request's JSON is written at once (``QuotaRequestSerializer.to_representation``), not by DRF's field loop:
here every row of the API list and every detail is held to what DRF's own loop writes from the same declared fields,
over statuses, deciders, shares, dates with and without an end, what was applied, and another time zone."""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal
from itertools import cycle

import pytest
from django.utils import timezone
from rest_framework import serializers

from quotas.api.serializers import QuotaRequestSerializer
from quotas.models import QuotaRequest

pytestmark = pytest.mark.django_db
API = "/api/v1"


def _drf(request: QuotaRequest) -> dict:
    """What DRF's own loop writes for ``request`` (read in full) with the serializer's declared fields."""
    return serializers.ModelSerializer.to_representation(QuotaRequestSerializer(), request)


@pytest.fixture
def asked(cast):
    from tests.workloads.factories import make_catalogue

    cat = make_catalogue(cast)
    now = timezone.now().replace(microsecond=123456)
    asking = cycle([(cast.vision, cast.carol), (cast.nlp, cast.alice), (cast.vision, cast.bob)])
    deciders = cycle([(None, None, ""), (cast.bob, now, "fine <by> me"), (cast.ops, now - timedelta(hours=3), "")])
    shares = cycle([(0, 0), (11264, 25), (0, 0), (40960, 50)])
    made = []
    for n, status in enumerate(QuotaRequest.Status.values * 3):
        decider, decided_at, comment = next(deciders)
        project, asker = next(asking)
        memory, cores = next(shares)
        made.append(QuotaRequest.objects.create(
            project=project, flavor=cat.mig if n % 3 else cat.h100, resource="nvidia.com/gpu",
            amount=Decimal(n + 1) / 4, share_memory_mib=memory, share_cores_percent=cores,
            until=now + timedelta(days=n) if n % 2 else None, reason=f"reason <{n}> é\nmore", requested_by=asker,
            status=status, approver=QuotaRequest.Approver.values[n % len(QuotaRequest.Approver.values)],
            decided_by=decider, decided_at=decided_at, comment=comment,
            applied={"quota": n, "rows": [["nvidia.com/gpu", str(n)]]} if n % 4 == 0 else {},
        ))
    return made


@pytest.mark.parametrize("zone", ["UTC", "Asia/Kolkata"])
def test_the_list_and_details_write_what_drfs_loop_writes(api, asked, settings, zone) -> None:
    settings.TIME_ZONE = zone
    client = api("ops")
    listed = client.get(f"{API}/quota-requests/?page_size=100").json()["results"]
    assert {row["id"] for row in listed} == {r.pk for r in asked}
    full = {r.pk: r for r in QuotaRequest.objects.filter(pk__in=[r.pk for r in asked])
            .select_related("project__tenant", "flavor__cluster", "requested_by", "decided_by")}
    for row in listed:
        expected = _drf(full[row["id"]])
        assert row == expected
        assert list(row) == list(expected)  # the same keys in the same order
        assert client.get(f"{API}/quota-requests/{row['id']}/").json() == expected
    shared = [row for row in listed if row["share"] is not None]
    assert shared and all(row["what"].startswith("+") for row in listed)
    assert any(row["decided_by"] is None and row["decided_at"] is None for row in listed)
    assert any(row["until"] is not None for row in listed) and any(row["until"] is None for row in listed)
    if zone != "UTC":
        assert all(row["created_at"].endswith("+05:30") for row in listed)
