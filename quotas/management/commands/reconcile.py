"""``manage.py reconcile <cluster> plan|apply|export``: review and apply a cluster's desired state.

    reconcile sandbox plan                    the diff, writes nothing
    reconcile sandbox plan --architecture E   what switching to E would do
    reconcile sandbox apply [--architecture E] [--yes]   apply (recorded and audited as the system actor)
    reconcile sandbox export [--tenant acme]  desired state as multi-document YAML
"""

from __future__ import annotations

from django.core.management.base import BaseCommand, CommandError

from quotas.models import Architecture, Cluster


class Command(BaseCommand):
    help = "Plan, apply or export the quota objects (Kueue, Volcano) of a cluster."

    def add_arguments(self, parser) -> None:
        parser.add_argument("cluster")
        parser.add_argument("action", choices=["plan", "apply", "export"])
        parser.add_argument("--architecture", choices=Architecture.values)
        parser.add_argument("--tenant", help="export: only this tenant's objects")
        parser.add_argument("--yes", action="store_true", help="apply without asking")

    def handle(self, *args, **options) -> None:
        from django.core.cache import cache

        from portal.kube import ClusterError
        from quotas.architecture import architecture_change_apply, architecture_change_start
        from quotas.exceptions import NothingToApply
        from quotas.reconcile import export_yaml, plan_build, plan_fingerprint
        from quotas.tasks import LOCK_SECONDS, reconcile_lock
        from tenants.access import Actor

        cluster = Cluster.objects.filter(name=options["cluster"]).first()
        if cluster is None:
            raise CommandError(f"no cluster named {options['cluster']!r}")
        if options["action"] == "export":
            self.stdout.write(export_yaml(cluster, options["tenant"]), ending="")
            return
        try:
            plan = plan_build(cluster, architecture=options["architecture"])
        except ClusterError as exc:
            raise CommandError(f"cluster {cluster.name}: {exc}") from exc
        self.stdout.write(plan.text(), ending="")
        if options["action"] == "plan" or plan.empty:
            return
        if not options["yes"] and input("Apply this plan? [y/N] ").strip().lower() not in ("y", "yes"):
            self.stdout.write("Not applied.")
            return
        # The same path as the ops page and the API (recorded, audited), run here instead of by a worker,
        # under the same lock as the reconcile task.
        lock = reconcile_lock(cluster.pk)
        if not cache.add(lock, "manage.py reconcile", LOCK_SECONDS):
            raise CommandError(f"a reconcile of {cluster.name} is running; try again in a moment")
        try:
            try:
                change = architecture_change_start(actor=Actor.system(), cluster=cluster,
                                                   architecture=plan.architecture,
                                                   fingerprint=plan_fingerprint(plan), queue=False)
            except NothingToApply as exc:
                self.stdout.write(exc.message)
                return
            change = architecture_change_apply(change.pk)
        finally:
            cache.delete(lock)
        assert change is not None
        result = change.result or {}
        self.stdout.write(f"applied {result.get('applied', 0)}, deleted {result.get('deleted', 0)}, "
                          f"failed {len(result.get('failed', []))}, skipped {result.get('skipped', 0)}")
        for label, error in result.get("failed", []):
            self.stderr.write(f"  {label}: {error}")
        if change.state != change.State.APPLIED:
            raise CommandError(change.state_reason or "some objects were not applied; run again to resume")
