"""Every read of capacity, flavors and quotas that depends on who asks, plus the sums the
invariants are made of. The API viewsets, the portal pages and the services start here."""

from __future__ import annotations

from decimal import ROUND_FLOOR, Decimal
from types import SimpleNamespace
from typing import Any

from django.contrib.auth import get_user_model
from django.db.models import CharField, Count, IntegerField, OuterRef, Q, QuerySet, Subquery, Sum, Value, prefetch_related_objects

from portal.cache import Versioned
from portal.compiled import Compiled
from portal.ui import PAGE_SIZE
from tenants.access import Actor, is_ops, scope_of
from tenants.models import Project, Tenant

from . import architectures
from .capacity import Enforcement, capacity_by_flavor, flavor_matches
from .capacity import flavor_enforcement as _flavor_enforcement
from .models import AppliedObject, ArchitectureChange, Cluster, Flavor, Node, NodePool, Quota, QuotaRequest

ZERO = Decimal(0)
MILLI = Decimal("0.001")
Approver = QuotaRequest.Approver
TIER_RANK: dict[str, int] = {Approver.PROJECT_ADMIN: 0, Approver.TENANT_ADMIN: 1, Approver.OPS: 2}


def _ops(actor: Actor) -> bool:
    return actor.token is None and is_ops(actor.user)


# Clusters and flavors --------------------------------------------------------------------------


def clusters_for(*, actor: Actor) -> QuerySet[Cluster]:
    """Every signed-in user sees that clusters exist (name and architecture; the API shows ops the rest)."""
    return Cluster.objects.all()


def enforced_flavor_q(prefix: str = "") -> Q:
    """``capacity.flavor_enforcement(...).enforced`` as a filter (``prefix``: e.g. ``"flavor__"``).

    Whole GPUs and CPU everywhere; MIG and HAMi where the architecture's entry (``quotas.architectures``)
    has them always, or as a switch and the cluster's ``use_mig`` / ``use_hami`` is on; active flavors only. tests/quotas/test_enforcement.py checks that this and the pure
    function agree for every architecture, switch and kind.
    """
    p = prefix

    def shared_kind(kind: str, switch_field: str) -> Q:
        always = architectures.where(lambda a: getattr(a, kind) == architectures.ALWAYS)
        switch = architectures.where(lambda a: getattr(a, kind) == architectures.SWITCH)
        return Q(**{f"{p}kind": kind}) & (Q(**{f"{p}cluster__architecture__in": always})
                                          | Q(**{f"{p}cluster__architecture__in": switch, f"{p}cluster__{switch_field}": True}))

    return Q(**{f"{p}active": True}) & (
        Q(**{f"{p}kind__in": [Flavor.Kind.WHOLE, Flavor.Kind.CPU]})
        | shared_kind(Flavor.Kind.MIG, "use_mig")
        | shared_kind(Flavor.Kind.HAMI, "use_hami")
    )


def flavors_for(*, actor: Actor) -> QuerySet[Flavor]:
    """Ops see every flavor (deactivated and not-enforced ones too, marked on their pages); everyone
    else only what the cluster's architecture enforces: a flavor nothing enforces is never offered."""
    base = Flavor.objects.select_related("cluster")
    return base if _ops(actor) else base.filter(enforced_flavor_q())


def flavor_name_choices(*, actor: Actor) -> list[tuple[str, str]]:
    """(name, name) of every flavor ``actor`` sees, once per name: a filter's choices."""
    return list(flavors_for(actor=actor).order_by("name").values_list("name", "name").distinct())


# Every enforced flavor with its cluster (``enforced_flavors``), kept per process and version: a write to a flavor or
# a cluster forgets it (the signals in ``quotas.apps``; a queryset ``update()`` of a cluster calls
# ``portal.cache.changed("catalogue")``, which it depends on too). Inside a transaction the table is read.
ENFORCED_FLAVORS = Versioned("enforced-flavors", also=("catalogue",))


def enforced_flavors() -> list[Flavor]:
    """The flavors some cluster enforces (``enforced_flavor_q``) with their clusters, by cluster name, order and name:
    the same for every actor (``flavors_for`` narrowed to the enforced ones, ops' too). Shared rows: read only."""
    return ENFORCED_FLAVORS.get("all", lambda: list(
        Flavor.objects.select_related("cluster").filter(enforced_flavor_q()).order_by("cluster__name", "order", "name")))


def flavors_by_pk(pks: set[int]) -> dict[int, Flavor]:
    """The flavors of rows the caller already holds (say, a project's quota summary), by id."""
    return {f.pk: f for f in Flavor.objects.filter(pk__in=pks)}


def flavors_promised_to(*, tenant: Tenant) -> QuerySet[Flavor]:
    """The enforced flavors ``tenant`` is promised quota of: what its projects' quota may be set in."""
    return (Flavor.objects.filter(enforced_flavor_q(), quotas__tenant=tenant, quotas__project__isnull=True)
            .select_related("cluster").distinct())


def flavor_enforcement(flavor: Flavor) -> Enforcement:
    return _flavor_enforcement(flavor.cluster, flavor)


# What each tenant's queues offer (``queue_offers``), kept per process and version (``portal.cache``): read again after
# any write to a quota row, a project or a tenant ("offers": the signals in ``quotas.apps``, the status moves' effect
# in ``tenants.states``), or to a flavor or a cluster ("catalogue", which every such write already bumps: the signals
# in ``workloads.apps`` and ``quotas.apps``, ``portal.cache.changed("catalogue")`` after a queryset ``update()``).
# Inside a transaction the tables are read.
OFFERS = Versioned("offers", also=("catalogue",))


