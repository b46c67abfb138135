"""A project's idle policies (docs/measured-use.md, "Idle detection"): set on the project page and through the API by
project and tenant admins (and ops), audited through ``project_update``; members, viewers and other tenants cannot."""

from __future__ import annotations

import pytest

from tenants.models import AuditEntry, Project

pytestmark = [pytest.mark.django_db]

FORM = "idle-cull_idle_notebooks_by_gpu"


def policies(project: Project) -> tuple[bool, bool]:
    project.refresh_from_db()
    return project.cull_idle_notebooks_by_gpu, project.stop_idle_batch_jobs


def test_project_admin_sets_the_idle_policies_on_the_project_page(as_user, cast) -> None:
    client = as_user("bob")
    page = client.get("/projects/acme-vision/").content.decode()
    assert f'name="{FORM}"' in page and "notebooks kept" in page
    response = client.post("/projects/acme-vision/idle/", {FORM: "on"})
    assert response.status_code == 302 and response["Location"].endswith("/projects/acme-vision/#idle")
    assert policies(cast.vision) == (True, False)
    entry = AuditEntry.objects.get(action="project.update", project=cast.vision)
    assert entry.before["cull_idle_notebooks_by_gpu"] is False and entry.after["cull_idle_notebooks_by_gpu"] is True
    assert "notebooks culled" in client.get("/projects/acme-vision/").content.decode()
    # the tenant admin turns both the other way
    assert as_user("alice").post("/projects/acme-vision/idle/", {"idle-stop_idle_batch_jobs": "on"}).status_code == 302
    assert policies(cast.vision) == (False, True)


@pytest.mark.parametrize("who, status", [("carol", 403), ("dave", 403), ("frank", 404), ("erin", 404)])
def test_others_cannot_change_the_idle_policies(as_user, cast, who, status) -> None:
    client = as_user(who)
    if status == 403:  # members and viewers see the policies, not the form
        page = client.get("/projects/acme-vision/").content.decode()
        assert "Measured idle GPUs" in page and f'name="{FORM}"' not in page
    assert client.post("/projects/acme-vision/idle/", {FORM: "on"}).status_code == status
    assert policies(cast.vision) == (False, False)
    assert not AuditEntry.objects.filter(action="project.update").exists()


def test_idle_policies_through_the_api(api, cast) -> None:
    url = f"/api/v1/projects/{cast.vision.pk}/"
    response = api("bob").patch(url, {"stop_idle_batch_jobs": True}, format="json")
    assert response.status_code == 200 and response.json()["stop_idle_batch_jobs"] is True
    assert policies(cast.vision) == (False, True)
    assert AuditEntry.objects.filter(action="project.update", project=cast.vision).count() == 1
    bad = api("bob").patch(url, {"cull_idle_notebooks_by_gpu": "perhaps"}, format="json")
    assert bad.status_code == 400 and "cull_idle_notebooks_by_gpu" in bad.json().get("fields", bad.json())
    assert api("carol").patch(url, {"cull_idle_notebooks_by_gpu": True}, format="json").status_code == 403
    assert policies(cast.vision) == (False, True)
