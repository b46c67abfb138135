"""The database itself refuses to change audit entries (PostgreSQL and SQLite) or delete them (PostgreSQL).

SQLite gets no DELETE trigger: Django's test flush empties tables with DELETE there (PostgreSQL uses
TRUNCATE, which row triggers don't see), and SQLite is only the development database. The model and
its queryset refuse deletes on every database.
"""

from django.db import migrations

FORWARD = """
CREATE OR REPLACE FUNCTION tenants_auditentry_append_only() RETURNS trigger AS $$
BEGIN
    RAISE EXCEPTION 'audit entries are append-only';
END;
$$ LANGUAGE plpgsql;
CREATE TRIGGER tenants_auditentry_no_change BEFORE UPDATE OR DELETE ON tenants_auditentry
    FOR EACH ROW EXECUTE FUNCTION tenants_auditentry_append_only();
"""
BACKWARD = """
DROP TRIGGER IF EXISTS tenants_auditentry_no_change ON tenants_auditentry;
DROP FUNCTION IF EXISTS tenants_auditentry_append_only();
"""


SQLITE_FORWARD = [
    "CREATE TRIGGER tenants_auditentry_no_update BEFORE UPDATE ON tenants_auditentry "
    "BEGIN SELECT RAISE(ABORT, 'audit entries are append-only'); END;",
]
SQLITE_BACKWARD = [
    "DROP TRIGGER IF EXISTS tenants_auditentry_no_update;",
]


def forward(apps, schema_editor):
    vendor = schema_editor.connection.vendor
    if vendor == "postgresql":
        schema_editor.execute(FORWARD)
    elif vendor == "sqlite":
        for statement in SQLITE_FORWARD:
            schema_editor.execute(statement)


def backward(apps, schema_editor):
    vendor = schema_editor.connection.vendor
    if vendor == "postgresql":
        schema_editor.execute(BACKWARD)
    elif vendor == "sqlite":
        for statement in SQLITE_BACKWARD:
            schema_editor.execute(statement)


class Migration(migrations.Migration):
    dependencies = [("tenants", "0001_initial")]
    operations = [migrations.RunPython(forward, backward)]
