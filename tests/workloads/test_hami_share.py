"""HAMi shares people can size (issue 27): the demo lets a researcher (carol, acme-vision) use HAMi at once; the form
and the API show each vGPU's share in GiB and % of the cores; the pod asks ``nvidia.com/gpumem`` (MiB) and
``nvidia.com/gpucores`` accordingly, never 0; a HAMi flavor without a share size is neither offered nor accepted."""

from __future__ import annotations

import pytest
from django.contrib.auth import get_user_model
from django.test import Client as DjangoClient
from rest_framework.test import APIClient

from quotas.demo import seed_quota_demo
from quotas.inventory import hami_share_default
from quotas.models import Flavor
from tenants.demo import seed_demo
from workloads.catalogue import seed_catalogue
from workloads.manifests import request_manifests
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
