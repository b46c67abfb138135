"""Sharing one request with a named colleague (workloads/sharing.py): through the API and the pages.

carol (member of acme-vision) shares her request with gina, a member of acme-nlp only, who otherwise sees nothing
of acme-vision. frank belongs to globex: he can never be named, and the refusal reads the same as for a name
nobody has.
"""

from __future__ import annotations

import pytest

from tenants.models import AuditEntry, Role
from workloads.sharing import NOT_A_COLLEAGUE

from ..factories import UserFactory, make_member
from .factories import make_request

API = "/api/v1"


@pytest.fixture
def gina(cast):
    user = UserFactory(username="gina", email="gina@acme.example")
    make_member(user, cast.acme, Role.MEMBER, cast.nlp)
    cast.gina = user  # as_user("gina")
    return user


@pytest.fixture
def req(cat, cast):
    return make_request(cat, cast.vision, cast.carol, template=cat.notebook)


def _client(cast, user):
    from rest_framework.test import APIClient

    client = APIClient()
    client.force_login(user)
    return client


def _ids(client) -> set[int]:
    return {row["id"] for row in client.get(f"{API}/requests/?page_size=100").json()["results"]}


def test_a_shared_request_shows_in_the_colleagues_list_and_detail_until_unshared(api, cast, req, gina) -> None:
    carol, other = api("carol"), _client(cast, gina)
    assert req.pk not in _ids(other)
    assert other.get(f"{API}/requests/{req.pk}/").status_code == 404

    response = carol.post(f"{API}/requests/{req.pk}/shares/", {"user": "gina", "level": "view"}, format="json")
    assert response.status_code == 201, response.content
    assert response.json()["user"] == "gina" and response.json()["level"] == "view"
    assert [row["user"] for row in carol.get(f"{API}/requests/{req.pk}/shares/").json()] == ["gina"]

    other = _client(cast, gina)
    assert req.pk in _ids(other)
    assert other.get(f"{API}/requests/{req.pk}/").json()["name"] == req.name
    assert req.pk in {row["id"] for row in other.get(f"{API}/requests/?state=pending_approval").json()["results"]}
    # View only: no logs. Operate: logs too.
    assert other.get(f"{API}/requests/{req.pk}/logs/").status_code == 403
    assert carol.post(f"{API}/requests/{req.pk}/shares/", {"user": "gina@acme.example", "level": "operate"},
                      format="json").status_code == 201
    other = _client(cast, gina)
    assert other.get(f"{API}/requests/{req.pk}/logs/").status_code == 200

    assert carol.delete(f"{API}/requests/{req.pk}/shares/gina/").status_code == 204
    assert carol.delete(f"{API}/requests/{req.pk}/shares/gina/").status_code == 404
    other = _client(cast, gina)
    assert req.pk not in _ids(other)
    assert other.get(f"{API}/requests/{req.pk}/").status_code == 404

    actions = list(AuditEntry.objects.filter(target_id=str(req.pk), action__startswith="request.")
                   .order_by("pk").values_list("action", flat=True))
    assert actions == ["request.share", "request.share", "request.unshare"]


def test_a_colleague_of_another_tenant_cannot_be_named_and_the_answer_reveals_nothing(api, cast, req, gina) -> None:
    carol = api("carol")
    foreign = carol.post(f"{API}/requests/{req.pk}/shares/", {"user": "frank"}, format="json")
    unknown = carol.post(f"{API}/requests/{req.pk}/shares/", {"user": "nobody-at-all"}, format="json")
    assert foreign.status_code == unknown.status_code == 400
    assert foreign.json() == unknown.json()
    assert foreign.json()["fields"] == {"user": [NOT_A_COLLEAGUE]}
    assert carol.get(f"{API}/requests/{req.pk}/shares/").json() == []
    bad_level = carol.post(f"{API}/requests/{req.pk}/shares/", {"user": "gina", "level": "own"}, format="json")
    assert bad_level.status_code == 400 and "level" in bad_level.json()["fields"]


