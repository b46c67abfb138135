from django.apps import AppConfig


class QuotasConfig(AppConfig):
    name = "quotas"

    def ready(self) -> None:
        # tenants checks a new project's namespace against the clusters through these (it sits below quotas).
        from tenants.services import namespace_checks

        from .namespaces import is_reserved, namespace_problem

        namespace_checks.reserved = is_reserved  # type: ignore[method-assign]
        namespace_checks.problem = namespace_problem  # type: ignore[method-assign]
