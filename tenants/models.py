"""Tenancy: tenants, projects, memberships with roles, API tokens and the append-only audit log."""

from __future__ import annotations

from django.conf import settings
from django.core.validators import RegexValidator
from django.db import models
from django.db.models import Q
from django.utils import timezone

DNS1123_LABEL = RegexValidator(
    r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$",
    "Use lower-case letters, digits and '-', starting and ending with a letter or digit (a DNS-1123 label).",
)


class Tenant(models.Model):
    """An organisation or department. A suspended tenant's users may read but not change anything."""

    class Status(models.TextChoices):
        ACTIVE = "active", "Active"
        SUSPENDED = "suspended", "Suspended"

    name = models.CharField(max_length=100, unique=True)
    slug = models.SlugField(max_length=40, unique=True, validators=[DNS1123_LABEL])
    cost_centre = models.CharField(max_length=60, blank=True)
    contact_email = models.EmailField(blank=True)
    status = models.CharField(max_length=12, choices=Status.choices, default=Status.ACTIVE)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["name"]
        permissions = [("manage_members_tenant", "Manage the tenant's members")]

    def __str__(self) -> str:
        return self.name

    @property
    def is_active(self) -> bool:
        return self.status == self.Status.ACTIVE


class Project(models.Model):
    """A project of one tenant. Its slug is unique portal-wide; its namespace is computed once at creation
    (``<tenant>-<slug>``, or the slug when it already starts with ``<tenant>-``; docs/ownership.md) and
    never changes."""

    class Status(models.TextChoices):
        ACTIVE = "active", "Active"
        ARCHIVED = "archived", "Archived"

    tenant = models.ForeignKey(Tenant, on_delete=models.PROTECT, related_name="projects")
    name = models.CharField(max_length=100)
    slug = models.CharField(max_length=63, unique=True, validators=[DNS1123_LABEL])
    description = models.TextField(blank=True, max_length=2000)
    status = models.CharField(max_length=12, choices=Status.choices, default=Status.ACTIVE)
    allow_custom_images = models.BooleanField(default=False, help_text="Requests may use images outside the curated list.")
    # Measured idleness (docs/measured-use.md, "Idle detection"): what may be stopped for it, by the project's word.
    cull_idle_notebooks_by_gpu = models.BooleanField(
        default=False, help_text="Cull idle notebooks by measured GPU use, as well as by portal activity.")
    stop_idle_batch_jobs = models.BooleanField(
        default=False, help_text="Stop training and batch inference jobs whose GPUs are measured idle.")
    notebooks_open_to_approvers = models.BooleanField(
        default=False, help_text="The project's approvers may open its members' running notebooks (off: only the requester)."
    )
    created_at = models.DateTimeField(auto_now_add=True)
    # Ownership of the namespace (docs/ownership.md). Empty only on rows made outside the services (the slug then).
    cluster_namespace = models.CharField(max_length=63, unique=True, null=True, blank=True, validators=[DNS1123_LABEL],
                                         help_text="The Kubernetes namespace, fixed at creation.")
    archived_at = models.DateTimeField(null=True, blank=True)
    namespace_adopted_at = models.DateTimeField(null=True, blank=True,
                                                help_text="Ops adopted a namespace that existed before the project.")
    namespace_released_at = models.DateTimeField(null=True, blank=True,
                                                 help_text="The archived project's namespace may be deleted (retention over or ops confirmed).")

    class Meta:
        ordering = ["tenant__name", "name"]
        constraints = [models.UniqueConstraint(fields=["tenant", "name"], name="project_name_unique_in_tenant")]
        permissions = [
            ("submit_project", "Submit requests in the project"),
            ("approve_project", "Approve the project's requests"),
            ("manage_members_project", "Manage the project's members"),
        ]

    def __str__(self) -> str:
        return f"{self.tenant.slug}/{self.slug}"

    @property
    def is_active(self) -> bool:
        return self.status == self.Status.ACTIVE

    @property
    def namespace(self) -> str:
        return self.cluster_namespace or self.slug


