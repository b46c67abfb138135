"""Quota services: flavors and clusters, the two invariants with their messages, the approver
routing of quota requests, approval, revert at ``until``, audit entries and notifications."""

from __future__ import annotations

import json
import threading
from datetime import timedelta
from decimal import Decimal
from http.server import BaseHTTPRequestHandler, HTTPServer

import pytest
from django.utils import timezone

from portal import events
from portal.exceptions import ConflictError, Invalid, NotAllowed, PortalError, ReadOnlyTenant
from quotas import jobs, policy, selectors, services
from quotas.capacity import capacity_by_flavor
from quotas.events import reconcile_queue
from quotas.exceptions import AlreadyDecided, QuotaExceeded
from quotas.mig import MIG_PROFILES, validate_mig_profile
from quotas.models import Cluster, Flavor, Node, Quota, QuotaRequest
from tenants.access import Actor
from tenants.models import AuditEntry, Tenant
from tenants.services import project_update, tenant_update

from .factories import GPU, MIG_1G, D, make_cluster, make_fleet

pytestmark = pytest.mark.django_db

Approver = QuotaRequest.Approver


def nominal(fleet, *, tenant=None, project=None, flavor=None, resource=GPU) -> Decimal:
    flavor = flavor or fleet.h100
    rows = Quota.objects.filter(flavor=flavor, resource=resource)
    rows = rows.filter(project=project) if project else rows.filter(tenant=tenant, project__isnull=True)
    row = rows.first()
    return row.nominal if row else Decimal(0)


def tenant_quota(cast, fleet, tenant, amount, flavor=None, resource=GPU):
    return services.quota_set(actor=cast.actor("ops"), tenant=tenant, flavor=flavor or fleet.h100, resource=resource, nominal=amount)


def project_quota(cast, fleet, project, amount, who="alice", **limits):
    return services.quota_set(actor=cast.actor(who), project=project, flavor=fleet.h100, resource=GPU, nominal=amount, **limits)


def counts() -> tuple[int, int, int]:
    return Quota.objects.count(), AuditEntry.objects.count(), QuotaRequest.objects.count()


# The fixture cluster and the MIG table -----------------------------------------------------------


def test_fixture_capacity_counts_only_ready_nodes(fleet) -> None:
    capacity = capacity_by_flavor(fleet.cluster)
    assert capacity[(fleet.h100.pk, GPU)] == 16  # the NotReady third node does not count
    assert capacity[(fleet.mig.pk, MIG_1G)] == 56
    assert capacity[(fleet.hami.pk, GPU)] == 40
    assert fleet.hami.resource_names == [GPU, "nvidia.com/total-gpucores", "nvidia.com/total-gpumem"]


@pytest.mark.parametrize(
    "model, profile, expected",
    [
        ("a100-80gb", "1g.10gb", "1g.10gb"),
        ("h100-80gb", "1g.10gb+me", "1g.10gb.me"),
        ("a100-40gb", "3g.20gb", "3g.20gb"),
        ("a30-24gb", "4g.24gb", "4g.24gb"),
        ("h200-141gb", "7g.141gb", "7g.141gb"),
        ("b200", "1g.23gb", "1g.23gb"),
    ],
)
def test_mig_profile_table_accepts_real_profiles(model, profile, expected) -> None:
    assert validate_mig_profile(model, profile) == expected


@pytest.mark.parametrize(
    "model, profile, field",
    [("a100-40gb", "1g.10gb.me", "mig_profile"), ("a30-24gb", "7g.80gb", "mig_profile"), ("a100-80gb", "1g.5gb", "mig_profile"),
     ("h100-80gb", "", "mig_profile"), ("v100-16gb", "1g.5gb", "gpu_model")],
)
def test_mig_profile_table_rejects_others(model, profile, field) -> None:
    with pytest.raises(Invalid) as caught:
        validate_mig_profile(model, profile)
    assert caught.value.field == field
    if field == "mig_profile":
        assert all(name in caught.value.message for name in MIG_PROFILES[model])


# Clusters ----------------------------------------------------------------------------------------


def test_cluster_create_is_ops_only_and_audited(cast) -> None:
    with pytest.raises(NotAllowed):
        services.cluster_create(actor=cast.actor("alice"), name="mine")
    cluster = services.cluster_create(actor=cast.actor("ops"), name="prod-1", architecture="C", use_mig=True, overcommit_percent=10)
    entry = AuditEntry.objects.get(action="cluster.create")
    assert entry.actor_label == "ops" and entry.after["architecture"] == "C" and entry.after["overcommit_percent"] == 10
    assert cluster.use_mig and not cluster.kubeconfig_encrypted


@pytest.mark.parametrize(
    "values, field",
    [
        ({"name": "Bad_Name"}, "name"),
        ({"name": "gpu-test"}, "name"),  # taken
        ({"name": "x", "architecture": "G"}, "architecture"),
        ({"name": "x", "architecture": "B", "use_mig": True}, "use_mig"),
        ({"name": "x", "architecture": "C", "use_hami": True}, "use_hami"),
        ({"name": "x", "overcommit_percent": 5000}, "overcommit_percent"),
        ({"name": "x", "kubeconfig": "just: text"}, "kubeconfig"),
        ({"name": "x", "kubeconfig": "{{{"}, "kubeconfig"),
        ({"name": "x", "kubeconfig_path": "relative/kubeconfig"}, "kubeconfig_path"),
    ],
)
def test_cluster_create_bad_input(cast, fleet, values, field) -> None:
    before = (Cluster.objects.count(), AuditEntry.objects.count())
    with pytest.raises((PortalError, Exception)) as caught:
        services.cluster_create(actor=cast.actor("ops"), **values)
    error = caught.value
    fields = [error.field] if isinstance(error, PortalError) else list(error.message_dict)
    assert field in fields
    assert (Cluster.objects.count(), AuditEntry.objects.count()) == before