def queue_offers(*, projects: Any, kinds: Any) -> set[tuple[int, str, int]]:
    """(project id, template kind, flavor id): what the queues rendered for the projects' tenants can admit given
    enough free capacity (``quotas.manifests.queue_admits``, the one rule of what is offered). Per tenant from the
    process's copy (``OFFERS``); a tenant not in it yet costs three queries, whatever the number of projects and
    tenants: the tenants' quota rows, their flavors, and their active projects with their tenants (a tenant without
    an active project offers nothing, and a project's queues depend on its tenant alone: ``manifests.queue_offers``)."""
    projects, kinds = list(projects), list(kinds)
    wanted = {p.pk for p in projects}
    if not wanted:
        return set()
    tenant_ids = {p.tenant_id for p in projects}
    if OFFERS.usable():
        # One dict per version and set of kinds: tenant id -> its projects' offers (read only once kept).
        kept: dict[int, frozenset[tuple[int, str, int]]] = OFFERS.get(
            "|".join(sorted(f"{k.name}:{k.gang:d}{k.serving:d}" for k in kinds)), dict)
        missing = tenant_ids - kept.keys()
        if missing:
            kept.update(_tenant_offers(missing, kinds))
    else:
        kept = _tenant_offers(tenant_ids, kinds)
    return {offer for tenant_id in tenant_ids for offer in kept.get(tenant_id, ()) if offer[0] in wanted}


def _tenant_offers(tenant_ids: set[int], kinds: list[Any]) -> dict[int, frozenset[tuple[int, str, int]]]:
    """``queue_offers`` for every active project of the tenants, by tenant id (every one of ``tenant_ids``)."""
    from . import manifests as m

    found: dict[int, set[tuple[int, str, int]]] = {tenant_id: set() for tenant_id in tenant_ids}
    rows = list(Quota.objects.filter(tenant_id__in=tenant_ids, flavor__active=True).values_list(
        "tenant_id", "project_id", "flavor_id", "resource", "nominal", "borrowing_limit", "lending_limit"
    ).order_by("tenant_id", "project_id", "flavor_id", "resource"))
    if not rows:
        return {tenant_id: frozenset() for tenant_id in found}
    flavors = {f.pk: f for f in Flavor.objects.filter(
        active=True, cluster_id__in=Flavor.objects.filter(pk__in={r[2] for r in rows}).values("cluster_id")
    ).select_related("cluster")}
    project_rows = list(Project.objects.filter(tenant_id__in=tenant_ids, status=Project.Status.ACTIVE).select_related("tenant"))
    tenants = {t.pk: t for t in sorted({p.tenant_id: p.tenant for p in project_rows}.values(), key=lambda t: (t.name, t.pk))}
    tenant_of = {p.pk: p.tenant_id for p in project_rows}
    for cluster in {f.cluster_id: f.cluster for f in flavors.values()}.values():
        mine = {pk: f for pk, f in flavors.items() if f.cluster_id == cluster.pk}
        by_owner: dict[tuple[int, int | None], list[m.QuotaRow]] = {}
        for tenant_id, project_id, flavor_id, resource, nominal, borrowing, lending in rows:
            flavor = mine.get(flavor_id)
            if flavor is not None and resource in flavor.resource_names:
                by_owner.setdefault((tenant_id, project_id), []).append(
                    m.QuotaRow(flavor.name, resource, nominal, borrowing, lending))
        data = m.Snapshot(
            m.ClusterRow(cluster.name, cluster.architecture, cluster.use_mig, cluster.use_hami,
                         cluster.volcano_capacity_plugin),
            tuple(m.FlavorRow(f.name, f.kind, tuple(f.resource_names), dict(f.node_labels or {}), tuple(f.taints or ()),
                              tuple(f.tolerations or ()), f.pool_label, f.order, f.pk) for f in mine.values()),
            tuple(m.TenantRow(t.slug, t.status == Tenant.Status.ACTIVE, tuple(by_owner.get((t.pk, None), ())), t.pk)
                  for t in tenants.values()),
            tuple(m.ProjectRow(p.slug, tenants[p.tenant_id].slug, True, tuple(by_owner.get((p.tenant_id, p.pk), ())), p.pk,
                               p.namespace) for p in project_rows),
        )
        ids = {p.slug: p.pk for p in project_rows}
        names = {f.name: f.pk for f in mine.values()}
        for slug, kind, flavor_name in m.queue_offers(data, kinds):
            found[tenant_of[ids[slug]]].add((ids[slug], kind, names[flavor_name]))
    return {tenant_id: frozenset(offers) for tenant_id, offers in found.items()}


def lookup_by_id_or_name(queryset: QuerySet[Any], key: str) -> Any:
    """``/clusters/<id>/`` or ``/clusters/<name>/`` within an already-scoped queryset; else 404."""
    from django.shortcuts import get_object_or_404

    from portal.inputs import NUL, is_id

    if is_id(str(key)):
        return get_object_or_404(queryset, pk=int(key))
    if NUL in str(key):
        return get_object_or_404(queryset.none())
    return get_object_or_404(queryset, name=key)


# Quotas ----------------------------------------------------------------------------------------


def quotas_for(*, actor: Actor) -> QuerySet[Quota]:
    """Scoped like projects: ops see every row; tenant admins their tenants' rows (the tenant's own
    and its projects'); members and viewers the rows of the projects they see."""
    base = Quota.objects.select_related("tenant", "project", "flavor__cluster")
    scope = scope_of(actor)
    if scope.everything:
        return base
    admin_tenants = [] if actor.token is not None else scope.tenant_ids("manage_members_tenant")
    return base.filter(Q(tenant_id__in=admin_tenants) | scope.in_projects("project"))


def tenant_quotas_for(*, tenant: Tenant) -> QuerySet[Quota]:
    """The tenant's own rows (what ops promised it) in active flavors, in page order. ``tenant`` comes from a
    guard (``tenants.guards``) or a scoped selector."""
    return (Quota.objects.filter(tenant=tenant, project__isnull=True, flavor__active=True).select_related("flavor__cluster")
            .order_by("flavor__cluster__name", "flavor__order", "flavor__name", "resource"))


def project_quotas_for(*, tenant: Tenant) -> QuerySet[Quota]:
    """The rows of ``tenant``'s projects (its split), archived projects included."""
    return Quota.objects.filter(tenant=tenant, project__isnull=False).select_related("project", "flavor__cluster")


def project_quotas_listed(*, tenant: Tenant) -> QuerySet[Quota]:
    """``project_quotas_for`` in the tenant quotas page's order: by project, flavor and resource."""
    return project_quotas_for(tenant=tenant).order_by("project__name", "flavor__order", "flavor__name", "resource")


# The first page the tenant quotas page's pager reads of its project rows, unfiltered (compiled once per process);
# their projects come from the page's own list of them, not a join.
_PROJECT_QUOTAS_FIRST = Compiled(lambda tenant_id: project_quotas_listed(tenant=Tenant(pk=tenant_id))
                                 .select_related(None).select_related("flavor__cluster")[:PAGE_SIZE + 1])


