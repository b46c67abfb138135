"""Every read of requests that depends on who asks. API viewsets and portal pages both start here."""

from __future__ import annotations

import copy
import hashlib
from dataclasses import dataclass
from decimal import Decimal
from collections.abc import Hashable, Iterable, Mapping
from typing import Any, cast

from django.db import connection
from django.db.models import BooleanField, Count, TextField, Exists, ExpressionWrapper, F, IntegerField, OuterRef, Prefetch, Q, QuerySet, Subquery, Sum, Value
from django.db.models.expressions import RawSQL
from django.db.models.functions import Coalesce
from django.utils.text import capfirst

from portal import labels
from portal.cache import Versioned, shared
from portal.compiled import Compiled
from portal.extensions import cost_estimator
from quotas.models import Cluster, Flavor, Quota
from tenants.access import APPROVALS, Actor, is_ops, scope_of
from tenants.models import Project

from .filters import RequestFilter
from .models import (
    LIVE_STATES,
    ApprovalRule,
    ExtensionRequest,
    Image,
    RequestEvent,
    RequestPreset,
    RequestState,
    ServiceTemplate,
    Volume,
    WorkloadRequest,
)
from .pending import awaiting_approval_sentence
from .shared import shares_held

S = RequestState
# Waiting for capacity in the project's queue (ahead of a request that gets approved now).
IN_QUEUE = [S.APPROVED, S.QUEUED, S.PREEMPTED]


def _is_ops(actor: Actor) -> bool:
    return actor.token is None and is_ops(actor.user)


def request_scope_for(*, actor: Actor) -> QuerySet[WorkloadRequest]:
    """The requests ``actor`` can see (a token: its project only; ops: all), with no related rows joined: those of
    the projects they see, and those shared with them (``policy.may_view_request``, ``sharing.shares_held``)."""
    visible = scope_of(actor).in_projects("project")
    shared = sorted(shares_held(actor))
    return WorkloadRequest.objects.filter(visible | Q(pk__in=shared) if shared else visible)


def requests_for(*, actor: Actor, filters: Mapping[str, Any] | None = None, request: Any = None) -> QuerySet[WorkloadRequest]:
    """Requests in the projects ``actor`` can see (a token: its project only); ops see all."""
    visible = request_scope_for(actor=actor).select_related(
        "tenant", "project", "template", "flavor", "requested_by", "approved_by"
    )
    if filters:
        return RequestFilter(filters, queryset=visible, request=request).qs
    return visible


# The API's request list and detail read rows, not model instances: the related objects they show come as
# scalar subqueries (one index probe each), never joins. PostgreSQL plans a six-table join in 17-90 ms and
# runs it in 1-6 (docs/performance.md); each subquery is planned on its own, in microseconds.
REQUEST_ROW_COLUMNS = (
    "id", "name", "image", "gpus", "replicas", "cpu", "memory_gib", "share_memory_mib", "share_cores_percent",
    "parameters", "duration_hours", "priority", "state", "state_reason", "pending_reason", "decision_comment", "created_at", "updated_at", "approved_at",
    "queued_at", "started_at", "finished_at", "expires_at", "template_id", "tenant_id", "flavor_id", "topology",
)


# Where a request runs and why (federation, workloads/routing.py): the API detail's ``placement``.
PLACEMENT_COLUMNS = ("spilled", "spilled_from_model", "route_reason", "spill_consent", "accepted_models",
                     "min_gpu_memory_gib", "min_compute_capability", "kueue_flavors")


def _one(model: Any, column: str, key: str, outer: Any = WorkloadRequest) -> RawSQL:
    """``(SELECT column FROM model's table WHERE pk = outer.key)``. Written out once rather than as a Subquery of
    a queryset: Django compiles eleven of those in ~10 ms per call, more than the query takes to run."""
    qn = connection.ops.quote_name
    field = model._meta.get_field(column)
    sql = (f"SELECT r.{qn(field.column)} FROM {qn(model._meta.db_table)} r "
           f"WHERE r.{qn(model._meta.pk.column)} = {qn(outer._meta.db_table)}.{qn(key)}")
    return RawSQL(sql, (), output_field=field)


# The API list's page, unfiltered (the common call: a pipeline polling the first page, a walk by cursor): compiled
# once per process and shape (portal.compiled), one Compiled per ordering, direction, page size and scope kind.
_PAGES: dict[Hashable, Compiled] = {}


def request_page(*, actor: Actor, keys: list[tuple[str, bool]], values: list | None, backwards: bool,
                 limit: int) -> list[dict[str, Any]]:
    """``request_rows`` of the requests ``actor`` can see, as ``portal.api.keyset_page`` pages them (``limit`` rows
    after ``values`` in the order ``keys``): what the API list reads when no filter is asked, from a kept query."""
    from portal.api import keyset_page

    scope = scope_of(actor)
    if shares_held(actor):  # requests shared with the actor: planned with them each time (few people have any)
        return list(keyset_page(request_rows(request_scope_for(actor=actor)), keys, values, backwards)[:limit])
    everything = scope.everything
    ids = () if everything else tuple(sorted(scope.visible_projects))
    # Prepared (planned once) for everything or one project, where one index gives the order whatever the values;
    # for several projects the best plan depends on their sizes, so it is planned with the values each time.
    single = everything or len(ids) == 1
    shape = (everything, single, tuple(keys), backwards, limit, values is None)
    compiled = _PAGES.get(shape)
    if compiled is None:
        def build(*args: Any) -> QuerySet:
            queryset = WorkloadRequest.objects.all()
            if not everything:
                queryset, args = queryset.filter(project_id__in=args[0]), args[1:]
            return keyset_page(request_rows(queryset), keys, list(args) if args else None, backwards)[:limit]

        compiled = _PAGES.setdefault(shape, Compiled(build, prepare=single))
    return compiled.rows(*([] if everything else [ids]), *(values or []))