def test_kubeconfig_is_stored_encrypted(cast) -> None:
    from portal.crypto import decrypt

    text = "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster: {server: 'https://10.0.0.1:6443'}\n"
    cluster = services.cluster_create(actor=cast.actor("ops"), name="enc", kubeconfig=text)
    assert "10.0.0.1" not in cluster.kubeconfig_encrypted
    assert decrypt(Cluster.objects.get(pk=cluster.pk).kubeconfig_encrypted) == text
    assert "10.0.0.1" not in json.dumps(AuditEntry.objects.get(action="cluster.create").after)
    services.cluster_set_kubeconfig(actor=cast.actor("ops"), cluster=cluster, kubeconfig="")
    assert Cluster.objects.get(pk=cluster.pk).kubeconfig_encrypted == ""


def test_cluster_update_guards(cast, fleet) -> None:
    ops = cast.actor("ops")
    with pytest.raises(Invalid) as caught:
        services.cluster_update(actor=ops, cluster=fleet.cluster, use_mig=False)
    assert caught.value.field == "use_mig"  # its MIG flavor is still active
    project_quota_with_limits = None
    tenant_quota(cast, fleet, cast.acme, 8)
    project_quota_with_limits = project_quota(cast, fleet, cast.vision, 4, borrowing_limit=2)
    assert project_quota_with_limits.borrowing_limit == 2
    services.flavor_deactivate(actor=ops, flavor=fleet.mig)
    services.flavor_deactivate(actor=ops, flavor=fleet.hami)
    with pytest.raises(Invalid) as caught:
        services.cluster_update(actor=ops, cluster=fleet.cluster, architecture="A", use_mig=False, use_hami=False)
    assert caught.value.field == "architecture"
    assert Cluster.objects.get(pk=fleet.cluster.pk).architecture == "E"


def test_lowering_overcommit_below_promises_is_refused(cast, fleet) -> None:
    ops = cast.actor("ops")
    services.cluster_update(actor=ops, cluster=fleet.cluster, overcommit_percent=50)
    tenant_quota(cast, fleet, cast.acme, 20)
    with pytest.raises(QuotaExceeded) as caught:
        services.cluster_update(actor=ops, cluster=fleet.cluster, overcommit_percent=10)
    assert "promised 20 x nvidia.com/gpu in h100-80gb but 10% overcommit allows 17.6 (2.4 over)" in caught.value.message
    services.cluster_update(actor=ops, cluster=fleet.cluster, overcommit_percent=25)  # allows exactly 20
    assert Cluster.objects.get(pk=fleet.cluster.pk).overcommit_percent == 25


# Flavors -----------------------------------------------------------------------------------------


def flavor_kwargs(**overrides):
    return {"name": "new-flavor", "kind": "whole", **overrides}


@pytest.mark.parametrize(
    "values, field, words",
    [
        (flavor_kwargs(kind="mig", gpu_model="a100-80gb", mig_profile="1g.5gb"), "mig_profile", ["1g.10gb", "3g.40gb", "7g.80gb"]),
        (flavor_kwargs(kind="mig", gpu_model="a30-24gb", mig_profile="3g.40gb"), "mig_profile", ["1g.6gb", "4g.24gb"]),
        (flavor_kwargs(kind="mig", gpu_model="rtx-4090", mig_profile="1g.10gb"), "gpu_model", ["a100-80gb"]),
        (flavor_kwargs(kind="whole", mig_profile="1g.10gb"), "mig_profile", []),
        (flavor_kwargs(kind="hami"), "hami_memory_mib", []),
        (flavor_kwargs(kind="hami", hami_memory_mib=4096), "hami_cores_percent", []),
        (flavor_kwargs(kind="hami", hami_memory_mib=4096, hami_cores_percent=150), "hami_cores_percent", []),
        (flavor_kwargs(kind="whole", hami_memory_mib=4096), "hami_memory_mib", []),
        (flavor_kwargs(kind="tpu"), "kind", ["whole", "mig", "hami", "cpu"]),
        (flavor_kwargs(name="Bad_Name"), "name", []),
        (flavor_kwargs(name="-edge"), "name", []),
        (flavor_kwargs(name="h100-80gb"), "name", ["already"]),
        (flavor_kwargs(pool_label="sideways"), "pool_label", []),
        (flavor_kwargs(node_labels={"bad key!": "x"}), "node_labels", []),
        (flavor_kwargs(node_labels=["not", "a", "dict"]), "node_labels", []),
        (flavor_kwargs(taints=[{"key": "k", "effect": "Sometimes"}]), "taints", []),
        (flavor_kwargs(tolerations=[{"key": "k", "operator": "Maybe"}]), "tolerations", []),
    ],
)
def test_flavor_validation(cast, fleet, values, field, words) -> None:
    before = (Flavor.objects.count(), AuditEntry.objects.count())
    with pytest.raises(Exception) as caught:
        services.flavor_create(actor=cast.actor("ops"), cluster=fleet.cluster, **values)
    error = caught.value
    fields = [error.field] if isinstance(error, PortalError) else list(error.message_dict)
    assert fields == [field]
    text = error.message if isinstance(error, PortalError) else str(error.message_dict)
    assert all(word in text for word in words), text
    assert (Flavor.objects.count(), AuditEntry.objects.count()) == before


