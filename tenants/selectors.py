"""Every read that depends on who asks. The API viewsets and the portal pages both start here."""

from __future__ import annotations

from typing import Any

from django.contrib.auth import get_user_model
from django.db.models import BooleanField, Count, ExpressionWrapper, Prefetch, Q, QuerySet, Window

from portal.compiled import Compiled
from portal.ui import PAGE_SIZE

from .access import Actor, is_ops, ops_role, scope_of
from .models import ApiToken, AuditEntry, GroupMapping, Invitation, Membership, OidcIdentity, Project, Role, Tenant


def tenants_for(*, actor: Actor) -> QuerySet[Tenant]:
    scope = scope_of(actor)
    return Tenant.objects.all() if scope.everything else Tenant.objects.filter(pk__in=sorted(scope.visible_tenants))


def projects_for(*, actor: Actor) -> QuerySet[Project]:
    scope = scope_of(actor)
    base = Project.objects.select_related("tenant")
    return base if scope.everything else base.filter(pk__in=sorted(scope.visible_projects))


# The pages' lookups by slug and a tenant's projects, compiled once per process (portal.compiled): building and
# compiling the querysets took longer than running them. Whether the actor sees the row is asked of their scope
# (the same sets ``tenants_for`` and ``projects_for`` filter by), not in the SQL.
_TENANT_BY_SLUG = Compiled(lambda slug: Tenant.objects.filter(slug=slug).order_by()[:1])
_PROJECT_BY_SLUG = Compiled(lambda slug: Project.objects.select_related("tenant").filter(slug=slug).order_by()[:1])
_TENANT_PROJECTS = Compiled(lambda tenant_id: Project.objects.filter(tenant_id=tenant_id).order_by("name"))


def tenant_seen_by(*, actor: Actor, slug: str) -> Tenant | None:
    """``tenants_for(actor).filter(slug=slug).first()``: the tenant ``slug`` if ``actor`` sees it, else None."""
    found = _TENANT_BY_SLUG.rows(slug)
    if not found:
        return None
    scope = scope_of(actor)
    return found[0] if scope.everything or found[0].pk in scope.visible_tenants else None


def project_seen_by(*, actor: Actor, slug: str) -> Project | None:
    """``projects_for(actor).filter(slug=slug).first()`` (with its tenant): the project ``slug`` if ``actor`` sees it,
    else None."""
    found = _PROJECT_BY_SLUG.rows(slug)
    if not found:
        return None
    scope = scope_of(actor)
    return found[0] if scope.everything or found[0].pk in scope.visible_projects else None


# A project page's first page of members and of tokens (their total in each row, ``portal.ui.page_of``'s window),
# compiled once per process; tokens: all of the project's, or one user's.
_MEMBERS_FIRST = Compiled(lambda project_id: Membership.objects.filter(project_id=project_id).select_related("user")
                          .order_by("user__username").annotate(_pager_total=Window(Count("pk")))[:PAGE_SIZE + 1])
_TOKENS_FIRST = Compiled(lambda project_id: ApiToken.objects.filter(project_id=project_id).select_related("user")
                         .order_by("-created_at").annotate(_pager_total=Window(Count("pk")))[:PAGE_SIZE + 1])
_OWN_TOKENS_FIRST = Compiled(lambda project_id, user_id: ApiToken.objects.filter(project_id=project_id, user_id=user_id)
                             .select_related("user").order_by("-created_at")
                             .annotate(_pager_total=Window(Count("pk")))[:PAGE_SIZE + 1])


def project_members_first(*, actor: Actor, project: Project) -> list[Membership]:
    """The first ``PAGE_SIZE + 1`` rows of ``memberships_for(actor).filter(project=project)`` by username, with their
    users and the total as ``_pager_total``: every membership of a project the actor sees (none of one they do not)."""
    scope = scope_of(actor)
    if not (scope.everything or project.pk in scope.visible_projects):
        return []
    return _MEMBERS_FIRST.rows(project.pk)


def project_tokens_first(*, actor: Actor, project: Project) -> list[ApiToken]:
    """The first ``PAGE_SIZE + 1`` rows of ``tokens_for(actor).filter(project=project)``, newest first, with their
    users and the total as ``_pager_total``: every token of the project for ops and its tenant's admins, the actor's
    own for anyone else."""
    if actor.token is not None:  # tokens_for's own rule (the token itself), not kept
        return list(tokens_for(actor=actor).filter(project=project).select_related(None).select_related("user")
                    .order_by("-created_at").annotate(_pager_total=Window(Count("pk")))[:PAGE_SIZE + 1])
    scope = scope_of(actor)
    if scope.everything or project.pk in scope.project_ids("manage_members_project"):
        return _TOKENS_FIRST.rows(project.pk)
    return _OWN_TOKENS_FIRST.rows(project.pk, actor.user.pk)


