"""Every write to tenancy: checks the rules, writes, audits, re-syncs permissions. One transaction each."""

from __future__ import annotations

import hashlib
import logging
import secrets
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.password_validation import validate_password
from django.core.exceptions import ValidationError
from django.core.validators import validate_email
from django.db import IntegrityError, transaction
from django.urls import reverse
from django.utils import timezone

from portal.events import after_commit
from portal.exceptions import ConflictError, Invalid, NotAllowed, ReadOnlyTenant
from portal.extensions import namespace_check, reserved_name
from portal.notify import notify_send

from . import invitation_states, policy
from .access import Actor, has_perm, permissions_sync, permissions_sync_tenant
from .audit import audit_record, snapshot
from .authentication import token_generate
from .guards import require, require_ops
from .models import ApiToken, Invitation, Membership, Project, Role, SupersededInvitationLink, Tenant
from .selectors import signup_usernames_for
from .states import PROJECT_FIELDS, TENANT_FIELDS, project_move, tenant_move

logger = logging.getLogger(__name__)

MEMBERSHIP_FIELDS = ["user", "tenant", "project", "role"]
TOKEN_FIELDS = ["name", "project", "scope", "expires_at", "revoked_at"]
MAX_TOKEN_DAYS = 366


def _require_writable(actor: Actor, tenant: Tenant) -> None:
    """A suspended tenant is read-only for everyone but ops."""
    if not policy.may_write_in(actor, tenant):
        raise ReadOnlyTenant(f"Tenant {tenant.slug} is suspended: its data can be read but not changed.")


def _tenant_locked(tenant: Tenant) -> Tenant:
    """Re-read the tenant under a row lock: its status decides whether writes are allowed, and the
    lock serialises membership and project changes within one tenant."""
    return Tenant.objects.select_for_update().get(pk=tenant.pk)


# Tenants ---------------------------------------------------------------------------------------


@transaction.atomic
def tenant_create(*, actor: Actor, name: str, slug: str, cost_centre: str = "", contact_email: str = "") -> Tenant:
    require_ops(actor, "Only platform ops create tenants.")
    tenant = Tenant(name=name, slug=slug, cost_centre=cost_centre, contact_email=contact_email)
    tenant.full_clean()
    tenant.save()
    audit_record(actor=actor, action="tenant.create", target=tenant, tenant=tenant, after=snapshot(tenant, TENANT_FIELDS))
    return tenant


@transaction.atomic
def tenant_update(*, actor: Actor, tenant: Tenant, **changes: Any) -> Tenant:
    tenant = Tenant.objects.select_for_update().get(pk=tenant.pk)
    require(policy.may_change_tenant(actor, tenant), "Only tenant admins and ops change a tenant.")
    if "status" in changes and changes["status"] != tenant.status:
        require_ops(actor, "Only platform ops suspend or reactivate a tenant.")
    elif not ("status" in changes and changes["status"] == Tenant.Status.ACTIVE):
        _require_writable(actor, tenant)
    if "slug" in changes and changes["slug"] != tenant.slug:
        raise Invalid("The slug cannot change: it names cluster objects.", field="slug")
    status = changes.pop("status", tenant.status)
    if status not in Tenant.Status.values:
        raise Invalid(f"Unknown tenant status {status!r}.", field="status")
    if changes or status == tenant.status:
        before = snapshot(tenant, TENANT_FIELDS)
        for field, value in changes.items():
            setattr(tenant, field, value)
        tenant.full_clean()
        tenant.save()
        audit_record(actor=actor, action="tenant.update", target=tenant, tenant=tenant, before=before,
                     after=snapshot(tenant, TENANT_FIELDS))
    if status != tenant.status:  # suspend or reactivate: through the state machine (tenants/states.py)
        tenant_move(tenant, to=status, actor=actor)
    return tenant


# Projects --------------------------------------------------------------------------------------


