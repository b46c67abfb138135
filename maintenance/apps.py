from django.apps import AppConfig


class MaintenanceConfig(AppConfig):
    """Managed changes to the cluster's hardware layout: MIG reconfiguration with a window, an approval and a
    rollback (docs/mig-changes.md)."""

    name = "maintenance"
