from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ("workloads", "0015_request_shares"),
    ]

    operations = [
        migrations.AddField(
            model_name="workloadrequest",
            name="topology",
            field=models.CharField(blank=True, choices=[("", "Anywhere"), ("rack", "Within one rack"), ("block", "Within one block"), ("prefer-rack", "Prefer one rack")], default="", help_text="Placement of its pods (multi-pod training on a topology-aware flavor).", max_length=12),
        ),
    ]
