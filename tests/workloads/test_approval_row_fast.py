"""The approvals inbox writes its rows in Python (``{% approval_row %}``, docs/performance.md): the same HTML as
``workloads/_approval_row.html``, which still renders a row decided in place. Compared here for rows of every kind:
markup and quotes in what people typed, replicas, a reason, quota rows with and without a borrowing limit or use,
none, a cost estimate, a selected row, the other states, and a bound form (which goes through the template); each
with its form built and without one (the page's rows: the form's HTML written directly)."""

from __future__ import annotations

from decimal import Decimal

import pytest
from django.template import engines
from django.test import RequestFactory

from workloads import selectors
from workloads.forms import DecisionForm
from workloads.views import _inbox_row, _rows

from .test_approvers import submit

pytestmark = [pytest.mark.django_db]

FAST = "{% load requests_ui %}{% for row in rows %}{% approval_row row %}{% endfor %}"
TEMPLATE = ('{% for row in rows %}{% include "workloads/_approval_row.html" with req=row.req info=row.info '
            'form=row.form selectable=True %}{% endfor %}')


def both(rows: list[dict], *, unbuilt: bool = False, **extra) -> tuple[str, str]:
    """The rows written by ``{% approval_row %}`` and through the template. ``unbuilt``: the fast side's rows come
    without their form (``None``, as the inbox page passes them), the template's with a fresh ``DecisionForm``."""
    request = RequestFactory().get("/approvals/")
    context = {"rows": rows, "csrf_token": "t0ken", "request": request, **extra}
    engine = engines["django"]
    fast_rows = [row | {"form": None} for row in rows] if unbuilt else rows
    return engine.from_string(FAST).render(context | {"rows": fast_rows}), engine.from_string(TEMPLATE).render(context)


def test_the_rows_are_the_templates(cast, cat) -> None:
    for values in ({"gpus": 4}, {"gpus": 4}, {"gpus": 3, "duration_hours": 12}, {"gpus": 4}):
        submit(cast, cat, **values)
    inbox = _rows(selectors.approvals_inbox_for(actor=cast.actor("bob")), "tenant", "requested_by")
    rows = [_inbox_row(req) for req in inbox]
    assert len(rows) == 4
    first, second, third, fourth = rows
    first["req"].project.name = 'Vision & "co" <b>'
    first["req"].pending_reason = "4 GPUs > 2 & <more>"
    first["info"]["quota"] = [
        {"resource": "nvidia.com/gpu", "nominal": Decimal("6.50"), "borrowing_limit": None, "used": Decimal("1.25")},
        {"resource": "cpu", "nominal": Decimal("2"), "borrowing_limit": Decimal("0.333"), "used": None},
    ]
    first["info"]["cost_estimate"] = Decimal("12.5")
    first["info"]["waiting_ahead"] = 1
    second["info"]["quota"] = []
    second["info"]["cost_estimate"] = None  # no price list (one another test left in the cache would price it)
    second["req"].replicas = 3
    second["info"]["in_use"] = None
    second["info"]["waiting_ahead"] = 3
    second["req"].pending_reason = ""
    third["req"].state = "submitted"
    fourth["req"].state = "approved"
    for unbuilt in (False, True):  # a row's built form, and none (the page's rows: its HTML written directly)
        fast, template = both(rows, unbuilt=unbuilt, selected_requests={str(first["req"].pk)})
        assert 'checked> Select' in fast and "Billing not configured." in fast and "&lt;b&gt;" in fast
        assert f'id="id_decide-{first["req"].pk}-comment"' in fast and "Required to reject" in fast
        assert fast == template


def test_a_row_without_its_form_is_the_pages_row(cast, cat) -> None:
    """The page builds no form per row (``_inbox_row(built=False)``); its rows are those of a fresh form."""
    submit(cast, cat, gpus=4)
    req = _rows(selectors.approvals_inbox_for(actor=cast.actor("bob")), "tenant", "requested_by").get()
    row = _inbox_row(req, built=False)
    assert row["form"] is None
    fast, template = both([row | {"form": DecisionForm(prefix=f"decide-{req.pk}")}], unbuilt=True)
    assert f'name="decide-{req.pk}-comment"' in fast and fast == template


def test_a_bound_form_renders_through_the_template(cast, cat) -> None:
    submit(cast, cat, gpus=4)
    req = _rows(selectors.approvals_inbox_for(actor=cast.actor("bob")), "tenant", "requested_by").get()
    form = DecisionForm({f"decide-{req.pk}-comment": "x" * 1001}, prefix=f"decide-{req.pk}")
    assert not form.is_valid()
    fast, template = both([_inbox_row(req, form)])
    assert "field-invalid" in fast and fast == template
    for unbuilt in (False, True):
        fast, template = both([_inbox_row(req)], unbuilt=unbuilt, error="Decided meanwhile.")
        assert "Decided meanwhile." in fast and fast == template
        fast, template = both([_inbox_row(req)], unbuilt=unbuilt, done="Approved.")
        assert "Approved." in fast and fast == template


def test_the_inbox_page_shows_them(as_user, cast, cat) -> None:
    req = submit(cast, cat, gpus=4)
    body = as_user("bob").get("/approvals/").content.decode()
    assert f'id="approval-{req.pk}"' in body and f'action="/requests/{req.pk}/decide/"' in body
