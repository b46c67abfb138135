"""The approvals inbox's rows (Jinja2, ``{% jinja %}``) carry the page's CSRF token, masked once per page like the
rest of the page's forms, not once per row (docs/performance.md), and a decision posted with it is accepted."""

from __future__ import annotations

import re

import pytest
from django.test import Client

from workloads.models import RequestState, WorkloadRequest

from .test_approvers import submit

pytestmark = [pytest.mark.django_db]


def test_every_form_of_the_inbox_has_one_csrf_token_and_a_decision_with_it_passes(cast, cat) -> None:
    requests = [submit(cast, cat, name=f"job-{i}", gpus=4) for i in range(3)]  # 4 GPUs: a project admin decides
    client = Client(enforce_csrf_checks=True)
    client.force_login(cast.bob)
    body = client.get("/approvals/").content.decode()
    tokens = re.findall(r'name="csrfmiddlewaretoken" value="([^"]+)"', body)
    assert len(tokens) >= len(requests) + 2  # a decision form per row, the bulk form, signing out
    assert len(set(tokens)) == 1
    assert f'"X-CSRFToken": "{tokens[0]}"' in body  # htmx's header: the same token
    first = requests[0]
    response = client.post(f"/requests/{first.pk}/decide/", {
        "csrfmiddlewaretoken": tokens[0], "decision": "approve", "next": "inbox", f"decide-{first.pk}-comment": "fine",
    }, HTTP_HX_REQUEST="true")
    assert response.status_code == 200
    assert "job-0 approved." in response.content.decode()
    assert WorkloadRequest.objects.get(pk=first.pk).state != RequestState.PENDING_APPROVAL
    refused = Client(enforce_csrf_checks=True)
    refused.force_login(cast.bob)
    response = refused.post(f"/requests/{requests[1].pk}/decide/", {"decision": "approve", "next": "inbox"})
    assert response.status_code == 403
