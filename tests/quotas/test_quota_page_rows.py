"""The quota pages' rows in Jinja2: the tenant quotas page's (templates/jinja2/quotas/_tenant_quota_rows.html) and the
capacity page's (_capacity_rows.html): what each row says, and each table written by one Jinja2 render, whatever the
number of rows (docs/performance.md, the last section)."""

from __future__ import annotations

import re


from quotas import services
from quotas.models import Quota
from tenants.access import Actor
from tenants.models import Tenant
from tenants.services import tenant_update
from tests.factories import make_project

GPU = "nvidia.com/gpu"



def rows(body: str, table: str) -> list[str]:
    section = body.split(f'id="{table}"', 1)[1].split("</table>", 1)[0]
    return re.findall(r"<tr[ >].*?</tr>", section.split("<tbody>", 1)[1], re.S)


def test_every_project_row_and_tenant_row_says_its_figures(as_user, cast, split) -> None:
    ops = cast.actor("ops")
    services.quota_set(actor=ops, project=cast.nlp, flavor=split.h100, resource=GPU, nominal=3, borrowing_limit=1)
    body = as_user("alice").get("/tenants/acme/quotas/").content.decode()
    tenant_rows = rows(body, "tenant-quota-h")
    assert len(tenant_rows) == 1
    assert re.sub(r"\s+", " ", tenant_rows[0]).count("<td>") == 6
    assert ">8<" in tenant_rows[0] and ">7<" in tenant_rows[0] and ">1<" in tenant_rows[0]  # quota, assigned, unassigned
    project_rows = rows(body, "project-quotas-h")
    assert len(project_rows) == 2
    for quota in Quota.objects.filter(tenant=cast.acme, project__isnull=False).select_related("project"):
        row = next(r for r in project_rows if f">{quota.project.name}</a>" in r)
        assert f'href="/projects/{quota.project.slug}/quota/"' in row
        assert f'href="?edit={quota.pk}#set-quota"' in row  # alice may change acme
        assert '<td data-label="Nominal">' + str(int(quota.nominal)) + "</td>" in row
        limit = "no limit" if quota.borrowing_limit is None else str(int(quota.borrowing_limit))
        assert f'<td data-label="Borrowing">{limit}</td>' in row
        assert 'data-label="Cluster confirmed"' in row

    tenant_update(actor=Actor.system(), tenant=cast.acme, status=Tenant.Status.SUSPENDED)
    suspended = as_user("alice").get("/tenants/acme/quotas/").content.decode()
    assert len(rows(suspended, "project-quotas-h")) == 2 and "?edit=" not in suspended  # nothing to change


def test_the_rows_are_one_render_per_table_whatever_their_number(as_user, cast, split, jinja_renders) -> None:
    client = as_user("alice")
    assert client.get("/tenants/acme/quotas/").status_code == 200
    few = list(jinja_renders)
    ops = cast.actor("ops")
    for i in range(6):
        services.quota_set(actor=ops, project=make_project(cast.acme), flavor=split.h100, resource=GPU,
                           nominal=0 if i else 1)
    jinja_renders.clear()
    body = client.get("/tenants/acme/quotas/").content.decode()
    assert len(rows(body, "project-quotas-h")) == 7  # vision and the six new ones
    # The two tables, the quota form (includes/form_fields.html) and the page's partials (the pagination, the "as of"
    # line, the chart), one render each whatever the rows.
    assert jinja_renders == few
    assert few.count("quotas/_tenant_quota_rows.html") == 2 and few.count("includes/form_fields.html") == 1


def test_capacity_rows_say_their_figures_in_one_render_per_table(as_user, cast, split, jinja_renders) -> None:
    from tenants.models import Tenant as TenantModel

    client = as_user("ops")
    assert client.get("/ops/capacity/").status_code == 200
    few = list(jinja_renders)
    assert few == ["quotas/capacity_body.html", "frame.html"]  # the whole body, its two row tables included: one render
    ops = cast.actor("ops")
    for i in range(5):
        tenant = TenantModel.objects.create(name=f"Extra {i}", slug=f"extra-{i}")
        services.quota_set(actor=ops, tenant=tenant, flavor=split.h100, resource=GPU, nominal=0)
    jinja_renders.clear()
    body = client.get("/ops/capacity/").content.decode()
    assert jinja_renders == few
    quota_rows = rows(body, "promises-h")
    assert len(quota_rows) == 7  # acme, globex and the five new tenants
    for quota in Quota.objects.filter(project__isnull=True).select_related("tenant"):
        row = next(r for r in quota_rows if f">{quota.tenant.name}</a>" in r)
        assert f'href="/tenants/{quota.tenant.slug}/quotas/"' in row
        assert f'<td data-label="Nominal">{int(quota.nominal)}</td>' in row
    flavor_rows = rows(body, "flavors-h")
    h100 = next(r for r in flavor_rows if f">{split.h100}</a>" in r)
    assert f'href="/ops/flavors/{split.h100.pk}/"' in h100
    assert "<td>" + "16" + "</td>" in h100 and "<td>" + "12" + "</td>" in h100  # capacity, promised (8 + 4)


def test_a_projects_quota_rows_in_one_render_on_both_pages(as_user, cast, split, jinja_renders) -> None:
    """The project quota page and the project page's quota card write the rows with one template
    (templates/jinja2/quotas/_quota_rows.html), once per table."""
    client = as_user("carol")
    body = client.get("/projects/acme-vision/quota/").content.decode()
    assert jinja_renders.count("quotas/_quota_rows.html") == 1
    [row] = re.findall(r"<tr[ >][^<]*<th scope=\"row\" data-label=\"Flavor\">.*?</tr>", body, re.S)
    assert f">{split.h100}" in row and '<td data-label="Quota" class="quota-nominal">4</td>' in row
    assert '<td data-label="May borrow">no limit</td>' in row
    ops = cast.actor("ops")
    services.quota_set(actor=ops, tenant=cast.acme, flavor=split.cpu, resource="memory", nominal=768)
    services.quota_set(actor=ops, tenant=cast.acme, flavor=split.cpu, resource="cpu", nominal=64)
    services.quota_set(actor=ops, project=cast.vision, flavor=split.cpu, resource="memory", nominal=512, borrowing_limit=8)
    services.quota_set(actor=ops, project=cast.vision, flavor=split.cpu, resource="cpu", nominal=32)
    for path in ("/projects/acme-vision/quota/", "/projects/acme-vision/"):
        jinja_renders.clear()
        body = client.get(path).content.decode()
        assert jinja_renders.count("quotas/_quota_rows.html") == 1, path
        found = re.findall(r"<tr[ >][^<]*<th scope=\"row\" data-label=\"Flavor\">.*?</tr>", body, re.S)
        assert len(found) == 3, path
        memory = next(r for r in found if "<code>memory</code>" in r)
        assert '<td data-label="Quota" class="quota-nominal">512</td>' in memory
        assert '<td data-label="May borrow">8</td>' in memory
