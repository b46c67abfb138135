from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('workloads', '0018_spill_source_wait'),
    ]

    operations = [
        migrations.AddField(
            model_name='servicetemplate',
            name='idle_gpu_percent',
            field=models.FloatField(blank=True, help_text='Measured GPU utilisation below which a running request counts as idle (empty: MEASURED_IDLE_PERCENT).', null=True),
        ),
        migrations.AddField(
            model_name='workloadrequest',
            name='measured_idle_since',
            field=models.DateTimeField(blank=True, null=True),
        ),
    ]
