from django.apps import AppConfig


class QuotasConfig(AppConfig):
    name = "quotas"

    def ready(self) -> None:
        # tenants checks a new project's namespace against the clusters through these (it sits below quotas).
        from tenants.policy import predicates_install
        from tenants.services import namespace_checks

        from . import policy
        from .namespaces import is_reserved, namespace_problem

        namespace_checks.reserved = is_reserved  # type: ignore[method-assign]
        namespace_checks.problem = namespace_problem  # type: ignore[method-assign]
        predicates_install(policy)  # templates ask them by name ({% may "quotas.may_decide" ... %})

        # A quota request written (created, or any save) changes what waits in the quota inboxes; status moves
        # (quotas.states.move, an UPDATE) say so themselves.
        from django.db.models.signals import post_delete, post_save

        from tenants.access import approvals_changed

        from .models import QuotaRequest

        post_save.connect(approvals_changed, sender=QuotaRequest, weak=False, dispatch_uid="approvals-quota-save")
        post_delete.connect(approvals_changed, sender=QuotaRequest, weak=False, dispatch_uid="approvals-quota-delete")
