"""The runtime database role (``manage.py db_runtime_role``) cannot alter the audit log.

PostgreSQL only (roles and privileges are PostgreSQL's): CI always runs on PostgreSQL, and the
``postgresql`` marker keeps the test out of SQLite runs instead of skipping it. The role is created
in the test database and used through psycopg directly, as the running portal would connect.
"""

from __future__ import annotations

import os
import uuid

import psycopg
import pytest
from django.core.management import call_command
from django.db import connection
from psycopg import errors

from tenants.access import Actor
from tenants.audit import audit_record

pytestmark = [pytest.mark.postgresql, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def runtime_role(cast, monkeypatch):
    role = f"portal_rt_{uuid.uuid4().hex[:10]}"
    monkeypatch.setenv("PORTAL_RUNTIME_DB_PASSWORD", "rt-" + uuid.uuid4().hex)
    call_command("db_runtime_role", role, "--apply")
    settings = connection.settings_dict
    conn = psycopg.connect(host=settings["HOST"] or "127.0.0.1", port=settings["PORT"] or 5432, dbname=settings["NAME"],
                           user=role, password=os.environ["PORTAL_RUNTIME_DB_PASSWORD"], autocommit=True)
    try:
        yield conn
    finally:
        conn.close()
        with connection.cursor() as cursor:
            cursor.execute(f'DROP OWNED BY "{role}"')
            cursor.execute(f'DROP ROLE "{role}"')


def refused(conn: psycopg.Connection, statement: str) -> bool:
    try:
        conn.execute(statement)
    except errors.InsufficientPrivilege:
        return True
    return False


def test_runtime_role_cannot_change_or_empty_the_audit_log(runtime_role) -> None:
    audit_record(actor=Actor.system(), action="test.entry", target=_tenant())
    count = runtime_role.execute("SELECT count(*) FROM tenants_auditentry").fetchone()[0]
    assert count > 0
    for statement in [
        "UPDATE tenants_auditentry SET action = 'forged'",
        "DELETE FROM tenants_auditentry",
        "TRUNCATE tenants_auditentry",
        "ALTER TABLE tenants_auditentry DISABLE TRIGGER ALL",
        "SET session_replication_role = replica",
        "DELETE FROM tenants_auditchainhead",
        "CREATE TABLE tenants_sneaky (id int)",
    ]:
        assert refused(runtime_role, statement), statement
    assert runtime_role.execute("SELECT count(*) FROM tenants_auditentry").fetchone()[0] == count


def test_runtime_role_can_do_what_the_portal_does(runtime_role) -> None:
    """Append to the log as ``audit_record`` does (lock the head, insert, move the head), and DML elsewhere."""
    with runtime_role.transaction():
        runtime_role.execute("INSERT INTO tenants_auditchainhead (id, seq, hash) VALUES (1, 0, '') ON CONFLICT (id) DO NOTHING")
        seq = runtime_role.execute("SELECT seq FROM tenants_auditchainhead WHERE id = 1 FOR UPDATE").fetchone()[0]
        runtime_role.execute(
            "INSERT INTO tenants_auditentry (created_at, actor_label, action, target_type, target_id, target_repr, seq, prev_hash, entry_hash)"
            " VALUES (now(), 'system', 'test.rt', 't', '1', 'r', %s, '', '')",
            [seq + 1],
        )
        runtime_role.execute("UPDATE tenants_auditchainhead SET seq = %s WHERE id = 1", [seq + 1])
    runtime_role.execute("UPDATE tenants_tenant SET cost_centre = 'cc-1' WHERE slug = 'acme'")
    runtime_role.execute("DELETE FROM tenants_loginthrottle")


def _tenant():
    from tenants.models import Tenant

    return Tenant.objects.get(slug="acme")
