from django.apps import AppConfig


class PortalConfig(AppConfig):
    name = "portal"

    def ready(self) -> None:
        from django.db.backends.signals import connection_created

        from .db_types import use_c_loaders

        connection_created.connect(use_c_loaders, dispatch_uid="portal.db_types.use_c_loaders")
