"""The portal never touches what it does not own (docs/ownership.md), against the sandbox cluster.

Reserved and pre-existing namespaces are refused at project creation and again at apply time; a foreign
object is never forced, labelled, written into or pruned; archived namespaces are retained until the
retention period ends or ops confirm after seeing what is inside; ops adopt a foreign namespace
explicitly. Every object we write carries our labels and owner annotation.
"""

from __future__ import annotations

import json
from datetime import timedelta

import pytest
from django.urls import reverse
from django.utils import timezone

from portal.kube import Kube, NotOwned
from quotas import manifests as m
from quotas.demo import seed_quota_demo
from quotas.models import AppliedObject, Cluster
from quotas.reconcile import plan_build, reconcile, snapshot_load
from quotas.tasks import namespace_housekeeping_task
from sandbox.testing import kubectl
from tenants.models import AuditEntry, Project

pytestmark = pytest.mark.django_db
API = "/api/v1"
KUEUE = m.KUEUE
INSTALLATION = "gpu-portal"


@pytest.fixture
def demo(cast, fresh_sandbox, settings):
    """The demo cluster on a fresh sandbox, registered (so project creation asks it), nothing applied yet."""
    settings.KUBECONFIG = str(fresh_sandbox.kubeconfig)
    settings.CELERY_TASK_ALWAYS_EAGER = False
    seed_quota_demo(architecture="B", reconcile_now=False)
    cluster = Cluster.objects.get(name="sandbox")
    kube = Kube(kubeconfig_path=str(fresh_sandbox.kubeconfig))
    return cluster, kube, fresh_sandbox


def foreign_namespace(sb, name: str) -> None:
    """What an operator makes with kubectl: a namespace holding a ConfigMap, no portal labels."""
    kubectl(sb, "create", "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}}))
    kubectl(sb, "create", "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "ConfigMap",
                                                       "metadata": {"name": "operator-config", "namespace": name},
                                                       "data": {"driver": "550"}}))


def labels_of(kube: Kube, kind: str, name: str, namespace: str | None = None, api_version: str = "v1") -> dict:
    obj = kube.get(api_version, kind, name, namespace)
    return ((obj or {}).get("metadata") or {}).get("labels") or {}


