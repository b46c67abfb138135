"""The tenant and project status machines.

    tenant:   active <──> suspended   (ops only; a suspended tenant is read-only for everyone but ops)
    project:  active <──> archived    (archiving starts the namespace's retention, restoring cancels it)

Only ``tenants/services.py`` (``tenant_update``, ``project_update``) moves them, after its checks. Each move is a
compare-and-set under the row's lock with one audit entry (``tenant.suspend`` / ``tenant.activate``,
``project.archive`` / ``project.restore``) holding the row before and after.
"""

from __future__ import annotations

from typing import Any

from portal.cache import changed as cache_changed
from portal.machine import NOW, Machine

from .access import Actor
from .audit import audit_record, snapshot
from .models import Project, Tenant

TENANT_FIELDS = ["name", "slug", "cost_centre", "contact_email", "status"]
PROJECT_FIELDS = ["name", "slug", "description", "status", "notebooks_open_to_approvers", "cull_idle_notebooks_by_gpu",
                  "stop_idle_batch_jobs"]
T, P = Tenant.Status, Project.Status


def _offers_changed(move: Any) -> None:
    """A tenant or project moved (an UPDATE: no post_save): what the queues offer is read again (``quotas.selectors``'
    "offers", a higher app's memo, named here, not imported)."""
    cache_changed("offers")


TENANT = Machine(
    Tenant, field="status", audit_as="tenant", record=audit_record,
    allowed={T.ACTIVE: {T.SUSPENDED}, T.SUSPENDED: {T.ACTIVE}},
    scope=lambda tenant: (tenant, None), snapshot=lambda tenant: snapshot(tenant, TENANT_FIELDS), effects=[_offers_changed],
)
PROJECT = Machine(
    Project, field="status", audit_as="project", record=audit_record,
    allowed={P.ACTIVE: {P.ARCHIVED}, P.ARCHIVED: {P.ACTIVE}},
    # Archiving keeps the namespace for the retention period (quotas/namespaces.py); restoring cancels it.
    stamps={P.ARCHIVED: {"archived_at": NOW, "namespace_released_at": None},
            P.ACTIVE: {"archived_at": None, "namespace_released_at": None}},
    scope=lambda project: (project.tenant, project), snapshot=lambda project: snapshot(project, PROJECT_FIELDS),
    effects=[_offers_changed],
)
TENANT_ACTIONS = {T.SUSPENDED: "tenant.suspend", T.ACTIVE: "tenant.activate"}
PROJECT_ACTIONS = {P.ARCHIVED: "project.archive", P.ACTIVE: "project.restore"}


def tenant_move(tenant: Tenant, *, to: str, actor: Actor) -> Any:
    """Suspend or reactivate ``tenant`` (updated in memory); None when it already moved (nothing written)."""
    return TENANT.move(tenant, to=to, actor=actor, action=TENANT_ACTIONS[to])


def project_move(project: Project, *, to: str, actor: Actor) -> Any:
    """Archive or restore ``project`` (updated in memory); None when it already moved (nothing written)."""
    return PROJECT.move(project, to=to, actor=actor, action=PROJECT_ACTIONS[to])
