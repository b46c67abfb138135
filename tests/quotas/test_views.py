"""Portal pages for capacity, flavors and quotas: HTTP in; status, body and database state out.

The cast (tests/conftest.py): acme has alice (tenant admin), bob (project admin of acme-vision),
carol (member of acme-vision), dave (viewer of acme-vision); globex has erin (tenant admin) and
frank (member of globex-llm); ops is platform ops; nobody has no role. The fleet
(tests/quotas/factories.py): 16 H100s that count (a third node is NotReady), 56 MIG slices, 40 HAMi slots.
"""

from __future__ import annotations

import html
import json
import re
from datetime import timedelta
from decimal import Decimal

import pytest
from django.urls import reverse
from django.utils import timezone

from quotas import services
from quotas.models import AppliedObject, ArchitectureChange, Cluster, Flavor, Node, Quota, QuotaRequest
from quotas.tasks import architecture_change_apply_task
from tenants.models import AuditEntry, Tenant

from .factories import GPU, MIG_1G, make_fleet, make_node


pytestmark = [pytest.mark.django_db]

HTMX = {"HTTP_HX_REQUEST": "true"}


def text(response) -> str:
    return response.content.decode()


def written() -> tuple[int, ...]:
    return (Cluster.objects.count(), Flavor.objects.count(), Quota.objects.count(), QuotaRequest.objects.count(),
            AuditEntry.objects.count(), list(Quota.objects.order_by("pk").values_list("nominal", flat=True)))


def target(flavor: Flavor, resource: str = GPU) -> str:
    return f"{flavor.pk}|{resource}"


def ask(cast, fleet, amount=2, who="carol"):
    return services.quota_request_create(actor=cast.actor(who), project=cast.vision, flavor=fleet.h100, resource=GPU,
                                         amount=amount, reason="More training runs.")


def vision_h100() -> Decimal:
    return Quota.objects.get(project__slug="acme-vision", flavor__name="h100-80gb", resource=GPU).nominal


# Sign-in and who sees which page ------------------------------------------------------------------


def test_pages_need_sign_in(client, split) -> None:
    for url in ["/ops/capacity/", "/ops/clusters/gpu-test/", "/ops/flavors/", "/tenants/acme/quotas/",
                "/projects/acme-vision/quota/", "/quota-requests/", "/ops/clusters/gpu-test/export.yaml"]:
        response = client.get(url)
        assert response.status_code == 302, url
        assert response["Location"].startswith(reverse("login"))


OPS_URLS = ["/ops/capacity/", "/ops/clusters/gpu-test/objects/", "/ops/flavors/", "/ops/clusters/gpu-test/export.yaml"]


@pytest.mark.parametrize("who", ["alice", "bob", "carol", "erin", "nobody"])
def test_ops_pages_are_404_for_everyone_else(as_user, split, who) -> None:
    client = as_user(who)
    flavor = Flavor.objects.get(name="h100-80gb")
    for url in [*OPS_URLS, "/ops/clusters/gpu-test/", f"/ops/flavors/{flavor.pk}/"]:
        assert client.get(url).status_code == 404, url
    before = written()
    posts = [
        ("/ops/capacity/tenant-quota/?cluster=gpu-test", {"tq-tenant": "acme", "tq-target": target(flavor), "tq-nominal": "9"}),
        ("/ops/flavors/new/", {"flavor-cluster": "gpu-test", "flavor-name": "x", "flavor-kind": "whole"}),
        (f"/ops/flavors/{flavor.pk}/active/", {"active": "false"}),
        ("/ops/clusters/gpu-test/settings/", {"settings-overcommit_percent": "50"}),
        ("/ops/clusters/gpu-test/apply/", {"architecture": "B", "fingerprint": "x"}),
    ]
    for url, data in posts:
        assert client.post(url, data).status_code == 404, url
    assert written() == before


def test_ops_pages_render_for_ops(as_user, split) -> None:
    client = as_user("ops")
    for url in OPS_URLS:
        assert client.get(url).status_code == 200, url
    body = text(client.get("/"))
    assert 'href="/ops/capacity/"' in body and 'href="/quota-requests/"' in body
    assert 'href="/ops/capacity/"' not in text(as_user("alice").get("/"))


# Capacity ----------------------------------------------------------------------------------------