def project_quotas_first(*, tenant: Tenant, projects: list[Project]) -> list[Quota]:
    """The first ``PAGE_SIZE + 1`` rows of ``project_quotas_listed(tenant)`` (with their projects, flavors and
    clusters): what ``portal.ui.Pager`` reads of its first page. Each row's project is taken from ``projects`` (the
    tenant's, as the page has them); one not among them is read (one query for them all)."""
    rows = _PROJECT_QUOTAS_FIRST.rows(tenant.pk)
    known = {p.pk: p for p in projects}
    missing = {r.project_id for r in rows} - known.keys()
    if missing:
        for project in Project.objects.filter(pk__in=missing):
            project.tenant = tenant
            known[project.pk] = project
    for row in rows:
        row.project = known[row.project_id]
    return rows


# The tenant quotas page's two reads of every row, compiled once per process (portal.compiled): building and compiling
# them took longer than running them.
_TENANT_ROWS = Compiled(lambda tenant_id: tenant_quotas_for(tenant=Tenant(pk=tenant_id)))
_SPLIT = Compiled(lambda tenant_id: Quota.objects.filter(tenant_id=tenant_id, project__isnull=False).order_by().values(
    "project__slug", "flavor_id", "resource", "nominal", "used", "flavor__cluster__reconciled_at"))


def tenant_quota_rows(*, tenant: Tenant) -> list[Quota]:
    """``tenant_quotas_for`` read (with each row's flavor and cluster)."""
    return _TENANT_ROWS.rows(tenant.pk)


def project_quota_split(*, tenant: Tenant) -> list[dict[str, Any]]:
    """Every row of ``tenant``'s projects as the split sums it: the project's slug, the flavor id, the resource, nominal
    and used, and when the row's cluster was last reconciled (in no order)."""
    return _SPLIT.rows(tenant.pk)


def flavor_quota_count(*, flavor: Flavor) -> int:
    """How many quota rows (tenants' and projects') name ``flavor``."""
    return Quota.objects.filter(flavor=flavor).count()


def quotas_asked_for(requests: list[QuotaRequest]) -> dict[int, Quota | None]:
    """Request id -> the project's current quota row for what it asks (one query for any number)."""
    if not requests:
        return {}
    wanted = Q()
    for r in requests:
        wanted |= Q(project_id=r.project_id, flavor_id=r.flavor_id, resource=r.resource)
    rows = {(q.project_id, q.flavor_id, q.resource): q for q in Quota.objects.filter(wanted)}
    return {r.pk: rows.get((r.project_id, r.flavor_id, r.resource)) for r in requests}


def with_quota_now(requests: QuerySet[QuotaRequest]) -> QuerySet[QuotaRequest]:
    """``requests`` with the project's current quota row for what each asks as ``quota_now_nominal``,
    ``quota_now_used`` and ``quota_now_borrowed`` (None: no row): ``quotas_asked_for`` in the list's own query."""
    # One row at most (one_project_quota_per_resource): no ordering, so no join to the flavor for Quota's own.
    now = Quota.objects.filter(project=OuterRef("project"), flavor=OuterRef("flavor"), resource=OuterRef("resource")).order_by()
    return requests.annotate(**{f"quota_now_{name}": Subquery(now.values(name)[:1]) for name in ("nominal", "used", "borrowed")})


def quota_now(request: QuotaRequest) -> Any:
    """The row ``with_quota_now`` read for ``request`` (its ``nominal``, ``used``, ``borrowed``), or None."""
    row: Any = request  # annotated by with_quota_now (django-stubs types only the model's fields)
    if row.quota_now_nominal is None:
        return None
    return SimpleNamespace(nominal=row.quota_now_nominal, used=row.quota_now_used, borrowed=row.quota_now_borrowed)


def projects_promised(*, tenant: Tenant, flavor: Flavor, resource: str, exclude_project_id: int | None = None) -> Decimal:
    """Sum of the nominal quotas of ``tenant``'s projects for (flavor, resource), archived ones included
    (restoring a project must not break the invariant)."""
    rows = Quota.objects.filter(tenant=tenant, project__isnull=False, flavor=flavor, resource=resource)
    if exclude_project_id is not None:
        rows = rows.exclude(project_id=exclude_project_id)
    return rows.aggregate(total=Sum("nominal"))["total"] or ZERO


def tenants_promised(*, flavor: Flavor, resource: str, exclude_tenant_id: int | None = None) -> Decimal:
    """Sum of the tenants' nominal quotas for (flavor, resource)."""
    rows = Quota.objects.filter(project__isnull=True, flavor=flavor, resource=resource)
    if exclude_tenant_id is not None:
        rows = rows.exclude(tenant_id=exclude_tenant_id)
    return rows.aggregate(total=Sum("nominal"))["total"] or ZERO


def tenant_nominal(*, tenant: Tenant, flavor: Flavor, resource: str) -> Decimal:
    row = Quota.objects.filter(tenant=tenant, project__isnull=True, flavor=flavor, resource=resource).first()
    return row.nominal if row else ZERO


def allowed_promise(cluster: Cluster, capacity: Decimal) -> Decimal:
    """What the tenants may be promised in total: capacity plus the cluster's explicit overcommit."""
    allowed = capacity * (100 + cluster.overcommit_percent) / 100
    return allowed.quantize(MILLI, rounding=ROUND_FLOOR)


def capacity_of(cluster: Cluster, flavor: Flavor, resource: str) -> Decimal:
    return capacity_by_flavor(cluster).get((flavor.pk, resource), ZERO)


def hami_card_mib(flavor: Flavor) -> int:
    """The memory of one card (MiB) behind a HAMi flavor, the most a share may have: the largest
    ``nvidia.com/gpu.memory`` among its nodes that count, else its node pool's, else 0 (unknown)."""
    best = 0
    for node in Node.objects.filter(cluster_id=flavor.cluster_id).select_related("pool"):
        if node.counts_capacity and flavor_matches(flavor, node):
            try:
                best = max(best, int(str((node.labels or {}).get("nvidia.com/gpu.memory") or 0)))
            except ValueError:
                continue
    if not best:
        pools = NodePool.objects.filter(cluster_id=flavor.cluster_id, sharing=NodePool.Sharing.HAMI)
        if flavor.gpu_product:
            pools = pools.filter(gpu_product=flavor.gpu_product)
        best = max(pools.values_list("gpu_memory_mib", flat=True), default=0)
    return best