def test_flavor_kinds_need_the_cluster_to_offer_them(cast) -> None:
    cluster = make_cluster("plain", architecture="B")
    for kind, extra in (("mig", {"gpu_model": "a100-80gb", "mig_profile": "1g.10gb"}), ("hami", {"hami_memory_mib": 1, "hami_cores_percent": 10})):
        with pytest.raises(Invalid) as caught:
            services.flavor_create(actor=cast.actor("ops"), cluster=cluster, name=f"x-{kind}", kind=kind, **extra)
        assert caught.value.field == "kind"


def test_flavor_ops_only_and_fixed_identity(cast, fleet) -> None:
    with pytest.raises(NotAllowed):
        services.flavor_create(actor=cast.actor("alice"), cluster=fleet.cluster, name="x", kind="whole")
    with pytest.raises(NotAllowed):
        services.flavor_deactivate(actor=cast.actor("alice"), flavor=fleet.h100)
    ops = cast.actor("ops")
    for field, value in (("name", "renamed"), ("kind", "cpu")):
        with pytest.raises(Invalid) as caught:
            services.flavor_update(actor=ops, flavor=fleet.h100, **{field: value})
        assert caught.value.field == field
    services.quota_set(actor=ops, tenant=cast.acme, flavor=fleet.mig, resource=MIG_1G, nominal=7)
    with pytest.raises(Invalid) as caught:
        services.flavor_update(actor=ops, flavor=fleet.mig, mig_profile="2g.20gb")
    assert caught.value.field == "mig_profile"
    updated = services.flavor_update(actor=ops, flavor=fleet.h100, display_name="H100 80 GB", order=5)
    assert updated.display_name == "H100 80 GB"
    assert AuditEntry.objects.filter(action="flavor.update", target_id=str(fleet.h100.pk)).count() == 1


def test_deactivated_flavor_takes_no_new_quota(cast, fleet) -> None:
    services.flavor_deactivate(actor=cast.actor("ops"), flavor=fleet.h100)
    assert AuditEntry.objects.filter(action="flavor.deactivate").count() == 1
    assert not selectors.flavors_for(actor=cast.actor("carol")).filter(pk=fleet.h100.pk).exists()
    assert selectors.flavors_for(actor=cast.actor("ops")).filter(pk=fleet.h100.pk).exists()
    with pytest.raises(Invalid) as caught:
        tenant_quota(cast, fleet, cast.acme, 1)
    assert caught.value.field == "flavor"


# Quotas: the two invariants ----------------------------------------------------------------------


def test_tenants_fit_in_capacity_with_explicit_overcommit(cast, fleet) -> None:
    tenant_quota(cast, fleet, cast.acme, 10)
    with pytest.raises(QuotaExceeded) as caught:
        tenant_quota(cast, fleet, cast.globex, 7)
    assert str(caught.value) == (
        "tenants of cluster gpu-test would be promised 17 x nvidia.com/gpu in h100-80gb but the cluster has 16 (1 over)"
    )
    assert caught.value.constraint == "cluster" and caught.value.over == 1
    assert nominal(fleet, tenant=cast.globex) == 0 and not Quota.objects.filter(tenant=cast.globex).exists()
    services.cluster_update(actor=cast.actor("ops"), cluster=fleet.cluster, overcommit_percent=25)
    tenant_quota(cast, fleet, cast.globex, 10)  # 20 = 16 + 25%
    with pytest.raises(QuotaExceeded) as caught:
        tenant_quota(cast, fleet, cast.globex, 11)
    assert "but the cluster allows 20 (16 with 25% overcommit) (1 over)" in str(caught.value)


def test_projects_fit_in_their_tenant(cast, fleet) -> None:
    tenant_quota(cast, fleet, cast.acme, 8)
    project_quota(cast, fleet, cast.vision, 5)
    project_quota(cast, fleet, cast.nlp, 3)
    with pytest.raises(QuotaExceeded) as caught:
        project_quota(cast, fleet, cast.nlp, 7)
    assert str(caught.value) == "projects of acme would be promised 12 x nvidia.com/gpu in h100-80gb but the tenant has 8 (4 over)"
    assert caught.value.constraint == "tenant" and caught.value.over == 4
    assert nominal(fleet, project=cast.nlp) == 3
    project_quota(cast, fleet, cast.vision, 1)  # lowering is always fine
    project_quota(cast, fleet, cast.nlp, 7)


def test_tenant_quota_cannot_drop_below_its_projects(cast, fleet) -> None:
    tenant_quota(cast, fleet, cast.acme, 8)
    project_quota(cast, fleet, cast.vision, 6)
    with pytest.raises(QuotaExceeded) as caught:
        tenant_quota(cast, fleet, cast.acme, 4)
    assert "projects of acme are promised 6 x nvidia.com/gpu in h100-80gb but the tenant would have 4 (2 over)" in str(caught.value)
    assert caught.value.constraint == "projects"
    tenant_quota(cast, fleet, cast.acme, 6)


def test_project_quota_without_tenant_quota_is_refused_and_writes_nothing(cast, fleet) -> None:
    before = counts()
    with pytest.raises(QuotaExceeded) as caught:
        project_quota(cast, fleet, cast.vision, 1)
    assert "but the tenant has 0 (1 over)" in str(caught.value)
    assert counts() == before  # not even the tenant's zero row


