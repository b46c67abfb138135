"""``page_kit``: ``{% url_kept %}`` and ``{% url_if %}`` write what ``{% url %}`` writes, and ``|stamp`` and ``|day``
what ``|date:"Y-m-d H:i"`` and ``|date:"Y-m-d"`` write, for every kind of value (docs/performance.md)."""

from __future__ import annotations

from datetime import date, datetime, UTC
from zoneinfo import ZoneInfo

import pytest
from django.template import engines
from django.test import override_settings
from django.urls import NoReverseMatch


def render(source: str, **context) -> str:
    return engines["django"].from_string("{% load page_kit %}" + source).render(context)


@pytest.mark.parametrize("name, args", [
    ("home", ""), ("api-docs", ""), ("request-detail", " pk"), ("quota-request", " pk"), ("project-quota", " slug"),
    ("tenant-quotas", " slug"), ("project-quota", " odd"), ("request-detail", " text_pk"),
])
def test_urls_are_djangos(name: str, args: str) -> None:
    values = {"pk": 4321, "slug": "acme-vision_2", "odd": "ümlaut & co", "text_pk": "17"}
    try:
        expected = render(f"{{% url '{name}'{args} %}}", **values)
    except NoReverseMatch:
        with pytest.raises(NoReverseMatch):
            render(f"{{% url_kept '{name}'{args} %}}", **values)
        return
    for _ in range(2):  # reversed, then kept
        assert render(f"{{% url_kept '{name}'{args} %}}", **values) == expected


def test_a_missing_name() -> None:
    with pytest.raises(NoReverseMatch):
        render("{% url_kept 'no-such-page' %}")
    assert render("{% url_if 'no-such-page' as u %}[{{ u }}]") == render("{% url 'no-such-page' as u %}[{{ u }}]") == "[]"
    assert render("{% url_if 'home' as u %}[{{ u }}]") == render("{% url 'home' as u %}[{{ u }}]")
    # With an argument (the tenant tabs' optional pages): the same, and "" for a name that does not exist.
    for slug in ("acme", "acme-vision", "x"):
        assert (render("{% url_if 'tenant-quotas' s as u %}[{{ u }}]", s=slug)
                == render("{% url 'tenant-quotas' s as u %}[{{ u }}]", s=slug) == f"[/tenants/{slug}/quotas/]")
        assert render("{% url_if 'no-such-page' s as u %}[{{ u }}]", s=slug) == "[]"
    assert render("{% url_if 'quota-request' 7 as u %}[{{ u }}]") == render("{% url 'quota-request' 7 as u %}[{{ u }}]")


@pytest.mark.parametrize("value", [
    datetime(2026, 11, 30, 23, 57, 3, tzinfo=UTC),
    datetime(2026, 1, 2, 3, 4, tzinfo=ZoneInfo("America/New_York")),
    datetime(987, 6, 5, 4, 3, tzinfo=UTC),
    datetime(2026, 3, 4, 5, 6),  # naive
    date(2026, 3, 4), None, "", "text",
])
@pytest.mark.parametrize("zone", ["UTC", "Europe/Berlin"])
def test_stamps_are_djangos(value, zone: str) -> None:
    def out(source: str) -> str:
        try:
            return render(source, v=value)
        except TypeError as exc:  # Django's own: no hours in a date
            return f"TypeError: {exc}"

    with override_settings(TIME_ZONE=zone):
        assert out("{{ v|stamp }}") == out('{{ v|date:"Y-m-d H:i" }}')
        assert out("{{ v|day }}") == out('{{ v|date:"Y-m-d" }}')
        assert out('{{ v|stamp|default:"—" }}') == out('{{ v|date:"Y-m-d H:i"|default:"—" }}')


def test_display_is_djangos_get_field_display() -> None:
    """``|display("state")`` (Jinja2 and Django templates) writes what ``get_state_display`` writes: every choice of a
    request's state and of a quota request's status and approver, and a value that is no choice (itself)."""
    from quotas.models import QuotaRequest
    from workloads.models import RequestState, WorkloadRequest

    jinja = engines["jinja2"].from_string('{{ r|display("state") }}')
    for value in [*RequestState.values, "no-such-state"]:
        req = WorkloadRequest(state=value)
        assert render('{{ r|display:"state" }}', r=req) == req.get_state_display() == jinja.render({"r": req})
    for status in [*QuotaRequest.Status.values, "odd"]:
        for approver in [*QuotaRequest.Approver.values, ""]:
            r = QuotaRequest(status=status, approver=approver)
            assert render('{{ r|display:"status" }}/{{ r|display:"approver" }}', r=r) == (
                f"{r.get_status_display()}/{r.get_approver_display()}")
    assert render('{{ r|display:"state" }}', r=WorkloadRequest(state="<b>")) == "&lt;b&gt;"  # escaped as any value


@pytest.mark.django_db
def test_a_requests_urls_follow_its_script_prefix(as_user) -> None:
    """The URLconf and script prefix are looked up once per request: a request served under ``/portal`` writes every
    link under it, the next request without a prefix writes none, and a template rendered outside a request (an
    email, a task) writes Django's own."""
    from django.urls import set_script_prefix

    from django.conf import settings

    settings.STATIC_URL  # noqa: B018 read (and kept by Django) before the prefix changes: other tests' static URLs stay
    client = as_user("carol")
    set_script_prefix("/portal/")  # as the WSGI handler sets it from SCRIPT_NAME (the test client does not)
    try:
        under = client.get("/requests/").content.decode()
    finally:
        set_script_prefix("/")
    assert 'href="/portal/requests/new/"' in under and 'href="/requests/new/"' not in under
    plain = client.get("/requests/").content.decode()
    assert 'href="/requests/new/"' in plain and 'href="/portal/' not in plain
    assert render("{% url_kept 'request-detail' 7 %}") == render("{% url 'request-detail' 7 %}") == "/requests/7/"