def headroom(*, project: Project, flavor: Flavor, resource: str) -> dict[str, Decimal]:
    """The tenant's unassigned quota and the cluster's unpromised capacity (within overcommit)."""
    tenant = project.tenant
    cluster = flavor.cluster
    unassigned = tenant_nominal(tenant=tenant, flavor=flavor, resource=resource) - projects_promised(
        tenant=tenant, flavor=flavor, resource=resource
    )
    allowed = allowed_promise(cluster, capacity_of(cluster, flavor, resource))
    unpromised = allowed - tenants_promised(flavor=flavor, resource=resource)
    return {"unassigned": unassigned, "unpromised": unpromised}


def approver_for(*, project: Project, flavor: Flavor, resource: str, amount: Decimal) -> str:
    """Who owns the headroom for ``amount`` more: the tenant's unassigned quota (project admin),
    else the cluster's unpromised capacity for the shortfall (tenant admin), else ops."""
    room = headroom(project=project, flavor=flavor, resource=resource)
    if room["unassigned"] >= amount:
        return Approver.PROJECT_ADMIN
    shortfall = amount - max(room["unassigned"], ZERO)
    if room["unpromised"] >= shortfall:
        return Approver.TENANT_ADMIN
    return Approver.OPS


# The queues and cohorts applied for these tenants (and the shared ones) on these clusters: compiled once per process
# and number of ids (portal.compiled). In each cluster's own order (kind, namespace, name), without joining the
# cluster for the model's ordering by its name: only the order within a cluster is read (a shared queue, below).
_APPLIED_QUEUES = Compiled(
    lambda clusters, tenants: AppliedObject.objects.filter(cluster_id__in=clusters, kind__in=("ClusterQueue", "Cohort"))
    .filter(Q(tenant_id__in=tenants) | Q(tenant__isnull=True))
    .order_by("cluster_id", "kind", "namespace", "name")
    .values("cluster_id", "kind", "tenant_id", "project_id", "confirmed_at", "live_quota", "project__status")
)


def quota_confirmations(rows: list[Quota]) -> dict[int, dict[str, Any]]:
    """Per quota row (id): what the cluster last confirmed for it, for the quota pages and the API.

    * ``enforced`` / ``enforcement``: does the cluster's architecture enforce the row's flavor at all
      (``capacity.flavor_enforcement``); a row of a flavor nothing enforces promises nothing.
    * ``confirmed_at``: when the last reconcile found the row's ClusterQueues (a project row: the
      project's one or two queues; a tenant row: its Cohort and its projects' queues) on the cluster as
      the portal wants them; ``None`` when they never were.
    * ``cluster_nominal``: the nominal quota those objects hold on the cluster (a project's queues
      summed; a tenant's Cohort plus its projects' queues), ``None`` when the cluster has none for it.
    * ``drift``: True when ``cluster_nominal`` differs from the portal's ``nominal`` (a change not applied
      yet, or one the cluster refused), ``None`` when it cannot be told (architecture A's one shared
      queue, Volcano-held flavors, archived projects, flavors nothing enforces).

    One query for any number of rows loaded with their flavors' clusters and projects
    (``select_related("flavor__cluster", "project")``); one more for each of the two they came without.
    """
    if not rows:
        return {}
    # Rows loaded without their flavor's cluster (``select_related("flavor")`` only): one query for all.
    prefetch_related_objects([r.flavor for r in rows if not Flavor.cluster.is_cached(r.flavor)], "cluster")
    clusters = {r.flavor.cluster_id for r in rows}
    tenants = {r.tenant_id for r in rows}
    objects = _APPLIED_QUEUES.rows(tuple(sorted(clusters)), tuple(sorted(tenants)))
    # Which projects are active: the objects' own projects say it for a tenant's rows, the rows' projects for theirs.
    active_projects = {o["project_id"] for o in objects if o["project__status"] == Project.Status.ACTIVE}
    unknown = set()
    for r in rows:
        if r.project_id is None:
            continue
        if Quota.project.is_cached(r):
            if r.project is not None and r.project.status == Project.Status.ACTIVE:
                active_projects.add(r.project_id)
            else:
                active_projects.discard(r.project_id)
        else:
            unknown.add(r.project_id)
    if unknown:
        active_projects |= set(Project.objects.filter(pk__in=unknown, status=Project.Status.ACTIVE).values_list("pk", flat=True))
    by_project: dict[tuple[int, int], list[dict[str, Any]]] = {}
    by_tenant: dict[tuple[int, int], list[dict[str, Any]]] = {}
    shared: dict[int, dict[str, Any]] = {}
    for obj in objects:
        if obj["tenant_id"] is None:
            shared[obj["cluster_id"]] = obj  # architecture A's queue
            continue
        by_tenant.setdefault((obj["cluster_id"], obj["tenant_id"]), []).append(obj)
        if obj["project_id"] is not None:
            by_project.setdefault((obj["cluster_id"], obj["project_id"]), []).append(obj)

    def confirmed(objs: list[dict[str, Any]]) -> Any:
        stamps = [o["confirmed_at"] for o in objs]
        return None if not stamps or None in stamps else min(stamps)

    def nominal(objs: list[dict[str, Any]], flavor: str, resource: str) -> Decimal | None:
        found = [Decimal(o["live_quota"][flavor][resource]) for o in objs
                 if resource in ((o["live_quota"] or {}).get(flavor) or {})]
        return sum(found, ZERO) if found else None

    out: dict[int, dict[str, Any]] = {}
    for row in rows:
        cluster = row.flavor.cluster
        enforcement = _flavor_enforcement(cluster, row.flavor)
        info: dict[str, Any] = {"enforced": enforcement.enforced, "enforcement": enforcement, "confirmed_at": None,
                                "cluster_nominal": None, "drift": None}
        if row.project_id is not None:
            objs = by_project.get((cluster.pk, row.project_id), [])
            tellable = row.project_id in active_projects
        else:
            objs = [o for o in by_tenant.get((cluster.pk, row.tenant_id), []) if o["project_id"] is None or o["project_id"] in active_projects]
            tellable = any(o["kind"] == "Cohort" for o in objs)
        if architectures.of(cluster).shared_queue:
            objs, tellable = ([shared[cluster.pk]] if cluster.pk in shared else []), False
        info["confirmed_at"] = confirmed(objs)
        if enforcement.by == "kueue" and tellable:
            info["cluster_nominal"] = nominal(objs, row.flavor.name, row.resource)
            info["drift"] = (info["cluster_nominal"] or ZERO) != row.nominal or info["confirmed_at"] is None
        out[row.pk] = info
    return out