def test_capacity_shows_overcommit_in_red_with_percent_and_flags_nodes(as_user, cast, settings) -> None:
    fleet = make_fleet(overcommit_percent=50)
    ops = cast.actor("ops")
    services.quota_set(actor=ops, tenant=cast.acme, flavor=fleet.h100, resource=GPU, nominal=12)
    services.quota_set(actor=ops, tenant=cast.globex, flavor=fleet.h100, resource=GPU, nominal=8)  # 20 of 16: 4 over
    services.quota_set(actor=ops, project=cast.vision, flavor=fleet.h100, resource=GPU, nominal=6)
    Quota.objects.filter(project=cast.vision, flavor=fleet.h100).update(used=3)
    make_node(fleet.cluster, "gpu-a100-mig-1", labels={"nvidia.com/mig.config": "all-1g.10gb"},
              allocatable={MIG_1G: "56"}, mig_state="pending")
    Node.objects.create(cluster=fleet.cluster, name="gpu-h100-gone", present=False, labels={}, allocatable={})

    response = as_user("ops").get("/ops/capacity/")
    assert response.status_code == 200
    body = text(response)
    assert 'role="alert" id="overcommit"' in body
    assert re.search(r'<strong class="over">4 over \(25\.0%\)</strong>', body)
    assert '<strong class="over">+4 (25.0%)</strong>' in body
    # The chart's data: capacity, promised split at the capacity, the overcommit on top, in use.
    chart = json.loads(re.search(r'<script id="flavor-chart" type="application/json">(.*?)</script>', body, re.S).group(1))
    assert chart["labels"][0] == "h100-80gb (gpu)"
    series = {d["label"]: d["data"][0] for d in chart["datasets"]}
    assert series == {"Capacity": 16.0, "Promised to tenants": 16.0, "Promised over capacity (overcommit)": 4.0, "In use": 3.0}
    assert "OVERCOMMITTED: 4 over capacity (25.0%)" in chart["notes"][0]
    assert 'data-chart="flavor-chart"' in body and 'data-chart="pool-chart"' in body
    assert "/static/vendor/chart.umd.min.js" in body and "/static/js/charts.js" in body
    # Nodes that do not count are shown, flagged.
    assert '<span class="flag flag-notready">NotReady</span>' in body
    assert '<span class="flag flag-vanished">Vanished</span>' in body
    assert "MIG change pending" in body
    assert not re.search(r'(src|href)="(https?:)?//', body)  # no CDN


def test_capacity_lists_filter_and_paginate(as_user, split, django_assert_max_num_queries) -> None:
    for n in range(30):
        make_node(split.cluster, f"cpu-{n:02d}", labels={}, allocatable={"cpu": "8", "memory": "32Gi"})
    client = as_user("ops")
    with django_assert_max_num_queries(40):
        body = text(client.get("/ops/capacity/?cluster=gpu-test"))
    assert "1–25 of 35" in body
    body = text(client.get("/ops/capacity/?cluster=gpu-test&nodes_page=2"))
    assert "26–35 of 35" in body
    body = text(client.get("/ops/capacity/?cluster=gpu-test&state=problem"))
    assert "gpu-h100-2" in body and "cpu-00" not in body and "1–1 of 1" in body
    body = text(client.get("/ops/capacity/?cluster=gpu-test&tenant=globex"))
    assert 'href="/tenants/globex/quotas/"' in body and 'href="/tenants/acme/quotas/"' not in body
    assert client.get("/ops/capacity/?cluster=nope").status_code == 404


def test_capacity_tenant_filter_and_form_take_a_typed_tenant(as_user, split) -> None:
    Tenant.objects.bulk_create([Tenant(name=f"Bulk tenant {i:03d}", slug=f"bulk-{i:03d}") for i in range(40)])
    client = as_user("ops")
    body = text(client.get("/ops/capacity/?cluster=gpu-test"))
    assert "Bulk tenant" not in body  # no option per tenant, in the filter or in the form
    assert re.search(r'<input type="text" name="tenant"[^>]*list="tenant-options"', body)
    assert re.search(r'<input type="text" name="tq-tenant"[^>]*list="tenant-options"', body)
    assert '<datalist id="tenant-options"></datalist>' in body
    body = text(client.get("/ops/capacity/?cluster=gpu-test&tenant=Globex+AI"))  # a name filters as the slug does
    assert 'href="/tenants/globex/quotas/"' in body and 'href="/tenants/acme/quotas/"' not in body
    response = client.post("/ops/capacity/tenant-quota/?cluster=gpu-test",
                           {"tq-tenant": "globex ai", "tq-target": target(split.h100), "tq-nominal": "3"})
    assert response.status_code == 302
    assert Quota.objects.get(tenant__slug="globex", project=None, flavor=split.h100).nominal == 3
    body = text(client.get("/quota-requests/"))
    assert "Bulk tenant" not in body and re.search(r'<input type="text" name="tenant"[^>]*list="tenant-options"', body)


def test_ops_set_a_tenant_quota(as_user, split) -> None:
    client = as_user("ops")
    response = client.post("/ops/capacity/tenant-quota/?cluster=gpu-test",
                           {"tq-tenant": "acme", "tq-target": target(split.h100), "tq-nominal": "10"})
    assert response.status_code == 302 and response["Location"] == "/ops/capacity/?cluster=gpu-test"
    assert Quota.objects.get(tenant__slug="acme", project=None, flavor=split.h100).nominal == 10


@pytest.mark.parametrize(("nominal", "words"), [
    ("13", "tenants of cluster gpu-test would be promised 17 x nvidia.com/gpu in h100-80gb but the cluster has 16 (1 over)"),
    ("3", "projects of acme are promised 4 x nvidia.com/gpu in h100-80gb but the tenant would have 3 (1 over)"),
])
def test_tenant_quota_refusals_say_by_how_much_and_write_nothing(as_user, split, nominal, words) -> None:
    before = written()
    response = as_user("ops").post("/ops/capacity/tenant-quota/?cluster=gpu-test",
                                   {"tq-tenant": "acme", "tq-target": target(split.h100), "tq-nominal": nominal})
    assert response.status_code == 200
    assert f"Not saved: {words}" in text(response)
    assert written() == before


