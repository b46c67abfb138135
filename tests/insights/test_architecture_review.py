"""The architecture review answers from the live configuration: change the configuration and the answers change.
Ops review the platform; a tenant admin reviews their tenant only; members and other tenants get nothing."""

from __future__ import annotations

from decimal import Decimal

import pytest

from billing.models import UsageInterval
from quotas.models import Cluster, Flavor, Node, NodePool, Quota
from workloads.models import RequestState

from ..workloads.factories import make_request

pytestmark = pytest.mark.django_db
URL = "/api/v1/architecture-review/"


@pytest.fixture
def lab(cast):
    cluster = Cluster.objects.create(name="lab", architecture="B", health="healthy")
    pool = NodePool.objects.create(cluster=cluster, name="h100", sharing="whole", gpu_product="NVIDIA-H100-80GB-HBM3")
    Node.objects.create(cluster=cluster, pool=pool, name="gpu-1", ready=True)
    Node.objects.create(cluster=cluster, pool=pool, name="gpu-2", ready=False)
    h100 = Flavor.objects.create(cluster=cluster, name="h100", kind="whole", gpu_model="h100-80gb")
    Quota.objects.create(tenant=cast.acme, flavor=h100, resource="nvidia.com/gpu", nominal=Decimal(8))
    Quota.objects.create(tenant=cast.acme, project=cast.vision, flavor=h100, resource="nvidia.com/gpu",
                         nominal=Decimal(6), borrowing_limit=Decimal(2))
    Quota.objects.create(tenant=cast.globex, flavor=h100, resource="nvidia.com/gpu", nominal=Decimal(4))
    Quota.objects.create(tenant=cast.globex, project=cast.llm, flavor=h100, resource="nvidia.com/gpu", nominal=Decimal(4))
    return cluster


def answers(response) -> dict[str, dict]:
    assert response.status_code == 200, response.content
    return {a["key"]: a for a in response.json()["answers"]}


def text(answer: dict) -> str:
    return " ".join([answer["answer"], *answer["details"]])


def test_answers_follow_the_configuration(cast, api, lab) -> None:
    ops = api("ops")
    before = answers(ops.get(URL))
    assert set(before) == {"unit", "isolation", "governed", "admission", "reconfiguration", "usage", "failure", "zones",
                           "routing", "spill"}
    assert "whole GPU in 1 pool" in before["unit"]["answer"] and "MIG" not in text(before["unit"])
    assert "B · cohort per tenant" in text(before["unit"])  # the why comes from the architecture's description
    assert before["isolation"]["answer"] == "Isolation targets: whole card."
    assert before["reconfiguration"]["answer"].startswith("No MIG pools")
    assert "2 tenants → 2 Cohorts; 2 projects → 2 ClusterQueues" in text(before["governed"])
    assert "may not exceed capacity" in text(before["admission"])
    assert "1 of 2 nodes ready" in text(before["failure"]) and "1 of 2 nodes not ready" in text(before["failure"])

    # A MIG pool on a cluster whose architecture offers MIG, some overcommit, an unhealthy cluster, metered usage.
    Cluster.objects.filter(pk=lab.pk).update(architecture="C", overcommit_percent=20, health="unhealthy",
                                             last_error="connection refused")
    mig = NodePool.objects.create(cluster=lab, name="a100-mig", sharing="mig", mig_config="all-1g.10gb",
                                  gpu_product="NVIDIA-A100-SXM4-80GB")
    Node.objects.create(cluster=lab, pool=mig, name="gpu-mig-1", ready=True)
    Flavor.objects.create(cluster=lab, name="a100-1g", kind="mig", mig_profile="1g.10gb", gpu_model="a100-80gb")

    after = answers(ops.get(URL))
    assert "MIG slice in 1 pool" in after["unit"]["answer"]
    assert "MIG slice (layout all-1g.10gb), profiles 1g.10gb" in text(after["unit"])
    assert "C · B plus MIG flavors" in text(after["unit"])
    assert "MIG hardware isolation" in after["isolation"]["answer"]
    assert after["reconfiguration"]["answer"].startswith("Yes: 1 MIG pool") and "ops, with approval" in text(after["reconfiguration"])
    assert "exceed capacity by 20%" in text(after["admission"])
    assert "UNHEALTHY" in text(after["failure"]) and "connection refused" in text(after["failure"])
    assert "1 cluster unhealthy" in after["failure"]["answer"]


