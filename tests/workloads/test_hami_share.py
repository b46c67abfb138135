"""HAMi shares people can size (issue 27): the demo lets a researcher (carol, acme-vision) use HAMi at once; the form
and the API show each vGPU's share in GiB and % of the cores; the pod asks ``nvidia.com/gpumem`` (MiB) and
``nvidia.com/gpucores`` accordingly, never 0; a HAMi flavor without a share size is neither offered nor accepted."""

from __future__ import annotations

import time
from datetime import timedelta
from decimal import Decimal
from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.test import Client as DjangoClient
from django.utils import timezone
from rest_framework.test import APIClient

from billing.models import Price, Unit
from billing.selectors import price_list_changed
from portal.kube import kube_cache_clear, kube_for
from portal.quantities import parse_quantity
from quotas.demo import seed_quota_demo
from quotas.inventory import flavors_discover, hami_share_default, inventory_sync, node_taints
from quotas.manifests import KUEUE
from quotas.models import Cluster, Flavor, NodePool, Quota
from quotas.reconcile import reconcile
from tenants.access import Actor
from tenants.demo import seed_demo
from workloads import services
from workloads.catalogue import seed_catalogue
from workloads.manifests import REQUEST_LABEL
from workloads.materialize import request_materialize
from workloads.models import RequestState, ServiceTemplate
from workloads.kinds import request_manifests
from workloads.models import WorkloadRequest

pytestmark = pytest.mark.django_db
SHARE = "L40S shared (HAMi) · 11 GiB, 25 % of the cores"


@pytest.fixture
def demo(settings, tmp_path) -> None:
    settings.KUBECONFIG = str(tmp_path / "no-cluster")  # unreachable: the demo profile's flavors
    seed_demo()
    seed_quota_demo(reconcile_now=False)
    seed_catalogue()


def _carol():
    return get_user_model().objects.get(username="carol")


def test_discovery_proposes_a_quarter_card_share_never_zero() -> None:
    assert hami_share_default(46068) == (11264, 25)  # an L40S: 11 GiB and 25 % of its cores
    assert hami_share_default(0) == (1024, 25)


def test_carol_picks_a_hami_share_at_once_and_the_pod_asks_for_it(demo) -> None:
    web = DjangoClient()
    web.force_login(_carol())
    form = web.get("/requests/new/", {"template": "training", "project": "acme-vision"})
    assert SHARE in [label for _pk, label in form.context["form"].fields["flavor"].choices]
    assert SHARE in form.content.decode()

    api = APIClient()
    api.force_authenticate(_carol())
    listed = api.get("/api/v1/templates/training/", {"project": "acme-vision"}).json()
    hami = next(f for f in listed["allowed_flavors"] if f["kind"] == "hami")
    assert (hami["share"], hami["hami_memory_mib"], hami["hami_cores_percent"]) == (
        "11 GiB, 25 % of the cores", 11264, 25)

    response = api.post("/api/v1/requests/", {"template": "training", "project": "acme-vision", "flavor": "l40s-hami",
                                              "gpus": 2, "parameters": {"command": "python train.py"}}, format="json")
    assert response.status_code == 201, response.content
    req = WorkloadRequest.objects.select_related("project__tenant", "tenant", "template", "flavor", "cluster").get(
        pk=response.json()["id"])
    assert SHARE in web.get(f"/requests/{req.pk}/").content.decode()
    pods = [o["spec"]["template"]["spec"] for o in request_manifests(req) if "template" in o.get("spec", {})]
    asked = pods[0]["containers"][0]["resources"]["requests"]
    assert (asked["nvidia.com/gpu"], asked["nvidia.com/gpumem"], asked["nvidia.com/gpucores"]) == ("2", "11264", "25")


