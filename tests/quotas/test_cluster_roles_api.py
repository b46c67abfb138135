"""Kueue MultiKueue roles through the cluster API (docs/federation.md, "Kueue MultiKueue"): ``role`` and ``manager``
are readable by everyone, ``admission_check`` by ops; ops write them with the rules of the cluster page's form (a
worker names a manager cluster, only a worker has one, a manager with workers stays one), each a 400 field error
that changes nothing."""

from __future__ import annotations

import pytest

from quotas.models import Cluster

pytestmark = [pytest.mark.django_db]
URL = "/api/v1/clusters/"


@pytest.fixture
def clusters(cast) -> dict[str, Cluster]:
    return {name: Cluster.objects.create(name=name, architecture="B") for name in ("hub", "east", "west")}


def test_ops_set_multikueue_roles_through_the_api_with_the_forms_rules(api, clusters) -> None:
    ops = api("ops")
    # A worker without a manager, or whose manager is not a MultiKueue manager: a field error, nothing saved.
    refused = ops.patch(f"{URL}east/", {"role": "worker"}, format="json")
    assert refused.status_code == 400 and refused.json()["fields"]["manager"] == ["A MultiKueue worker needs its manager cluster."]
    refused = ops.patch(f"{URL}east/", {"role": "worker", "manager": "hub"}, format="json")
    assert refused.status_code == 400
    assert refused.json()["fields"]["manager"] == ["Cluster hub is not a MultiKueue manager: set its role first."]
    assert ops.patch(f"{URL}east/", {"role": "worker", "manager": "nowhere"}, format="json").status_code == 400
    assert Cluster.objects.get(name="east").role == "standalone"

    hub = ops.patch(f"{URL}hub/", {"role": "manager", "admission_check": "mk"}, format="json")
    assert hub.status_code == 200 and (hub.json()["role"], hub.json()["admission_check"]) == ("manager", "mk")
    east = ops.patch(f"{URL}east/", {"role": "worker", "manager": "hub"}, format="json")
    assert east.status_code == 200, east.content
    assert (east.json()["role"], east.json()["manager"]) == ("worker", "hub")
    # Registered as a worker at once.
    created = ops.post(URL, {"name": "north", "role": "worker", "manager": "hub"}, format="json")
    assert created.status_code == 201, created.content
    assert Cluster.objects.get(name="north").manager == clusters["hub"]

    # No cycles: a manager cannot itself become a worker while workers name it, a worker names no worker, a standalone
    # cluster names no manager.
    refused = ops.patch(f"{URL}hub/", {"role": "worker", "manager": "hub", "admission_check": ""}, format="json")
    assert refused.status_code == 400 and refused.json()["fields"]["manager"] == ["A MultiKueue worker needs its manager cluster."]
    refused = ops.patch(f"{URL}hub/", {"role": "worker", "manager": "west", "admission_check": ""}, format="json")
    assert refused.json()["fields"]["manager"] == ["Cluster west is not a MultiKueue manager: set its role first."]
    assert ops.patch(f"{URL}west/", {"role": "worker", "manager": "east"}, format="json").status_code == 400
    refused = ops.patch(f"{URL}west/", {"manager": "hub"}, format="json")
    assert refused.status_code == 400 and refused.json()["fields"]["manager"] == ["Only a MultiKueue worker has a manager."]
    assert ops.patch(f"{URL}hub/", {"role": "standalone"}, format="json").json()["fields"]["admission_check"] == [
        "Only a MultiKueue manager names an admission check."]
    assert ops.patch(f"{URL}hub/", {"role": "standalone", "admission_check": ""}, format="json").json()["fields"]["role"] == [
        "Workers name this cluster as their manager: change their role first."]
    assert Cluster.objects.get(name="hub").role == "manager" and Cluster.objects.get(name="west").role == "standalone"

    # Read: everyone sees the roles (the architecture review says as much); the admission check is ops-only.
    rows = {c["name"]: c for c in api("carol").get(URL).json()["results"]}
    assert (rows["east"]["role"], rows["east"]["manager"]) == ("worker", "hub")
    assert (rows["hub"]["role"], rows["hub"]["manager"], rows["hub"]["admission_check"]) == ("manager", None, None)
    assert api("ops").get(f"{URL}hub/").json()["admission_check"] == "mk"
    # Researchers write nothing.
    assert api("carol").patch(f"{URL}west/", {"role": "manager"}, format="json").status_code == 403