class Role(models.TextChoices):
    TENANT_ADMIN = "tenant_admin", "Tenant admin"
    PROJECT_ADMIN = "project_admin", "Project admin"
    MEMBER = "member", "Member"
    VIEWER = "viewer", "Viewer"


class Membership(models.Model):
    """A user's role in a tenant (tenant admin: no project) or in one project (the other roles)."""

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="memberships")
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="memberships")
    project = models.ForeignKey(Project, on_delete=models.CASCADE, null=True, blank=True, related_name="memberships")
    role = models.CharField(max_length=16, choices=Role.choices)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["tenant__name", "project__name", "user__username"]
        constraints = [
            models.UniqueConstraint(
                fields=["user", "tenant"], condition=Q(project__isnull=True), name="one_tenant_role_per_user"
            ),
            models.UniqueConstraint(fields=["user", "project"], name="one_project_role_per_user"),
            models.CheckConstraint(
                condition=(Q(role="tenant_admin", project__isnull=True) | (~Q(role="tenant_admin") & Q(project__isnull=False))),
                name="tenant_admin_has_no_project",
            ),
        ]

    def __str__(self) -> str:
        where = self.project.slug if self.project_id else self.tenant.slug
        return f"{self.user} is {self.get_role_display()} of {where}"


class ApiToken(models.Model):
    """A named, project-scoped token for CI. Only a hash of the secret is stored."""

    class Scope(models.TextChoices):
        READ = "read", "Read"
        SUBMIT = "read+submit", "Read and submit"

    name = models.CharField(max_length=80)
    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="tokens")
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="api_tokens")
    scope = models.CharField(max_length=12, choices=Scope.choices, default=Scope.READ)
    prefix = models.CharField(max_length=12, unique=True, help_text="Shown to tell tokens apart; not secret.")
    secret_hash = models.CharField(max_length=64)
    created_at = models.DateTimeField(auto_now_add=True)
    expires_at = models.DateTimeField()
    last_used_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return f"{self.name} ({self.prefix}…)"

    @property
    def tenant(self) -> Tenant:
        return self.project.tenant

    @property
    def can_submit(self) -> bool:
        return self.scope == self.Scope.SUBMIT


class Invitation(models.Model):
    """An invitation, by email, to hold a role in a tenant (tenant admins) or in one of its projects.

    The link carries a single-use secret; only its sha256 is stored. Accepting it (signed in, or
    signing up on the accept page) creates the membership. Its status moves only through
    ``tenants/invitation_states.py``: pending -> accepted | expired | revoked, expired -> pending
    (sent again) | revoked.
    """

    class Status(models.TextChoices):
        PENDING = "pending", "Pending"
        ACCEPTED = "accepted", "Accepted"
        EXPIRED = "expired", "Expired"
        REVOKED = "revoked", "Revoked"

    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="invitations")
    project = models.ForeignKey(Project, on_delete=models.CASCADE, null=True, blank=True, related_name="invitations")
    role = models.CharField(max_length=16, choices=Role.choices)
    email = models.EmailField(help_text="Where the link was sent (lower case).")
    status = models.CharField(max_length=10, choices=Status.choices, default=Status.PENDING)
    secret_hash = models.CharField(max_length=64, unique=True, help_text="sha256 of the link's secret; the secret is never stored.")
    invited_by = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, blank=True, related_name="+")
    created_at = models.DateTimeField(auto_now_add=True)
    sent_at = models.DateTimeField(null=True, blank=True)
    send_count = models.PositiveIntegerField(default=0)
    expires_at = models.DateTimeField()
    accepted_by = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, blank=True, related_name="+")
    accepted_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        constraints = [
            models.UniqueConstraint(
                fields=["tenant", "email"], condition=Q(status="pending", project__isnull=True),
                name="one_pending_tenant_invitation_per_email",
            ),
            models.UniqueConstraint(
                fields=["project", "email"], condition=Q(status="pending"), name="one_pending_project_invitation_per_email"
            ),
            models.CheckConstraint(
                condition=(Q(role="tenant_admin", project__isnull=True) | (~Q(role="tenant_admin") & Q(project__isnull=False))),
                name="invitation_tenant_admin_has_no_project",
            ),
        ]

    def __str__(self) -> str:
        where = self.project.slug if self.project_id else self.tenant.slug
        return f"{self.email} as {self.get_role_display()} of {where}"

    @property
    def overdue(self) -> bool:
        """Pending but past its expiry: the link no longer works (the status follows on the next touch)."""
        return self.status == self.Status.PENDING and self.expires_at <= timezone.now()

    @property
    def shown_status(self) -> str:
        return self.Status.EXPIRED.label if self.overdue else self.get_status_display()


