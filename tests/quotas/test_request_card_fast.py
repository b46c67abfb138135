"""The quota request inbox writes its cards in Python (``{% quota_request_card %}``, docs/performance.md): the same
HTML as ``quotas/_request_card.html``, compared here for cards of every kind. In the inbox (selectable, the decision
form without asking) and outside it (the detail page, the card an in-place decision sends back): every status and
approver; a reader who may decide, one who may only withdraw (the requester), one who may do neither; with and
without the quota now (and what is borrowed of it), an end date, a decider, a decision time or a comment; a note, an
error, a typed comment sent back, a ``next`` URL or the page's own; markup and quotes in what people typed and named;
in UTC and in another time zone."""

from __future__ import annotations

from datetime import datetime, timezone
from decimal import Decimal
from itertools import cycle
from types import SimpleNamespace

from django.template import engines
from django.test import RequestFactory
from django.utils import timezone as tz

from quotas.forms import DecisionForm
from quotas.models import Flavor, QuotaRequest
from tenants.models import Project, Tenant

FAST = ("{% load quota_tags %}{% for r, current in rows %}"
        "{% quota_request_card r current inbox=inbox selectable=selectable %}{% endfor %}")
TEMPLATE = ('{% for r, current in rows %}{% include "quotas/_request_card.html" with inbox=inbox selectable=selectable %}'
            "{% endfor %}")


def _rows(cast) -> list[tuple[QuotaRequest, object]]:
    at = datetime(2026, 11, 30, 23, 57, 3, tzinfo=timezone.utc)
    odd = Project(pk=cast.vision.pk + 10_000, tenant=Tenant(pk=99, name='Acme <b>"R&D"</b>', slug="odd"),
                  name="<i>LLM</i>", slug="llm_2")
    projects = cycle([cast.vision, odd, cast.llm])
    flavors = cycle([Flavor(pk=1, name="h100-80gb"), Flavor(pk=2, name='mig "1g" <x>')])
    askers = cycle([cast.carol, cast.bob, cast.frank])
    currents = cycle([None, SimpleNamespace(nominal=Decimal("8.000"), used=Decimal("2.500"), borrowed=None),
                      SimpleNamespace(nominal=Decimal("4"), used=Decimal("0"), borrowed=Decimal("1.250")),
                      SimpleNamespace(nominal=Decimal("0"), used=Decimal("0"), borrowed=Decimal("0"))])
    kinds = [  # (until, decided_by, decided_at, comment)
        (None, None, None, ""), (at, cast.bob, at, ""), (None, cast.alice, None, 'fine <by> me & "you"'),
        (at, None, None, "withdrawn:\nno longer"), (None, cast.ops, at, "x"),
    ]
    approvers = cycle(QuotaRequest.Approver.values)
    amounts = cycle([Decimal("4"), Decimal("0.500"), Decimal("12.125")])
    reasons = cycle(["more", "line one\nline <two> & \"three\"\n\nfour"])
    rows = []
    pk = 0
    for status in QuotaRequest.Status.values:
        for until, decider, decided_at, comment in kinds:
            pk += 1
            rows.append((QuotaRequest(
                pk=pk, project=next(projects), flavor=next(flavors), resource="nvidia.com/gpu" if pk % 3 else "cpu<&>",
                amount=next(amounts), until=until, requested_by=next(askers), status=status,
                approver=next(approvers), decided_by=decider, decided_at=decided_at, comment=comment, created_at=at,
                reason=next(reasons),
                # Every fourth a HAMi request in shares (its size, what they add up to, the rows approval raises).
                share_memory_mib=11264 if pk % 4 == 0 else 0, share_cores_percent=25 if pk % 4 == 0 else 0,
            ), next(currents)))
    return rows


def test_the_cards_are_the_template(cast) -> None:
    rows = _rows(cast)
    engine = engines["django"]
    fast, template = engine.from_string(FAST), engine.from_string(TEMPLATE)
    typed = DecisionForm({"comment": 'why <not> & "so"', "decision": "reject"})
    contexts = [
        {"inbox": True, "selectable": True},
        {"inbox": False, "selectable": False},
        {"inbox": False, "selectable": True, "note": "Approved: +4 <gpu>."},
        {"inbox": False, "selectable": False, "error": 'Does not fit: "8" & more', "form": typed,
         "next_url": "/quota-requests/?q=a&b=<c>"},
        {"inbox": True, "selectable": False, "error": "Refused.", "form": DecisionForm(), "next_url": ""},
    ]
    seen = set()
    for who in ("bob", "carol", "alice", "ops", "dave"):
        for extra in contexts:
            for zone in ("UTC", "Asia/Kolkata"):
                request = RequestFactory().get("/quota-requests/?inbox_page=2&x=<y>")
                request.user = getattr(cast, who)
                context = {"rows": rows, "request": request, "csrf_token": "tok<en>"} | extra
                with tz.override(zone):
                    written = fast.render(context)
                    assert written == template.render(context)
                assert written.count('<li class="card request-card"') == len(rows) == 25
                seen |= {word for word in ("Withdraw", "Approve", "borrowed", "none yet", "permanent", "<br>", "Select",
                                           'role="status"', 'role="alert"', "&lt;not&gt;", "&amp;b=", "by ops, 2026",
                                           "shares of", "Approval raises together")
                         if word in written}
    assert len(seen) == 14, seen


def test_the_inbox_writes_them(as_user, cast) -> None:
    from tests.workloads.factories import make_catalogue

    cat = make_catalogue(cast)
    made = QuotaRequest.objects.create(project=cast.vision, flavor=cat.h100, resource="nvidia.com/gpu", amount=Decimal("2"),
                                       reason="more", requested_by=cast.carol, approver=QuotaRequest.Approver.PROJECT_ADMIN)
    body = as_user("bob").get("/quota-requests/").content.decode()
    assert f'<li class="card request-card" id="request-{made.pk}"' in body
    assert f'action="/quota-requests/{made.pk}/decide/"' in body and 'name="csrfmiddlewaretoken"' in body
