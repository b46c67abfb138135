from django.apps import AppConfig


class TenantsConfig(AppConfig):
    name = "tenants"
    verbose_name = "Tenancy and access"

    def ready(self) -> None:
        # Templates ask predicates by name (``{% may %}``); every app installs its own (docs/conventions.md).
        from . import checks, policy  # noqa: F401  (checks registers the mail deploy check)

        policy.predicates_install(policy)

        # A remembered scope (tenants.access.scope_of) is forgotten whenever memberships or projects change.
        from django.db.models.signals import post_delete, post_save

        from .access import scope_forget_on_change
        from .models import Membership, Project

        for model in (Membership, Project):
            post_save.connect(scope_forget_on_change, sender=model, dispatch_uid=f"scope-forget-save-{model.__name__}")
            post_delete.connect(scope_forget_on_change, sender=model, dispatch_uid=f"scope-forget-delete-{model.__name__}")

        # Platform ops decide everywhere: joining or leaving the ops group changes what waits for them.
        from django.contrib.auth import get_user_model
        from django.db.models.signals import m2m_changed

        from .access import approvals_changed

        m2m_changed.connect(approvals_changed, sender=get_user_model().groups.through, weak=False,
                            dispatch_uid="approvals-user-groups")

        # The session users' kept rows (tenants.access.user_for_session): the user, their memberships, their groups.
        from django.contrib.auth.models import Group

        from .access import session_users_changed

        for model in (get_user_model(), Membership, Project, Group):
            post_save.connect(session_users_changed, sender=model, weak=False, dispatch_uid=f"session-users-save-{model.__name__}")
            post_delete.connect(session_users_changed, sender=model, weak=False,
                                dispatch_uid=f"session-users-delete-{model.__name__}")
        m2m_changed.connect(session_users_changed, sender=get_user_model().groups.through, weak=False,
                            dispatch_uid="session-users-groups")
