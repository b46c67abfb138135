"""Single sign-on's writes: users made on first sign-in, roles from the provider's groups, the login settings
and the group mappings ops edit (docs/security.md "Single sign-on").

Roles go through the membership services (``tenants.services``), so permissions are re-synced and every
change is audited like an admin's. Single sign-on only takes away roles it gave itself
(``OidcIdentity.managed``): a role given by hand or by invitation stays when a group goes.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.db import transaction
from django.utils import timezone

from portal.events import after_commit
from portal.exceptions import ConflictError, Invalid, PortalError
from portal.notify import notify_send

from . import policy, services
from .access import Actor
from .audit import audit_record, snapshot
from .guards import require
from .models import ApiToken, GroupMapping, Invitation, LoginSettings, Membership, OidcIdentity, Project, Role, Tenant

logger = logging.getLogger(__name__)

MAPPING_FIELDS = ["group", "match", "tenant", "project", "role"]
LOGIN_SETTINGS_FIELDS = ["password_login_staff_only", "default_role"]
# The stronger role wins where two groups give roles in the same place.
STRENGTH = {Role.VIEWER: 1, Role.MEMBER: 2, Role.PROJECT_ADMIN: 3, Role.TENANT_ADMIN: 4}
SLUG = r"[a-z0-9](?:[-a-z0-9]*?[a-z0-9])?"

Place = tuple[int, int | None]  # (tenant id, project id or None for the tenant itself)


# The login settings (one row) ------------------------------------------------------------------


def login_settings_get() -> LoginSettings:
    """The login settings; the defaults until ops first save them."""
    return LoginSettings.objects.filter(pk=1).first() or LoginSettings(pk=1)


@transaction.atomic
def login_settings_update(*, actor: Actor, password_login_staff_only: bool, default_role: str) -> LoginSettings:
    require(policy.may_manage_identity(actor), "Only platform ops change how people sign in.")
    if default_role not in Role.values:
        raise Invalid(f"Unknown role {default_role!r}.", field="default_role")
    if default_role == Role.TENANT_ADMIN:
        raise Invalid("The default role cannot be tenant admin: name that role on the mapping itself.", field="default_role")
    if password_login_staff_only and not (settings.OIDC_ISSUER and settings.OIDC_RP_CLIENT_ID):
        # Nobody but staff could sign in at all.
        raise Invalid("Single sign-on is not configured: password sign-in must stay open to everyone.",
                      field="password_login_staff_only")
    row, _ = LoginSettings.objects.select_for_update().get_or_create(pk=1)
    before = snapshot(row, LOGIN_SETTINGS_FIELDS)
    row.password_login_staff_only = password_login_staff_only
    row.default_role = default_role
    row.save()
    audit_record(actor=actor, action="login_settings.update", target=row, before=before,
                 after=snapshot(row, LOGIN_SETTINGS_FIELDS))
    return row


# Group mappings -----------------------------------------------------------------------------------


def pattern_regex(pattern: str) -> re.Pattern[str]:
    """``gpu-{tenant}-admins`` as a regular expression with the named groups ``tenant`` and ``project``;
    ``*`` and ``?`` work as in a glob."""
    parts = re.split(r"(\{tenant\}|\{project\})", pattern)
    out = []
    for part in parts:
        if part in ("{tenant}", "{project}"):
            out.append(f"(?P<{part[1:-1]}>{SLUG})")
        elif part:
            out.append("".join(".*?" if c == "*" else "." if c == "?" else re.escape(c) for c in part))
    return re.compile("".join(out), re.IGNORECASE)


def _check_mapping(*, group: str, match: str, tenant: Tenant | None, project: Project | None, role: str) -> None:
    group = group.strip()
    if not group:
        raise Invalid("Name a group or a pattern.", field="group")
    if match not in GroupMapping.Match.values:
        raise Invalid("Choose exact or pattern.", field="match")
    if role and role not in Role.values:
        raise Invalid(f"Unknown role {role!r}.", field="role")
    if match == GroupMapping.Match.EXACT:
        if tenant is None:
            raise Invalid("An exact group names its tenant.", field="tenant")
        if "{" in group:
            raise Invalid("{tenant} and {project} belong in patterns: choose pattern.", field="match")
    else:
        if "{tenant}" not in group and "{project}" not in group:
            raise Invalid("A pattern holds {tenant} or {project}, e.g. gpu-{tenant}-admins.", field="group")
        if tenant is not None or project is not None:
            raise Invalid("A pattern finds its tenant in the group's name: leave tenant and project empty.", field="tenant")
        try:
            pattern_regex(group)
        except re.error as exc:
            raise Invalid(f"Not a usable pattern: {exc}.", field="group") from None
    if project is not None and tenant is not None and project.tenant_id != tenant.pk:
        raise Invalid("The project belongs to another tenant.", field="project")
    if role == Role.TENANT_ADMIN and project is not None:
        raise Invalid("A tenant admin holds the tenant, not one project: leave project empty.", field="project")
    if role == Role.TENANT_ADMIN and "{project}" in group:
        raise Invalid("A tenant admin holds the tenant: a pattern for it names {tenant} only.", field="group")


@transaction.atomic
def group_mapping_create(*, actor: Actor, group: str, match: str, role: str, tenant: Tenant | None = None,
                         project: Project | None = None) -> GroupMapping:
    require(policy.may_manage_identity(actor), "Only platform ops map groups to roles.")
    _check_mapping(group=group, match=match, tenant=tenant, project=project, role=role)
    mapping = GroupMapping.objects.create(group=group.strip(), match=match, tenant=tenant, project=project, role=role)
    audit_record(actor=actor, action="group_mapping.create", target=mapping, tenant=tenant, project=project,
                 after=snapshot(mapping, MAPPING_FIELDS))
    return mapping


@transaction.atomic
def group_mapping_delete(*, actor: Actor, mapping: GroupMapping) -> None:
    require(policy.may_manage_identity(actor), "Only platform ops map groups to roles.")
    mapping = GroupMapping.objects.select_for_update().get(pk=mapping.pk)
    audit_record(actor=actor, action="group_mapping.delete", target=mapping, tenant=mapping.tenant,
                 project=mapping.project, before=snapshot(mapping, MAPPING_FIELDS))
    mapping.delete()


# From groups to roles (pure, given the rows) -----------------------------------------------------


@dataclass(frozen=True)
class Rule:
    """One mapping, as the matcher needs it."""

    group: str
    match: str
    role: str
    tenant_id: int | None = None
    project_id: int | None = None


@dataclass(frozen=True)
class Directory:
    """The tenants and projects a pattern may name: slug -> id, and each tenant's active projects."""

    tenants: dict[str, int]
    projects: dict[str, tuple[int, int]]  # project slug -> (tenant id, project id)
    active_projects: dict[int, list[int]]  # tenant id -> its active projects' ids


