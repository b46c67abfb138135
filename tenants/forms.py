"""Portal forms. They only shape and check input; the views hand the cleaned data to services."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from django import forms
from django.contrib.admin.forms import AdminAuthenticationForm
from django.contrib.auth.forms import AuthenticationForm
from django.core.exceptions import NON_FIELD_ERRORS, ValidationError

from portal.exceptions import PortalError
from portal.forms import IntegerField, OneTimeFormMixin

from .models import ApiToken, Project, Role, Tenant
from .services import MAX_TOKEN_DAYS


class ThrottleMessageMixin:
    """Explain a throttled sign-in: the backend (``tenants.throttle``) refused it or this failure
    used up the last attempt; say so, and for how long, instead of "wrong password"."""

    def get_invalid_login_error(self) -> ValidationError:
        blocked = getattr(self.request, "login_blocked", None)  # type: ignore[attr-defined]
        if blocked is not None:
            return ValidationError(blocked.message, code="throttled")
        return super().get_invalid_login_error()  # type: ignore[misc]


class ThrottledAuthenticationForm(ThrottleMessageMixin, AuthenticationForm):
    """Django's login form; the throttle itself is in the authentication backend. When ops switched password
    sign-in off for everyone but staff and ops (``LoginSettings``), a right password of anyone else is refused
    too (after the throttle, so the answer tells a guesser nothing more)."""

    error_messages = {
        **AuthenticationForm.error_messages,
        "invalid_login": "That username and password do not match. Check both and try again.",
        "sso_only": "Password sign-in is switched off for your account: use single sign-on.",
    }

    def confirm_login_allowed(self, user: Any) -> None:
        super().confirm_login_allowed(user)
        from . import policy
        from .access import Actor
        from .identity import login_settings_get

        if not policy.may_use_password(Actor(user=user), login_settings_get()):
            raise ValidationError(self.error_messages["sso_only"], code="sso_only")


class ThrottledAdminAuthenticationForm(ThrottleMessageMixin, AdminAuthenticationForm):
    """The Django admin's login form, with the same throttle messages."""


def add_service_error(form: forms.Form, exc: PortalError | ValidationError, fields: Mapping[str, str] | None = None) -> None:
    """Show a service's refusal on ``form``: next to the field it names when the form has it, else on top.

    ``fields`` maps service/model field names to form field names where they differ.
    """
    fields = fields or {}
    items: Iterable[tuple[str | None, list[str]]]
    if isinstance(exc, PortalError):
        items = [(exc.field, [exc.message])]
    elif hasattr(exc, "error_dict"):
        items = exc.message_dict.items()
    else:
        items = [(None, exc.messages)]
    for field, messages in items:
        name = fields.get(field, field) if field and field != NON_FIELD_ERRORS else None
        target = name if name in form.fields else None
        for message in messages:
            form.add_error(target, message)


class TenantCreateForm(forms.Form):
    name = forms.CharField(max_length=100)
    slug = forms.CharField(
        max_length=40, help_text="Lower-case letters, digits and '-'. Names cluster objects; cannot change later."
    )
    cost_centre = forms.CharField(max_length=60, required=False, label="Cost centre")
    contact_email = forms.EmailField(required=False, label="Contact email")


class TenantDetailsForm(forms.Form):
    name = forms.CharField(max_length=100)
    cost_centre = forms.CharField(max_length=60, required=False, label="Cost centre")
    contact_email = forms.EmailField(required=False, label="Contact email")

    @classmethod
    def for_tenant(cls, tenant: Tenant, data: Mapping[str, Any] | None = None) -> TenantDetailsForm:
        initial = {"name": tenant.name, "cost_centre": tenant.cost_centre, "contact_email": tenant.contact_email}
        return cls(data, initial=initial, prefix="details")


class ProjectCreateForm(forms.Form):
    name = forms.CharField(max_length=100)
    slug = forms.CharField(
        max_length=63,
        help_text="Becomes the Kubernetes namespace: lower-case letters, digits and '-', unique portal-wide.",
    )
    description = forms.CharField(widget=forms.Textarea(attrs={"rows": 2}), required=False, max_length=2000)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("prefix", "project")
        super().__init__(*args, **kwargs)


