"""``portal.ui.filtered(..., hide=...)``: a page that fixes some filters builds neither those filters nor their form
fields (docs/performance.md); the others are the FilterSet's own, in its order, and a hidden one's parameter filters
nothing, as before."""

from __future__ import annotations

import pytest
from django.test import Client, RequestFactory

from portal.ui import filtered
from workloads.filters import RequestFilter
from workloads.models import WorkloadRequest

from .factories import make_request

pytestmark = [pytest.mark.django_db]

HIDE = ("state", "phase", "tenant", "mine", "requested_by", "created_after", "created_before", "template", "flavor",
        "priority")


def test_hidden_filters_are_not_built(cast) -> None:
    request = RequestFactory().get("/approvals/", {"state": "running", "q": "wait"})
    request.user = cast.bob
    filterset = filtered(RequestFilter, request, WorkloadRequest.objects.all(), hide=HIDE)
    shown = [name for name in RequestFilter.base_filters if name not in HIDE]
    assert list(filterset.filters) == shown and list(filterset.form.fields) == shown == ["project", "kind", "q"]
    assert filterset.is_active  # ?q= is shown; ?state= is not
    again = filtered(RequestFilter, request, WorkloadRequest.objects.all(), hide=HIDE)
    assert type(again) is type(filterset)  # one class per FilterSet and hidden names
    assert list(filtered(RequestFilter, request, WorkloadRequest.objects.all()).filters) == list(RequestFilter.base_filters)


def test_a_hidden_parameter_filters_nothing_on_the_page(cast, cat) -> None:
    make_request(cat, cast.vision, cast.carol, name="wait-a")
    make_request(cat, cast.vision, cast.carol, name="other-b")
    client = Client()
    client.force_login(cast.bob)
    body = client.get("/approvals/?state=running&template=nope").content.decode()
    assert "wait-a" in body and "other-b" in body  # hidden: ignored
    body = client.get("/approvals/?q=wait").content.decode()
    assert "wait-a" in body and "other-b" not in body
    assert 'name="q"' in body and 'name="state"' not in body.split('id="filters"', 1)[1].split("</form>", 1)[0]