# ------------------------------------------------------------------------------------------- marks
def test_every_object_carries_our_labels_and_owner_annotation(demo) -> None:
    cluster, kube, _ = demo
    desired = m.desired_state(cluster, snapshot_load(cluster))
    for obj in desired:
        meta = obj["metadata"]
        assert meta["labels"][m.MANAGED_BY] == "gpu-portal" and meta["labels"][m.INSTALLATION_LABEL] == INSTALLATION, obj
        assert meta["annotations"][m.OWNER_ANNOTATION].startswith(f"gpu-portal installation {INSTALLATION}")
    assert reconcile(cluster, kube=kube).ok
    ns = kube.get("v1", "Namespace", "acme-vision")
    assert ns["metadata"]["annotations"][m.OWNER_ANNOTATION] == (
        "gpu-portal installation gpu-portal; tenant acme; project acme-vision")
    # Pod Security: baseline enforced (notebooks), restricted warned and audited.
    assert ns["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "baseline"
    assert ns["metadata"]["labels"]["pod-security.kubernetes.io/warn"] == "restricted"
    assert ns["metadata"]["labels"]["pod-security.kubernetes.io/audit"] == "restricted"
    for kind in ("Cohort", "ClusterQueue", "ResourceFlavor", "WorkloadPriorityClass"):
        for obj in kube.list(KUEUE, kind)[0]:
            assert obj["metadata"]["labels"][m.INSTALLATION_LABEL] == INSTALLATION


def test_installation_id_comes_from_the_setting(demo, settings) -> None:
    cluster, _, _ = demo
    settings.PORTAL_INSTALLATION_ID = "portal-eu-1"
    snap = snapshot_load(cluster)
    assert snap.installation == "portal-eu-1"
    assert {o["metadata"]["labels"][m.INSTALLATION_LABEL] for o in m.desired_state(cluster, snap)} == {"portal-eu-1"}


# ------------------------------------------------------------------------------------------- create
@pytest.mark.parametrize("slug", ["kube-system", "kube-public", "default", "gpu-operator", "nvidia-gpu-operator",
                                  "kueue-system", "volcano-system", "volcano-monitoring", "hami-system", "cert-manager"])
def test_reserved_names_are_refused_with_a_field_error(demo, api, slug: str) -> None:
    response = api("alice").post(f"{API}/projects/", {"tenant": "acme", "name": slug, "slug": slug}, format="json")
    assert response.status_code == 400, response.content
    assert "reserved" in response.json()["fields"]["slug"][0]
    assert not Project.objects.filter(slug=slug).exists()


def test_configured_reserved_names_are_refused(demo, api, settings) -> None:
    settings.PORTAL_RESERVED_NAMESPACES = ["acme-secret", "shared-*"]
    for slug in ("acme-secret", "shared-data"):
        response = api("alice").post(f"{API}/projects/", {"tenant": "acme", "name": slug, "slug": slug}, format="json")
        assert response.status_code == 400 and "reserved" in response.json()["fields"]["slug"][0]
    # "secret" in tenant acme would become namespace acme-secret: refused too.
    response = api("alice").post(f"{API}/projects/", {"tenant": "acme", "name": "Secret", "slug": "secret"}, format="json")
    assert response.status_code == 400 and "reserved" in response.json()["fields"]["slug"][0]


def test_an_existing_namespace_that_is_not_ours_is_refused(demo, api) -> None:
    _, kube, sb = demo
    foreign_namespace(sb, "acme-data")
    for slug in ("acme-data", "data"):  # "data" in tenant acme is namespace acme-data
        response = api("alice").post(f"{API}/projects/", {"tenant": "acme", "name": f"D {slug}", "slug": slug}, format="json")
        assert response.status_code == 400, response.content
        assert "already exists on cluster sandbox and is not managed by this portal" in response.json()["fields"]["slug"][0]
    assert labels_of(kube, "Namespace", "acme-data").get(m.MANAGED_BY) is None


def test_namespace_is_prefixed_with_the_tenant_and_fixed_at_creation(demo, api, as_user) -> None:
    response = api("alice").post(f"{API}/projects/", {"tenant": "acme", "name": "Robotics", "slug": "robotics"}, format="json")
    assert response.status_code == 201
    project = Project.objects.get(slug="robotics")
    assert project.namespace == "acme-robotics"
    assert Project.objects.get(slug="acme-vision").namespace == "acme-vision"  # already prefixed: unchanged
    # The page says where it lands.
    response = as_user("alice").post(reverse("project-create", args=["acme"]),
                                     {"project-name": "Speech", "project-slug": "speech"}, follow=True)
    assert "namespace acme-speech" in response.content.decode()


def test_the_project_page_form_shows_the_reserved_error(demo, as_user) -> None:
    response = as_user("alice").post(reverse("project-create", args=["acme"]), {"project-name": "Sys", "project-slug": "kube-system"})
    assert response.status_code == 200
    assert "kube-system is a reserved name" in response.content.decode()
    assert not Project.objects.filter(slug="kube-system").exists()


# ------------------------------------------------------------------------------------------- apply
def test_reconcile_never_writes_into_a_namespace_that_is_not_ours(demo, as_user) -> None:
    cluster, kube, sb = demo
    # The project was created while the namespace did not exist; someone made it with kubectl since.
    foreign_namespace(sb, "acme-nlp")
    result = reconcile(cluster, kube=kube)
    assert not result.failed
    assert {label for label, _ in result.conflicts} == {
        "Namespace acme-nlp", "LocalQueue acme-nlp/acme-nlp", "ResourceQuota acme-nlp/gpu-portal", "LimitRange acme-nlp/gpu-portal"}
    assert labels_of(kube, "Namespace", "acme-nlp").get(m.MANAGED_BY) is None
    assert kube.list("v1", "ResourceQuota", "acme-nlp")[0] == [] and kube.list("v1", "LimitRange", "acme-nlp")[0] == []
    assert kube.list(KUEUE, "LocalQueue", "acme-nlp")[0] == []
    row = AppliedObject.objects.get(cluster=cluster, kind="Namespace", name="acme-nlp")
    assert row.error.startswith("conflict: namespace acme-nlp exists and is not managed by this portal") and not row.hash
    # The rest of the tenant is applied as usual.
    assert labels_of(kube, "Namespace", "acme-vision")[m.INSTALLATION_LABEL] == INSTALLATION
    # Ops see the conflict on the cluster's objects page, with a link to review the namespace.
    body = as_user("ops").get(reverse("ops-cluster-objects", args=["sandbox"])).content.decode()
    assert "namespace acme-nlp exists and is not managed by this portal" in body
    assert reverse("ops-namespace", args=["sandbox", "acme-nlp"]) in body
    plan_page = as_user("ops").get(reverse("ops-cluster", args=["sandbox"])).content.decode()
    assert "4 not ours (left alone)" in plan_page and "namespace acme-nlp exists and is not managed" in plan_page


def test_reserved_namespace_of_an_old_project_is_never_written_or_deleted(demo) -> None:
    """The finding: projects named default and kube-system (made before the checks) got our labels and
    guard rails; archiving default deleted it. Now: our marks come off, nothing is written or deleted."""
    cluster, kube, _ = demo
    old = Project.objects.create(tenant=Project.objects.get(slug="acme-vision").tenant, name="Old default", slug="default",
                                 cluster_namespace="default")
    # What the old portal left behind: our labels on default, our guard rail inside, recorded as applied.
    kube.apply({"apiVersion": "v1", "kind": "Namespace",
                "metadata": {"name": "default", "labels": {m.MANAGED_BY: m.MANAGER, m.TENANT_LABEL: "acme",
                                                           m.PROJECT_LABEL: "default"}}})
    kube.apply({"apiVersion": "v1", "kind": "ResourceQuota",
                "metadata": {"name": "gpu-portal", "namespace": "default",
                             "labels": {m.MANAGED_BY: m.MANAGER, m.TENANT_LABEL: "acme", m.PROJECT_LABEL: "default"}},
                "spec": {"hard": {"requests.nvidia.com/gpu": "4"}}})
    for kind, ns, name in (("Namespace", "", "default"), ("ResourceQuota", "default", "gpu-portal")):
        AppliedObject.objects.create(cluster=cluster, api_version="v1", kind=kind, namespace=ns, name=name, hash="old")
    result = reconcile(cluster, kube=kube)
    assert "Namespace default" in {label for label, _ in result.conflicts}
    assert kube.get("v1", "Namespace", "default") is not None
    assert m.MANAGED_BY not in labels_of(kube, "Namespace", "default")  # our labels are taken off
    assert kube.get("v1", "ResourceQuota", "gpu-portal", "default") is None  # our guard rail taken out
    assert kube.list("v1", "LimitRange", "default")[0] == []
    # Archiving it deletes nothing.
    Project.objects.filter(pk=old.pk).update(status=Project.Status.ARCHIVED, archived_at=timezone.now() - timedelta(days=30),
                                             namespace_released_at=timezone.now())
    reconcile(cluster, kube=kube)
    assert kube.get("v1", "Namespace", "default") is not None


def test_forced_apply_is_refused_on_an_object_we_do_not_own(demo) -> None:
    cluster, kube, sb = demo
    # Another team's ClusterQueue that happens to have a project's name, and another installation's Cohort.
    theirs = {"apiVersion": KUEUE, "kind": "ClusterQueue",
              "metadata": {"name": "acme-vision", "labels": {"team": "infra"}},
              "spec": {"namespaceSelector": {}, "resourceGroups": []}}
    kube.apply(theirs, field_manager="kubectl")
    other = {"apiVersion": KUEUE, "kind": "Cohort",
             "metadata": {"name": "other-team", "labels": {m.MANAGED_BY: m.MANAGER, m.INSTALLATION_LABEL: "portal-eu-2"}}}
    kube.apply(other, field_manager="gpu-portal")
    with pytest.raises(NotOwned):
        kube.apply(m.mark(theirs, INSTALLATION), owner=m.owner_selector(INSTALLATION))
    result = reconcile(cluster, kube=kube)
    assert "ClusterQueue acme-vision" in {label for label, _ in result.conflicts}
    live = kube.get(KUEUE, "ClusterQueue", "acme-vision")
    assert live["metadata"]["labels"] == {"team": "infra"} and live["spec"]["resourceGroups"] == []
    assert kube.get(KUEUE, "Cohort", "other-team") is not None  # another installation's: never pruned
    assert AppliedObject.objects.get(cluster=cluster, kind="ClusterQueue", name="acme-vision").error.startswith("conflict:")
    # A forced apply on something that became another installation's after the plan: refused before any write.
    kubectl(sb, "label", "namespace", "acme-nlp", f"{m.INSTALLATION_LABEL}=portal-eu-2", "--overwrite")
    with pytest.raises(NotOwned):
        kube.apply(m.mark({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "acme-nlp"}}, INSTALLATION),
                   owner=m.owner_selector(INSTALLATION))
    assert labels_of(kube, "Namespace", "acme-nlp")[m.INSTALLATION_LABEL] == "portal-eu-2"


