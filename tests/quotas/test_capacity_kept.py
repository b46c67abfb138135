"""The capacity page reads a cluster through kept queries (``quotas.selectors.capacity_*``, ``tenant_promises_first``;
``portal.compiled``, docs/performance.md): once warm, a view compiles no SQL, and it shows what the ORM shows: every
cluster to pick from, the cluster's active flavors in their order, its nodes and pools, and the tenant quotas 25 a
page (the first page kept, the next ones and a filter through the ORM), counted right."""

from __future__ import annotations

import re
from decimal import Decimal

import pytest
from django.db.models.sql.compiler import SQLCompiler

from quotas.models import Flavor, Quota
from tenants.models import Tenant

from .factories import GPU, make_cluster, make_node

pytestmark = [pytest.mark.django_db]


def text(response) -> str:
    assert response.status_code == 200
    return response.content.decode()


def _compiled_sql(monkeypatch, client, path: str) -> list[str]:
    for _ in range(2):
        text(client.get(path))
    built: list[str] = []
    real = SQLCompiler.as_sql

    def spy(self, *args, **kwargs):
        sql = real(self, *args, **kwargs)
        built.append(sql[0])
        return sql

    monkeypatch.setattr(SQLCompiler, "as_sql", spy)
    try:
        text(client.get(path))
    finally:
        monkeypatch.undo()
    return built


@pytest.mark.django_db(transaction=True)  # outside a transaction, as a server runs: the badge's count is kept too
def test_capacity_compiles_no_sql_once_warm(as_user, split, monkeypatch) -> None:
    client = as_user("ops")
    assert _compiled_sql(monkeypatch, client, "/ops/capacity/?cluster=gpu-test") == []


def _tenant_rows(body: str) -> list[str]:
    table = body.split('id="promises-h"', 1)[1].split("</table>", 1)[0]
    return re.findall(r'<td data-label="Tenant"><a href="/tenants/([^/]+)/quotas/">', table)


def test_capacity_shows_what_the_orm_reads(as_user, cast, split) -> None:
    make_cluster("other-cluster")
    Flavor.objects.filter(pk=split.h100.pk).update(order=95)  # after cpu (90): the flavors' order is kept
    inactive = Flavor.objects.create(cluster=split.cluster, name="retired", kind="cpu", active=False, order=1)
    make_node(split.cluster, "cpu-extra", labels={}, allocatable={"cpu": "8", "memory": "32Gi"})
    tenants = Tenant.objects.bulk_create([Tenant(name=f"Bulk {i:02d}", slug=f"bulk-{i:02d}") for i in range(26)])
    Quota.objects.bulk_create([Quota(tenant=t, flavor=split.cpu, resource="cpu", nominal=Decimal(1)) for t in tenants])
    client = as_user("ops")
    body = text(client.get("/ops/capacity/?cluster=gpu-test"))
    # Both clusters to pick from, by name; this cluster's active flavors in their order, not the inactive one.
    assert re.findall(r'<option value="([^"]+)"', body.split('id="pick-cluster"', 1)[1].split("</select>", 1)[0]) == [
        "gpu-test", "other-cluster"]
    flavors = body.split('id="flavors-h"', 1)[1].split("</table>", 1)[0]
    shown = re.findall(r'<th scope="row">(?:<a [^>]*>|<span class="muted">)([^<]+)<', flavors)
    assert shown.index("cpu") < shown.index(str(split.h100)) and inactive.name not in shown
    assert "cpu-extra" in body and "gpu-h100-0" in body
    # 28 tenant rows (acme, globex and 26 more), by tenant name: 25 on the first page (kept), 3 on the second.
    first = _tenant_rows(body)
    assert len(first) == 25 and "1–25 of 28" in body
    assert first[:3] == ["acme", "bulk-00", "bulk-01"]
    second = _tenant_rows(text(client.get("/ops/capacity/?cluster=gpu-test&quotas_page=2")))
    assert second == ["bulk-24", "bulk-25", "globex"]
    assert _tenant_rows(text(client.get("/ops/capacity/?cluster=gpu-test&tenant=globex"))) == ["globex"]
    assert GPU in body
