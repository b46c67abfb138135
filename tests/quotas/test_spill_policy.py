"""A project's spill-over policy, on its page and through the API (docs/federation.md): members read it, its
admins and its tenant's admins set it (audited), other tenants get a 404, bad input a field error that changes
nothing."""

from __future__ import annotations

import pytest

from quotas.models import Cluster, Flavor, SpillPolicy
from tenants.models import AuditEntry

pytestmark = pytest.mark.django_db
URL = "/api/v1/projects/acme-vision/spill-policy/"
PAGE = "/projects/acme-vision/spill-over/"


@pytest.fixture
def models(db):
    cluster = Cluster.objects.create(name="lab", architecture="B")
    for name, model in [("h100", "h100-80gb"), ("a100", "a100-80gb")]:
        Flavor.objects.create(cluster=cluster, name=name, kind=Flavor.Kind.WHOLE, gpu_model=model)


def test_api_reads_and_sets_the_policy_scoped_and_audited(api, cast, models) -> None:
    assert api("carol").get(URL).json() == {"project": "acme-vision", "allowed": False, "target_models": [],
                                            "needs_approval": False, "may_change": False}
    body = {"allowed": True, "target_models": ["a100-80gb"], "needs_approval": True}
    assert api("carol").put(URL, body, format="json").status_code == 403  # a member reads, does not set
    response = api("bob").put(URL, body, format="json")
    assert response.status_code == 200, response.content
    assert response.json() | {"may_change": True} == {"project": "acme-vision", **body, "may_change": True}
    entry = AuditEntry.objects.get(action="project.spill_policy")
    assert entry.actor == cast.bob and entry.after["target_models"] == ["a100-80gb"]
    assert api("alice").put(f"/api/v1/projects/{cast.vision.pk}/spill-policy/", {"allowed": False},
                            format="json").json()["allowed"] is False
    # Bad input: a field error, and nothing changes.
    bad = api("bob").put(URL, {"allowed": True, "target_models": ["v100-16gb"]}, format="json")
    assert bad.status_code == 400 and "No cluster offers v100-16gb" in bad.json()["fields"]["target_models"][0]
    bad = api("bob").put(URL, {"target_models": ["a100-80gb"]}, format="json")
    assert bad.status_code == 400 and "allowed" in bad.json()["fields"]
    assert SpillPolicy.objects.get(project=cast.vision).allowed is False
    # Other tenants see nothing, not even that the project exists.
    assert api("erin").get(URL).status_code == 404
    assert api("erin").put(URL, body, format="json").status_code == 404
    assert AuditEntry.objects.filter(action="project.spill_policy").count() == 2


def test_page_shows_and_sets_the_policy_for_admins_only(as_user, cast, models) -> None:
    body = as_user("carol").get(PAGE).content.decode()
    assert "Not allowed: the project's work always waits for its own GPU model." in body
    assert "Save spill-over policy" not in body
    assert as_user("carol").post(PAGE, {"allowed": "on"}).status_code == 403
    assert "Spill-over policy" in as_user("carol").get("/projects/acme-vision/quota/").content.decode()

    response = as_user("alice").post(PAGE, {"allowed": "on", "target_models": ["a100-80gb"], "needs_approval": "on"})
    assert response.status_code == 302
    body = as_user("alice").get(PAGE).content.decode()
    assert "Allowed to a100-80gb; a request that spills waits for an approver." in body
    bad = as_user("alice").post(PAGE, {"allowed": "on", "target_models": ["v100-16gb"]})
    assert bad.status_code == 200 and "Select a valid choice" in bad.content.decode()
    assert SpillPolicy.objects.get(project=cast.vision).target_models == ["a100-80gb"]
    assert AuditEntry.objects.filter(action="project.spill_policy", actor=cast.alice).count() == 1
    assert as_user("erin").get(PAGE).status_code == 404
    assert as_user("erin").post(PAGE, {"allowed": "on"}).status_code == 404
