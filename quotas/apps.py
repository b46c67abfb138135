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

        # What the queues offer (selectors.OFFERS) is read from quota rows, flavors, clusters, projects and tenants:
        # every write to one forgets it (a status move, an UPDATE, says so itself: tenants.states).
        from tenants.models import Project, Tenant

        from .models import Cluster, Flavor, Quota
        from .selectors import OFFERS

        def offers_changed(**kwargs) -> None:
            OFFERS.changed()

        for model in (Quota, Flavor, Cluster, Project, Tenant):
            post_save.connect(offers_changed, sender=model, weak=False, dispatch_uid=f"offers-save-{model.__name__}")
            post_delete.connect(offers_changed, sender=model, weak=False, dispatch_uid=f"offers-delete-{model.__name__}")

        # The enforced flavors (selectors.ENFORCED_FLAVORS: the quota request form's choices) likewise.
        from .selectors import ENFORCED_FLAVORS

        def flavors_changed(**kwargs) -> None:
            ENFORCED_FLAVORS.changed()

        for model in (Flavor, Cluster):
            post_save.connect(flavors_changed, sender=model, weak=False, dispatch_uid=f"enforced-save-{model.__name__}")
            post_delete.connect(flavors_changed, sender=model, weak=False, dispatch_uid=f"enforced-delete-{model.__name__}")
