"""The page frame written by Jinja2 (templates/jinja2/frame.html, through base.html's ``{% jinja_frame %}``) is byte
for byte what the Django ``base.html`` it replaced wrote (kept below as the reference, ``OLD``): for every kind of
reader (nobody signed in, a member, a viewer, an approver with requests waiting, a tenant admin, ops), on the pages
whose link the top bar marks as current, with messages (plain, with markup and apostrophes, safe), a full name with
markup and an apostrophe, the page's own title and scripts, and without a request at all (the 500 page). The
navigation badges' out-of-band answer (``_nav_counts.html``) too. Only the CSRF token differs: it is masked anew for
every render."""

from __future__ import annotations

import re

import pytest
from django.conf import settings
from django.contrib.auth.models import AnonymousUser
from django.contrib.messages import constants, get_messages
from django.contrib.messages.storage.fallback import FallbackStorage
from django.contrib.sessions.backends.cache import SessionStore
from django.template import Context, Engine, RequestContext, engines
from django.template.backends.django import get_installed_libraries
from django.test import RequestFactory
from django.utils.safestring import mark_safe

from workloads import services

from .workloads.factories import make_catalogue

# base.html and the badge's include as they were before the frame was Jinja2's: the reference.
OLD = {"base.html": '{% load static policy page_kit %}<!doctype html>\n<html lang="en">\n<head>\n  <meta charset="utf-8">\n  <meta name="viewport" content="width=device-width, initial-scale=1">\n  <title>{% block title %}GPU Portal{% endblock %} · GPU Portal</title>\n  <link rel="icon" href="{% static \'img/favicon.svg\' %}" type="image/svg+xml">\n  <link rel="stylesheet" href="{% static \'css/portal.css\' %}">\n  {# htmx\'s indicator styles are in portal.css: htmx adds no inline <style> (Content-Security-Policy). #}\n  <meta name="htmx-config" content=\'{"includeIndicatorStyles": false}\'>\n</head>\n<body hx-headers=\'{"X-CSRFToken": "{{ csrf_token }}"}\'>\n  <a class="skip-link" href="#main">Skip to content</a>\n  <header class="topbar">\n    <div class="topbar-inner">\n      <a class="brand" href="{% url_kept \'home\' %}"><span class="brand-mark" aria-hidden="true">▣</span> GPU Portal</a>\n      {% if user.is_authenticated %}\n        {# On narrow screens the menu folds behind this toggle (CSS only: a checkbox and its label, no script). #}\n        {# An approver\'s count is on the toggle too: on a phone the menu (and its badges) is folded. #}\n        {% may "workloads.may_decide_somewhere" as menu_approve %}{% may "tenants.may_operate" as menu_ops %}\n        <input type="checkbox" id="nav-toggle" class="nav-toggle" aria-controls="mainnav"{% if menu_approve or menu_ops %} aria-describedby="nav-count-menu-text"{% endif %} autocomplete="off">\n        <label for="nav-toggle" class="nav-toggle-button btn btn-secondary btn-small"><span aria-hidden="true">☰</span> Menu{% if menu_approve or menu_ops %}{% load requests_ui %}{% approvals_waiting as menu_waiting %}{% include "workloads/_nav_count.html" with key="menu" n=menu_waiting.requests|add:menu_waiting.quota %}{% endif %}</label>\n        <nav class="mainnav" id="mainnav" aria-label="Main">\n          {% may "tenants.may_manage_some_tenant" as nav_admins_tenants %}{% may "tenants.may_operate" as is_ops %}\n          {% url_if \'home\' as home_url %}\n          <a href="{{ home_url }}"{% if request.path == home_url or \'/projects/\' in request.path %} aria-current="page"{% endif %}>My projects</a>\n          {% if nav_admins_tenants %}\n            <a href="{% url_kept \'tenant-list\' %}"{% if request.path|slice:\':9\' == \'/tenants/\' %} aria-current="page"{% endif %}>Tenants you admin</a>\n            {% url_if \'statements\' as nav_statements_url %}{% if nav_statements_url %}{% may "billing.may_view_some_statements" as nav_statements %}{% if nav_statements and not is_ops %}<a href="{{ nav_statements_url }}"{% if request.path|slice:\':12\' == \'/statements/\' %} aria-current="page"{% endif %}>Statements</a>{% endif %}{% endif %}\n          {% endif %}\n          {% if is_ops %}\n            <a href="{% url_kept \'ops-home\' %}"{% if request.path|slice:\':5\' == \'/ops/\' and request.path|slice:\':14\' != \'/ops/requests/\' and not ops_capacity_section %} aria-current="page"{% endif %}>Ops</a>\n            {% url_if \'ops-capacity\' as ops_capacity_url %}{% if ops_capacity_url %}<a href="{{ ops_capacity_url }}"{% if ops_capacity_section %} aria-current="page"{% endif %}>Capacity</a>{% endif %}\n          {% endif %}\n          {% url_if \'request-list\' as requests_url %}{% if requests_url %}\n            {% may "workloads.may_submit_somewhere" as nav_submit %}{% may "workloads.may_decide_somewhere" as nav_approve %}\n            {% load requests_ui %}{% approvals_waiting as waiting %}\n            <a href="{{ requests_url }}"{% if request.path == requests_url or request.path|slice:\':10\' == \'/requests/\' and request.path != \'/requests/new/\' %} aria-current="page"{% endif %}>Requests</a>\n            {% if nav_submit %}<a href="{% url_kept \'request-new\' %}"{% if request.path == \'/requests/new/\' %} aria-current="page"{% endif %}>New request</a>{% endif %}\n            {% if nav_approve %}<a href="{% url_kept \'approvals\' %}"{% if request.path == \'/approvals/\' %} aria-current="page"{% endif %} aria-describedby="nav-count-requests-text">Approvals{% include "workloads/_nav_count.html" with key="requests" n=waiting.requests %}</a>{% endif %}\n            {% if is_ops %}<a href="{% url_kept \'ops-requests\' %}"{% if request.path == \'/ops/requests/\' %} aria-current="page"{% endif %}>All requests</a>{% endif %}\n          {% endif %}\n          {% url_if \'quota-requests\' as quota_requests_url %}{% if quota_requests_url %}<a href="{{ quota_requests_url }}"{% if request.path|slice:\':16\' == \'/quota-requests/\' %} aria-current="page"{% endif %}{% if nav_approve or is_ops %} aria-describedby="nav-count-quota-text">Quota requests{% include "workloads/_nav_count.html" with key="quota" n=waiting.quota %}{% else %}>Quota requests{% endif %}</a>{% endif %}\n          {% if nav_approve or is_ops %}{% url_if \'approvals-waiting\' as waiting_url %}{% if waiting_url %}<span hidden hx-get="{{ waiting_url }}" hx-trigger="approvals-changed from:body" hx-swap="none"></span>{% endif %}{% endif %}\n          <a href="{% url_kept \'api-docs\' %}">API docs</a>\n        </nav>\n        <details class="usermenu">\n          <summary><span class="avatar" aria-hidden="true">{{ user.get_username|first|upper }}</span> <span class="username">{{ user.get_username }}</span></summary>\n          <div class="usermenu-panel">\n            {% if user.get_full_name %}<p class="muted small">{{ user.get_full_name }}</p>{% endif %}\n            <a href="{% url_kept \'password_change\' %}">Change password</a>\n            <form method="post" action="{% url_kept \'logout\' %}">\n              {% csrf_token %}\n              <button type="submit" class="linklike">Sign out</button>\n            </form>\n          </div>\n        </details>\n      {% endif %}\n    </div>\n  </header>\n\n  <main id="main" class="container">\n    {% if messages %}\n      <ul class="messages" role="status">\n        {% for message in messages %}\n          <li class="message message-{{ message.tags|default:\'info\' }}">{{ message }}</li>\n        {% endfor %}\n      </ul>\n    {% endif %}\n    {% block content %}{% endblock %}\n  </main>\n\n  <footer class="footer container">\n    <span class="muted small">GPU Portal · <a href="{% url_kept \'api-docs\' %}">REST API</a></span>\n  </footer>\n\n  <script src="{% static \'vendor/htmx.min.js\' %}" defer></script>\n  <script src="{% static \'js/portal.js\' %}" defer></script>\n  <script src="{% static \'js/times.js\' %}" defer></script>\n  {% block scripts %}{% endblock %}\n</body>\n</html>\n',
       "workloads/_nav_count.html": '{# One navigation badge: how many wait for the user\'s decision (key: requests or quota). Replaced out of band after a decision. #}<span id="nav-count-{{ key }}" class="nav-count"{% if oob %} hx-swap-oob="true"{% endif %}>{% if n %}<span class="nav-badge" aria-hidden="true">{{ n }}</span>{% endif %}<span id="nav-count-{{ key }}-text" hidden>{% if n %}{{ n }} waiting for your decision{% else %}Nothing waits for your decision{% endif %}</span></span>\n'}

