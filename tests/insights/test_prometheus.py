"""``/metrics``: the text format with the portal's metric names, the database's numbers read at scrape time, the
bearer token, and counters that add up across processes in the client's multiprocess mode."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from datetime import timedelta
from pathlib import Path

import pytest
from django.utils import timezone
from prometheus_client.parser import text_string_to_metric_families

from portal import prometheus
from workloads.models import RequestState

from ..workloads.factories import make_catalogue, make_request

pytestmark = pytest.mark.django_db
S = RequestState
ROOT = Path(__file__).resolve().parents[2]
TOKEN = "scrape-me-please"


def samples(text: str) -> dict[tuple[str, tuple], float]:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def scrape(client, token: str | None = TOKEN, **extra) -> object:
    headers = {"HTTP_AUTHORIZATION": f"Bearer {token}"} if token else {}
    return client.get("/metrics", **headers, **extra)


def test_scrape_answers_the_text_format_with_the_database_numbers(cast, client, settings) -> None:
    settings.METRICS_TOKEN = TOKEN
    cat = make_catalogue(cast)
    now = timezone.now()
    make_request(cat, cast.vision, cast.carol, state=S.QUEUED, approved_at=now - timedelta(minutes=40), queued_at=now)
    make_request(cat, cast.vision, cast.carol, state=S.APPROVED, approved_at=now - timedelta(minutes=5))
    make_request(cat, cast.vision, cast.carol, state=S.PENDING_APPROVAL)
    # Admitted after 5 minutes and after 3 hours; a seeded one (demo history) is left out.
    make_request(cat, cast.vision, cast.carol, state=S.RUNNING, approved_at=now - timedelta(hours=4),
                 admitted_at=now - timedelta(hours=4) + timedelta(minutes=5))
    make_request(cat, cast.llm, cast.frank, state=S.SUCCEEDED, approved_at=now - timedelta(hours=6),
                 admitted_at=now - timedelta(hours=3))
    make_request(cat, cast.llm, cast.frank, state=S.SUCCEEDED, approved_at=now - timedelta(hours=6),
                 admitted_at=now - timedelta(hours=5), seeded=True)

    answer = scrape(client)
    assert answer.status_code == 200
    assert answer["Content-Type"].startswith("text/plain; version=")
    text = answer.content.decode()
    for name in ("gpuportal_queue_wait_seconds", "gpuportal_requests_pending", "gpuportal_quota_nominal",
                 "gpuportal_quota_used", "gpuportal_materialize_errors_total", "gpuportal_celery_task_seconds",
                 "gpuportal_http_requests_total", "gpuportal_cluster_healthy"):
        assert name in text, name
    got = samples(text)
    h100 = (("cluster", "lab"), ("flavor", "h100"))
    assert got[("gpuportal_requests_pending", h100)] == 2
    assert 40 * 60 - 5 <= got[("gpuportal_requests_pending_oldest_seconds", h100)] <= 40 * 60 + 60
    assert got[("gpuportal_requests_awaiting_approval", h100)] == 1
    assert got[("gpuportal_requests_running", h100)] == 1
    assert got[("gpuportal_queue_wait_seconds_count", h100)] == 2
    assert got[("gpuportal_queue_wait_seconds_sum", h100)] == pytest.approx(5 * 60 + 3 * 3600, abs=1)
    bucket = lambda le: got[("gpuportal_queue_wait_seconds_bucket", (*h100, ("le", le)))]
    assert (bucket("120.0"), bucket("300.0"), bucket("7200.0"), bucket("21600.0"), bucket("+Inf")) == (0, 1, 1, 2, 2)
    vision_h100 = (("cluster", "lab"), ("flavor", "h100"), ("project", "acme-vision"), ("resource", "nvidia.com/gpu"),
                   ("tenant", "acme"))
    assert got[("gpuportal_quota_nominal", vision_h100)] == 8
    assert got[("gpuportal_quota_borrowing_limit", vision_h100)] == 2
    tenant_h100 = (("cluster", "lab"), ("flavor", "h100"), ("project", ""), ("resource", "nvidia.com/gpu"),
                   ("tenant", "acme"))
    assert got[("gpuportal_quota_nominal", tenant_h100)] == 12


def test_a_requeued_request_counts_once_with_its_first_wait(cast, client, settings) -> None:
    """A preempted request keeps ``first_admitted_at``: while it waits again it stays counted, and its next admission
    (hours later) neither counts it a second time nor moves it to a slower bucket: the histogram only grows."""
    settings.METRICS_TOKEN = TOKEN
    cat = make_catalogue(cast)
    now = timezone.now()
    approved = now - timedelta(hours=4)
    first = approved + timedelta(minutes=4)
    req = make_request(cat, cast.vision, cast.carol, state=S.PREEMPTED, approved_at=approved, admitted_at=None,
                       first_admitted_at=first)
    h100 = (("cluster", "lab"), ("flavor", "h100"))

    def histogram() -> tuple[float, ...]:
        got = samples(scrape(client).content.decode())
        return (got[("gpuportal_queue_wait_seconds_count", h100)], got[("gpuportal_queue_wait_seconds_sum", h100)],
                *(got[("gpuportal_queue_wait_seconds_bucket", (*h100, ("le", le)))] for le in ("120.0", "300.0", "+Inf")))

    while_waiting = histogram()
    assert while_waiting == (1, pytest.approx(240, abs=1), 0, 1, 1)
    # Admitted again three hours later (the follower stamps the new run's admission; the first one stays).
    type(req).objects.filter(pk=req.pk).update(state=S.RUNNING, admitted_at=approved + timedelta(hours=3))
    assert histogram() == while_waiting


def test_metrics_need_the_token(cast, client, settings) -> None:
    settings.METRICS_TOKEN = TOKEN
    assert scrape(client, token=None).status_code == 401
    assert scrape(client, token="wrong").status_code == 401
    assert client.get("/metrics", HTTP_AUTHORIZATION=f"Basic {TOKEN}").status_code == 401
    # Prometheus scrapes the pod's address over plain HTTP: answered before the host check and the HTTPS redirect.
    settings.SECURE_SSL_REDIRECT = True
    assert scrape(client, HTTP_HOST="10.1.2.3:8000").status_code == 200
    # No token set: loopback only, and only with DEBUG on.
    settings.METRICS_TOKEN = ""
    settings.DEBUG = False
    assert scrape(client, token=None).status_code == 401
    settings.DEBUG = True
    assert scrape(client, token=None).status_code == 200
    assert scrape(client, token=None, REMOTE_ADDR="10.0.0.7").status_code == 401
    # Signed-in users get nothing more: the token is the only key.
    client.force_login(cast.ops)
    settings.DEBUG = False
    assert scrape(client, token=None).status_code == 401


# Each process runs Celery tasks (as a worker's child would: task_prerun / task_postrun time them) and counts a
# materialization error, writing to the shared folder.
CHILD = textwrap.dedent("""
    import django
    django.setup()
    from portal import prometheus
    from portal.celery import app
    for _ in range(3):
        app.tasks["portal.ping"].apply().get()
    prometheus.materialize_error(cluster="lab", reason="rejected")
