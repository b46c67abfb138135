"""Telling tenants what a MIG change does to their quota (docs/mig-changes.md, "Tenants are told").

A change whose plan cuts a tenant's quota (``impact["quotas"]["changes"]``, the rows the approver saw) is told to
that tenant's admins twice: when it is approved (what will be cut, and when) and when the cut is applied (the
``quotas`` step). Their quota pages show it meanwhile and for two weeks after (``quota_notices``, through the
``portal.extensions.quota_notices`` slot, since quotas cannot import this app). Each tenant hears only of its own
rows: the other tenants' are 404s to it everywhere else (docs/security.md)."""

from __future__ import annotations

from collections import defaultdict
from datetime import datetime, timedelta
from typing import Any

from django.core.cache import cache
from django.db.models import Q
from django.utils import timezone

from portal.cache import read_forget, read_with_versions
from portal.notify import notify_send, portal_link
from tenants.access import ops_role
from tenants.models import Tenant
from tenants.policy import holders, may_change_tenant

from .models import MigChange

S = MigChange.Status
SHOWN_AFTER = timedelta(days=14)  # an applied cut stays on the quota pages this long


def _cuts(change: MigChange) -> list[dict[str, Any]]:
    return list(((change.impact or {}).get("quotas") or {}).get("changes") or [])


def cuts_by_tenant(change: MigChange) -> dict[str, list[dict[str, Any]]]:
    """The change's planned quota cuts, per tenant slug."""
    out: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for row in _cuts(change):
        if row.get("tenant"):
            out[row["tenant"]].append(row)
    return dict(out)


def _fmt(value: Any) -> str:
    from portal.quantities import fmt

    return fmt(value)


def _line(row: dict[str, Any]) -> str:
    from portal.quantities import resource_unit

    who = f"project {row['project']}" if row.get("project") else "the tenant"
    unit = resource_unit(row["resource"])
    return (f"{who}: {row['flavor']} {row['resource']} {_fmt(row['nominal'])} → {_fmt(row['new_nominal'])}"
            + ("" if unit == "count" else f" ({unit})"))


def _sentence(change: MigChange, rows: list[dict[str, Any]]) -> str:
    what = "; ".join(_line(r) for r in rows)
    where = f"MIG change #{change.pk} of pool {change.pool_name} ({change.from_layout} → {change.to_layout})"
    if change.status == S.SUCCEEDED:
        when = f"{change.finished_at:%Y-%m-%d %H:%M} UTC" if change.finished_at else "recently"
        return f"{where} cut this quota on {when}: {what}."
    return (f"{where} is {change.get_status_display().lower()}, window from {change.window_start:%Y-%m-%d %H:%M} UTC: "
            f"it will cut this quota: {what}.")


def quota_notices(*, tenant: Any, project: Any = None, now: datetime | None = None) -> list[str]:
    """(``portal.extensions.quota_notices``) Sentences for the quota page of ``tenant`` (all its rows) or of
    ``project`` (that project's rows): approved or running changes that will cut its quota, and those that cut it
    within the last two weeks."""
    now = now or timezone.now()
    changes = [c for c in _cutting_changes(now)
               if c.status != S.SUCCEEDED or (c.finished_at and c.finished_at >= now - SHOWN_AFTER)]
    out = []
    for change in changes:
        rows = cuts_by_tenant(change).get(tenant.slug, [])
        if project is not None:
            rows = [r for r in rows if r.get("project") == project.slug]
        if rows:
            out.append(_sentence(change, rows))
    return out


CACHE_KEY = "maintenance:quota-cutting-changes"
CACHE_SECONDS = 300


def _cutting_changes(now: datetime) -> list[MigChange]:
    """The changes the quota pages may name (approved, running, or succeeded within ``SHOWN_AFTER``), kept in the
    shared cache: the quota pages are among the most opened, and these rarely change. Every status move of a change
    forgets the list (``states.move``). Read with the request's cache versions (``portal.cache.read_with_versions``:
    no round trip of its own)."""
    found = read_with_versions(CACHE_KEY)
    if found is None:
        found = list(MigChange.objects.filter(Q(status__in=[S.APPROVED, S.RUNNING])
                                              | Q(status=S.SUCCEEDED, finished_at__gte=now - SHOWN_AFTER))
                     .order_by("-window_start", "-pk"))
        cache.set(CACHE_KEY, found, CACHE_SECONDS)
        read_forget(CACHE_KEY)
    return found


def cutting_changes_forget() -> None:
    cache.delete(CACHE_KEY)
    read_forget(CACHE_KEY)


def _admin_emails(tenant_slugs: list[str]) -> dict[str, list[str]]:
    """Per tenant, the emails of who may split its quota (``tenants.may_change_tenant``'s holders), less ops."""
    out: dict[str, list[str]] = {}
    for tenant in Tenant.objects.filter(slug__in=tenant_slugs):
        people = holders(may_change_tenant, tenant).exclude(ops_role()).exclude(email="")
        out[tenant.slug] = sorted(set(people.values_list("email", flat=True)))
    return out


def tell_tenants(change_id: int, *, applied: bool) -> int:
    """Email the admins of each tenant whose quota the change cuts (their rows only): it will (approved) or did
    (``applied``) cut it. Returns how many tenants were told."""
    change = MigChange.objects.filter(pk=change_id).first()
    if change is None:
        return 0
    by_tenant = cuts_by_tenant(change)
    emails = _admin_emails(sorted(by_tenant))
    names = dict(Tenant.objects.filter(slug__in=sorted(by_tenant)).values_list("slug", "name"))
    for slug, rows in sorted(by_tenant.items()):
        lines = [_line(r) for r in rows]
        if applied:
            subject = f"[GPU portal] Your quota was cut: MIG change #{change.pk} of pool {change.pool_name}"
            head = (f"MIG change #{change.pk} switched pool {change.pool_name} from {change.from_layout} to "
                    f"{change.to_layout}. The capacity it leaves does not hold what {names.get(slug, slug)} was "
                    f"promised, so these quotas were cut:")
        else:
            subject = f"[GPU portal] A MIG change will cut your quota: pool {change.pool_name}"
            head = (f"MIG change #{change.pk}, approved, switches pool {change.pool_name} from {change.from_layout} to "
                    f"{change.to_layout} in a window from {change.window_start:%Y-%m-%d %H:%M} UTC (running work is "
                    f"stopped at {change.deadline:%Y-%m-%d %H:%M} UTC). The new capacity does not hold what "
                    f"{names.get(slug, slug)} is promised, so these quotas will be cut when it is done:")
        body = "\n".join([head, "", *(f"- {line}" for line in lines), "",
                          f"Your quotas: {portal_link(f'/tenants/{slug}/quotas/')}", ""])
        notify_send(subject=subject, body=body, to=emails.get(slug, []), topic="mig change",
                    payload={"event": "mig_change.quota_cut" if applied else "mig_change.quota_cut_planned",
                             "id": change.pk, "tenant": slug, "changes": rows})
    return len(by_tenant)