def request_rows(queryset: QuerySet[WorkloadRequest], *, detail: bool = False,
                 also: tuple[str, ...] = ()) -> QuerySet[WorkloadRequest]:
    """``queryset`` (from ``request_scope_for``, filtered and ordered) as dicts: ``REQUEST_ROW_COLUMNS`` and what
    the API shows of the related rows (``tenant_slug``, ``project_slug``, ``project_cluster_namespace``, ``template_*``,
    ``flavor_name``, ``flavor_display_name``, ``requested_by_username``, ``approved_by_username``); ``detail`` adds
    ``cluster_status``, ``has_extension_requests`` and on PostgreSQL ``timeline_json`` (the timeline as a JSON
    list of [at, from_state, to_state, actor_label, message], oldest first); ``also``: more of the request's own
    columns."""
    from django.contrib.auth import get_user_model

    from tenants.models import Tenant

    user = get_user_model()
    related = {
        "tenant_slug": _one(Tenant, "slug", "tenant_id"),
        "project_slug": _one(Project, "slug", "project_id"),
        "project_cluster_namespace": _one(Project, "cluster_namespace", "project_id"),
        "template_kind": _one(ServiceTemplate, "kind", "template_id"),
        "template_slug": _one(ServiceTemplate, "slug", "template_id"),
        "template_version": _one(ServiceTemplate, "version", "template_id"),
        "template_name": _one(ServiceTemplate, "name", "template_id"),
        "flavor_name": _one(Flavor, "name", "flavor_id"),
        "flavor_display_name": _one(Flavor, "display_name", "flavor_id"),
        "requested_by_username": _one(user, "username", "requested_by_id"),
        "approved_by_username": _one(user, "username", "approved_by_id"),
    }
    columns: tuple[str, ...] = (*REQUEST_ROW_COLUMNS, *also)
    if detail:
        columns = (*columns, "cluster_status", "project_id", *PLACEMENT_COLUMNS)
        related.update(cluster_name=_one(Cluster, "name", "cluster_id"), cluster_zone=_one(Cluster, "zone", "cluster_id"),
                       flavor_gpu_model=_one(Flavor, "gpu_model", "flavor_id"),
                       redispatched_from_name=_one(Cluster, "name", "redispatched_from_id"))
        qn = connection.ops.quote_name
        if connection.vendor == "postgresql":  # the timeline in the same round trip (else request_timeline_rows)
            related["timeline_json"] = RawSQL(
                f"SELECT COALESCE(json_agg(json_build_array(e.{qn('at')}, e.{qn('from_state')}, e.{qn('to_state')}, "
                f"e.{qn('actor_label')}, e.{qn('message')}) ORDER BY e.{qn('at')}, e.{qn('id')}), '[]')::text "
                f"FROM {qn(RequestEvent._meta.db_table)} e "
                f"WHERE e.{qn('request_id')} = {qn(WorkloadRequest._meta.db_table)}.{qn('id')}", (), output_field=TextField())
        related["has_extension_requests"] = RawSQL(
            f"EXISTS (SELECT 1 FROM {qn(ExtensionRequest._meta.db_table)} e "
            f"WHERE e.{qn('request_id')} = {qn(WorkloadRequest._meta.db_table)}.{qn('id')})", (), output_field=BooleanField())
    return queryset.values(*columns, **related)


def _detail_row_query(pk: int, ids: tuple[int, ...] | None = None) -> QuerySet[WorkloadRequest]:
    requests = WorkloadRequest.objects.all() if ids is None else WorkloadRequest.objects.filter(project_id__in=ids)
    return request_rows(requests.filter(pk=pk).order_by("pk"), detail=True)[:1]


# The API detail's row, compiled once per process and shape (portal.compiled): Django took longer to build and compile
# its fourteen subqueries than PostgreSQL took to run them.
_DETAIL_ROW_ANYWHERE = Compiled(lambda pk: _detail_row_query(pk))  # noqa: PLW0108 fixes the arity: pk only
_DETAIL_ROW_IN = Compiled(lambda pk, ids: _detail_row_query(pk, ids))  # noqa: PLW0108 fixes the arity: both


def request_detail_row(*, actor: Actor, pk: int) -> dict[str, Any] | None:
    """``request_rows(detail=True)`` of request ``pk`` if ``actor`` can see it (``request_scope_for``), else None."""
    scope = scope_of(actor)
    if scope.everything:
        rows = _DETAIL_ROW_ANYWHERE.rows(pk)
    else:
        rows = _DETAIL_ROW_IN.rows(pk, tuple(sorted(scope.visible_projects)))
        if not rows and pk in shares_held(actor):  # shared with the actor (workloads.sharing)
            rows = _DETAIL_ROW_ANYWHERE.rows(pk)
    return rows[0] if rows else None


def flavors_by_id(ids: Iterable[int]) -> dict[int, Flavor]:
    """The flavors of a page of rows, by id, in one query (what the cost estimate prices)."""
    return Flavor.objects.in_bulk(set(ids))


def request_timeline_rows(request_id: int) -> QuerySet[RequestEvent, Any]:  # rows: values() dicts
    """``request_timeline`` as dicts (the API's detail)."""
    return RequestEvent.objects.filter(request_id=request_id).order_by("at", "id").values(
        "at", "from_state", "to_state", "actor_label", "message"
    )


def request_extension_rows(request_id: int) -> list[dict[str, Any]]:
    """The request's extension requests, newest first, as dicts with their people's usernames and the tenant
    of the request's project (the API's detail)."""
    from django.contrib.auth import get_user_model

    user = get_user_model()
    return cast(list[dict[str, Any]], list(  # values() rows: the stubs type them as a TypedDict
        ExtensionRequest.objects.filter(request_id=request_id).order_by("-created_at", "-id").values(
            "id", "hours", "replicas", "reason", "status", "decided_at", "comment", "created_at",
            requested_by_username=_one(user, "username", "requested_by_id", ExtensionRequest),
            decided_by_username=_one(user, "username", "decided_by_id", ExtensionRequest),
            project_tenant_slug=Subquery(
                Project.objects.filter(pk=OuterRef("request__project_id")).order_by().values("tenant__slug")[:1]),
        )
    ))


def request_timeline(request: WorkloadRequest) -> QuerySet[RequestEvent]:
    return request.events.order_by("at", "id")


def approvals_inbox_for(*, actor: Actor, context: bool = True) -> QuerySet[WorkloadRequest]:
    """Requests awaiting approval in the projects where ``actor`` may approve, oldest first.

    Each row carries its context for the approver: ``waiting_ahead`` (requests of the project in
    the same flavor already approved and waiting for capacity), ``in_use`` (GPUs, or CPUs for the
    CPU flavor, that the project's running requests hold in that flavor) and ``quota_rows`` (the
    project's Quota rows, prefetched). See ``approval_context()``. ``context=False``: the rows alone, for a
    list that reads a page of them first and then their context with ``with_approval_context`` (two queries for
    the page instead of two subqueries per row and a prefetch).
    """
    approvable = scope_of(actor).in_projects("project", "approve_project")
    if not context:
        return requests_for(actor=actor).filter(approvable, state=S.PENDING_APPROVAL).order_by("created_at", "id")
    same = WorkloadRequest.objects.filter(project=OuterRef("project"), flavor=OuterRef("flavor")).order_by()
    ahead = same.filter(state__in=IN_QUEUE).values("project").annotate(n=Count("pk")).values("n")
    in_use = (
        same.filter(state=S.RUNNING)
        .values("project")
        .annotate(n=Sum(F("gpus") * F("replicas"), output_field=IntegerField()))
        .values("n")
    )
    return (
        requests_for(actor=actor)
        .filter(approvable, state=S.PENDING_APPROVAL)
        .annotate(
            waiting_ahead=Coalesce(Subquery(ahead, output_field=IntegerField()), Value(0)),
            in_use=Coalesce(Subquery(in_use, output_field=IntegerField()), Value(0)),
        )
        .prefetch_related(
            # approval_context() reads the rows' own columns (flavor_id, not the flavor): no join.
            Prefetch("project__quotas", queryset=Quota.objects.all(), to_attr="quota_rows")
        )
        .order_by("created_at", "id")
    )


