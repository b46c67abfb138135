"""Reclaimable capacity (insights/reclaimable.py): what would be freed if every rightsizing suggestion were taken, by
tenant, on a constructed history with a known answer; the same suggestions as the request page's ``suggestion()``;
a fixed number of queries however many requests; the ops page, the tenant admin's page and the API, scoped."""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from insights import measured
from insights.reclaimable import reclaimable
from workloads.models import RequestState

from ..workloads.factories import make_request
from .test_measured import H100_MIB, fleet, profile_samples  # noqa: F401 (fleet: the fixture)

S = RequestState


@pytest.fixture
def history(cast, fleet) -> dict[str, Any]:  # noqa: F811
    """acme: a running memory-light H100 job (-> a 2g.20gb slice: frees 5/7 of a card), a running saturated one (no
    suggestion), a notebook-like run that finished 3 days ago after 10 hours (-> a 1g.10gb slice: saves 6/7 x 10
    GPU-hours) and one that finished 8 days ago (outside the week). globex: a running 4-GPU job a third busy
    (-> 2 H100s: frees 2 cards)."""
    now = timezone.now()
    light = make_request(fleet, cast.vision, cast.carol, state=S.RUNNING, gpus=1, name="light-run")
    busy = make_request(fleet, cast.nlp, cast.alice, state=S.RUNNING, gpus=1, name="busy-run")
    week = make_request(fleet, cast.vision, cast.carol, state=S.SUCCEEDED, gpus=1, name="idle-done",
                        started_at=now - timedelta(days=3), finished_at=now - timedelta(days=3) + timedelta(hours=10))
    old = make_request(fleet, cast.vision, cast.carol, state=S.SUCCEEDED, gpus=1, name="idle-old",
                       started_at=now - timedelta(days=8, hours=10), finished_at=now - timedelta(days=8))
    wide = make_request(fleet, cast.llm, cast.frank, state=S.RUNNING, gpus=4, name="wide-run")
    profile_samples(light, fb=9318, sm=0.12, util=40)
    profile_samples(busy, fb=0.93 * H100_MIB, sm=0.95, util=97)
    profile_samples(week, fb=1230, sm=0.002, util=0)
    profile_samples(old, fb=1230, sm=0.002, util=0)
    profile_samples(wide, fb=H100_MIB * 0.3, sm=0.3, util=30)
    return {"light": light, "busy": busy, "week": week, "old": old, "wide": wide, "fleet": fleet}


def test_the_known_answer_by_tenant(cast, history) -> None:
    lines = reclaimable()
    assert [x.tenant.slug for x in lines] == ["globex", "acme"]  # most freed first
    globex, acme = lines
    assert globex.as_data() == {
        "tenant": "globex", "tenant_name": "Globex AI", "running": 1, "running_with_suggestion": 1,
        "held_cards": 4.0, "would_hold_cards": 2.0, "freed_cards": 2.0, "finished_with_suggestion": 0,
        "freed_gpu_hours_per_week": 0.0}
    assert acme.as_data() == {
        "tenant": "acme", "tenant_name": "Acme Research", "running": 2, "running_with_suggestion": 1,
        "held_cards": 2.0, "would_hold_cards": round(2 - 5 / 7, 2), "freed_cards": round(5 / 7, 2),
        "finished_with_suggestion": 1, "freed_gpu_hours_per_week": round(6 / 7 * 10, 2)}
    # the requests behind acme's line: the running one first, the week's run next; not the old one nor the busy one
    assert [r.request.name for r in acme.lines] == ["light-run", "idle-done"]
    assert acme.lines[0].suggestion.flavor.name == "a100-2g.20gb"
    assert acme.lines[1].suggestion.flavor.name == "a100-1g.10gb"
    # the same suggestions as the request page's, request by request
    for line in (*globex.lines, *acme.lines):
        one = measured.suggestion(line.request)
        got = line.suggestion
        assert (got.flavor, got.gpus, got.saving_gpu_hours, got.evidence) == (
            one.flavor, one.gpus, one.saving_gpu_hours, one.evidence)
    # narrowed to one tenant
    assert [x.tenant.slug for x in reclaimable(tenants=[cast.acme])] == ["acme"]