def _stronger(found: dict[Place, str], place: Place, role: str) -> None:
    if STRENGTH[role] > STRENGTH.get(found.get(place, ""), 0):
        found[place] = role


def roles_from_groups(groups: Iterable[str], rules: Iterable[Rule], directory: Directory,
                      default_role: str) -> dict[Place, str]:
    """The role the groups give in each place: ``{(tenant id, project id or None): role}``.

    A tenant-wide non-admin role (a mapping with a tenant but no project) is held in every active project of
    the tenant; a pattern's ``{project}`` must name a project of the ``{tenant}`` it names (when it names one)."""
    found: dict[Place, str] = {}
    groups = [g for g in groups if isinstance(g, str)]
    for rule in rules:
        role = rule.role or default_role
        for group in groups:
            tenant_id, project_id = rule.tenant_id, rule.project_id
            if rule.match == GroupMapping.Match.EXACT:
                if group != rule.group:
                    continue
            else:
                hit = pattern_regex(rule.group).fullmatch(group)
                if hit is None:
                    continue
                names = hit.groupdict()
                tenant_id = directory.tenants.get((names.get("tenant") or "").lower())
                if names.get("project") is not None:
                    owner_project = directory.projects.get(names["project"].lower())
                    if owner_project is None or (names.get("tenant") is not None and owner_project[0] != tenant_id):
                        continue
                    tenant_id, project_id = owner_project
                if tenant_id is None:
                    continue
            if role == Role.TENANT_ADMIN:
                _stronger(found, (tenant_id, None), role)
            elif project_id is not None:
                _stronger(found, (tenant_id, project_id), role)
            else:
                for pid in directory.active_projects.get(tenant_id, []):
                    _stronger(found, (tenant_id, pid), role)
    return found


def _rules_and_directory() -> tuple[list[Rule], Directory]:
    rules = [Rule(group=m.group, match=m.match, role=m.role, tenant_id=m.tenant_id, project_id=m.project_id)
             for m in GroupMapping.objects.all()]
    tenants = dict(Tenant.objects.filter(status=Tenant.Status.ACTIVE).values_list("slug", "pk"))
    projects: dict[str, tuple[int, int]] = {}
    active: dict[int, list[int]] = {}
    for pid, slug, tid in Project.objects.filter(status=Project.Status.ACTIVE, tenant__status=Tenant.Status.ACTIVE) \
            .values_list("pk", "slug", "tenant_id"):
        projects[slug] = (tid, pid)
        active.setdefault(tid, []).append(pid)
    return rules, Directory(tenants=tenants, projects=projects, active_projects=active)