# A project's quota rows with their flavors and clusters (the project page's quota card and the project quota page),
# compiled once per process (portal.compiled).
_PROJECT_ROWS = Compiled(lambda project_id: Quota.objects.filter(project_id=project_id, flavor__active=True)
                         .select_related("flavor__cluster")
                         .order_by("flavor__cluster__name", "flavor__order", "flavor__name", "resource"))


def project_quota_summary(*, project: Project, flavors: dict[int, Flavor] | None = None) -> list[dict[str, Any]]:
    """The project's quota per (flavor, resource): promised, limits, in use, borrowed, and free
    (what is left of its own nominal quota; borrowing may add to it when the cohort has room).
    ``flavors``: a dict the rows' flavors are put in, by id, for a caller that needs more of them (a chart)."""
    rows = _PROJECT_ROWS.rows(project.pk)
    for row in rows:
        row.project = project  # the confirmations ask whether it is active: no query for it
        if flavors is not None:
            flavors[row.flavor_id] = row.flavor
    checks = quota_confirmations(rows)
    return [
        {
            "cluster": row.flavor.cluster.name,
            "flavor": row.flavor.name,
            "flavor_id": row.flavor_id,
            "resource": row.resource,
            "nominal": row.nominal,
            "borrowing_limit": row.borrowing_limit,
            "lending_limit": row.lending_limit,
            "used": row.used,
            "borrowed": row.borrowed,
            "free": max(row.nominal - row.used, ZERO) if checks[row.pk]["enforced"] else ZERO,
            "usage_at": row.usage_at,
            # Every reconcile reads the queues' usage before it stamps the cluster: the figures are as of then.
            "usage_read_at": row.flavor.cluster.reconciled_at,
            "enforced": checks[row.pk]["enforced"],
            "enforcement_reason": "" if checks[row.pk]["enforced"] else checks[row.pk]["enforcement"].reason,
            "confirmed_at": checks[row.pk]["confirmed_at"],
            "cluster_nominal": checks[row.pk]["cluster_nominal"],
            "drift": checks[row.pk]["drift"],
        }
        for row in rows
    ]


def overcommit_for(*, cluster: Cluster, flavors: list[Flavor] | None = None, nodes: list[Node] | None = None,
                   sums: dict[tuple[int, str], dict[str, Any]] | None = None) -> list[dict[str, Any]]:
    """Per active (flavor, resource): what the tenants are promised against the capacity that counts.

    ``percent_over`` is how far the promises exceed the capacity (0 when they fit; ``None`` when
    something is promised and there is no capacity at all); ``allowed`` adds the cluster's overcommit.
    ``flavors`` (the cluster's, in page order), ``nodes`` (``nodes_for``) and ``sums`` (``quota_sums_for``):
    what the caller already read; what is not given is read here.
    """
    if flavors is None:
        flavors = list(Flavor.objects.filter(cluster=cluster, active=True))
    capacity = capacity_by_flavor(cluster, flavors=flavors, nodes=nodes)
    if sums is None:
        sums = quota_sums_for(cluster=cluster)
    promised = {key: row["promised"] for key, row in sums.items()}
    out = []
    for flavor in (f for f in flavors if f.active):
        for resource in flavor.resource_names:
            cap = capacity.get((flavor.pk, resource), ZERO)
            prom = promised.get((flavor.pk, resource)) or ZERO
            over = max(prom - cap, ZERO)
            if cap > 0:
                percent = (over * 100 / cap).quantize(Decimal("0.1"))
            else:
                percent = None if prom > 0 else Decimal("0.0")
            allowed = allowed_promise(cluster, cap)
            out.append(
                {
                    "flavor": flavor.name,
                    "flavor_id": flavor.pk,
                    "resource": resource,
                    "promised": prom,
                    "capacity": cap,
                    "over": over,
                    "percent_over": percent,
                    "allowed": allowed,
                    "within_limit": prom <= allowed,
                }
            )
    return out


# Capacity pages (ops): one cluster, got through ``clusters_for`` ---------------------------------------


def nodes_for(*, cluster: Cluster) -> QuerySet[Node]:
    return Node.objects.filter(cluster=cluster).select_related("pool")


def node_pools_for(*, cluster: Cluster) -> QuerySet[NodePool]:
    return NodePool.objects.filter(cluster=cluster).order_by("name")


def tenant_promises_for(*, cluster: Cluster | int) -> QuerySet[Quota]:
    """The tenants' rows on ``cluster`` (what ops promised), in page order."""
    return (Quota.objects.filter(flavor__cluster=cluster, project__isnull=True).select_related("tenant", "flavor__cluster")
            .order_by("tenant__name", "flavor__order", "flavor__name", "resource"))


# The capacity page's reads of one cluster (quotas.views._capacity_page), compiled once per process and run prepared
# (portal.compiled): Django compiled these five queries in 3-4 ms per page, more than PostgreSQL took to run them.
# Each gives what the queryset in its comment gives.
_CLUSTERS = Compiled(lambda: Cluster.objects.order_by("name"))  # clusters_for(...).order_by("name")
_ACTIVE_FLAVORS = Compiled(lambda cluster_id: Flavor.objects.filter(cluster_id=cluster_id, active=True).order_by("order", "name"))
_NODES = Compiled(lambda cluster_id: Node.objects.filter(cluster_id=cluster_id).select_related("pool")
                  .order_by("present", "ready", "name"))  # nodes_for(...).order_by("present", "ready", "name")