@pytest.mark.parametrize(("data", "field"), [
    ({"tq-nominal": "-1"}, "tq-nominal"),
    ({"tq-nominal": "abc"}, "tq-nominal"),
    ({"tq-nominal": "1.5"}, "tq-nominal"),  # GPUs are whole
    ({"tq-tenant": "nope"}, "tq-tenant"),
    ({"tq-target": "999999|nvidia.com/gpu"}, "tq-target"),
])
def test_tenant_quota_bad_input_gives_field_errors(as_user, split, data, field) -> None:
    before = written()
    body = {"tq-tenant": "acme", "tq-target": target(split.h100), "tq-nominal": "5"} | data
    response = as_user("ops").post("/ops/capacity/tenant-quota/?cluster=gpu-test", body)
    assert response.status_code == 200
    assert f'id="id_{field}_error"' in text(response)
    assert written() == before


# Clusters: settings, plan, export, applied objects -----------------------------------------------


def test_cluster_page_without_a_reachable_cluster_offers_no_apply(as_user, split) -> None:
    body = text(as_user("ops").get("/ops/clusters/gpu-test/"))
    assert "No plan:" in body and "has no kubeconfig" in body
    assert "Apply plan" not in body


def test_cluster_settings_change_and_refusal(as_user, cast, split) -> None:
    client = as_user("ops")
    response = client.post("/ops/clusters/gpu-test/settings/", {"settings-overcommit_percent": "50", "settings-use_mig": "on",
                                                               "settings-use_hami": "on"})
    assert response.status_code == 302
    assert Cluster.objects.get().overcommit_percent == 50
    services.quota_set(actor=cast.actor("ops"), tenant=cast.acme, flavor=split.h100, resource=GPU, nominal=16)  # 20 of 16
    before = written()
    response = client.post("/ops/clusters/gpu-test/settings/", {"settings-overcommit_percent": "0", "settings-use_mig": "on",
                                                               "settings-use_hami": "on"})
    assert response.status_code == 200
    assert "Not saved: tenants of cluster gpu-test are promised 20 x nvidia.com/gpu in h100-80gb but 0% overcommit allows 16 (4 over)" in text(response)
    assert Cluster.objects.get().overcommit_percent == 50 and written() == before
    response = client.post("/ops/clusters/gpu-test/settings/", {"settings-overcommit_percent": "-5"})
    assert 'id="id_settings-overcommit_percent_error"' in text(response)


def test_cluster_settings_set_the_prometheus_cluster_label_value(as_user, split) -> None:
    """One Prometheus over several clusters (docs/measured-use.md): the value of PROMETHEUS_CLUSTER_LABEL on this
    cluster's series, its name when empty; a value too long is a form error and saves nothing."""
    client = as_user("ops")
    assert Cluster.objects.get().prometheus_cluster_value == "gpu-test"
    cluster = Cluster.objects.get()
    keep = {"settings-overcommit_percent": "0"} | {f"settings-{flag}": "on" for flag in ("use_mig", "use_hami")
                                                   if getattr(cluster, flag)}
    response = client.post("/ops/clusters/gpu-test/settings/", keep | {"settings-prometheus_cluster": "east-1"})
    assert response.status_code == 302
    assert Cluster.objects.get().prometheus_cluster_value == "east-1"
    assert AuditEntry.objects.filter(action="cluster.update").latest("pk").after["prometheus_cluster"] == "east-1"
    response = client.post("/ops/clusters/gpu-test/settings/", keep | {"settings-prometheus_cluster": "x" * 64})
    assert 'id="id_settings-prometheus_cluster_error"' in text(response)
    assert Cluster.objects.get().prometheus_cluster == "east-1"
    assert client.post("/ops/clusters/gpu-test/settings/", keep).status_code == 302
    assert Cluster.objects.get().prometheus_cluster_value == "gpu-test"


def test_export_yaml_downloads_cluster_or_tenant(as_user, split) -> None:
    client = as_user("ops")
    response = client.get("/ops/clusters/gpu-test/export.yaml")
    assert response.status_code == 200
    assert response["Content-Type"].startswith("application/yaml")
    assert response["Content-Disposition"] == 'attachment; filename="gpu-test.yaml"'
    whole = response.content.decode()
    assert "kind: ClusterQueue" in whole and "name: acme-vision" in whole and "name: globex-llm" in whole
    response = client.get("/ops/clusters/gpu-test/export.yaml?tenant=acme")
    assert response["Content-Disposition"] == 'attachment; filename="gpu-test-acme.yaml"'
    assert "name: acme-vision" in response.content.decode() and "globex" not in response.content.decode()
    assert client.get("/ops/clusters/gpu-test/export.yaml?tenant=nope").status_code == 404
    assert client.get("/ops/clusters/nope/export.yaml").status_code == 404


def test_applied_objects_show_errors_first_and_filter(as_user, split) -> None:
    now = timezone.now()
    AppliedObject.objects.create(cluster=split.cluster, api_version="kueue.x-k8s.io/v1beta2", kind="ClusterQueue",
                                 name="acme-vision", hash="a" * 64, applied_at=now)
    AppliedObject.objects.create(cluster=split.cluster, api_version="kueue.x-k8s.io/v1beta2", kind="ClusterQueue",
                                 name="globex-llm", error="422 Invalid: spec.resourceGroups[0] bad [fields: spec.resourceGroups]",
                                 error_at=now)
    client = as_user("ops")
    body = text(client.get("/ops/clusters/gpu-test/objects/"))
    assert body.index("globex-llm") < body.index("acme-vision")
    assert "[fields: spec.resourceGroups]" in body and "1 error" in body
    body = text(client.get("/ops/clusters/gpu-test/objects/?errors=true"))
    assert "globex-llm" in body and "ClusterQueue acme-vision" not in body