def project_namespace(tenant_slug: str, slug: str) -> str:
    """A new project's namespace, fixed at creation: the slug when it already starts with ``<tenant>-``
    (the convention, e.g. ``acme-vision``), else ``<tenant>-<slug>``. The tenant prefix keeps a project
    away from namespaces other tenants' projects or the platform use (docs/ownership.md)."""
    return slug if slug.startswith(f"{tenant_slug}-") else f"{tenant_slug}-{slug}"


def _check_namespace(tenant: Tenant, slug: str) -> str:
    """The namespace for a new project, or Invalid (field ``slug``): reserved, too long, taken, or it
    exists on a registered cluster without our labels (never adopted silently; ops may adopt it). quotas
    answers the cluster questions through two enforcing slots (``portal.extensions``): if one fails, the project
    is refused with the slot's sentence (``ExtensionUnavailable``, field ``slug``)."""
    if not slug:
        return slug
    if reserved_name.call(slug):
        raise Invalid(f"{slug} is a reserved name (Kubernetes, GPU operator, Kueue, Volcano, HAMi...): choose another slug.",
                      field="slug")
    namespace = project_namespace(tenant.slug, slug)
    if len(namespace) > 63:
        raise Invalid(f"The namespace {namespace} would be longer than 63 characters: choose a shorter slug.", field="slug")
    if Project.objects.filter(cluster_namespace=namespace).exists():
        raise Invalid(f"The namespace {namespace} is not available: choose another slug.", field="slug")
    problem = namespace_check.call(namespace, project_slug=slug)
    if problem:
        raise Invalid(problem, field="slug")
    return namespace


PROJECT_SLUG_NOT_AVAILABLE = "This slug is not available: choose another."
PROJECT_SLUG_IN_TENANT = "This tenant already has a project with this slug."


@transaction.atomic
def project_create(*, actor: Actor, tenant: Tenant, name: str, slug: str, description: str = "") -> Project:
    tenant = _tenant_locked(tenant)
    require(policy.may_change_tenant(actor, tenant), "Only tenant admins and ops create projects.")
    _require_writable(actor, tenant)
    project = Project(tenant=tenant, name=name, slug=slug, description=description)
    # Slugs are unique portal-wide, but another tenant's project is a 404 to this actor: say "not available",
    # never "exists", and never whose (docs/security.md). The model's own message would confirm it.
    taken = Project.objects.filter(slug=slug).values_list("tenant_id", flat=True).first() if slug else None
    if taken is not None:
        raise Invalid(PROJECT_SLUG_IN_TENANT if taken == tenant.pk else PROJECT_SLUG_NOT_AVAILABLE, field="slug")
    project.full_clean()
    project.cluster_namespace = _check_namespace(tenant, slug)
    try:
        with transaction.atomic():
            project.save()
    except IntegrityError:  # the same slug or namespace saved a moment ago by someone else
        raise Invalid(PROJECT_SLUG_NOT_AVAILABLE, field="slug") from None
    # Tenant admins hold permissions on every project of their tenant, this new one included.
    permissions_sync_tenant(tenant=tenant)
    audit_record(
        actor=actor, action="project.create", target=project, tenant=tenant, project=project,
        after=snapshot(project, PROJECT_FIELDS),
    )
    return project


@transaction.atomic
def project_update(*, actor: Actor, project: Project, **changes: Any) -> Project:
    project = Project.objects.select_for_update(of=("self",)).select_related("tenant").get(pk=project.pk)
    require(policy.may_change_project(actor, project), "Only project admins, tenant admins and ops change a project.")
    _require_writable(actor, project.tenant)
    if "slug" in changes and changes["slug"] != project.slug:
        raise Invalid("The slug cannot change: it is the project's namespace.", field="slug")
    if "status" in changes and changes["status"] != project.status:
        require(policy.may_change_tenant(actor, project.tenant), "Only tenant admins and ops archive or restore a project.")
    if changes.get("notebooks_open_to_approvers", project.notebooks_open_to_approvers) != project.notebooks_open_to_approvers:
        # Approvers would grant themselves access to other people's notebooks: the tenant admins decide.
        require(policy.may_change_tenant(actor, project.tenant), "Only tenant admins and ops let approvers open members' notebooks.")
    status = changes.pop("status", project.status)
    if status not in Project.Status.values:
        raise Invalid(f"Unknown project status {status!r}.", field="status")
    if changes or status == project.status:
        before = snapshot(project, PROJECT_FIELDS)
        for field, value in changes.items():
            setattr(project, field, value)
        project.full_clean()
        project.save()
        audit_record(actor=actor, action="project.update", target=project, tenant=project.tenant, project=project,
                     before=before, after=snapshot(project, PROJECT_FIELDS))
    if status != project.status:  # archive (the namespace's retention starts) or restore: tenants/states.py
        project_move(project, to=status, actor=actor)
    return project


