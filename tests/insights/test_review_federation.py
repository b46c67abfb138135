"""The architecture review answers the federation questions from data (docs/federation.md): the zones and their
failure domains, the routing rule with the zones each model is routed among, and the spill-over policies with the
spill-overs of the last days. A tenant admin's review shows only their tenant's policies and spills."""

from __future__ import annotations

from decimal import Decimal

import pytest

from quotas.models import Cluster, Flavor, Quota, SpillPolicy
from quotas.zones import cluster_drain
from tenants.access import Actor
from workloads.catalogue import seed_catalogue
from workloads.models import RequestState, ServiceTemplate

from ..workloads.factories import Catalogue, make_request
from .test_architecture_review import answers, text

pytestmark = pytest.mark.django_db
URL = "/api/v1/architecture-review/"


@pytest.fixture
def zones(cast):
    out = {}
    for name, zone, domain, model in [("c-h100", "h100-training", "site-a", "h100-80gb"),
                                      ("c-a100", "a100-inference", "site-b", "a100-80gb"),
                                      ("c-h100b", "h100-overflow", "site-b", "h100-80gb")]:
        cluster = Cluster.objects.create(name=name, architecture="B", health="healthy", zone=zone, failure_domain=domain)
        flavor = Flavor.objects.create(cluster=cluster, name=model, kind="whole", gpu_model=model)
        Quota.objects.create(tenant=cast.acme, flavor=flavor, resource="nvidia.com/gpu", nominal=Decimal(8))
        Quota.objects.create(tenant=cast.globex, flavor=flavor, resource="nvidia.com/gpu", nominal=Decimal(8))
        out[name] = (cluster, flavor)
    return out


def test_zones_routing_and_spill_are_answered_from_data(cast, api, zones) -> None:
    got = answers(api("ops").get(URL))
    assert got["zones"]["answer"] == "3 zones: each cluster is one zone, as a rule one GPU model's pool; the GPU models are a100-80gb, h100-80gb."
    assert "a100-inference (cluster c-a100, failure domain site-b): a100-80gb; healthy." in got["zones"]["details"]
    assert "h100-80gb: h100-overflow, h100-training (the least loaded that fits now is taken)" in got["routing"]["details"]
    assert "a100-80gb: a100-inference" in got["routing"]["details"]
    assert "2 failure domains (site-a, site-b)" in got["failure"]["answer"]
    assert "Failure domain site-b: c-a100, c-h100b" in got["failure"]["details"]
    assert "0 projects allow spill-over." in got["spill"]["answer"]

    # Policies, a spill, a drain: the answers change with the data.
    SpillPolicy.objects.create(project=cast.vision, allowed=True, target_models=["a100-80gb"], needs_approval=True)
    SpillPolicy.objects.create(project=cast.llm, allowed=True)
    cluster, a100 = zones["c-a100"]
    seed_catalogue()
    training = ServiceTemplate.objects.get(slug="training")
    cat = Catalogue(cluster, a100, a100, a100, training, training, training)
    make_request(cat, cast.vision, cast.carol, state=RequestState.SUCCEEDED, spilled=True, spilled_from_model="h100-80gb")
    cluster_drain(actor=Actor(user=cast.ops), cluster=zones["c-h100b"][0], reason="power work")
    got = answers(api("ops").get(URL))
    assert "2 projects allow spill-over; 1 requests spilled in the last 30 days." in got["spill"]["answer"]
    assert "acme / acme-vision: to a100-80gb; a spilled request waits for an approver" in got["spill"]["details"]
    assert "globex / globex-llm: to any model" in got["spill"]["details"]
    assert "Spilled in the last 30 days: h100-80gb → a100-80gb, 1 request" in got["spill"]["details"]
    assert "h100-overflow (cluster c-h100b, failure domain site-b): h100-80gb; draining (power work)." in got["zones"]["details"]

    # A tenant admin sees their tenant's policies and spills only.
    erin = answers(api("erin").get(URL + "?tenant=globex"))
    assert "1 project allow spill-over." in erin["spill"]["answer"] and "acme" not in text(erin["spill"])