def test_a_hami_flavor_without_a_share_is_not_offered_and_refused_with_the_reason(demo) -> None:
    Flavor.objects.filter(name="l40s-hami").update(hami_memory_mib=0, hami_cores_percent=0)
    web = DjangoClient()
    web.force_login(_carol())
    form = web.get("/requests/new/", {"template": "training", "project": "acme-vision"})
    assert "l40s-hami" not in {f.name for f in form.context["form"].flavors.values()}
    api = APIClient()
    api.force_authenticate(_carol())
    response = api.post("/api/v1/requests/", {"template": "training", "project": "acme-vision", "flavor": "l40s-hami",
                                              "gpus": 1, "parameters": {"command": "python train.py"}}, format="json")
    assert response.status_code == 400
    assert "has no share size" in str(response.json()), response.json()
    assert not WorkloadRequest.objects.filter(flavor__name="l40s-hami").exists()


# ------------------------------------------------------------------------------------------------ a size of one's own
# A researcher may also size a share as people think of it: GiB of GPU memory and % of the card's cores, within what
# the flavor's card allows. The demo's L40S card has 45 GiB (46068 MiB); acme-vision has 45 GiB and 200 % of HAMi quota.
OWN = {"template": "training", "project": "acme-vision", "flavor": "l40s-hami", "gpus": 2, "duration_hours": 2,
       "parameters": {"command": "python train.py"}}


def _card(memory_mib: int = 46068) -> None:
    """The L40S node pool of the demo's cluster (it has no reachable cluster, so no nodes to read the card from)."""
    flavor = Flavor.objects.get(name="l40s-hami")
    NodePool.objects.create(cluster=flavor.cluster, name="l40s", gpu_product="NVIDIA-L40S", gpu_memory_mib=memory_mib,
                            sharing=NodePool.Sharing.HAMI)


def _prices() -> None:
    """HAMi memory 0.01 a GiB-hour, compute 1.00 a card-hour; nothing else priced."""
    past = timezone.now() - timedelta(days=1)
    Price.objects.create(unit=Unit.HAMI_MEMORY, amount=Decimal("0.01"), currency="EUR", effective_from=past)
    Price.objects.create(unit=Unit.HAMI_CORES, amount=Decimal("1.00"), currency="EUR", effective_from=past)
    price_list_changed()


def _api() -> APIClient:
    api = APIClient()
    api.force_authenticate(_carol())
    return api


def test_a_share_of_ones_own_size_shows_everywhere_is_priced_and_counted(demo) -> None:
    _card()
    _prices()
    api = _api()
    response = api.post("/api/v1/requests/", OWN | {"share_memory_gib": "10", "share_cores_percent": 40}, format="json")
    assert response.status_code == 201, response.content
    share = {"memory_gib": "10", "memory_mib": 10240, "cores_percent": 40, "size": "10 GiB, 40 % of an L40S",
             "preset": False}
    assert response.json()["share"] == share
    pk = response.json()["id"]
    assert api.get(f"/api/v1/requests/{pk}/").json()["share"] == share
    assert {row["id"]: row["share"] for row in api.get("/api/v1/requests/").json()["results"]} == {pk: share}
    # Priced by its own size: 2 vGPUs x (10 GiB x 0.01 + 0.40 of a card x 1.00) x 2 h; the preset (11 GiB, 25 %)
    # would be 1.44.
    assert response.json()["cost_estimate"] == "2.00"
    web = DjangoClient()
    web.force_login(_carol())
    page = web.get(f"/requests/{pk}/").content.decode()
    assert "10 GiB, 40 % of an L40S" in page and "(a size of the requester's own)" in page
    assert SHARE not in page  # the flavor's preset is not what it got

    # The preset is still the default, and said so.
    preset = api.post("/api/v1/requests/", OWN | {"name": "preset"}, format="json")
    assert preset.status_code == 201, preset.content
    assert preset.json()["share"] == {"memory_gib": "11", "memory_mib": 11264, "cores_percent": 25,
                                      "size": "11 GiB, 25 % of an L40S", "preset": True}
    assert preset.json()["cost_estimate"] == "1.44"

    # Quota accounting: the project can ever get 90 GiB of GPU memory and 400 % of a card's cores (its 45 GiB and
    # 200 % plus what it may borrow from acme); 3 vGPUs of 40 GiB, or 5 of 90 %, would never fit (the preset would).
    too_big = api.post("/api/v1/requests/", OWN | {"name": "big", "gpus": 3, "share_memory_gib": "40"}, format="json")
    assert too_big.status_code == 400
    assert "need 120 GiB of GPU memory" in too_big.json()["fields"]["share_memory_gib"][0], too_big.json()
    assert "(90 GiB)" in too_big.json()["fields"]["share_memory_gib"][0]
    greedy = api.post("/api/v1/requests/", OWN | {"name": "greedy", "gpus": 5, "share_cores_percent": 90}, format="json")
    assert greedy.status_code == 400
    assert "need 450 % of a card's cores" in greedy.json()["fields"]["share_cores_percent"][0], greedy.json()
    assert api.post("/api/v1/requests/", OWN | {"name": "fits", "gpus": 3}, format="json").status_code == 201
    assert WorkloadRequest.objects.count() == 3


