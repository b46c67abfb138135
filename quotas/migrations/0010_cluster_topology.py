from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('quotas', '0009_zones'),
    ]

    operations = [
        migrations.AddField(
            model_name='cluster',
            name='topology',
            field=models.CharField(blank=True, choices=[('', 'None'), ('block-rack-host', 'Block, rack, host')], help_text='Topology-aware placement: the node labels of blocks and racks (empty: off).', max_length=20),
        ),
    ]
