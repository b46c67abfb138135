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
    return subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=clean | {"DJANGO_SETTINGS_MODULE": "portal.settings"}, capture_output=True, text=True, timeout=60)


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
