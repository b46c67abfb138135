"""The ops zones page's zone fault (docs/federation.md, "Take a zone down"): "Take down" / "Bring up" per sandbox zone,
POST with CSRF, ops only, audited, the same service as ``manage.py zone_fault``. Two sandbox zones; the follower's
cycle then finds the zone taken down unhealthy and the other healthy."""

from __future__ import annotations

import io
import re
from pathlib import Path

import pytest
from django.core.management import call_command
from django.test import Client

from quotas.models import Cluster
from tenants.models import AuditEntry
from workloads.status import requests_sync

from ..zones import two_zones

pytestmark = [pytest.mark.django_db, pytest.mark.timeout(300)]


@pytest.fixture
def zones(tmp_path: Path, cast):
    with two_zones(tmp_path, cast) as found:
        yield found


def _health() -> dict[str, str]:
    return dict(Cluster.objects.values_list("name", "health"))


def _follow() -> None:
    for cluster in Cluster.objects.all():
        requests_sync(cluster=cluster, watch_seconds=1)


def test_ops_take_a_sandbox_zone_down_from_the_zones_page_and_bring_it_back(zones, as_user, cast) -> None:
    _follow()
    assert _health() == {"zone-h100": "healthy", "zone-a100": "healthy"}
    page = as_user("ops").get("/ops/zones/").content.decode()
    assert page.count(">Take down</button>") == 2 and ">Bring up<" not in page  # a button per sandbox zone

    # Without the CSRF token the POST is refused and nothing changes.
    raw = Client(enforce_csrf_checks=True)
    raw.force_login(cast.ops)
    assert raw.post("/ops/zones/zone-a100/fault/", {"action": "down"}).status_code == 403
    token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', raw.get("/ops/zones/").content.decode()).group(1)
    response = raw.post("/ops/zones/zone-a100/fault/", {"action": "down", "csrfmiddlewaretoken": token}, follow=True)
    assert response.status_code == 200
    page = response.content.decode()
    assert "zone-a100 (zone a100-inference) is down" in page
    assert page.count(">Take down</button>") == 1 and page.count(">Bring up</button>") == 1
    entry = AuditEntry.objects.get(action="cluster.zone_fault")
    assert entry.actor_id == cast.ops.pk and entry.target_id == str(zones["a100"].pk)
    assert entry.after["zone"] == "a100-inference" and entry.after["down"] is True and entry.created_at

    # Within a follower cycle only that zone shows unhealthy.
    _follow()
    assert _health() == {"zone-h100": "healthy", "zone-a100": "unhealthy"}
    page = as_user("ops").get("/ops/zones/").content.decode()
    assert re.search(r"a100-inference.*?badge-error\">unhealthy", page, re.S)

    # Bring it up: it answers again, audited too.
    response = as_user("ops").post("/ops/zones/zone-a100/fault/", {"action": "up"}, follow=True)
    assert "zone-a100 (zone a100-inference) answers again." in response.content.decode()
    requests_sync(cluster=zones["a100"], watch_seconds=1)
    assert _health()["zone-a100"] == "healthy"
    assert [e.after["down"] for e in AuditEntry.objects.filter(action="cluster.zone_fault").order_by("seq")] == [True, False]

    # The command is the same service: audited as the system actor.
    call_command("zone_fault", "zone-h100", "down", stdout=io.StringIO())
    last = AuditEntry.objects.filter(action="cluster.zone_fault").order_by("seq").last()
    assert last.actor_id is None and last.target_id == str(zones["h100"].pk) and last.after["down"] is True
    call_command("zone_fault", "zone-h100", "up", stdout=io.StringIO())


def test_the_zone_fault_is_refused_to_everyone_but_ops_and_bad_input_changes_nothing(zones, as_user) -> None:
    for who in ("alice", "erin", "carol"):  # tenant admins and a member: no such page
        assert as_user(who).post("/ops/zones/zone-a100/fault/", {"action": "down"}).status_code == 404
        assert as_user(who).get("/ops/zones/").status_code == 404
    assert as_user("ops").get("/ops/zones/zone-a100/fault/").status_code == 405
    assert as_user("ops").post("/ops/zones/nowhere/fault/", {"action": "down"}).status_code == 404
    bad = as_user("ops").post("/ops/zones/zone-a100/fault/", {"action": "sideways"})
    assert bad.status_code == 400 and "say down or up" in bad.content.decode()
    assert not AuditEntry.objects.filter(action="cluster.zone_fault").exists()
    _follow()
    assert _health() == {"zone-h100": "healthy", "zone-a100": "healthy"}
    # A cluster whose kubeconfig does not even load: the page still shows, without a button for it.
    Cluster.objects.create(name="broken", kubeconfig_encrypted="not-a-token")
    page = as_user("ops").get("/ops/zones/")
    assert page.status_code == 200 and "broken" in page.content.decode()
    assert page.content.decode().count(">Take down</button>") == 2
