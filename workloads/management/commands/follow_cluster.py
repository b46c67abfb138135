"""``manage.py follow_cluster``: the status follower as a long-running process (for ``make run``).

Keeps one :class:`workloads.status.StatusFollower` per cluster and runs its cycles back to back: each cycle
watches every followed kind for ``--watch`` seconds from the last resourceVersion, so changes reach the portal
within about that long; a dropped connection resumes, an expired one re-lists, and everything is re-listed every
``--resync`` seconds. The alternative is beat running ``workloads.tasks.requests_sync_task`` every few seconds;
run one or the other, or several: each cluster's lease (``workloads.status.follow_lease``) makes one follower active
per cluster; this command keeps it across cycles, and a standby takes over within PORTAL_FOLLOW_LEASE_SECONDS of
the holder's death.
"""

from __future__ import annotations

import time
from typing import Any

from django.core.management.base import BaseCommand
from django.db import close_old_connections

from portal.kube import ClusterUnavailable
from quotas.models import Cluster
from workloads.status import StatusFollower, follow_lease


class Command(BaseCommand):
    help = "Follow the clusters' workload status and move requests along (runs until stopped)."

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("--watch", type=int, default=2, help="Seconds each cycle watches (latency).")
        parser.add_argument("--resync", type=float, default=300, help="Seconds between full re-lists.")
        parser.add_argument("--once", action="store_true", help="Run one cycle per cluster and exit.")

    def handle(self, *args: Any, **options: Any) -> None:
        followers: dict[int, StatusFollower] = {}
        leases: dict[int, Any] = {}
        try:
            self._follow(followers, leases, options)
        finally:
            for lease in leases.values():
                lease.release()

    def _follow(self, followers: dict[int, StatusFollower], leases: dict[int, Any], options: dict[str, Any]) -> None:
        while True:
            close_old_connections()
            clusters = list(Cluster.objects.exclude(kubeconfig_encrypted="", kubeconfig_path=""))
            if not clusters:
                time.sleep(options["watch"])
            standing_by = 0
            for cluster in clusters:
                lease = leases.setdefault(cluster.pk, follow_lease(cluster))
                if not lease.hold():  # another follower has this cluster; it takes over if that one dies
                    followers.pop(cluster.pk, None)
                    standing_by += 1
                    continue
                follower = followers.get(cluster.pk)
                if follower is None or follower.cluster.kubeconfig_path != cluster.kubeconfig_path:
                    try:
                        follower = followers[cluster.pk] = StatusFollower(
                            cluster, watch_seconds=options["watch"], resync_seconds=options["resync"])
                    except Exception as exc:  # a broken kubeconfig must not stop the others
                        self.stderr.write(f"{cluster}: {exc}")
                        cluster.health_record(error=f"{type(exc).__name__}: {exc}")
                        continue
                try:
                    stats = follower.cycle()
                except ClusterUnavailable as exc:
                    self.stderr.write(f"{cluster}: unavailable: {exc}")
                    cluster.health_record(error=f"Unavailable: {exc}")
                    time.sleep(options["watch"])
                    continue
                except Exception as exc:
                    self.stderr.write(f"{cluster}: {type(exc).__name__}: {exc}")
                    cluster.health_record(error=f"{type(exc).__name__}: {exc}")
                    followers.pop(cluster.pk, None)
                    continue
                cluster.health_record()
                if stats.moves or stats.resynced:
                    self.stdout.write(f"{cluster}: {stats.events} events, {stats.moves} moves, {stats.db_writes} writes")
            if options["once"]:
                return
            if clusters and standing_by == len(clusters):
                time.sleep(options["watch"])
