"""Who may do what with workload requests, notebooks and the catalogue. Built on ``tenants.policy``;
services enforce these predicates, views and templates ask them (see ``tenants/policy.py``)."""

from __future__ import annotations

from tenants.access import Actor, scope_of
from tenants.models import Project
from tenants.policy import holders, may_approve, may_operate, may_submit, with_holders

from . import kinds
from .models import WorkloadRequest
from .shared import OPERATE, VIEW, shares_held


def may_submit_request(actor: Actor, project: Project) -> bool:
    return may_submit(actor, project)


@with_holders(lambda project: holders("approve_project", project))
def may_decide(actor: Actor, project: Project) -> bool:
    """Approve or reject the project's requests: project admins, tenant admins, ops."""
    return may_approve(actor, project)


def is_requester(actor: Actor, req: WorkloadRequest) -> bool:
    return actor.user is not None and actor.user.pk == req.requested_by_id


def may_act_on(actor: Actor, req: WorkloadRequest) -> bool:
    """Cancel, stop, restart, extend, scale: the requester (while they may still submit in the
    project) or an approver of the project."""
    if may_approve(actor, req.project):
        return True
    return is_requester(actor, req) and may_submit(actor, req.project)


def _shared(actor: Actor, req: WorkloadRequest, codename: str) -> bool:
    """``req`` was shared with the actor with ``codename`` (``workloads.sharing``; never through a token)."""
    return codename in shares_held(actor).get(req.pk, frozenset())


def may_view_request(actor: Actor, req: WorkloadRequest) -> bool:
    """See the request (lists, its page, the API): whoever sees its project, and a colleague it was shared with.
    ``selectors.request_scope_for`` is the same rule as a query."""
    return scope_of(actor).allows("view_project", req.project) or _shared(actor, req, VIEW)


def may_read_logs(actor: Actor, req: WorkloadRequest) -> bool:
    """Read the request's pod logs: whoever sees its project; of the colleagues it was shared with, those who may
    operate it (a view-only share shows the request, not its logs)."""
    return scope_of(actor).allows("view_project", req.project) or _shared(actor, req, OPERATE)


def may_share_request(actor: Actor, req: WorkloadRequest) -> bool:
    """Share the request with a named colleague of its tenant, or stop sharing it: its requester (while they may
    submit in the project) and the project's approvers; not through an API token (a token acts for a pipeline),
    and never a colleague it was shared with (a share does not pass on)."""
    if actor.token is not None or actor.user is None:
        return actor.user is None
    return may_act_on(actor, req)


def may_manage_inference_keys(actor: Actor, req: WorkloadRequest) -> bool:
    """Create or revoke an inference service's API keys (``workloads.endpoints``), and list them: its requester
    (while they may still submit in the project) and the project's approvers (project and tenant admins, ops)."""
    return may_act_on(actor, req)


def may_ask_extension(actor: Actor, req: WorkloadRequest) -> bool:
    """Ask the approvers for more hours than the approval rule grants: the requester, while they may still
    submit in the project (approvers extend directly; they need not ask)."""
    return is_requester(actor, req) and may_submit(actor, req.project)


def may_manage_catalogue(actor: Actor) -> bool:
    """Templates, images and global approval rules: platform ops."""
    return may_operate(actor)


def may_set_rules(actor: Actor, project: Project | None) -> bool:
    """Approval rules: a project's approvers for the project, ops for global rules."""
    return may_operate(actor) if project is None else may_approve(actor, project)


def may_open_notebook(actor: Actor, req: WorkloadRequest) -> bool:
    """Who may open a notebook (through the portal's proxy or the ingress that asks ``/notebooks/auth/``):
    its requester, a colleague it was shared with to operate (``workloads.sharing``), and the project's approvers
    only where the project allows it (``Project.notebooks_open_to_approvers``, off by default). An API token never
    opens a notebook."""
    user = actor.user
    if actor.token is not None or user is None or not user.is_authenticated:
        return False
    if not kinds.get(req.template.kind).interactive:
        return False
    if req.requested_by_id == user.pk or _shared(actor, req, OPERATE):
        return True
    return bool(req.project.notebooks_open_to_approvers) and may_approve(actor, req.project)


def _somewhere(actor: Actor, perm: str) -> bool:
    """``perm`` on at least one project: from the actor's scope, no query (ops and the system: always)."""
    if actor.user is None:
        return True
    scope = scope_of(actor)
    return scope.everything or bool(scope.project_ids(perm))


def may_submit_somewhere(actor: Actor) -> bool:
    """Submit in at least one project (the navigation's "New request")."""
    return _somewhere(actor, "submit_project")


def may_decide_somewhere(actor: Actor) -> bool:
    """Decide on requests in at least one project: who has an approvals inbox."""
    return _somewhere(actor, "approve_project")
