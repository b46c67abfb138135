from django.apps import AppConfig


class MaintenanceConfig(AppConfig):
    """Managed changes to the cluster's hardware layout: MIG reconfiguration with a window, an approval and a
    rollback (docs/mig-changes.md)."""

    name = "maintenance"

    def ready(self) -> None:
        from tenants.policy import predicates_install

        from . import policy

        predicates_install(policy)  # templates ask them by name ({% may "maintenance.may_decide_mig_change" c as ok %})

        from portal.extensions import quota_notices

        from . import notices

        quota_notices.register(notices.quota_notices)  # the quota pages show MIG changes that cut the quota
