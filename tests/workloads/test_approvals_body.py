"""The approvals inbox's body and its extension request rows are Jinja2 templates
(templates/jinja2/workloads/approvals_body.html, _extension_row.html; docs/performance.md): byte for byte what the
Django templates they replaced wrote (kept below as the reference), CSRF tokens aside, for an inbox with requests,
extension and scale requests (markup in their reasons, one of them ticked after a refused bulk decision), and for
the htmx answer of one extension request decided in place (refused: the comment's error; done: the note)."""

from __future__ import annotations

import re

import pytest
from django.template import engines
from django.test import Client

from workloads.extensions import extension_request_create
from workloads.forms import DecisionForm
from workloads.models import ExtensionRequest, RequestState
from workloads.services import REJECT_REASON_MISSING

from .factories import make_request
from .test_approvers import submit

pytestmark = [pytest.mark.django_db]
HTMX = {"HTTP_HX_REQUEST": "true"}

OLD_PAGE = '{% extends "base.html" %}{% load page_kit %}\n{% block title %}Approvals{% endblock %}\n{% block content %}\n<div class="page-head">\n  <div>\n    <h1>Approvals</h1>\n    <p class="muted">Requests waiting for your decision, oldest first, with what you need to decide: the project\'s quota and use, the queue, the cost. Decide one at a time, or tick several and decide them together.</p>\n  </div>\n</div>\n\n{% include "includes/filters.html" with filter_label="Filter approvals" fold=True %}\n\n{% if rows or extension_rows %}\n  <section class="card" aria-labelledby="bulk-h">\n    <h2 id="bulk-h">Several at once</h2>\n    <form method="post" action="{% url_kept \'approvals-bulk\' %}" id="bulk-form" class="bulk-form" novalidate>\n      {% csrf_token %}\n      <p class="muted small">Tick the requests below, then approve or reject them all. Each one is decided as if you had clicked it: one that cannot be (decided meanwhile, not yours) is reported and the others go ahead.</p>\n      {% include "includes/form_fields.html" with form=bulk_form %}\n      <div class="form-actions">\n        <button type="submit" name="decision" value="approve" class="btn btn-primary">Approve selected</button>\n        <button type="submit" name="decision" value="reject" class="btn btn-danger">Reject selected</button>\n      </div>\n    </form>\n  </section>\n{% endif %}\n\n{% if rows %}\n  <ul class="plain inbox" aria-label="Awaiting approval">\n    {% jinja "workloads/_approval_rows.html" rows=rows selected_requests=selected_requests %}\n  </ul>\n{% else %}\n  <div class="card empty">\n    {% if filterset.is_active %}<p>Nothing matches these filters. <a href="{{ request.path }}">Clear the filters</a>.</p>\n    {% else %}<p><strong>Nothing waits for you.</strong></p><p class="muted">New requests that need a project admin show up here.</p>{% endif %}\n  </div>\n{% endif %}\n{% include "includes/pagination.html" %}\n\n{% if extension_rows %}\n  <section aria-labelledby="extensions-h">\n    <h2 id="extensions-h">Extensions and scaling asked for</h2>\n    <ul class="plain inbox" aria-label="Extensions awaiting approval">\n      {% for row in extension_rows %}{% include "workloads/_extension_row.html" with ext=row.ext form=row.form selectable=True in_inbox=True %}{% endfor %}\n    </ul>\n    {% include "includes/pagination.html" with pager=extension_pager %}\n  </section>\n{% endif %}\n{% endblock %}\n'
OLD_ROW = '{% load page_kit %}{# One extension request in the approver\'s inbox: what is asked and why, and the decision (htmx: this item is replaced). #}{% load requests_ui %}\n<li class="card inbox-item" id="extension-{{ ext.pk }}" aria-labelledby="extension-{{ ext.pk }}-h">\n  <div class="card-head">\n    <h3 class="card-title" id="extension-{{ ext.pk }}-h"><a href="{% url_kept \'request-detail\' ext.request_id %}">{{ ext.request.name }}</a>: {% if ext.is_scale %}scale to {{ ext.replicas }} replicas{% else %}{{ ext.hours }} more hours{% endif %}</h3>\n    <span>\n      {% if ext.status == "pending" and not done %}<label class="select-item"><input type="checkbox" name="extension_requests" value="{{ ext.pk }}" form="bulk-form"{% if ext.pk|stringformat:"d" in selected_extensions %} checked{% endif %}> Select<span class="visually-hidden"> {% if ext.is_scale %}scaling{% else %}extension{% endif %} of {{ ext.request.name }}</span></label>{% endif %}\n      <span class="badge badge-extension-{{ ext.status }}">{{ ext.get_status_display }}</span>\n    </span>\n  </div>\n  <p class="muted small">{{ ext.request.template.name }} in <strong>{{ ext.request.project.name }}</strong> ({{ ext.request.project.tenant.name }}) · asked by {{ ext.requested_by.get_username }} · {{ ext.created_at|stamp }}</p>\n  <dl class="facts facts-wide">\n    {% if ext.is_scale %}\n    <div><dt>Runs now</dt><dd>{{ ext.request.replicas }} replica{{ ext.request.replicas|pluralize }} of {{ ext.request.gpus }} × {{ ext.request.flavor }} ({{ ext.request.get_state_display|lower }})</dd></div>\n    <div><dt>With it</dt><dd>{{ ext.replicas }} replicas</dd></div>\n    {% else %}\n    <div><dt>Runs now</dt><dd>{{ ext.request.gpus }} × {{ ext.request.flavor }} for {{ ext.request.duration_hours }} h ({{ ext.request.get_state_display|lower }})</dd></div>\n    <div><dt>With it</dt><dd>{{ ext.request.duration_hours|add:ext.hours }} h <span class="muted small">(at most {{ ext.request.template.max_duration_hours }})</span></dd></div>\n    {% endif %}\n    <div><dt>Why</dt><dd>{{ ext.reason|linebreaksbr }}</dd></div>\n    {% if ext.comment %}<div><dt>{% if ext.status == "rejected" %}Reason{% else %}Comment{% endif %}</dt><dd>{{ ext.comment }}</dd></div>{% endif %}\n  </dl>\n  {% if done %}\n    <p class="note" role="status">{{ done }}</p>\n  {% elif ext.status == "pending" %}\n    {% url_kept \'extension-decide\' ext.pk as decide_url %}<form method="post" action="{{ decide_url }}"\n          hx-post="{{ decide_url }}" hx-target="closest li" hx-swap="outerHTML">\n      {% csrf_token %}\n      <input type="hidden" name="next" value="inbox">\n      {% with field=form.comment %}\n        <div class="field{% if field.errors %} field-invalid{% endif %}">\n          <label for="{{ field.id_for_label }}">Comment on the {% if ext.is_scale %}scaling{% else %}extension{% endif %} of {{ ext.request.name }}</label>\n          {{ field|row_widget }}\n          {{ field.errors }}\n          {% if field.help_text %}<p class="help" id="{{ field.auto_id }}_helptext">{{ field.help_text }}</p>{% endif %}\n        </div>\n      {% endwith %}\n      <div class="form-actions">\n        <button type="submit" name="decision" value="approve" class="btn btn-primary">Approve<span class="visually-hidden"> the {% if ext.is_scale %}scaling{% else %}extension{% endif %} of {{ ext.request.name }}</span></button>\n        <button type="submit" name="decision" value="reject" class="btn btn-danger">Reject<span class="visually-hidden"> the {% if ext.is_scale %}scaling{% else %}extension{% endif %} of {{ ext.request.name }}</span></button>\n      </div>\n    </form>\n  {% endif %}\n  {% if error and not form.comment.errors %}<p class="error small" role="alert">{{ error }}</p>{% endif %}\n</li>\n'
# The old page included the old row by name; the reference inlines it.
OLD = OLD_PAGE.replace(
    '{% include "workloads/_extension_row.html" with ext=row.ext form=row.form selectable=True in_inbox=True %}',
    '{% with ext=row.ext form=row.form selectable=True in_inbox=True %}' + OLD_ROW.replace("{% load page_kit %}", "", 1)
    .replace("{% load requests_ui %}", "", 1) + '{% endwith %}').replace("{% load page_kit %}", "{% load page_kit requests_ui %}", 1)