# The quota rows of these projects, in each project's and flavor's order by resource (approval_context reads one
# flavor's rows, in the order Quota's own ordering gives them), and per (project, flavor) what waits in the queue
# and what runs: compiled once per process and number of ids (portal.compiled).
_QUOTA_ROWS_OF = Compiled(
    lambda project_ids: Quota.objects.filter(project_id__in=project_ids).order_by("project_id", "flavor_id", "resource")
)
_QUEUE_OF = Compiled(
    lambda project_ids, flavor_ids: WorkloadRequest.objects.filter(
        project_id__in=project_ids, flavor_id__in=flavor_ids, state__in=[*IN_QUEUE, S.RUNNING])
    .order_by().values("project_id", "flavor_id")
    .annotate(waiting_ahead=Count("pk", filter=Q(state__in=IN_QUEUE)),
              in_use=Sum(F("gpus") * F("replicas"), filter=Q(state=S.RUNNING), output_field=IntegerField()))
)


def _approval_context_read(pairs: set[tuple[int, int]]) -> tuple[dict[int, list[Quota]], dict[tuple[int, int], Any]]:
    """For these (project, flavor) pairs: each project's quota rows, and per pair what waits and what runs (two
    queries)."""
    projects = tuple(sorted({p for p, _ in pairs}))
    flavors = tuple(sorted({f for _, f in pairs}))
    quota_rows: dict[int, list[Quota]] = {pk: [] for pk in projects}
    for row in _QUOTA_ROWS_OF.rows(projects):
        quota_rows[row.project_id].append(row)
    return quota_rows, {(q["project_id"], q["flavor_id"]): q for q in _QUEUE_OF.rows(projects, flavors)}


