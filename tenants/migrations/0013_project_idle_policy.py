from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('tenants', '0012_guardian_mirror_dropped'),
    ]

    operations = [
        migrations.AddField(
            model_name='project',
            name='cull_idle_notebooks_by_gpu',
            field=models.BooleanField(default=False, help_text='Cull idle notebooks by measured GPU use, as well as by portal activity.'),
        ),
        migrations.AddField(
            model_name='project',
            name='stop_idle_batch_jobs',
            field=models.BooleanField(default=False, help_text='Stop training and batch inference jobs whose GPUs are measured idle.'),
        ),
    ]
