"""Production settings refuse unsafe configuration; development needs no server."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def load_settings(**env: str) -> subprocess.CompletedProcess:
    clean = {k: v for k, v in os.environ.items() if k not in {"DATABASE_URL", "REDIS_URL", "CELERY_BROKER_URL", "DEBUG", "SECRET_KEY", "PORTAL_ENV"}}
    clean.update(env)
    code = "import django; django.setup(); from django.conf import settings; print(settings.DATABASES['default']['ENGINE'], settings.CELERY_BROKER_URL, settings.DEBUG)"
    return subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=clean | {"DJANGO_SETTINGS_MODULE": "portal.settings"}, capture_output=True, text=True, timeout=60, check=False)


def test_production_refuses_debug() -> None:
    result = load_settings(PORTAL_ENV="production", DEBUG="1", SECRET_KEY="x" * 50)
    assert result.returncode != 0 and "DEBUG" in result.stderr


def test_production_refuses_default_secret() -> None:
    result = load_settings(PORTAL_ENV="production", DEBUG="0")
    assert result.returncode != 0 and "SECRET_KEY" in result.stderr


def test_production_starts_with_safe_settings() -> None:
    result = load_settings(PORTAL_ENV="production", DEBUG="0", SECRET_KEY="k" * 50)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split()[-1] == "False"


def test_development_defaults_need_no_server(tmp_path) -> None:
    result = load_settings(PORTAL_VAR_DIR=str(tmp_path))
    assert result.returncode == 0, result.stderr
    engine, broker, debug = result.stdout.split()
    # The embedded broker: an SQLite file under the runtime folder (one per parallel test process).
    assert engine.endswith("sqlite3") and broker.startswith(f"portal+sqlite:///{tmp_path}/celery-broker") and debug == "True"


def test_environment_selects_postgres_and_redis(tmp_path) -> None:
    result = load_settings(PORTAL_VAR_DIR=str(tmp_path), DATABASE_URL="postgres://u@db:5432/p", REDIS_URL="redis://cache:6379/0")
    assert result.returncode == 0, result.stderr
    engine, broker, _ = result.stdout.split()
    assert engine.endswith("postgresql") and broker == "redis://cache:6379/0"


def test_each_test_run_names_its_own_databases_and_keys(tmp_path) -> None:
    """Two `make test` runs on one machine never share test databases or Redis keys (they used to collide
    on fixed names such as test_portal_gw0)."""
    code = ("import django; django.setup(); from django.conf import settings; "
            "print(settings.DATABASES['default']['TEST']['NAME'], settings.CELERY_BROKER_TRANSPORT_OPTIONS['global_keyprefix'])")
    seen = []
    for run_id in ("run1", "run2"):
        env = {k: v for k, v in os.environ.items() if k not in {"DATABASE_URL", "REDIS_URL", "CELERY_BROKER_URL"}}
        env |= {"DJANGO_SETTINGS_MODULE": "portal.settings", "PORTAL_VAR_DIR": str(tmp_path), "PORTAL_TEST_RUN_ID": run_id,
                "PYTEST_XDIST_WORKER": "gw0", "DATABASE_URL": "postgres://u@db:5432/portal",
                "REDIS_URL": "redis://cache:6379/15"}
        result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60, check=False)
        assert result.returncode == 0, result.stderr
        seen.append(result.stdout.split())
    assert seen == [["test_portal_run1", "test-run1-gw0:"], ["test_portal_run2", "test-run2-gw0:"]]


def test_make_test_gives_each_run_its_own_id_and_runtime_folder() -> None:
    """deploy/run_tests.py (`make test`) picks a fresh id per run, says which, and removes the run's folder."""
    ids = set()
    for _ in range(2):
        env = {k: v for k, v in os.environ.items() if k not in {"PORTAL_TEST_RUN_ID", "PORTAL_VAR_DIR", "PYTEST_XDIST_WORKER"}}
        env["PYTEST_WORKERS"] = "0"
        result = subprocess.run([sys.executable, "deploy/run_tests.py", "--co", "-q", "tests/test_settings.py::test_production_refuses_debug"],
                                cwd=ROOT, env=env, capture_output=True, text=True, timeout=120, check=False)
        assert result.returncode == 0, result.stdout + result.stderr
        run_id = result.stdout.splitlines()[0].rsplit("run ", 1)[1]
        assert not (ROOT / "var" / "test" / run_id).exists()
        ids.add(run_id)
    assert len(ids) == 2


def test_invitation_days_must_be_sensible(tmp_path) -> None:
    for bad in ("0", "91", "seven", "-1"):
        result = load_settings(PORTAL_VAR_DIR=str(tmp_path), PORTAL_INVITATION_DAYS=bad)
        assert result.returncode != 0 and "PORTAL_INVITATION_DAYS" in result.stderr, bad
    assert load_settings(PORTAL_VAR_DIR=str(tmp_path), PORTAL_INVITATION_DAYS="14").returncode == 0


def test_the_prometheus_cluster_label_must_be_a_label_name(tmp_path) -> None:
    """docs/measured-use.md, "One Prometheus over several clusters": the label is spliced into PromQL's ``by (...)``."""
    for bad in ("cluster name", "1cluster", "cluster)", "a-b"):
        result = load_settings(PORTAL_VAR_DIR=str(tmp_path), PROMETHEUS_CLUSTER_LABEL=bad)
        assert result.returncode != 0 and "PROMETHEUS_CLUSTER_LABEL must be a Prometheus label name" in result.stderr, bad
    for good in ("cluster", "k8s_cluster", ""):
        assert load_settings(PORTAL_VAR_DIR=str(tmp_path), PROMETHEUS_CLUSTER_LABEL=good).returncode == 0, good