class ProjectIdleForm(forms.Form):
    """What may be stopped when its GPUs are measured idle (docs/measured-use.md, "Idle detection")."""

    cull_idle_notebooks_by_gpu = forms.BooleanField(
        required=False, label="Cull notebooks whose GPUs are measured idle",
        help_text="As well as by portal activity; the home volume is kept.")
    stop_idle_batch_jobs = forms.BooleanField(
        required=False, label="Stop training and batch jobs whose GPUs are measured idle",
        help_text="Inference services are never stopped for idling.")

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("prefix", "idle")
        super().__init__(*args, **kwargs)

    @classmethod
    def for_project(cls, project: Project, data: Mapping[str, Any] | None = None) -> ProjectIdleForm:
        return cls(data, initial={name: getattr(project, name) for name in cls.base_fields})


TENANT_WIDE = ""


def _where_choices(projects: dict[str, Project]) -> list[tuple[str, str]]:
    return [(slug, f"{p.name} ({slug})") for slug, p in projects.items()] + [(TENANT_WIDE, "Tenant-wide (tenant admin)")]


class MemberAddForm(forms.Form):
    """Give someone who already belongs to the tenant a role in (another of) its projects. The people
    are a list of the tenant's own members, never a free-text username: the form cannot tell anyone
    whether a name exists elsewhere. Newcomers are invited by email (``InvitationForm``)."""

    user = forms.ChoiceField(label="Member", help_text="Someone who already has a role in this tenant.")
    project = forms.ChoiceField(
        required=False, help_text="Tenant admins hold their role tenant-wide; every other role is held in one project."
    )
    role = forms.ChoiceField(choices=Role.choices, initial=Role.MEMBER)

    def __init__(self, *args: Any, projects: Iterable[Project] = (), members: Iterable[Any] = (), **kwargs: Any) -> None:
        kwargs.setdefault("prefix", "member")
        super().__init__(*args, **kwargs)
        self.projects = {p.slug: p for p in projects}
        self.members = {u.get_username(): u for u in members}
        self.fields["user"].choices = [("", "Choose…")] + [
            (name, f"{name} ({u.get_full_name()})" if u.get_full_name() else name) for name, u in self.members.items()
        ]
        self.fields["project"].choices = _where_choices(self.projects)
        if not self.is_bound and not self.initial.get("project") and self.projects:
            self.initial["project"] = next(iter(self.projects))

    def cleaned_project(self) -> Project | None:
        return self.projects.get(self.cleaned_data.get("project") or "")

    def cleaned_user(self) -> Any:
        return self.members[self.cleaned_data["user"]]


class InvitationForm(OneTimeFormMixin, forms.Form):
    """Invite someone by email to a role in the tenant or one of its projects."""

    email = forms.EmailField(max_length=254, help_text="The invitation link is sent there; it works once.")
    project = forms.ChoiceField(
        required=False, help_text="Tenant admins hold their role tenant-wide; every other role is held in one project."
    )
    role = forms.ChoiceField(choices=Role.choices, initial=Role.MEMBER)

    def __init__(self, *args: Any, projects: Iterable[Project] = (), **kwargs: Any) -> None:
        kwargs.setdefault("prefix", "invite")
        super().__init__(*args, **kwargs)
        self.projects = {p.slug: p for p in projects if p.is_active}
        self.fields["project"].choices = _where_choices(self.projects)
        if not self.is_bound and not self.initial.get("project") and self.projects:
            self.initial["project"] = next(iter(self.projects))

    def cleaned_project(self) -> Project | None:
        return self.projects.get(self.cleaned_data.get("project") or "")


