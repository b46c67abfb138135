"""The image's ``migrate`` role on an empty PostgreSQL database, as the owner beside a runtime role that owns nothing.

``entrypoint.py migrate`` with ``DATABASE_MIGRATE_URL`` runs ``manage.py migrate --database migrate`` while
``DATABASE_URL`` (the default connection) is the runtime role. A data migration that queried through the default
connection would wait for ever on the locks of the migration's own transaction (docs/security.md), so every
``RunPython`` uses ``schema_editor.connection.alias``. Here a fresh database, its owner and a runtime role are
made, the role runs in a subprocess as the image runs it (then ``db_runtime_role --apply``), and every migration
this code knows must be recorded as applied.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import uuid
from pathlib import Path

import psycopg
import pytest
from django.db import connection
from django.db.migrations.loader import MigrationLoader
from psycopg import sql

pytestmark = [pytest.mark.postgresql]
ROOT = Path(__file__).resolve().parents[2]
TIMEOUT_S = 240


def _admin() -> psycopg.Connection:
    db = connection.settings_dict
    return psycopg.connect(host=db["HOST"] or "127.0.0.1", port=db["PORT"] or 5432, user=db["USER"],
                           password=db["PASSWORD"] or None, dbname="postgres", autocommit=True)


@pytest.fixture
def empty_database():
    """A new empty database owned by a new owner role, and a runtime role with no privileges on it yet."""
    tag = uuid.uuid4().hex[:10]
    database, owner, runtime = f"portal_migrate_{tag}", f"portal_own_{tag}", f"portal_rt_{tag}"
    owner_password, runtime_password = "own-" + uuid.uuid4().hex, "rt-" + uuid.uuid4().hex
    db = connection.settings_dict
    host, port = db["HOST"] or "127.0.0.1", db["PORT"] or 5432
    with _admin() as admin:
        # The owner is no superuser; it may manage roles, as `db_runtime_role --apply` needs (docs/security.md).
        admin.execute(sql.SQL("CREATE ROLE {} LOGIN CREATEROLE PASSWORD {}").format(sql.Identifier(owner),
                                                                                 sql.Literal(owner_password)))
        admin.execute(sql.SQL("CREATE ROLE {} LOGIN PASSWORD {}").format(sql.Identifier(runtime), sql.Literal(runtime_password)))
        if admin.info.server_version >= 160000:  # since 16 CREATEROLE alone does not cover roles others created
            admin.execute(sql.SQL("GRANT {} TO {} WITH ADMIN OPTION").format(sql.Identifier(runtime), sql.Identifier(owner)))
        admin.execute(sql.SQL("CREATE DATABASE {} OWNER {}").format(sql.Identifier(database), sql.Identifier(owner)))
    try:
        yield {
            "database": database, "runtime": runtime, "runtime_password": runtime_password,
            "owner_url": f"postgres://{owner}:{owner_password}@{host}:{port}/{database}",
            "runtime_url": f"postgres://{runtime}:{runtime_password}@{host}:{port}/{database}",
        }
    finally:
        with _admin() as admin:
            admin.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(database)))
            admin.execute(sql.SQL("DROP ROLE IF EXISTS {}").format(sql.Identifier(runtime)))
            admin.execute(sql.SQL("DROP ROLE IF EXISTS {}").format(sql.Identifier(owner)))


def _run(cmd: list[str], env: dict[str, str]) -> subprocess.CompletedProcess:
    """Run ``cmd`` in its own process group; past the timeout the whole group goes (the entrypoint's children too)."""
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        pytest.fail(f"`{' '.join(cmd[1:])}` still running after {TIMEOUT_S}s (a data migration waiting on the "
                    f"default connection?); its output:\n{out[-4000:]}")
    return subprocess.CompletedProcess(cmd, proc.returncode, out)


def test_migrate_role_on_an_empty_database_applies_every_migration_as_the_owner(empty_database) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "DATABASE_"))}
    env.update({
        "DJANGO_SETTINGS_MODULE": "portal.settings", "LOG_FORMAT": "plain",
        "DATABASE_URL": empty_database["runtime_url"], "DATABASE_MIGRATE_URL": empty_database["owner_url"],
        "PORTAL_RUNTIME_DB_ROLE": empty_database["runtime"],
        "PORTAL_RUNTIME_DB_PASSWORD": empty_database["runtime_password"],
    })

    done = _run([sys.executable, str(ROOT / "deploy" / "entrypoint.py"), "migrate"], env)

    assert done.returncode == 0, done.stdout[-4000:]
    known = set(MigrationLoader(None, ignore_no_migrations=True).disk_migrations)
    with psycopg.connect(empty_database["runtime_url"], autocommit=True) as conn:
        applied = {tuple(row) for row in conn.execute("SELECT app, name FROM django_migrations")}
        assert known and known <= applied, sorted(known - applied)
        # The owner made every table; the runtime role owns none and got its grants after the migration.
        assert conn.execute("SELECT count(*) FROM pg_tables WHERE tableowner = current_user").fetchone()[0] == 0
        assert conn.execute("SELECT count(*) FROM tenants_project").fetchone()[0] == 0
