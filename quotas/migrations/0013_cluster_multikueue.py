import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('quotas', '0012_cluster_prometheus_cluster'),
    ]

    operations = [
        migrations.AddField(
            model_name='cluster',
            name='role',
            field=models.CharField(choices=[('standalone', 'Standalone (the portal routes)'), ('manager', 'MultiKueue manager'), ('worker', 'MultiKueue worker')], default='standalone', help_text="How work reaches it: the portal's own routing, or Kueue MultiKueue.", max_length=12),
        ),
        migrations.AddField(
            model_name='cluster',
            name='manager',
            field=models.ForeignKey(blank=True, help_text="A MultiKueue worker's manager cluster (its MultiKueueCluster there has this cluster's name).", null=True, on_delete=django.db.models.deletion.SET_NULL, related_name='workers', to='quotas.cluster'),
        ),
        migrations.AddField(
            model_name='cluster',
            name='admission_check',
            field=models.CharField(blank=True, default='', help_text="A MultiKueue manager's AdmissionCheck (controllerName kueue.x-k8s.io/multikueue) that its ClusterQueues name (empty: multikueue).", max_length=63),
        ),
    ]