# Memberships -----------------------------------------------------------------------------------


def _check_membership_shape(*, tenant: Tenant, project: Project | None, role: str) -> None:
    if role not in Role.values:
        raise Invalid(f"Unknown role {role!r}.", field="role")
    if role == Role.TENANT_ADMIN and project is not None:
        raise Invalid("A tenant admin is a member of the tenant, not of one project: leave project empty.", field="project")
    if role != Role.TENANT_ADMIN and project is None:
        raise Invalid("This role is held in a project: choose one.", field="project")
    if project is not None and project.tenant_id != tenant.pk:
        raise Invalid("The project belongs to another tenant.", field="project")


@transaction.atomic
def membership_create(*, actor: Actor, tenant: Tenant, user: Any, role: str, project: Project | None = None) -> Membership:
    tenant = _tenant_locked(tenant)
    require(policy.may_manage_members(actor, tenant), "Only tenant admins and ops manage members.")
    _require_writable(actor, tenant)
    _check_membership_shape(tenant=tenant, project=project, role=role)
    return _membership_insert(actor=actor, tenant=tenant, user=user, role=role, project=project)


def _membership_insert(*, actor: Actor, tenant: Tenant, user: Any, role: str, project: Project | None,
                       already: str | None = None) -> Membership:
    """Write a checked membership (the tenant row locked by the caller), sync permissions, audit."""
    if Membership.objects.filter(user=user, tenant=tenant, project=project).exists():
        where = project.slug if project else tenant.slug
        raise ConflictError(already or f"{user.get_username()} already has a role in {where}; change that role instead.",
                            field="user")
    try:
        with transaction.atomic():
            membership = Membership.objects.create(user=user, tenant=tenant, project=project, role=role)
    except IntegrityError:
        raise ConflictError(already or "That user already has a role there.", field="user") from None
    permissions_sync(user=user, tenant=tenant)
    audit_record(
        actor=actor, action="membership.create", target=membership, tenant=tenant, project=project,
        after=snapshot(membership, MEMBERSHIP_FIELDS),
    )
    return membership


@transaction.atomic
def membership_update(*, actor: Actor, membership: Membership, role: str) -> Membership:
    membership = Membership.objects.select_for_update(of=("self",)).select_related("tenant", "project", "user").get(pk=membership.pk)
    require(policy.may_manage_members(actor, membership.tenant), "Only tenant admins and ops manage members.")
    _require_writable(actor, membership.tenant)
    _check_membership_shape(tenant=membership.tenant, project=membership.project, role=role)
    _guard_last_admin(membership, new_role=role)
    before = snapshot(membership, MEMBERSHIP_FIELDS)
    membership.role = role
    membership.save(update_fields=["role"])
    permissions_sync(user=membership.user, tenant=membership.tenant)
    audit_record(
        actor=actor, action="membership.update", target=membership, tenant=membership.tenant,
        project=membership.project, before=before, after=snapshot(membership, MEMBERSHIP_FIELDS),
    )
    return membership


