from django.apps import AppConfig


class QuotasConfig(AppConfig):
    name = "quotas"

    def ready(self) -> None:
        # tenants checks a new project's namespace against the clusters through these slots (it sits below
        # quotas); both are enforcing: a check that fails refuses the project.
        from portal.extensions import namespace_check, reserved_name
        from tenants.policy import predicates_install

        from . import policy
        from .namespaces import is_reserved, namespace_problem

        reserved_name.register(is_reserved)
        namespace_check.register(namespace_problem)
        predicates_install(policy)  # templates ask them by name ({% may "quotas.may_decide" ... %})

        # A quota request written (created, or any save) changes what waits in the quota inboxes; status moves
        # (quotas.states.move, an UPDATE) say so themselves.
        from django.db.models.signals import post_delete, post_save

        from tenants.access import approvals_changed

        from .models import QuotaRequest

        post_save.connect(approvals_changed, sender=QuotaRequest, weak=False, dispatch_uid="approvals-quota-save")
        post_delete.connect(approvals_changed, sender=QuotaRequest, weak=False, dispatch_uid="approvals-quota-delete")
