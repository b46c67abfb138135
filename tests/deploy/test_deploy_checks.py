"""`manage.py check --deploy` with the production settings refuses mail that is printed instead of delivered."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.deploy.test_image import ENTRYPOINT, production_env


def check_deploy(env: dict) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(ENTRYPOINT), "manage", "check", "--deploy", "--fail-level", "WARNING"],
                          env=env, capture_output=True, text=True, timeout=120, check=False)


@pytest.mark.django_db(transaction=True)
def test_production_without_an_smtp_host_fails_the_deploy_check(tmp_path):
    env = production_env(tmp_path)
    env.pop("EMAIL_HOST")
    env.pop("EMAIL_BACKEND", None)
    out = check_deploy(env)
    assert out.returncode != 0, out.stdout + out.stderr
    assert "tenants.E001" in out.stderr + out.stdout and "EMAIL_HOST" in out.stderr + out.stdout


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("backend", ["django.core.mail.backends.locmem.EmailBackend",
                                     "django.core.mail.backends.filebased.EmailBackend"])
def test_production_with_an_undelivering_backend_fails_too(tmp_path, backend):
    out = check_deploy(production_env(tmp_path, EMAIL_BACKEND=backend, EMAIL_FILE_PATH=str(tmp_path)))
    assert out.returncode != 0 and "tenants.E001" in out.stderr + out.stdout, out.stdout + out.stderr


@pytest.mark.django_db(transaction=True)
def test_production_with_an_smtp_host_passes_and_development_is_not_asked(tmp_path):
    out = check_deploy(production_env(tmp_path))  # EMAIL_HOST set: the SMTP backend
    assert out.returncode == 0 and "no issues" in out.stdout, out.stdout + out.stderr
    dev = production_env(tmp_path, PORTAL_ENV="development")
    dev.pop("EMAIL_HOST")
    out = check_deploy(dev)
    assert "tenants.E001" not in out.stdout + out.stderr, out.stdout + out.stderr