def _plain(html: str) -> str:
    html = re.sub(r'(csrfmiddlewaretoken" value=")[^"]+', r"\1X", html)
    return re.sub(r'("X-CSRFToken": ")[^"]+', r"\1X", html)


def _reference(response) -> str:
    return engines["django"].from_string(OLD).render(response.context[0].flatten(), request=response.wsgi_request)


@pytest.fixture
def inbox(cast, cat):
    for i in range(3):
        submit(cast, cat, gpus=4, name=f"big-{i}")
        running = make_request(cat, cast.vision, cast.carol, state=RequestState.RUNNING, name=f"run-<{i}>", replicas=1)
        extension_request_create(actor=cast.actor("carol"), request=running, hours=2 + i, reason=f"more <{i}> & 'why'\nnow")
    return running


def test_the_inbox_is_what_the_django_templates_wrote(cast, inbox) -> None:
    client = Client()
    client.force_login(cast.bob)
    response = client.get("/approvals/")
    body = response.content.decode()
    assert body.count('class="card inbox-item" id="extension-') == 3
    assert body.count('class="card inbox-item" id="approval-') == 3
    assert _plain(body) == _plain(_reference(response))
    # A refused bulk decision (no reason to reject) shows the page again with the ticked extension still ticked.
    ext = ExtensionRequest.objects.order_by("pk").first()
    response = client.post("/approvals/bulk/", {"decision": "reject", "bulk-comment": "", "extension_requests": [str(ext.pk)]})
    assert response.status_code == 400
    body = response.content.decode()
    assert f'value="{ext.pk}" form="bulk-form" checked' in body
    assert _plain(body) == _plain(_reference(response))