def tenant_projects_for(*, actor: Actor, tenant: Tenant) -> list[Project]:
    """``projects_for(actor).filter(tenant=tenant).order_by("name")``: the projects of ``tenant`` that ``actor`` sees,
    by name, each with ``tenant`` as its tenant (no join)."""
    scope = scope_of(actor)
    found = _TENANT_PROJECTS.rows(tenant.pk)
    for project in found:
        project.tenant = tenant
    return found if scope.everything else [p for p in found if p.pk in scope.visible_projects]


def projects_where(*, actor: Actor, perm: str) -> QuerySet[Project]:
    """Projects on which ``actor`` holds ``perm`` (e.g. ``submit_project``)."""
    scope = scope_of(actor)
    base = Project.objects.select_related("tenant")
    return base if scope.everything else base.filter(pk__in=scope.project_ids(perm))


def admin_tenants_for(*, actor: Actor) -> QuerySet[Tenant]:
    """Tenants whose members ``actor`` may manage."""
    if actor.token is not None:
        return Tenant.objects.none()
    scope = scope_of(actor)
    return Tenant.objects.all() if scope.everything else Tenant.objects.filter(pk__in=scope.tenant_ids("manage_members_tenant"))


def memberships_for(*, actor: Actor) -> QuerySet[Membership]:
    """Tenant admins see their tenants' memberships; others see the members of the projects they see."""
    base = Membership.objects.select_related("user", "tenant", "project")
    scope = scope_of(actor)
    if scope.everything:
        return base
    admin_tenants = [] if actor.token is not None else scope.tenant_ids("manage_members_tenant")
    return base.filter(Q(tenant_id__in=admin_tenants) | Q(project_id__in=sorted(scope.visible_projects)))


def own_memberships_for(*, actor: Actor) -> QuerySet[Membership]:
    """The actor's own roles (``/api/v1/me/``); through a token, only those in the token's tenant."""
    mine = Membership.objects.filter(user=actor.user).select_related("tenant", "project", "user")
    if actor.token is not None:
        mine = mine.filter(tenant=actor.token.project.tenant_id)
    return mine


def users_for(*, actor: Actor) -> QuerySet[Any]:
    """Every user account, for ops (the ops pages); nobody else lists users."""
    users = get_user_model().objects.all()
    return users if actor.token is None and is_ops(actor.user) else users.none()


def user_list_for(*, actor: Actor) -> QuerySet[Any]:
    """``users_for`` by username, with each user's memberships and groups (ops' user list)."""
    memberships = Prefetch("memberships", queryset=Membership.objects.select_related("tenant", "project"))
    # ``in_ops_group``: holds the ops role (``access.ops_role``; the page's "ops" badge and its toggle).
    return (users_for(actor=actor).order_by("username").prefetch_related(memberships)
            .annotate(in_ops_group=ExpressionWrapper(ops_role(), output_field=BooleanField())))


def group_mappings_for(*, actor: Actor) -> QuerySet[GroupMapping]:
    """The identity provider's group mappings (/ops/identity/): ops only."""
    mappings = GroupMapping.objects.select_related("tenant", "project").order_by("group", "pk")
    return mappings if actor.token is None and is_ops(actor.user) else mappings.none()


def identities_for(*, actor: Actor) -> QuerySet[OidcIdentity]:
    """Single sign-on identities with their users, latest sign-in first: ops only."""
    found = OidcIdentity.objects.select_related("user").order_by("-last_login_at", "pk")
    return found if actor.token is None and is_ops(actor.user) else found.none()


def invitations_for(*, actor: Actor) -> QuerySet[Invitation]:
    """Invitations of the tenants ``actor`` administers (ops: all); nobody else sees any."""
    base = Invitation.objects.select_related("tenant", "project", "invited_by", "accepted_by")
    if actor.token is not None:
        return base.none()
    scope = scope_of(actor)
    return base if scope.everything else base.filter(tenant_id__in=scope.tenant_ids("manage_members_tenant"))


