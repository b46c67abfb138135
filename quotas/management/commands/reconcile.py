"""``manage.py reconcile <cluster> plan|apply|export``: review and apply a cluster's desired state.

    reconcile sandbox plan                    the diff, writes nothing
    reconcile sandbox plan --architecture E   what switching to E would do
    reconcile sandbox apply [--architecture E] [--yes]   apply (audited as the system actor)
    reconcile sandbox export [--tenant acme]  desired state as multi-document YAML
"""

from __future__ import annotations

from django.core.management.base import BaseCommand, CommandError

from quotas.models import Architecture, Cluster


class Command(BaseCommand):
    help = "Plan, apply or export the quota objects (Kueue, Volcano) of a cluster."

    def add_arguments(self, parser) -> None:  # noqa: ANN001
        parser.add_argument("cluster")
        parser.add_argument("action", choices=["plan", "apply", "export"])
        parser.add_argument("--architecture", choices=Architecture.values)
        parser.add_argument("--tenant", help="export: only this tenant's objects")
        parser.add_argument("--yes", action="store_true", help="apply without asking")

    def handle(self, *args, **options) -> None:  # noqa: ANN002, ANN003
        from portal.kube import ClusterError
        from quotas.reconcile import export_yaml, plan_apply, plan_build
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
        result = plan_apply(plan, actor=Actor.system())
        self.stdout.write(f"applied {result.applied}, deleted {result.deleted}, failed {len(result.failed)}, "
                          f"skipped {result.skipped}")
        for label, error in result.failed:
            self.stderr.write(f"  {label}: {error}")
        if result.failed:
            raise CommandError("some objects were not applied; run again to resume")
