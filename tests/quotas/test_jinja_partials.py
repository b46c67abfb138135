"""The partials the capacity page's Jinja2 body and the Django pages share (the pagination, a chart, the "in use as
of" line, a cluster's health): one template each, Jinja2's (templates/jinja2/), which the Django includes write
through ``{% jinja %}`` (docs/performance.md). Byte for byte what the Django templates they replaced wrote (kept
here as the reference), for pagers on every kind of page, charts with markup in their titles, readings and none,
and every health. One difference is allowed, and only it: Jinja2 writes an apostrophe in text as ``&#39;`` where
Django writes ``&#x27;`` (the same character to a browser)."""

from __future__ import annotations

from datetime import UTC, datetime
from types import SimpleNamespace

import pytest
from django.template import Context, engines
from django.test import RequestFactory

from portal.ui import Pager

pytestmark = [pytest.mark.django_db]

OLD = {
    "includes/pagination.html": """{% with p=pager.page %}
  <nav class="pagination" aria-label="Pages">
    <span class="muted small">
      {% if p.paginator.count %}{{ p.start_index }}–{{ p.end_index }} of {% if pager.capped %}{{ pager.counted }}{% else %}{{ p.paginator.count }}{% endif %}{% else %}0 results{% endif %}
    </span>
    {% if p.paginator.num_pages > 1 %}
      <span class="pages">
        {% if pager.first_url %}<a href="{{ pager.first_url }}" aria-label="First page">« First</a>{% endif %}
        {% if pager.previous_url %}<a href="{{ pager.previous_url }}" rel="prev">‹ Previous</a>{% endif %}
        <span aria-current="page">Page {{ p.number }} of {% if pager.capped %}{{ pager.pages }}{% else %}{{ p.paginator.num_pages }}{% endif %}</span>
        {% if pager.next_url %}<a href="{{ pager.next_url }}" rel="next">Next ›</a>{% endif %}
        {% if pager.last_url %}<a href="{{ pager.last_url }}" aria-label="Last page">Last »</a>{% endif %}
      </span>
    {% endif %}
  </nav>
{% endwith %}
""",
    "quotas/_chart.html": """{# A bar chart. #}
<figure class="chart">
  <div class="chart-box"><canvas id="{{ chart_id }}-canvas" data-chart="{{ chart_id }}" role="img" aria-label="{{ chart.title }} (the numbers are in the table below)"></canvas></div>
  <figcaption class="muted small">{{ chart.title }}.</figcaption>
</figure>
{{ chart|json_script:chart_id }}
""",
    "quotas/_as_of.html": """{% load page_kit %}{% load quota_tags %}{# rows #}{% with as_of=rows|usage_as_of %}
<p class="as-of muted small">{% if as_of %}In use as of <time datetime="{{ as_of|date:'c' }}">{{ as_of|stamp }} UTC</time>, when the portal last read the cluster's queues.{% else %}In use: not read from the cluster yet (the figures show 0 until the first reading).{% endif %}</p>
{% endwith %}
""",
    "quotas/_cluster_health.html": """{# One cluster's health. #}
<span class="cluster-health" data-health="{{ c.health }}">
  {% if c.health == "unhealthy" %}<span class="badge badge-error">Unhealthy</span> <span class="error">{{ c.last_error }}</span>
  {% elif c.health == "healthy" %}<span class="badge badge-active">Healthy</span>
  {% else %}<span class="badge">Unknown</span> <span class="muted small">not contacted yet</span>{% endif %}
  {% if c.last_seen_at %}<span class="muted small">· last answered {{ c.last_seen_at|date:"Y-m-d H:i:s" }} UTC</span>{% endif %}
</span>
""",
}


def _both(name: str, request, **values) -> tuple[str, str]:
    django = engines["django"]
    old = django.from_string(OLD[name]).template.render(Context(values))
    new = django.get_template(name).render(values, request)
    return old, new.replace("&#39;", "&#x27;")


def _pagers(rf) -> list[Pager]:
    pagers = []
    for n, page in ((0, 1), (3, 1), (30, 1), (30, 2), (80, 2), (80, 4), (80, 99)):
        request = rf.get("/", {"page": page, "state": "a&b"})
        pagers.append(Pager(request, list(range(n)), per_page=25))
    bounded = rf.get("/", {"p": 1})
    pager = Pager(bounded, list(range(40)), per_page=25, param="p")
    pager.page.paginator.bound, pager.page.paginator.capped = 30, True  # "30+" as a capped count shows it
    pagers.append(pager)
    return pagers


def test_pagination_is_what_the_django_include_wrote() -> None:
    rf = RequestFactory()
    for pager in _pagers(rf):
        old, new = _both("includes/pagination.html", pager.request, pager=pager)
        assert new == old, pager.page
        assert "<nav" in new


def test_chart_as_of_and_health_are_what_the_django_includes_wrote() -> None:
    request = RequestFactory().get("/")
    chart = {"title": "Quota <of> 'acme' & co", "labels": ["a</script>"], "datasets": []}
    old, new = _both("quotas/_chart.html", request, chart=chart, chart_id="flavor-chart")
    assert new == old and "\\u003C/script\\u003E" in new
    read = datetime(2026, 12, 1, 9, 30, tzinfo=UTC)
    for rows in ([], [{"usage_read_at": None}], [{"usage_read_at": read}], [{"flavor__cluster__reconciled_at": read}]):
        old, new = _both("quotas/_as_of.html", request, rows=rows)
        assert new == old, rows
    for health, error, seen in (("unhealthy", "<refused> & gone", read), ("healthy", "", read), ("unknown", "", None)):
        c = SimpleNamespace(health=health, last_error=error, last_seen_at=seen)
        old, new = _both("quotas/_cluster_health.html", request, c=c)
        assert new == old, health