class SupersededInvitationLink(models.Model):
    """A link an invitation had before it was sent again (``services.invitation_resend``): it opens nothing any
    more, but its page can say that a newer invitation was sent, instead of "not a valid invitation". Only the
    secret's sha256 is kept, as for the live link."""

    invitation = models.ForeignKey(Invitation, on_delete=models.CASCADE, related_name="superseded_links")
    secret_hash = models.CharField(max_length=64, unique=True)
    superseded_at = models.DateTimeField(default=timezone.now)

    def __str__(self) -> str:
        return f"old link of invitation {self.invitation_id}"


class AuditEntryQuerySet(models.QuerySet):
    def update(self, **kwargs):
        raise PermissionError("Audit entries are append-only.")

    def delete(self):
        raise PermissionError("Audit entries are append-only.")


class AuditEntry(models.Model):
    """One state-changing action. Written in the same transaction as the change; never changed.

    On PostgreSQL a trigger (migration 0002) also refuses UPDATE and DELETE of rows. The log is a
    hash chain (``tenants.audit``): entry ``seq`` n carries ``prev_hash`` (entry n-1's hash) and
    ``entry_hash`` (sha256 of its own fields and ``prev_hash``), so ``manage.py audit_verify`` finds
    any row changed, removed or added behind the portal's back, even by the tables' owner.
    """

    created_at = models.DateTimeField(default=timezone.now, editable=False, db_index=True)
    actor = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.DO_NOTHING, db_constraint=False, null=True, related_name="+"
    )
    token = models.ForeignKey(ApiToken, on_delete=models.DO_NOTHING, db_constraint=False, null=True, related_name="+")
    actor_label = models.CharField(max_length=200)
    action = models.CharField(max_length=60, db_index=True)
    target_type = models.CharField(max_length=60)
    target_id = models.CharField(max_length=64)
    target_repr = models.CharField(max_length=200)
    tenant = models.ForeignKey(Tenant, on_delete=models.DO_NOTHING, db_constraint=False, null=True, related_name="+")
    project = models.ForeignKey(Project, on_delete=models.DO_NOTHING, db_constraint=False, null=True, related_name="+")
    before = models.JSONField(null=True, blank=True)
    after = models.JSONField(null=True, blank=True)
    client_address = models.GenericIPAddressField(null=True, blank=True)
    seq = models.PositiveBigIntegerField(null=True, unique=True, editable=False)
    prev_hash = models.CharField(max_length=64, blank=True, default="", editable=False)
    entry_hash = models.CharField(max_length=64, blank=True, default="", editable=False)

    objects = AuditEntryQuerySet.as_manager()

    class Meta:
        ordering = ["-created_at", "-id"]
        verbose_name_plural = "audit entries"

    def __str__(self) -> str:
        return f"{self.created_at:%Y-%m-%d %H:%M} {self.actor_label} {self.action} {self.target_repr}"

    def save(self, *args, **kwargs):
        if self.pk is not None:
            raise PermissionError("Audit entries are append-only.")
        super().save(*args, **kwargs)

    def delete(self, *args, **kwargs):
        raise PermissionError("Audit entries are append-only.")