PAGE = ('{% extends "base.html" %}{% block title %}It\'s <the> page{% endblock %}'
        '{% block content %}<p>Body & more</p>{% endblock %}{% block scripts %}<script src="/x.js" defer></script>{% endblock %}')
BARE = '{% extends "base.html" %}'  # a page that fills no block: the default title


def reference() -> Engine:
    django = settings.TEMPLATES[0]
    return Engine(
        loaders=[("django.template.loaders.locmem.Loader", OLD),
                 ("django.template.loaders.filesystem.Loader", django["DIRS"]),
                 "django.template.loaders.app_directories.Loader"],
        libraries=get_installed_libraries(), context_processors=django["OPTIONS"]["context_processors"])


def masked(html: str) -> str:
    html = re.sub(r'(csrfmiddlewaretoken" value=")[^"]+', r"\1X", html)
    return re.sub(r'("X-CSRFToken": ")[^"]*', r"\1X", html)


def request_for(user, path: str, notes=()):
    request = RequestFactory().get(path)
    request.user = user or AnonymousUser()
    request.session = SessionStore()
    request._messages = FallbackStorage(request)
    for level, text in notes:
        request._messages.add(level, text)
    return request


def both(source: str, request, **context) -> tuple[str, str]:
    """(the reference's page, this frame's), each rendered for its own copy of the request and its messages."""
    notes = [(m.level, m.message) for m in get_messages(request)]
    old = reference().from_string(source).render(RequestContext(request, context))
    new = engines["django"].from_string(source).render(context, request=request_for(request.user, request.get_full_path(), notes))
    return masked(old), masked(new)


