"""Cluster-wide metrics (``Metric.ops_only``: pools hold every tenant's work) are platform ops' alone, on every
surface alike: a tenant's overview, detail pages, report (page and CSV), weekly digest and a tenant admin's API
neither list nor compute them (a detail page or API call is a 404, like an unknown metric); ops see them on
``/ops/metrics/`` and through the API."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from insights import digests
from insights.registry import METRICS

pytestmark = [pytest.mark.django_db]
NOW = datetime(2026, 3, 11, 9, 30, tzinfo=UTC)


def ops_only_metrics() -> list:
    found = [m for m in METRICS.values() if m.ops_only]
    assert {"overcommit", "gpu-allocation", "idle-allocated", "mig-fragmentation"} <= {m.key for m in found}
    return found


def tenant_metrics() -> list:
    return [m for m in METRICS.values() if not m.ops_only]


@pytest.mark.parametrize("who", ["alice", "ops"])
def test_a_tenants_pages_leave_out_the_cluster_wide_metrics(client, cast, who) -> None:
    """Also for ops looking at one tenant: its pages are that tenant's slice, pools are on /ops/metrics/."""
    client.force_login(getattr(cast, who))
    overview = client.get("/tenants/acme/metrics/").content.decode()
    report = client.get("/tenants/acme/metrics/report/").content.decode()
    csv = client.get("/tenants/acme/metrics/report/", {"format": "csv"}).content.decode()
    for metric in ops_only_metrics():
        assert f"/tenants/acme/metrics/{metric.key}/" not in overview
        assert metric.title not in overview and metric.title not in report
        assert f"metric,{metric.key}\n" not in csv
        assert client.get(f"/tenants/acme/metrics/{metric.key}/").status_code == 404
    for metric in tenant_metrics():
        assert f"/tenants/acme/metrics/{metric.key}/" in overview
        assert f"metric,{metric.key}\n" in csv
        assert client.get(f"/tenants/acme/metrics/{metric.key}/").status_code == 200
    assert "Efficiency" not in overview  # a family with only cluster-wide metrics has no heading


def test_ops_see_them_on_the_platform_pages(client, cast) -> None:
    client.force_login(cast.ops)
    overview = client.get("/ops/metrics/").content.decode()
    csv = client.get("/ops/metrics/report/", {"format": "csv"}).content.decode()
    for metric in ops_only_metrics():
        assert f"/ops/metrics/{metric.key}/" in overview and f"metric,{metric.key}\n" in csv
        assert client.get(f"/ops/metrics/{metric.key}/").status_code == 200


def test_the_api_lists_and_answers_them_for_ops_only(api, cast) -> None:
    def keys(who: str) -> set[str]:
        body = api(who).get("/api/v1/metrics/", {"page_size": 500}).json()
        return {m["key"] for m in body["results"]}

    ops_keys = {m.key for m in ops_only_metrics()}
    assert ops_keys <= keys("ops")
    for who in ("alice", "erin"):
        assert keys(who) == {m.key for m in tenant_metrics()}
        for key in ops_keys:
            response = api(who).get(f"/api/v1/metrics/{key}/")
            assert response.status_code == 404 and response.json()["error"] == "not_found"
            assert api(who).get(f"/api/v1/metrics/{key}/", {"tenant": "acme"}).status_code == 404
    for key in ops_keys:
        assert api("ops").get(f"/api/v1/metrics/{key}/").status_code == 200


def test_the_digest_leaves_them_out(cast) -> None:
    from tenants.models import Tenant

    _subject, body = digests.digest_of(Tenant.objects.get(slug="acme"), digests.last_week(NOW))
    for metric in ops_only_metrics():
        assert metric.title not in body
    for metric in tenant_metrics():
        assert f"- {metric.title}:" in body


def test_headlines_are_readable() -> None:
    """Large figures lose their decimals and gain separators; one request is singular; counts go without a unit."""
    from decimal import Decimal

    from insights.presentation import headline
    from insights.registry import Result, Row

    def one(*values, unit: str) -> str:
        rows = [Row(group=f"g{i}", group_id=i, values={"v": v}) for i, v in enumerate(values)]
        return headline(Result(rows=rows, chart_value="v", columns={"v": ("V", unit)}))

    assert one(326.53, 1484.62, unit="minutes") == "327 – 1,485 minutes across 2 groups"
    assert one(71.583, 12.26, unit="GPU-hours") == "12.3 – 71.6 GPU-hours across 2 groups"
    assert one(Decimal("3.91"), unit="EUR") == "3.91 EUR"
    assert one(0.525, unit="x") == "0.525 x"
    assert one(1, unit="requests") == "1 request"
    assert one(3, 7, unit="count") == "3 – 7 across 2 groups"
    assert one(None, unit="%") == "—"
