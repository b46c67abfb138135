"""Ops switch topology-aware placement on and off (issue 26): through the API and the cluster's settings page, against
the sandbox. On goes through the plan (a Topology to create, the whole-GPU flavors gaining ``topologyName``); off is
refused while flavors on the cluster carry it (Kueue forbids removing it), and works once those flavors are gone."""

from __future__ import annotations

import html
import re

import pytest

from portal.kube import kube_for
from quotas import manifests as m
from quotas import reconcile
from quotas.models import Cluster, Flavor
from tenants.models import AuditEntry

pytestmark = pytest.mark.django_db
RACKS = "block-rack-host"


@pytest.fixture
def sandbox_demo(cast, fresh_sandbox, settings) -> Cluster:
    """The demo cluster (its default architecture) on a fresh sandbox, applied once without topology."""
    from quotas.demo import seed_quota_demo

    settings.KUBECONFIG = str(fresh_sandbox.kubeconfig)
    seed_quota_demo(reconcile_now=False)
    cluster = Cluster.objects.get(name="sandbox")
    assert reconcile.reconcile(cluster).ok
    return cluster


def _placed(cluster: Cluster) -> list[str]:
    cluster.refresh_from_db()
    return [f.name for f in cluster.flavors.filter(active=True).order_by("order", "name") if m.topology_flavor(cluster, f)]


def _live_topology_names(cluster: Cluster) -> dict[str, str | None]:
    flavors, _ = kube_for(cluster).list(m.KUEUE, "ResourceFlavor")
    return {f["metadata"]["name"]: (f.get("spec") or {}).get("topologyName") for f in flavors}


def test_ops_switch_topology_on_through_the_api_and_off_only_once_no_flavor_carries_it(api, sandbox_demo) -> None:
    ops = api("ops")
    url = f"/api/v1/clusters/{sandbox_demo.pk}/"
    assert ops.get(url).json()["topology"] == ""
    assert api("carol").get(url).json()["topology"] is None  # an ops setting

    bad = ops.patch(url, {"topology": "one-big-rack"}, format="json")
    assert bad.status_code == 400 and "topology" in bad.json()["fields"], bad.content

    on = ops.patch(url, {"topology": RACKS}, format="json")
    assert on.status_code == 200 and on.json()["topology"] == RACKS, on.content
    entry = AuditEntry.objects.filter(action="cluster.update").latest("pk")
    assert entry.before["topology"] == "" and entry.after["topology"] == RACKS
    placed = _placed(sandbox_demo)
    assert placed, "the demo has whole-GPU flavors to place"

    plan = reconcile.plan_build(sandbox_demo)
    topology = [i for i in plan.items if i.key[1] == "Topology"]
    assert [(i.action, i.key[3]) for i in topology] == [("create", m.TOPOLOGY_NAME)]
    gaining = {i.key[3] for i in plan.items if i.key[1] == "ResourceFlavor" and i.action == "change"
               and "+  topologyName: gpu-portal" in i.diff}
    assert gaining == set(placed)
    assert reconcile.plan_apply(plan).ok
    live = _live_topology_names(sandbox_demo)
    assert all(live[name] == m.TOPOLOGY_NAME for name in placed)
    # The demo's H100 zone runs E: Volcano's offline pool gets the racks and blocks as HyperNodes, so a training gang
    # there may ask for one rack (Kueue's TAS places the flavors above).
    assert sandbox_demo.architecture == "E"
    hypernodes = {h["metadata"]["name"] for h in kube_for(sandbox_demo).list(m.VOLCANO_TOPOLOGY, "HyperNode")[0]}
    assert {"rack-a1", "rack-a2", "block-a"} <= hypernodes, hypernodes

    # Off is refused while the flavors carry it, and nothing changes.
    off = ops.patch(url, {"topology": ""}, format="json")
    assert off.status_code == 400, off.content
    words = " ".join(off.json()["fields"]["topology"])
    assert f"flavors {', '.join(placed)} carry it" in words and "Kueue does not allow removing" in words
    assert "deactivate" in words and "activate them again" in words
    sandbox_demo.refresh_from_db()
    assert sandbox_demo.topology == RACKS

    # What the message says: deactivate them, apply, switch off, activate them again.
    for name in placed:
        assert ops.post(f"/api/v1/flavors/{Flavor.objects.get(cluster=sandbox_demo, name=name).pk}/deactivate/").status_code == 200
    assert reconcile.reconcile(sandbox_demo).ok
    assert not set(placed) & set(_live_topology_names(sandbox_demo))
    off = ops.patch(url, {"topology": ""}, format="json")
    assert off.status_code == 200 and off.json()["topology"] == "", off.content
    Flavor.objects.filter(cluster=sandbox_demo, name__in=placed).update(active=True)
    sandbox_demo.refresh_from_db()
    assert reconcile.reconcile(sandbox_demo).ok
    live = _live_topology_names(sandbox_demo)
    assert all(name in live and live[name] is None for name in placed)


def _text(response) -> str:
    return html.unescape(response.content.decode())