# ------------------------------------------------------------------------------------------- archive / delete
def test_archiving_keeps_the_namespace_until_ops_confirm_after_seeing_its_contents(demo, api) -> None:
    cluster, kube, sb = demo
    assert reconcile(cluster, kube=kube).ok
    kubectl(sb, "create", "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "ConfigMap",
                                                       "metadata": {"name": "results", "namespace": "acme-nlp"},
                                                       "data": {"epoch": "12"}}))
    assert api("alice").patch(f"{API}/projects/acme-nlp/", {"status": "archived"}, format="json").status_code == 200
    plan = plan_build(cluster, kube=kube)
    assert {i.label for i in plan.deletes} == {"ClusterQueue acme-nlp", "LocalQueue acme-nlp/acme-nlp",
                                               "ResourceQuota acme-nlp/gpu-portal", "LimitRange acme-nlp/gpu-portal"}
    assert reconcile(cluster, kube=kube).ok
    ns = kube.get("v1", "Namespace", "acme-nlp")
    assert ns is not None and ns["metadata"]["labels"][m.ARCHIVED_LABEL] == "true"
    assert kube.get("v1", "ConfigMap", "results", "acme-nlp") is not None
    # Ops look first: what is inside, by kind.
    assert api("alice").get(f"{API}/clusters/sandbox/projects/acme-nlp/namespace/").status_code == 403
    info = api("ops").get(f"{API}/clusters/sandbox/projects/acme-nlp/namespace/").json()
    assert info["owner"] == "ours" and info["contents"]["ConfigMap (core)"] >= 1 and info["total"] >= 1
    url = f"{API}/clusters/sandbox/projects/acme-nlp/namespace/delete/"
    wrong = api("ops").post(url, {"confirm": info["total"] + 5}, format="json")
    assert wrong.status_code == 400 and "confirm" in wrong.json()["fields"]
    assert api("ops").post(url, {}, format="json").status_code == 400
    assert reconcile(cluster, kube=kube).ok and kube.get("v1", "Namespace", "acme-nlp") is not None  # still there
    assert api("ops").post(url, {"confirm": info["total"]}, format="json").status_code == 200
    assert AuditEntry.objects.filter(action="namespace.delete", project__slug="acme-nlp").exists()
    result = reconcile(cluster, kube=kube)
    assert result.ok and result.deleted == 1
    ns = kube.get("v1", "Namespace", "acme-nlp")
    assert ns is None or (ns.get("metadata") or {}).get("deletionTimestamp")