@pytest.fixture
def sandbox_demo(cast, fresh_sandbox, settings):
    """The demo cluster (architecture B) on a fresh sandbox, nothing applied yet."""
    from quotas.demo import seed_quota_demo

    settings.KUBECONFIG = str(fresh_sandbox.kubeconfig)
    seed_quota_demo(architecture="B", reconcile_now=False)
    return Cluster.objects.get(name="sandbox")


def test_plan_then_explicit_audited_apply(as_user, sandbox_demo) -> None:
    client = as_user("ops")
    body = text(client.get("/ops/clusters/sandbox/"))
    created = int(re.search(r"(\d+) to create", body).group(1))
    assert created > 0 and "0 to delete" in body
    assert '<span class="d-add">+kind: ClusterQueue</span>' in body
    assert "data-confirm=\"Apply this plan to sandbox?" in body
    fingerprint = re.search(r'name="fingerprint" value="([0-9a-f]{64})"', body).group(1)

    # A plan other than the one reviewed is not applied.
    response = client.post("/ops/clusters/sandbox/apply/", {"architecture": "B", "fingerprint": "0" * 64}, follow=True)
    assert "the plan changed since you reviewed it" in text(response)
    assert not AppliedObject.objects.exists() and not AuditEntry.objects.filter(action="cluster.apply").exists()

    response = client.post("/ops/clusters/sandbox/apply/", {"architecture": "B", "fingerprint": fingerprint}, follow=True)
    assert "Applying the plan to sandbox (architecture B)" in text(response) and "Requested" in text(response)
    assert 'hx-get="/ops/clusters/sandbox/change/"' in response.content.decode()  # the page polls the progress
    change = ArchitectureChange.objects.get(cluster=sandbox_demo)
    architecture_change_apply_task.apply(args=[change.pk])  # what the worker does
    progress = text(client.get("/ops/clusters/sandbox/change/"))
    assert "Applied" in progress and f"{created} applied, 0 deleted" in progress
    assert AppliedObject.objects.filter(cluster=sandbox_demo, error="").count() == created
    entry = AuditEntry.objects.get(action="cluster.apply")
    assert entry.actor_label == "ops" and entry.after["create"] == created
    assert "The cluster matches the desired state" in text(client.get("/ops/clusters/sandbox/"))


def test_architecture_change_is_planned_before_it_is_applied(as_user, sandbox_demo) -> None:
    client = as_user("ops")
    body = text(client.get("/ops/clusters/sandbox/?architecture=A"))
    assert "switch to architecture A" in body and "Applying it records the new architecture" in body
    assert Cluster.objects.get(pk=sandbox_demo.pk).architecture == "B"  # looking changes nothing
    body = text(client.get("/ops/clusters/sandbox/?architecture=A&action=create"))
    assert "badge-plan-delete" not in body
    fingerprint = re.search(r'name="fingerprint" value="([0-9a-f]{64})"', body).group(1)
    client.post("/ops/clusters/sandbox/apply/", {"architecture": "A", "fingerprint": fingerprint})
    assert Cluster.objects.get(pk=sandbox_demo.pk).architecture == "B"  # the view only starts it
    architecture_change_apply_task.apply(args=[ArchitectureChange.objects.get(cluster=sandbox_demo).pk])
    assert Cluster.objects.get(pk=sandbox_demo.pk).architecture == "A"
    assert AuditEntry.objects.get(action="cluster.apply").after["architecture"] == "A"


# Flavors -----------------------------------------------------------------------------------------


def test_flavor_create_edit_and_deactivate(as_user, split) -> None:
    client = as_user("ops")
    response = client.post("/ops/flavors/new/", {
        "flavor-cluster": "gpu-test", "flavor-name": "a100-80gb-mig-3g.40gb", "flavor-kind": "mig",
        "flavor-gpu_model": "a100-80gb", "flavor-mig_profile": "3g.40gb", "flavor-hami_memory_mib": "0",
        "flavor-hami_cores_percent": "0", "flavor-order": "25",
        "flavor-node_labels": '{"nvidia.com/mig.config": "all-3g.40gb"}', "flavor-tolerations": "[]", "flavor-taints": "",
    })
    assert response.status_code == 302, text(response)
    flavor = Flavor.objects.get(name="a100-80gb-mig-3g.40gb")
    assert flavor.resource_names == ["nvidia.com/mig-3g.40gb"] and flavor.node_labels == {"nvidia.com/mig.config": "all-3g.40gb"}
    assert "a100-80gb-mig-3g.40gb" in text(client.get("/ops/flavors/?kind=mig"))
    assert "a100-80gb-mig-3g.40gb" not in text(client.get("/ops/flavors/?kind=whole"))

    response = client.post(f"/ops/flavors/{flavor.pk}/", {
        "flavor-display_name": "A100 3g.40gb", "flavor-gpu_model": "a100-80gb", "flavor-mig_profile": "3g.40gb",
        "flavor-hami_memory_mib": "0", "flavor-hami_cores_percent": "0", "flavor-order": "26",
        "flavor-node_labels": "{}", "flavor-name": "renamed",  # fixed fields are ignored
    })
    assert response.status_code == 302
    flavor.refresh_from_db()
    assert (flavor.display_name, flavor.order, flavor.name) == ("A100 3g.40gb", 26, "a100-80gb-mig-3g.40gb")

    client.post(f"/ops/flavors/{flavor.pk}/active/", {"active": "false"})
    flavor.refresh_from_db()
    assert not flavor.active
    assert AuditEntry.objects.filter(action="flavor.deactivate").exists()