SIGNUP_SUGGESTIONS = 4
_SUFFIX_ALPHABET = "abcdefghijkmnpqrstuvwxyz23456789"  # no l/1/o/0: read aloud or copied by hand without doubt


def signup_usernames_for(invitation: Invitation) -> list[str]:
    """The usernames a newcomer may choose from on the invitation's page: the invited address's local part
    with a short suffix drawn from the link's secret (so the same link offers the same names, and no two links
    the same), those already in use left out.

    The newcomer chooses among these and types no name, so the page cannot be asked whether a given username
    exists (docs/security.md, "Invitations"): every suggestion carries a suffix, which of them are left out
    says nothing about the names people chose."""
    import hmac
    import re

    from django.conf import settings
    from django.db.models.functions import Lower

    base = re.sub(r"[^a-z0-9._-]+", "", invitation.email.split("@", 1)[0].lower()).strip("._-")[:24] or "user"
    candidates = []
    for n in range(SIGNUP_SUGGESTIONS * 4):
        digest = hmac.new(settings.SECRET_KEY.encode(), f"signup:{invitation.secret_hash}:{n}".encode(), "sha256").digest()
        candidates.append(f"{base}-" + "".join(_SUFFIX_ALPHABET[b % len(_SUFFIX_ALPHABET)] for b in digest[:4]))
    taken = set(get_user_model().objects.annotate(name=Lower("username")).filter(name__in=candidates)
                .values_list("name", flat=True))
    return [name for name in dict.fromkeys(candidates) if name not in taken][:SIGNUP_SUGGESTIONS]


def invitation_by_secret(secret: str) -> Invitation | None:
    """The invitation a link's secret opens (whatever its status), or None. Only the hash is stored."""
    import hashlib

    if not secret or len(secret) > 100:
        return None
    digest = hashlib.sha256(secret.encode()).hexdigest()
    return Invitation.objects.select_related("tenant", "project").filter(secret_hash=digest).first()


def invitation_superseded_by_secret(secret: str) -> Invitation | None:
    """The invitation whose earlier link this secret was (it was sent again since: a newer link exists), or None."""
    import hashlib

    from .models import SupersededInvitationLink

    if not secret or len(secret) > 100:
        return None
    digest = hashlib.sha256(secret.encode()).hexdigest()
    old = SupersededInvitationLink.objects.select_related("invitation__tenant").filter(secret_hash=digest).first()
    return old.invitation if old is not None else None


def tenant_members(*, tenant: Tenant) -> QuerySet[Any]:
    """The active users who hold any role in ``tenant`` (for picking one, never for searching others)."""
    from django.contrib.auth import get_user_model

    return get_user_model().objects.filter(is_active=True, memberships__tenant=tenant).distinct().order_by("username")


def tokens_for(*, actor: Actor) -> QuerySet[ApiToken]:
    """A user's own tokens; tenant admins also see (and may revoke) every token of their tenant."""
    base = ApiToken.objects.select_related("project__tenant", "user")
    if actor.token is not None:
        return base.filter(pk=actor.token.pk)
    scope = scope_of(actor)
    if scope.everything:
        return base
    # The projects of the tenants they administer (manage_members_project is a tenant admin's, on every project
    # of the tenant): two indexed columns of the token table, no join.
    return base.filter(Q(user_id=actor.user.pk) | Q(project_id__in=scope.project_ids("manage_members_project")))


def audit_entries_for(*, actor: Actor) -> QuerySet[AuditEntry]:
    """Ops see everything; tenant admins their tenants' entries; project admins their projects'."""
    base = AuditEntry.objects.select_related("tenant", "project")
    if actor.token is not None:
        return base.none()
    scope = scope_of(actor)
    if scope.everything:
        return base
    admin_projects = sorted(project_id for _, project_id, role in scope.memberships
                            if role == Role.PROJECT_ADMIN and project_id is not None)
    return base.filter(Q(tenant_id__in=scope.tenant_ids("manage_members_tenant")) | Q(project_id__in=admin_projects))


def lookup(queryset: QuerySet[Any], key: str) -> Any:
    """Find by numeric id or by slug within an already-scoped queryset; anything else is a 404."""
    from django.shortcuts import get_object_or_404

    from portal.inputs import NUL, is_id

    if is_id(key):
        return get_object_or_404(queryset, pk=int(key))
    if NUL in key:
        return get_object_or_404(queryset.none())
    return get_object_or_404(queryset, slug=key)