def test_capacity_loss_allows_lowering_and_shows_overcommit(cast, fleet) -> None:
    tenant_quota(cast, fleet, cast.acme, 10)
    tenant_quota(cast, fleet, cast.globex, 6)
    Node.objects.filter(name="gpu-h100-1").update(ready=False)  # capacity drops to 8
    rows = {(r["flavor"], r["resource"]): r for r in selectors.overcommit_for(cluster=fleet.cluster)}
    h100 = rows[("h100-80gb", GPU)]
    assert (h100["promised"], h100["capacity"], h100["over"], h100["percent_over"], h100["within_limit"]) == (16, 8, 8, Decimal("100.0"), False)
    assert rows[("cpu", "cpu")]["promised"] == 0 and rows[("cpu", "cpu")]["percent_over"] == 0
    tenant_quota(cast, fleet, cast.acme, 9)  # lowering works although still over
    with pytest.raises(QuotaExceeded):
        tenant_quota(cast, fleet, cast.globex, 7)  # raising does not


def test_overcommit_for_reports_percent(cast, fleet) -> None:
    cluster = services.cluster_update(actor=cast.actor("ops"), cluster=fleet.cluster, overcommit_percent=50)
    tenant_quota(cast, fleet, cast.acme, 12)
    tenant_quota(cast, fleet, cast.globex, 8)
    row = next(r for r in selectors.overcommit_for(cluster=cluster) if r["flavor"] == "h100-80gb")
    assert row == {
        "flavor": "h100-80gb", "flavor_id": fleet.h100.pk, "resource": GPU, "promised": 20, "capacity": 16, "over": 4,
        "percent_over": Decimal("25.0"), "allowed": 24, "within_limit": True,
    }


# Quotas: who, what, and bad input ----------------------------------------------------------------


@pytest.mark.parametrize("who, allowed", [("ops", True), ("alice", False), ("bob", False), ("carol", False), ("erin", False), ("nobody", False)])
def test_tenant_quota_is_set_by_ops_only(cast, fleet, who, allowed) -> None:
    call = lambda: services.quota_set(actor=cast.actor(who), tenant=cast.acme, flavor=fleet.h100, resource=GPU, nominal=4)
    if allowed:
        assert call().nominal == 4
    else:
        with pytest.raises(NotAllowed):
            call()


@pytest.mark.parametrize(
    "who, allowed", [("ops", True), ("alice", True), ("bob", False), ("carol", False), ("dave", False), ("erin", False), ("nobody", False)]
)
def test_project_quota_is_set_by_tenant_admins_and_ops(cast, fleet, who, allowed) -> None:
    tenant_quota(cast, fleet, cast.acme, 8)
    if allowed:
        assert project_quota(cast, fleet, cast.vision, 4, who=who).nominal == 4
    else:
        with pytest.raises(NotAllowed):
            project_quota(cast, fleet, cast.vision, 4, who=who)


def test_project_token_cannot_set_quota(cast, fleet, token_client) -> None:
    tenant_quota(cast, fleet, cast.acme, 8)
    _client, token = token_client("alice", cast.vision, "read+submit")
    with pytest.raises(NotAllowed):
        services.quota_set(actor=Actor(user=cast.alice, token=token), project=cast.vision, flavor=fleet.h100, resource=GPU, nominal=1)


@pytest.mark.parametrize(
    "changes, field",
    [
        ({"nominal": -1}, "nominal"),
        ({"nominal": "four"}, "nominal"),
        ({"nominal": "NaN"}, "nominal"),
        ({"nominal": "Infinity"}, "nominal"),
        ({"nominal": True}, "nominal"),
        ({"nominal": None}, "nominal"),
        ({"nominal": "1.5"}, "nominal"),  # GPUs are whole
        ({"nominal": "1e20"}, "nominal"),
        ({"nominal": 2, "borrowing_limit": -1}, "borrowing_limit"),
        ({"nominal": 2, "lending_limit": "x"}, "lending_limit"),
        ({"nominal": 2, "lending_limit": 3}, "lending_limit"),
        ({"nominal": 2, "resource": "nvidia.com/mig-1g.10gb"}, "resource"),
        ({"nominal": 2, "resource": ""}, "resource"),
    ],
)
def test_project_quota_bad_input_writes_nothing(cast, fleet, changes, field) -> None:
    tenant_quota(cast, fleet, cast.acme, 8)
    before = counts()
    values = {"resource": GPU, **changes}
    with pytest.raises(Invalid) as caught:
        services.quota_set(actor=cast.actor("alice"), project=cast.vision, flavor=fleet.h100, **values)
    assert caught.value.field == field
    assert counts() == before


def test_cpu_quota_takes_fractions_but_not_four_places(cast, fleet) -> None:
    ops = cast.actor("ops")
    assert services.quota_set(actor=ops, tenant=cast.acme, flavor=fleet.cpu, resource="cpu", nominal="12.5").nominal == D("12.5")
    with pytest.raises(Invalid) as caught:
        services.quota_set(actor=ops, tenant=cast.acme, flavor=fleet.cpu, resource="memory", nominal="0.0001")
    assert caught.value.field == "nominal"