@pytest.mark.parametrize(("changes", "field", "words"), [
    ({"flavor-mig_profile": "9g.99gb"}, "flavor-mig_profile", "9g.99gb"),
    ({"flavor-gpu_model": "z900"}, "flavor-gpu_model", "No MIG profile table"),
    ({"flavor-node_labels": "{not json"}, "flavor-node_labels", "Enter a valid JSON"),
    ({"flavor-node_labels": "[1, 2]"}, "flavor-node_labels", "JSON object"),
    ({"flavor-name": "Bad Name"}, "flavor-name", ""),
    ({"flavor-name": "h100-80gb", "flavor-kind": "whole", "flavor-mig_profile": ""}, "flavor-name", "already has a flavor"),
])
def test_flavor_bad_input_gives_field_errors_and_writes_nothing(as_user, split, changes, field, words) -> None:
    before = written()
    data = {"flavor-cluster": "gpu-test", "flavor-name": "a100-80gb-mig-2g.20gb", "flavor-kind": "mig",
            "flavor-gpu_model": "a100-80gb", "flavor-mig_profile": "2g.20gb", "flavor-hami_memory_mib": "0",
            "flavor-hami_cores_percent": "0", "flavor-order": "30"} | changes
    response = as_user("ops").post("/ops/flavors/new/", data)
    assert response.status_code == 200
    body = text(response)
    assert f'id="id_{field}_error"' in body and words in body
    assert written() == before


# Tenant quota split ------------------------------------------------------------------------------


@pytest.mark.parametrize(("who", "status"), [
    ("alice", 200), ("ops", 200), ("bob", 403), ("carol", 403), ("dave", 403), ("erin", 404), ("frank", 404), ("nobody", 404),
])
def test_tenant_quota_page_is_for_tenant_admins(as_user, split, who, status) -> None:
    client = as_user(who)
    assert client.get("/tenants/acme/quotas/").status_code == status
    before = written()
    response = client.post("/tenants/acme/quotas/set/", {"pq-project": "acme-vision", "pq-target": target(split.h100), "pq-nominal": "5"})
    assert response.status_code == (302 if status == 200 else status)
    if status != 200:
        assert written() == before


def test_tenant_quota_page_shows_the_split(as_user, split) -> None:
    body = text(as_user("alice").get("/tenants/acme/quotas/"))
    assert 'aria-current="page">Quotas</a>' in body
    chart = json.loads(re.search(r'<script id="split-chart" type="application/json">(.*?)</script>', body, re.S).group(1))
    assert {d["label"]: d["data"] for d in chart["datasets"]} == {"NLP": [0.0], "Vision": [4.0], "Unassigned": [4.0]}
    assert "globex-llm" not in body and "LLM" not in body  # nothing of the other tenant
    row = Quota.objects.get(project__slug="acme-vision", flavor=split.h100)
    body = text(as_user("alice").get(f"/tenants/acme/quotas/?edit={row.pk}"))
    assert 'value="acme-vision" selected' in body and f'value="{target(split.h100)}" selected' in body


def test_quota_tables_say_the_unit_of_each_resource(as_user, cast, split) -> None:
    """``memory 768`` and ``total-gpumem 92136`` alone say nothing: every Resource cell names its unit."""
    ops = cast.actor("ops")
    services.quota_set(actor=ops, tenant=cast.acme, flavor=split.cpu, resource="memory", nominal=768)
    services.quota_set(actor=ops, tenant=cast.acme, flavor=split.hami, resource="nvidia.com/total-gpumem", nominal=92136)
    services.quota_set(actor=ops, project=cast.vision, flavor=split.cpu, resource="memory", nominal=512)
    memory = '<code>memory</code> <span class="unit muted small">(GiB)</span>'
    gpumem = '<code>nvidia.com/total-gpumem</code> <span class="unit muted small">(MiB of GPU memory)</span>'
    gpumem_gib = '<code>nvidia.com/total-gpumem</code> <span class="unit muted small">(GiB of GPU memory)</span>'
    gpus = '<code>nvidia.com/gpu</code> <span class="unit muted small">(count)</span>'
    tenant_page = text(as_user("alice").get("/tenants/acme/quotas/"))
    for label in (memory, gpumem_gib, gpus):  # tenants and projects read HAMi's GPU memory in GiB (90, not 92136)
        assert label in tenant_page, label
    assert "90 GiB" in tenant_page and "92136" not in tenant_page
    assert memory in text(as_user("carol").get("/projects/acme-vision/quota/"))
    capacity = text(as_user("ops").get("/ops/capacity/"))
    assert memory in capacity and gpumem in capacity
    assert "<code>memory</code></td>" not in tenant_page + capacity  # no bare resource name left