READERS = ["nobody", "carol", "dave", "bob", "alice", "erin", "ops"]
PATHS = ["/", "/projects/acme-vision/", "/requests/", "/requests/new/", "/requests/7/", "/approvals/", "/quota-requests/",
         "/tenants/acme/", "/statements/", "/ops/", "/ops/requests/", "/ops/capacity/"]


@pytest.mark.parametrize("who", READERS)
def test_the_frame_is_written_as_djangos_was_for_every_reader_and_page(cast, who) -> None:
    user = None if who == "nobody" else getattr(cast, who)
    for path in PATHS:
        old, new = both(PAGE, request_for(user, path))
        assert new == old, (who, path)
        assert "<title>It's <the> page · GPU Portal</title>" in new and '<script src="/x.js" defer></script>' in new
    old, new = both(BARE, request_for(user, "/ops/capacity/"), ops_capacity_section=True)
    assert new == old and "<title>GPU Portal · GPU Portal</title>" in new
    assert ("<nav" in new) is (user is not None)


def test_badges_messages_and_a_full_name_with_an_apostrophe(cast) -> None:
    cat = make_catalogue(cast)
    services.request_submit(actor=cast.actor("carol"), project=cast.vision, template=cat.training, flavor=cat.h100,
                            gpus=4, parameters={"command": "python train.py"})
    cast.bob.first_name, cast.bob.last_name = "Bob", "O'Brien <b>"
    cast.bob.save()
    notes = [(constants.SUCCESS, "Request #3's <b>done</b> & saved"),
             (constants.ERROR, mark_safe("<a href='/x'>Safe</a> link")), (constants.INFO, "Plain")]
    for path in ["/approvals/", "/quota-requests/", "/requests/"]:
        old, new = both(PAGE, request_for(cast.bob, path, notes))
        assert new == old, path
    assert '<span class="nav-badge" aria-hidden="true">1</span>' in new  # the badge is there
    assert "O&#x27;Brien &lt;b&gt;" in new and "Request #3&#x27;s &lt;b&gt;done&lt;/b&gt; &amp; saved" in new
    assert "<a href='/x'>Safe</a> link" in new and 'class="message message-error"' in new
    old, new = both('{% include "workloads/_nav_counts.html" %}', request_for(cast.bob, "/approvals/"))
    assert new == old and 'hx-swap-oob="true"' in new


def test_without_a_request_the_frame_is_the_bare_page(db) -> None:
    """The 500 page is rendered with no request, no user and no CSRF token."""
    old = reference().from_string(PAGE).render(Context({}))
    new = engines["django"].from_string(PAGE).render({})
    assert new == old and "<nav" not in new
    assert engines["django"].get_template("500.html").render({}) == reference().get_template("500.html").render(Context({}))


def test_the_frames_static_urls_follow_the_setting(cast, settings) -> None:
    """The frame's ``static()`` URLs are kept per process, and forgotten when a setting changes."""
    page = engines["django"].from_string(PAGE)
    assert 'href="/static/css/portal.css"' in page.render({}, request=request_for(cast.carol, "/"))
    settings.STATIC_URL = "/assets/"
    new = page.render({}, request=request_for(cast.carol, "/"))
    assert 'href="/assets/css/portal.css"' in new and 'src="/assets/vendor/htmx.min.js"' in new
    old = reference().from_string(PAGE).render(RequestContext(request_for(cast.carol, "/"), {}))
    assert masked(new) == masked(old)
