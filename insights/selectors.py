"""Reads for the metric surfaces (pages, API, report, digest): who may look at which tenants, the ``Query`` a
metric is computed for, the objects its filters name, and whether demo history is in the period
(docs/insights.md, "Pages, API and reports").

A metric's ``Query.scope`` is the asker's scope (``tenants.access.scope_of``), narrowed to the tenants they may see
metrics of: a tenant admin who is also a plain member elsewhere sees only the tenants they administer."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from django.db.models import QuerySet
from django.utils import timezone

from quotas.models import Cluster, Flavor
from quotas.selectors import clusters_for, flavors_for
from tenants.access import Actor, ActorScope, scope_of
from tenants.models import Project, Tenant
from tenants.selectors import admin_tenants_for
from workloads.models import WorkloadRequest

from . import memo, policy
from .models import PoolSample, QueueSample
from .registry import METRICS, Metric, Query

FAMILIES = ("scheduling", "fairness", "efficiency", "cost", "measured")
DEFAULT_DAYS = 7
PRESETS = (7, 30, 90)
MAX_DAYS = 400
MAX_HOURLY_DAYS = 31


@dataclass(frozen=True)
class Filters:
    """Validated filters (``forms.MetricFilterForm`` on pages, ``api.views.MetricQuery`` in the API)."""

    start: datetime
    end: datetime
    group_by: str = "tenant"
    bucket: str = "day"
    cluster: Cluster | None = None
    flavor: Flavor | None = None
    tenant: Tenant | None = None
    project: Project | None = None


def day_start(now: datetime | None = None) -> datetime:
    now = now or timezone.now()
    return now.astimezone(UTC).replace(hour=0, minute=0, second=0, microsecond=0)


def last_days(days: int = DEFAULT_DAYS, now: datetime | None = None) -> tuple[datetime, datetime]:
    """The last ``days`` whole UTC days up to and including today: [today - days + 1, tomorrow)."""
    end = day_start(now) + timedelta(days=1)
    return end - timedelta(days=days), end


def period_problems(start: datetime, end: datetime, bucket: str = "day") -> dict[str, list[str]]:
    """What is wrong with a period, by field: the same sentences on pages and in the API."""
    if end <= start:
        return {"end": ["The end must be after the start."]}
    if end - start > timedelta(days=MAX_DAYS):
        return {"end": [f"The period is at most {MAX_DAYS} days."]}
    if bucket == "hour" and end - start > timedelta(days=MAX_HOURLY_DAYS):
        return {"bucket": [f"Hourly buckets cover at most {MAX_HOURLY_DAYS} days; pick day or week."]}
    return {}


def metrics_for(*, family: str | None = None, ops_only: bool = True) -> list[Metric]:
    """Every registered metric, by family then key (the order of the pages, the API and the report).

    ``ops_only=False``: without the cluster-wide ones (``Metric.ops_only``): what a tenant's pages, its report, its
    digest and a tenant admin's API list. Every surface asks here, so they agree."""
    found = [m for m in METRICS.values() if (family is None or m.family == family) and (ops_only or not m.ops_only)]
    order = {name: i for i, name in enumerate(FAMILIES)}
    # By family, then in the order the family registers them (its own reading order: queue wait first).
    return sorted(found, key=lambda m: (order.get(m.family, len(FAMILIES)), m.family))


def metric_get(key: str, *, ops_only: bool = True) -> Metric | None:
    """The metric ``key``; ``None`` for an unknown one, and with ``ops_only=False`` for a cluster-wide one."""
    metric = METRICS.get(key)
    return metric if metric is not None and (ops_only or not metric.ops_only) else None


def metric_tenants_for(*, actor: Actor) -> QuerySet[Tenant]:
    """The tenants whose metrics ``actor`` may see: every one for ops, else those they administer (no token)."""
    if policy.may_view_all_metrics(actor):
        return Tenant.objects.all()
    return admin_tenants_for(actor=actor)


def metric_projects_for(*, tenants: list[Tenant] | None) -> QuerySet[Project]:
    """The projects a metric filter may name: those of ``tenants`` (``None``: every project, ops)."""
    base = Project.objects.select_related("tenant").order_by("tenant__slug", "slug")
    return base if tenants is None else base.filter(tenant__in=[t.pk for t in tenants])


def metric_clusters_for(*, actor: Actor) -> QuerySet[Cluster]:
    return clusters_for(actor=actor).order_by("name")


def metric_flavors_for(*, actor: Actor) -> QuerySet[Flavor]:
    return flavors_for(actor=actor).order_by("cluster__name", "name")


def metrics_scope(*, actor: Actor, tenants: list[Tenant] | None) -> ActorScope:
    """``actor``'s scope, narrowed to ``tenants`` and their projects (``None``: as it is, for ops)."""
    scope = scope_of(actor)
    if tenants is None:
        return scope
    ids = frozenset(t.pk for t in tenants)

    def narrowed() -> ActorScope:
        projects = frozenset(Project.objects.filter(tenant_id__in=sorted(ids)).values_list("pk", flat=True))
        return ActorScope(visible_projects=projects, visible_tenants=ids, grants=lambda: scope.grants)

    # One per page for an overview or a report (memo.one_page): every metric's query shares it.
    return memo.remembered(("metrics-scope", id(scope), ids), narrowed)


def group_for(metric: Metric, wanted: str) -> str:
    """``wanted`` if the metric breaks down by it, else its first breakdown (the overview and the report)."""
    return wanted if wanted in metric.groups else metric.groups[0]


def query_for(*, actor: Actor, filters: Filters, tenants: list[Tenant] | None, group_by: str | None = None) -> Query:
    """The ``Query`` for ``actor``: ``tenants`` is what they may see (``None``: everything, ops only)."""
    if tenants is None and not policy.may_view_all_metrics(actor):
        tenants = list(metric_tenants_for(actor=actor))
    tenant = filters.tenant or (tenants[0] if tenants is not None and len(tenants) == 1 else None)
    return Query(
        scope=metrics_scope(actor=actor, tenants=tenants), start=filters.start, end=filters.end,
        group_by=group_by or filters.group_by, bucket=filters.bucket,
        cluster_id=filters.cluster.pk if filters.cluster else None,
        flavor_id=filters.flavor.pk if filters.flavor else None,
        tenant_id=tenant.pk if tenant else None,
        project_id=filters.project.pk if filters.project else None,
    )


def seeded_in(query: Query) -> bool:
    """Whether the period holds demo history the metrics read (samples or requests with ``seeded=True``)."""
    scope = query.scope
    queues = QueueSample.objects.filter(seeded=True, at__gte=query.start, at__lt=query.end).filter(scope.in_tenants())
    pools = PoolSample.objects.filter(seeded=True, at__gte=query.start, at__lt=query.end)
    requests = WorkloadRequest.objects.filter(seeded=True, created_at__gte=query.start, created_at__lt=query.end).filter(
        scope.in_projects())
    for name, value in (("cluster_id", query.cluster_id), ("flavor_id", query.flavor_id)):
        if value is not None:
            queues, pools = queues.filter(**{name: value}), pools.filter(**{name: value})
            requests = requests.filter(**{name: value})
    if query.tenant_id is not None:
        queues, requests = queues.filter(tenant_id=query.tenant_id), requests.filter(project__tenant_id=query.tenant_id)
    if query.project_id is not None:
        queues, requests = queues.filter(project_id=query.project_id), requests.filter(project_id=query.project_id)
    return queues.exists() or pools.exists() or requests.exists()