@transaction.atomic
def membership_delete(*, actor: Actor, membership: Membership) -> None:
    membership = Membership.objects.select_for_update(of=("self",)).select_related("tenant", "project", "user").get(pk=membership.pk)
    require(policy.may_manage_members(actor, membership.tenant), "Only tenant admins and ops manage members.")
    _require_writable(actor, membership.tenant)
    _guard_last_admin(membership, new_role=None)
    before = snapshot(membership, MEMBERSHIP_FIELDS)
    user, tenant, project = membership.user, membership.tenant, membership.project
    audit_record(actor=actor, action="membership.delete", target=membership, tenant=tenant, project=project, before=before)
    membership.delete()
    permissions_sync(user=user, tenant=tenant)
    # A user's tokens for a project they no longer belong to stop working at once.
    if project is not None and not Membership.objects.filter(user=user, tenant=tenant, role=Role.TENANT_ADMIN).exists():
        ApiToken.objects.filter(user=user, project=project, revoked_at__isnull=True).update(revoked_at=timezone.now())
    elif project is None:
        still = Membership.objects.filter(user=user, tenant=tenant).values("project_id")
        ApiToken.objects.filter(user=user, project__tenant=tenant, revoked_at__isnull=True).exclude(
            project_id__in=still
        ).update(revoked_at=timezone.now())


def _guard_last_admin(membership: Membership, *, new_role: str | None) -> None:
    """Keep at least one tenant admin, so a tenant can't lock itself out."""
    if membership.role != Role.TENANT_ADMIN or new_role == Role.TENANT_ADMIN:
        return
    others = Membership.objects.filter(tenant=membership.tenant, role=Role.TENANT_ADMIN).exclude(pk=membership.pk)
    if not others.exists():
        raise ConflictError("This is the tenant's last tenant admin: add another one first.", field="role")


def user_by_name(username: str) -> Any:
    """Any active user by name: for ops only (they see every user anyway)."""
    User = get_user_model()
    try:
        return User.objects.get(username=username, is_active=True)
    except User.DoesNotExist:
        raise Invalid(f"No active user named {username!r}.", field="user") from None


def tenant_member_by_name(*, actor: Actor, tenant: Tenant, username: str) -> Any:
    """A user to give a role in ``tenant`` by name: for tenant admins, only someone who already holds
    a role in the tenant. The answer is the same whether the name is unknown or belongs to someone of
    another tenant, so nobody learns which usernames exist elsewhere; newcomers are invited by email.
    Ops (who see every user) may name anyone active."""
    if actor.is_ops or actor.user is None:
        return user_by_name(username)
    from .selectors import tenant_members

    found = tenant_members(tenant=tenant).filter(username=username).first()
    if found is None:
        raise Invalid(f"{tenant.name} has no member named {username!r}. Invite newcomers by email.", field="user")
    return found


# Invitations -----------------------------------------------------------------------------------


