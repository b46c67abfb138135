"""The demo's history feeds every metric: after ``manage.py seed_demo`` (the sandbox not running), each registered
metric's default period (the last 7 days) has table rows and chart points for platform ops, and each metric a tenant
admin sees has them for Acme (``gang-start``: the demo cluster runs architecture E, Volcano gangs, since a switch a few
days ago; ``reclaim-latency``: Acme's projects reclaim H100s lent to each other). The one documented exception says why in
its note:

* ``pending-now``: the table is what waits *now* (the chart is the sampled history), and without the sandbox
  nothing was materialized to wait.
"""

from __future__ import annotations

import io
from datetime import timedelta

import pytest
from django.contrib.auth import get_user_model
from django.core.management import call_command
from django.db.models import F

from insights.demo import OVERSIZED_KEY
from insights.models import MeasuredSample
from insights.registry import METRICS
from insights.selectors import Filters, group_for, last_days, metric_tenants_for, query_for
from quotas.models import Flavor
from tenants.access import Actor
from workloads.models import RequestState, WorkloadRequest

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


def test_demo_oversized_job_suggests_a_mig_slice_and_clone_prefills_it(demo, client) -> None:
    """The demo's rightsizing story: a memory-light training job on a whole H100 (measured peak ~8 GiB, SM ~11 %)."""
    req = WorkloadRequest.objects.get(idempotency_key=OVERSIZED_KEY)
    assert (req.flavor.kind, req.gpus, req.state) == (Flavor.Kind.WHOLE, 1, RequestState.SUCCEEDED)
    assert MeasuredSample.objects.filter(request=req, seeded=True).count() == 72  # six hours of 5-minute slots
    client.force_login(req.requested_by)
    response = client.get(f"/requests/{req.pk}/")
    page = response.content.decode()
    assert response.status_code == 200
    assert "peak 8.2 GiB of 80 GiB GPU memory, SM active 11 %" in page, page[page.find("Measured use") - 50:][:600]
    assert "a MIG slice 1g.10gb" in page and "Clone with the suggestion" in page
    assert f"clone={req.pk}&amp;suggest=1" in page
    form = client.get(f"/requests/new/?template={req.template.slug}&project={req.project.slug}&clone={req.pk}&suggest=1")
    assert form.status_code == 200
    mig = Flavor.objects.get(pk=int(form.context["form"].initial["flavor"]))
    assert (mig.kind, mig.mig_profile) == (Flavor.Kind.MIG, "1g.10gb") and form.context["form"].initial["gpus"] == 1
    # every seeded run has measured samples, and the demo's notebooks were mostly measured idle
    assert not WorkloadRequest.objects.filter(seeded=True).exclude(
        pk__in=MeasuredSample.objects.filter(seeded=True).values("request_id")).filter(finished_at__gt=F("started_at") + timedelta(minutes=10)).exists()
    assert MeasuredSample.objects.filter(seeded=True, util_avg__lt=5).exists()