def test_tenant_admin_splits_quota_with_limits(as_user, split) -> None:
    client = as_user("alice")
    response = client.post("/tenants/acme/quotas/set/", {"pq-project": "acme-nlp", "pq-target": target(split.h100),
                                                         "pq-nominal": "3", "pq-borrowing_limit": "2", "pq-lending_limit": ""})
    assert response.status_code == 302
    row = Quota.objects.get(project__slug="acme-nlp", flavor=split.h100)
    assert (row.nominal, row.borrowing_limit, row.lending_limit) == (3, 2, None)
    assert AuditEntry.objects.filter(action="quota.set", project__slug="acme-nlp").exists()


@pytest.mark.parametrize(("data", "where", "words"), [
    ({"pq-nominal": "10"}, "top", "Not saved: projects of acme would be promised 10 x nvidia.com/gpu in h100-80gb but the tenant has 8 (2 over)"),
    ({"pq-nominal": "-1"}, "pq-nominal", ""),
    ({"pq-nominal": "two"}, "pq-nominal", ""),
    ({"pq-nominal": "2", "pq-lending_limit": "3"}, "pq-lending_limit", "cannot lend more than its nominal quota (2)"),
    ({"pq-project": "globex-llm"}, "pq-project", ""),
])
def test_tenant_quota_split_refusals(as_user, split, data, where, words) -> None:
    before = written()
    body = {"pq-project": "acme-vision", "pq-target": target(split.h100), "pq-nominal": "4"} | data
    response = as_user("alice").post("/tenants/acme/quotas/set/", body)
    assert response.status_code == 200
    page = text(response)
    if where == "top":
        assert '<div class="form-errors" role="alert">' in page
    else:
        assert f'id="id_{where}_error"' in page
    assert words in page
    assert written() == before


# Project quota -----------------------------------------------------------------------------------


@pytest.mark.parametrize(("who", "status"), [
    ("carol", 200), ("dave", 200), ("bob", 200), ("alice", 200), ("ops", 200), ("erin", 404), ("frank", 404), ("nobody", 404),
])
def test_project_quota_page_is_for_who_sees_the_project(as_user, split, who, status) -> None:
    assert as_user(who).get("/projects/acme-vision/quota/").status_code == status


def test_project_quota_shows_quota_use_borrowed_free(as_user, split) -> None:
    Quota.objects.filter(project__slug="acme-vision", flavor=split.h100).update(used=5, borrowed=1)
    body = text(as_user("carol").get("/projects/acme-vision/quota/"))
    row = re.search(r'<th scope="row" data-label="Flavor">h100-80gb</th>(.*?)</tr>', body, re.S).group(1)
    cells = re.findall(r"<td[^>]*>(.*?)</td>", row, re.S)
    assert cells[1:6] == ["4", "5", "1", "0", "no limit"]
    chart = json.loads(re.search(r'<script id="usage-chart" type="application/json">(.*?)</script>', body, re.S).group(1))
    assert {d["label"]: d["data"] for d in chart["datasets"]} == {"In use (own quota)": [4.0], "Borrowed": [1.0], "Free": [0.0]}
    assert "Send request" in body
    assert "Send request" not in text(as_user("dave").get("/projects/acme-vision/quota/"))  # viewers cannot ask
    # The project page links the summary too.
    body = text(as_user("carol").get("/projects/acme-vision/"))
    assert 'id="quota-h"' in body and 'href="/projects/acme-vision/quota/"' in body


def test_member_asks_for_more_quota(as_user, split, mailoutbox, django_capture_on_commit_callbacks) -> None:
    client = as_user("carol")
    until = (timezone.now() + timedelta(days=7)).strftime("%Y-%m-%dT%H:%M")
    with django_capture_on_commit_callbacks(execute=True):
        response = client.post("/projects/acme-vision/quota/request/", {
            "qr-target": target(split.h100), "qr-amount": "2", "qr-until": until, "qr-reason": "Paper deadline."})
    assert response.status_code == 302 and response["Location"] == "/projects/acme-vision/quota/"
    request = QuotaRequest.objects.get()
    assert (request.amount, request.requested_by.username, request.approver) == (2, "carol", "project_admin")
    assert request.until is not None
    assert any("bob@example.com" in m.to for m in mailoutbox)
    body = text(client.get("/projects/acme-vision/quota/"))
    assert f'href="/quota-requests/{request.pk}/"' in body and "Pending" in body


@pytest.mark.parametrize(("data", "field"), [
    ({"qr-amount": "0"}, "qr-amount"),
    ({"qr-amount": "-2"}, "qr-amount"),
    ({"qr-amount": "1.5"}, "qr-amount"),
    ({"qr-reason": ""}, "qr-reason"),
    ({"qr-until": "2001-01-01T00:00"}, "qr-until"),
    ({"qr-until": "soon"}, "qr-until"),
    ({"qr-target": "12345|nvidia.com/gpu"}, "qr-target"),
])
def test_quota_request_bad_input_gives_field_errors(as_user, split, data, field) -> None:
    before = written()
    body = {"qr-target": target(split.h100), "qr-amount": "2", "qr-reason": "More runs."} | data
    response = as_user("carol").post("/projects/acme-vision/quota/request/", body)
    assert response.status_code == 200
    assert f'id="id_{field}_error"' in text(response)
    assert written() == before