_POOLS = Compiled(lambda cluster_id: NodePool.objects.filter(cluster_id=cluster_id).order_by("name"))  # node_pools_for
# A pager's first read of tenant_promises_for(cluster): the tenants only joined, the flavors are the page's own; the
# columns the rows show and their confirmations read (quota_confirmations), no limits, times or tenant details.
_PROMISE_SHOWN = ("tenant", "project", "flavor", "resource", "nominal", "used", "tenant__name", "tenant__slug")
_PROMISES = Compiled(lambda cluster_id: Quota.objects.filter(flavor__cluster_id=cluster_id, project__isnull=True)
                     .select_related("tenant").order_by("tenant__name", "flavor__order", "flavor__name", "resource")
                     .only(*_PROMISE_SHOWN)[:PAGE_SIZE + 1])


def capacity_clusters() -> list[Cluster]:
    """Every cluster by name (``clusters_for`` as ops see it)."""
    return _CLUSTERS.rows()


def capacity_flavors(*, cluster: Cluster) -> list[Flavor]:
    """The cluster's active flavors (all of them, as ops see them: ``flavors_for``), by order and name, each with
    ``cluster`` set to ``cluster`` (no join)."""
    flavors = _ACTIVE_FLAVORS.rows(cluster.pk)
    for flavor in flavors:
        flavor.cluster = cluster
    return flavors


def capacity_nodes(*, cluster: Cluster) -> list[Node]:
    """``nodes_for(cluster)`` in the capacity page's order (present, ready, name), with their pools."""
    return _NODES.rows(cluster.pk)


def capacity_pools(*, cluster: Cluster) -> list[NodePool]:
    """``node_pools_for(cluster)``, by name."""
    return _POOLS.rows(cluster.pk)


def tenant_promises_first(*, cluster: Cluster, flavors: dict[int, Flavor] | None = None) -> list[Quota]:
    """The first ``PAGE_SIZE + 1`` rows of ``tenant_promises_for(cluster)``: what ``portal.ui.Pager`` reads of its
    first page. Each row's flavor is the one in ``flavors`` (id -> flavor, as ``capacity_flavors`` read them: the page
    has them already) or, for a flavor not in it (an inactive one), read in one query; every flavor's ``cluster`` is
    ``cluster``. Half the models per row of joining the flavor and its cluster again."""
    rows = _PROMISES.rows(cluster.pk)
    known = dict(flavors or {})
    missing = {r.flavor_id for r in rows} - known.keys()
    if missing:
        for flavor in Flavor.objects.filter(pk__in=missing):
            known[flavor.pk] = flavor
    for flavor in known.values():
        flavor.cluster = cluster
    for r in rows:
        r.flavor = known[r.flavor_id]
    return rows


def project_sums_for(*, cluster: Cluster) -> dict[tuple[int, str], dict[str, Any]]:
    """(flavor id, resource) -> what the projects are promised ("assigned"), use and borrow on ``cluster``."""
    return {key: row for key, row in quota_sums_for(cluster=cluster).items() if row["project_rows"]}


def _quota_sums_query(cluster_id: int) -> QuerySet[Quota, Any]:  # rows: values() dicts
    tenants, projects = Q(project__isnull=True), Q(project__isnull=False)
    return (
        Quota.objects.filter(flavor__cluster_id=cluster_id).order_by()
        .values("flavor_id", "resource")
        .annotate(promised=Sum("nominal", filter=tenants), tenant_rows=Count("pk", filter=tenants),
                  assigned=Sum("nominal", filter=projects), used=Sum("used", filter=projects),
                  borrowed=Sum("borrowed", filter=projects), project_rows=Count("pk", filter=projects))
    )


_QUOTA_SUMS = Compiled(_quota_sums_query)  # compiled once per process (portal.compiled): six sums per row


def quota_sums_for(*, cluster: Cluster) -> dict[tuple[int, str], dict[str, Any]]:
    """(flavor id, resource) -> the sums of ``cluster``'s quota rows, in one query: what the tenants are promised
    (``promised``, over ``tenant_rows`` rows) and what their projects are promised (``assigned``), use and borrow
    (over ``project_rows`` rows). Zero, not None, where there are no rows of a level."""
    out = {}
    for r in _QUOTA_SUMS.rows(cluster.pk):
        for name in ("promised", "assigned", "used", "borrowed"):
            r[name] = r[name] or ZERO
        out[(r["flavor_id"], r["resource"])] = r
    return out


def applied_objects_for(*, actor: Actor, cluster: Cluster) -> QuerySet[AppliedObject]:
    """What the materializer applied to ``cluster``: ops see it, nobody else."""
    base = AppliedObject.objects.filter(cluster=cluster)
    return base if _ops(actor) else base.none()


# Quota requests --------------------------------------------------------------------------------


def quota_requests_for(*, actor: Actor, inbox: bool = False) -> QuerySet[QuotaRequest]:
    """Your own requests and those of projects you approve for (tenant admins: the whole tenant).

    ``inbox``: only pending requests ``actor`` may decide now, by the tier the request was routed to
    (the same rule as ``services.quota_request_approve``; it may still escalate at decision time).
    """
    base = QuotaRequest.objects.select_related("project__tenant", "flavor__cluster", "requested_by", "decided_by")
    if _ops(actor):
        return base.filter(status=QuotaRequest.Status.PENDING) if inbox else base
    user = actor.user
    if actor.token is not None:
        return base.none() if inbox else base.filter(project_id=actor.token.project_id, requested_by=user)
    scope = scope_of(actor)
    approve_projects = scope.project_ids("approve_project")
    admin_tenants = scope.tenant_ids("change_tenant")  # tenants whose quota split the actor may change
    if not inbox:
        return base.filter(Q(requested_by=user) | Q(project_id__in=approve_projects) | Q(project__tenant_id__in=admin_tenants))
    tenant_tier = Q(approver__in=[Approver.PROJECT_ADMIN, Approver.TENANT_ADMIN], project__tenant_id__in=admin_tenants)
    project_tier = Q(approver=Approver.PROJECT_ADMIN, project_id__in=approve_projects) & ~Q(requested_by=user)
    return base.filter(status=QuotaRequest.Status.PENDING).filter(tenant_tier | project_tier)


class _CountOf(Subquery):
    """``(SELECT count(*) FROM (<queryset>))``: a queryset's count as an expression (several counts, one query)."""

    template = "(SELECT count(*) FROM (%(subquery)s) _counted)"
    output_field = IntegerField()


