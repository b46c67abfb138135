"""The demo's history feeds every metric: after ``manage.py seed_demo`` (the sandbox not running), each registered
metric's default period (the last 7 days) has table rows and chart points for platform ops, and each metric a tenant
admin sees has them for Acme (``gang-start``: the demo cluster ran architecture E, Volcano gangs, until a few days
ago; ``reclaim-latency``: Acme's projects reclaim H100s lent to each other). The one documented exception says why in
its note:

* ``pending-now``: the table is what waits *now* (the chart is the sampled history), and without the sandbox
  nothing was materialized to wait.
"""

from __future__ import annotations

import io

import pytest
from django.contrib.auth import get_user_model
from django.core.management import call_command

from insights.registry import METRICS
from insights.selectors import Filters, group_for, last_days, metric_tenants_for, query_for
from tenants.access import Actor

pytestmark = [pytest.mark.django_db, pytest.mark.timeout(180)]
EMPTY_ROWS_NOTES = {"pending-now": "The table is now"}


@pytest.fixture
def demo(settings, tmp_path) -> None:
    settings.KUBECONFIG = str(tmp_path / "no-sandbox.kubeconfig")
    call_command("seed_demo", stdout=io.StringIO())


def _results(username: str, wanted_group: str):
    actor = Actor(user=get_user_model().objects.get(username=username))
    start, end = last_days()
    tenants = None if username == "ops" else list(metric_tenants_for(actor=actor))
    for metric in METRICS.values():
        if metric.ops_only and tenants is not None:
            continue
        filters = Filters(start=start, end=end, group_by=group_for(metric, wanted_group))
        yield metric, metric.compute(query_for(actor=actor, filters=filters, tenants=tenants))


def _check(metric, result) -> None:
    assert result.points, (metric.key, result.note)
    assert any(p.value is not None for p in result.points), metric.key
    if metric.key in EMPTY_ROWS_NOTES and not result.rows:
        assert EMPTY_ROWS_NOTES[metric.key] in result.note, (metric.key, result.note)
        return
    assert result.rows, (metric.key, result.note)
    assert any(r.values.get(result.chart_value) is not None for r in result.rows), metric.key


def test_every_metric_has_rows_and_points_for_ops(demo) -> None:
    seen = set()
    for metric, result in _results("ops", "tenant"):
        seen.add(metric.key)
        _check(metric, result)
    assert seen == set(METRICS)


def test_every_tenant_metric_has_rows_and_points_for_acme_admin(demo) -> None:
    keys = []
    for metric, result in _results("alice", "project"):
        keys.append(metric.key)
        _check(metric, result)
        labels = {r.group for r in result.rows} | {p.series for p in result.points}
        assert labels and all(label.startswith("acme") for label in labels), (metric.key, labels)
    assert {"quota-fulfilment", "gang-start", "reclaim-latency"} <= set(keys) and "overcommit" not in keys
