"""The alerting rules shipped as a PrometheusRule (deploy/kubernetes/base/monitoring/alerts.yaml): the six alerts
the operations guide documents, each expression naming only series the portal serves on ``/metrics`` (scraped here
with data that makes every one of them appear) or that NVIDIA's DCGM exporter publishes (the sandbox's list). Where
``promtool`` is installed (``deploy/services.sh promtool``) it checks the rules' syntax too; the structural checks
run either way."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from datetime import timedelta
from decimal import Decimal
from pathlib import Path

import pytest
import yaml
from django.core.cache import cache
from django.utils import timezone

from billing.models import Budget
from quotas.models import Cluster
from sandbox.dcgm import METRIC_NAMES as DCGM_NAMES
from workloads.models import RequestState
from workloads.status import followed_key

from ..insights.test_prometheus import TOKEN, scrape
from ..workloads.factories import make_catalogue, make_request

ROOT = Path(__file__).resolve().parents[2]
S = RequestState
RULES = ROOT / "deploy" / "kubernetes" / "base" / "monitoring" / "alerts.yaml"
ALERTS = {"GPUPortalQueueWaitP95OverTarget", "GPUPortalMaterializationStuck", "GPUPortalFollowerLagging",
          "GPUXidError", "GPUPortalBudgetSpent", "GPUPortalClusterUnreachable"}
# What is not a series name in PromQL: keywords, and the words inside by (...) / on (...) label lists.
KEYWORDS = {"and", "or", "unless", "by", "without", "on", "ignoring", "group_left", "group_right", "bool", "offset",
            "inf", "nan"}
_STRINGS = re.compile(r'"(?:[^"\\]|\\.)*"')
_MATCHERS = re.compile(r"\{[^}]*\}")
_RANGES = re.compile(r"\[[^\]]*\]")
_LABEL_LISTS = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)")
_NUMBERS = re.compile(r"\b\d+(?:\.\d+)?(?:e[+-]?\d+)?(?:ms|[smhdwy])?\b")  # 0.95, 5m, 1e3
_WORD = re.compile(r"[A-Za-z_:][A-Za-z0-9_:]*")


def series_names(expr: str) -> set[str]:
    """The series an expression reads: identifiers that are not functions, keywords or label names."""
    text = _NUMBERS.sub(" ", _LABEL_LISTS.sub(" ", _RANGES.sub(" ", _MATCHERS.sub(" ", _STRINGS.sub(" ", expr)))))
    names = set()
    for match in _WORD.finditer(text):
        word = match.group(0)
        if word.lower() in KEYWORDS or text[match.end():].lstrip().startswith("("):
            continue
        names.add(word)
    return names


def rules() -> list[dict]:
    doc = yaml.safe_load(RULES.read_text())
    assert doc["apiVersion"] == "monitoring.coreos.com/v1" and doc["kind"] == "PrometheusRule"
    return [rule for group in doc["spec"]["groups"] for rule in group["rules"]]


def test_series_names_reads_what_an_expression_uses() -> None:
    expr = ('histogram_quantile(0.95, sum by (cluster, le) (rate(foo_bucket{a="b(c)"}[1h]))) > '
            'scalar(max(bar_target)) and on (cluster) baz offset 5m')
    assert series_names(expr) == {"foo_bucket", "bar_target", "baz"}


def test_the_six_alerts_are_there_and_each_is_documented() -> None:
    found = rules()
    assert {r["alert"] for r in found} == ALERTS
    guide = (ROOT / "docs" / "operations.md").read_text()
    for rule in found:
        assert rule["labels"]["severity"] in ("info", "warning", "critical"), rule["alert"]
        assert rule["annotations"]["summary"] and rule["annotations"]["description"], rule["alert"]
        assert "for" in rule, rule["alert"]
        assert f"`{rule['alert']}`" in guide, f"{rule['alert']} is not in docs/operations.md"


@pytest.mark.django_db
def test_every_expression_reads_series_the_portal_serves_or_dcgm_exports(cast, client, settings, tmp_path) -> None:
    settings.METRICS_TOKEN = TOKEN
    cat = make_catalogue(cast)
    now = timezone.now()
    # Data that makes every series appear: an admitted request (the wait histogram), one approved and not applied,
    # a budget, a cluster that has answered and whose follower has completed a cycle.
    make_request(cat, cast.vision, cast.carol, state=S.RUNNING, approved_at=now - timedelta(hours=1),
                 admitted_at=now - timedelta(minutes=50))
    make_request(cat, cast.vision, cast.carol, state=S.APPROVED, approved_at=now - timedelta(minutes=3))
    Budget.objects.create(tenant=cast.acme, amount=Decimal("10.00"))
    Cluster.objects.filter(pk=cat.cluster.pk).update(health="healthy", last_seen_at=now)
    cache.set(followed_key(cat.cluster.pk), now.timestamp(), None)
    text = scrape(client).content.decode()
    served = {line.split("{")[0].split(" ")[0] for line in text.splitlines() if line and not line.startswith("#")}
    for rule in rules():
        names = series_names(rule["expr"])
        assert names, rule["alert"]
        unknown = names - served - set(DCGM_NAMES)
        assert not unknown, f"{rule['alert']} reads {unknown}: neither on /metrics nor a DCGM exporter name"

    promtool = os.environ.get("PROMTOOL") or shutil.which("promtool")
    if promtool:  # the syntax too, where promtool is installed (deploy/services.sh promtool)
        spec = tmp_path / "rules.yaml"
        spec.write_text(yaml.safe_dump(yaml.safe_load(RULES.read_text())["spec"]))
        checked = subprocess.run([promtool, "check", "rules", str(spec)], check=False, capture_output=True, text=True,
                                 timeout=60)
        assert checked.returncode == 0, checked.stdout + checked.stderr
        assert f"{len(ALERTS)} rules found" in checked.stdout