def test_the_htmx_answer_of_one_extension_is_what_the_django_row_wrote(cast, inbox) -> None:
    client = Client()
    client.force_login(cast.bob)
    ext = ExtensionRequest.objects.select_related("request__template", "request__project__tenant", "request__flavor",
                                                  "requested_by").order_by("pk").first()
    old_row = engines["django"].from_string(OLD_ROW)
    response = client.post(f"/extension-requests/{ext.pk}/decide/", {"decision": "reject"}, **HTMX)
    form = DecisionForm({"decision": "reject"}, prefix=f"extension-{ext.pk}")
    form.is_valid()
    form.add_error("comment", REJECT_REASON_MISSING)
    body = response.content.decode()
    assert "Say why it is rejected" in body
    reference = old_row.render({"ext": ext, "form": form, "error": REJECT_REASON_MISSING, "done": ""},
                               request=response.wsgi_request)
    assert _plain(body) == _plain(reference)
    response = client.post(f"/extension-requests/{ext.pk}/decide/", {"decision": "approve"}, **HTMX)
    ext = ExtensionRequest.objects.select_related("request__template", "request__project__tenant", "request__flavor",
                                                  "requested_by").get(pk=ext.pk)
    done = f"Extension of {ext.request.name} by {ext.hours} h approved."
    body = response.content.decode()
    assert done.replace("<", "&lt;").replace(">", "&gt;") in body
    reference = old_row.render({"ext": ext, "form": DecisionForm(prefix=f"extension-{ext.pk}"), "error": "", "done": done},
                               request=response.wsgi_request)
    assert _plain(body) == _plain(reference)
