from django.apps import AppConfig


class WorkloadsConfig(AppConfig):
    name = "workloads"

    def ready(self) -> None:
        from tenants.policy import predicates_install

        from . import policy

        predicates_install(policy)  # templates ask them by name ({% may "workloads.may_act_on" req as ok %})