""")


def test_counters_add_up_across_processes_in_multiprocess_mode(cast, client, settings, tmp_path, monkeypatch) -> None:
    folder = tmp_path / "prom"
    prometheus.multiprocess_reset(folder)
    env = {**os.environ, prometheus.ENV_DIR: str(folder), "DJANGO_SETTINGS_MODULE": "portal.settings",
           "CELERY_TASK_ALWAYS_EAGER": "1"}
    children = [subprocess.Popen([sys.executable, "-c", CHILD], cwd=ROOT, env=env) for _ in range(2)]
    assert [child.wait(timeout=120) for child in children] == [0, 0]
    assert len(list(folder.glob("*.db"))) >= 2  # one file per process and kind

    settings.METRICS_TOKEN = TOKEN
    monkeypatch.setenv(prometheus.ENV_DIR, str(folder))
    text = scrape(client).content.decode()
    got = samples(text)
    assert got[("gpuportal_materialize_errors_total", (("cluster", "lab"), ("reason", "rejected")))] == 2
    assert got[("gpuportal_celery_task_seconds_count", (("state", "SUCCESS"), ("task", "portal.ping")))] == 6
    # The database's gauges are in the same answer, read once whatever the processes.
    assert "# TYPE gpuportal_queue_wait_seconds histogram" in text

    # A restart empties the folder: the counts start again from zero.
    prometheus.multiprocess_reset(folder)
    got = samples(scrape(client).content.decode())
    assert ("gpuportal_materialize_errors_total", (("cluster", "lab"), ("reason", "rejected"))) not in got


KUBECONFIG_NOWHERE = """
apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "https://127.0.0.1:9", insecure-skip-tls-verify: true}}]
users: [{name: u, user: {token: t}}]
contexts: [{name: x, context: {cluster: c, user: u}}]
current-context: x
"""


def test_a_cluster_that_does_not_answer_counts_a_materialization_error(cast, client, settings, tmp_path) -> None:
    from portal.kube import ClusterUnavailable, kube_cache_clear
    from quotas.models import Cluster
    from workloads.materialize import request_materialize

    settings.METRICS_TOKEN = TOKEN
    cat = make_catalogue(cast)
    config = tmp_path / "nowhere.kubeconfig"
    config.write_text(KUBECONFIG_NOWHERE)
    Cluster.objects.filter(pk=cat.cluster.pk).update(kubeconfig_path=str(config))
    kube_cache_clear()
    req = make_request(cat, cast.vision, cast.carol, state=S.APPROVED, approved_at=timezone.now())
    key = ("gpuportal_materialize_errors_total", (("cluster", "lab"), ("reason", "unavailable")))
    before = samples(scrape(client).content.decode()).get(key, 0)
    with pytest.raises(ClusterUnavailable):
        request_materialize(request_id=req.pk)
    assert samples(scrape(client).content.decode())[key] == before + 1