def test_limits_need_a_cohort(cast, fleet) -> None:
    ops = cast.actor("ops")
    with pytest.raises(Invalid) as caught:  # a tenant's cohort has no parent to borrow from
        services.quota_set(actor=ops, tenant=cast.acme, flavor=fleet.h100, resource=GPU, nominal=8, borrowing_limit=2)
    assert caught.value.field == "borrowing_limit"
    tenant_quota(cast, fleet, cast.acme, 8)
    row = project_quota(cast, fleet, cast.vision, 4, borrowing_limit=4, lending_limit=2)
    assert (row.borrowing_limit, row.lending_limit) == (4, 2)
    # Architecture A: one queue, no cohorts at all.
    plain = make_fleet("single-queue", architecture="A")
    services.quota_set(actor=ops, tenant=cast.acme, flavor=plain.h100, resource=GPU, nominal=8)
    before = counts()
    for field in ("borrowing_limit", "lending_limit"):
        with pytest.raises(Invalid) as caught:
            services.quota_set(actor=cast.actor("alice"), project=cast.vision, flavor=plain.h100, resource=GPU, nominal=2, **{field: 1})
        assert caught.value.field == field and "architecture A" in caught.value.message
    assert counts() == before


def test_suspended_tenant_cannot_change_its_split(cast, fleet) -> None:
    tenant_quota(cast, fleet, cast.acme, 8)
    tenant_update(actor=cast.actor("ops"), tenant=cast.acme, status=Tenant.Status.SUSPENDED)
    with pytest.raises(ReadOnlyTenant):
        project_quota(cast, fleet, cast.vision, 2)
    project_quota(cast, fleet, cast.vision, 2, who="ops")


def test_quota_change_is_audited_and_schedules_one_reconcile(cast, fleet) -> None:
    other = make_cluster("other")
    tenant_quota(cast, fleet, cast.acme, 8)
    project_quota(cast, fleet, cast.vision, 4, borrowing_limit=2)
    # Everything here runs in the test's one transaction: one reconcile per cluster covers it all.
    pending = [handler.args for handler in events.pending() if handler.fn is reconcile_queue]
    assert pending == [(fleet.cluster.pk,), (other.pk,)]
    entry = AuditEntry.objects.filter(action="quota.set", project=cast.vision).get()
    assert entry.actor_label == "alice" and entry.tenant_id == cast.acme.pk
    assert entry.before["nominal"] == "0" and entry.after == {
        "tenant": "acme", "project": "acme-vision", "cluster": "gpu-test", "flavor": "h100-80gb", "resource": GPU,
        "nominal": "4", "borrowing_limit": "2", "lending_limit": None,
    }
    # Setting the same numbers again changes nothing: no audit entry.
    project_quota(cast, fleet, cast.vision, 4, borrowing_limit=2)
    assert AuditEntry.objects.filter(action="quota.set", project=cast.vision).count() == 1


def test_quota_selectors_are_scoped(cast, fleet) -> None:
    tenant_quota(cast, fleet, cast.acme, 8)
    tenant_quota(cast, fleet, cast.globex, 4)
    project_quota(cast, fleet, cast.vision, 4)
    project_quota(cast, fleet, cast.nlp, 2)
    project_quota(cast, fleet, cast.llm, 3, who="erin")

    def seen(who: str) -> set[str]:
        return {f"{q.project.slug if q.project else q.tenant.slug}" for q in selectors.quotas_for(actor=cast.actor(who))}

    assert seen("ops") == {"acme", "globex", "acme-vision", "acme-nlp", "globex-llm"}
    assert seen("alice") == {"acme", "acme-vision", "acme-nlp"}
    assert seen("bob") == seen("carol") == seen("dave") == {"acme-vision"}
    assert seen("erin") == {"globex", "globex-llm"}
    assert seen("frank") == {"globex-llm"}
    assert seen("nobody") == set()


def test_project_quota_summary(cast, fleet) -> None:
    tenant_quota(cast, fleet, cast.acme, 8)
    project_quota(cast, fleet, cast.vision, 4, borrowing_limit=2)
    Quota.objects.filter(project=cast.vision).update(used=5, borrowed=1)
    services.quota_set(actor=cast.actor("ops"), tenant=cast.acme, flavor=fleet.cpu, resource="cpu", nominal=64)
    services.quota_set(actor=cast.actor("alice"), project=cast.vision, flavor=fleet.cpu, resource="cpu", nominal="16.5")
    Quota.objects.filter(project=cast.vision, resource="cpu").update(used=4)
    summary = selectors.project_quota_summary(project=cast.vision)
    assert [(r["flavor"], r["resource"], r["nominal"], r["used"], r["borrowed"], r["free"]) for r in summary] == [
        ("h100-80gb", GPU, 4, 5, 1, 0),
        ("cpu", "cpu", D("16.5"), 4, 0, D("12.5")),
    ]
    assert summary[0]["borrowing_limit"] == 2 and summary[0]["lending_limit"] is None


# Quota requests: routing, approval, revert ---------------------------------------------------------


def ask(cast, fleet, amount, *, who="carol", until=None, project=None):
    return services.quota_request_create(
        actor=cast.actor(who), project=project or cast.vision, flavor=fleet.h100, resource=GPU, amount=amount,
        reason="Training run for the paper.", until=until,
    )


@pytest.fixture
def split(cast, fleet):
    """acme has 8 GPUs of 16; vision 4 of them, so 4 are unassigned and 8 unpromised in the cluster."""
    tenant_quota(cast, fleet, cast.acme, 8)
    project_quota(cast, fleet, cast.vision, 4)
    return fleet


@pytest.mark.parametrize("amount, approver", [(1, Approver.PROJECT_ADMIN), (4, Approver.PROJECT_ADMIN),
                                              (5, Approver.TENANT_ADMIN), (12, Approver.TENANT_ADMIN)])
