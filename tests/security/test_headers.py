"""Security headers and the production checklist: CSP everywhere, nonces that match, HSTS for a year
with an HTTPS redirect in production, and ``manage.py check --deploy`` clean in production mode."""

from __future__ import annotations

import os
import re
import secrets
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent.parent


def production_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in {"DATABASE_URL", "REDIS_URL", "CELERY_BROKER_URL", "DEBUG", "SECRET_KEY",
                                                     "DJANGO_ALLOW_ASYNC_UNSAFE"}}  # set by the browser tests in this process
    return env | {"PORTAL_ENV": "production", "DEBUG": "0", "SECRET_KEY": secrets.token_urlsafe(50),
                  "PORTAL_VAR_DIR": str(tmp_path), "DJANGO_SETTINGS_MODULE": "portal.settings",
                  "EMAIL_HOST": "smtp.example.org"} | extra  # production mail must be sent (tenants.E001)


def test_check_deploy_finds_no_issues_in_production(tmp_path) -> None:
    result = subprocess.run([sys.executable, "manage.py", "check", "--deploy"], cwd=ROOT, env=production_env(tmp_path),
                            capture_output=True, text=True, timeout=240, check=False)
    assert result.returncode == 0, result.stderr
    assert "System check identified no issues (0 silenced)." in result.stdout, result.stdout + result.stderr


PROBE = """
import django; django.setup()
from django.test import Client
client = Client()
plain = client.get("/accounts/login/")
print("redirect", plain.status_code, plain.get("Location"))
secure = client.get("/accounts/login/", headers={"X-Forwarded-Proto": "https"})
print("hsts", secure.get("Strict-Transport-Security"))
print("csp", secure.get("Content-Security-Policy"))
"""


def test_production_redirects_to_https_and_sends_hsts_for_a_year(tmp_path) -> None:
    result = subprocess.run([sys.executable, "-c", PROBE], cwd=ROOT, env=production_env(tmp_path), capture_output=True, text=True, timeout=120, check=False)
    assert result.returncode == 0, result.stderr
    lines = dict(line.split(" ", 1) for line in result.stdout.splitlines())
    assert lines["redirect"] == "301 https://testserver/accounts/login/"
    assert lines["hsts"] == "max-age=31536000; includeSubDomains; preload"
    assert "default-src 'self'" in lines["csp"]


def test_production_tls_settings_follow_the_environment(tmp_path) -> None:
    env = production_env(tmp_path, SECURE_SSL_REDIRECT="0", SECURE_HSTS_INCLUDE_SUBDOMAINS="0", SECURE_HSTS_PRELOAD="0")
    result = subprocess.run([sys.executable, "-c", PROBE], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120, check=False)
    lines = dict(line.split(" ", 1) for line in result.stdout.splitlines())
    assert lines["redirect"].startswith("200"), result.stderr
    assert lines["hsts"] == "max-age=31536000"


@pytest.mark.django_db
def test_pages_carry_the_policy_and_inline_code_its_nonce(client, as_user) -> None:
    response = client.get("/accounts/login/")
    policy = response["Content-Security-Policy"]
    assert "script-src 'self'" in policy and "style-src 'self'" in policy and "unsafe-inline" not in policy
    assert "object-src 'none'" in policy and "frame-ancestors 'none'" in policy
    body = response.content.decode()
    assert "<script>" not in body and "<style>" not in body and " style=" not in body

    docs = as_user("carol").get("/api/docs/")
    nonces = set(re.findall(r'nonce="([^"]+)"', docs.content.decode()))
    assert len(nonces) == 1  # the inline style and script share the request's nonce
    assert f"'nonce-{nonces.pop()}'" in docs["Content-Security-Policy"]
