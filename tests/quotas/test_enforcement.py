"""What the portal offers must be what the cluster enforces; what it promises, what the cluster confirmed.

* The rule (``capacity.flavor_enforcement``) per architecture, and that it, the queryset filter
  (``selectors.enforced_flavor_q``) and the renderer (``manifests.desired_state``) agree everywhere.
* Under B (whole GPUs only) with MIG and HAMi flavors defined, the ops pages say "offered but not
  enforced", the chart leaves them out, and the quota pages and API do not promise them.
* Each quota figure shows when the cluster last confirmed it, and drift against the live ClusterQueues.
* The demo starts on an architecture that enforces every seeded flavor, and one request really waits.
"""

from __future__ import annotations

import itertools
import json
import re
from decimal import Decimal

import pytest

from quotas import manifests as m
from quotas import services
from quotas.capacity import flavor_enforcement
from quotas.models import Cluster, Flavor, Quota
from quotas.reconcile import reconcile
from quotas.selectors import enforced_flavor_q
from sandbox.testing import kubectl

from .factories import GPU, MIG_1G, make_fleet

pytestmark = pytest.mark.django_db
KINDS = ("whole", "mig", "hami", "cpu")
COMBOS = list(itertools.product("ABCDEF", (False, True), (False, True)))


def text(response) -> str:
    return response.content.decode()


# ----------------------------------------------------------------------------------------- the rule
@pytest.mark.parametrize("arch, use_mig, use_hami, expected", [
    ("A", True, True, {"whole", "cpu"}),
    ("B", True, True, {"whole", "cpu"}),  # the old demo: switches on, architecture B: still whole GPUs only
    ("C", False, False, {"whole", "cpu", "mig"}),
    ("D", False, False, {"whole", "cpu", "hami"}),
    ("E", True, True, {"whole", "cpu", "mig", "hami"}),
    ("E", False, False, {"whole", "cpu"}),
    ("F", True, True, {"whole", "cpu", "mig", "hami"}),
    ("F", True, False, {"whole", "cpu", "mig"}),
])
def test_rule_per_architecture(arch: str, use_mig: bool, use_hami: bool, expected: set[str]) -> None:
    cluster = m.ClusterRow("c", arch, use_mig, use_hami)
    enforced = {k for k in KINDS if flavor_enforcement(cluster, m.FlavorRow(f"f-{k}", k, ())).enforced}
    assert enforced == expected
    for kind in set(KINDS) - expected:
        e = flavor_enforcement(cluster, m.FlavorRow(f"f-{kind}", kind, ()))
        assert e.by == "" and "offered but not enforced" in e.reason and e.remedy in e.reason
        assert ("architecture C" if kind == "mig" else "architecture D") in e.remedy


def test_offline_whole_gpus_under_e_are_volcanos() -> None:
    e = flavor_enforcement(m.ClusterRow("c", "E"), m.FlavorRow("h100-offline", "whole", (), pool_label="offline"))
    assert e.enforced and e.by == "volcano"


def test_rule_filter_and_renderer_agree_everywhere(cast) -> None:
    flavors = []
    for i, (arch, use_mig, use_hami) in enumerate(COMBOS):
        cluster = Cluster.objects.create(name=f"c{i}", architecture=arch, use_mig=use_mig, use_hami=use_hami)
        for kind in KINDS:
            flavors.append(Flavor.objects.create(cluster=cluster, name=f"{kind}-x", kind=kind, mig_profile="1g.10gb"))
        flavors.append(Flavor.objects.create(cluster=cluster, name="whole-off", kind="whole", pool_label="offline"))
        flavors.append(Flavor.objects.create(cluster=cluster, name="whole-gone", kind="whole", active=False))
        # The renderer: a Kueue-enforced flavor has a ResourceFlavor, nothing else has.
        rows = tuple(m.FlavorRow(f.name, f.kind, tuple(f.resource_names), pool_label=f.pool_label)
                     for f in cluster.flavors.filter(active=True))
        rendered = {o["metadata"]["name"] for o in m.desired_state(m.ClusterRow(cluster.name, arch, use_mig, use_hami),
                                                                     m.Snapshot(m.ClusterRow(cluster.name, arch, use_mig, use_hami), rows))
                    if o["kind"] == "ResourceFlavor"}
        by_kueue = {f.name for f in cluster.flavors.filter(active=True) if flavor_enforcement(cluster, f).by == "kueue"}
        assert rendered == by_kueue, (arch, use_mig, use_hami)
    filtered = set(Flavor.objects.filter(enforced_flavor_q()).values_list("pk", flat=True))
    assert filtered == {f.pk for f in flavors if flavor_enforcement(f.cluster, f).enforced}


