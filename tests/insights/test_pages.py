"""The metric pages: ops' overview and detail across tenants, a tenant admin's own slice, who gets a 404 or a 403,
form errors for a bad period or breakdown, the note and the demo-history notice, and the links to them."""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal

import pytest
from django.utils import timezone

from insights.models import QueueSample
from insights.registry import METRICS
from tests.workloads.factories import make_catalogue

from .surfaces import KEY, NOTE
from . import surfaces

pytestmark = [pytest.mark.django_db]
demo_metric = surfaces.demo_metric  # the fixture


def test_ops_overview_groups_metrics_by_family_with_headline_and_chart(as_user, demo_metric) -> None:
    response = as_user("ops").get("/ops/metrics/")
    assert response.status_code == 200
    text = response.content.decode()
    assert 'id="family-scheduling"' in text and f'id="metric-{KEY}"' in text
    assert demo_metric.title in text and demo_metric.definition in text
    assert "1 – 2 across 2 groups" in text  # a count goes without its unit  # globex has 1 project, acme 2
    assert f'data-chart="chart-{KEY}"' in text and f'<script id="chart-{KEY}" type="application/json">' in text
    assert '<a href="/ops/metrics/" aria-current="page">Metrics</a>' in text  # the ops tab


def test_ops_detail_draws_a_chart_and_a_table_of_every_tenant(as_user, demo_metric) -> None:
    response = as_user("ops").get(f"/ops/metrics/{KEY}/", {"preset": "30", "bucket": "week"})
    assert response.status_code == 200
    text = response.content.decode()
    assert 'data-chart="metric-chart"' in text and "Projects (count)" in text
    assert '<th scope="row">acme</th><td class="num">2</td><td class="num">0.500</td>' in text
    assert '<th scope="row">globex</th><td class="num">1</td><td class="num">1</td>' in text
    assert "Over time (per week, by tenant)" in text


def test_ops_compare_or_narrow_by_tenant_and_project(as_user, demo_metric) -> None:
    text = as_user("ops").get(f"/ops/metrics/{KEY}/", {"tenant": "globex"}).content.decode()
    assert '<th scope="row">globex</th>' in text and '<th scope="row">acme</th>' not in text
    text = as_user("ops").get(f"/ops/metrics/{KEY}/", {"group_by": "project", "project": "acme-nlp"}).content.decode()
    assert '<th scope="row">acme-nlp</th>' in text and "acme-vision" not in text.split('id="metric-table"')[1]


def test_the_table_paginates(as_user, demo_metric) -> None:
    from insights import views

    old, views.ROWS_PER_PAGE = views.ROWS_PER_PAGE, 1
    try:
        first = as_user("ops").get(f"/ops/metrics/{KEY}/").content.decode()
        second = as_user("ops").get(f"/ops/metrics/{KEY}/", {"page": "2"}).content.decode()
    finally:
        views.ROWS_PER_PAGE = old
    assert '<th scope="row">acme</th>' in first and '<th scope="row">globex</th>' not in first
    assert '<th scope="row">globex</th>' in second and "Page 2 of 2" in second


def test_tenant_admin_sees_their_own_tenant_only(as_user, demo_metric) -> None:
    response = as_user("alice").get("/tenants/acme/metrics/")
    assert response.status_code == 200
    text = response.content.decode()
    assert demo_metric.title in text and "Acme Research only" in text
    detail = as_user("alice").get(f"/tenants/acme/metrics/{KEY}/").content.decode()
    assert '<th scope="row">acme-vision</th>' in detail and '<th scope="row">acme-nlp</th>' in detail
    assert "globex" not in detail
    by_tenant = as_user("alice").get(f"/tenants/acme/metrics/{KEY}/", {"group_by": "tenant"}).content.decode()
    assert '<th scope="row">acme</th>' in by_tenant and "globex" not in by_tenant
    assert 'name="tenant"' not in by_tenant  # no tenant filter on a tenant's own pages


def test_a_tenant_admin_who_is_a_member_elsewhere_still_sees_only_the_tenant_they_admin(as_user, cast,
                                                                                          demo_metric) -> None:
    from tests.factories import make_member
    from tenants.models import Role

    make_member(cast.alice, cast.globex, Role.MEMBER, cast.llm)
    assert as_user("alice").get("/tenants/globex/metrics/").status_code == 403
    text = as_user("alice").get(f"/tenants/acme/metrics/{KEY}/", {"group_by": "tenant"}).content.decode()
    assert "globex" not in text


@pytest.mark.parametrize("path", ["/tenants/acme/metrics/", f"/tenants/acme/metrics/{KEY}/",
                                  "/tenants/acme/metrics/report/"])
@pytest.mark.parametrize(("who", "status"), [("ops", 200), ("alice", 200), ("bob", 403), ("carol", 403),
                                             ("dave", 403), ("erin", 404), ("frank", 404), ("nobody", 404)])
