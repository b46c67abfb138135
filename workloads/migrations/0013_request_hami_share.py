"""A HAMi request's share per vGPU (GPU memory in MiB, % of a card's cores), as submitted: the flavor's preset or
a size of the requester's own. Requests made before carry their flavor's preset."""

from django.db import migrations, models


def preset_sizes(apps, schema_editor):
    WorkloadRequest = apps.get_model("workloads", "WorkloadRequest")
    Flavor = apps.get_model("quotas", "Flavor")
    db = schema_editor.connection.alias  # the migrating connection (the migrate role), not the default one
    for flavor in Flavor.objects.using(db).filter(kind="hami"):
        WorkloadRequest.objects.using(db).filter(flavor=flavor, share_memory_mib=0).update(
            share_memory_mib=flavor.hami_memory_mib, share_cores_percent=flavor.hami_cores_percent)


class Migration(migrations.Migration):

    dependencies = [
        ("quotas", "0008_quota_request_hami_share"),
        ("workloads", "0012_spill"),
    ]

    operations = [
        migrations.AddField(
            model_name="workloadrequest",
            name="share_memory_mib",
            field=models.PositiveIntegerField(default=0, help_text="HAMi: GPU memory per vGPU (MiB)."),
        ),
        migrations.AddField(
            model_name="workloadrequest",
            name="share_cores_percent",
            field=models.PositiveIntegerField(default=0, help_text="HAMi: % of a card's cores per vGPU."),
        ),
        migrations.RunPython(preset_sizes, migrations.RunPython.noop),
    ]