def invitation_secret_hash(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def invitation_link(secret: str, base_url: str = "") -> str:
    """The accept page's address: ``PORTAL_BASE_URL`` when set, else ``base_url`` (the inviting
    request's own scheme and host)."""
    base = (getattr(settings, "PORTAL_BASE_URL", "") or base_url or "").rstrip("/")
    return base + reverse("invitation-accept", kwargs={"secret": secret})


def _invitation_expiry() -> datetime:
    return timezone.now() + timedelta(days=settings.PORTAL_INVITATION_DAYS)


def _invitation_send(invitation: Invitation, *, secret: str, base_url: str, inviter: str) -> None:
    """Email the link once the transaction commits (a rolled-back invitation mails nobody); a mail
    failure is logged, never raised: the invitation exists and can be sent again."""
    project = invitation.project  # None for a tenant-wide invitation (no query then)
    where = f"project {project.name} ({project.slug}) of {invitation.tenant.name}" if project is not None \
        else invitation.tenant.name
    link = invitation_link(secret, base_url)
    subject = f"[GPU portal] {inviter} invites you to {invitation.tenant.name}"
    body = (
        f"{inviter} invites you to join {where} on the GPU portal as {invitation.get_role_display()}.\n\n"
        f"Accept the invitation here (sign in, or choose a username and password if you are new):\n{link}\n\n"
        f"The link works once, until {invitation.expires_at:%Y-%m-%d %H:%M} UTC. If you did not expect it, ignore this email.\n"
    )
    to = invitation.email

    after_commit(notify_send, subject=subject, body=body, to=[to], topic="invitation")


def _new_secret() -> tuple[str, str]:
    secret = secrets.token_urlsafe(32)
    return secret, invitation_secret_hash(secret)


@transaction.atomic
def invitation_create(
    *, actor: Actor, tenant: Tenant, email: str, role: str, project: Project | None = None, base_url: str = ""
) -> Invitation:
    """Invite ``email`` to hold ``role`` in ``tenant`` (tenant admins) or in ``project``; the link is emailed.

    Nothing here looks at user accounts: whether the address belongs to someone already is learnt by
    nobody but the person who opens the link."""
    if actor.token is not None:
        raise NotAllowed("API tokens cannot invite people; sign in to invite.")
    tenant = _tenant_locked(tenant)
    require(policy.may_manage_members(actor, tenant), "Only tenant admins and ops invite members.")
    _require_writable(actor, tenant)
    email = (email or "").strip().lower()
    try:
        validate_email(email)
    except ValidationError:
        raise Invalid("Enter a valid email address.", field="email") from None
    _check_membership_shape(tenant=tenant, project=project, role=role)
    if project is not None and not project.is_active:
        raise Invalid("The project is archived.", field="project")
    pending = Invitation.objects.filter(tenant=tenant, project=project, email=email, status=Invitation.Status.PENDING)
    if pending.filter(expires_at__gt=timezone.now()).exists():
        raise ConflictError(f"{email} already has a pending invitation there: send it again from the list instead.", field="email")
    for overdue in pending:
        invitation_expire(invitation=overdue)
    secret, digest = _new_secret()
    invitation = Invitation(
        tenant=tenant, project=project, role=role, email=email, secret_hash=digest,
        invited_by=actor.user if actor.user is not None and actor.user.is_authenticated else None,
        expires_at=_invitation_expiry(), sent_at=timezone.now(), send_count=1,
    )
    invitation.full_clean(exclude=["invited_by", "tenant", "project"])
    try:
        with transaction.atomic():
            invitation.save()
    except IntegrityError:
        raise ConflictError(f"{email} already has a pending invitation there.", field="email") from None
    audit_record(actor=actor, action="invitation.create", target=invitation, tenant=tenant, project=project,
                 after=invitation_states.invitation_snapshot(invitation))
    _invitation_send(invitation, secret=secret, base_url=base_url, inviter=actor.label)
    return invitation


@transaction.atomic
def invitation_resend(*, actor: Actor, invitation: Invitation, base_url: str = "") -> Invitation:
    """Send a pending or expired invitation again: a new link (the old one stops working) and a new expiry."""
    if actor.token is not None:
        raise NotAllowed("API tokens cannot invite people; sign in to invite.")
    tenant = _tenant_locked(invitation.tenant)
    require(policy.may_manage_members(actor, tenant), "Only tenant admins and ops invite members.")
    _require_writable(actor, tenant)
    secret, digest = _new_secret()
    fields = {"secret_hash": digest, "expires_at": _invitation_expiry(), "sent_at": timezone.now()}
    current = (Invitation.objects.select_for_update(of=("self",)).select_related("tenant", "project")
               .filter(pk=invitation.pk).first())
    moved: Invitation | None = None
    if current is not None and current.status in (Invitation.Status.PENDING, Invitation.Status.EXPIRED):
        # The old link stops working; its page will say that a newer invitation was sent.
        SupersededInvitationLink.objects.get_or_create(secret_hash=current.secret_hash, defaults={"invitation": current})
    if current is not None and current.status == Invitation.Status.PENDING:
        # Still pending: the status stays; the row gets the new link (the lock keeps an accept out meanwhile).
        before = invitation_states.invitation_snapshot(current)
        Invitation.objects.filter(pk=current.pk).update(send_count=current.send_count + 1, **fields)
        current.refresh_from_db()
        audit_record(actor=actor, action="invitation.resend", target=current, tenant=tenant, project=current.project,
                     before=before, after=invitation_states.invitation_snapshot(current))
        moved = current
    elif current is not None:
        try:
            with transaction.atomic():
                moved = invitation_states.move(current, to=Invitation.Status.PENDING, actor=actor, action="invitation.resend",
                                               fields={**fields, "send_count": current.send_count + 1})
        except IntegrityError:
            raise ConflictError(f"{current.email} has a newer pending invitation there: send that one again instead.") from None
    if moved is None:
        raise ConflictError(f"This invitation was {_status_word(invitation.pk)}: it cannot be sent again. Invite again instead.")
    _invitation_send(moved, secret=secret, base_url=base_url, inviter=actor.label)
    return moved


def _status_word(pk: int) -> str:
    status = Invitation.objects.filter(pk=pk).values_list("status", flat=True).first()
    return Invitation.Status(status).label.lower() if status else "removed"


@transaction.atomic
def invitation_revoke(*, actor: Actor, invitation: Invitation) -> Invitation:
    """Withdraw a pending or expired invitation: its link stops working. Revoking twice is a no-op."""
    if actor.token is not None:
        raise NotAllowed("API tokens cannot manage invitations; sign in.")
    tenant = _tenant_locked(invitation.tenant)
    require(policy.may_manage_members(actor, tenant), "Only tenant admins and ops revoke invitations.")
    _require_writable(actor, tenant)
    moved = invitation_states.move(invitation, to=Invitation.Status.REVOKED, actor=actor, action="invitation.revoke",
                                   fields={"revoked_at": timezone.now()})
    if moved is not None:
        return moved
    current = Invitation.objects.select_related("tenant", "project").get(pk=invitation.pk)
    if current.status == Invitation.Status.REVOKED:
        return current
    raise ConflictError(f"This invitation was already {current.get_status_display().lower()}: there is nothing to revoke.")


def invitation_expire(*, invitation: Invitation) -> bool:
    """Move an overdue pending invitation to expired (the system's move); True when this call did."""
    return invitation_states.move(
        invitation, to=Invitation.Status.EXPIRED, actor=Actor.system(), action="invitation.expire",
        where={"expires_at__lte": timezone.now()},
    ) is not None


def invitations_expire_overdue() -> int:
    """Expire every overdue pending invitation (the periodic task); returns how many moved."""
    overdue = Invitation.objects.filter(status=Invitation.Status.PENDING, expires_at__lte=timezone.now()).order_by("pk")
    return sum(invitation_expire(invitation=invitation) for invitation in overdue)


def invitation_check_open(invitation: Invitation) -> None:
    """Refuse a link that no longer works, saying why (Invalid, field ``invitation``)."""
    status = invitation.status
    if status == Invitation.Status.PENDING and invitation.expires_at <= timezone.now():
        status = Invitation.Status.EXPIRED
    if status == Invitation.Status.ACCEPTED:
        raise Invalid("This invitation was already accepted: each link works once. Sign in instead.", field="invitation")
    if status == Invitation.Status.EXPIRED:
        raise Invalid("This invitation has expired. Ask whoever invited you to send it again.", field="invitation")
    if status == Invitation.Status.REVOKED:
        raise Invalid("This invitation was withdrawn. Ask the tenant's admins if you still need access.", field="invitation")


def invitation_accept(*, invitation: Invitation, user: Any, ip: str | None = None) -> Membership:
    """``user`` (signed in, or just signed up) takes the invitation's role. Single use: of two people
    using the same link at once, one wins (``invitation_states.move``)."""
    actor = Actor(user=user, ip=ip)
    with transaction.atomic():
        current = Invitation.objects.select_related("tenant", "project").get(pk=invitation.pk)
        invitation_check_open(current)
        _tenant_locked(current.tenant)  # the tenant before the invitation, as every admin's write locks them
        made: dict[str, Membership] = {}

        def effect(locked: Invitation) -> None:
            tenant = _tenant_locked(locked.tenant)
            if not tenant.is_active:
                raise ReadOnlyTenant(f"{tenant.name} is suspended: nobody can join it now. Try again once it is active.")
            project = locked.project
            if project is not None and not project.is_active:
                raise Invalid(f"Project {project.name} is archived: ask {tenant.name}'s admins to invite you elsewhere.",
                              field="invitation")
            where = project.name if project else tenant.name
            made["membership"] = _membership_insert(
                actor=actor, tenant=tenant, user=user, role=locked.role, project=project,
                already=f"You already have a role in {where}; ask its admins to change it.",
            )

        moved = invitation_states.move(
            current, to=Invitation.Status.ACCEPTED, actor=actor, action="invitation.accept",
            fields={"accepted_by": user, "accepted_at": timezone.now()}, where={"expires_at__gt": timezone.now()},
            effect=effect,
        )
        if moved is None:
            invitation_check_open(Invitation.objects.get(pk=invitation.pk))
            raise ConflictError("This invitation was used a moment ago: each link works once.", field="invitation")
    return made["membership"]


SIGNUP_CHOOSE_OFFERED = "Choose one of the usernames offered."


def invitation_signup(*, invitation: Invitation, username: str, password: str, ip: str | None = None) -> tuple[Any, Membership]:
    """A newcomer chooses a username and password on the accept page: the account (with the invited
    address) and the membership are made together, or neither is."""
    User = get_user_model()
    username = (username or "").strip()
    with transaction.atomic():
        invitation = Invitation.objects.select_related("tenant", "project").get(pk=invitation.pk)
        invitation_check_open(invitation)
        # Only a name the page offered (free when offered): a typed name would tell whether it exists.
        if username not in signup_usernames_for(invitation):
            raise Invalid(SIGNUP_CHOOSE_OFFERED, field="username")
        candidate = User(username=username, email=invitation.email)
        try:
            candidate.full_clean(exclude=["password", "username"])
        except ValidationError as exc:
            raise Invalid(" ".join(exc.messages), field="username") from None
        try:
            validate_password(password, user=candidate)
        except ValidationError as exc:
            raise Invalid(" ".join(exc.messages), field="password") from None
        try:
            with transaction.atomic():
                user = User.objects.create_user(username=username, email=invitation.email, password=password)
        except IntegrityError:  # taken a moment ago, between the check above and this insert
            raise Invalid(SIGNUP_CHOOSE_OFFERED, field="username") from None
        audit_record(actor=Actor(user=user, ip=ip), action="user.signup", target=user, tenant=invitation.tenant,
                     project=invitation.project, after={"username": username, "email": invitation.email})
        membership = invitation_accept(invitation=invitation, user=user, ip=ip)
    return user, membership


# Tokens ----------------------------------------------------------------------------------------


@transaction.atomic
def token_create(
    *, actor: Actor, project: Project, name: str, scope: str, expires_at: datetime | None = None
) -> tuple[ApiToken, str]:
    """Create a token; returns it and the raw secret, which is never stored or shown again."""
    if actor.token is not None:
        raise NotAllowed("API tokens cannot create tokens; sign in to create one.")
    require(policy.may_view_project(actor, project), "You are not a member of this project.")
    _require_writable(actor, project.tenant)
    if not project.is_active:
        raise Invalid("The project is archived.", field="project")
    if scope == ApiToken.Scope.SUBMIT:
        require(policy.may_submit(actor, project), "Your role in this project cannot submit, so neither can your token.")
    elif scope != ApiToken.Scope.READ:
        raise Invalid(f"Scope must be one of {', '.join(ApiToken.Scope.values)}.", field="scope")
    now = timezone.now()
    expires_at = expires_at or now + timedelta(days=90)
    if expires_at <= now:
        raise Invalid("The expiry must be in the future.", field="expires_at")
    if expires_at > now + timedelta(days=MAX_TOKEN_DAYS):
        raise Invalid(f"Tokens live at most {MAX_TOKEN_DAYS} days.", field="expires_at")
    raw, prefix, digest = token_generate()
    token = ApiToken(name=name, project=project, user=actor.user, scope=scope, prefix=prefix, secret_hash=digest, expires_at=expires_at)
    token.full_clean()
    token.save()
    audit_record(
        actor=actor, action="token.create", target=token, tenant=project.tenant, project=project,
        after=snapshot(token, TOKEN_FIELDS),
    )
    return token, raw


@transaction.atomic
def token_revoke(*, actor: Actor, token: ApiToken) -> ApiToken:
    token = ApiToken.objects.select_for_update(of=("self",)).select_related("project__tenant", "user").get(pk=token.pk)
    own = actor.user is not None and token.user_id == actor.user.pk and actor.token is None
    if not own and not (actor.token is None and has_perm(actor, "manage_members_tenant", token.project.tenant)):
        raise NotAllowed("Only the token's owner, tenant admins and ops revoke a token.")
    if token.revoked_at is not None:
        return token  # revoking twice is a no-op, not an error
    before = snapshot(token, TOKEN_FIELDS)
    token.revoked_at = timezone.now()
    token.save(update_fields=["revoked_at"])
    audit_record(
        actor=actor, action="token.revoke", target=token, tenant=token.project.tenant, project=token.project,
        before=before, after=snapshot(token, TOKEN_FIELDS),
    )
    return token


# Platform ops ----------------------------------------------------------------------------------


def _ops_snapshot(user: Any) -> dict[str, Any]:
    from .access import OPS_GROUP

    return {"is_staff": user.is_staff, "ops_group": user.groups.filter(name=OPS_GROUP).exists()}


def _forget_perms(user: Any) -> None:
    # is_ops() and Django cache permissions on the user object; this one may be the request's user.
    for attr in ("_portal_is_ops", "_perm_cache", "_user_perm_cache", "_group_perm_cache"):
        user.__dict__.pop(attr, None)


@transaction.atomic
def ops_user_ensure(*, actor: Actor, user: Any) -> bool:
    """Make ``user`` platform ops (staff in the ops group). Audited when it changes something;
    returns whether it did (making ops twice is a no-op, not an error)."""
    from django.contrib.auth.models import Group

    from .access import OPS_GROUP

    require_ops(actor, "Only platform ops make other users ops.")
    locked = get_user_model().objects.select_for_update().get(pk=user.pk)
    before = _ops_snapshot(locked)
    group, _ = Group.objects.get_or_create(name=OPS_GROUP)
    if not locked.is_staff:
        locked.is_staff = True
        locked.save(update_fields=["is_staff"])
    locked.groups.add(group)
    user.is_staff = True
    _forget_perms(user)
    after = _ops_snapshot(locked)
    if after == before:
        return False
    audit_record(actor=actor, action="user.make_ops", target=locked, before=before, after=after)
    return True


@transaction.atomic
def ops_user_remove(*, actor: Actor, user: Any) -> bool:
    """Take platform ops away from ``user`` (out of the ops group, no longer staff). Audited when it
    changes something; returns whether it did. Nobody removes their own ops role, so there is always
    someone left who can give it back."""
    from .access import OPS_GROUP

    require_ops(actor, "Only platform ops remove other users' ops role.")
    if actor.user is not None and actor.user.pk == user.pk:
        raise ConflictError("You cannot remove your own ops role: ask another ops user.", field="user")
    locked = get_user_model().objects.select_for_update().get(pk=user.pk)
    if locked.is_superuser:
        raise ConflictError(f"{locked.get_username()} is a superuser, which counts as ops; that is not changed here.", field="user")
    before = _ops_snapshot(locked)
    locked.groups.remove(*locked.groups.filter(name=OPS_GROUP))
    if locked.is_staff:
        locked.is_staff = False
        locked.save(update_fields=["is_staff"])
    user.is_staff = False
    _forget_perms(user)
    after = _ops_snapshot(locked)
    if after == before:
        return False
    audit_record(actor=actor, action="user.remove_ops", target=locked, before=before, after=after)
    return True
