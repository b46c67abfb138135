"""The per-period report: every metric's table for a period, as a printable page and as CSV (one section per
metric), for ops (every tenant) and a tenant admin (their tenant); who may download it; bad periods."""

from __future__ import annotations

import csv
import io

import pytest

from insights.registry import METRICS, Metric, Result, Row, register

from .surfaces import KEY
from . import surfaces

pytestmark = [pytest.mark.django_db]
demo_metric = surfaces.demo_metric  # the fixture


def sections(text: str) -> dict[str, list[list[str]]]:
    """The CSV's sections by metric key: the rows from its ``metric`` line to the empty line after it."""
    found: dict[str, list[list[str]]] = {}
    current: list[list[str]] | None = None
    for row in csv.reader(io.StringIO(text)):
        if row[:1] == ["metric"]:
            current = found.setdefault(row[1], [])
        elif not row:
            current = None
        elif current is not None:
            current.append(row)
    return found


def test_ops_report_csv_has_a_section_per_metric(as_user, demo_metric) -> None:
    response = as_user("ops").get("/ops/metrics/report/", {"start": "2026-01-01", "end": "2026-01-31", "format": "csv"})
    assert response.status_code == 200 and response["Content-Type"].startswith("text/csv")
    assert 'filename="metrics-20260101-20260131.csv"' in response["Content-Disposition"]  # the last day included, as asked
    text = response.content.decode()
    assert text.splitlines()[0] == "report,metrics,2026-01-01T00:00:00+00:00,2026-02-01T00:00:00+00:00"
    found = sections(text)
    assert set(found) == set(METRICS)
    assert found[KEY] == [
        ["title", demo_metric.title], ["definition", demo_metric.definition], ["group_by", "tenant"],
        ["tenant", "Projects (count)", "Share"], ["acme", "2", "0.500"], ["globex", "1", "1"],
    ]


def test_tenant_report_csv_is_the_tenants_slice(as_user, demo_metric) -> None:
    response = as_user("alice").get("/tenants/acme/metrics/report/", {"preset": "7", "format": "csv"})
    assert response.status_code == 200 and 'filename="metrics-acme-' in response["Content-Disposition"]
    assert sections(response.content.decode())[KEY][3:] == [["project", "Projects (count)", "Share"],
                                                             ["acme-nlp", "1", "1"], ["acme-vision", "1", "1"]]
    assert "globex" not in response.content.decode()


def test_the_printable_page_has_every_metric_and_a_csv_link(as_user, demo_metric) -> None:
    response = as_user("ops").get("/ops/metrics/report/", {"start": "2026-01-01", "end": "2026-01-31"})
    assert response.status_code == 200
    text = response.content.decode()
    assert f'id="report-{KEY}"' in text and '<th scope="row">globex</th>' in text
    assert "format=csv" in text and "2026-01-01 to 2026-01-31 (UTC)" in text
    assert "css/insights.css" in text  # its print rules hide the navigation and filters


@pytest.mark.parametrize(("who", "path", "status"), [
    ("erin", "/tenants/acme/metrics/report/", 404),
    ("carol", "/tenants/acme/metrics/report/", 403),
    ("alice", "/ops/metrics/report/", 404),
    ("alice", "/tenants/globex/metrics/report/", 404),
])
def test_who_may_not_download(as_user, demo_metric, who, path, status) -> None:
    assert as_user(who).get(path, {"format": "csv"}).status_code == status


def test_a_bad_period_is_a_form_error_not_a_file(as_user, demo_metric) -> None:
    response = as_user("ops").get("/ops/metrics/report/", {"start": "2026-03-01", "end": "2026-01-01", "format": "csv"})
    assert response.status_code == 400 and response["Content-Type"].startswith("text/html")
    assert "The end must be on or after the first day." in response.content.decode()


def test_labels_that_look_like_formulas_stay_text(as_user, cast) -> None:
    register(Metric(key="test-formula", family="cost", title="Formula", definition="A label like a formula.",
                    compute=lambda q: Result(rows=[Row(group="=HYPERLINK(1)", group_id=None, values={"v": 1})])))
    try:
        text = as_user("ops").get("/ops/metrics/report/", {"format": "csv"}).content.decode()
    finally:
        METRICS.pop("test-formula", None)
    assert sections(text)["test-formula"][-1] == ["'=HYPERLINK(1)", "1"]
