"""What the request lists read besides their rows is kept per process (docs/performance.md, "The request lists'
reads kept"): the requests shared with a user (``workloads.shared.SHARES``), the project filter's choices, the ops
list's flavor and template choices and its rows' template and flavor names. A warm list reads its rows (and their
count) only; a share, a project, a flavor or a template written (here, or by another process) is seen at the next
page; a user's kept shares and projects are never another user's."""

from __future__ import annotations

import pytest
from django.core.cache import cache
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext

from tenants.models import Role
from workloads.models import RequestShare, ServiceTemplate
from workloads.shared import SHARES, VIEW
from workloads.sharing import request_share, request_unshare

from ..factories import UserFactory, make_member, make_project
from .factories import make_request

pytestmark = [pytest.mark.django_db(transaction=True)]  # outside a transaction, as a server runs: kept values used

SHARED_PAGE = "/requests/?scope=shared"


@pytest.fixture
def gina(cast):
    user = UserFactory(username="gina", email="gina@acme.example")
    make_member(user, cast.acme, Role.MEMBER, cast.nlp)
    return user


def _client(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


def test_a_warm_request_list_reads_no_share(cast, cat) -> None:
    make_request(cat, cast.vision, cast.carol, name="mine-1")
    client = _client(cast.carol)
    for path in ("/requests/", "/requests/?scope=projects", "/api/v1/requests/"):
        assert client.get(path).status_code == 200
        with CaptureQueriesContext(connection) as ctx:
            assert client.get(path).status_code == 200
        tables = [q["sql"] for q in ctx.captured_queries if "workloads_requestshare" in q["sql"]]
        assert tables == [], (path, tables)
    with CaptureQueriesContext(connection) as ctx:
        body = client.get("/requests/").content.decode()
    # The page's rows only (and their count when a page is full): no share, no project for the drop-down.
    assert "mine-1" in body and len(ctx.captured_queries) <= 2, [q["sql"] for q in ctx.captured_queries]


def test_the_project_filter_shows_a_renamed_or_joined_project_at_the_next_page(cast, cat) -> None:
    client = _client(cast.frank)
    assert f'<option value="{cast.llm.slug}">{cast.llm.name}</option>' in client.get("/requests/").content.decode()
    newer = make_project(cast.globex, "globex-newer", name="Newer")
    assert "globex-newer" not in client.get("/requests/").content.decode()
    cast.llm.name = "LLM renamed"
    cast.llm.save()
    make_member(cast.frank, cast.globex, Role.MEMBER, newer)
    body = client.get("/requests/").content.decode()
    assert f'<option value="{cast.llm.slug}">LLM renamed</option>' in body
    assert '<option value="globex-newer">Newer</option>' in body
    # frank never sees acme's projects, nor carol globex's, kept or not.
    assert cast.vision.slug not in body and cast.nlp.slug not in body
    assert "globex" not in _client(cast.carol).get("/requests/").content.decode()


def test_the_ops_filter_choices_are_kept_until_a_flavor_or_template_is_written(cast, cat) -> None:
    from quotas.models import Flavor

    client = _client(cast.ops)
    assert client.get("/ops/requests/").status_code == 200
    with CaptureQueriesContext(connection) as ctx:
        assert client.get("/ops/requests/").status_code == 200
    assert not [q for q in ctx.captured_queries if "UNION" in q["sql"]], [q["sql"] for q in ctx.captured_queries]
    flavor = Flavor.objects.order_by("pk").first()
    flavor.pk, flavor.name = None, "brand-new-flavor"
    flavor.save()
    template = cat.notebook
    template.pk, template.slug, template.version = None, "brand-new-template", 1
    template.save()
    body = client.get("/ops/requests/").content.decode()
    assert '<option value="brand-new-flavor">' in body and '<option value="brand-new-template">' in body


def test_a_share_made_and_stopped_shows_at_the_next_page(cast, cat, gina) -> None:
    req = make_request(cat, cast.vision, cast.carol, name="carols-notebook")
    other = _client(gina)
    assert "carols-notebook" not in other.get(SHARED_PAGE).content.decode()
    assert "carols-notebook" not in other.get(SHARED_PAGE).content.decode()  # kept: still nothing
    request_share(actor=cast.actor("carol"), request=req, user="gina", level="view")
    assert "carols-notebook" in other.get(SHARED_PAGE).content.decode()
    assert other.get(f"/requests/{req.pk}/").status_code == 200
    assert "carols-notebook" not in _client(cast.dave).get(SHARED_PAGE).content.decode()  # gina's, not dave's
    request_unshare(actor=cast.actor("carol"), request=req, user="gina")
    assert "carols-notebook" not in other.get(SHARED_PAGE).content.decode()
    assert other.get(f"/requests/{req.pk}/").status_code == 404


def test_a_share_written_directly_or_by_another_process_is_seen(cast, cat, gina) -> None:
    req = make_request(cat, cast.vision, cast.carol, name="carols-job")
    other = _client(gina)
    assert "carols-job" not in other.get(SHARED_PAGE).content.decode()
    share = RequestShare.objects.create(user=gina, content_object=req, permission=_view(), shared_by=cast.carol)
    assert "carols-job" in other.get(SHARED_PAGE).content.decode()  # a save: its signal
    RequestShare.objects.filter(pk=share.pk).delete()
    assert "carols-job" not in other.get(SHARED_PAGE).content.decode()
    # Another process's write (no signal here): its new version, read with the request's, has the shares read again.
    RequestShare.objects.bulk_create([RequestShare(user=gina, content_object=req, permission=_view(), shared_by=cast.carol)])
    cache.set(f"versioned:{SHARES}", "another-process", None)
    assert "carols-job" in other.get(SHARED_PAGE).content.decode()


def _view():
    from django.contrib.auth.models import Permission

    return Permission.objects.get(content_type__app_label="workloads", codename=VIEW)


def test_the_ops_rows_show_their_template_and_flavor_kept_and_written(cast, cat) -> None:
    from quotas.models import Flavor

    make_request(cat, cast.vision, cast.carol, name="on-h100", flavor=cat.h100, template=cat.notebook)
    make_request(cat, cast.llm, cast.frank, name="on-mig", flavor=cat.mig, template=cat.training)
    client = _client(cast.ops)
    assert client.get("/ops/requests/").status_code == 200
    with CaptureQueriesContext(connection) as ctx:
        body = client.get("/ops/requests/").content.decode()
    assert len(ctx.captured_queries) <= 2, [q["sql"] for q in ctx.captured_queries]  # the rows (and their count)
    assert _row(body, "on-h100") == (cat.notebook.name, str(cat.h100))
    assert _row(body, "on-mig") == (cat.training.name, str(cat.mig))
    Flavor.objects.filter(pk=cat.h100.pk).update(display_name="Renamed H100")  # no signal: another process's write
    cache.set("versioned:catalogue", "another-process", None)
    assert _row(client.get("/ops/requests/").content.decode(), "on-h100")[1] == "Renamed H100"
    cat.training.name = "Training renamed"
    cat.training.save()
    assert _row(client.get("/ops/requests/").content.decode(), "on-mig")[0] == "Training renamed"
    # A template the kept table lacks (written without a signal, no new version yet): read for its rows.
    unseen = ServiceTemplate.objects.get(pk=cat.inference.pk)
    unseen.pk, unseen.slug, unseen.name, unseen.version = None, "unseen", "Unseen template", 7
    ServiceTemplate.objects.bulk_create([unseen])
    unseen = ServiceTemplate.objects.get(slug="unseen")
    make_request(cat, cast.vision, cast.carol, name="on-unseen", flavor=cat.h100, template=unseen)
    assert _row(client.get("/ops/requests/").content.decode(), "on-unseen") == ("Unseen template", "Renamed H100")


def _row(body: str, name: str) -> tuple[str, str]:
    import re

    row = re.search(rf'>{name}</a></td>.*?data-label="Template">([^<]*)</td>\s*<td data-label="Resources">\d+ × ([^<]*?)</td>',
                    body, re.S)
    assert row, name
    return row.group(1), row.group(2)
