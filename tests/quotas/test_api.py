"""REST API for clusters, flavors, quotas and quota requests: every endpoint, the role x action
matrix, tenant isolation (a foreign row is a 404 and never listed), bad input (400 with field
errors, nothing written) and query counts on the lists."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from quotas import services
from quotas.models import Cluster, Flavor, Quota, QuotaRequest
from tenants.models import AuditEntry

from .factories import GPU, MIG_1G, make_fleet


pytestmark = [pytest.mark.django_db]

API = "/api/v1"
KUBECONFIG = "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster: {server: 'https://10.1.2.3:6443'}\n"


def results(response) -> list:
    assert response.status_code == 200, response.content
    return response.json()["results"]


def written() -> tuple[int, ...]:
    return (Cluster.objects.count(), Flavor.objects.count(), Quota.objects.count(), QuotaRequest.objects.count(),
            AuditEntry.objects.count())


def ask(cast, fleet, amount=2, who="carol", **kwargs):
    return services.quota_request_create(actor=cast.actor(who), project=kwargs.pop("project", cast.vision), flavor=fleet.h100,
                                         resource=GPU, amount=amount, reason="More runs.", **kwargs)


# Clusters ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("who", ["ops", "alice", "carol", "erin", "nobody"])
def test_cluster_list_everyone_sees_minimal(api, fleet, who, django_assert_max_num_queries) -> None:
    make_fleet("second", architecture="B")
    client = api(who)
    with django_assert_max_num_queries(8):
        rows = results(client.get(f"{API}/clusters/"))
    assert [r["name"] for r in rows] == ["gpu-test", "second"]
    if who == "ops":
        assert {"overcommit_percent", "has_kubeconfig", "kubeconfig_path", "use_mig"} <= set(rows[0])
        assert "kubeconfig" not in rows[0] and "kubeconfig_encrypted" not in rows[0]
    else:
        # The same keys for everyone (tests/test_api_schema.py checks them against the schema); ops-only ones null.
        assert {k for k, v in rows[0].items() if v is not None} == {"id", "name", "architecture", "role"}
        assert rows[0]["use_mig"] is None and rows[0]["kubeconfig_path"] is None


def test_cluster_by_id_and_name(api, fleet) -> None:
    client = api("carol")
    shown = {k: v for k, v in client.get(f"{API}/clusters/{fleet.cluster.pk}/").json().items() if v is not None}
    assert shown == {"id": fleet.cluster.pk, "name": "gpu-test", "architecture": "E", "role": "standalone"}
    assert client.get(f"{API}/clusters/gpu-test/").json()["id"] == fleet.cluster.pk
    assert client.get(f"{API}/clusters/no-such/").status_code == 404


@pytest.mark.parametrize("who, status", [("ops", 201), ("alice", 403), ("carol", 403), ("nobody", 403)])
def test_cluster_create_ops_only(api, cast, who, status) -> None:
    body = {"name": "prod-1", "architecture": "D", "use_hami": True, "overcommit_percent": 20, "kubeconfig": KUBECONFIG}
    response = api(who).post(f"{API}/clusters/", body, format="json")
    assert response.status_code == status, response.content
    if status == 201:
        data = response.json()
        assert data["has_kubeconfig"] is True and "kubeconfig" not in data and "10.1.2.3" not in response.content.decode()
        assert Cluster.objects.get(name="prod-1").kubeconfig_encrypted
    else:
        assert not Cluster.objects.filter(name="prod-1").exists()


@pytest.mark.parametrize(
    "body, field",
    [
        ({"name": "Bad_Name"}, "name"),
        ({"name": "gpu-test"}, "name"),
        ({"name": "x", "architecture": "Z"}, "architecture"),
        ({"name": "x", "architecture": "B", "use_mig": True}, "use_mig"),
        ({"name": "x", "overcommit_percent": -5}, "overcommit_percent"),
        ({"name": "x", "overcommit_percent": "lots"}, "overcommit_percent"),
        ({"name": "x", "kubeconfig": "not: a kubeconfig"}, "kubeconfig"),
        ({"name": "x", "colour": "red"}, "colour"),
        ({}, "name"),
    ],
)
def test_cluster_create_bad_input(api, fleet, body, field) -> None:
    before = written()
    response = api("ops").post(f"{API}/clusters/", body, format="json")
    assert response.status_code == 400, response.content
    assert response.json()["error"] == "invalid" and field in response.json()["fields"]
    assert written() == before


def test_cluster_update_and_overcommit_view(api, split) -> None:
    assert api("alice").patch(f"{API}/clusters/gpu-test/", {"overcommit_percent": 50}, format="json").status_code == 403
    response = api("ops").patch(f"{API}/clusters/gpu-test/", {"overcommit_percent": 50}, format="json")
    assert response.status_code == 200 and response.json()["overcommit_percent"] == 50
    rows = api("ops").get(f"{API}/clusters/gpu-test/overcommit/").json()["results"]
    h100 = next(r for r in rows if r["flavor"] == "h100-80gb")
    assert (h100["promised"], h100["capacity"], h100["allowed"], h100["percent_over"]) == ("12.000", "16.000", "24.000", "0.0")
    assert api("carol").get(f"{API}/clusters/gpu-test/overcommit/").status_code == 403
    response = api("ops").patch(f"{API}/clusters/gpu-test/", {"overcommit_percent": 0, "architecture": "B"}, format="json")
    assert response.status_code == 400 and "use_mig" in response.json()["fields"]


# Flavors -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("who, count", [("ops", 4), ("carol", 3), ("erin", 3), ("nobody", 3)])
def test_flavor_list(api, cast, fleet, who, count, django_assert_max_num_queries) -> None:
    services.flavor_deactivate(actor=cast.actor("ops"), flavor=fleet.hami)
    client = api(who)
    with django_assert_max_num_queries(8):
        rows = results(client.get(f"{API}/flavors/"))
    assert len(rows) == count
    h100 = next(r for r in rows if r["name"] == "h100-80gb")
    assert h100["cluster"] == "gpu-test" and h100["resource_names"] == [GPU]
    assert api(who).get(f"{API}/flavors/{fleet.hami.pk}/").status_code == (200 if who == "ops" else 404)


def test_flavor_filters_and_ordering(api, fleet) -> None:
    client = api("carol")
    assert [r["name"] for r in results(client.get(f"{API}/flavors/?kind=mig"))] == ["a100-80gb-mig-1g.10gb"]
    assert [r["name"] for r in results(client.get(f"{API}/flavors/?ordering=-order"))][0] == "cpu"
    assert results(client.get(f"{API}/flavors/?cluster=other")) == []
    page = client.get(f"{API}/flavors/?page_size=2").json()
    assert page["count"] == 4 and len(page["results"]) == 2 and page["next"]


def test_flavor_create(api, fleet) -> None:
    body = {"cluster": "gpu-test", "name": "a100-80gb-mig-3g.40gb", "kind": "mig", "gpu_model": "a100-80gb", "mig_profile": "3g.40gb",
            "node_labels": {"nvidia.com/mig.config": "all-3g.40gb"}}
    assert api("alice").post(f"{API}/flavors/", body, format="json").status_code == 403
    response = api("ops").post(f"{API}/flavors/", body, format="json")
    assert response.status_code == 201, response.content
    assert response.json()["resource_names"] == ["nvidia.com/mig-3g.40gb"]
    assert AuditEntry.objects.filter(action="flavor.create", target_repr="a100-80gb-mig-3g.40gb").exists()


@pytest.mark.parametrize(
    "changes, field, words",
    [
        ({"kind": "mig", "gpu_model": "a100-80gb", "mig_profile": "2g.10gb"}, "mig_profile", ["1g.10gb", "2g.20gb", "7g.80gb"]),
        ({"kind": "mig", "gpu_model": "a100-40gb", "mig_profile": "1g.10gb.me"}, "mig_profile", ["1g.5gb"]),
        ({"kind": "mig", "gpu_model": "t4", "mig_profile": "1g.10gb"}, "gpu_model", []),
        ({"kind": "hami", "hami_memory_mib": 4096}, "hami_cores_percent", []),
        ({"kind": "hami", "hami_memory_mib": 0, "hami_cores_percent": 20}, "hami_memory_mib", []),
        ({"kind": "hami", "hami_memory_mib": 4096, "hami_cores_percent": 101}, "hami_cores_percent", []),
        ({"kind": "quantum"}, "kind", []),
        ({"name": "UPPER"}, "name", []),
        ({"name": "h100-80gb"}, "name", []),
        ({"cluster": "no-such"}, "cluster", []),
        ({"hami_memory_mib": "lots"}, "hami_memory_mib", []),
        ({"colour": "red"}, "colour", []),
    ],
)
def test_flavor_create_bad_input(api, fleet, changes, field, words) -> None:
    body = {"cluster": "gpu-test", "name": "new-one", "kind": "whole", **changes}
    before = written()
    response = api("ops").post(f"{API}/flavors/", body, format="json")
    assert response.status_code == 400, response.content
    fields = response.json()["fields"]
    assert list(fields) == [field]
    assert all(word in fields[field][0] for word in words), fields
    assert written() == before


def test_flavor_update_and_deactivate(api, fleet) -> None:
    url = f"{API}/flavors/{fleet.h100.pk}/"
    assert api("ops").patch(url, {"display_name": "H100"}, format="json").json()["display_name"] == "H100"
    response = api("ops").patch(url, {"name": "renamed"}, format="json")
    assert response.status_code == 400 and "name" in response.json()["fields"]
    assert api("carol").patch(url, {"display_name": "x"}, format="json").status_code == 403
    assert api("carol").post(f"{url}deactivate/").status_code == 403
    response = api("ops").post(f"{url}deactivate/")
    assert response.status_code == 200 and response.json()["active"] is False
    assert api("carol").get(url).status_code == 404


# Quotas ------------------------------------------------------------------------------------------


def test_tenant_quota_upsert(api, cast, fleet) -> None:
    client = api("ops")
    response = client.post(f"{API}/quotas/", {"tenant": "acme", "flavor": "h100-80gb", "nominal": 8}, format="json")
    assert response.status_code == 201, response.content
    data = response.json()
    assert (data["tenant"], data["project"], data["flavor_name"], data["resource"], data["nominal"]) == ("acme", None, "h100-80gb", GPU, "8.000")
    response = client.post(f"{API}/quotas/", {"tenant": "acme", "flavor": fleet.h100.pk, "resource": GPU, "nominal": 10}, format="json")
    assert response.status_code == 200 and response.json()["id"] == data["id"] and response.json()["nominal"] == "10.000"
    assert AuditEntry.objects.filter(action="quota.set").count() == 2


def test_project_quota_upsert_and_limits(api, split) -> None:
    body = {"project": "acme-nlp", "flavor": "h100-80gb", "nominal": 3, "borrowing_limit": 2, "lending_limit": None}
    response = api("alice").post(f"{API}/quotas/", body, format="json")
    assert response.status_code == 201, response.content
    assert (response.json()["borrowing_limit"], response.json()["lending_limit"]) == ("2.000", None)


def test_quota_exceeded_is_409_with_numbers(api, split) -> None:
    before = written()
    response = api("alice").post(f"{API}/quotas/", {"project": "acme-nlp", "flavor": "h100-80gb", "nominal": 8}, format="json")
    assert response.status_code == 409
    assert response.json() == {
        "error": "quota_exceeded",
        "detail": "projects of acme would be promised 12 x nvidia.com/gpu in h100-80gb but the tenant has 8 (4 over)",
    }
    response = api("ops").post(f"{API}/quotas/", {"tenant": "globex", "flavor": "h100-80gb", "nominal": 9}, format="json")
    assert response.status_code == 409 and "but the cluster has 16 (1 over)" in response.json()["detail"]
    assert written() == before


@pytest.mark.parametrize(
    "body, field",
    [
        ({"project": "acme-nlp", "flavor": "h100-80gb", "nominal": -1}, "nominal"),
        ({"project": "acme-nlp", "flavor": "h100-80gb", "nominal": "four"}, "nominal"),
        ({"project": "acme-nlp", "flavor": "h100-80gb", "nominal": "1.5"}, "nominal"),
        ({"project": "acme-nlp", "flavor": "h100-80gb", "nominal": "0.0001"}, "nominal"),
        ({"project": "acme-nlp", "flavor": "h100-80gb"}, "nominal"),
        ({"project": "acme-nlp", "flavor": "h100-80gb", "nominal": 1, "borrowing_limit": -1}, "borrowing_limit"),
        ({"project": "acme-nlp", "flavor": "h100-80gb", "nominal": 1, "lending_limit": 2}, "lending_limit"),
        ({"project": "acme-nlp", "flavor": "no-such-flavor", "nominal": 1}, "flavor"),
        ({"project": "acme-nlp", "flavor": 999999, "nominal": 1}, "flavor"),
        ({"project": "acme-nlp", "flavor": "h100-80gb", "resource": MIG_1G, "nominal": 1}, "resource"),
        ({"project": "acme-nlp", "flavor": "h100-80gb", "resource": "cpu", "nominal": 1}, "resource"),
        ({"project": "no-such", "flavor": "h100-80gb", "nominal": 1}, "project"),
        ({"project": "globex-llm", "flavor": "h100-80gb", "nominal": 1}, "project"),  # another tenant's: not even named
        ({"flavor": "h100-80gb", "nominal": 1}, "project"),
        ({"tenant": "acme", "project": "acme-nlp", "flavor": "h100-80gb", "nominal": 1}, "project"),
        ({"project": "acme-nlp", "flavor": "h100-80gb", "nominal": 1, "priority": "high"}, "priority"),
    ],
)
def test_quota_bad_input_is_400_and_writes_nothing(api, split, body, field) -> None:
    before = written()
    response = api("alice").post(f"{API}/quotas/", body, format="json")
    assert response.status_code == 400, response.content
    assert response.json()["error"] == "invalid" and field in response.json()["fields"], response.json()
    assert written() == before


def test_borrowing_without_cohort_is_400(api, cast) -> None:
    plain = make_fleet("single-queue", architecture="A")
    services.quota_set(actor=cast.actor("ops"), tenant=cast.acme, flavor=plain.h100, resource=GPU, nominal=8)
    before = written()
    body = {"project": "acme-vision", "cluster": "single-queue", "flavor": "h100-80gb", "nominal": 2, "borrowing_limit": 1}
    response = api("alice").post(f"{API}/quotas/", body, format="json")
    assert response.status_code == 400 and "architecture A" in response.json()["fields"]["borrowing_limit"][0]
    assert written() == before


def test_ambiguous_flavor_name_needs_cluster(api, cast, split) -> None:
    make_fleet("second", architecture="B")
    response = api("ops").post(f"{API}/quotas/", {"tenant": "acme", "flavor": "h100-80gb", "nominal": 1}, format="json")
    assert response.status_code == 400 and "cluster" in response.json()["fields"]


@pytest.mark.parametrize(
    "who, expected",
    [
        ("ops", {"acme", "globex", "acme-vision", "globex-llm"}),
        ("alice", {"acme", "acme-vision"}),
        ("bob", {"acme-vision"}),
        ("carol", {"acme-vision"}),
        ("dave", {"acme-vision"}),
        ("erin", {"globex", "globex-llm"}),
        ("frank", {"globex-llm"}),
        ("nobody", set()),
    ],
)
def test_quota_list_is_scoped(api, split, who, expected, django_assert_max_num_queries) -> None:
    client = api(who)
    with django_assert_max_num_queries(8):
        rows = results(client.get(f"{API}/quotas/"))
    assert {r["project"] or r["tenant"] for r in rows} == expected


def test_quota_filters(api, cast, split) -> None:
    client = api("ops")
    assert {r["tenant"] for r in results(client.get(f"{API}/quotas/?tenant=acme"))} == {"acme"}
    assert [r["project"] for r in results(client.get(f"{API}/quotas/?project=acme-vision"))] == ["acme-vision"]
    assert {r["project"] for r in results(client.get(f"{API}/quotas/?level=tenant"))} == {None}
    assert len(results(client.get(f"{API}/quotas/?level=project&flavor={split.h100.pk}"))) == 2
    assert results(client.get(f"{API}/quotas/?flavor_name=cpu")) == []
    ordered = [r["nominal"] for r in results(client.get(f"{API}/quotas/?ordering=-nominal"))]
    assert ordered == ["8.000", "4.000", "4.000", "2.000"]
    # A filter on a foreign tenant reveals nothing.
    assert results(api("erin").get(f"{API}/quotas/?tenant=acme")) == []


def test_quota_detail_and_patch(api, cast, split) -> None:
    row = Quota.objects.get(project=cast.vision)
    url = f"{API}/quotas/{row.pk}/"
    assert api("carol").get(url).json()["nominal"] == "4.000"
    for who in ("erin", "frank", "nobody"):
        response = api(who).get(url)
        assert response.status_code == 404 and "acme" not in response.content.decode()
        assert api(who).patch(url, {"nominal": 1}, format="json").status_code == 404
    assert api("bob").patch(url, {"nominal": 1}, format="json").status_code == 403
    response = api("alice").patch(url, {"lending_limit": 2}, format="json")
    assert response.status_code == 200 and (response.json()["nominal"], response.json()["lending_limit"]) == ("4.000", "2.000")
    assert api("alice").patch(url, {"nominal": 9}, format="json").status_code == 409
    assert api("alice").patch(url, {"nominal": "x"}, format="json").status_code == 400


# Project quota summary ---------------------------------------------------------------------------


def test_project_quota_summary(api, cast, split) -> None:
    Quota.objects.filter(project=cast.vision).update(used=3, borrowed=0)
    response = api("carol").get(f"{API}/projects/acme-vision/quota/")
    assert response.status_code == 200
    assert response.json() == {
        "tenant": "acme", "project": "acme-vision",
        "quotas": [{
            "cluster": "gpu-test", "flavor": "h100-80gb", "flavor_id": split.h100.pk, "resource": GPU, "nominal": "4.000",
            "borrowing_limit": None, "lending_limit": None, "used": "3.000", "borrowed": "0.000", "free": "1.000",
                "usage_at": None, "usage_read_at": None,
            # Enforced (whole GPUs), but never reconciled: nothing on the cluster confirms the 4 yet.
            "enforced": True, "enforcement_reason": "", "confirmed_at": None, "cluster_nominal": None, "drift": True,
        }],
    }
    for who in ("erin", "frank", "nobody"):
        assert api(who).get(f"{API}/projects/acme-vision/quota/").status_code == 404
    assert api("carol").get(f"{API}/projects/acme-nlp/quota/").status_code == 404  # exists, but not hers
    assert api("alice").get(f"{API}/projects/acme-nlp/quota/").json()["quotas"] == []


def test_project_quota_summary_with_a_token(cast, split, token_client) -> None:
    client, _token = token_client("carol", cast.vision, "read")
    assert client.get(f"{API}/projects/acme-vision/quota/").json()["quotas"][0]["nominal"] == "4.000"
    assert client.get(f"{API}/projects/acme-nlp/quota/").status_code == 404


# Quota requests ----------------------------------------------------------------------------------


def test_request_create(api, split, mailoutbox) -> None:
    body = {"project": "acme-vision", "flavor": "h100-80gb", "amount": 2, "reason": "Paper deadline.",
            "until": (timezone.now() + timedelta(days=7)).isoformat()}
    response = api("carol").post(f"{API}/quota-requests/", body, format="json")
    assert response.status_code == 201, response.content
    data = response.json()
    assert (data["status"], data["approver"], data["resource"], data["requested_by"], data["amount"]) == (
        "pending", "project_admin", GPU, "carol", "2.000")
    assert QuotaRequest.objects.get(pk=data["id"]).requested_by.username == "carol"


@pytest.mark.parametrize(
    "changes, field",
    [
        ({"amount": 0}, "amount"),
        ({"amount": -1}, "amount"),
        ({"amount": "some"}, "amount"),
        ({"amount": "1.5"}, "amount"),
        ({"until": "2001-01-01T00:00:00Z"}, "until"),
        ({"until": "next week"}, "until"),
        ({"reason": ""}, "reason"),
        ({"flavor": "tpu-v5"}, "flavor"),
        ({"resource": "memory"}, "resource"),
        ({"project": "globex-llm"}, "project"),
        ({"approver": "ops"}, "approver"),
    ],
)
def test_request_bad_input(api, split, changes, field) -> None:
    body = {"project": "acme-vision", "flavor": "h100-80gb", "amount": 2, "reason": "Paper deadline.", **changes}
    before = written()
    response = api("carol").post(f"{API}/quota-requests/", body, format="json")
    assert response.status_code == 400, response.content
    assert field in response.json()["fields"]
    assert written() == before


def test_request_list_scoped_and_inbox(api, cast, split, django_assert_max_num_queries) -> None:
    mine = ask(cast, split, 2)
    big = ask(cast, split, 6)
    bobs = ask(cast, split, 1, who="bob")
    foreign = ask(cast, split, 1, who="frank", project=cast.llm)

    def listed(who: str, query: str = "") -> set[int]:
        client = api(who)
        with django_assert_max_num_queries(10):
            return {r["id"] for r in results(client.get(f"{API}/quota-requests/{query}"))}

    assert listed("carol") == {mine.pk, big.pk}
    assert listed("bob") == {mine.pk, big.pk, bobs.pk}
    assert listed("bob", "?inbox=true") == {mine.pk}  # not his own, not the tenant-admin one
    assert listed("alice", "?inbox=true") == {mine.pk, big.pk, bobs.pk}
    assert listed("ops") == {mine.pk, big.pk, bobs.pk, foreign.pk}
    assert listed("erin") == {foreign.pk}
    assert listed("dave") == set()
    assert listed("carol", "?mine=true&status=pending") == {mine.pk, big.pk}
    assert listed("alice", "?approver=tenant_admin") == {big.pk}
    for who in ("erin", "frank", "nobody", "dave"):
        assert api(who).get(f"{API}/quota-requests/{mine.pk}/").status_code == 404


@pytest.mark.parametrize(
    "who, status", [("bob", 200), ("alice", 200), ("ops", 200), ("carol", 403), ("dave", 404), ("erin", 404), ("nobody", 404)]
)
def test_request_approve_matrix(api, cast, split, who, status) -> None:
    request = ask(cast, split, 3)
    response = api(who).post(f"{API}/quota-requests/{request.pk}/approve/", {"comment": "ok"}, format="json")
    assert response.status_code == status, response.content
    expected = 7 if status == 200 else 4
    assert Quota.objects.get(project=cast.vision).nominal == expected
    if status == 200:
        assert response.json()["status"] == "approved" and response.json()["applied"]["project"]["added"] == "3"


def test_second_approver_gets_409(api, cast, split) -> None:
    request = ask(cast, split, 3)
    assert api("bob").post(f"{API}/quota-requests/{request.pk}/approve/", {}, format="json").status_code == 200
    response = api("alice").post(f"{API}/quota-requests/{request.pk}/approve/", {"comment": "me too"}, format="json")
    assert response.status_code == 409 and response.json()["error"] == "already_decided"
    assert Quota.objects.get(project=cast.vision).nominal == 7


def test_request_reject_and_cancel(api, cast, split) -> None:
    request = ask(cast, split, 2)
    url = f"{API}/quota-requests/{request.pk}"
    response = api("bob").post(f"{url}/reject/", {}, format="json")
    assert response.status_code == 400 and "comment" in response.json()["fields"]
    assert api("bob").post(f"{url}/reject/", {"comment": "x", "extra": 1}, format="json").status_code == 400
    assert api("bob").post(f"{url}/cancel/").status_code == 403
    response = api("bob").post(f"{url}/reject/", {"comment": "Next month."}, format="json")
    assert response.status_code == 200 and response.json()["status"] == "rejected"
    assert api("carol").post(f"{url}/cancel/").status_code == 409
    other = ask(cast, split, 1)
    response = api("carol").post(f"{API}/quota-requests/{other.pk}/cancel/")
    assert response.status_code == 200 and response.json()["status"] == "cancelled"


def test_tokens_ask_but_never_decide(cast, split, token_client) -> None:
    client, _token = token_client("alice", cast.vision, "read+submit")
    response = client.post(f"{API}/quota-requests/", {"project": "acme-vision", "flavor": "h100-80gb", "amount": 1, "reason": "CI"}, format="json")
    assert response.status_code == 201, response.content
    response = client.post(f"{API}/quota-requests/{response.json()['id']}/approve/", {}, format="json")
    assert response.status_code == 403
    assert client.post(f"{API}/quotas/", {"project": "acme-vision", "flavor": "h100-80gb", "nominal": 1}, format="json").status_code == 403


# The role x action matrix ----------------------------------------------------------------------------

ACTIONS = ["cluster.create", "flavor.create", "quota.tenant", "quota.project", "request.create", "request.approve", "summary"]
MATRIX = {
    #          cluster flavor  tenant-q project-q ask  approve summary
    "ops":    (201,    201,    200,     200,      201, 200,    200),
    "alice":  (403,    403,    403,     200,      201, 200,    200),
    "bob":    (403,    403,    403,     403,      201, 200,    200),
    "carol":  (403,    403,    403,     403,      201, 403,    200),
    "dave":   (403,    403,    403,     403,      403, 404,    200),
    "erin":   (403,    403,    400,     400,      400, 404,    404),
    "nobody": (403,    403,    400,     400,      400, 404,    404),
}


def _call(client, cast, fleet, action: str):
    if action == "cluster.create":
        return client.post(f"{API}/clusters/", {"name": "another"}, format="json")
    if action == "flavor.create":
        return client.post(f"{API}/flavors/", {"cluster": "gpu-test", "name": "new-one", "kind": "whole"}, format="json")
    if action == "quota.tenant":
        return client.post(f"{API}/quotas/", {"tenant": "acme", "flavor": "h100-80gb", "nominal": 9}, format="json")
    if action == "quota.project":
        return client.post(f"{API}/quotas/", {"project": "acme-vision", "flavor": "h100-80gb", "nominal": 5}, format="json")
    if action == "request.create":
        body = {"project": "acme-vision", "flavor": "h100-80gb", "amount": 1, "reason": "why"}
        return client.post(f"{API}/quota-requests/", body, format="json")
    if action == "request.approve":
        request = ask(cast, fleet, 1)
        return client.post(f"{API}/quota-requests/{request.pk}/approve/", {}, format="json")
    return client.get(f"{API}/projects/acme-vision/quota/")


@pytest.mark.parametrize("who", list(MATRIX))
@pytest.mark.parametrize("action", ACTIONS)
def test_role_action_matrix(api, cast, split, who, action) -> None:
    response = _call(api(who), cast, split, action)
    assert response.status_code == MATRIX[who][ACTIONS.index(action)], response.content


def test_cluster_sync_on_demand_queues_inventory_then_reconcile(api, fleet, django_capture_on_commit_callbacks) -> None:
    from celery.signals import before_task_publish

    published: list[str] = []

    def record(sender=None, **kwargs) -> None:
        published.append(sender)

    before_task_publish.connect(record, weak=False)
    try:
        assert api("alice").post(f"{API}/clusters/{fleet.cluster.pk}/sync/").status_code == 403
        with django_capture_on_commit_callbacks(execute=True):
            response = api("ops").post(f"{API}/clusters/{fleet.cluster.pk}/sync/")
    finally:
        before_task_publish.disconnect(record)
    assert response.status_code == 202
    assert published == ["quotas.inventory_sync"]  # the reconcile follows it in the chain
    assert AuditEntry.objects.filter(action="cluster.sync", target_id=str(fleet.cluster.pk)).count() == 1