# Users and their roles at each sign-in -----------------------------------------------------------


def _free_username(wanted: str) -> str:
    User = get_user_model()
    base = re.sub(r"[^\w.@+-]", "-", wanted or "")[:140].strip("-") or "sso-user"
    name, n = base, 1
    while User.objects.filter(username__iexact=name).exists():
        n += 1
        name = f"{base}-{n}"
    return name


@transaction.atomic
def identity_user_create(*, issuer: str, subject: str, username: str, email: str, ip: str | None = None) -> Any:
    """The user of a first sign-in: a new account (no usable password) bound to (issuer, subject).

    Never matched to an existing account by name or email: whoever controls an address at the provider would
    take over the local account of the same address."""
    User = get_user_model()
    user = User.objects.create_user(username=_free_username(username), email=email)
    OidcIdentity.objects.create(user=user, issuer=issuer, subject=subject, email=email)
    audit_record(actor=Actor(user=user, ip=ip), action="user.sso_create", target=user,
                 after={"username": user.get_username(), "email": email, "issuer": issuer, "subject": subject})
    return user


@dataclass
class SyncResult:
    added: list[str]
    changed: list[str]
    removed: list[str]
    kept: list[str]
    invitations: list[str]


def _where(place: Place, names: dict[int, str], pnames: dict[int, str]) -> str:
    tenant_id, project_id = place
    return pnames.get(project_id, "?") if project_id else names.get(tenant_id, "?")


def identity_sync(*, user: Any, issuer: str, subject: str, claims: dict[str, Any], groups: list[str],
                  invitation_secret: str | None = None, verified_email: str = "",
                  ip: str | None = None) -> SyncResult:
    """At each sign-in: the roles the groups give now, through the membership services (one audit entry each),
    then invitations the person may take (the link they came with; pending invitations to their verified
    address). A role single sign-on gave and the groups no longer give is taken away, with the person's API
    tokens for the projects they left revoked, and they are told by email."""
    system = Actor.system()
    result = SyncResult(added=[], changed=[], removed=[], kept=[], invitations=[])
    with transaction.atomic():
        identity = OidcIdentity.objects.select_for_update().get(issuer=issuer, subject=subject)
        settings_row = login_settings_get()
        rules, directory = _rules_and_directory()
        wanted = roles_from_groups(groups, rules, directory, settings_row.default_role)
        managed: dict[Place, str] = {(t, p): r for t, p, r in identity.managed}
        names = {v: k for k, v in directory.tenants.items()}
        pnames = {pid: slug for slug, (_t, pid) in directory.projects.items()}
        current = {(m.tenant_id, m.project_id): m for m in
                   Membership.objects.filter(user=user).select_related("tenant", "project")}
        for m in current.values():
            names.setdefault(m.tenant_id, m.tenant.slug)
            if m.project_id:
                pnames.setdefault(m.project_id, m.project.slug)
        now_managed: dict[Place, str] = {}
        # Grants first, removals last: a tenant admin who becomes a project admin keeps their tokens there.
        for place, role in sorted(wanted.items(), key=lambda item: (item[0][0], item[0][1] or 0)):
            tenant_id, project_id = place
            where = _where(place, names, pnames)
            held = current.get(place)
            try:
                if held is None:
                    tenant = Tenant.objects.get(pk=tenant_id)
                    project = Project.objects.get(pk=project_id) if project_id else None
                    services.membership_create(actor=system, tenant=tenant, user=user, role=role, project=project)
                    result.added.append(f"{Role(role).label} of {where}")
                elif held.role != role and place in managed:
                    services.membership_update(actor=system, membership=held, role=role)
                    result.changed.append(f"{Role(role).label} of {where}")
                elif held.role != role:
                    # Given by hand or by invitation: an admin's choice stands; single sign-on does not own it.
                    continue
                now_managed[place] = role
            except PortalError as exc:
                logger.warning("single sign-on could not give %s %s of %s: %s", user, role, where, exc)
        lost_projects: list[Project] = []
        for place, role in managed.items():
            if place in wanted:
                continue
            held = current.get(place)
            if held is None or held.role != role:
                continue  # already gone, or an admin changed it: no longer single sign-on's
            where = _where(place, names, pnames)
            try:
                with transaction.atomic():
                    tokens = _tokens_lost(user, held)
                    for token in tokens:
                        services.token_revoke(actor=system, token=token)
                    services.membership_delete(actor=system, membership=held)
            except ConflictError as exc:
                # The tenant's last admin stays (an admin must name another first); said in the audit log.
                now_managed[place] = role
                result.kept.append(f"{Role(role).label} of {where}")
                logger.warning("single sign-on kept %s as %s of %s: %s", user, role, where, exc)
                continue
            result.removed.append(f"{Role(role).label} of {where}")
            lost_projects.extend(t.project for t in tokens)
        before = {"groups": identity.groups, "managed": identity.managed}
        identity.groups = sorted({g for g in groups if isinstance(g, str)})
        identity.managed = [[t, p, r] for (t, p), r in sorted(now_managed.items(), key=lambda i: (i[0][0], i[0][1] or 0))]
        identity.last_login_at = timezone.now()
        identity.email = verified_email or identity.email
        identity.save()
        if before != {"groups": identity.groups, "managed": identity.managed} or result.kept:
            audit_record(actor=Actor(user=user, ip=ip), action="user.sso_sync", target=identity,
                         before=before, after={"groups": identity.groups, "managed": identity.managed,
                                               "added": result.added, "changed": result.changed,
                                               "removed": result.removed, "kept": result.kept})
        if result.removed and user.email:
            _tell_lost(user, result, lost_projects)
    result.invitations = _take_invitations(user=user, invitation_secret=invitation_secret,
                                           email=verified_email, ip=ip)
    return result