class AuditChainHead(models.Model):
    """The audit chain's last entry (one row): appends lock it, so writers take turns and cannot fork
    the chain, and ``audit_verify`` compares it with the log's end, so entries removed from the end
    (or the whole log, TRUNCATE) show."""

    seq = models.PositiveBigIntegerField(default=0)
    hash = models.CharField(max_length=64, blank=True, default="")

    def __str__(self) -> str:
        return f"audit chain head #{self.seq}"


class LoginThrottle(models.Model):
    """Sign-in attempts for one username or one client address (``tenants.throttle``).

    ``attempts`` counts the failed sign-ins of the current window, ``in_flight`` the password checks
    running now (reserved at ``in_flight_since`` at the latest); both are only read and written under a
    row lock, so parallel attempts cannot slip past the limits. Times are seconds since the epoch.
    """

    key = models.CharField(max_length=100, unique=True)
    attempts = models.PositiveIntegerField(default=0)
    window_start = models.FloatField(default=0)
    blocked_until = models.FloatField(default=0)
    in_flight = models.PositiveIntegerField(default=0)
    in_flight_since = models.FloatField(default=0)

    def __str__(self) -> str:
        return f"{self.key}: {self.attempts}"


# Single sign-on (tenants/oidc.py, tenants/identity.py; docs/security.md "Single sign-on") --------------------------


class GroupMapping(models.Model):
    """How a group of the identity provider becomes a role in the portal. Ops edit these at /ops/identity/.

    ``exact``: the group named ``group`` gives ``role`` in ``tenant`` (tenant admins) or in ``project``
    (the other roles; with no project, in every active project of the tenant). ``pattern``: ``group``
    holds ``{tenant}`` (and maybe ``{project}``), e.g. ``gpu-{tenant}-admins``; the slugs found in a
    group's name pick the tenant (and project). An empty role means the default role (``LoginSettings``).
    """

    class Match(models.TextChoices):
        EXACT = "exact", "Exact group name"
        PATTERN = "pattern", "Pattern with {tenant} / {project}"

    group = models.CharField(max_length=200, help_text="A group name, or a pattern such as gpu-{tenant}-admins.")
    match = models.CharField(max_length=10, choices=Match.choices, default=Match.EXACT)
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, null=True, blank=True, related_name="group_mappings")
    project = models.ForeignKey(Project, on_delete=models.CASCADE, null=True, blank=True, related_name="group_mappings")
    role = models.CharField(max_length=16, choices=Role.choices, blank=True, help_text="Empty: the default role.")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["group", "id"]

    def __str__(self) -> str:
        return f"{self.group} -> {self.role or 'default role'}"


class LoginSettings(models.Model):
    """How people sign in: one row (pk 1), edited by ops at /ops/identity/."""

    password_login_staff_only = models.BooleanField(
        default=False, help_text="Only staff and ops may sign in with a password; everyone else uses single sign-on."
    )
    default_role = models.CharField(max_length=16, choices=Role.choices, default=Role.VIEWER,
                                    help_text="The role of a group mapping that names none.")
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        verbose_name_plural = "login settings"

    def __str__(self) -> str:
        return "login settings"


class OidcIdentity(models.Model):
    """A user's identity at an OpenID provider: (issuer, subject) is who they are there, never their email.

    ``managed`` lists the roles single sign-on gave (``[tenant_id, project_id or None, role]``): only those
    are taken away when a group goes; roles given by hand or by invitation stay."""

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="oidc_identities")
    issuer = models.CharField(max_length=300)
    subject = models.CharField(max_length=255)
    email = models.EmailField(blank=True)
    groups = models.JSONField(default=list, blank=True)
    managed = models.JSONField(default=list, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    last_login_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["issuer", "subject"]
        constraints = [models.UniqueConstraint(fields=["issuer", "subject"], name="one_user_per_oidc_identity")]
        verbose_name_plural = "OIDC identities"

    def __str__(self) -> str:
        return f"{self.subject} at {self.issuer}"