# ----------------------------------------------------------------------------------------- under B
@pytest.fixture
def on_b(cast):
    """The fleet with MIG and HAMi flavors and quotas for them, on a cluster that runs B (as the old demo did)."""
    fleet = make_fleet()
    ops = cast.actor("ops")
    services.quota_set(actor=ops, tenant=cast.acme, flavor=fleet.h100, resource=GPU, nominal=8)
    services.quota_set(actor=ops, tenant=cast.acme, flavor=fleet.mig, resource=MIG_1G, nominal=16)
    services.quota_set(actor=ops, project=cast.vision, flavor=fleet.h100, resource=GPU, nominal=4)
    services.quota_set(actor=ops, project=cast.vision, flavor=fleet.mig, resource=MIG_1G, nominal=8)
    Cluster.objects.filter(pk=fleet.cluster.pk).update(architecture="B")  # switches stay on: B ignores them
    fleet.cluster.refresh_from_db()
    return fleet


def _chart(body: str, chart_id: str) -> dict:
    found = re.search(rf'<script id="{chart_id}" type="application/json">(.*?)</script>', body, re.S)
    assert found, chart_id
    return json.loads(found.group(1))


def test_capacity_page_says_offered_but_not_enforced_and_does_not_chart_it(as_user, on_b) -> None:
    body = text(as_user("ops").get("/ops/capacity/"))
    banner = body[body.index('id="not-enforced"'):body.index('id="flavors"')]
    assert "a100-80gb-mig-1g.10gb" in banner and "l40s-hami" in banner and "h100-80gb" not in banner
    assert "architecture C" in banner and "architecture D" in banner
    labels = " ".join(_chart(body, "flavor-chart")["labels"])
    assert "h100-80gb" in labels and "mig" not in labels and "hami" not in labels
    row = re.search(rf'<a href="/ops/flavors/{on_b.mig.pk}/">a100-80gb-mig-1g.10gb</a>.*?</tr>', body, re.S).group(0)
    assert "offered but not enforced" in row and "none" not in row.split("<td>")[-1]
    # Ops may not promise it from this page either.
    assert f'value="{on_b.mig.pk}:' not in body.split('id="set-tenant-quota"')[1]


def test_flavor_list_marks_it(as_user, on_b) -> None:
    body = text(as_user("ops").get("/ops/flavors/"))
    row = re.search(r'>a100-80gb-mig-1g.10gb</a>.*?</tr>', body, re.S).group(0)
    assert "Offered but not enforced" in row and "architecture C" in row
    assert "Offered but not enforced" not in re.search(r'>h100-80gb</a>.*?</tr>', body, re.S).group(0)
    detail = text(as_user("ops").get(f"/ops/flavors/{on_b.mig.pk}/"))
    assert "offered but not enforced" in detail


