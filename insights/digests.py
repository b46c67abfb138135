"""The weekly digest: each tenant's admins get last week's headline figures (every metric, their tenant's slice)
and a link to the week's report (docs/insights.md, "Pages, API and reports").

Beat runs ``insights.digests_send`` hourly; a tenant's digest for a week is claimed by inserting its ``DigestSent``
row (unique per tenant and week) before it is sent, after commit: of two runs at once one inserts and sends, the
other finds the row and sends nothing. An hourly run means a beat that was down on Monday still sends the week's."""

from __future__ import annotations

import logging
from datetime import UTC, date, datetime, timedelta

from celery import shared_task
from django.conf import settings
from django.db import transaction
from django.urls import reverse
from django.utils import timezone
from django.utils.http import urlencode

from portal.events import after_commit
from portal.notify import notify_send
from tenants.access import Actor, ops_role
from tenants.models import Tenant
from tenants.policy import holders

from . import policy, reports, selectors
from .models import DigestSent

logger = logging.getLogger(__name__)


def last_week(now: datetime | None = None) -> date:
    """The Monday (UTC) of the last whole week before ``now``."""
    today = selectors.day_start(now).date()
    return today - timedelta(days=today.weekday() + 7)


def digest_recipients(tenant: Tenant) -> list[str]:
    """Who may read the tenant's metrics (``policy.may_view_metrics``'s holders: its tenant admins), less platform
    ops, with an email address."""
    people = holders(policy.may_view_metrics, tenant).exclude(ops_role()).exclude(email="")
    return sorted(set(people.values_list("email", flat=True)))


def report_link(tenant: Tenant, week: date) -> str:
    """The tenant's report for the week (``PORTAL_BASE_URL`` in front when set)."""
    params = urlencode({"start": week.isoformat(), "end": (week + timedelta(days=6)).isoformat()})
    base = (getattr(settings, "PORTAL_BASE_URL", "") or "").rstrip("/")
    return f"{base}{reverse('tenant-metrics-report', args=(tenant.slug,))}?{params}"


def digest_of(tenant: Tenant, week: date) -> tuple[str, str]:
    """(subject, body): every metric's headline for the tenant in the week starting ``week``."""
    start = datetime(week.year, week.month, week.day, tzinfo=UTC)
    filters = selectors.Filters(start=start, end=start + timedelta(days=7), group_by="project")
    system = Actor.system()
    sections = reports.sections_of(selectors.metrics_for(ops_only=False), lambda m: selectors.query_for(
        actor=system, filters=filters, tenants=[tenant], group_by=selectors.group_for(m, "project")))
    lines = [f"Metrics of {tenant.name} for the week of {week:%d %B %Y} (UTC):", ""]
    for s in sections:
        lines.append(f"- {s.metric.title}: {s.headline}" + (f" ({s.result.note})" if s.result.note else ""))
    if not sections:
        lines.append("No metrics are defined yet.")
    if selectors.seeded_in(selectors.query_for(actor=system, filters=filters, tenants=[tenant])):
        lines += ["", "The week includes seeded demo history."]
    lines += ["", f"The week's report: {report_link(tenant, week)}", ""]
    return f"Weekly metrics of {tenant.name}, week of {week:%d %b %Y}", "\n".join(lines)


def _digest_mail(digest_id: int) -> None:
    digest = DigestSent.objects.select_related("tenant").filter(pk=digest_id).first()
    if digest is None:
        return
    subject, body = digest_of(digest.tenant, digest.week)
    notify_send(subject=subject, body=body, to=digest_recipients(digest.tenant), topic="digest")


def digests_send(*, now: datetime | None = None) -> int:
    """Claim and send last week's digest of every active tenant with an admin to tell; returns how many."""
    week = last_week(now or timezone.now())
    sent = 0
    for tenant in Tenant.objects.filter(status=Tenant.Status.ACTIVE).order_by("pk"):
        recipients = digest_recipients(tenant)
        if not recipients:
            continue  # nobody to tell: not claimed, so an admin added this week still gets it
        with transaction.atomic():
            digest, created = DigestSent.objects.get_or_create(tenant=tenant, week=week,
                                                               defaults={"recipients": len(recipients)})
            if created:
                after_commit(_digest_mail, digest.pk)
                sent += 1
    return sent


@shared_task(name="insights.digests_send")
def digests_send_task() -> int:
    return digests_send()