@pytest.mark.parametrize(("sent", "field", "words"), [
    ({"share_memory_gib": "0"}, "share_memory_gib", "greater than or equal to 0.001"),
    ({"share_memory_gib": "48"}, "share_memory_gib", "at most one card's memory: 45 GiB"),
    ({"share_cores_percent": 150}, "share_cores_percent", "less than or equal to 100"),
    ({"share_preset": True, "share_memory_gib": "10"}, "share_preset", "not both"),
    ({"share_preset": False}, "share_memory_gib", "or take the preset"),
    ({"flavor": "h100-80gb-offline", "share_memory_gib": "10"}, "share_memory_gib", "Only HAMi flavors"),
])
def test_a_share_size_that_does_not_fit_is_a_field_error(demo, sent, field, words) -> None:
    _card()
    response = _api().post("/api/v1/requests/", OWN | sent, format="json")
    assert response.status_code == 400, response.content
    assert words in " ".join(response.json()["fields"].get(field, [])), response.json()
    assert not WorkloadRequest.objects.exists()


def _form_data(form) -> dict[str, str]:
    """What the generated form posts when sent as it came (its initial values)."""
    data = {}
    for name in form.fields:
        value = form[name].value()
        if value is None or value is False:
            continue
        data[name] = "on" if value is True else str(value)
    return data


def test_the_form_offers_a_share_of_ones_own_for_hami_flavors(demo) -> None:
    _card()
    _prices()
    web = DjangoClient()
    web.force_login(_carol())
    page = web.get("/requests/new/", {"template": "training", "project": "acme-vision"})
    form = page.context["form"]
    hami = Flavor.objects.get(name="l40s-hami")
    # The share fields, which the page's script shows for the HAMi flavors only (the select names them).
    assert {"share_preset", "share_memory_gib", "share_cores_percent"} <= set(form.fields)
    assert form.fields["flavor"].widget.attrs["data-hami-flavors"].split() == [str(hami.pk)]
    html = page.content.decode()
    assert f'data-hami-flavors="{hami.pk}"' in html and 'data-hami-only="own"' in html
    data = _form_data(form) | {"flavor": str(hami.pk), "gpus": "2", "duration_hours": "2", "project": "acme-vision",
                               "param_command": "python train.py"}

    # The cost estimate follows the share (htmx posts the form as it is).
    own = {"share_preset": "false", "share_memory_gib": "10", "share_cores_percent": "40"}
    estimate = web.post("/requests/new/estimate/?template=training", data | own).content.decode()
    assert "2.00 EUR" in estimate, estimate
    assert "1.44 EUR" in web.post("/requests/new/estimate/?template=training", data).content.decode()

    # Bad sizes come back as field errors, with what was typed kept.
    for bad, field, words in (
        ({"share_preset": "true", "share_memory_gib": "10"}, "share_preset", "not both"),
        ({**own, "share_cores_percent": "150"}, "share_cores_percent", "1 to 100"),
        ({**own, "share_memory_gib": "48"}, "share_memory_gib", "45 GiB"),
    ):
        response = web.post("/requests/new/?template=training", data | bad)
        assert response.status_code == 200
        errors = response.context["form"].errors
        assert words in " ".join(errors.get(field, [])), errors
        assert response.context["form"][field].value() == (data | bad)[field]
    assert not WorkloadRequest.objects.exists()

    sent = web.post("/requests/new/?template=training", data | own)
    assert sent.status_code == 302, sent.context["form"].errors if sent.context else sent
    req = WorkloadRequest.objects.get()
    assert (req.share_memory_mib, req.share_cores_percent) == (10240, 40)
    assert "10 GiB, 40 % of an L40S" in web.get(sent["Location"]).content.decode()