def test_request_goes_to_who_owns_the_headroom(cast, split, amount, approver) -> None:
    request = ask(cast, split, amount)
    assert (request.approver, request.status) == (approver, QuotaRequest.Status.PENDING)
    assert AuditEntry.objects.get(action="quota_request.create").after["approver"] == approver


def test_beyond_what_the_tenants_may_be_promised_goes_to_ops(cast, split) -> None:
    """globex is promised 4 more: 4 unassigned in acme + 4 unpromised = 8; a 9th needs ops (the cluster
    still has room for the project: 4 + 9 of 16)."""
    tenant_quota(cast, split, cast.globex, 4)
    request = ask(cast, split, 9)
    assert request.approver == Approver.OPS


def test_never_more_than_the_cluster_has(cast, split) -> None:
    with pytest.raises(Invalid, match="at most 12 more"):
        ask(cast, split, 13)
    assert not QuotaRequest.objects.exists()


@pytest.mark.parametrize("who, allowed", [("carol", True), ("bob", True), ("alice", True), ("ops", True), ("dave", False), ("erin", False), ("nobody", False)])
def test_who_may_ask(cast, split, who, allowed) -> None:
    if allowed:
        assert ask(cast, split, 1, who=who).requested_by == getattr(cast, who)
    else:
        with pytest.raises(NotAllowed):
            ask(cast, split, 1, who=who)


@pytest.mark.parametrize(
    "changes, field",
    [
        ({"amount": 0}, "amount"),
        ({"amount": -2}, "amount"),
        ({"amount": "lots"}, "amount"),
        ({"amount": "0.5"}, "amount"),
        ({"until": "past"}, "until"),
        ({"reason": "  "}, "reason"),
        ({"resource": "cpu"}, "resource"),
    ],
)
def test_request_bad_input(cast, split, changes, field) -> None:
    values = {"amount": 1, "reason": "why not", "resource": GPU, "until": None, **changes}
    if values["until"] == "past":
        values["until"] = timezone.now() - timedelta(minutes=1)
    before = counts()
    with pytest.raises(Invalid) as caught:
        services.quota_request_create(actor=cast.actor("carol"), project=cast.vision, flavor=split.h100, **values)
    assert caught.value.field == field
    assert counts() == before


def test_archived_project_cannot_ask(cast, split) -> None:
    project_update(actor=cast.actor("alice"), project=cast.nlp, status="archived")
    with pytest.raises(Invalid) as caught:
        ask(cast, split, 1, who="alice", project=cast.nlp)
    assert caught.value.field == "project"


def test_project_admin_approves_from_unassigned_quota(cast, split) -> None:
    request = ask(cast, split, 3)
    for who in ("carol", "dave", "erin", "frank"):
        with pytest.raises(NotAllowed):
            services.quota_request_approve(actor=cast.actor(who), request=request)
    done = services.quota_request_approve(actor=cast.actor("bob"), request=request, comment="Go.")
    assert (done.status, done.decided_by, done.comment) == (QuotaRequest.Status.APPROVED, cast.bob, "Go.")
    assert nominal(split, project=cast.vision) == 7 and nominal(split, tenant=cast.acme) == 8
    row = Quota.objects.get(project=cast.vision, flavor=split.h100)
    assert done.applied == {"project": {"quota": row.pk, "added": "3"}}
    raise_entry = AuditEntry.objects.get(action="quota.raise")
    assert (raise_entry.before["nominal"], raise_entry.after["nominal"], raise_entry.actor_label) == ("4", "7", "bob")
    approve_entry = AuditEntry.objects.get(action="quota_request.approve")
    assert approve_entry.before["status"] == "pending" and approve_entry.after["status"] == "approved"


def test_project_admin_cannot_approve_their_own_request(cast, split) -> None:
    request = ask(cast, split, 2, who="bob")
    assert request.approver == Approver.PROJECT_ADMIN
    with pytest.raises(NotAllowed):
        services.quota_request_approve(actor=cast.actor("bob"), request=request)
    assert not selectors.quota_requests_for(actor=cast.actor("bob"), inbox=True).filter(pk=request.pk).exists()
    services.quota_request_approve(actor=cast.actor("alice"), request=request)


def test_tenant_admin_approves_by_raising_the_tenant(cast, split) -> None:
    request = ask(cast, split, 6)  # 4 unassigned, 2 more from the cluster
    assert request.approver == Approver.TENANT_ADMIN
    with pytest.raises(NotAllowed):
        services.quota_request_approve(actor=cast.actor("bob"), request=request)
    done = services.quota_request_approve(actor=cast.actor("alice"), request=request)
    assert nominal(split, tenant=cast.acme) == 10 and nominal(split, project=cast.vision) == 10
    assert done.applied["tenant"]["added"] == "2" and done.applied["project"]["added"] == "6"
    assert AuditEntry.objects.filter(action="quota.raise").count() == 2


def test_ops_request_needs_ops_and_capacity(cast, split) -> None:
    tenant_quota(cast, split, cast.globex, 8)  # the cluster's 16 are all promised
    request = ask(cast, split, 6)
    assert request.approver == Approver.OPS
    with pytest.raises(NotAllowed):
        services.quota_request_approve(actor=cast.actor("alice"), request=request)
    with pytest.raises(QuotaExceeded) as caught:
        services.quota_request_approve(actor=cast.actor("ops"), request=request)
    assert "would be promised 18 x nvidia.com/gpu in h100-80gb but the cluster has 16 (2 over)" in str(caught.value)
    assert QuotaRequest.objects.get(pk=request.pk).status == QuotaRequest.Status.PENDING  # rolled back, still decidable
    services.cluster_update(actor=cast.actor("ops"), cluster=split.cluster, overcommit_percent=25)
    services.quota_request_approve(actor=cast.actor("ops"), request=request)
    assert nominal(split, tenant=cast.acme) == 10 and nominal(split, project=cast.vision) == 10