def test_housekeeping_deletes_archived_namespaces_after_the_retention_period(demo, settings) -> None:
    cluster, kube, _ = demo
    settings.PORTAL_NAMESPACE_RETENTION_DAYS = 7
    assert reconcile(cluster, kube=kube).ok
    Project.objects.filter(slug="acme-nlp").update(status=Project.Status.ARCHIVED, archived_at=timezone.now() - timedelta(days=6))
    assert namespace_housekeeping_task.apply().get() == 0
    reconcile(cluster, kube=kube)
    assert kube.get("v1", "Namespace", "acme-nlp") is not None
    Project.objects.filter(slug="acme-nlp").update(archived_at=timezone.now() - timedelta(days=8))
    assert namespace_housekeeping_task.apply().get() == 1
    assert namespace_housekeeping_task.apply().get() == 0  # idempotent
    assert AuditEntry.objects.filter(action="namespace.delete", project__slug="acme-nlp").count() == 1
    reconcile(cluster, kube=kube)
    ns = kube.get("v1", "Namespace", "acme-nlp")
    assert ns is None or (ns.get("metadata") or {}).get("deletionTimestamp")


def test_restoring_within_retention_keeps_everything(demo, api) -> None:
    cluster, kube, _ = demo
    assert reconcile(cluster, kube=kube).ok
    api("alice").patch(f"{API}/projects/acme-nlp/", {"status": "archived"}, format="json")
    reconcile(cluster, kube=kube)
    api("alice").patch(f"{API}/projects/acme-nlp/", {"status": "active"}, format="json")
    assert Project.objects.get(slug="acme-nlp").archived_at is None
    assert reconcile(cluster, kube=kube).ok
    assert m.ARCHIVED_LABEL not in labels_of(kube, "Namespace", "acme-nlp")
    assert kube.get(KUEUE, "LocalQueue", "acme-nlp", "acme-nlp") is not None


