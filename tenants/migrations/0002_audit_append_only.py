"""On PostgreSQL, the database itself refuses to change or delete audit entries."""

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


def forward(apps, schema_editor):  # noqa: ANN001, ANN201
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(FORWARD)


def backward(apps, schema_editor):  # noqa: ANN001, ANN201
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(BACKWARD)


class Migration(migrations.Migration):
    dependencies = [("tenants", "0001_initial")]
    operations = [migrations.RunPython(forward, backward)]