def test_a_mig_pool_the_architecture_does_not_offer_is_said_so(cast, api, lab) -> None:
    mig = NodePool.objects.create(cluster=lab, name="a100-mig", sharing="mig", mig_config="all-1g.10gb")
    got = answers(api("ops").get(URL))
    assert "a100-mig" not in text(got["unit"])  # no node in it (yet, or any more: a MIG change moved them)
    Node.objects.create(cluster=lab, pool=mig, name="gpu-mig-1", ready=True)
    got = answers(api("ops").get(URL))
    assert "never offers MIG slice flavors: the pool is not offered" in text(got["unit"])


def test_a_tenant_admin_reviews_their_tenant_only(cast, api, client, lab) -> None:
    from ..workloads.factories import Catalogue
    from workloads.catalogue import seed_catalogue
    from workloads.models import ServiceTemplate

    seed_catalogue()
    training = ServiceTemplate.objects.get(slug="training")
    flavor = Flavor.objects.get(cluster=lab, name="h100")
    cat = Catalogue(lab, flavor, flavor, flavor, training, training, training)
    for project, user in ((cast.vision, cast.carol), (cast.llm, cast.frank)):
        req = make_request(cat, project, user, state=RequestState.SUCCEEDED)
        UsageInterval.objects.create(request=req, tenant=project.tenant, project=project, cluster=lab, run_key="r1",
                                     source="workload", object_uid="u", object_name=req.k8s_name, unit="gpu",
                                     key="h100-80gb", quantity=Decimal(1), started_at=req.created_at)

    body = api("alice").get(URL)
    assert body.status_code == 200 and body.json()["tenant"] == "acme"
    got = answers(body)
    everything = " ".join(text(a) for a in got.values())
    assert "globex" not in everything
    assert "acme-vision" in text(got["admission"]) and "1 interval" in text(got["usage"])
    assert got["governed"]["answer"].startswith("tenant acme with 2 active projects")
    assert api("alice").get(URL, {"tenant": "acme"}).json() == body.json()
    # Another tenant: not there at all. A member or viewer: not for them. Ops: any tenant, or everything.
    assert api("alice").get(URL, {"tenant": "globex"}).status_code == 404
    assert api("erin").get(URL, {"tenant": "acme"}).status_code == 404
    assert api("carol").get(URL).status_code == 403
    assert api("carol").get(URL, {"tenant": "acme"}).status_code == 403
    assert api("nobody").get(URL).status_code == 403
    platform = api("ops").get(URL).json()
    assert platform["tenant"] is None and "globex" in str(platform)
    assert api("ops").get(URL, {"tenant": "globex"}).json()["tenant"] == "globex"

    # The pages: ops at /ops/, the tenant admin under the tenant, the same scoping.
    client.force_login(cast.alice)
    page = client.get("/tenants/acme/architecture-review/")
    assert page.status_code == 200 and b"What is the resource unit" in page.content and b"globex" not in page.content
    assert client.get("/tenants/globex/architecture-review/").status_code == 404
    assert client.get("/ops/architecture-review/").status_code == 404
    client.force_login(cast.carol)
    assert client.get("/tenants/acme/architecture-review/").status_code == 403
    client.force_login(cast.ops)
    page = client.get("/ops/architecture-review/")
    assert page.status_code == 200 and b"globex" in page.content and b"Architecture review" in page.content


def test_bad_input_is_a_400_and_tokens_read_their_tenant_only(cast, api, token_client, lab) -> None:
    ops = api("ops")
    assert ops.get(URL, {"tenant": "not a slug!"}).status_code == 400
    assert ops.get(URL, {"tenant": "missing"}).status_code == 404
    answer = ops.get(URL, {"colour": "blue"})
    assert answer.status_code == 400
    client, _ = token_client("carol", cast.vision)
    assert client.get(URL).status_code == 403