def _tokens_lost(user: Any, membership: Membership) -> list[ApiToken]:
    """The live tokens ``user`` loses with ``membership``: its project's, or, for a tenant admin role, those of
    the tenant's projects where they hold no other role."""
    live = ApiToken.objects.filter(user=user, revoked_at__isnull=True).select_related("project__tenant")
    if membership.project_id is not None:
        if Membership.objects.filter(user=user, tenant_id=membership.tenant_id, role=Role.TENANT_ADMIN).exists():
            return []
        return list(live.filter(project_id=membership.project_id))
    still = Membership.objects.filter(user=user, tenant_id=membership.tenant_id, project__isnull=False).values("project_id")
    return list(live.filter(project__tenant_id=membership.tenant_id).exclude(project_id__in=still))


def _tell_lost(user: Any, result: SyncResult, lost_projects: list[Project]) -> None:
    lines = "\n".join(f"- {what}" for what in result.removed)
    tokens = ""
    if lost_projects:
        tokens = "\nYour API tokens for " + ", ".join(sorted({p.slug for p in lost_projects})) + " were revoked.\n"
    body = (f"Your groups at the identity provider changed, so the GPU portal took away these roles:\n{lines}\n{tokens}\n"
            "If this is a mistake, ask your identity administrators to restore the group.\n")
    after_commit(notify_send, subject="[GPU portal] Your access changed", body=body, to=[user.email], topic="sso")


def _take_invitations(*, user: Any, invitation_secret: str | None, email: str, ip: str | None) -> list[str]:
    """Accept the invitation whose link the person came with, and every pending invitation to their verified
    address; one that cannot be taken (a role already held, an archived project) is left as it is."""
    taken: list[str] = []
    candidates: list[Invitation] = []
    if invitation_secret:
        found = Invitation.objects.filter(secret_hash=services.invitation_secret_hash(invitation_secret)).first()
        if found is not None:
            candidates.append(found)
    if email:
        candidates.extend(Invitation.objects.filter(email=email.lower(), status=Invitation.Status.PENDING,
                                                    expires_at__gt=timezone.now()).order_by("pk"))
    seen: set[int] = set()
    for invitation in candidates:
        if invitation.pk in seen:
            continue
        seen.add(invitation.pk)
        try:
            membership = services.invitation_accept(invitation=invitation, user=user, ip=ip)
        except PortalError as exc:
            logger.info("single sign-on left invitation %s for %s: %s", invitation.pk, user, exc)
            continue
        taken.append(membership.project.name if membership.project_id else membership.tenant.name)
    return taken


def identity_for(user: Any) -> OidcIdentity | None:
    return OidcIdentity.objects.filter(user=user).first()


def rules_preview(groups: list[str]) -> list[str]:
    """What ``groups`` would give now, in words ("Member of acme-vision"): the mapping page's tester."""
    rules, directory = _rules_and_directory()
    found = roles_from_groups(groups, rules, directory, login_settings_get().default_role)
    tenants = {v: k for k, v in directory.tenants.items()}
    projects = {pid: slug for slug, (_t, pid) in directory.projects.items()}
    return sorted(f"{Role(role).label} of {projects.get(p, '?') if p else tenants.get(t, '?')}"
                  for (t, p), role in found.items())

