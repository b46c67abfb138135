"""The API (``/api/v1/mig-changes/``) and the pages (``/ops/mig-changes/``): who sees and does what, bad input as
field errors, and the impact on the page before anyone approves."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from maintenance.models import MigChange
from tenants.models import AuditEntry

pytestmark = [pytest.mark.django_db, pytest.mark.timeout(120)]
API = "/api/v1/mig-changes/"


def _body(demo, **values):
    now = timezone.now()
    body = {"pool": demo.pool.pk, "to_layout": "all-1g.10gb", "window_start": (now + timedelta(hours=1)).isoformat(),
            "deadline": (now + timedelta(hours=3)).isoformat(), "reason": "small slices for inference"}
    return body | values


def test_api_scoping_decisions_and_bad_input(api, cast, ops2, demo, settings) -> None:
    assert api("carol").get(API).status_code == 403  # a member: not for them
    assert api("carol").post(API, _body(demo), format="json").status_code == 403
    assert api("nobody").get(API).status_code == 403

    for values, field in [({"to_layout": "all-7g.40gb"}, "to_layout"), ({"to_layout": "half-1g"}, "to_layout"),
                          ({"to_layout": "all-balanced"}, "to_layout"),  # what it runs already
                          ({"deadline": (timezone.now() - timedelta(days=1)).isoformat()}, "deadline"),
                          ({"pool": 999999}, "pool"), ({"pool": "x"}, "pool"), ({"colour": "red"}, "colour"),
                          ({"tenant": "globex"}, "tenant")]:
        response = api("alice").post(API, _body(demo, **values), format="json")
        assert response.status_code == 400 and field in response.json()["fields"], (values, response.content)
    bad = api("alice").post(API, _body(demo, to_layout="all-7g.40gb"), format="json").json()
    assert "all-1g.10gb" in bad["fields"]["to_layout"][0]  # it names what the model allows
    assert not MigChange.objects.exists()

    # all-1g.10gb would cut globex's 3g.40gb quota: a tenant admin may not propose that (ops may, see below)
    cuts = api("alice").post(API, _body(demo), format="json")
    assert cuts.status_code == 400, cuts.content
    refusal = cuts.json()["fields"]["to_layout"][0]
    assert "not available to your tenant" in refusal and "Only platform ops" in refusal
    # It names nothing of the other tenant's: not the tenant, its project, the flavor or the amounts.
    for theirs in ("globex", "llm", "LLM", "3g.40gb", "→"):
        assert theirs not in refusal, (theirs, refusal)
    assert not MigChange.objects.exists()

    made = api("alice").post(API, _body(demo, to_layout="all-3g.40gb"), format="json")
    assert made.status_code == 201, made.content
    change = made.json()
    assert change["status"] == "proposed" and change["tenant"] == "acme" and change["proposed_by"] == "alice"
    assert {c["tenant"] for c in change["impact"]["quotas"]["changes"]} <= {"acme"}
    assert {r["resource"] for r in change["impact"]["capacity"]} >= {"nvidia.com/mig-1g.10gb", "nvidia.com/mig-3g.40gb"}
    assert change["steps"][0]["message"].startswith("Proposed by alice")
    url = f"{API}{change['id']}/"
    again = api("erin").post(API, _body(demo), format="json")  # globex uses the pool too, but one change at a time
    assert again.status_code == 409

    # another tenant's proposal: absent from the list and 404 by id; ops see it
    assert api("erin").get(API).json()["results"] == [] and api("erin").get(url).status_code == 404
    assert [c["id"] for c in api("alice").get(API).json()["results"]] == [change["id"]]
    assert [c["id"] for c in api("ops").get(API, {"status": "proposed"}).json()["results"]] == [change["id"]]
    assert api("ops").get(API, {"status": "running"}).json()["results"] == []
    assert api("ops").get(API, {"status": "nonsense"}).status_code == 400

    assert api("alice").post(f"{url}approve/", {}, format="json").status_code == 403  # tenant admins never approve
    assert api("ops").post(f"{url}reject/", {"comment": ""}, format="json").status_code == 400  # say why
    approved = api("ops").post(f"{url}approve/", {"comment": "ok for tonight"}, format="json")
    assert approved.status_code == 200 and approved.json()["status"] == "approved"
    assert approved.json()["approved_by"] == "ops"
    assert api("ops").post(f"{url}approve/", {}, format="json").status_code == 409
    assert api("alice").post(f"{url}cancel/", {}, format="json").json()["status"] == "cancelled"
    assert AuditEntry.objects.filter(action="mig_change.cancelled", actor_label="alice").exists()

    # ops proposing need a second ops person, unless the installation says it has one
    mine = api("ops").post(API, _body(demo), format="json").json()  # ops may cut any tenant's quota, plan shown
    assert mine["tenant"] is None and "globex" in {c["tenant"] for c in mine["impact"]["quotas"]["changes"]}
    refused = api("ops").post(f"{API}{mine['id']}/approve/", {}, format="json")
    assert refused.status_code == 403 and "Another ops person" in refused.json()["detail"]
    settings.PORTAL_MIG_SINGLE_OPS = True
    assert api("ops").post(f"{API}{mine['id']}/approve/", {}, format="json").status_code == 200
    assert api("erin").get(f"{API}{mine['id']}/").status_code == 404  # ops' own proposals: ops only


def test_pages_show_the_impact_before_approval_and_the_progress(as_user, client, cast, ops2, demo) -> None:
    def as_ops2():
        client.logout()
        client.force_login(ops2)
        return client

    assert as_user("carol").get("/ops/mig-changes/").status_code == 403
    page = as_user("ops").get("/ops/mig-changes/new/")
    assert page.status_code == 200 and b"all-1g.10gb" in page.content
    text = page.content.decode()  # "New layout" is a choice of the pool's GPU model's layouts, not free text
    assert '<select name="mig-to_layout"' in text and '<optgroup label="a100-80gb">' in text
    assert '<option value="all-1g.10gb">' in text and 'list="mig-layouts"' not in text
    form = {"mig-pool": str(demo.pool.pk), "mig-to_layout": "all-1g.10gb", "mig-window_start": "2030-01-01T22:00",
            "mig-deadline": "2030-01-02T02:00", "mig-reason": "small slices"}
    preview = as_user("ops").post("/ops/mig-changes/new/", form | {"preview": "1"})
    assert preview.status_code == 200 and b'id="impact-plan"' in preview.content and not MigChange.objects.exists()
    bad = as_user("ops").post("/ops/mig-changes/new/", form | {"mig-to_layout": "all-9g.99gb"})
    assert bad.status_code == 200 and b"Select a valid choice. all-9g.99gb is not one of the available" in bad.content
    early = as_user("ops").post("/ops/mig-changes/new/", form | {"mig-deadline": "2029-12-31T00:00"})
    assert b"cannot be before the window starts" in early.content and not MigChange.objects.exists()

    made = as_user("ops").post("/ops/mig-changes/new/", form)
    change = MigChange.objects.get()
    assert made.status_code == 302 and made["Location"] == f"/ops/mig-changes/{change.pk}/"
    detail = as_ops2().get(made["Location"])
    text = detail.content.decode()
    assert "Capacity per flavor" in text and "Quotas that no longer fit" in text and "globex" in text
    assert f'formaction="/ops/mig-changes/{change.pk}/reject/"' in text  # ops2 may decide
    assert "Approve</button>" not in as_user("ops").get(made["Location"]).content.decode()  # the proposer may not
    assert as_user("erin").get(made["Location"]).status_code == 404
    assert as_user("alice").get("/ops/mig-changes/").status_code == 200
    assert f'href="/ops/mig-changes/{change.pk}/"' not in as_user("alice").get("/ops/mig-changes/").content.decode()
    assert f'href="/ops/mig-changes/{change.pk}/"' in as_user("ops").get("/ops/mig-changes/").content.decode()

    decided = as_ops2().post(f"/ops/mig-changes/{change.pk}/approve/", {"comment": "fine"})
    assert decided.status_code == 302
    change.refresh_from_db()
    assert change.status == "approved" and change.approved_by == ops2
    progress = as_user("ops").get(f"/ops/mig-changes/{change.pk}/progress/")
    assert progress.status_code == 200 and b'hx-trigger="every 2s"' in progress.content
    # The cancel button is in the fragment the page polls: it goes as soon as the window opens.
    assert b'id="mig-change-cancel"' in progress.content
    from maintenance import states

    states.move(change, to="running", actor=cast.actor("ops"), step="cordon")
    for path in (f"/ops/mig-changes/{change.pk}/progress/", f"/ops/mig-changes/{change.pk}/"):
        assert b"Cancel this change" not in as_user("ops").get(path).content, path
    assert as_user("ops").get("/ops/mig-changes/", {"status": "approved"}).status_code == 200


def test_a_tenant_admin_sees_no_other_tenants_rows_in_the_impact_or_the_refusal(as_user, cast, demo) -> None:
    """all-1g.10gb would cut globex's quota. Previewing or proposing it, alice (acme's admin) learns that it is not
    available and that other tenants' quotas are affected, never whose, which project, flavor or amounts."""
    form = {"mig-pool": str(demo.pool.pk), "mig-to_layout": "all-1g.10gb", "mig-window_start": "2030-01-01T22:00",
            "mig-deadline": "2030-01-02T02:00", "mig-reason": "small slices"}
    preview = as_user("alice").post("/ops/mig-changes/new/", form | {"preview": "1"}).content.decode()
    assert "Capacity per flavor" in preview and 'id="impact-others-cut"' in preview
    refused = as_user("alice").post("/ops/mig-changes/new/", form).content.decode()
    assert "not available to your tenant" in refused and not MigChange.objects.exists()
    for page in (preview, refused):
        assert "globex" not in page and "LLM" not in page
    # Ops see every tenant's rows in the same preview.
    assert "globex" in as_user("ops").post("/ops/mig-changes/new/", form | {"preview": "1"}).content.decode()


