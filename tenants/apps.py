from django.apps import AppConfig


class TenantsConfig(AppConfig):
    name = "tenants"
    verbose_name = "Tenancy and access"

    def ready(self) -> None:
        # Templates ask predicates by name (``{% may %}``); every app installs its own (docs/conventions.md).
        from . import policy

        policy.predicates_install(policy)