def test_approval_escalates_when_the_headroom_went_away(cast, split) -> None:
    request = ask(cast, split, 3)
    assert request.approver == Approver.PROJECT_ADMIN
    project_quota(cast, split, cast.nlp, 4)  # alice hands the unassigned 4 to nlp
    with pytest.raises(NotAllowed) as caught:
        services.quota_request_approve(actor=cast.actor("bob"), request=request)
    assert "no longer covers" in caught.value.message
    services.quota_request_approve(actor=cast.actor("alice"), request=request)
    assert nominal(split, tenant=cast.acme) == 11 and nominal(split, project=cast.vision) == 7


def test_decisions_are_compare_and_set(cast, split) -> None:
    request = ask(cast, split, 1)
    services.quota_request_approve(actor=cast.actor("bob"), request=request)
    with pytest.raises(AlreadyDecided):
        services.quota_request_approve(actor=cast.actor("alice"), request=request)
    with pytest.raises(AlreadyDecided):
        services.quota_request_reject(actor=cast.actor("alice"), request=request, comment="no")
    with pytest.raises(AlreadyDecided):
        services.quota_request_cancel(actor=cast.actor("carol"), request=request)
    assert nominal(split, project=cast.vision) == 5  # applied once


def test_reject_needs_a_comment_and_changes_no_quota(cast, split) -> None:
    request = ask(cast, split, 2)
    with pytest.raises(Invalid) as caught:
        services.quota_request_reject(actor=cast.actor("bob"), request=request, comment=" ")
    assert caught.value.field == "comment"
    with pytest.raises(NotAllowed):
        services.quota_request_reject(actor=cast.actor("carol"), request=request, comment="no")
    done = services.quota_request_reject(actor=cast.actor("bob"), request=request, comment="Use the nightly slot.")
    assert (done.status, done.comment) == (QuotaRequest.Status.REJECTED, "Use the nightly slot.")
    assert nominal(split, project=cast.vision) == 4
    assert AuditEntry.objects.filter(action="quota_request.reject").count() == 1


def test_only_the_requester_cancels(cast, split) -> None:
    request = ask(cast, split, 2)
    for who in ("bob", "alice", "ops"):
        with pytest.raises(NotAllowed):
            services.quota_request_cancel(actor=cast.actor(who), request=request)
    assert services.quota_request_cancel(actor=cast.actor("carol"), request=request).status == QuotaRequest.Status.CANCELLED
    with pytest.raises(ConflictError):
        services.quota_request_approve(actor=cast.actor("bob"), request=request)
    assert AuditEntry.objects.filter(action="quota_request.cancel").count() == 1


def test_approved_request_reverts_when_it_ends(cast, split) -> None:
    until = timezone.now() + timedelta(days=2)
    request = ask(cast, split, 6, until=until)
    services.quota_request_approve(actor=cast.actor("alice"), request=request)
    assert (nominal(split, tenant=cast.acme), nominal(split, project=cast.vision)) == (10, 10)
    assert jobs.quota_requests_expire(now=until - timedelta(seconds=1)) == {"reverted": 0, "lapsed": 0}
    assert jobs.quota_requests_expire(now=until) == {"reverted": 1, "lapsed": 0}
    assert (nominal(split, tenant=cast.acme), nominal(split, project=cast.vision)) == (8, 4)
    request.refresh_from_db()
    assert request.status == QuotaRequest.Status.REVERTED and request.applied["reverted"] == {"project": "6", "tenant": "2"}
    assert AuditEntry.objects.filter(action="quota.revert", actor_label="system").count() == 2
    assert AuditEntry.objects.filter(action="quota_request.revert").count() == 1
    assert jobs.quota_requests_expire(now=until + timedelta(days=1)) == {"reverted": 0, "lapsed": 0}  # runs twice safely


def test_revert_never_takes_what_is_promised_to_others(cast, split) -> None:
    until = timezone.now() + timedelta(hours=1)
    request = ask(cast, split, 6, until=until)
    services.quota_request_approve(actor=cast.actor("alice"), request=request)  # acme 10, vision 10
    project_quota(cast, split, cast.vision, 1)
    project_quota(cast, split, cast.nlp, 9)  # the tenant's 10 are now promised 1 + 9
    jobs.quota_requests_expire(now=until)
    # vision loses only the 1 it still has; the tenant keeps what nlp is promised.
    assert nominal(split, project=cast.vision) == 0 and nominal(split, project=cast.nlp) == 9
    assert nominal(split, tenant=cast.acme) == 9
    request.refresh_from_db()
    assert request.applied["reverted"] == {"project": "1", "tenant": "1"}


def test_pending_request_that_ended_lapses(cast, split) -> None:
    until = timezone.now() + timedelta(hours=1)
    request = ask(cast, split, 2, until=until)
    assert jobs.quota_requests_expire(now=until) == {"reverted": 0, "lapsed": 1}
    request.refresh_from_db()
    assert request.status == QuotaRequest.Status.REJECTED and request.decided_by is None and "before anyone decided" in request.comment
    assert nominal(split, project=cast.vision) == 4