@pytest.mark.parametrize(("who", "status"), [("dave", 200), ("frank", 404), ("nobody", 404)])
def test_only_members_ask(as_user, split, who, status) -> None:
    before = written()
    response = as_user(who).post("/projects/acme-vision/quota/request/", {
        "qr-target": target(split.h100), "qr-amount": "2", "qr-reason": "More runs."})
    assert response.status_code == status
    if status == 200:
        assert "Your role in this project cannot ask for quota." in text(response)
    assert written() == before


# Quota requests: inbox and decisions -------------------------------------------------------------


def test_inbox_and_list_are_scoped(as_user, cast, split, django_assert_max_num_queries) -> None:
    mine = ask(cast, split)
    services.quota_request_create(actor=cast.actor("frank"), project=cast.llm, flavor=split.h100, resource=GPU, amount=1, reason="Eval.")
    client = as_user("bob")
    with django_assert_max_num_queries(30):
        body = text(client.get("/quota-requests/"))
    inbox = body[body.index('id="inbox"'):body.index('id="all"')]
    assert f'id="request-{mine.pk}"' in inbox and "Approve" in inbox and "More training runs." in inbox
    assert "4 promised, 0 in use" in inbox  # context: the project's quota now
    assert "globex" not in body.lower()

    body = text(as_user("carol").get("/quota-requests/"))
    assert "Nothing waits for your decision." in body and f'href="/quota-requests/{mine.pk}/"' in body
    body = text(as_user("frank").get("/quota-requests/"))
    assert f'href="/quota-requests/{mine.pk}/"' not in body
    assert as_user("frank").get(f"/quota-requests/{mine.pk}/").status_code == 404
    body = text(as_user("carol").get("/quota-requests/?status=approved"))
    assert "No request matches these filters." in body


@pytest.mark.parametrize("zone", ["UTC", "Europe/Berlin"])
def test_cards_write_dates_in_the_portals_zone_and_name_it(as_user, cast, split, settings, zone) -> None:
    from datetime import UTC, datetime
    from zoneinfo import ZoneInfo

    settings.TIME_ZONE = zone
    mine = ask(cast, split)
    QuotaRequest.objects.filter(pk=mine.pk).update(created_at=datetime(2026, 12, 4, 23, 30, tzinfo=UTC))
    body = text(as_user("bob").get("/quota-requests/"))
    card = body[body.index(f'id="request-{mine.pk}"'):]
    local = datetime(2026, 12, 4, 23, 30, tzinfo=UTC).astimezone(ZoneInfo(zone))
    assert f"carol, {local:%Y-%m-%d %H:%M} {zone}</dd>" in card  # Berlin: 2026-12-05 00:30, said so
    assert zone == "UTC" or " UTC" not in card[:card.index("</li>")]


def test_approve_with_comment_raises_the_quota(as_user, cast, split) -> None:
    request = ask(cast, split)
    response = as_user("bob").post(f"/quota-requests/{request.pk}/decide/",
                                   {"decision": "approve", "comment": "Go ahead.", "next": "/quota-requests/"})
    assert response.status_code == 302 and response["Location"] == "/quota-requests/"
    request.refresh_from_db()
    assert (request.status, request.comment, request.decided_by.username) == ("approved", "Go ahead.", "bob")
    assert vision_h100() == 6
    body = text(as_user("carol").get("/projects/acme-vision/quota/"))
    assert '<td data-label="Quota" class="quota-nominal">6</td>' in body and "Go ahead." in body


def test_htmx_decision_answers_with_the_card(as_user, cast, split) -> None:
    request = ask(cast, split)
    response = as_user("alice").post(f"/quota-requests/{request.pk}/decide/", {"decision": "reject", "comment": "Use NLP's."}, **HTMX)
    assert response.status_code == 200
    body = text(response)
    assert f'<li class="card request-card" id="request-{request.pk}"' in body and "<html" not in body
    assert "Rejected" in body and "Use NLP's." in html.unescape(body) and "Use NLP's." not in body and "Approve" not in body
    assert QuotaRequest.objects.get().status == "rejected" and vision_h100() == 4


def test_reject_needs_a_comment_and_changes_nothing(as_user, cast, split) -> None:
    request = ask(cast, split)
    before = written()
    response = as_user("bob").post(f"/quota-requests/{request.pk}/decide/", {"decision": "reject", "comment": ""}, **HTMX)
    assert "Say why, so the requester knows what to do." in text(response)
    assert written() == before and QuotaRequest.objects.get().status == "pending"


@pytest.mark.parametrize(("who", "status"), [("carol", 302), ("dave", 404), ("erin", 404), ("frank", 404)])
def test_who_may_not_decide(as_user, cast, split, who, status) -> None:
    request = ask(cast, split)
    before = written()
    client = as_user(who)
    response = client.post(f"/quota-requests/{request.pk}/decide/", {"decision": "approve", "comment": ""})
    assert response.status_code == status
    if status == 302:  # the requester sees their request, but approving it is refused
        messages = [str(m) for m in client.get("/quota-requests/").context["messages"]]
        assert any("may decide this request" in m for m in messages)
    assert written() == before and QuotaRequest.objects.get().status == "pending"