def test_the_log_reads_in_the_order_it_was_written_whatever_the_clock(api, as_user, cast, demo) -> None:
    """Steps written in the same second, one by a worker whose clock is a little behind: the page and the API list
    them in the order they were written (their ``seq``), not by timestamp."""
    from maintenance import services, states
    from maintenance.models import MigChangeStep

    change = services.mig_change_propose(actor=cast.actor("ops"), pool=demo.pool, to_layout="all-1g.10gb",
                                         window_start=timezone.now() + timedelta(hours=1),
                                         deadline=timezone.now() + timedelta(hours=2))
    first = states.log(change, step="cordon", outcome="started", message="first: cordon started")
    second = states.log(change, step="cordon", outcome="done", message="second: cordon done")
    third = states.log(change, step="drain", outcome="started", message="third: drain started")
    # the later lines carry earlier instants (another worker's clock), within the same second
    MigChangeStep.objects.filter(pk=second.pk).update(at=first.at - timedelta(microseconds=300))
    MigChangeStep.objects.filter(pk=third.pk).update(at=first.at - timedelta(microseconds=600))
    assert [s.seq for s in (first, second, third)] == [2, 3, 4]  # 1: the proposal

    steps = api("ops").get(f"{API}{change.pk}/").json()["steps"]
    assert [s["message"].split(":")[0] for s in steps[1:]] == ["first", "second", "third"]
    assert [s["seq"] for s in steps] == [1, 2, 3, 4]
    page = as_user("ops").get(f"/ops/mig-changes/{change.pk}/progress/").content.decode()
    assert page.index("first: cordon") < page.index("second: cordon") < page.index("third: drain")