def test_tenant_pages_who_may_see_them(as_user, demo_metric, path, who, status) -> None:
    assert as_user(who).get(path).status_code == status


@pytest.mark.parametrize("path", ["/ops/metrics/", f"/ops/metrics/{KEY}/", "/ops/metrics/report/"])
@pytest.mark.parametrize("who", ["alice", "bob", "carol", "erin", "nobody"])
def test_ops_pages_do_not_exist_for_others(as_user, demo_metric, path, who) -> None:
    assert as_user(who).get(path).status_code == 404


@pytest.mark.parametrize("path", ["/ops/metrics/", f"/ops/metrics/{KEY}/", "/tenants/acme/metrics/",
                                  "/tenants/acme/metrics/report/"])
def test_anonymous_is_sent_to_sign_in(client, cast, demo_metric, path) -> None:
    response = client.get(path)
    assert response.status_code == 302 and "/login/" in response["Location"]


def test_an_unknown_metric_is_404(as_user, cast) -> None:
    assert as_user("ops").get("/ops/metrics/no-such-metric/").status_code == 404
    assert as_user("alice").get("/tenants/acme/metrics/no-such-metric/").status_code == 404


@pytest.mark.parametrize(("params", "field", "message"), [
    ({"start": "2026-02-10", "end": "2026-02-01"}, "end", "The end must be on or after the first day."),
    ({"start": "2020-01-01", "end": "2026-01-01"}, "end", "The period is at most 400 days."),
    ({"preset": "90", "bucket": "hour"}, "bucket", "Hourly buckets cover at most 31 days"),
    ({"start": "2026-02-10"}, "end", "Give both days, or pick a preset."),
    ({"start": "yesterday", "end": "2026-02-01"}, "start", "Enter a valid date."),
    ({"group_by": "galaxy"}, "group_by", "Select a valid choice."),
    ({"preset": "45"}, "preset", "Select a valid choice."),
    ({"tenant": "no-such-tenant"}, "tenant", "Select a valid choice."),
    ({"group_by": "queue"}, "group_by", "This metric breaks down by tenant, project."),
])
def test_bad_filters_are_form_errors(as_user, demo_metric, params, field, message) -> None:
    response = as_user("ops").get(f"/ops/metrics/{KEY}/", params)
    assert response.status_code == 400
    assert message in response.content.decode()
    assert field in response.context["form"].errors


def test_a_tenant_admin_cannot_name_another_tenants_project(as_user, demo_metric) -> None:
    response = as_user("alice").get(f"/tenants/acme/metrics/{KEY}/", {"project": "globex-llm"})
    assert response.status_code == 400 and "project" in response.context["form"].errors


def test_the_note_and_the_demo_history_notice(as_user, cast, demo_metric) -> None:
    cat = make_catalogue(cast)
    text = as_user("ops").get(f"/ops/metrics/{KEY}/", {"cluster": cat.cluster.name}).content.decode()
    assert NOTE in text and "No rows in this period." in text
    assert "seeded demo history" not in as_user("ops").get("/ops/metrics/").content.decode()
    QueueSample.objects.create(at=timezone.now() - timedelta(hours=1), cluster=cat.cluster, tenant=cast.acme,
                               project=cast.vision, flavor=cat.h100, nominal=Decimal(8), seeded=True)
    assert "includes seeded demo history" in as_user("ops").get("/ops/metrics/").content.decode()
    assert "includes seeded demo history" in as_user("alice").get("/tenants/acme/metrics/").content.decode()
    assert "seeded demo history" not in as_user("erin").get("/tenants/globex/metrics/").content.decode()


def test_links_from_the_tenant_page_and_the_ops_tabs(as_user, cast) -> None:
    assert 'href="/tenants/acme/metrics/"' in as_user("alice").get("/tenants/acme/").content.decode()
    assert 'href="/ops/metrics/"' in as_user("ops").get("/ops/costs/").content.decode()


def test_every_registered_metric_renders_for_ops_and_a_tenant_admin(as_user, cast, demo_metric) -> None:
    make_catalogue(cast)
    assert as_user("ops").get("/ops/metrics/").status_code == 200
    assert as_user("alice").get("/tenants/acme/metrics/").status_code == 200
    for key in METRICS:
        for params in ({}, {"bucket": "hour", "preset": "7"}, {"bucket": "week", "preset": "90"}):
            assert as_user("ops").get(f"/ops/metrics/{key}/", params).status_code == 200, (key, params)
            # A cluster-wide metric is not on a tenant's pages (tests/insights/test_ops_only.py).
            expected = 404 if METRICS[key].ops_only else 200
            assert as_user("alice").get(f"/tenants/acme/metrics/{key}/", params).status_code == expected, (key, params)