def test_ops_switch_topology_on_the_settings_page_and_see_why_off_is_refused(as_user, sandbox_demo) -> None:
    client = as_user("ops")
    page = _text(client.get("/ops/clusters/sandbox/"))
    assert 'name="settings-topology"' in page and "Topology-aware placement" in page
    keep = {"settings-overcommit_percent": str(sandbox_demo.overcommit_percent)} | {
        f"settings-{flag}": "on" for flag in ("use_mig", "use_hami", "volcano_capacity_plugin") if getattr(sandbox_demo, flag)}
    response = client.post("/ops/clusters/sandbox/settings/", keep | {"settings-topology": RACKS}, follow=True)
    body = _text(response)
    assert "Settings of sandbox saved." in body
    assert "+kind: Topology" in body and "+  topologyName: gpu-portal" in body  # the plan to review
    sandbox_demo.refresh_from_db()
    assert sandbox_demo.topology == RACKS
    assert reconcile.reconcile(sandbox_demo).ok

    response = client.post("/ops/clusters/sandbox/settings/", keep | {"settings-topology": ""})
    body = _text(response)
    assert response.status_code == 200 and 'id="id_settings-topology_error"' in body
    assert re.search(r"Topology cannot be switched off while flavors [\w.-]+(, [\w.-]+)* carry it", body)
    sandbox_demo.refresh_from_db()
    assert sandbox_demo.topology == RACKS


NVLINK_LEVELS = [{"name": "block", "label": m.BLOCK_LABEL}, {"name": "rack", "label": m.RACK_LABEL},
                 {"name": "nvlink", "label": m.NVLINK_LABEL}, {"name": "host", "label": m.HOSTNAME_LABEL}]


def test_levels_change_only_once_no_flavor_carries_the_topology_and_the_reconcile_replaces_it(api, sandbox_demo) -> None:
    """Kueue v0.17 refuses any change to a Topology's levels ("field is immutable"): the portal refuses to change them
    while flavors carry the Topology; once none does, the Topology is gone too and comes back with the new ones."""
    ops = api("ops")
    url = f"/api/v1/clusters/{sandbox_demo.pk}/"
    assert ops.patch(url, {"topology": RACKS}, format="json").status_code == 200
    placed = _placed(sandbox_demo)
    assert reconcile.reconcile(sandbox_demo).ok

    refused = ops.patch(url, {"topology": "custom", "topology_levels": NVLINK_LEVELS}, format="json")
    assert refused.status_code == 400, refused.content
    words = " ".join(refused.json()["fields"]["topology_levels"])
    assert f"levels cannot change while flavors {', '.join(placed)} carry it" in words and "deactivate" in words
    sandbox_demo.refresh_from_db()
    assert (sandbox_demo.topology, sandbox_demo.topology_levels) == (RACKS, [])
    # The preset's own labels, named: nothing Kueue sees changes, so it is allowed.
    same = [lv for lv in NVLINK_LEVELS if lv["name"] != "nvlink"]
    assert ops.patch(url, {"topology": "custom", "topology_levels": same}, format="json").status_code == 200
    assert not [i for i in reconcile.plan_build(sandbox_demo).items if i.key[1] == "Topology"]

    for name in placed:
        assert ops.post(f"/api/v1/flavors/{Flavor.objects.get(cluster=sandbox_demo, name=name).pk}/deactivate/").status_code == 200
    sandbox_demo.refresh_from_db()
    assert reconcile.reconcile(sandbox_demo).ok
    changed = ops.patch(url, {"topology_levels": NVLINK_LEVELS}, format="json")
    assert changed.status_code == 200, changed.content
    Flavor.objects.filter(cluster=sandbox_demo, name__in=placed).update(active=True)
    sandbox_demo.refresh_from_db()
    plan = reconcile.plan_build(sandbox_demo)
    # The old Topology went with the flavors (nothing placed, nothing to name it): it is created with the new levels.
    assert [(i.action, i.key[3]) for i in plan.items if i.key[1] == "Topology"] == [("create", m.TOPOLOGY_NAME)]
    assert reconcile.plan_apply(plan).ok
    live = kube_for(sandbox_demo).get(m.KUEUE, "Topology", m.TOPOLOGY_NAME)
    assert live["spec"]["levels"] == [{"nodeLabel": lv["label"]} for lv in NVLINK_LEVELS]
    assert all(_live_topology_names(sandbox_demo)[name] == m.TOPOLOGY_NAME for name in placed)


def test_a_live_topology_whose_levels_differ_is_replaced_never_updated(sandbox_demo) -> None:
    """Levels changed behind the services' back (the database edited, an older portal's Topology): the plan deletes
    and recreates the Topology instead of an update Kueue refuses ("field is immutable")."""
    Cluster.objects.filter(pk=sandbox_demo.pk).update(topology=RACKS)
    sandbox_demo.refresh_from_db()
    assert reconcile.reconcile(sandbox_demo).ok
    Cluster.objects.filter(pk=sandbox_demo.pk).update(topology="custom", topology_levels=NVLINK_LEVELS)
    sandbox_demo.refresh_from_db()
    plan = reconcile.plan_build(sandbox_demo)
    assert [(i.action, i.key[3]) for i in plan.items if i.key[1] == "Topology"] == [("replace", m.TOPOLOGY_NAME)]
