"""A metric with a known answer for the surface tests (pages, API, report, digest), registered through the public
``insights.registry.register`` and removed after each test. It honours the query like a real metric: it sees only
the tenants and projects of ``query.scope`` and its tenant/project filters.

Rows: per tenant (or per project with ``group_by=project``) the number of projects in view, and ``share`` = 1/n.
A cluster filter answers no rows and the note "not defined: no pending work" (how real metrics say it)."""

from __future__ import annotations

from decimal import Decimal

import pytest

from insights.registry import METRICS, Metric, Point, Query, Result, Row, register
from tenants.models import Project, Tenant

KEY = "test-projects"
NOTE = "not defined: no pending work"


def compute(query: Query) -> Result:
    columns = {"projects": ("Projects", "count"), "share": ("Share", "")}
    if query.cluster_id is not None:
        return Result(chart_value="projects", columns=columns, note=NOTE)
    projects = Project.objects.filter(query.scope.in_projects("pk")).select_related("tenant").order_by("slug")
    if query.tenant_id is not None:
        projects = projects.filter(tenant_id=query.tenant_id)
    if query.project_id is not None:
        projects = projects.filter(pk=query.project_id)
    counts: dict[tuple[str, int], int] = {}
    for p in projects:
        group = (p.slug, p.pk) if query.group_by == "project" else (p.tenant.slug, p.tenant_id)
        counts[group] = counts.get(group, 0) + 1
    if query.group_by == "tenant":  # tenants in view with no project count too
        for t in Tenant.objects.filter(query.scope.in_tenants("pk")):
            if query.tenant_id in (None, t.pk):
                counts.setdefault((t.slug, t.pk), 0)
    rows = [Row(group=g, group_id=pk, values={"projects": n, "share": Decimal(1) / n if n else None})
            for (g, pk), n in sorted(counts.items())]
    points = [Point(at=query.start, series=r.group, value=r.values["projects"]) for r in rows]
    return Result(rows=rows, points=points, chart_value="projects", columns=columns)


@pytest.fixture
def demo_metric():
    metric = register(Metric(key=KEY, family="scheduling", title="Projects in view (test)",
                             definition="How many projects each group has (a metric for tests).", compute=compute,
                             groups=("tenant", "project")))
    yield metric
    METRICS.pop(KEY, None)