def test_only_the_requester_and_project_admins_share_and_a_share_does_not_pass_on(api, cast, req, gina) -> None:
    assert api("carol").post(f"{API}/requests/{req.pk}/shares/", {"user": "gina"}, format="json").status_code == 201
    shared = _client(cast, gina)
    # gina sees it but may not share it further, nor see or stop its shares.
    assert shared.post(f"{API}/requests/{req.pk}/shares/", {"user": "dave"}, format="json").status_code == 403
    assert shared.get(f"{API}/requests/{req.pk}/shares/").status_code == 403
    assert shared.delete(f"{API}/requests/{req.pk}/shares/gina/").status_code == 403
    # dave (a viewer of the project) sees the request but may not share it; frank (globex) does not see it at all.
    assert api("dave").post(f"{API}/requests/{req.pk}/shares/", {"user": "gina"}, format="json").status_code == 403
    assert api("frank").post(f"{API}/requests/{req.pk}/shares/", {"user": "erin"}, format="json").status_code == 404
    assert api("frank").get(f"{API}/requests/{req.pk}/shares/").status_code == 404
    # bob, the project's admin, may.
    assert api("bob").post(f"{API}/requests/{req.pk}/shares/", {"user": "gina", "level": "operate"},
                           format="json").status_code == 201


def test_share_section_on_the_request_page(as_user, cast, req, gina) -> None:
    page = as_user("carol").get(f"/requests/{req.pk}/")
    assert b'id="share-h"' in page.content and b"Not shared with anyone." in page.content

    refused = as_user("carol").post(f"/requests/{req.pk}/shares/", {"share-user": "frank", "share-level": "view"})
    assert refused.status_code == 400 and NOT_A_COLLEAGUE.encode() in refused.content
    assert b'value="frank"' in refused.content  # what was typed comes back

    done = as_user("carol").post(f"/requests/{req.pk}/shares/", {"share-user": "gina", "share-level": "view"})
    assert done.status_code == 302
    page = as_user("carol").get(f"/requests/{req.pk}/")
    assert b"<strong>gina</strong>" in page.content and b"Stop sharing" in page.content

    # gina finds it in her list and on its page, without the Share section or the logs.
    client = as_user("gina")
    assert req.name.encode() in client.get("/requests/?scope=shared").content
    assert req.name.encode() in client.get("/requests/?scope=projects").content
    detail = client.get(f"/requests/{req.pk}/")
    assert detail.status_code == 200 and b'id="share-h"' not in detail.content and b'id="logs-h"' not in detail.content
    assert client.get(f"/requests/{req.pk}/logs/").status_code == 403
    assert client.post(f"/requests/{req.pk}/shares/", {"share-user": "dave", "share-level": "view"}).status_code == 403

    assert as_user("carol").post(f"/requests/{req.pk}/shares/gina/stop/").status_code == 302
    assert as_user("gina").get(f"/requests/{req.pk}/").status_code == 404
    assert req.name.encode() not in as_user("gina").get("/requests/?scope=shared").content


def test_a_share_lapses_when_the_colleague_leaves_the_tenant(api, cast, req, gina) -> None:
    from tenants.models import Membership

    assert api("carol").post(f"{API}/requests/{req.pk}/shares/", {"user": "gina"}, format="json").status_code == 201
    assert req.pk in _ids(_client(cast, gina))
    Membership.objects.filter(user=gina).delete()
    assert req.pk not in _ids(_client(cast, gina))
    assert _client(cast, gina).get(f"{API}/requests/{req.pk}/").status_code == 404


def test_an_operate_share_opens_the_notebook(api, cast, req, gina) -> None:
    from tenants.access import Actor
    from workloads.policy import may_open_notebook

    assert api("carol").post(f"{API}/requests/{req.pk}/shares/", {"user": "gina"}, format="json").status_code == 201
    assert not may_open_notebook(Actor(user=gina), req)
    assert api("carol").post(f"{API}/requests/{req.pk}/shares/", {"user": "gina", "level": "operate"},
                             format="json").status_code == 201
    gina.__dict__.pop("_portal_shares", None)
    assert may_open_notebook(Actor(user=gina), req)