def with_approval_context_rows(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``with_approval_context`` for rows of ``request_rows(..., also=("project_id",))`` (the API inbox's):
    ``waiting_ahead``, ``in_use`` and ``quota_rows`` put in each row; two queries for any number of rows."""
    if not rows:
        return rows
    quota_rows, queue = _approval_context_read({(r["project_id"], r["flavor_id"]) for r in rows})
    for r in rows:
        found = queue.get((r["project_id"], r["flavor_id"]), {})
        r.update(waiting_ahead=found.get("waiting_ahead") or 0, in_use=found.get("in_use") or 0,
                 quota_rows=quota_rows[r["project_id"]])
    return rows


def with_approval_context(requests: list[WorkloadRequest]) -> list[WorkloadRequest]:
    """What ``approvals_inbox_for`` annotates and prefetches, put on rows read with ``context=False``:
    ``waiting_ahead``, ``in_use`` and the project's ``quota_rows``; two queries for any number of rows."""
    if not requests:
        return requests
    quota_rows, queue = _approval_context_read({(r.project_id, r.flavor_id) for r in requests})
    for r in requests:
        found = queue.get((r.project_id, r.flavor_id), {})
        # Attributes the page reads, set on the instances (django-stubs types only the model's fields).
        r.waiting_ahead = found.get("waiting_ahead") or 0  # type: ignore[attr-defined]
        r.in_use = found.get("in_use") or 0  # type: ignore[attr-defined]
        r.project.quota_rows = quota_rows[r.project_id]  # type: ignore[attr-defined]
    return requests


def approvals_inbox_rows(*, actor: Actor) -> QuerySet[WorkloadRequest]:
    """``approvals_inbox_for(context=False)`` without the visibility filter and the shares it reads: every project
    where the actor may approve is one they see (``tenants.access.PROJECT_PERMS``: ``approve_project`` comes with
    ``view_project``), so only the approvable ones filter. No related rows joined (the page chooses)."""
    return WorkloadRequest.objects.filter(scope_of(actor).in_projects("project", "approve_project"),
                                          state=S.PENDING_APPROVAL).order_by("created_at", "id")


def inbox_extension_rows(*, actor: Actor) -> QuerySet[ExtensionRequest]:
    """``extension_requests_for(inbox=True)`` without the visibility filter (implied, as in ``approvals_inbox_rows``)
    and without related rows joined."""
    return ExtensionRequest.objects.filter(scope_of(actor).in_projects("request__project", "approve_project"),
                                           status=ExtensionRequest.Status.PENDING).order_by("created_at", "id")


# The inbox's first page, unfiltered (what an approver opens): one kept, prepared query per list, shape (related rows,
# columns, page size) and number of projects (portal.compiled). Through the ORM, Django compiled each five-join query
# in 1-1.5 ms and PostgreSQL planned it in 1.4-2 ms, longer than it ran (docs/performance.md).
_INBOX_PAGES: dict[Hashable, Compiled] = {}


def inbox_first_page(*, actor: Actor, extensions: bool, related: tuple[str, ...], columns: tuple[str, ...],
                     limit: int) -> list[Any]:
    """The first ``limit`` rows of ``approvals_inbox_rows`` (``extensions``: of ``inbox_extension_rows``) with
    ``related`` joined and only ``columns`` read: what ``list(rows.select_related(*related).only(*columns)[:limit])``
    gives, from a kept query."""
    scope = scope_of(actor)
    everything = scope.everything
    ids = () if everything else tuple(scope.project_ids("approve_project"))
    if not everything and not ids:
        return []
    shape = (extensions, everything, related, columns, limit)
    compiled = _INBOX_PAGES.get(shape)
    if compiled is None:
        def build(*args: Any) -> QuerySet:
            if extensions:
                rows: QuerySet = ExtensionRequest.objects.filter(status=ExtensionRequest.Status.PENDING)
                rows = rows if everything else rows.filter(request__project_id__in=args[0])
            else:
                rows = WorkloadRequest.objects.filter(state=S.PENDING_APPROVAL)
                rows = rows if everything else rows.filter(project_id__in=args[0])
            return rows.select_related(*related).only(*columns).order_by("created_at", "id")[:limit]

        compiled = _INBOX_PAGES.setdefault(shape, Compiled(build))
    return compiled.rows(*(() if everything else (ids,)))


_APPROVABLE = Compiled(lambda ids: Project.objects.filter(pk__in=ids).order_by("name").values_list("pk", "slug", "name"))
_ALL_PROJECTS = Compiled(lambda: Project.objects.order_by("name").values_list("pk", "slug", "name"))


def approvable_projects(*, actor: Actor) -> list[tuple[int, str, str]]:
    """(id, slug, name) of the projects where ``actor`` may approve, by name: the inbox's projects (one kept query,
    ``portal.compiled``), kept in the shared cache per set of projects under ``tenants.access.APPROVALS`` (a project
    saved or deleted, a membership changed: ``approvals_changed``), so a warm inbox reads no table for them."""
    scope = scope_of(actor)
    if scope.everything:
        return shared(APPROVALS, "approvable-projects:all", lambda: list(_ALL_PROJECTS.rows()))
    ids = tuple(sorted(scope.project_ids("approve_project")))
    key = "approvable-projects:" + hashlib.sha1(",".join(map(str, ids)).encode()).hexdigest()
    return shared(APPROVALS, key, lambda: list(_APPROVABLE.rows(ids)))


def _row_names() -> tuple[dict[int, ServiceTemplate], dict[int, Flavor]]:
    return ({t.pk: t for t in ServiceTemplate.objects.only("id", "name")},
            {f.pk: f for f in Flavor.objects.only("id", "name", "display_name")})


def attach_template_and_flavor(rows: list[WorkloadRequest]) -> None:
    """Give the ops list's rows their template and flavor (the name each row shows) from the table of every
    template's and flavor's name kept with the catalogue (``CATALOGUE``: a template or flavor written reads it
    again), not from two queries per page; each distinct one a new instance for this call. A row whose template
    or flavor the kept table lacks (written since) has both read from the database (``prefetch_related``)."""
    from django.db.models import prefetch_related_objects

    templates, flavors = CATALOGUE.get("row-names", _row_names)
    mine: dict[tuple[str, int], Any] = {}
    missing = []
    for row in rows:
        if row.template_id not in templates or (row.flavor_id is not None and row.flavor_id not in flavors):
            missing.append(row)
            continue
        key = ("t", row.template_id)
        if key not in mine:
            mine[key] = copy.copy(templates[row.template_id])
        row.template = mine[key]
        if row.flavor_id is not None:
            key = ("f", row.flavor_id)
            if key not in mine:
                mine[key] = copy.copy(flavors[row.flavor_id])
            row.flavor = mine[key]
    if missing:
        prefetch_related_objects(missing, "template", "flavor")


def visible_project_choices(*, actor: Actor) -> list[tuple[str, str]]:
    """(slug, name) of the projects ``actor`` sees, by name: the request list's project filter. Kept as
    ``approvable_projects`` is (under ``APPROVALS``, per set of projects: a project saved or deleted, a membership
    changed reads them again), so a warm request list reads no project for its drop-down."""
    scope = scope_of(actor)
    if scope.everything:
        rows = shared(APPROVALS, "approvable-projects:all", lambda: list(_ALL_PROJECTS.rows()))
    else:
        ids = tuple(sorted(scope.visible_projects))
        key = "visible-projects:" + hashlib.sha1(",".join(map(str, ids)).encode()).hexdigest()
        rows = shared(APPROVALS, key, lambda: list(_APPROVABLE.rows(ids)))
    return [(slug, name) for _, slug, name in rows]


def extension_requests_for(*, actor: Actor, inbox: bool = False) -> QuerySet[ExtensionRequest]:
    """Extension requests of the requests ``actor`` can see (``requests_for``), newest first.

    ``inbox``: only the pending ones in projects where ``actor`` may decide (``policy.may_decide``), oldest first.
    """
    # A pending extension request (the inbox's) is decided by nobody yet: no join for it.
    related = ("request__project__tenant", "request__template", "request__flavor", "requested_by")
    base = ExtensionRequest.objects.select_related(*related, *(() if inbox else ("decided_by",)))
    scope = scope_of(actor)
    base = base.filter(scope.in_projects("request__project"))
    if not inbox:
        return base.order_by("-created_at", "-id")
    approvable = scope.in_projects("request__project", "approve_project")
    return base.filter(approvable, status=ExtensionRequest.Status.PENDING).order_by("created_at", "id")


class _Count(Subquery):
    """``(SELECT count(*) FROM (<queryset>))``: a queryset's count as an expression, so that several counts come
    back in one query."""

    template = "(SELECT count(*) FROM (%(subquery)s) _counted)"
    output_field = IntegerField()


def approvals_waiting(*, actor: Actor) -> QuerySet[WorkloadRequest]:
    """The workload requests waiting for ``actor``'s decision: pending approval, or with a pending extension
    request, in the projects where ``actor`` may decide (the Approvals inbox's rows)."""
    approvable = scope_of(actor).in_projects("project", "approve_project")
    extension_waits = ExtensionRequest.objects.filter(request=OuterRef("pk"), status=ExtensionRequest.Status.PENDING)
    return WorkloadRequest.objects.filter(approvable).filter(Q(state=S.PENDING_APPROVAL) | Exists(extension_waits))


def approvals_waiting_counts(*, actor: Actor) -> dict[str, int]:
    """How many things wait for ``actor``'s decision: ``requests`` (``approvals_waiting``) and ``quota`` (the quota
    requests inbox, ``quotas.selectors.quota_requests_for(inbox=True)``); ``extensions``, the pending extension
    requests among them (``inbox_extension_rows``: the inbox reads none while it is 0). One query for all three."""
    from django.contrib.auth import get_user_model

    from quotas.selectors import quota_requests_for

    if actor.user is None or not actor.user.is_authenticated or actor.token is not None:
        return {"requests": 0, "quota": 0, "extensions": 0}  # an API token decides nothing
    row = (
        get_user_model().objects.filter(pk=actor.user.pk)
        .annotate(requests=_Count(approvals_waiting(actor=actor).order_by().values("pk")),
                  quota=_Count(quota_requests_for(actor=actor, inbox=True).order_by().values("pk")),
                  extensions=_Count(inbox_extension_rows(actor=actor).order_by().values("pk")))
        .values_list("requests", "quota", "extensions")
        .first()
    )
    requests, quota, extensions = row or (0, 0, 0)
    return {"requests": requests or 0, "quota": quota or 0, "extensions": extensions or 0}


def approvals_waiting_counts_kept(*, actor: Actor) -> dict[str, int]:
    """``approvals_waiting_counts``, kept per user in the shared cache until something they count changes
    (``portal.cache.shared`` under ``tenants.access.APPROVALS``; every write that can change them calls
    ``tenants.access.approvals_changed``): the navigation's badges on every page of an approver or ops, one
    cache read."""
    user = actor.user
    if user is None or not user.is_authenticated or actor.token is not None:
        return {"requests": 0, "quota": 0, "extensions": 0}
    return dict(shared(APPROVALS, f"approvals-waiting:{user.pk}:2", lambda: approvals_waiting_counts(actor=actor)))


def request_approvers(*, project: Any, exclude_user_id: int | None = None) -> list[Any]:
    """Who is told that a request of ``project`` waits for a decision: the holders of ``policy.may_decide`` on the
    project (``tenants.policy.holders``: project admins, the tenant's admins, active), less ``exclude_user_id`` (the
    requester). Platform ops may decide everywhere but are told only where nobody else could decide."""
    from tenants.access import told
    from tenants.policy import holders

    from .policy import may_decide

    return told(holders(may_decide, project), exclude_user_id=exclude_user_id)


def _number(value: Decimal | None) -> float | None:
    return None if value is None else float(value)


def request_cost_estimate(request: Any) -> str | None:
    """The estimated cost of a request (or of a form's values) as a decimal string ("12.50"), None
    while no estimator is registered (``portal.extensions.cost_estimator``)."""
    value = cost_estimator.estimate(request)
    return None if value is None else str(value)


def approval_context(request: WorkloadRequest) -> dict[str, Any]:
    """What an approver needs beside the request: usage against quota, the queue, the cost."""
    rows = getattr(request.project, "quota_rows", None)  # prefetched by approvals_inbox_for()
    if rows is None:
        rows = Quota.objects.filter(project=request.project)
    return approval_context_of(quota_rows=rows, flavor_id=request.flavor_id, in_use=getattr(request, "in_use", None),
                               waiting_ahead=getattr(request, "waiting_ahead", None),
                               cost_estimate=request_cost_estimate(request))


def approval_context_of(*, quota_rows: Iterable[Quota], flavor_id: int | None, in_use: int | None,
                        waiting_ahead: int | None, cost_estimate: str | None) -> dict[str, Any]:
    """``approval_context`` from its parts: the project's quota rows (those of ``flavor_id`` are shown), the GPUs in
    use, the requests waiting ahead and the cost estimate (None without a price list)."""
    rows = [row for row in quota_rows if row.flavor_id == flavor_id]
    return {
        "quota": [
            {
                "resource": row.resource,
                "nominal": _number(row.nominal),
                "borrowing_limit": _number(row.borrowing_limit),
                "used": _number(row.used),
            }
            for row in rows
        ],
        "in_use": in_use,
        "waiting_ahead": waiting_ahead,
        # From billing's price list once it registers an estimator (portal.extensions); None until then.
        "cost_estimate": cost_estimate,
    }


def request_pending_reason(request: WorkloadRequest) -> str:
    """A plain answer to "why is it not running yet?", or "" when it is not waiting."""
    if request.state == S.PENDING_APPROVAL:
        # pending_reason holds why the rule did not approve it ("4 GPUs is more than the 2 ..."); the
        # approvers' inbox shows it alone, as "Why you".
        why = f": {request.pending_reason}" if request.pending_reason else "."
        return capfirst(awaiting_approval_sentence(request.updated_at)) + why
    if request.state == S.SUBMITTED:
        return "Submitted; the approval rules are being applied."
    if request.state == S.APPROVED:
        return request.pending_reason or "Approved; the portal is creating it in the cluster."
    if request.state in (S.QUEUED, S.PREEMPTED):
        return request.pending_reason or (
            f"Waiting in project {request.project.slug}'s queue for {request.gpus} x {request.flavor}"
            + (f" x {request.replicas}" if request.replicas > 1 else "") + "."
        )
    return ""


def live_templates() -> QuerySet[ServiceTemplate]:
    """One version per slug: the newest active one. Older versions are retired for new submissions."""
    newer = ServiceTemplate.objects.filter(slug=OuterRef("slug"), active=True, version__gt=OuterRef("version"))
    return ServiceTemplate.objects.filter(active=True).exclude(Exists(newer))


def live_template(slug: str) -> ServiceTemplate | None:
    """The version of ``slug`` that new requests use; None if the template is not offered."""
    return live_templates().filter(slug=slug).first()


def templates_for(*, actor: Actor) -> QuerySet[ServiceTemplate]:
    """Templates an actor may look at: the live versions; ops also see retired ones (ops pages)."""
    base = ServiceTemplate.objects.prefetch_related("allowed_flavors__cluster")
    return base if _is_ops(actor) else base.filter(pk__in=live_templates().values("pk"))


def catalogue_for(*, actor: Actor, projects: Iterable[Project] | None = None) -> QuerySet[ServiceTemplate]:
    """The catalogue to submit from: one entry per slug, its live version, for everyone (the API's list, the
    new-request page and its form all start here).

    With ``projects`` (where the actor would submit): only the templates at least one of those projects can
    use, that is with a flavor ``template_flavors_for`` offers there."""
    live = templates_for(actor=actor).filter(pk__in=live_templates().values("pk"))
    if projects is None:
        return live
    usable = [t.pk for t in live if template_flavors_for(template=t, projects=projects)]
    return live.filter(pk__in=usable)


def template_flavors_for(*, template: ServiceTemplate, projects: Iterable[Project] | None = None) -> list[Flavor]:
    """The flavors a request from ``template`` may ask for: allowed by the template, active, enforced by their
    cluster's architecture (``quotas.selectors.enforced_flavor_q``), schedulable for the template's kind
    (``kinds.kueue_cannot_admit``), and, with ``projects``, where one of them has quota (a ceiling above
    0: ``quota_ceiling``) and the queues rendered for it can admit the template's kind on the flavor given enough
    free capacity (``quotas.selectors.queue_offers``: ``quotas.manifests.queue_admits``). The submission service
    refuses the others with the reason; the form, the catalogue, the API and the CLI never offer them. Never a
    MultiKueue worker's flavor."""
    from quotas.selectors import enforced_flavor_q

    from .kinds import kueue_cannot_admit

    # A Kueue MultiKueue worker's flavors are never offered: work reaches a worker through its manager only, under
    # the manager's flavors and quota (docs/federation.md, "Kueue MultiKueue").
    flavors = [
        f for f in template.allowed_flavors.filter(enforced_flavor_q()).exclude(cluster__role="worker")
        .select_related("cluster").order_by("order", "name")
        if not kueue_cannot_admit(kind=template.kind, flavor=f) and f.hami_sized
    ]
    if projects is None:
        return flavors
    projects = list(projects)
    admitted = queue_offered_flavors(projects=projects, kind=template.kind)
    usable = set().union(*(ids & admitted.get(pk, set()) for pk, ids in flavors_with_quota(projects=projects).items()))
    return [f for f in flavors if f.pk in usable]


def queue_offered_flavors(*, projects: Iterable[Project], kind: str) -> dict[int, set[int]]:
    """Per project id, the ids of the flavors its queues admit ``kind`` on (``quotas.selectors.queue_offers``)."""
    from quotas.selectors import queue_offers

    from . import kinds

    out: dict[int, set[int]] = {}
    for project, _kind, flavor in queue_offers(projects=list(projects), kinds=[kinds.get(kind)]):
        out.setdefault(project, set()).add(flavor)
    return out


def queue_offered_flavors_kept(*, project: Project, kind: str) -> set[int] | None:
    """``queue_offered_flavors`` of one project from the process's copy (``quotas.selectors.OFFERS``), for a caller
    about to open its transaction; None inside one, where nothing is kept (the caller asks in place)."""
    from quotas.selectors import OFFERS

    if not OFFERS.usable():
        return None
    return queue_offered_flavors(projects=[project], kind=kind).get(project.pk, set())


# Submitting again: a request's values, saved presets ------------------------------------------------------

# The values a preset keeps and a clone copies: what the new-request form submits, but the request's name.
PRESET_KEYS = ("flavor", "image", "gpus", "replicas", "cpu", "memory_gib", "duration_hours", "priority", "parameters",
               "topology")


def request_values(request: WorkloadRequest) -> dict[str, Any]:
    """What ``request`` was submitted with, as a preset keeps it (``PRESET_KEYS``; ``cpu`` as text): the values a
    clone starts from. Replicas only where the kind takes them freely (training derives them from parameters)."""
    from . import kinds

    values: dict[str, Any] = {
        "flavor": request.flavor.name, "image": request.image, "gpus": request.gpus, "cpu": f"{request.cpu.normalize():f}",
        "memory_gib": request.memory_gib, "duration_hours": request.duration_hours, "priority": request.priority,
        "parameters": dict(request.parameters or {}),
    }
    if kinds.get(request.template.kind).replicas == "free":
        values["replicas"] = request.replicas
    if request.topology:  # placement by rack or block (issue 26)
        values["topology"] = request.topology
    return values


def presets_for(*, actor: Actor) -> QuerySet[RequestPreset]:
    """The actor's own presets, in the projects they see (a token: its project only). Nobody sees another's."""
    if actor.user is None or not actor.user.is_authenticated:
        return RequestPreset.objects.none()
    return RequestPreset.objects.select_related("project__tenant").filter(
        scope_of(actor).in_projects("project"), owner=actor.user
    )


# Quota: the most a project can ever get ----------------------------------------------------------------


@dataclass(frozen=True)
class Ceiling:
    """The most of one flavor's primary resource the project can ever get at once."""

    resource: str
    nominal: Decimal
    borrowable: Decimal | None  # None: no borrowing limit, bounded by the tenant's cohort
    total: Decimal


def _ceiling(resource: str, row: Quota | None, tenant_nominal: Decimal | None, projects_nominal: Decimal) -> Ceiling:
    """The rule (one place): no row means nothing; a missing borrowing limit means "as much as the cohort has":
    the tenant's row for the flavor (its pool) if there is one, else the sum of its projects' quotas."""
    if row is None:
        return Ceiling(resource, Decimal(0), Decimal(0), Decimal(0))
    if row.borrowing_limit is not None:
        return Ceiling(resource, row.nominal, row.borrowing_limit, row.nominal + row.borrowing_limit)
    cohort = tenant_nominal if tenant_nominal is not None else projects_nominal
    return Ceiling(resource, row.nominal, None, max(row.nominal, cohort))


_PROJECT_QUOTA_ROW = Compiled(  # compiled once per process (portal.compiled)
    lambda project_id, flavor_id, resource: Quota.objects.filter(
        project_id=project_id, flavor_id=flavor_id, resource=resource)[:1]  # the model's order, as first() reads
)


def quota_ceiling(*, project: Project, flavor: Flavor, resource: str = "") -> Ceiling:
    """Nominal quota plus what the project may borrow, for ``flavor``'s ``resource`` (default: its primary one;
    see ``_ceiling``)."""
    resource = resource or flavor.primary_resource
    found = _PROJECT_QUOTA_ROW.rows(project.pk, flavor.pk, resource)
    row = found[0] if found else None
    if row is None or row.borrowing_limit is not None:
        return _ceiling(resource, row, None, Decimal(0))
    tenant_row = Quota.objects.filter(tenant_id=project.tenant_id, project__isnull=True, flavor=flavor, resource=resource).first()
    projects_nominal = Decimal(0)
    if tenant_row is None:
        projects_nominal = Quota.objects.filter(
            tenant_id=project.tenant_id, project__isnull=False, flavor=flavor, resource=resource
        ).aggregate(total=Sum("nominal"))["total"] or Decimal(0)
    return _ceiling(resource, row, tenant_row.nominal if tenant_row else None, projects_nominal)


Ceilings = dict[tuple[int, str], Ceiling]  # one project's, by (flavor id, resource): what ``quota_ceiling`` answers


def quota_ceilings_kept(*, project: Project) -> Ceilings | None:
    """Every ``quota_ceiling`` of ``project`` (a flavor and resource not in it: no quota), from the process's copy of
    its tenant's quota rows (kept at ``quotas.selectors.OFFERS``' version, which every quota write moves), for a
    caller about to open its transaction: the submission's "can it ever run" check needs no query of its own. None
    inside a transaction, where nothing is kept (the caller asks ``quota_ceiling``)."""
    from quotas.selectors import OFFERS

    if not OFFERS.usable():
        return None
    by_tenant: dict[int, dict[int, Ceilings]] = OFFERS.get("ceilings", dict)
    tenant = by_tenant.get(project.tenant_id)
    if tenant is None:
        tenant = by_tenant[project.tenant_id] = _tenant_ceilings(project.tenant_id)
    return tenant.get(project.pk, {})


def _tenant_ceilings(tenant_id: int) -> dict[int, Ceilings]:
    """``quota_ceiling`` of every quota row of the tenant's projects, by project id: one query."""
    rows = list(Quota.objects.filter(tenant_id=tenant_id).order_by("project_id", "flavor_id", "resource", "id"))
    pools = {(r.flavor_id, r.resource): r.nominal for r in rows if r.project_id is None}
    projects_nominal: dict[tuple[int, str], Decimal] = {}
    for row in rows:
        if row.project_id is not None:
            key = (row.flavor_id, row.resource)
            projects_nominal[key] = projects_nominal.get(key, Decimal(0)) + row.nominal
    out: dict[int, Ceilings] = {}
    for row in rows:
        key = (row.flavor_id, row.resource)
        if row.project_id is not None and key not in out.setdefault(row.project_id, {}):  # the first, as first() reads
            out[row.project_id][key] = _ceiling(row.resource, row, pools.get(key), projects_nominal.get(key, Decimal(0)))
    return out


def ceiling_of(ceilings: Ceilings | None, *, project: Project, flavor: Flavor, resource: str = "") -> Ceiling:
    """``quota_ceiling`` from ``ceilings`` (``quota_ceilings_kept``), or read now when there are none."""
    if ceilings is None:
        return quota_ceiling(project=project, flavor=flavor, resource=resource)
    resource = resource or flavor.primary_resource
    found = ceilings.get((flavor.pk, resource))
    return found if found is not None else _ceiling(resource, None, None, Decimal(0))


def flavors_with_quota(*, projects: Iterable[Project]) -> dict[int, set[int]]:
    """Per project id, the ids of the flavors whose ceiling (``quota_ceiling``) is above 0. One query."""
    projects = list(projects)
    wanted = {p.pk for p in projects}
    out: dict[int, set[int]] = {pk: set() for pk in wanted}
    if not wanted:
        return out
    rows = list(Quota.objects.filter(tenant_id__in={p.tenant_id for p in projects}).select_related("flavor"))
    tenant_nominal: dict[tuple[int, int, str], Decimal] = {}
    projects_nominal: dict[tuple[int, int, str], Decimal] = {}
    for row in rows:
        key = (row.tenant_id, row.flavor_id, row.resource)
        if row.project_id is None:
            tenant_nominal[key] = row.nominal
        else:
            projects_nominal[key] = projects_nominal.get(key, Decimal(0)) + row.nominal
    for row in rows:
        if row.project_id not in wanted or row.resource != row.flavor.primary_resource:
            continue
        key = (row.tenant_id, row.flavor_id, row.resource)
        if _ceiling(row.resource, row, tenant_nominal.get(key), projects_nominal.get(key, Decimal(0))).total > 0:
            out[row.project_id].add(row.flavor_id)
    return out


# The submission catalogue: the live templates with their allowed flavors and those flavors' clusters, the active
# images and the approval rules, read once per process and version (``portal.cache``). Every write to those tables
# forgets it (signals in ``workloads.apps``; ``quotas`` calls ``portal.cache.changed("catalogue")`` after an
# ``update()`` of a cluster's architecture). Inside a transaction the tables are read.
CATALOGUE = Versioned("catalogue")


def _live_catalogue() -> dict[str, ServiceTemplate]:
    rows = live_templates().prefetch_related(Prefetch("allowed_flavors", queryset=Flavor.objects.select_related("cluster")))
    out = {}
    for template in rows:
        template.is_live = True  # type: ignore[attr-defined]
        out[template.slug] = template
    return out


def _template_copy(template: ServiceTemplate) -> ServiceTemplate:
    """A copy of the memo's template for one caller (its own field cache); the allowed flavors, with their clusters,
    are the memo's (read only)."""
    out = copy.copy(template)
    out._prefetched_objects_cache = dict(template._prefetched_objects_cache)  # type: ignore[attr-defined]
    return out


def curated_images() -> list[Image]:
    """The active images, in the list's order."""
    return CATALOGUE.get("images", lambda: list(Image.objects.filter(active=True)))


def approval_rules() -> list[ApprovalRule] | None:
    """Every approval rule, from the memo; None inside a transaction (ask the table for the ones needed)."""
    if not CATALOGUE.usable():
        return None
    return CATALOGUE.get("rules", lambda: list(ApprovalRule.objects.all()))


def template_to_submit(*, actor: Actor, key: str) -> ServiceTemplate | None:
    """The template a submission names: by id any version (the service refuses a retired one and names
    the live one), by slug the live one in the catalogue; None if there is no such template."""
    from portal.inputs import is_id

    if CATALOGUE.usable():
        # A copy: the caller's request is written around it, the memo's stays as read.
        live = CATALOGUE.get("templates", _live_catalogue)
        if not is_id(key):
            found = live.get(key)
            return None if found is None else _template_copy(found)
        found = next((t for t in live.values() if t.pk == int(key)), None)
        if found is not None:
            return _template_copy(found)
    # One query for the template and its allowed flavors with their clusters (a prefetch); ``is_live`` tells the
    # service whether it may skip looking the live version up again.
    newer = ServiceTemplate.objects.filter(slug=OuterRef("slug"), active=True, version__gt=OuterRef("version"))
    base = ServiceTemplate.objects.prefetch_related(
        Prefetch("allowed_flavors", queryset=Flavor.objects.select_related("cluster"))
    ).annotate(is_live=ExpressionWrapper(Q(active=True) & ~Exists(newer), output_field=BooleanField()))
    if is_id(key):
        return base.filter(pk=int(key)).first()
    # By slug: its live version (what ``catalogue_for`` offers everyone).
    return base.filter(slug=key, active=True).exclude(Exists(newer)).first()


def template_list_for(*, actor: Actor) -> QuerySet[ServiceTemplate]:
    """``templates_for`` with how many requests use each version and the newest version of its slug (ops list)."""
    newest = ServiceTemplate.objects.filter(slug=OuterRef("slug")).order_by("-version").values("version")[:1]
    return templates_for(actor=actor).annotate(request_count=Count("requests"), latest_version=Subquery(newest))


def template_versions_for(*, template: ServiceTemplate) -> QuerySet[ServiceTemplate]:
    """Every version of ``template``'s slug, newest first, with how many requests use each."""
    return ServiceTemplate.objects.filter(slug=template.slug).annotate(request_count=Count("requests")).order_by("-version")


def template_slug_choices(*, actor: Actor) -> list[tuple[str, str]]:
    """(slug, slug) of the templates ``actor`` may look at, once per slug: a filter's choices."""
    base = ServiceTemplate.objects.all() if _is_ops(actor) else live_templates()
    return list(base.order_by("slug").values_list("slug", "slug").distinct())


def flavor_and_template_choices(*, actor: Actor) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
    """``quotas.selectors.flavor_name_choices`` and ``template_slug_choices`` in one query (a UNION): a request
    filter's two drop-downs. Ops and everyone else each have one answer, kept per process with the catalogue
    (``CATALOGUE``: a template, flavor or cluster written reads them again); inside a transaction always read."""
    ops = _is_ops(actor)
    flavors, slugs = CATALOGUE.get(f"filter-choices:{'ops' if ops else 'live'}",
                                   lambda: _flavor_and_template_choices(actor, ops))
    return list(flavors), list(slugs)


def _flavor_and_template_choices(actor: Actor, ops: bool) -> tuple[tuple[tuple[str, str], ...], ...]:
    from quotas.selectors import flavors_for

    templates = ServiceTemplate.objects.all() if ops else live_templates()
    both = (flavors_for(actor=actor).order_by().values_list("name", Value("flavor"))
            .union(templates.order_by().values_list("slug", Value("template"))))
    flavors: set[str] = set()
    slugs: set[str] = set()
    for value, what in both:
        (flavors if what == "flavor" else slugs).add(value)
    return tuple((n, n) for n in sorted(flavors)), tuple((n, n) for n in sorted(slugs))


def images_for(*, actor: Actor) -> QuerySet[Image]:
    return Image.objects.all() if _is_ops(actor) else Image.objects.filter(active=True)


def volumes_for(*, actor: Actor) -> QuerySet[Volume]:
    """The volumes of the projects the actor sees: the shared ones and the actor's own (ops: all)."""
    base = Volume.objects.select_related("project", "owner")
    if _is_ops(actor):
        return base
    mine = Q(owner__isnull=True) | Q(owner=actor.user) if actor.user is not None else Q(owner__isnull=True)
    return base.filter(scope_of(actor).in_projects("project")).filter(mine)


def approval_rules_for(*, actor: Actor) -> QuerySet[ApprovalRule]:
    """Global rules (everyone may read what applies to them) and the rules of visible projects."""
    base = ApprovalRule.objects.select_related("project__tenant")
    scope = scope_of(actor)
    if scope.everything:
        return base
    return base.filter(Q(project__isnull=True) | scope.in_projects("project"))


# Notebooks and logs --------------------------------------------------------------------------------------------


def notebook_may_open(*, actor: Actor, request: WorkloadRequest) -> bool:
    """Who may open a notebook (through the portal's proxy or the ingress that asks ``/notebooks/auth/``):
    its requester, and the project's approvers only where the project allows it
    (``Project.notebooks_open_to_approvers``, off by default). An API token never opens a notebook.
    The rule is ``workloads.policy.may_open_notebook``."""
    from .policy import may_open_notebook

    return may_open_notebook(actor, request)


@dataclass
class LogLine:
    at: str  # RFC 3339 as the cluster's runtime stamped it (cluster time); "" when the line had none
    text: str


@dataclass
class PodLog:
    name: str
    phase: str = ""
    node: str = ""
    lines: list[LogLine] | None = None  # None: no log (not started yet, or gone)

    @property
    def text(self) -> str:
        return "".join(f"{line.at} {line.text}\n" if line.at else f"{line.text}\n" for line in self.lines or [])


def parse_log(text: str | None) -> list[LogLine] | None:
    """Split a ``timestamps=true`` log into (cluster time, text) lines."""
    if text is None:
        return None
    out = []
    for raw in text.splitlines():
        stamp, _, rest = raw.partition(" ")
        if len(stamp) >= 20 and stamp[4] == "-" and stamp[10] == "T" and stamp.endswith("Z"):
            out.append(LogLine(stamp, rest))
        else:
            out.append(LogLine("", raw))
    return out


def log_time_key(at: str) -> str:
    """An RFC 3339 time as a string that sorts in time order (the runtime trims trailing zeros of the fraction)."""
    if not at:
        return ""
    head, _, frac = at.rstrip("Z").partition(".")
    return f"{head}.{frac.ljust(9, '0')[:9]}"


def logs_for(request: WorkloadRequest, *, tail: int | None = 200, since: str | Mapping[str, str] | None = None,
             pod: str | None = None) -> list[PodLog]:
    """The request's pods (by our request label), each with its log from the cluster's ``log`` subresource.

    ``tail``: the last N lines (None: all); ``since``: only lines stamped at or after this RFC 3339 time (cluster
    time, as in ``LogLine.at``; whole seconds are what every API server takes), or a mapping pod name → such a time;
    ``pod``: only that pod. Lines carry the runtime's timestamps. Visibility is the
    caller's business (``requests_for``). Raises ``ClusterUnavailable``/``ClusterRejected`` when the cluster fails.
    """
    cluster = request.cluster
    if not (cluster.kubeconfig_encrypted or cluster.kubeconfig_path):
        return []
    from portal.kube import kube_for, pod_log_read

    kube = kube_for(cluster)
    namespace = request.project.namespace
    items, _ = kube.list("v1", "Pod", namespace, label_selector=labels.request_selector(request.pk))
    out = []
    for item in sorted(items, key=lambda p: p["metadata"]["name"]):
        name = item["metadata"]["name"]
        if pod is not None and name != pod:
            continue
        since_time = since.get(name) if isinstance(since, Mapping) else since
        lines = parse_log(pod_log_read(kube, namespace, name, tail_lines=tail, since_time=since_time or None,
                                       timestamps=True))
        out.append(PodLog(name=name, phase=(item.get("status") or {}).get("phase", ""),
                          node=(item.get("spec") or {}).get("nodeName", ""), lines=lines))
    return out


def gpus_in_use_by_node(cluster: Cluster) -> dict[str, Decimal]:
    """Whole GPUs the live requests on ``cluster`` hold on each node: for each admitted Workload whose Kueue topology
    assignment the status follower kept (``topo``: host -> pods), pods x GPUs per pod. On a cluster with a topology
    every pod set of a placed flavor gets such an assignment, so this covers the work on placed flavors (the
    per-rack free GPUs of the capacity page, ``quotas.capacity.rack_fragmentation``). One query."""
    used: dict[str, Decimal] = {}
    rows = WorkloadRequest.objects.filter(cluster=cluster, state__in=LIVE_STATES, flavor__kind=Flavor.Kind.WHOLE)
    for gpus, status in rows.values_list("gpus", "cluster_status"):
        for key, value in ((status or {}).get("objects") or {}).items():
            if not key.startswith("workload/") or ((value.get("c") or {}).get("Admitted") or [None])[0] != "True":
                continue
            for host, pods in (value.get("topo") or {}).items():
                used[str(host)] = used.get(str(host), Decimal(0)) + Decimal(int(pods) * gpus)
    return used