def test_inbox_agrees_with_who_may_decide(cast, split) -> None:
    tenant_quota(cast, split, cast.globex, 4)
    requests = [ask(cast, split, 2), ask(cast, split, 6), ask(cast, split, 2, who="bob"), ask(cast, split, 9)]
    assert [r.approver for r in requests] == [Approver.PROJECT_ADMIN, Approver.TENANT_ADMIN, Approver.PROJECT_ADMIN, Approver.OPS]
    for who in ("ops", "alice", "bob", "carol", "dave", "erin", "nobody"):
        actor = cast.actor(who)
        inbox = set(selectors.quota_requests_for(actor=actor, inbox=True).values_list("pk", flat=True))
        assert inbox == {r.pk for r in requests if policy.may_decide(actor, r, tier=r.approver)}, who
    assert {r.pk for r in selectors.quota_requests_for(actor=cast.actor("carol"))} == {requests[0].pk, requests[1].pk, requests[3].pk}
    assert {r.pk for r in selectors.quota_requests_for(actor=cast.actor("bob"))} == {r.pk for r in requests}
    assert not selectors.quota_requests_for(actor=cast.actor("erin")).exists()


# Notifications -------------------------------------------------------------------------------------


def test_everyone_involved_is_emailed(cast, split, mailoutbox, django_capture_on_commit_callbacks) -> None:
    with django_capture_on_commit_callbacks(execute=True):
        request = ask(cast, split, 2)
    assert sorted(m.to[0] for m in mailoutbox) == ["alice@example.com", "bob@example.com", "carol@example.com"]
    assert all(len(m.to) == 1 for m in mailoutbox)  # nobody sees the others' addresses
    assert f"Quota request #{request.pk}" in mailoutbox[0].subject and "+2 nvidia.com/gpu" in mailoutbox[0].body
    mailoutbox.clear()
    with django_capture_on_commit_callbacks(execute=True):
        services.quota_request_approve(actor=cast.actor("bob"), request=request, comment="Enjoy.")
    assert sorted(m.to[0] for m in mailoutbox) == ["alice@example.com", "bob@example.com", "carol@example.com"]
    assert "approved" in mailoutbox[0].subject and "Enjoy." in mailoutbox[0].body
    mailoutbox.clear()
    tenant_quota(cast, split, cast.globex, 4)
    with django_capture_on_commit_callbacks(execute=True):
        ask(cast, split, 8)  # 2 unassigned + 4 unpromised: ops decide this one
    assert sorted(m.to[0] for m in mailoutbox) == ["carol@example.com", "ops@example.com"]


def test_nothing_is_sent_when_the_decision_rolls_back(cast, split, mailoutbox, django_capture_on_commit_callbacks) -> None:
    tenant_quota(cast, split, cast.globex, 8)
    request = ask(cast, split, 6)
    with django_capture_on_commit_callbacks(execute=True) as callbacks, pytest.raises(QuotaExceeded):
        services.quota_request_approve(actor=cast.actor("ops"), request=request)
    assert callbacks == [] and mailoutbox == []


class _Hook(BaseHTTPRequestHandler):
    received: list = []

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        type(self).received.append((self.headers["Content-Type"], json.loads(body)))
        self.send_response(204)
        self.end_headers()

    def log_message(self, *args) -> None:
        pass


@pytest.fixture
def webhook(settings):
    """A real HTTP server on loopback standing in for the customer's webhook."""
    _Hook.received = []
    server = HTTPServer(("127.0.0.1", 0), _Hook)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    settings.PORTAL_WEBHOOK_URL = f"http://127.0.0.1:{server.server_address[1]}/hooks/quota"
    yield _Hook.received
    server.shutdown()
    server.server_close()


def test_webhook_receives_json(cast, split, webhook, django_capture_on_commit_callbacks) -> None:
    with django_capture_on_commit_callbacks(execute=True):
        request = ask(cast, split, 2, until=timezone.now() + timedelta(days=1))
    with django_capture_on_commit_callbacks(execute=True):
        services.quota_request_reject(actor=cast.actor("alice"), request=request, comment="Not this week.")
    assert [content_type for content_type, _ in webhook] == ["application/json"] * 2
    submitted, rejected = (payload for _, payload in webhook)
    assert submitted["event"] == "quota_request.submitted" and rejected["event"] == "quota_request.rejected"
    assert submitted["request"] | {"until": None} == {
        "id": request.pk, "tenant": "acme", "project": "acme-vision", "cluster": "gpu-test", "flavor": "h100-80gb",
        "resource": GPU, "amount": "2", "what": "+2 nvidia.com/gpu (h100-80gb)", "share": None, "until": None,
        "reason": "Training run for the paper.", "status": "pending",
        "approver": "project_admin", "requested_by": "carol", "decided_by": None, "comment": "", "applied": {},
    }
    assert rejected["actor"] == "alice" and rejected["request"]["comment"] == "Not this week."


def test_broken_webhook_is_logged_not_raised(cast, split, settings, mailoutbox, caplog, django_capture_on_commit_callbacks) -> None:
    settings.PORTAL_WEBHOOK_URL = "http://127.0.0.1:9/nothing-listens-here"
    with django_capture_on_commit_callbacks(execute=True):
        request = ask(cast, split, 1)
    assert QuotaRequest.objects.filter(pk=request.pk).exists() and len(mailoutbox) == 3
    assert "quota webhook" in caplog.text