def test_a_multikueue_worker_keeps_its_managers_architecture_and_switches(api, cast) -> None:
    """MultiKueue dispatches by the manager's queue names and flavors: a worker whose architecture (or, where the
    architecture switches them, MIG or HAMi flavors) differs from its manager's is refused with a field error, and so
    is a manager's change that would leave its workers differing; nothing is saved."""
    ops = api("ops")
    Cluster.objects.create(name="hub", architecture="E", role="manager")
    Cluster.objects.create(name="west", architecture="B")
    assert ops.post(URL, {"name": "east", "architecture": "E", "role": "worker", "manager": "hub"},
                    format="json").status_code == 201
    # Registered or made a worker with another architecture: refused on what differs.
    refused = ops.post(URL, {"name": "north", "architecture": "B", "role": "worker", "manager": "hub"}, format="json")
    assert refused.status_code == 400
    assert refused.json()["fields"]["architecture"] == [
        "A MultiKueue worker needs its manager's queues (same ClusterQueue and LocalQueue names and flavors): north "
        "would have architecture B, not E as on its manager hub. Set it as on hub, or choose another manager."]
    assert not Cluster.objects.filter(name="north").exists()
    refused = ops.patch(f"{URL}west/", {"role": "worker", "manager": "hub"}, format="json")
    assert refused.status_code == 400 and "west would have architecture B, not E" in refused.json()["fields"]["manager"][0]
    # A worker's own change: its architecture, or a MIG/HAMi switch its architecture (E) makes per cluster.
    refused = ops.patch(f"{URL}east/", {"architecture": "F"}, format="json")
    assert refused.status_code == 400 and "east would have architecture F, not E" in refused.json()["fields"]["architecture"][0]
    refused = ops.patch(f"{URL}east/", {"use_mig": True}, format="json")
    assert refused.status_code == 400 and "east would have MIG flavors on, not off" in refused.json()["fields"]["use_mig"][0]
    # The manager's change while its worker differs would differ: refused, saying what to change first.
    refused = ops.patch(f"{URL}hub/", {"use_hami": True}, format="json")
    assert refused.status_code == 400
    assert refused.json()["fields"]["use_hami"] == [
        "Its MultiKueue workers would no longer have its queues: east would have HAMi flavors off, not on. Make east "
        "standalone first (their role), change hub, change east the same way, then make them its workers again."]
    refused = ops.patch(f"{URL}hub/", {"architecture": "F"}, format="json")
    assert refused.status_code == 400 and "east would have architecture E, not F" in refused.json()["fields"]["architecture"][0]
    assert [(c.name, c.architecture, c.use_mig, c.use_hami, c.role) for c in Cluster.objects.order_by("name")] == [
        ("east", "E", False, False, "worker"), ("hub", "E", False, False, "manager"), ("west", "B", False, False, "standalone")]
    # The order the message gives works: the worker standalone, both changed, the worker again.
    assert ops.patch(f"{URL}east/", {"role": "standalone", "manager": None}, format="json").status_code == 200
    assert ops.patch(f"{URL}hub/", {"use_hami": True}, format="json").status_code == 200
    assert ops.patch(f"{URL}east/", {"use_hami": True}, format="json").status_code == 200
    assert ops.patch(f"{URL}east/", {"role": "worker", "manager": "hub"}, format="json").status_code == 200
