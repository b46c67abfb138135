"""The database's side of ``/metrics``: gauges and the queue-wait histogram, read at scrape time.

``portal/prometheus.py`` serves them (``settings.PROMETHEUS_COLLECTORS`` names :class:`DatabaseCollector`). Read
from the database when Prometheus asks, they are one number whichever process answers: no multiprocess sums, and a
restart loses nothing. Five aggregate queries per scrape, each grouped in the database, one read of the cache
(when each status follower last completed a cycle) and, at most once a minute, the budgets' spend (one aggregate
query, kept in the cache). The alerting rules (deploy/kubernetes/base/monitoring/alerts.yaml, docs/operations.md
"Alerts") use these names. Seeded demo history (``seeded=True``) is left out: these are the live system's numbers.

The queue wait (approval to admission) is a histogram over every request the cluster has admitted, computed as
counts per bucket in one query: it only grows, as a Prometheus histogram must, so ``rate()`` and
``histogram_quantile()`` work on it. A request's wait is counted once, from its first admission
(``first_admitted_at``, kept across preemptions; ``admitted_at`` for rows that have only that): a preempted and
requeued request neither drops out while it waits again nor moves to another bucket when it is admitted again.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta

from django.core.cache import cache
from django.db.models import Count, DurationField, ExpressionWrapper, F, Min, Q, Sum
from django.db.models.functions import Coalesce
from django.utils import timezone
from prometheus_client.core import GaugeMetricFamily, HistogramMetricFamily, Metric

from billing.budgets import spends
from billing.models import Budget
from quotas.models import Cluster, Node, Quota
from workloads.models import RequestState, WorkloadRequest
from workloads.status import followed_at

from .rollups import admit_target_minutes

S = RequestState
# Seconds: 10 s … 2 days. A wait beyond the last bucket still counts in +Inf.
QUEUE_WAIT_BUCKETS = (10, 30, 60, 120, 300, 600, 1800, 3600, 7200, 21600, 43200, 86400, 172800)
# Approved, not yet admitted: the portal has handed it (or is handing it) to the cluster, which has not started it.
WAITING = (S.APPROVED, S.QUEUED, S.PREEMPTED)


def _num(value: object) -> float:
    return float(value or 0)


def queue_wait_rows() -> list[dict]:
    """Per cluster and flavor: how many admitted requests waited at most each bucket's seconds, how many in all,
    and the waits' sum. One query; the same on PostgreSQL and SQLite (datetime arithmetic is Django's)."""
    wait = ExpressionWrapper(F("first") - F("approved_at"), output_field=DurationField())
    buckets = {f"le_{i}": Count("pk", filter=Q(first__lte=F("approved_at") + timedelta(seconds=b)))
               for i, b in enumerate(QUEUE_WAIT_BUCKETS)}
    return list(
        WorkloadRequest.objects.filter(seeded=False, approved_at__isnull=False)
        .annotate(first=Coalesce("first_admitted_at", "admitted_at")).filter(first__isnull=False)
        .values("cluster__name", "flavor__name")
        .annotate(total=Count("pk"), wait_sum=Sum(wait), **buckets)
        .order_by("cluster__name", "flavor__name")
    )


def queue_wait_metric() -> HistogramMetricFamily:
    family = HistogramMetricFamily(
        "gpuportal_queue_wait_seconds", "Time from approval to the cluster's first admission of requests, by "
        "cluster and flavor (every admitted request once; seeded demo history left out).", labels=["cluster", "flavor"])
    for row in queue_wait_rows():
        buckets = [(str(float(b)), row[f"le_{i}"]) for i, b in enumerate(QUEUE_WAIT_BUCKETS)]
        buckets.append(("+Inf", row["total"]))
        total = row["wait_sum"]
        family.add_metric([row["cluster__name"], row["flavor__name"]], buckets,
                          sum_value=max(total.total_seconds(), 0.0) if total is not None else 0.0)
    return family


def request_metrics() -> list[GaugeMetricFamily]:
    now = timezone.now()
    pending = GaugeMetricFamily("gpuportal_requests_pending", "Approved requests the cluster has not started yet "
                                "(approved, queued, preempted), by cluster and flavor.", labels=["cluster", "flavor"])
    oldest = GaugeMetricFamily("gpuportal_requests_pending_oldest_seconds", "How long the oldest of them has waited "
                               "since its approval.", labels=["cluster", "flavor"])
    awaiting = GaugeMetricFamily("gpuportal_requests_awaiting_approval", "Requests waiting for an approver.",
                                 labels=["cluster", "flavor"])
    running = GaugeMetricFamily("gpuportal_requests_running", "Running requests.", labels=["cluster", "flavor"])
    stuck = GaugeMetricFamily("gpuportal_materialize_oldest_seconds", "How long the oldest request still approved "
                              "and not yet applied to the cluster (state approved) has waited since its approval, by "
                              "cluster (absent: none).", labels=["cluster"])
    rows = (
        WorkloadRequest.objects.filter(seeded=False, state__in=[*WAITING, S.PENDING_APPROVAL, S.RUNNING])
        .values("cluster__name", "flavor__name", "state")
        .annotate(n=Count("pk"), since=Min("approved_at"))
        .order_by("cluster__name", "flavor__name", "state")
    )
    waiting: dict[tuple[str, str], list] = {}
    approved: dict[str, object] = {}  # cluster -> the oldest approval of a request not applied yet
    for row in rows:
        labels = (row["cluster__name"], row["flavor__name"])
        if row["state"] == S.APPROVED and row["since"] is not None:
            have = approved.get(labels[0])
            approved[labels[0]] = row["since"] if have is None or row["since"] < have else have
        if row["state"] in WAITING:
            entry = waiting.setdefault(labels, [0, None])
            entry[0] += row["n"]
            if row["since"] is not None and (entry[1] is None or row["since"] < entry[1]):
                entry[1] = row["since"]
        elif row["state"] == S.PENDING_APPROVAL:
            awaiting.add_metric(list(labels), row["n"])
        else:
            running.add_metric(list(labels), row["n"])
    for labels, (n, since) in sorted(waiting.items()):
        pending.add_metric(list(labels), n)
        oldest.add_metric(list(labels), max((now - since).total_seconds(), 0.0) if since else 0.0)
    for cluster, since in sorted(approved.items()):
        stuck.add_metric([cluster], max((now - since).total_seconds(), 0.0))
    return [pending, oldest, awaiting, running, stuck]


def quota_metrics() -> list[GaugeMetricFamily]:
    names = ("cluster", "flavor", "resource", "tenant", "project")
    families = {
        "nominal": GaugeMetricFamily("gpuportal_quota_nominal", "Nominal quota (promised), in the resource's unit; "
                                     "project empty: the tenant's.", labels=list(names)),
        "used": GaugeMetricFamily("gpuportal_quota_used", "Quota in use (admitted), as last read from the cluster.",
                                  labels=list(names)),
        "borrowed": GaugeMetricFamily("gpuportal_quota_borrowed", "In use beyond nominal, borrowed from the cohort.",
                                      labels=list(names)),
        "borrowing_limit": GaugeMetricFamily("gpuportal_quota_borrowing_limit", "How much more than nominal may be "
                                             "borrowed (absent: no limit).", labels=list(names)),
    }
    rows = (Quota.objects.values_list("flavor__cluster__name", "flavor__name", "resource", "tenant__slug",
                                      "project__slug", "nominal", "used", "borrowed", "borrowing_limit")
            .order_by("flavor__cluster__name", "flavor__name", "resource", "tenant__slug", "project__slug"))
    for cluster, flavor, resource, tenant, project, nominal, used, borrowed, limit in rows:
        labels = [cluster, flavor, resource, tenant, project or ""]
        families["nominal"].add_metric(labels, _num(nominal))
        families["used"].add_metric(labels, _num(used))
        families["borrowed"].add_metric(labels, _num(borrowed))
        if limit is not None:
            families["borrowing_limit"].add_metric(labels, _num(limit))
    return list(families.values())


def cluster_metrics() -> list[GaugeMetricFamily]:
    healthy = GaugeMetricFamily("gpuportal_cluster_healthy", "1 when the last contact with the cluster worked, 0 when "
                                "it failed, -1 not yet known.", labels=["cluster"])
    seen = GaugeMetricFamily("gpuportal_cluster_last_seen_seconds", "Seconds since the cluster last answered the "
                             "portal (absent: never).", labels=["cluster"])
    lag = GaugeMetricFamily("gpuportal_follower_lag_seconds", "Seconds since the cluster's status follower last "
                            "completed a cycle (absent: not followed since the cache was emptied).", labels=["cluster"])
    now = timezone.now()
    clusters = list(Cluster.objects.values_list("pk", "name", "health", "last_seen_at").order_by("name"))
    cycled = followed_at([pk for pk, *_ in clusters])
    for pk, name, health, last_seen in clusters:
        healthy.add_metric([name], {"healthy": 1, "unhealthy": 0}.get(health, -1))
        if last_seen is not None:
            seen.add_metric([name], max((now - last_seen).total_seconds(), 0.0))
        if pk in cycled:
            lag.add_metric([name], max(now.timestamp() - cycled[pk], 0.0))
    nodes = GaugeMetricFamily("gpuportal_nodes", "Nodes present in the cluster, by pool and readiness.",
                              labels=["cluster", "pool", "ready"])
    rows = (Node.objects.filter(present=True).values("cluster__name", "pool__name", "ready").annotate(n=Count("pk"))
            .order_by("cluster__name", "pool__name", "ready"))
    for row in rows:
        nodes.add_metric([row["cluster__name"], row["pool__name"] or "", "true" if row["ready"] else "false"], row["n"])
    return [healthy, seen, lag, nodes]


BUDGETS_KEY = "insights:prometheus:budgets"
BUDGETS_SECONDS = 60  # a month's spend moves slowly: rated at most once a minute, whatever the scrape interval


def budget_metrics() -> list[GaugeMetricFamily]:
    """This month's spend of each budget over its amount (``billing.budgets.spends``: one aggregate query), kept in
    the cache for ``BUDGETS_SECONDS``."""
    ratios = cache.get(BUDGETS_KEY)
    if ratios is None:
        statuses = spends(list(Budget.objects.select_related("tenant", "project").order_by("tenant__slug", "project__slug")))
        ratios = [(st.budget.tenant.slug, st.budget.project.slug if st.budget.project_id else "",
                   float(st.spent / st.budget.amount)) for st in statuses]
        cache.set(BUDGETS_KEY, ratios, BUDGETS_SECONDS)
    family = GaugeMetricFamily("gpuportal_budget_spent_ratio", "This month's spend over the monthly budget (1: spent), "
                               "by tenant and project (project empty: the tenant's budget).", labels=["tenant", "project"])
    for tenant, project, ratio in ratios:
        family.add_metric([tenant, project], ratio)
    return [family]


def target_metrics() -> list[GaugeMetricFamily]:
    target = GaugeMetricFamily("gpuportal_queue_wait_target_seconds", "The queue wait target: approval to admission "
                               "within INSIGHTS_ADMIT_TARGET_MINUTES (the alert on the wait's P95 compares with it).")
    target.add_metric([], admit_target_minutes() * 60.0)
    return [target]


class DatabaseCollector:
    """The collector ``/metrics`` asks at scrape time (a custom collector of the official client)."""

    def collect(self) -> Iterator[Metric]:
        yield queue_wait_metric()
        yield from request_metrics()
        yield from quota_metrics()
        yield from cluster_metrics()
        yield from budget_metrics()
        yield from target_metrics()
