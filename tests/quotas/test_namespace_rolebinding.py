"""Each project namespace the reconcile makes gets the RoleBinding that grants the portal's ServiceAccount what
only lives there (Secrets: the ClusterRole gpu-portal-namespaced), so the cluster-wide role holds no Secrets
(docs/security.md, "The portal's cluster identity"). Written to the sandbox cluster by the real reconcile."""

from __future__ import annotations

import pytest

from quotas import manifests as m
from quotas.reconcile import reconcile
from quotas.tasks import reconcile_cluster_task
from tests.quotas.test_ownership import demo  # noqa: F401  (the fixture)
from tenants.models import Project

pytestmark = pytest.mark.django_db
RBAC = "rbac.authorization.k8s.io/v1"


def test_the_reconcile_binds_the_namespaced_role_in_every_project_namespace(demo, settings) -> None:  # noqa: F811
    cluster, kube, _ = demo
    settings.PORTAL_SERVICE_ACCOUNT = "gpu-portal/gpu-portal"
    assert reconcile(cluster, kube=kube).ok
    namespaces = {p.namespace for p in Project.objects.filter(archived_at__isnull=True)}
    assert namespaces
    for namespace in namespaces:
        binding = kube.get(RBAC, "RoleBinding", m.NAMESPACED_ROLE, namespace)
        assert binding is not None, namespace
        assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                                      "name": "gpu-portal-namespaced"}
        assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "gpu-portal", "namespace": "gpu-portal"}]
        assert binding["metadata"]["labels"][m.MANAGED_BY] == "gpu-portal"
    # Applying again changes nothing; the binding is pruned with the rest when the setting goes.
    assert reconcile(cluster, kube=kube).ok
    settings.PORTAL_SERVICE_ACCOUNT = ""
    assert reconcile(cluster, kube=kube).ok
    assert all(kube.get(RBAC, "RoleBinding", m.NAMESPACED_ROLE, ns) is None for ns in namespaces)


def test_the_periodic_reconcile_task_writes_it_too(demo, settings) -> None:  # noqa: F811
    cluster, kube, _ = demo
    settings.PORTAL_SERVICE_ACCOUNT = "gpu-portal/gpu-portal"
    reconcile_cluster_task.apply(args=[cluster.pk]).get()
    namespace = Project.objects.filter(archived_at__isnull=True).first().namespace
    assert kube.get(RBAC, "RoleBinding", m.NAMESPACED_ROLE, namespace) is not None
