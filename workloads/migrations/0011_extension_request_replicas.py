# An extension request may ask for replicas (a scale request, issue 27): one pending of each kind per request.

import django.core.validators
from django.conf import settings
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('workloads', '0010_request_workload_uid_reclaim'),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.RemoveConstraint(
            model_name='extensionrequest',
            name='one_pending_extension_per_request',
        ),
        migrations.AddField(
            model_name='extensionrequest',
            name='replicas',
            field=models.PositiveIntegerField(blank=True, null=True, validators=[django.core.validators.MinValueValidator(1)]),
        ),
        migrations.AlterField(
            model_name='extensionrequest',
            name='hours',
            field=models.PositiveIntegerField(default=0, help_text='More hours asked for (0: a scale request).'),
        ),
        migrations.AddConstraint(
            model_name='extensionrequest',
            constraint=models.UniqueConstraint(condition=models.Q(('replicas__isnull', True), ('status', 'pending')), fields=('request',), name='one_pending_extension_per_request'),
        ),
        migrations.AddConstraint(
            model_name='extensionrequest',
            constraint=models.UniqueConstraint(condition=models.Q(('replicas__isnull', False), ('status', 'pending')), fields=('request',), name='one_pending_scale_request_per_request'),
        ),
        migrations.AddConstraint(
            model_name='extensionrequest',
            constraint=models.CheckConstraint(condition=models.Q(models.Q(('hours__gte', 1), ('replicas__isnull', True)), models.Q(('hours', 0), ('replicas__gte', 1)), _connector='OR'), name='extension_request_hours_or_replicas'),
        ),
    ]
