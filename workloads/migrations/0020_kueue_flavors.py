from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('workloads', '0019_measured_idle'),
    ]

    operations = [
        migrations.AddField(
            model_name='workloadrequest',
            name='kueue_flavors',
            field=models.JSONField(blank=True, default=list, help_text='Flavors of its cluster Kueue may choose between (empty: pinned to its flavor).'),
        ),
    ]
