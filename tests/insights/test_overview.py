"""The metrics overviews at a glance, on the demo (``manage.py seed_demo``, no cluster): a percentile headline says
which percentile, "Pending now" says 0 when nothing waits (its chart still has the history), and the page's metrics
share their reads (labels, scope, rollup plans), so the query count stays small (tests/bench/overview_bench.py times
it)."""

from __future__ import annotations

import io
import re
from collections import Counter

import pytest
from django.contrib.auth import get_user_model
from django.core.management import call_command
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext

pytestmark = [pytest.mark.django_db, pytest.mark.timeout(240)]


@pytest.fixture
def demo(settings, tmp_path) -> None:
    settings.KUBECONFIG = str(tmp_path / "no-sandbox.kubeconfig")
    call_command("seed_demo", stdout=io.StringIO())


def signed_in(username: str) -> Client:
    client = Client()
    client.force_login(get_user_model().objects.get(username=username))
    return client


def headline_of(page: str, key: str) -> str:
    card = page.split(f'id="metric-{key}"', 1)[1].split("</li>", 1)[0]
    return re.search(r'<p class="headline">(.*?)</p>', card, re.S)[1].strip()


def test_headlines_say_which_percentile_and_what_waits_now(demo) -> None:
    page = signed_in("ops").get("/ops/metrics/").content.decode()
    wait = headline_of(page, "queue-wait")
    assert wait.startswith("Approval → admission P95: ") and wait.endswith("minutes across 2 groups"), wait
    assert headline_of(page, "reclaim-latency").startswith("Waiting → lender admitted P95: ")
    pending = page.split('id="metric-pending-now"', 1)[1].split("</li>", 1)[0]
    assert 'data-chart="chart-pending-now"' in pending  # the chart has the sampled history...
    assert headline_of(page, "pending-now") == "0 requests"  # ...and nothing waits now: 0, not "not defined"
    assert headline_of(page, "spend").split()[0][0].isdigit()  # a single-figure metric keeps its plain headline


@pytest.mark.parametrize("rolled_up", [False, True], ids=["live", "rolled-up"])
def test_the_overviews_share_their_reads(demo, rolled_up) -> None:
    if rolled_up:  # as beat leaves it (its hourly refreshes run at start)
        from billing import rollup as cost_rollup
        from insights import rollups, sample_rollups

        rollups.rollups_refresh()
        sample_rollups.sample_rollups_refresh()
        cost_rollup.refresh()
    for username, path, most in (("ops", "/ops/metrics/", 80), ("alice", "/tenants/acme/metrics/", 56)):
        client = signed_in(username)
        assert client.get(path).status_code == 200
        with CaptureQueriesContext(connection) as queries:
            assert client.get(path).status_code == 200
        sql = [q["sql"] for q in queries.captured_queries]
        repeated = {s: n for s, n in Counter(sql).items() if n > 1 and not s.startswith(("BEGIN", "COMMIT", "SET"))}
        assert not repeated, (path, repeated)  # no read twice: labels, scope and rollup plans are shared
        assert len(sql) <= most, (path, len(sql))  # 122 and 92 before the metrics shared them (rolled up); the forecast, spill-over and measured metrics added 7 and 3