class GroupMappingForm(forms.Form):
    """A mapping from the identity provider's groups to a role (/ops/identity/)."""

    group = forms.CharField(max_length=200, help_text="An exact group name, or a pattern such as gpu-{tenant}-admins.")
    match = forms.ChoiceField(choices=[("exact", "Exact group name"), ("pattern", "Pattern with {tenant} / {project}")])
    tenant = forms.ChoiceField(required=False, help_text="Exact groups only: the tenant the group gives a role in.")
    project = forms.ChoiceField(required=False, help_text="Empty: tenant admins hold the tenant; other roles every "
                                                          "active project of it.")
    role = forms.ChoiceField(required=False, help_text="Empty: the default role below.")

    def __init__(self, *args: Any, tenants: Iterable[Tenant] = (), projects: Iterable[Project] = (), **kwargs: Any) -> None:
        kwargs.setdefault("prefix", "mapping")
        super().__init__(*args, **kwargs)
        self.tenants = {t.slug: t for t in tenants}
        self.projects = {p.slug: p for p in projects}
        self.fields["tenant"].choices = [("", "—")] + [(t.slug, t.name) for t in self.tenants.values()]
        self.fields["project"].choices = [("", "—")] + [(p.slug, f"{p.name} ({p.slug})") for p in self.projects.values()]
        self.fields["role"].choices = [("", "Default role")] + list(Role.choices)

    def cleaned_objects(self) -> tuple[Tenant | None, Project | None]:
        project = self.projects.get(self.cleaned_data.get("project") or "")
        tenant = self.tenants.get(self.cleaned_data.get("tenant") or "")
        if project is not None and tenant is None and self.cleaned_data.get("match") == "exact":
            tenant = project.tenant
        return tenant, project


class LoginSettingsForm(forms.Form):
    """How people sign in (/ops/identity/)."""

    password_login_staff_only = forms.BooleanField(
        required=False, label="Password sign-in only for staff and ops",
        help_text="Everyone else signs in with single sign-on; local staff and ops accounts stay for break-glass.")
    default_role = forms.ChoiceField(choices=[c for c in Role.choices if c[0] != Role.TENANT_ADMIN],
                                     help_text="The role of a group mapping that names none.")


class SignupForm(forms.Form):
    """A newcomer's account, made on the invitation's page. The email is the invited address.

    The username is chosen from ``usernames`` (``selectors.signup_usernames_for``), never typed: a typed name
    would be refused exactly when someone has it, and the page would tell anyone holding a link which
    usernames exist (docs/security.md, "Invitations")."""

    username = forms.ChoiceField(help_text="Choose one; you sign in with it.",
                                 error_messages={"invalid_choice": "Choose one of the usernames offered."})
    password1 = forms.CharField(label="Password", strip=False, widget=forms.PasswordInput)
    password2 = forms.CharField(label="Password again", strip=False, widget=forms.PasswordInput)

    def __init__(self, *args: Any, usernames: Iterable[str] = (), **kwargs: Any) -> None:
        kwargs.setdefault("prefix", "signup")
        super().__init__(*args, **kwargs)
        self.fields["username"].choices = [(name, name) for name in usernames]

    def clean(self) -> dict[str, Any]:
        data = super().clean()
        if data.get("password1") and data.get("password2") is not None and data["password1"] != data["password2"]:
            self.add_error("password2", "The two passwords differ: type the same one twice.")
        return data


class RoleForm(forms.Form):
    role = forms.ChoiceField(choices=Role.choices)


class TokenCreateForm(OneTimeFormMixin, forms.Form):
    name = forms.CharField(max_length=80, help_text="Where it is used, e.g. “CI nightly”.")
    scope = forms.ChoiceField(choices=ApiToken.Scope.choices, initial=ApiToken.Scope.READ)
    expires_days = IntegerField(
        min_value=1, max_value=MAX_TOKEN_DAYS, initial=90, label="Expires in (days)",
        help_text=f"1 to {MAX_TOKEN_DAYS} days.",
    )

    def __init__(self, *args: Any, can_submit: bool = True, **kwargs: Any) -> None:
        kwargs.setdefault("prefix", "token")
        super().__init__(*args, **kwargs)
        if not can_submit:
            # A token never does more than its user: offer only what this role allows.
            self.fields["scope"].choices = [(ApiToken.Scope.READ, ApiToken.Scope.READ.label)]
            self.fields["scope"].help_text = "Your role in this project can read only, so can your tokens."
