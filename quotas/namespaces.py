"""Project namespaces and who owns them (docs/ownership.md): look, adopt, release.

* :func:`namespace_problem` — why a new project may not use a namespace (reserved name, or it exists on a
  registered cluster and is not ours); ``tenants.services.project_create`` refuses with it.
* :func:`namespace_inspect` — what a namespace holds (object counts by kind) and who owns it: shown to ops
  before they adopt or delete one.
* :func:`namespace_adopt` — ops take a namespace that existed before the project (audited, explicit
  confirmation). The reconcile then labels it and writes our objects into it; nothing else is adopted.
* :func:`namespace_release` — ops confirm an archived project's namespace may be deleted now, instead of
  waiting for the retention period; :func:`namespaces_housekeeping` releases those whose retention passed.

A released namespace is deleted by the next reconcile, and only if it still carries our labels.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from portal.exceptions import ConflictError, Invalid, NotAllowed
from tenants.models import Project

from . import manifests as m
from .events import schedule_reconcile
from .models import Cluster

log = logging.getLogger(__name__)

# What a namespace may hold that someone would miss: counted before adoption or deletion.
CONTENT_KINDS: list[tuple[str, str]] = [
    ("v1", "Pod"),
    ("apps/v1", "Deployment"),
    ("apps/v1", "StatefulSet"),
    ("batch/v1", "Job"),
    ("batch.volcano.sh/v1alpha1", "Job"),
    ("v1", "Service"),
    ("v1", "ConfigMap"),
    ("v1", "Secret"),
    ("v1", "PersistentVolumeClaim"),
    (m.KUEUE, "LocalQueue"),
    ("v1", "ResourceQuota"),
    ("v1", "LimitRange"),
]


def installation_id() -> str:
    return getattr(settings, "PORTAL_INSTALLATION_ID", m.DEFAULT_INSTALLATION) or m.DEFAULT_INSTALLATION


def is_reserved(name: str) -> bool:
    return m.reserved_namespace(name, getattr(settings, "PORTAL_RESERVED_NAMESPACES", ()))


def _clusters() -> list[Cluster]:
    return [c for c in Cluster.objects.order_by("name") if c.kubeconfig_encrypted or c.kubeconfig_path]


def namespace_problem(namespace: str, *, project_slug: str | None = None) -> str | None:
    """Why a new project may not have ``namespace``, or None. Clusters that cannot be asked now are
    skipped: the reconcile checks again before it writes anything (and records a conflict)."""
    from portal.crypto import InvalidToken
    from portal.kube import ClusterError, kube_for

    if is_reserved(namespace):
        return f"{namespace} is a reserved namespace (Kubernetes, GPU operator, Kueue, Volcano, HAMi...): choose another slug."
    for cluster in _clusters():
        try:
            live = kube_for(cluster).get("v1", "Namespace", namespace)
        except (ClusterError, OSError, ValueError, InvalidToken) as exc:
            log.warning("namespace check on %s skipped: %s", cluster.name, exc)
            continue
        owner = m.ownership(live, installation_id())
        if owner == "missing":
            continue
        labels = (live.get("metadata") or {}).get("labels") or {}
        if owner == "ours" and project_slug and labels.get(m.PROJECT_LABEL) == project_slug:
            continue
        return (f"Namespace {namespace} already exists on cluster {cluster.name} and is not managed by this portal: "
                "choose another slug, or ask ops to adopt it.")
    return None


@dataclass
class NamespaceInfo:
    cluster: str
    namespace: str
    exists: bool
    owner: str  # ours | legacy | foreign | missing
    labels: dict[str, str] = field(default_factory=dict)
    contents: dict[str, int] = field(default_factory=dict)  # "Kind (group)" -> count, non-zero only
    project: str | None = None

    @property
    def total(self) -> int:
        return sum(self.contents.values())

    def as_dict(self) -> dict[str, Any]:
        return {"cluster": self.cluster, "namespace": self.namespace, "exists": self.exists, "owner": self.owner,
                "project": self.project, "labels": self.labels, "contents": self.contents, "total": self.total}


def namespace_inspect(cluster: Cluster, namespace: str, *, kube: Any = None) -> NamespaceInfo:
    """Who owns ``namespace`` on ``cluster`` and what is inside (counts by kind)."""
    from portal.kube import ClusterRejected

    kube = kube or _kube(cluster)
    live = kube.get("v1", "Namespace", namespace)
    project = Project.objects.filter(cluster_namespace=namespace).values_list("slug", flat=True).first()
    info = NamespaceInfo(cluster.name, namespace, live is not None, m.ownership(live, installation_id()),
                         dict(((live or {}).get("metadata") or {}).get("labels") or {}), project=project)
    if live is None:
        return info
    for api_version, kind in CONTENT_KINDS:
        try:
            items, _ = kube.list(api_version, kind, namespace)
        except ClusterRejected as exc:
            if exc.status == 404:
                continue  # the cluster does not serve that kind
            if exc.status == 403 and kind == "Secret":
                # Secrets are readable only in project namespaces, through their RoleBinding (docs/security.md):
                # a namespace not yet ours shows them as not counted.
                info.contents[f"{kind} (core, not readable before adoption)"] = 0
                continue
            raise
        if items:
            group = api_version.split("/")[0] if "/" in api_version else "core"
            info.contents[f"{kind} ({group})"] = len(items)
    return info


def _kube(cluster: Cluster) -> Any:
    """The cluster's client. A cluster the portal has no way to ask (no kubeconfig, an unreadable or undecryptable
    one) is a ConflictError (409, naming the reason): its registration must change first, and retrying will not help
    (an unreachable cluster is ClusterUnavailable, a 503)."""
    from portal.crypto import InvalidToken
    from portal.kube import kube_for

    try:
        return kube_for(cluster)
    except (OSError, ValueError, InvalidToken) as exc:
        raise ConflictError(f"The cluster {cluster.name} cannot be asked ({exc or type(exc).__name__}): "
                            "ops set its kubeconfig first.") from exc


def _project_for_ops(actor: Any, project: Project) -> Project:
    if not actor.is_ops:
        raise NotAllowed("Only platform ops adopt or delete namespaces.")
    return Project.objects.select_for_update(of=("self",)).select_related("tenant").get(pk=project.pk)


def namespace_adopt(*, actor: Any, cluster: Cluster, project: Project, confirm: int | None, kube: Any = None) -> NamespaceInfo:
    """Ops adopt the existing namespace of ``project`` on ``cluster``. ``confirm`` must be the object count
    ops were shown (:func:`namespace_inspect`), so nobody adopts a namespace without having seen what is
    inside (or after it changed). Audited; the next reconcile labels it and writes our objects into it."""
    from tenants.audit import audit_record

    info = namespace_inspect(cluster, project.namespace, kube=kube)
    with transaction.atomic():
        project = _project_for_ops(actor, project)
        if is_reserved(project.namespace):
            raise Invalid(f"{project.namespace} is a reserved namespace: it is never adopted.", field="namespace")
        if not info.exists:
            raise ConflictError(f"Namespace {project.namespace} does not exist on {cluster.name}: nothing to adopt.",
                                field="namespace")
        if info.owner == "ours":
            return info
        if confirm is None or int(confirm) != info.total:
            raise Invalid(f"Confirm with the number of objects in {project.namespace} ({info.total}) after reviewing them.",
                          field="confirm")
        project.namespace_adopted_at = timezone.now()
        project.save(update_fields=["namespace_adopted_at"])
        audit_record(actor=actor, action="namespace.adopt", target=project, tenant=project.tenant, project=project,
                     before={"cluster": cluster.name, "owner": info.owner, "labels": info.labels},
                     after={"namespace": project.namespace, "contents": info.contents})
        schedule_reconcile(cluster.pk)
    return info


def namespace_release(*, actor: Any, cluster: Cluster, project: Project, confirm: int | None, kube: Any = None) -> NamespaceInfo:
    """Ops confirm an archived project's namespace (and all it holds) may be deleted now. ``confirm`` is
    the object count they were shown. The reconcile deletes it, and only if it carries our labels."""
    from tenants.audit import audit_record

    info = namespace_inspect(cluster, project.namespace, kube=kube)
    with transaction.atomic():
        project = _project_for_ops(actor, project)
        if project.is_active:
            raise ConflictError("The project is active: archive it first.", field="status")
        if info.exists and info.owner not in ("ours", "legacy"):
            raise ConflictError(f"Namespace {project.namespace} is not managed by this portal: it is never deleted by it.",
                                field="namespace")
        if confirm is None or int(confirm) != info.total:
            raise Invalid(f"Confirm with the number of objects in {project.namespace} ({info.total}) after reviewing them.",
                          field="confirm")
        if project.namespace_released_at is None:
            project.namespace_released_at = timezone.now()
            project.save(update_fields=["namespace_released_at"])
            audit_record(actor=actor, action="namespace.delete", target=project, tenant=project.tenant, project=project,
                         before={"cluster": cluster.name, "contents": info.contents},
                         after={"namespace": project.namespace, "released": True})
        schedule_reconcile(cluster.pk)
    return info


def retention() -> timedelta:
    return timedelta(days=getattr(settings, "PORTAL_NAMESPACE_RETENTION_DAYS", 7))


def namespaces_housekeeping(now: Any = None) -> int:
    """Release the namespaces of projects archived longer than the retention period. Audited (system);
    returns how many. The next reconcile deletes them (ours only)."""
    from tenants.access import Actor
    from tenants.audit import audit_record

    now = now or timezone.now()
    due = Project.objects.filter(status=Project.Status.ARCHIVED, namespace_released_at__isnull=True,
                                 archived_at__lte=now - retention()).select_related("tenant")
    count = 0
    for project in due:
        with transaction.atomic():
            updated = Project.objects.filter(pk=project.pk, namespace_released_at__isnull=True).update(namespace_released_at=now)
            if updated:
                count += 1
                audit_record(actor=Actor.system(), action="namespace.delete", target=project, tenant=project.tenant,
                             project=project, after={"namespace": project.namespace, "reason": "retention period over"})
    return count
