from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('quotas', '0010_cluster_topology'),
    ]

    operations = [
        migrations.AddField(
            model_name='node',
            name='conditions',
            field=models.JSONField(blank=True, default=list, help_text='status.conditions: type, status, reason, message.'),
        ),
        migrations.AddField(
            model_name='node',
            name='unschedulable',
            field=models.BooleanField(default=False, help_text='spec.unschedulable (cordoned).'),
        ),
        migrations.AddField(
            model_name='node',
            name='cordon_reason',
            field=models.CharField(blank=True, max_length=500),
        ),
    ]