def quota_request_counts_kept(*, actor: Actor) -> dict[str, int] | None:
    """How many quota requests the quota requests page lists for a signed-in ``actor``: ``inbox`` (what they may
    decide now, ``quota_requests_for(inbox=True)``) and ``seen`` (every one they see), in one query, kept per user in
    the shared cache under ``tenants.access.APPROVALS`` (every quota request write, membership, project and ops group
    change calls ``approvals_changed``) and held in process at that version: the page's unfiltered pagers count
    nothing. None for a token or an anonymous caller (the page is for people signed in)."""
    from portal.cache import shared
    from tenants.access import APPROVALS

    user = actor.user
    if user is None or not user.is_authenticated or actor.token is not None:
        return None

    def load() -> dict[str, int]:
        row = (get_user_model().objects.filter(pk=user.pk)
               .annotate(inbox=_CountOf(quota_requests_for(actor=actor, inbox=True).order_by().values("pk")),
                         seen=_CountOf(quota_requests_for(actor=actor).order_by().values("pk")))
               .values_list("inbox", "seen").first())
        inbox, seen = row or (0, 0)
        return {"inbox": inbox or 0, "seen": seen or 0}

    return dict(shared(APPROVALS, f"quota-request-counts:{user.pk}", load))


def project_quota_request_count_kept(*, actor: Actor, project: Project) -> int | None:
    """How many quota requests the project quota page lists for a signed-in ``actor`` (``quota_requests_for(actor)``
    in ``project``), kept per user and project in the shared cache under ``tenants.access.APPROVALS``, as
    ``quota_request_counts_kept``. None for a token or an anonymous caller."""
    from portal.cache import shared
    from tenants.access import APPROVALS

    user = actor.user
    if user is None or not user.is_authenticated or actor.token is not None:
        return None

    def load() -> int:
        return quota_requests_for(actor=actor).filter(project=project).order_by().count()

    return int(shared(APPROVALS, f"project-quota-request-count:{user.pk}:{project.pk}", load))


# The columns of a quota request its card, table row and request line show, and the policies (``quotas.may_decide``,
# ``may_withdraw``) read: not the applied objects' JSON, not the reminder's time.
_SHOWN = ("project", "flavor", "resource", "amount", "until", "reason", "requested_by", "status", "approver",
          "decided_by", "decided_at", "comment", "created_at", "share_memory_mib", "share_cores_percent")


def quota_requests_listed(requests: QuerySet[QuotaRequest], *also: str) -> QuerySet[QuotaRequest]:
    """``requests`` reading only the shown columns of the quota request table (and the columns ``also`` names) and no
    related table: a page of them then costs the database no join to plan (about 1 ms for the four) and the ORM one
    model per row instead of six, with no flavor's JSON to decode. ``with_shown_related`` puts on the page's rows what
    they show of the related."""
    return requests.select_related(None).only(*_SHOWN, *also)


# The project quota page's first page of the project's quota requests (listed), compiled once per process: all of
# them, or one requester's.
_PROJECT_REQUESTS_FIRST = Compiled(lambda project_id: quota_requests_listed(
    QuotaRequest.objects.filter(project_id=project_id)).order_by("-created_at")[:PAGE_SIZE + 1])
_OWN_PROJECT_REQUESTS_FIRST = Compiled(lambda project_id, user_id: quota_requests_listed(
    QuotaRequest.objects.filter(project_id=project_id, requested_by_id=user_id)).order_by("-created_at")[:PAGE_SIZE + 1])


def project_quota_requests_first(*, actor: Actor, project: Project) -> list[QuotaRequest]:
    """The first ``PAGE_SIZE + 1`` rows of ``quota_requests_listed(quota_requests_for(actor)).filter(project=project)
    .order_by("-created_at")``: every request of the project for ops, its approvers and its tenant's admins, the
    actor's own for anyone else."""
    if actor.token is not None:  # quota_requests_for's own rule, not kept
        return list(quota_requests_listed(quota_requests_for(actor=actor)).filter(project=project)
                    .order_by("-created_at")[:PAGE_SIZE + 1])
    if not _ops(actor):
        scope = scope_of(actor)
        if project.pk not in scope.project_ids("approve_project") and project.tenant_id not in scope.tenant_ids("change_tenant"):
            return _OWN_PROJECT_REQUESTS_FIRST.rows(project.pk, actor.user.pk)
    return _PROJECT_REQUESTS_FIRST.rows(project.pk)


# The quota requests page's first pages (its table of every request one sees, its inbox) and its project filter's
# choices, compiled once per process: the same rows as ``quota_requests_for`` (and ``projects_for``), in the same
# order. A list of ids comes padded (``_padded``: an empty one as ``(0,)``, which matches no row).
_SEEN_ALL_FIRST = Compiled(lambda: quota_requests_listed(QuotaRequest.objects.all()).order_by("-created_at")[:PAGE_SIZE + 1])
_SEEN_FIRST = Compiled(lambda user_id, projects, tenants: quota_requests_listed(QuotaRequest.objects.filter(
    Q(requested_by_id=user_id) | Q(project_id__in=projects) | Q(project__tenant_id__in=tenants)))
    .order_by("-created_at")[:PAGE_SIZE + 1])
_INBOX_ALL_FIRST = Compiled(lambda: with_quota_now(quota_requests_listed(QuotaRequest.objects.filter(
    status=QuotaRequest.Status.PENDING))).order_by("created_at")[:PAGE_SIZE + 1])
_INBOX_FIRST = Compiled(lambda user_id, projects, tenants: with_quota_now(quota_requests_listed(QuotaRequest.objects.filter(
    Q(approver__in=[Approver.PROJECT_ADMIN, Approver.TENANT_ADMIN], project__tenant_id__in=tenants)
    | (Q(approver=Approver.PROJECT_ADMIN, project_id__in=projects) & ~Q(requested_by_id=user_id)),
    status=QuotaRequest.Status.PENDING))).order_by("created_at")[:PAGE_SIZE + 1])
_PROJECT_CHOICES_ALL = Compiled(lambda: Project.objects.order_by("name").values("slug", "name"))
_PROJECT_CHOICES = Compiled(lambda ids: Project.objects.filter(pk__in=ids).order_by("name").values("slug", "name"))


