"""Reads of the architecture review (``insights/review.py`` answers from what these return).

``review_snapshot_for`` is scoped like every selector: ops see the whole platform; anyone else only a tenant they
administer (``tenants.policy.may_manage_members``), and then only that tenant's quotas, projects and usage and the
clusters it has quota on. The caller (a view, the API) finds the tenant through ``tenants.guards`` first, so a
tenant the actor cannot see is a 404 there.
"""

from __future__ import annotations

from datetime import timedelta

from django.db.models import Count, Q
from django.utils import timezone

from billing.models import UsageInterval
from portal.exceptions import NotAllowed
from quotas.models import Cluster, Flavor, NodePool, Quota, SpillPolicy
from tenants import policy
from tenants.access import Actor
from tenants.models import Project, Tenant
from workloads.models import WorkloadRequest

from .review import ClusterRow, FlavorRow, PoolRow, QuotaRow, Snapshot, SpillPolicyRow, UsageRow

USAGE_DAYS = 30


def review_snapshot_for(*, actor: Actor, tenant: Tenant | None = None, mig_changes_url: str = "") -> Snapshot:
    """The live configuration the review answers from: the platform's (ops, ``tenant`` None) or one tenant's."""
    if tenant is None and not actor.is_ops:
        raise NotAllowed("Only platform ops review the whole platform; tenant admins review their tenant.")
    if tenant is not None and not policy.may_manage_members(actor, tenant):
        raise NotAllowed("Only the tenant's admins and platform ops review a tenant.")
    quotas = Quota.objects.select_related("flavor__cluster", "tenant", "project")
    clusters = Cluster.objects.all()
    tenants = Tenant.objects.all()
    usage = UsageInterval.objects.filter(Q(ended_at__isnull=True) | Q(ended_at__gte=timezone.now() - timedelta(days=USAGE_DAYS)))
    policies = SpillPolicy.objects.all()
    spilled = WorkloadRequest.objects.filter(spilled=True, created_at__gte=timezone.now() - timedelta(days=USAGE_DAYS))
    if tenant is not None:
        policies = policies.filter(project__tenant=tenant)
        spilled = spilled.filter(tenant=tenant)
        quotas = quotas.filter(tenant=tenant)
        clusters = clusters.filter(pk__in=quotas.values("flavor__cluster_id"))
        tenants = tenants.filter(pk=tenant.pk)
        usage = usage.filter(tenant=tenant)
    spilled = (spilled.order_by().values("spilled_from_model", "flavor__gpu_model").annotate(n=Count("pk"))
               .order_by("spilled_from_model", "flavor__gpu_model"))
    cluster_rows = [
        ClusterRow(name=c.name, architecture=c.architecture, use_mig=c.use_mig, use_hami=c.use_hami,
                   overcommit_percent=c.overcommit_percent, volcano_capacity_plugin=c.volcano_capacity_plugin,
                   health=c.health, last_error=c.last_error, last_seen_at=c.last_seen_at, zone=c.zone,
                   failure_domain=c.failure_domain, draining=c.draining, drain_reason=c.drain_reason,
                   role=c.role, manager=c.manager.name if c.manager is not None else "")
        for c in clusters.select_related("manager").order_by("name")
    ]
    names = [c.name for c in cluster_rows]
    pools = (NodePool.objects.filter(cluster__name__in=names).select_related("cluster")
             .annotate(n=Count("nodes", filter=Q(nodes__present=True)),
                       ready=Count("nodes", filter=Q(nodes__present=True, nodes__ready=True)))
             .filter(n__gt=0)  # a pool no node is in any more (a MIG change moved them) is not part of the review
             .order_by("cluster__name", "name"))
    flavors = Flavor.objects.filter(cluster__name__in=names, active=True).select_related("cluster").order_by("cluster__name", "order", "name")
    projects = dict(Project.objects.filter(tenant__in=tenants, status="active").values("tenant__slug")
                    .annotate(n=Count("pk")).values_list("tenant__slug", "n"))
    usage_rows = (usage.values("tenant__slug", "project__slug")
                  .annotate(n=Count("pk"), running=Count("pk", filter=Q(ended_at__isnull=True)))
                  .order_by("tenant__slug", "project__slug"))
    return Snapshot(
        clusters=cluster_rows,
        pools=[PoolRow(cluster=p.cluster.name, name=p.name, sharing=p.sharing, gpu_product=p.gpu_product,
                       mig_config=p.mig_config, pool_label=p.pool_label, nodes=p.n, nodes_ready=p.ready) for p in pools],
        flavors=[FlavorRow(cluster=f.cluster.name, name=f.name, kind=f.kind, mig_profile=f.mig_profile,
                           pool_label=f.pool_label, gpu_model=f.gpu_model) for f in flavors],
        quotas=[QuotaRow(cluster=q.flavor.cluster.name, flavor=q.flavor.name, kind=q.flavor.kind, resource=q.resource,
                         tenant=q.tenant.slug, project=q.project.slug if q.project_id else "", nominal=q.nominal,
                         borrowing_limit=q.borrowing_limit, lending_limit=q.lending_limit)
                for q in quotas.order_by("flavor__cluster__name", "tenant__slug", "project__slug", "flavor__name", "resource")],
        tenants={slug: projects.get(slug, 0) for slug in tenants.order_by("slug").values_list("slug", flat=True)},
        usage=[UsageRow(tenant=u["tenant__slug"], project=u["project__slug"], intervals=u["n"], open_intervals=u["running"])
               for u in usage_rows],
        tenant=tenant.slug if tenant is not None else "",
        mig_changes_url=mig_changes_url,
        usage_days=USAGE_DAYS,
        spill_policies=[SpillPolicyRow(tenant=p.project.tenant.slug, project=p.project.slug, allowed=p.allowed,
                                       target_models=tuple(p.target_models or ()), needs_approval=p.needs_approval)
                        for p in policies.select_related("project__tenant").order_by("project__slug")],
        spills=[(r["spilled_from_model"], r["flavor__gpu_model"], r["n"]) for r in spilled],
    )
