"""``manage.py db_runtime_role NAME``: a PostgreSQL role for the running portal that owns nothing.

The portal then runs with ``DATABASE_URL`` as this role, while ``migrate`` (and this command) run
as the tables' owner (``DATABASE_MIGRATE_URL``, alias ``migrate``). The role may read and write
every table, but on the audit log only SELECT and INSERT: no UPDATE, DELETE or TRUNCATE, and as a
non-owner it cannot ALTER the table (DISABLE TRIGGER) or set session_replication_role either.
Run it again after each ``migrate``: it is idempotent and grants on new tables too.

Without ``--apply`` it prints the SQL, for a DBA to run.
"""

from __future__ import annotations

import os
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError
from django.db import connections, transaction
from psycopg import sql

from tenants.models import AuditChainHead, AuditEntry


def runtime_role_sql(role: str, password: str | None, *, database: str, exists: bool) -> list[sql.Composable]:
    name = sql.Identifier(role)
    audit, head = sql.Identifier(AuditEntry._meta.db_table), sql.Identifier(AuditChainHead._meta.db_table)
    statements: list[sql.Composable] = []
    if not exists:
        statements.append(sql.SQL("CREATE ROLE {} LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE NOREPLICATION NOBYPASSRLS").format(name))
    if password:
        statements.append(sql.SQL("ALTER ROLE {} PASSWORD {}").format(name, sql.Literal(password)))
    statements += [
        sql.SQL("GRANT CONNECT ON DATABASE {} TO {}").format(sql.Identifier(database), name),
        sql.SQL("GRANT USAGE ON SCHEMA public TO {}").format(name),
        sql.SQL("REVOKE ALL ON ALL TABLES IN SCHEMA public FROM {}").format(name),
        sql.SQL("GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA public TO {}").format(name),
        # The audit log: append and read only. Its chain head: no DELETE either.
        sql.SQL("REVOKE UPDATE, DELETE ON {} FROM {}").format(audit, name),
        sql.SQL("REVOKE DELETE ON {} FROM {}").format(head, name),
        sql.SQL("GRANT USAGE, SELECT ON ALL SEQUENCES IN SCHEMA public TO {}").format(name),
        # Tables later migrations create (as the role running this) are usable too.
        sql.SQL("ALTER DEFAULT PRIVILEGES IN SCHEMA public GRANT SELECT, INSERT, UPDATE, DELETE ON TABLES TO {}").format(name),
        sql.SQL("ALTER DEFAULT PRIVILEGES IN SCHEMA public GRANT USAGE, SELECT ON SEQUENCES TO {}").format(name),
    ]
    return statements


class Command(BaseCommand):
    help = "Create or update the portal's runtime PostgreSQL role (owns nothing; audit log append-only). Prints the SQL unless --apply."

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("role", help="the runtime role's name, e.g. portal_app")
        parser.add_argument("--password-env", default="PORTAL_RUNTIME_DB_PASSWORD",
                            help="environment variable holding the role's password (default: %(default)s); unset: leave it")
        parser.add_argument("--apply", action="store_true", help="run the SQL (as the tables' owner) instead of printing it")
        parser.add_argument("--database", default="migrate" if "migrate" in settings.DATABASES else "default",
                            help="the connection to run it on: the owner's (default: %(default)s)")

    def handle(self, *args: Any, role: str, password_env: str, apply: bool, database: str, **options: Any) -> None:
        connection = connections[database]
        if connection.vendor != "postgresql":
            raise CommandError(f"runtime roles are a PostgreSQL feature; the {database!r} database is {connection.vendor}")
        connection.ensure_connection()
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", [role])
            exists = cursor.fetchone() is not None
        statements = runtime_role_sql(role, os.environ.get(password_env) or None,
                                      database=connection.settings_dict["NAME"], exists=exists)
        raw = connection.connection
        if not apply:
            for statement in statements:
                self.stdout.write(statement.as_string(raw) + ";")
            return
        with transaction.atomic(using=database), connection.cursor() as cursor:
            for statement in statements:
                cursor.execute(statement.as_string(raw))
        self.stdout.write(f"runtime role {role} {'updated' if exists else 'created'} on {connection.settings_dict['NAME']}")
