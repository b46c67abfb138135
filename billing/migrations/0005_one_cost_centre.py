"""One cost centre: the tenant's (``Tenant.cost_centre``). A billing profile's own cost centre, where the tenant had
none, moves to the tenant; then the profile's field goes."""

from django.db import migrations


def to_tenant(apps, schema_editor):
    BillingProfile = apps.get_model("billing", "BillingProfile")
    Tenant = apps.get_model("tenants", "Tenant")
    db = schema_editor.connection.alias
    for profile in BillingProfile.objects.using(db).exclude(cost_centre="").select_related("tenant"):
        if not profile.tenant.cost_centre:
            Tenant.objects.using(db).filter(pk=profile.tenant_id).update(cost_centre=profile.cost_centre[:60])


def to_profile(apps, schema_editor):
    BillingProfile = apps.get_model("billing", "BillingProfile")
    db = schema_editor.connection.alias
    for profile in BillingProfile.objects.using(db).select_related("tenant"):
        BillingProfile.objects.using(db).filter(pk=profile.pk).update(cost_centre=profile.tenant.cost_centre)


class Migration(migrations.Migration):

    dependencies = [
        ("billing", "0004_cost_rollup"),
        ("tenants", "0010_login_throttle_in_flight"),
    ]

    operations = [
        migrations.RunPython(to_tenant, to_profile),
        migrations.RemoveField(model_name="billingprofile", name="cost_centre"),
    ]