def test_a_share_of_ones_own_reaches_the_pod_and_kueue_counts_it(fresh_sandbox, cast) -> None:
    """On the sandbox cluster (architecture D): the Job's pod asks nvidia.com/gpumem in MiB and nvidia.com/gpucores
    for the size given, and Kueue counts the vGPUs times that share against total-gpumem / total-gpucores."""
    kube_cache_clear()
    cluster = Cluster.objects.create(name="sandbox-d", architecture="D", kubeconfig_path=str(fresh_sandbox.kubeconfig),
                                     use_hami=True)
    kube = kube_for(cluster)
    inventory_sync(cluster, kube=kube)
    for flavor in flavors_discover(cluster, taints_by_node=node_taints(kube)):
        flavor.save()
    flavors = list(Flavor.objects.filter(cluster=cluster))
    for flavor in flavors:
        for resource in flavor.resource_names:
            amount = {"cpu": 400, "memory": 4000, "nvidia.com/total-gpucores": 800,
                      "nvidia.com/total-gpumem": 8 * 46068}.get(resource, 8)
            Quota.objects.create(tenant=cast.acme, flavor=flavor, resource=resource, nominal=Decimal(amount * 2))
            Quota.objects.create(tenant=cast.acme, project=cast.vision, flavor=flavor, resource=resource,
                                 nominal=Decimal(amount), borrowing_limit=Decimal(0))
    seed_catalogue()
    for template in ServiceTemplate.objects.all():
        template.allowed_flavors.set(flavors)
    assert reconcile(cluster, kube=kube).ok
    hami = next(f for f in flavors if f.kind == "hami")

    api = APIClient()
    api.force_authenticate(cast.carol)
    response = api.post("/api/v1/requests/", OWN | {"flavor": hami.name, "gpus": 2, "share_memory_gib": "10",
                                                    "share_cores_percent": 40}, format="json")
    assert response.status_code == 201, response.content
    req = WorkloadRequest.objects.get(pk=response.json()["id"])
    if req.state == RequestState.PENDING_APPROVAL:
        req = services.request_approve(actor=Actor(user=cast.bob), request=req, comment="ok")
    assert request_materialize(request_id=req.pk) == "queued"
    store = fresh_sandbox.store
    [job] = store.list("batch/v1", "Job", cast.vision.namespace, label_selector=f"{REQUEST_LABEL}={req.pk}")["items"]
    asked = job["spec"]["template"]["spec"]["containers"][0]["resources"]["requests"]
    assert (asked["nvidia.com/gpu"], asked["nvidia.com/gpumem"], asked["nvidia.com/gpucores"]) == ("2", "10240", "40")

    def usage() -> dict[str, Any] | None:
        for workload in store.list(KUEUE, "Workload", cast.vision.namespace)["items"]:
            admission = (workload.get("status") or {}).get("admission")
            if admission:
                return admission["podSetAssignments"][0]["resourceUsage"]
        return None

    deadline = time.monotonic() + 30
    while usage() is None:
        assert time.monotonic() < deadline, store.list(KUEUE, "Workload", cast.vision.namespace)["items"]
        fresh_sandbox.advance(1)
        time.sleep(0.2)
    counted = usage()
    assert parse_quantity(counted["nvidia.com/total-gpumem"]) == 2 * 10240, counted
    assert parse_quantity(counted["nvidia.com/total-gpucores"]) == 2 * 40, counted
