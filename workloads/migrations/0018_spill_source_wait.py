from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('workloads', '0017_inference_keys'),
    ]

    operations = [
        migrations.AddField(
            model_name='workloadrequest',
            name='spill_source_pending',
            field=models.PositiveIntegerField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name='workloadrequest',
            name='spill_source_wait_seconds',
            field=models.PositiveIntegerField(blank=True, null=True),
        ),
    ]
