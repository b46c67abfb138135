"""Memberships are read directly (``tenants.access.scope_of`` and ``holders``): the django-guardian rows that mirrored
them on tenants and projects are read by nothing any more, so they go. Guardian keeps only per-object shares."""

from django.db import migrations


def drop_mirror(apps, schema_editor):
    ContentType = apps.get_model("contenttypes", "ContentType")
    UserObjectPermission = apps.get_model("guardian", "UserObjectPermission")
    db = schema_editor.connection.alias  # the migrating connection (the migrate role), not the default one
    mirrored = ContentType.objects.using(db).filter(app_label="tenants", model__in=["tenant", "project"])
    UserObjectPermission.objects.using(db).filter(content_type__in=mirrored).delete()


class Migration(migrations.Migration):
    dependencies = [
        ("tenants", "0011_invitation_superseded_link"),
        ("guardian", "0002_generic_permissions_index"),
        ("contenttypes", "0002_remove_content_type_name"),
    ]

    operations = [migrations.RunPython(drop_mirror, migrations.RunPython.noop)]
