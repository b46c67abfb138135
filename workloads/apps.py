from django.apps import AppConfig


class WorkloadsConfig(AppConfig):
    name = "workloads"

    def ready(self) -> None:
        from django.db.models.signals import m2m_changed, post_delete, post_save

        from quotas.models import Cluster, Flavor
        from tenants.policy import predicates_install

        from . import policy, selectors
        from .models import ApprovalRule, Image, ServiceTemplate

        predicates_install(policy)  # templates ask them by name ({% may "workloads.may_act_on" req as ok %})

        from portal.extensions import gpus_in_use_by_node

        gpus_in_use_by_node.register(selectors.gpus_in_use_by_node)  # the capacity page's per-rack free GPUs

        # Every write to what the submission catalogue holds forgets it (workloads.selectors.CATALOGUE).
        def catalogue_changed(**kwargs) -> None:
            selectors.CATALOGUE.changed()

        for model in (ServiceTemplate, Image, ApprovalRule, Flavor, Cluster):
            post_save.connect(catalogue_changed, sender=model, weak=False, dispatch_uid=f"catalogue-save-{model.__name__}")
            post_delete.connect(catalogue_changed, sender=model, weak=False, dispatch_uid=f"catalogue-delete-{model.__name__}")
        m2m_changed.connect(catalogue_changed, sender=ServiceTemplate.allowed_flavors.through, weak=False,
                            dispatch_uid="catalogue-template-flavors")

        # The shares kept per process (workloads.shared.SHARES): a share saved or deleted (also by a cascade).
        from .models import RequestShare
        from .shared import shares_changed

        post_save.connect(shares_changed, sender=RequestShare, weak=False, dispatch_uid="shares-save")
        post_delete.connect(shares_changed, sender=RequestShare, weak=False, dispatch_uid="shares-delete")

        # What waits for approvers (selectors.approvals_waiting_counts_kept): a request saved while pending approval
        # (a submission's INSERT), an extension request written (created, or any save) or a request deleted changes
        # it; state moves (UPDATEs) say so themselves (states, extension_states).
        from tenants.access import approvals_changed

        from .models import ExtensionRequest, RequestState, WorkloadRequest

        def request_saved(instance, **kwargs) -> None:
            if instance.state == RequestState.PENDING_APPROVAL:
                approvals_changed()

        post_save.connect(request_saved, sender=WorkloadRequest, weak=False, dispatch_uid="approvals-request-save")
        post_save.connect(approvals_changed, sender=ExtensionRequest, weak=False, dispatch_uid="approvals-extension-save")
        post_delete.connect(approvals_changed, sender=ExtensionRequest, weak=False,
                            dispatch_uid="approvals-extension-delete")
        post_delete.connect(approvals_changed, sender=WorkloadRequest, weak=False, dispatch_uid="approvals-request-delete")