def quota_requests_first(*, actor: Actor, inbox: bool = False) -> list[QuotaRequest]:
    """The first ``PAGE_SIZE + 1`` rows of ``quota_requests_listed(quota_requests_for(actor=actor, inbox=inbox))``
    newest first (``inbox``: oldest first, ``with_quota_now``), as the quota requests page lists them."""
    if actor.token is not None:  # quota_requests_for's own rule, not kept
        rows = quota_requests_listed(quota_requests_for(actor=actor, inbox=inbox))
        return list((with_quota_now(rows).order_by("created_at") if inbox else rows.order_by("-created_at"))[:PAGE_SIZE + 1])
    if _ops(actor):
        return _INBOX_ALL_FIRST.rows() if inbox else _SEEN_ALL_FIRST.rows()
    scope = scope_of(actor)
    projects, tenants = scope.project_ids("approve_project"), scope.tenant_ids("change_tenant")
    if inbox:
        if not projects and not tenants:
            return []  # as the ORM: nothing to decide, no query
        return _INBOX_FIRST.rows(actor.user.pk, _padded(set(projects)), _padded(set(tenants)))
    return _SEEN_FIRST.rows(actor.user.pk, _padded(set(projects)), _padded(set(tenants)))


def project_choices_for(*, actor: Actor) -> list[tuple[str, str]]:
    """``projects_for(actor).order_by("name").values_list("slug", "name")``: a project filter's choices."""
    scope = scope_of(actor)
    if scope.everything:
        rows = _PROJECT_CHOICES_ALL.rows()
    elif not scope.visible_projects:
        return []
    else:
        rows = _PROJECT_CHOICES.rows(_padded(set(scope.visible_projects)))
    return [(r["slug"], r["name"]) for r in rows]


def _padded(ids: set[int]) -> tuple[int, ...]:
    """``ids`` sorted, the last repeated up to a power of two: the number of ids is part of a compiled query's
    shape, so a page's lists of ids come in a few lengths (a few statements per connection) instead of one each."""
    out = sorted(ids)
    size = 1
    while size < len(out):
        size *= 2
    return tuple(out + out[-1:] * (size - len(out))) if out else (0,)


def _named(kind: int, queryset: QuerySet, *texts: str, number: str | None = None) -> QuerySet:
    """``(kind, pk, text, text, text, text, number)`` rows of ``queryset``: the branches of ``_SHOWN_RELATED``'s
    union."""
    blank = Value("", output_field=CharField())
    return queryset.order_by().values_list(
        Value(kind, output_field=IntegerField()), "pk", *texts, *([blank] * (4 - len(texts))),
        number or Value(0, output_field=IntegerField()))


def _shown_related(projects: tuple[int, ...], flavors: tuple[int, ...], users: tuple[int, ...]) -> QuerySet:
    User = get_user_model()
    return _named(0, Project.objects.filter(pk__in=projects), "slug", "name", "tenant__name", "tenant__slug",
                  number="tenant_id").union(
        _named(1, Flavor.objects.filter(pk__in=flavors), "name", "display_name", "cluster__name", number="cluster_id"),
        _named(2, User.objects.filter(pk__in=users), User.USERNAME_FIELD),
        all=True,
    )


_SHOWN_RELATED = Compiled(_shown_related)


def _partial(model: Any, **values: Any) -> Any:
    """An instance of ``model`` as the database read it with only ``values`` (by attribute name); its other fields
    are deferred (``Model.from_db`` takes the values in the model's field order)."""
    names = [f.attname for f in model._meta.concrete_fields if f.attname in values]
    return model.from_db("default", names, [values[name] for name in names])


def with_shown_related(requests: list[QuotaRequest]) -> list[QuotaRequest]:
    """The related rows a quota request's card, table row, request line or API row shows, put on ``requests`` (read
    with ``quota_requests_listed``, from one list or several): the project (slug, name, its tenant's name and slug),
    the flavor's name, display name and cluster's name, the requester's and decider's usernames. One query for any
    number of rows. Each related row is one model instance with only those fields: another field would be read by a
    query of its own, which the pages' query counts would catch."""
    if not requests:
        return requests
    User = get_user_model()
    users = {r.requested_by_id for r in requests} | {r.decided_by_id for r in requests if r.decided_by_id}
    found = _SHOWN_RELATED.rows(_padded({r.project_id for r in requests}), _padded({r.flavor_id for r in requests}),
                                _padded(users))
    projects: dict[int, Project] = {}
    flavors: dict[int, Flavor] = {}
    people: dict[int, Any] = {}
    tenants: dict[int, Tenant] = {}
    clusters: dict[int, Cluster] = {}
    for kind, pk, first, second, third, fourth, number in found:
        if kind == 0:
            project = projects[pk] = _partial(Project, id=pk, slug=first, name=second, tenant_id=number)
            tenant = tenants.get(number)
            if tenant is None:
                tenant = tenants[number] = _partial(Tenant, id=number, name=third, slug=fourth)
            project.tenant = tenant
        elif kind == 1:
            # A HAMi share says its display name; the API its cluster's name.
            flavor = flavors[pk] = _partial(Flavor, id=pk, name=first, display_name=second, cluster_id=number)
            cluster = clusters.get(number)
            if cluster is None:
                cluster = clusters[number] = _partial(Cluster, id=number, name=third)
            flavor.cluster = cluster
        else:
            people[pk] = _partial(User, **{"id": pk, User.USERNAME_FIELD: first})
    for r in requests:
        r.project = projects[r.project_id]
        r.flavor = flavors[r.flavor_id]
        r.requested_by = people[r.requested_by_id]
        r.decided_by = people[r.decided_by_id] if r.decided_by_id else None
    return requests


def quota_request_approvers(*, request: QuotaRequest) -> list[Any]:
    """Who is told about ``request``: the holders of ``policy.may_decide`` at the tier it was routed to
    (``tenants.policy.holders``; never the requester through the project tier alone), less platform ops unless
    nobody else may decide it (ops requests: ops)."""
    from tenants.access import told
    from tenants.policy import holders

    from .policy import may_decide

    return told(holders(may_decide, request, tier=request.approver))


def architecture_change_latest(cluster: Cluster) -> ArchitectureChange | None:
    """The cluster's most recent architecture change (or plan apply), for its progress on the page and the API."""
    return ArchitectureChange.objects.filter(cluster=cluster).select_related("requested_by").first()
