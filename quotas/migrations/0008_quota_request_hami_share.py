"""A HAMi quota request in shares: the size of each share (GPU memory in MiB, % of a card's cores)."""

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ("quotas", "0007_cluster_kueue_api"),
    ]

    operations = [
        migrations.AddField(
            model_name="quotarequest",
            name="share_memory_mib",
            field=models.PositiveIntegerField(default=0, help_text="HAMi: GPU memory per share (MiB)."),
        ),
        migrations.AddField(
            model_name="quotarequest",
            name="share_cores_percent",
            field=models.PositiveIntegerField(default=0, help_text="HAMi: GPU cores per share (% of a card)."),
        ),
    ]