def test_second_decision_is_refused(as_user, cast, split) -> None:
    request = ask(cast, split)
    as_user("bob").post(f"/quota-requests/{request.pk}/decide/", {"decision": "approve"})
    response = as_user("alice").post(f"/quota-requests/{request.pk}/decide/", {"decision": "approve"}, **HTMX)
    assert "already approved" in text(response)
    assert vision_h100() == 6


def test_requester_withdraws(as_user, cast, split) -> None:
    request = ask(cast, split)
    assert as_user("bob").post(f"/quota-requests/{request.pk}/cancel/").status_code == 302
    assert QuotaRequest.objects.get().status == "pending"  # only the requester
    body = text(as_user("carol").get(f"/quota-requests/{request.pk}/"))
    assert "Withdraw" in body
    response = as_user("carol").post(f"/quota-requests/{request.pk}/cancel/", **HTMX)
    assert "Cancelled" in text(response)
    assert QuotaRequest.objects.get().status == "cancelled"


def test_capacity_page_sync_now_button(cast, client) -> None:
    fleet = make_fleet()
    client.force_login(cast.ops)
    page = client.get(f"/ops/capacity/?cluster={fleet.cluster.name}").content.decode()
    assert f"/ops/clusters/{fleet.cluster.name}/sync/" in page
    response = client.post(f"/ops/clusters/{fleet.cluster.name}/sync/")
    assert response.status_code == 302
    assert AuditEntry.objects.filter(action="cluster.sync").count() == 1
    client.force_login(cast.alice)
    assert client.post(f"/ops/clusters/{fleet.cluster.name}/sync/").status_code == 404


# Registering a cluster (ops) ------------------------------------------------------------------------

KUBECONFIG = """apiVersion: v1
kind: Config
clusters:
- name: lab
  cluster: {server: "https://127.0.0.1:6443"}
contexts: []
users: []
"""


def cluster_form(**overrides: object) -> dict[str, object]:
    data = {"name": "lab-2", "architecture": "C", "use_mig": "on", "overcommit_percent": "10",
            "kubeconfig": KUBECONFIG, "kubeconfig_path": ""}
    data.update(overrides)
    return {f"cluster-{k}": v for k, v in data.items() if v is not None}


def test_ops_registers_a_cluster_with_a_kubeconfig(as_user, cast) -> None:
    from portal.crypto import decrypt

    client = as_user("ops")
    assert "/ops/clusters/new/" in text(client.get("/ops/capacity/"))  # linked from the capacity page
    body = text(client.get("/ops/clusters/new/"))
    assert 'aria-current="page">Register a cluster</a>' in body
    response = client.post("/ops/clusters/new/", cluster_form())
    assert response.status_code == 302 and response["Location"] == "/ops/capacity/?cluster=lab-2"
    cluster = Cluster.objects.get(name="lab-2")
    assert (cluster.architecture, cluster.use_mig, cluster.use_hami, cluster.overcommit_percent) == ("C", True, False, 10)
    assert "clusters:" not in cluster.kubeconfig_encrypted and decrypt(cluster.kubeconfig_encrypted) == KUBECONFIG.strip()
    entry = AuditEntry.objects.get(action="cluster.create")
    assert "127.0.0.1:6443" not in json.dumps(entry.after, default=str)


def test_ops_registers_a_cluster_by_kubeconfig_path(as_user, cast) -> None:
    response = as_user("ops").post("/ops/clusters/new/", cluster_form(
        name="lab-3", architecture="B", use_mig=None, kubeconfig="", kubeconfig_path="/etc/portal/lab-3.yaml"))
    assert response.status_code == 302
    cluster = Cluster.objects.get(name="lab-3")
    assert (cluster.kubeconfig_path, cluster.kubeconfig_encrypted) == ("/etc/portal/lab-3.yaml", "")


@pytest.mark.parametrize(("overrides", "field"), [
    ({"name": "gpu-test"}, "name"),  # taken
    ({"name": "Bad_Name"}, "name"),
    ({"name": "new"}, "name"),
    ({"architecture": "B"}, "use_mig"),  # MIG belongs to C, E, F
    ({"overcommit_percent": "-1"}, "overcommit_percent"),
    ({"kubeconfig": "clusters: [unclosed"}, "kubeconfig"),
    ({"kubeconfig": "apiVersion: v1\nkind: Config\n"}, "kubeconfig"),
    ({"kubeconfig": "", "kubeconfig_path": "relative/kubeconfig"}, "kubeconfig_path"),
    ({"kubeconfig_path": "/etc/portal/x.yaml"}, "kubeconfig_path"),  # both
])
def test_bad_cluster_input_shows_errors_and_writes_nothing(as_user, fleet, overrides, field) -> None:
    before = written()
    response = as_user("ops").post("/ops/clusters/new/", cluster_form(**overrides))
    assert response.status_code == 200 and field in response.context["form"].errors
    assert KUBECONFIG not in text(response)  # write-only: never shown back
    assert written() == before


@pytest.mark.parametrize("who", ["alice", "bob", "nobody"])
def test_cluster_registration_is_404_for_non_ops(as_user, cast, who) -> None:
    client = as_user(who)
    assert client.get("/ops/clusters/new/").status_code == 404
    assert client.post("/ops/clusters/new/", cluster_form()).status_code == 404
    assert not Cluster.objects.filter(name="lab-2").exists()
