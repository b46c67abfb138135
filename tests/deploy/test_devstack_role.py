"""`make run` on PostgreSQL (deploy/devstack.py): migrations run as the owner, everything else as a runtime role that
owns no table, so the running portal cannot TRUNCATE or ALTER the audit log (docs/security.md).

The devstack's own preparation runs against the test database (its ``manage.py`` steps as subprocesses, as `make
run` runs them); the URL it leaves for the demo data and the children is then used through psycopg directly.
"""

from __future__ import annotations

import importlib.util
import os
import uuid
from pathlib import Path

import psycopg
import pytest
from django.db import connection
from psycopg import errors

pytestmark = [pytest.mark.postgresql, pytest.mark.django_db(transaction=True)]
ROOT = Path(__file__).resolve().parents[2]


def load_devstack():
    spec = importlib.util.spec_from_file_location("devstack_under_test", ROOT / "deploy" / "devstack.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def role():
    name = f"portal_rt_{uuid.uuid4().hex[:10]}"
    yield name
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", [name])
        if cursor.fetchone():
            cursor.execute(f'DROP OWNED BY "{name}"')
            cursor.execute(f'DROP ROLE "{name}"')


def test_make_run_on_postgresql_runs_the_portal_as_a_role_that_owns_nothing(role, tmp_path, monkeypatch) -> None:
    devstack = load_devstack()
    db = connection.settings_dict
    owner_url = f"postgres://{db['USER']}@{db['HOST'] or '127.0.0.1'}:{db['PORT'] or 5432}/{db['NAME']}"
    monkeypatch.setattr(devstack, "VAR", tmp_path)
    monkeypatch.setenv("DATABASE_URL", owner_url)
    monkeypatch.setenv("PORTAL_RUNTIME_DB_ROLE", role)
    monkeypatch.delenv("PORTAL_RUNTIME_DB_PASSWORD", raising=False)
    monkeypatch.delenv("DATABASE_MIGRATE_URL", raising=False)

    devstack.database_prepare()

    runtime_url = os.environ["DATABASE_URL"]
    assert runtime_url != owner_url and "DATABASE_MIGRATE_URL" not in os.environ
    assert (tmp_path / "runtime-db-password").stat().st_mode & 0o077 == 0
    with psycopg.connect(runtime_url, autocommit=True) as conn:
        assert conn.execute("SELECT current_user").fetchone()[0] == role
        owned = conn.execute("SELECT count(*) FROM pg_tables WHERE tableowner = current_user").fetchone()[0]
        assert owned == 0
        # What the portal does: read and append.
        assert conn.execute("SELECT count(*) FROM tenants_auditentry").fetchone()[0] >= 0
        for statement in ["TRUNCATE tenants_auditentry", "TRUNCATE tenants_auditchainhead",
                          "TRUNCATE tenants_auditentry, tenants_auditchainhead",
                          "DELETE FROM tenants_auditentry", "ALTER TABLE tenants_auditentry DISABLE TRIGGER ALL"]:
            with pytest.raises(errors.InsufficientPrivilege):
                conn.execute(statement)

    # A second `make run` keeps the role and its password (kept in the runtime folder).
    monkeypatch.setenv("DATABASE_URL", owner_url)
    devstack.database_prepare()
    assert os.environ["DATABASE_URL"] == runtime_url