def test_quota_pages_and_api_do_not_promise_it(api, as_user, cast, on_b) -> None:
    body = api("carol").get("/api/v1/projects/acme-vision/quota/").json()
    rows = {r["flavor"]: r for r in body["quotas"]}
    mig = rows["a100-80gb-mig-1g.10gb"]
    assert mig["enforced"] is False and "not enforced" in mig["enforcement_reason"] and Decimal(mig["free"]) == 0
    assert rows["h100-80gb"]["enforced"] is True and rows["h100-80gb"]["enforcement_reason"] == ""
    page = text(as_user("carol").get("/projects/acme-vision/quota/"))
    assert "Not usable today" in page and "not enforced: no request can use it" in page
    labels = " ".join(_chart(page, "usage-chart")["labels"])
    assert "mig" not in labels and "h100-80gb" in labels
    assert "a100-80gb-mig-1g.10gb" not in page.split('id="request"')[1]  # cannot even ask for more of it
    tenant = text(as_user("alice").get("/tenants/acme/quotas/"))
    assert "Not enforced on the cluster" in tenant
    assert "mig" not in " ".join(_chart(tenant, "split-chart")["labels"])
    assert f'value="{on_b.mig.pk}:' not in tenant.split('id="set-quota"')[1]


# ----------------------------------------------------------------------------------------- confirmed, drift
@pytest.fixture
def demo(cast, fresh_sandbox, settings):
    from quotas.demo import seed_quota_demo

    settings.KUBECONFIG = str(fresh_sandbox.kubeconfig)
    # F: the offline H100s in Kueue's ClusterQueues, whose figures the cluster confirms (the demo's E gives them to
    # Volcano, whose Queues tell no drift)
    seed_quota_demo(architecture="F", reconcile_now=False)
    return Cluster.objects.get(name="sandbox"), fresh_sandbox


def _h100(body: dict) -> dict:
    return next(r for r in body["quotas"] if r["flavor"] == "h100-80gb-offline" and r["resource"] == GPU)


def test_each_figure_says_when_the_cluster_confirmed_it_and_flags_drift(api, as_user, demo) -> None:
    cluster, sb = demo
    before = _h100(api("carol").get("/api/v1/projects/acme-vision/quota/").json())
    assert before["confirmed_at"] is None and before["drift"] is True  # nothing on the cluster yet
    assert reconcile(cluster).ok
    row = _h100(api("carol").get("/api/v1/projects/acme-vision/quota/").json())
    assert row["confirmed_at"] is not None and row["drift"] is False
    assert Decimal(row["cluster_nominal"]) == Decimal(row["nominal"]) == 6
    assert "drift:" not in text(as_user("alice").get("/tenants/acme/quotas/"))

    # The portal promises 8; until a reconcile applies it the cluster's queue still says 6.
    Quota.objects.filter(project__slug="acme-vision", flavor__name="h100-80gb-offline", resource=GPU).update(nominal=8)
    row = _h100(api("carol").get("/api/v1/projects/acme-vision/quota/").json())
    assert row["drift"] is True and Decimal(row["cluster_nominal"]) == 6 and Decimal(row["nominal"]) == 8
    page = text(as_user("carol").get("/projects/acme-vision/quota/"))
    assert "the portal says 8, the cluster&#x27;s queues say 6" in page or "the portal says 8, the cluster's queues say 6" in page
    tenant = text(as_user("alice").get("/tenants/acme/quotas/"))
    assert "drift: the cluster says 6" in tenant
    ops = text(as_user("ops").get("/ops/capacity/"))
    assert "Cluster confirmed" in ops and " UTC" in ops.split('id="promises"')[1]

    # The next reconcile applies it: no drift, and a fresh confirmation time.
    confirmed = row["confirmed_at"]
    reconcile(cluster)
    row = _h100(api("carol").get("/api/v1/projects/acme-vision/quota/").json())
    assert row["drift"] is False and Decimal(row["cluster_nominal"]) == 8 and row["confirmed_at"] >= confirmed
    live = json.loads(kubectl(sb, "get", "clusterqueue", "acme-vision", "-o", "json").stdout)
    assert any(r["nominalQuota"] == "8" for g in live["spec"]["resourceGroups"] for f in g["flavors"]
               if f["name"] == "h100-80gb-offline" for r in f["resources"])
