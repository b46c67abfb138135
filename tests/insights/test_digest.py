"""The weekly digest: each active tenant's admins get last week's headline figures and a link to the week's report,
once per tenant and week however often the task runs."""

from __future__ import annotations

from datetime import UTC, date, datetime

import pytest
from django.core import mail

from insights import digests
from insights.models import DigestSent
from portal.celery import app
from tenants.models import Tenant

from . import surfaces

pytestmark = [pytest.mark.django_db]
demo_metric = surfaces.demo_metric  # the fixture

NOW = datetime(2026, 3, 11, 9, 30, tzinfo=UTC)  # a Wednesday: last week began on Monday 2 March


def test_last_week_is_the_previous_monday_to_sunday() -> None:
    assert digests.last_week(NOW) == date(2026, 3, 2)
    assert digests.last_week(datetime(2026, 3, 9, 0, 0, tzinfo=UTC)) == date(2026, 3, 2)


def test_each_tenant_admin_gets_the_digest_once_per_week(cast, demo_metric, django_capture_on_commit_callbacks,
                                                         settings) -> None:
    settings.PORTAL_BASE_URL = "https://portal.example"
    with django_capture_on_commit_callbacks(execute=True):
        assert digests.digests_send(now=NOW) == 2
    assert sorted(m.to[0] for m in mail.outbox) == ["alice@example.com", "erin@example.com"]
    acme = next(m for m in mail.outbox if m.to == ["alice@example.com"])
    assert acme.subject == "[GPU portal] Weekly metrics of Acme Research, week of 02 Mar 2026"
    assert f"- {demo_metric.title}: 1\n" in acme.body  # by project: each of acme's projects has one
    assert "https://portal.example/tenants/acme/metrics/report/?start=2026-03-02&end=2026-03-08" in acme.body
    assert "globex" not in acme.body.lower()
    with django_capture_on_commit_callbacks(execute=True):
        assert digests.digests_send(now=NOW) == 0
        assert digests.digests_send(now=datetime(2026, 3, 15, 23, 0, tzinfo=UTC)) == 0  # still the same week
    assert len(mail.outbox) == 2
    assert set(DigestSent.objects.values_list("tenant__slug", "week")) == {("acme", date(2026, 3, 2)),
                                                                            ("globex", date(2026, 3, 2))}
    with django_capture_on_commit_callbacks(execute=True):
        assert digests.digests_send(now=datetime(2026, 3, 16, 1, 0, tzinfo=UTC)) == 2  # the next week
    assert len(mail.outbox) == 4


def test_suspended_tenants_and_tenants_without_admins_are_skipped(cast, django_capture_on_commit_callbacks) -> None:
    Tenant.objects.filter(pk=cast.globex.pk).update(status=Tenant.Status.SUSPENDED)
    cast.alice.email = ""
    cast.alice.save()
    with django_capture_on_commit_callbacks(execute=True):
        assert digests.digests_send(now=NOW) == 0
    assert mail.outbox == [] and not DigestSent.objects.exists()  # not claimed: an admin added later still gets it


def test_the_beat_task_is_registered_and_thin(cast, django_capture_on_commit_callbacks) -> None:
    from django.conf import settings

    assert settings.CELERY_BEAT_SCHEDULE["insights-digests-send"]["task"] == "insights.digests_send"
    with django_capture_on_commit_callbacks(execute=True):
        assert app.tasks["insights.digests_send"].apply().get() == 2
    assert len(mail.outbox) == 2