# ------------------------------------------------------------------------------------------- adopt
def test_ops_adopt_a_foreign_namespace_explicitly_after_seeing_what_is_inside(demo, api, as_user) -> None:
    cluster, kube, sb = demo
    foreign_namespace(sb, "acme-nlp")
    reconcile(cluster, kube=kube)
    assert api("alice").post(f"{API}/clusters/sandbox/projects/acme-nlp/namespace/adopt/", {"confirm": 1},
                             format="json").status_code == 403
    page = as_user("ops").get(reverse("ops-namespace", args=["sandbox", "acme-nlp"])).content.decode()
    assert "not this portal" in page and "ConfigMap (core)" in page and "Adopt acme-nlp" in page
    info = api("ops").get(f"{API}/clusters/sandbox/projects/acme-nlp/namespace/").json()
    assert info["owner"] == "foreign" and info["contents"]["ConfigMap (core)"] == 1
    wrong = api("ops").post(f"{API}/clusters/sandbox/projects/acme-nlp/namespace/adopt/", {"confirm": 0}, format="json")
    assert wrong.status_code == 400
    reconcile(cluster, kube=kube)
    assert labels_of(kube, "Namespace", "acme-nlp").get(m.MANAGED_BY) is None  # still not adopted
    # Through the page: the form posts the total ops were shown.
    response = as_user("ops").post(reverse("ops-namespace-adopt", args=["sandbox", "acme-nlp"]), {"confirm": info["total"]})
    assert response.status_code == 302
    entry = AuditEntry.objects.get(action="namespace.adopt", project__slug="acme-nlp")
    assert entry.after["contents"]["ConfigMap (core)"] == 1
    assert reconcile(cluster, kube=kube).ok
    assert labels_of(kube, "Namespace", "acme-nlp")[m.INSTALLATION_LABEL] == INSTALLATION
    assert kube.get("v1", "ResourceQuota", "gpu-portal", "acme-nlp") is not None
    assert kube.get("v1", "ConfigMap", "operator-config", "acme-nlp") is not None  # theirs, untouched
    assert not AppliedObject.objects.filter(cluster=cluster, namespace="acme-nlp").exclude(error="").exists()


def test_reserved_namespaces_are_never_adopted(demo, api) -> None:
    acme = Project.objects.get(slug="acme-vision").tenant
    Project.objects.create(tenant=acme, name="Sys", slug="kube-system", cluster_namespace="kube-system")
    response = api("ops").post(f"{API}/clusters/sandbox/projects/kube-system/namespace/adopt/", {"confirm": 0}, format="json")
    assert response.status_code == 400 and "reserved" in json.dumps(response.json())


# ------------------------------------------------------------------------------------------- request objects
@pytest.mark.parametrize("kind", ["notebook", "training", "inference"])
def test_request_objects_carry_our_labels_and_owner_annotation(kind: str, settings) -> None:
    from tests.workloads.test_render import make_request, pod_templates
    from workloads import kinds as wm

    settings.PORTAL_INSTALLATION_ID = "portal-eu-1"
    objects = wm.request_manifests(make_request(kind, replicas=2 if kind == "training" else 1), notebook_token="t")
    assert objects
    for obj in objects:
        meta = obj["metadata"]
        assert meta["labels"][m.MANAGED_BY] == "gpu-portal" and meta["labels"][m.INSTALLATION_LABEL] == "portal-eu-1"
        assert meta["annotations"][m.OWNER_ANNOTATION] == (
            "gpu-portal installation portal-eu-1; tenant acme; project acme-vision; request 42")
        for template in pod_templates(obj):
            assert template["metadata"]["labels"][m.INSTALLATION_LABEL] == "portal-eu-1"


def test_a_retained_archived_project_renders_only_its_namespace() -> None:
    quota = (m.QuotaRow("h100", "nvidia.com/gpu", 4),)
    snap = m.Snapshot(
        m.ClusterRow("c", "A"), (m.FlavorRow("h100", "whole", ("nvidia.com/gpu",)),),
        (m.TenantRow("acme", True, quota),),
        (m.ProjectRow("acme-vision", "acme", True, quota), m.ProjectRow("acme-old", "acme", False, quota, namespace="acme-old")),
        "portal-x",
    )
    objects = m.desired_state(snap.cluster, snap)
    old = [o for o in objects if "acme-old" in (o["metadata"]["name"], o["metadata"].get("namespace"))]
    assert [o["kind"] for o in old] == ["Namespace"] and old[0]["metadata"]["labels"][m.ARCHIVED_LABEL] == "true"
    shared = next(o for o in objects if o["kind"] == "ClusterQueue")
    assert shared["spec"]["resourceGroups"][0]["flavors"][0]["resources"][0]["nominalQuota"] == "4"  # archived not counted


def test_reserved_names_match_exactly_or_by_prefix() -> None:
    assert m.reserved_namespace("kube-system") and m.reserved_namespace("kube-node-lease") and m.reserved_namespace("default")
    assert not m.reserved_namespace("acme-default") and not m.reserved_namespace("kubeflow-team")
    assert m.reserved_namespace("team-infra-a", ["team-infra-*"]) and not m.reserved_namespace("team-infra", ["team-infra-*"])
