"""The quota request table writes its rows in Python (``{% quota_request_row %}``, docs/performance.md), the project
quota page its request lines (``{% quota_request_line %}``) and the quota tables what the cluster confirmed
(``{% confirmed_cell %}``): the same HTML as ``quotas/_request_row.html``, ``quotas/_request_line.html`` and
``quotas/_confirmed.html``, compared here for rows of every kind (the confirmations: enforced or not, confirmed or
not, drifting with and without a quota on the cluster). The requests: every status and approver, with and without an
end date, a decider or a comment, fractional and whole amounts, markup and quotes in what people typed and named, a
project slug the kept URLs take and one they reverse as usual, in UTC and in another time zone."""

from __future__ import annotations

from datetime import datetime, timezone
from decimal import Decimal
from itertools import cycle

from django.contrib.auth import get_user_model
from django.template import engines
from django.utils import timezone as tz

from quotas.capacity import Enforcement
from quotas.models import Flavor, QuotaRequest
from tenants.models import Project, Tenant

FAST = "{% load quota_tags %}{% for r in rows %}{% quota_request_row r %}{% endfor %}"
TEMPLATE = '{% for r in rows %}{% include "quotas/_request_row.html" %}{% endfor %}'
FAST_LINE = "{% load quota_tags %}{% for r in rows %}{% quota_request_line r %}{% endfor %}"
TEMPLATE_LINE = '{% for r in rows %}{% include "quotas/_request_line.html" %}{% endfor %}'


def _rows() -> list[QuotaRequest]:
    User = get_user_model()
    tenant = Tenant(pk=1, name='Acme <b>"R&D"</b>', slug="acme")
    projects = [Project(pk=1, tenant=tenant, name="Vision & co", slug="acme-vision"),
                Project(pk=2, tenant=Tenant(pk=2, name="Globex", slug="globex"), name="<i>LLM</i>", slug="llm_2")]
    flavors = [Flavor(pk=1, name="h100-80gb"), Flavor(pk=2, name='mig "1g" <x>')]
    carol, bob = User(pk=1, username="carol"), User(pk=2, username="b<o>b")
    at = datetime(2026, 11, 30, 23, 57, 3, tzinfo=timezone.utc)
    rows = []
    kinds = [  # (until, decided_by, comment)
        (None, None, ""), (at, bob, ""), (None, bob, "fine <by> me & \"you\""), (at, None, "withdrawn:\nno longer"),
        (at, bob, "x"),
    ]
    approvers = cycle(QuotaRequest.Approver.values)
    amounts = cycle([Decimal("4"), Decimal("0.500"), Decimal("12.125"), Decimal("1000")])
    pk = 0
    for status in QuotaRequest.Status.values:
        for until, decider, comment in kinds:
            pk += 1
            rows.append(QuotaRequest(
                pk=pk, project=projects[pk % 2], flavor=flavors[pk % 2], resource="nvidia.com/gpu" if pk % 3 else "cpu<&>",
                amount=next(amounts), until=until, requested_by=carol if pk % 2 else bob, status=status,
                approver=next(approvers), decided_by=decider, comment=comment, created_at=at, reason="more",
            ))
    return rows


def test_the_rows_are_the_templates() -> None:
    rows = _rows()
    engine = engines["django"]
    for zone in ("UTC", "Europe/Berlin"):
        with tz.override(zone):
            fast = engine.from_string(FAST).render({"rows": rows})
            template = engine.from_string(TEMPLATE).render({"rows": rows})
        assert fast.count("<tr id=") == len(rows) == 25
        assert "&lt;i&gt;LLM&lt;/i&gt;" in fast and "until 20" in fast and "—" in fast and "Ended (reverted)" in fast
        assert fast == template


def test_the_lines_are_the_templates() -> None:
    rows = _rows()
    engine = engines["django"]
    for zone in ("UTC", "Pacific/Kiritimati"):  # +14: another day than UTC's
        with tz.override(zone):
            fast = engine.from_string(FAST_LINE).render({"rows": rows})
            template = engine.from_string(TEMPLATE_LINE).render({"rows": rows})
        assert fast.count('<li class="request-line">') == len(rows)
        assert "&lt;x&gt;" in fast and "ended (reverted) by b&lt;o&gt;b" in fast and "<blockquote" in fast
        assert fast == template


def test_the_confirmations_are_the_template() -> None:
    at = datetime(2026, 11, 30, 23, 57, 3, tzinfo=timezone.utc)
    enforced = Enforcement(True, "kueue", "Kueue enforces it.")
    checks = [
        {"enforced": False, "enforcement": Enforcement(False, "", 'Nothing enforces <"mig"> & co.'), "confirmed_at": None,
         "cluster_nominal": None, "drift": None},
        {"enforced": True, "enforcement": enforced, "confirmed_at": at, "cluster_nominal": Decimal("8.000"), "drift": False},
        {"enforced": True, "enforcement": enforced, "confirmed_at": None, "cluster_nominal": None, "drift": True},
        {"enforced": True, "enforcement": enforced, "confirmed_at": at, "cluster_nominal": Decimal("2.500"), "drift": True},
        {"enforced": True, "enforcement": enforced, "confirmed_at": None, "cluster_nominal": None, "drift": None},
    ]
    engine = engines["django"]
    fast = engine.from_string("{% load quota_tags %}{% for c in rows %}[{% confirmed_cell c %}]{% endfor %}")
    template = engine.from_string('{% for c in rows %}[{% include "quotas/_confirmed.html" %}]{% endfor %}')
    for zone in ("UTC", "Asia/Kolkata"):
        with tz.override(zone):
            assert fast.render({"rows": checks}) == template.render({"rows": checks})
    text = fast.render({"rows": checks})
    assert "&lt;&quot;mig&quot;&gt;" in text and "says none" in text and "says 2.5" in text and "not yet" in text


def test_the_pages_write_them(as_user, cast) -> None:
    from tests.workloads.factories import make_catalogue

    cat = make_catalogue(cast)
    made = QuotaRequest.objects.create(project=cast.vision, flavor=cat.h100, resource="nvidia.com/gpu", amount=Decimal("2"),
                                       reason="more", requested_by=cast.carol, approver=QuotaRequest.Approver.PROJECT_ADMIN)
    body = as_user("carol").get("/quota-requests/").content.decode()
    assert f'<tr id="quota-request-row-{made.pk}">' in body and f'href="/quota-requests/{made.pk}/"' in body
    body = as_user("carol").get(f"/projects/{cast.vision.slug}/quota/").content.decode()
    assert '<li class="request-line">' in body and f'href="/quota-requests/{made.pk}/"' in body
    body = as_user("alice").get(f"/tenants/{cast.acme.slug}/quotas/").content.decode()  # confirmations per row
    assert 'data-label="Cluster confirmed">' in body and ("not yet on the cluster" in body or "not enforced" in body)
