"""The three-zone demo as ``make run`` seeds it (docs/federation.md, "The demo"): three sandbox clusters, each with
its own endpoint and kubeconfig (the demo profile as the H100 training zone, sandbox/profiles/zone-a100.yaml and
zone-l40s.yaml), registered as zones in three failure domains with their GPU model's facts and Acme's quota; the
history holds spill-overs (the ops zones page and the spill-over metric show them); ``manage.py zone_fault`` takes
one zone down, and only that zone is unhealthy."""

from __future__ import annotations

import io
from datetime import timedelta
from pathlib import Path

import pytest
from django.core.management import call_command
from django.utils import timezone

from insights.registry import METRICS, Query
from portal.kube import kube_cache_clear
from quotas.models import Cluster, Flavor, SpillPolicy
from sandbox.app import Sandbox
from tenants.access import scope_of
from workloads.status import requests_sync

pytestmark = [pytest.mark.django_db, pytest.mark.timeout(300)]
PROFILES = Path(__file__).resolve().parents[2] / "sandbox" / "profiles"


@pytest.fixture
def three_sandboxes(tmp_path: Path, settings):
    settings.KUBECONFIG = str(tmp_path / "sandbox.kubeconfig")
    kube_cache_clear()
    sandboxes = [Sandbox(kubeconfig=tmp_path / config, profile=profile) for config, profile in [
        ("sandbox.kubeconfig", None), ("zone-a100.kubeconfig", PROFILES / "zone-a100.yaml"),
        ("zone-l40s.kubeconfig", PROFILES / "zone-l40s.yaml")]]
    try:
        for sb in sandboxes:
            sb.start()
        yield sandboxes
    finally:
        for sb in sandboxes:
            sb.stop()
        kube_cache_clear()


def test_make_run_seeds_three_zones_with_spill_history_and_a_fault_takes_one_down(three_sandboxes, as_user, cast) -> None:
    call_command("seed_demo", stdout=io.StringIO())
    call_command("seed_demo", stdout=io.StringIO())  # a restart seeds again: nothing doubles
    zones = {c.name: c for c in Cluster.objects.all()}
    assert {(c.name, c.zone_name, c.failure_domain) for c in zones.values()} == {
        ("sandbox", "h100-training", "site-a"), ("a100-inference", "a100-inference", "site-b"),
        ("l40s-dev", "l40s-dev", "site-c")}
    assert len({c.kubeconfig_path for c in zones.values()}) == 3
    whole = {(f.cluster.name, f.gpu_model, f.compute_capability) for f in Flavor.objects.filter(kind="whole").select_related("cluster")}
    assert {("a100-inference", "a100-80gb", "8.0"), ("l40s-dev", "l40s", "8.9"), ("sandbox", "h100-80gb", "9.0")} <= whole
    assert SpillPolicy.objects.get(project__slug="acme-vision").admits("a100-80gb")
    for cluster in zones.values():
        requests_sync(cluster=cluster, watch_seconds=1)
    assert {c.name: c.health for c in Cluster.objects.all()} == {"sandbox": "healthy", "a100-inference": "healthy",
                                                                  "l40s-dev": "healthy"}

    # The history's spill-overs: on the ops zones page and in the metric (the wait they saved).
    page = as_user("ops").get("/ops/zones/").content.decode()
    assert "h100-80gb → a100-80gb" in page and "l40s-dev" in page and "site-c" in page
    now = timezone.now()
    result = METRICS["spill-over"].compute(Query(scope=scope_of(cast.actor("ops")), start=now - timedelta(days=7),
                                                 end=now, group_by="project"))
    (row,) = result.rows
    assert row.group == "acme-vision" and row.values["spilled"] == 14 and row.values["saved_hours"] > 5

    # A fault takes the A100 zone down: only it is unhealthy; it answers again when brought back.
    out = io.StringIO()
    call_command("zone_fault", "a100-inference", "down", stdout=out)
    assert "a100-inference (zone a100-inference) is down" in out.getvalue()
    for cluster in Cluster.objects.all():
        requests_sync(cluster=cluster, watch_seconds=1)
    assert {c.name: c.health for c in Cluster.objects.all()} == {"sandbox": "healthy", "a100-inference": "unhealthy",
                                                                  "l40s-dev": "healthy"}
    call_command("zone_fault", "a100-inference", "up", stdout=io.StringIO())
    requests_sync(cluster=Cluster.objects.get(name="a100-inference"), watch_seconds=1)
    assert Cluster.objects.get(name="a100-inference").health == "healthy"
    with pytest.raises(Exception, match="No cluster 'nowhere'"):
        call_command("zone_fault", "nowhere", "down", stdout=io.StringIO())
