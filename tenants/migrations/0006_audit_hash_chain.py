"""The audit log becomes a hash chain (tenants.audit): existing entries are chained in id order.

The append-only triggers of 0002 are set aside for the backfill only. SQLite rebuilds the table when
a unique column is added, which drops its trigger: it is created again here.
"""

import django.utils.timezone
from django.db import migrations, models

SQLITE_TRIGGER = (
    "CREATE TRIGGER tenants_auditentry_no_update BEFORE UPDATE ON tenants_auditentry "
    "BEGIN SELECT RAISE(ABORT, 'audit entries are append-only'); END;"
)


def chain_existing(apps, schema_editor):
    from tenants.audit import entry_digest

    # Through the migration's own connection (docs/security.md: `migrate --database migrate`).
    alias = schema_editor.connection.alias
    entries = apps.get_model("tenants", "AuditEntry").objects.using(alias)
    heads = apps.get_model("tenants", "AuditChainHead").objects.using(alias)
    vendor = schema_editor.connection.vendor
    if vendor == "postgresql":
        schema_editor.execute("ALTER TABLE tenants_auditentry DISABLE TRIGGER tenants_auditentry_no_change")
    elif vendor == "sqlite":
        schema_editor.execute("DROP TRIGGER IF EXISTS tenants_auditentry_no_update")
    prev_hash, seq = "", 0
    for entry in entries.order_by("id").iterator(chunk_size=2000):
        seq += 1
        entry.seq, entry.prev_hash = seq, prev_hash
        entry.entry_hash = prev_hash = entry_digest(entry)
        # The historical queryset has no append-only guard; the trigger is off for this.
        entries.filter(pk=entry.pk).update(seq=seq, prev_hash=entry.prev_hash, entry_hash=entry.entry_hash)
    if seq:
        heads.update_or_create(pk=1, defaults={"seq": seq, "hash": prev_hash})
    if vendor == "postgresql":
        schema_editor.execute("ALTER TABLE tenants_auditentry ENABLE TRIGGER tenants_auditentry_no_change")
    elif vendor == "sqlite":
        schema_editor.execute(SQLITE_TRIGGER)


def sqlite_trigger_again(apps, schema_editor):
    if schema_editor.connection.vendor == "sqlite":
        schema_editor.execute("DROP TRIGGER IF EXISTS tenants_auditentry_no_update")
        schema_editor.execute(SQLITE_TRIGGER)


class Migration(migrations.Migration):

    dependencies = [
        ('tenants', '0005_login_throttle'),
    ]

    operations = [
        migrations.CreateModel(
            name='AuditChainHead',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('seq', models.PositiveBigIntegerField(default=0)),
                ('hash', models.CharField(blank=True, default='', max_length=64)),
            ],
        ),
        migrations.AddField(
            model_name='auditentry',
            name='entry_hash',
            field=models.CharField(blank=True, default='', editable=False, max_length=64),
        ),
        migrations.AddField(
            model_name='auditentry',
            name='prev_hash',
            field=models.CharField(blank=True, default='', editable=False, max_length=64),
        ),
        migrations.AddField(
            model_name='auditentry',
            name='seq',
            field=models.PositiveBigIntegerField(editable=False, null=True, unique=True),
        ),
        migrations.AlterField(
            model_name='auditentry',
            name='created_at',
            field=models.DateTimeField(db_index=True, default=django.utils.timezone.now, editable=False),
        ),
        migrations.RunPython(chain_existing, sqlite_trigger_again),
    ]
