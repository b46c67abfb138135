"""``manage.py zone_fault CLUSTER down|up``: take a sandbox zone's API down (every API call answered 503, through
the sandbox's fault injection) or bring it back (docs/federation.md, "The demo"). The status follower then marks
the cluster unhealthy; after PORTAL_REDISPATCH_AFTER_SECONDS housekeeping moves its pending work elsewhere, once;
running work stays; nothing else is touched. Sandbox clusters only (a real cluster has no fault endpoint). The same
service as the ops zones page's "Take down" / "Bring up" (``quotas.zones.zone_fault_set``, audited as the system
actor here)."""

from __future__ import annotations

from django.core.management.base import BaseCommand, CommandError

from portal.exceptions import PortalError
from quotas.models import Cluster
from quotas.zones import zone_fault_set
from tenants.access import Actor


class Command(BaseCommand):
    help = "Take a sandbox zone's API down (down) or bring it back (up)."

    def add_arguments(self, parser) -> None:
        parser.add_argument("cluster", help="The cluster's name (see /ops/zones/).")
        parser.add_argument("action", choices=["down", "up"])

    def handle(self, *args, **options) -> None:
        cluster = Cluster.objects.filter(name=options["cluster"]).first()
        if cluster is None:
            names = ", ".join(Cluster.objects.order_by("name").values_list("name", flat=True)) or "none"
            raise CommandError(f"No cluster {options['cluster']!r}; clusters: {names}.")
        try:
            zone_fault_set(actor=Actor.system(), cluster=cluster, down=options["action"] == "down")
        except PortalError as exc:
            raise CommandError(getattr(exc, "message", str(exc))) from exc
        if options["action"] == "down":
            self.stdout.write(f"{cluster.name} (zone {cluster.zone_name}) is down: every API call is answered 503. "
                              f"`manage.py zone_fault {cluster.name} up` brings it back.")
        else:
            self.stdout.write(f"{cluster.name} (zone {cluster.zone_name}) answers again.")