def test_a_fixed_number_of_queries_whatever_the_fleet(cast, history) -> None:
    with CaptureQueriesContext(connection) as few:
        reclaimable()
    for i in range(12):
        project, who = ((cast.vision, cast.carol), (cast.llm, cast.frank))[i % 2]
        req = make_request(history["fleet"], project, who, state=S.RUNNING, gpus=1)
        profile_samples(req, fb=9318, sm=0.12, util=40, n=2)
    with CaptureQueriesContext(connection) as many:
        lines = reclaimable()
    assert sum(x.running_suggested for x in lines) == 2 + 12
    assert len(many.captured_queries) == len(few.captured_queries) <= 5


def test_the_ops_page_and_its_drill_down(cast, history, as_user) -> None:
    client = as_user("ops")
    response = client.get("/ops/reclaimable/")
    assert response.status_code == 200
    body = response.content.decode()
    assert body.index('href="/ops/reclaimable/globex/"') < body.index('href="/ops/reclaimable/acme/"')
    assert "2.71 freed" in body  # the fleet: 2 + 5/7 cards
    assert 'href="/ops/reclaimable/"' in body and ">Reclaimable</a>" in body  # in the capacity navigation
    chart = json.loads(body.split('id="reclaimable-bars" type="application/json">')[1].split("</script>")[0])
    assert chart["labels"] == ["globex", "acme"]
    assert {d["label"]: d["data"] for d in chart["datasets"]} == {
        "Held now": [4.0, 2.0], "With the suggestions": [2.0, 1.29], "Freed": [2.0, 0.71]}
    drill = client.get("/ops/reclaimable/acme/").content.decode()
    assert "light-run" in drill and "idle-done" in drill and "wide-run" not in drill and "idle-old" not in drill
    assert "peak 9.1 GiB of 80 GiB GPU memory" in drill and "a100-2g.20gb" in drill and "8.57" in drill
    assert "Reclaimable capacity" in client.get("/ops/metrics/").content.decode()


@pytest.mark.parametrize("who", ["alice", "carol", "erin", "frank"])
def test_the_ops_page_is_404_for_everyone_else(cast, history, as_user, who) -> None:
    client = as_user(who)
    assert client.get("/ops/reclaimable/").status_code == 404
    assert client.get("/ops/reclaimable/acme/").status_code == 404


def test_a_tenant_admin_sees_their_own_tenant_only(cast, history, as_user) -> None:
    client = as_user("alice")
    page = client.get("/tenants/acme/reclaimable/")
    assert page.status_code == 200
    body = page.content.decode()
    assert "light-run" in body and "idle-done" in body and "wide-run" not in body
    assert "0.71 freed" in body and "8.57 GPU-hours a week" in body
    assert client.get("/tenants/globex/reclaimable/").status_code == 404  # another tenant: not there
    assert 'id="reclaimable-link"' in client.get("/tenants/acme/metrics/").content.decode()
    erin = as_user("erin").get("/tenants/globex/reclaimable/").content.decode()
    assert "wide-run" in erin and "light-run" not in erin
    # a researcher of the tenant sees the tenant, not its reclaimable capacity
    assert as_user("carol").get("/tenants/acme/reclaimable/").status_code == 403


def test_the_api(cast, history, api) -> None:
    ops = api("ops").get("/api/v1/reclaimable/", {"page_size": 1})
    assert ops.status_code == 200 and ops.json()["count"] == 2 and ops.json()["next"]
    assert [r["tenant"] for r in ops.json()["results"]] == ["globex"]
    alice = api("alice").get("/api/v1/reclaimable/").json()
    assert [r["tenant"] for r in alice["results"]] == ["acme"]
    detail = api("alice").get("/api/v1/reclaimable/acme/")
    assert detail.status_code == 200
    got = detail.json()
    assert got["freed_cards"] == round(5 / 7, 2) and got["count"] == 2
    first = got["requests"][0]
    assert (first["name"], first["suggested_flavor"], first["suggested_gpus"]) == ("light-run", "a100-2g.20gb", 1)
    assert first["evidence"].startswith("peak 9.1 GiB of 80 GiB GPU memory")
    assert api("alice").get("/api/v1/reclaimable/globex/").status_code == 404
    assert api("carol").get("/api/v1/reclaimable/").status_code == 403
    assert api("carol").get("/api/v1/reclaimable/acme/").status_code == 403
