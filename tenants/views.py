"""Portal pages for tenancy. Reads start from ``tenants.selectors``; writes go through ``tenants.services``.

A project or tenant the user cannot see is a 404, exactly as in the API. A tenant page the user can
see but not administer is a 403. Service refusals (``PortalError``) and model validation errors are
shown on the form that caused them; nothing is written then.

Small actions (revoke a token, change or remove a member) answer htmx requests with the updated
table row, and plain POSTs with a redirect and a message, so every page works without JavaScript.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any
from urllib.parse import urlencode

import django_filters as filters
from django.conf import settings
from django.contrib import messages
from django.contrib.auth import get_user_model
from django.contrib.auth import login as auth_login
from django.contrib.auth import views as auth_views
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied, ValidationError
from django.db.models import Q, QuerySet
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse
from django.utils import timezone
from django.utils.cache import add_never_cache_headers
from django.views.decorators.http import require_http_methods, require_POST

from portal.exceptions import PortalError
from portal.forms import once_claim, once_initial, once_replay
from portal.ui import Pager, filtered

from . import identity, oidc, policy, selectors, services
from .access import Actor
from .filters import (
    TENANT_SEARCH_LIMIT,
    AuditEntryFilter,
    GroupMappingFilter,
    MembershipFilter,
    ProjectFilter,
    TenantFilter,
)
from .forms import (
    GroupMappingForm,
    InvitationForm,
    LoginSettingsForm,
    MemberAddForm,
    ProjectCreateForm,
    ProjectIdleForm,
    RoleForm,
    SignupForm,
    TenantCreateForm,
    TenantDetailsForm,
    ThrottledAuthenticationForm,
    TokenCreateForm,
    add_service_error,
)
from .guards import ops_only as _ops_only
from .guards import tenant_to_manage_members as _admin_tenant
from .models import ApiToken, Invitation, Membership, Project, Role, Tenant
from .throttle import signup_attempt
from .ui import page, refresh_perms, role_in, role_labels, tenant_choices

# Sign-in ---------------------------------------------------------------------------------------


class LoginView(auth_views.LoginView):
    """Django's login; the throttle (``tenants.throttle``) is in the authentication backend. With single
    sign-on configured, "Sign in with <provider>" comes first."""

    authentication_form = ThrottledAuthenticationForm
    redirect_authenticated_user = True

    def get_context_data(self, **kwargs: Any) -> dict[str, Any]:
        context = super().get_context_data(**kwargs)
        if oidc.sso_enabled():
            context["sso_provider"] = oidc.provider_name()
            context["sso_url"] = reverse("oidc-login") + "?" + urlencode({"next": context.get("next") or ""})
            context["password_staff_only"] = identity.login_settings_get().password_login_staff_only
        return context


class PasswordChangeView(auth_views.PasswordChangeView):
    def form_valid(self, form):
        messages.success(self.request, "Your password was changed.")
        return super().form_valid(form)


# Home ------------------------------------------------------------------------------------------


@login_required
def home(request: HttpRequest) -> HttpResponse:
    """My projects: every project the user can see, with their role in it."""
    actor = Actor.from_request(request)
    visible = selectors.projects_for(actor=actor).order_by("tenant__name", "name")
    filterset = filtered(ProjectFilter, request, visible, hide=("slug",),
                         selects={"tenant": list(selectors.tenants_for(actor=actor).values_list("slug", "name"))})
    pager = Pager(request, filterset.qs)
    by_project, by_tenant = role_labels(actor)
    rows = [(project, role_in(project, by_project, by_tenant, actor)) for project in pager]
    return page(request, "tenants/home.html", {"filterset": filterset, "pager": pager, "rows": rows})


@login_required
def tenant_search(request: HttpRequest) -> HttpResponse:
    """Tenants the user sees whose name or slug contains ``q`` (or the ``tenant`` field's value, as htmx sends
    it), by name, at most ``TENANT_SEARCH_LIMIT``: ``<option>``s for a filter's datalist (``tenant_search_widget``)."""
    actor = Actor.from_request(request)
    term = (request.GET.get("q") or request.GET.get("tenant") or "").strip()[:100]
    found = selectors.tenants_for(actor=actor).order_by("name")
    if term:
        found = found.filter(Q(name__icontains=term) | Q(slug__icontains=term))
    tenants = list(found.values_list("slug", "name")[:TENANT_SEARCH_LIMIT])
    return render(request, "tenants/_tenant_options.html", {"tenants": tenants})


# Projects --------------------------------------------------------------------------------------


def _visible_project(actor: Actor, slug: str) -> Project:
    project = selectors.project_seen_by(actor=actor, slug=slug)
    if project is None:
        raise Http404("No Project matches the given query.")
    return project


NEW_TOKEN_SESSION_KEY = "tenants:new-token"


def _new_token_flash(request: HttpRequest, actor: Actor, project: Project) -> tuple[ApiToken | None, str | None]:
    """The token just created and its secret, once: taken out of the session as the page shows them."""
    flash = request.session.get(NEW_TOKEN_SESSION_KEY)
    if not isinstance(flash, dict) or flash.get("project") != project.pk:
        return None, None
    del request.session[NEW_TOKEN_SESSION_KEY]
    token = selectors.tokens_for(actor=actor).filter(project=project, pk=flash.get("id")).first()
    return (token, str(flash.get("secret") or "")) if token is not None else (None, None)


def _project_page(
    request: HttpRequest,
    actor: Actor,
    project: Project,
    *,
    token_form: TokenCreateForm | None = None,
    idle_form: ProjectIdleForm | None = None,
) -> HttpResponse:
    new_token, new_secret = _new_token_flash(request, actor, project) if token_form is None else (None, None)
    tenant = project.tenant
    by_project, by_tenant = role_labels(actor)
    # The project and its tenant are known: the rows join only their users (fewer joins to compile and decode).
    members = (selectors.memberships_for(actor=actor).filter(project=project).select_related(None)
               .select_related("user").order_by("user__username"))
    tokens = (selectors.tokens_for(actor=actor).filter(project=project).select_related(None)
              .select_related("user").order_by("-created_at"))
    # A project's members and tokens: bounded lists, whose page rows carry their total (no COUNT query); their first
    # pages from kept queries.
    member_pager = Pager(request, members, param="members_page", window=True,
                         first=lambda: selectors.project_members_first(actor=actor, project=project))
    token_pager = Pager(request, tokens, param="tokens_page", window=True,
                        first=lambda: selectors.project_tokens_first(actor=actor, project=project))
    for m in member_pager:
        m.project, m.tenant = project, tenant
    for t in token_pager:
        t.project = project  # and so its tenant (ApiToken.tenant)
    context = {
        "project": project,
        "tenant": tenant,
        "my_role": role_in(project, by_project, by_tenant, actor),
        "members": member_pager,
        "tokens": token_pager,
        # The page asks the same predicate ({% may %}): asked once for both.
        "token_form": token_form or TokenCreateForm(can_submit=policy.asked(request, policy.may_submit, project),
                                                    initial=once_initial(request, TokenCreateForm)),
        "new_token": new_token,
        "new_secret": new_secret,
        "now": timezone.now(),
        "idle_form": idle_form or ProjectIdleForm.for_project(project),
    }
    response = page(request, "tenants/project_detail.html", context)
    if new_secret:
        add_never_cache_headers(response)  # the secret is shown once: no cached copy anywhere
    return response


@login_required
def project_detail(request: HttpRequest, slug: str) -> HttpResponse:
    actor = Actor.from_request(request)
    return _project_page(request, actor, _visible_project(actor, slug))


@login_required
@require_POST
def token_create(request: HttpRequest, slug: str) -> HttpResponse:
    actor = Actor.from_request(request)
    project = _visible_project(actor, slug)
    form = TokenCreateForm(request.POST, can_submit=policy.may_submit(actor, project))
    once = once_claim(request, form)
    if not once.first:
        return once_replay(request, form, once) or _project_page(request, actor, project, token_form=form)
    if form.is_valid():
        data = form.cleaned_data
        try:
            token, secret = services.token_create(
                actor=actor, project=project, name=data["name"], scope=data["scope"],
                expires_at=timezone.now() + timedelta(days=data["expires_days"]),
            )
        except (PortalError, ValidationError) as exc:
            add_service_error(form, exc, {"expires_at": "expires_days", "project": None})
        else:
            # Post/redirect/get: the secret rides in the session to the page the redirect shows, once;
            # a reload of that page shows it no more and creates nothing.
            request.session[NEW_TOKEN_SESSION_KEY] = {"project": project.pk, "id": token.pk, "secret": secret}
            messages.success(request, f"Token “{token.name}” created. Copy the secret now: it is shown only once.")
            url = reverse("project-detail", kwargs={"slug": project.slug}) + "#tokens"
            once.done(url, f"This form was already sent: token “{token.name}” was created then (its secret was shown once).")
            return redirect(url)
    once.release()
    return _project_page(request, actor, project, token_form=form)


@login_required
@require_POST
def token_revoke(request: HttpRequest, slug: str, pk: int) -> HttpResponse:
    actor = Actor.from_request(request)
    project = _visible_project(actor, slug)
    token = get_object_or_404(selectors.tokens_for(actor=actor).filter(project=project), pk=pk)
    error = None
    try:
        token = services.token_revoke(actor=actor, token=token)
    except PortalError as exc:
        error = exc.message
    if request.htmx:
        context = {"token": token, "project": project, "error": error, "now": timezone.now()}
        return render(request, "tenants/_token_row.html", context, using="jinja2")
    if error:
        messages.error(request, error)
    else:
        messages.success(request, f"Token “{token.name}” revoked: it no longer works.")
    return redirect("project-detail", slug=project.slug)


@login_required
@require_POST
def project_status(request: HttpRequest, slug: str) -> HttpResponse:
    """Archive or restore a project (tenant admins and ops)."""
    actor = Actor.from_request(request)
    project = _visible_project(actor, slug)
    if not policy.may_change_tenant(actor, project.tenant):
        raise PermissionDenied("Only tenant admins and ops archive or restore a project.")
    status = request.POST.get("status")
    if status not in Project.Status.values:
        messages.error(request, "Unknown project status.")
        return redirect("project-detail", slug=project.slug)
    try:
        project = services.project_update(actor=actor, project=project, status=status)
    except (PortalError, ValidationError) as exc:
        messages.error(request, getattr(exc, "message", None) or "; ".join(exc.messages))
    else:
        messages.success(request, f"Project {project.name} is now {project.get_status_display().lower()}.")
    return redirect("project-detail", slug=project.slug)


@login_required
@require_POST
def project_idle(request: HttpRequest, slug: str) -> HttpResponse:
    """The project's idle policies (project and tenant admins, ops): through ``project_update``, audited."""
    actor = Actor.from_request(request)
    project = _visible_project(actor, slug)
    if not policy.may_change_project(actor, project):
        raise PermissionDenied("Only project admins, tenant admins and ops change a project's idle policies.")
    form = ProjectIdleForm.for_project(project, request.POST)
    if form.is_valid():
        try:
            project = services.project_update(actor=actor, project=project, **form.cleaned_data)
        except (PortalError, ValidationError) as exc:
            add_service_error(form, exc, {})
        else:
            messages.success(request, f"Idle policies of {project.name} saved.")
            return redirect(reverse("project-detail", kwargs={"slug": project.slug}) + "#idle")
    return _project_page(request, actor, project, idle_form=form)


# Tenant admin ----------------------------------------------------------------------------------


@login_required
def tenant_list(request: HttpRequest) -> HttpResponse:
    """The tenants the user administers (ops: all)."""
    actor = Actor.from_request(request)
    filterset = filtered(TenantFilter, request, selectors.admin_tenants_for(actor=actor).order_by("name"), hide=("slug",))
    pager = Pager(request, filterset.qs)
    return page(request, "tenants/tenant_list.html", {"filterset": filterset, "pager": pager})


def _tenant_overview(
    request: HttpRequest,
    actor: Actor,
    tenant: Tenant,
    *,
    details_form: TenantDetailsForm | None = None,
    project_form: ProjectCreateForm | None = None,
) -> HttpResponse:
    projects = selectors.projects_for(actor=actor).filter(tenant=tenant).order_by("name")
    filterset = filtered(ProjectFilter, request, projects, hide=("tenant", "slug"))
    context = {
        "tenant": tenant,
        "tab": "overview",
        "details_form": details_form or TenantDetailsForm.for_tenant(tenant),
        "project_form": project_form or ProjectCreateForm(),
        "filterset": filterset,
        "pager": Pager(request, filterset.qs),
    }
    return page(request, "tenants/tenant_overview.html", context)


@login_required
def tenant_detail(request: HttpRequest, slug: str) -> HttpResponse:
    actor = Actor.from_request(request)
    return _tenant_overview(request, actor, _admin_tenant(actor, slug))


@login_required
@require_POST
def tenant_details(request: HttpRequest, slug: str) -> HttpResponse:
    actor = Actor.from_request(request)
    tenant = _admin_tenant(actor, slug)
    form = TenantDetailsForm.for_tenant(tenant, request.POST)
    if form.is_valid():
        try:
            services.tenant_update(actor=actor, tenant=tenant, **form.cleaned_data)
        except (PortalError, ValidationError) as exc:
            add_service_error(form, exc)
        else:
            messages.success(request, "Tenant details saved.")
            return redirect("tenant-detail", slug=tenant.slug)
    tenant.refresh_from_db()
    return _tenant_overview(request, actor, tenant, details_form=form)


@login_required
@require_POST
def project_create(request: HttpRequest, slug: str) -> HttpResponse:
    actor = Actor.from_request(request)
    tenant = _admin_tenant(actor, slug)
    form = ProjectCreateForm(request.POST)
    if form.is_valid():
        try:
            project = services.project_create(actor=actor, tenant=tenant, **form.cleaned_data)
        except (PortalError, ValidationError) as exc:
            add_service_error(form, exc)
        else:
            refresh_perms(request.user)
            messages.success(request, f"Project {project.name} created (namespace {project.namespace}).")
            return redirect("tenant-detail", slug=tenant.slug)
    return _tenant_overview(request, actor, tenant, project_form=form)


def _tenant_members(
    request: HttpRequest,
    actor: Actor,
    tenant: Tenant,
    *,
    form: MemberAddForm | None = None,
    invite_form: InvitationForm | None = None,
    status: int = 200,
) -> HttpResponse:
    memberships = (
        selectors.memberships_for(actor=actor).filter(tenant=tenant).order_by("project__name", "user__username")
    )
    projects = list(selectors.projects_for(actor=actor).filter(tenant=tenant).order_by("name"))
    filterset = filtered(MembershipFilter, request, memberships, hide=("tenant",),
                         selects={"project": [(p.slug, p.name) for p in projects]})
    invitations = (selectors.invitations_for(actor=actor).filter(tenant=tenant)
                   .filter(status__in=[Invitation.Status.PENDING, Invitation.Status.EXPIRED])
                   .order_by("-sent_at", "-id"))
    initial = {"project": request.GET.get("project")}
    context = {
        "tenant": tenant,
        "tab": "members",
        "filterset": filterset,
        "pager": Pager(request, filterset.qs),
        "form": form or MemberAddForm(projects=projects, members=selectors.tenant_members(tenant=tenant), initial=initial),
        "invite_form": invite_form or InvitationForm(projects=projects, initial=initial | once_initial(request, InvitationForm)),
        "invitations": Pager(request, invitations, param="invitations_page"),
        "roles": Role.choices,
        "invitation_days": settings.PORTAL_INVITATION_DAYS,
    }
    return page(request, "tenants/tenant_members.html", context, status=status)


@login_required
def tenant_members(request: HttpRequest, slug: str) -> HttpResponse:
    actor = Actor.from_request(request)
    return _tenant_members(request, actor, _admin_tenant(actor, slug))


@login_required
@require_POST
def member_add(request: HttpRequest, slug: str) -> HttpResponse:
    """Give one of the tenant's own members a role in (another of) its projects."""
    actor = Actor.from_request(request)
    tenant = _admin_tenant(actor, slug)
    projects = selectors.projects_for(actor=actor).filter(tenant=tenant).order_by("name")
    form = MemberAddForm(request.POST, projects=projects, members=selectors.tenant_members(tenant=tenant))
    if form.is_valid():
        data = form.cleaned_data
        user = form.cleaned_user()
        try:
            membership = services.membership_create(
                actor=actor, tenant=tenant, user=user, role=data["role"], project=form.cleaned_project()
            )
        except (PortalError, ValidationError) as exc:
            add_service_error(form, exc)
        else:
            where = membership.project.name if membership.project else tenant.name
            messages.success(request, f"{user.get_username()} is now {membership.get_role_display()} of {where}.")
            return redirect("tenant-members", slug=tenant.slug)
    return _tenant_members(request, actor, tenant, form=form)


def _base_url(request: HttpRequest) -> str:
    return request.build_absolute_uri("/").rstrip("/")


@login_required
@require_POST
def invitation_create(request: HttpRequest, slug: str) -> HttpResponse:
    actor = Actor.from_request(request)
    tenant = _admin_tenant(actor, slug)
    projects = selectors.projects_for(actor=actor).filter(tenant=tenant).order_by("name")
    form = InvitationForm(request.POST, projects=projects)
    once = once_claim(request, form)
    if not once.first:
        return once_replay(request, form, once) or _tenant_members(request, actor, tenant, invite_form=form)
    if form.is_valid():
        data = form.cleaned_data
        try:
            invitation = services.invitation_create(
                actor=actor, tenant=tenant, email=data["email"], role=data["role"], project=form.cleaned_project(),
                base_url=_base_url(request),
            )
        except (PortalError, ValidationError) as exc:
            add_service_error(form, exc)
        else:
            where = invitation.project.name if invitation.project else tenant.name
            messages.success(request, f"Invitation sent to {invitation.email} ({invitation.get_role_display()} of {where}). "
                                      f"The link works once, for {settings.PORTAL_INVITATION_DAYS} days.")
            url = reverse("tenant-members", kwargs={"slug": tenant.slug}) + "#invitations"
            once.done(url, f"This form was already sent: {invitation.email} was invited then.")
            return redirect(url)
    once.release()
    return _tenant_members(request, actor, tenant, invite_form=form)


def _invitation_action(request: HttpRequest, slug: str, pk: int, call: Any, done: str) -> HttpResponse:
    actor = Actor.from_request(request)
    tenant = _admin_tenant(actor, slug)
    invitation = get_object_or_404(selectors.invitations_for(actor=actor).filter(tenant=tenant), pk=pk)
    try:
        invitation = call(actor, invitation)
    except PortalError as exc:
        messages.error(request, exc.message)
    else:
        messages.success(request, done.format(email=invitation.email))
    return redirect(reverse("tenant-members", kwargs={"slug": tenant.slug}) + "#invitations")


@login_required
@require_POST
def invitation_resend(request: HttpRequest, slug: str, pk: int) -> HttpResponse:
    base = _base_url(request)
    return _invitation_action(
        request, slug, pk, lambda actor, inv: services.invitation_resend(actor=actor, invitation=inv, base_url=base),
        f"Invitation sent again to {{email}} with a new link (the old one no longer works), valid for "
        f"{settings.PORTAL_INVITATION_DAYS} days.",
    )


@login_required
@require_POST
def invitation_revoke(request: HttpRequest, slug: str, pk: int) -> HttpResponse:
    return _invitation_action(
        request, slug, pk, lambda actor, inv: services.invitation_revoke(actor=actor, invitation=inv),
        "Invitation to {email} revoked: its link no longer works.",
    )


# Accepting an invitation -------------------------------------------------------------------------


def _accept_page(request: HttpRequest, invitation: Invitation | None, *, status: int = 200, **context: Any) -> HttpResponse:
    context["invitation"] = invitation
    if request.user.is_authenticated:
        response = page(request, "tenants/invitation_accept.html", context, status=status)
    else:
        response = render(request, "tenants/invitation_accept.html", context, status=status)
    # The address carries the link's secret: no cached copy. (Referer: the site-wide same-origin policy
    # sends it to no one else; "no-referrer" would make the browser's form POST fail the CSRF origin check.)
    add_never_cache_headers(response)
    return response


def _joined(request: HttpRequest, membership: Membership) -> HttpResponse:
    refresh_perms(request.user)
    where = membership.project.name if membership.project_id else membership.tenant.name
    messages.success(request, f"Welcome: you are now {membership.get_role_display()} of {where}.")
    if membership.project_id:
        return redirect("project-detail", slug=membership.project.slug)
    return redirect("tenant-detail", slug=membership.tenant.slug)


@require_http_methods(["GET", "POST"])
def invitation_accept(request: HttpRequest, secret: str) -> HttpResponse:
    """The invitation's link. Signed in: accept as yourself. Not signed in: sign in first (and come
    back), or choose a username and password here. An unknown link is a 404 that says nothing more."""
    invitation = selectors.invitation_by_secret(secret)
    if invitation is None:
        newer = selectors.invitation_superseded_by_secret(secret)
        if newer is not None:  # an earlier link of an invitation sent again: say so, and where the new one went
            return _accept_page(request, None, superseded=newer, status=410)
        return _accept_page(request, None, status=404)
    if invitation.overdue:
        services.invitation_expire(invitation=invitation)
        invitation.refresh_from_db()
    try:
        services.invitation_check_open(invitation)
    except PortalError as exc:
        return _accept_page(request, invitation, closed=exc.message, status=410)
    login_url = reverse("login") + "?" + urlencode({"next": request.path})
    usernames = selectors.signup_usernames_for(invitation)
    signup_form = SignupForm(usernames=usernames)
    error = None
    status = 200
    # Password accounts for newcomers only while password sign-in is open to everyone.
    signup_open = not identity.login_settings_get().password_login_staff_only
    if request.method == "POST" and not request.user.is_authenticated and not signup_open:
        error = "New accounts come from single sign-on here: use the button to sign in."
    elif request.method == "POST":
        ip = Actor.from_request(request).ip
        if request.user.is_authenticated and request.POST.get("accept"):
            try:
                membership = services.invitation_accept(invitation=invitation, user=request.user, ip=ip)
            except (PortalError, ValidationError) as exc:
                error = getattr(exc, "message", None) or "; ".join(exc.messages)
            else:
                return _joined(request, membership)
        elif not request.user.is_authenticated:
            blocked = signup_attempt(invitation_id=invitation.pk, ip=ip)
            if blocked is None:
                signup_form = SignupForm(request.POST, usernames=usernames)
            else:
                error, status = blocked.message, 429
            if blocked is None and signup_form.is_valid():
                data = signup_form.cleaned_data
                try:
                    user, membership = services.invitation_signup(
                        invitation=invitation, username=data["username"], password=data["password1"], ip=ip,
                    )
                except (PortalError, ValidationError) as exc:
                    add_service_error(signup_form, exc, {"password": "password1", "invitation": None})
                else:
                    auth_login(request, user, backend="tenants.throttle.ThrottledModelBackend")
                    return _joined(request, membership)
        else:
            error = "Use the button to accept the invitation."
        invitation.refresh_from_db()
    sso = {"sso_provider": oidc.provider_name(), "sso_url": reverse("invitation-sso", kwargs={"secret": secret})} \
        if oidc.sso_enabled() else {}
    return _accept_page(request, invitation, signup_form=signup_form, login_url=login_url, error=error,
                        signup_open=signup_open, status=status, **sso)


def _member_answer(
    request: HttpRequest, tenant: Tenant, membership: Membership | None, *, error: str | None, done: str
) -> HttpResponse:
    """htmx: the row (or nothing, once removed). Plain POST: back to the list, with a message."""
    if request.htmx:
        if membership is None:
            return HttpResponse("")
        context = {"m": membership, "tenant": tenant, "roles": Role.choices, "error": error,
                   "note": None if error else done}
        return render(request, "tenants/_member_row.html", context)
    if error:
        messages.error(request, error)
    else:
        messages.success(request, done)
    back = request.POST.get("next", "")
    url = reverse("tenant-members", kwargs={"slug": tenant.slug})
    return redirect(url + (back if back.startswith("?") else ""))


@login_required
@require_POST
def member_role(request: HttpRequest, slug: str, pk: int) -> HttpResponse:
    actor = Actor.from_request(request)
    tenant = _admin_tenant(actor, slug)
    membership = get_object_or_404(selectors.memberships_for(actor=actor).filter(tenant=tenant), pk=pk)
    form = RoleForm(request.POST)
    error = None
    if not form.is_valid():
        error = "Choose one of the listed roles."
    else:
        try:
            membership = services.membership_update(actor=actor, membership=membership, role=form.cleaned_data["role"])
        except (PortalError, ValidationError) as exc:
            error = getattr(exc, "message", None) or "; ".join(exc.messages)
    done = f"{membership.user.get_username()} is now {membership.get_role_display()}."
    return _member_answer(request, tenant, membership, error=error, done=done)


@login_required
@require_POST
def member_remove(request: HttpRequest, slug: str, pk: int) -> HttpResponse:
    actor = Actor.from_request(request)
    tenant = _admin_tenant(actor, slug)
    membership = get_object_or_404(selectors.memberships_for(actor=actor).filter(tenant=tenant), pk=pk)
    where = membership.project.name if membership.project_id else tenant.name
    done = f"{membership.user.get_username()} no longer has a role in {where}."
    try:
        services.membership_delete(actor=actor, membership=membership)
    except PortalError as exc:
        return _member_answer(request, tenant, membership, error=exc.message, done=done)
    refresh_perms(request.user)
    return _member_answer(request, tenant, None, error=None, done=done)


# Audit log -------------------------------------------------------------------------------------


def _audit_page(request: HttpRequest, actor: Actor, entries: QuerySet[Any], context: dict[str, Any]) -> HttpResponse:
    hide = ("target_type",) + (("tenant",) if "tenant" in context else ())
    filterset = filtered(AuditEntryFilter, request, entries.order_by("-created_at", "-id"), hide=hide,
                         selects={"tenant": tenant_choices()} if actor.is_ops else None)
    context |= {"filterset": filterset, "pager": Pager(request, filterset.qs)}
    return page(request, "tenants/audit_list.html", context)


@login_required
def tenant_audit(request: HttpRequest, slug: str) -> HttpResponse:
    actor = Actor.from_request(request)
    tenant = _admin_tenant(actor, slug)
    entries = selectors.audit_entries_for(actor=actor).filter(tenant=tenant)
    return _audit_page(request, actor, entries, {"tenant": tenant, "tab": "audit"})


# Ops -------------------------------------------------------------------------------------------


class UserFilter(filters.FilterSet):
    """Ops' user list. Users are not a tenancy model, so this one lives with its only page."""

    q = filters.CharFilter(method="search", label="Name, username or email contains")
    tenant = filters.CharFilter(field_name="memberships__tenant__slug", label="Tenant", distinct=True)

    class Meta:
        model = get_user_model()
        fields = ["q", "tenant", "is_active"]

    def search(self, queryset, name, value):
        return queryset.filter(
            Q(username__icontains=value) | Q(email__icontains=value)
            | Q(first_name__icontains=value) | Q(last_name__icontains=value)
        )


@login_required
def ops_home(request: HttpRequest) -> HttpResponse:
    _ops_only(request)
    return redirect("ops-tenants")


def _ops_tenants(request: HttpRequest, actor: Actor, *, form: TenantCreateForm | None = None) -> HttpResponse:
    filterset = filtered(TenantFilter, request, selectors.tenants_for(actor=actor).order_by("name"), hide=("slug",))
    context = {"tab": "tenants", "filterset": filterset, "pager": Pager(request, filterset.qs),
               "form": form or TenantCreateForm()}
    return page(request, "ops/tenants.html", context)


@login_required
def ops_tenants(request: HttpRequest) -> HttpResponse:
    return _ops_tenants(request, _ops_only(request))


@login_required
@require_POST
def ops_tenant_create(request: HttpRequest) -> HttpResponse:
    actor = _ops_only(request)
    form = TenantCreateForm(request.POST)
    if form.is_valid():
        try:
            tenant = services.tenant_create(actor=actor, **form.cleaned_data)
        except (PortalError, ValidationError) as exc:
            add_service_error(form, exc)
        else:
            messages.success(request, f"Tenant {tenant.name} created. Invite its first tenant admin by email on its members page.")
            return redirect("ops-tenants")
    return _ops_tenants(request, actor, form=form)


@login_required
@require_POST
def ops_tenant_status(request: HttpRequest, slug: str) -> HttpResponse:
    actor = _ops_only(request)
    tenant = get_object_or_404(selectors.tenants_for(actor=actor), slug=slug)
    status = request.POST.get("status")
    if status not in Tenant.Status.values:
        messages.error(request, "Unknown tenant status.")
    else:
        try:
            tenant = services.tenant_update(actor=actor, tenant=tenant, status=status)
        except (PortalError, ValidationError) as exc:
            messages.error(request, getattr(exc, "message", None) or "; ".join(exc.messages))
        else:
            what = "suspended: its users can read but not change anything" if status == Tenant.Status.SUSPENDED else "active again"
            messages.success(request, f"Tenant {tenant.name} is {what}.")
    back = request.POST.get("next", "")
    return redirect(reverse("ops-tenants") + (back if back.startswith("?") else ""))


@login_required
def ops_projects(request: HttpRequest) -> HttpResponse:
    actor = _ops_only(request)
    projects = selectors.projects_for(actor=actor).order_by("tenant__name", "name")
    filterset = filtered(ProjectFilter, request, projects, hide=("slug",), selects={"tenant": tenant_choices()})
    return page(request, "ops/projects.html", {"tab": "projects", "filterset": filterset, "pager": Pager(request, filterset.qs)})


@login_required
def ops_users(request: HttpRequest) -> HttpResponse:
    actor = _ops_only(request)
    users = selectors.user_list_for(actor=actor)
    filterset = filtered(UserFilter, request, users, selects={"tenant": tenant_choices()})
    pager = Pager(request, filterset.qs)  # each user with ``in_ops_group`` (selectors.user_list_for)
    return page(request, "ops/users.html", {"tab": "users", "filterset": filterset, "pager": pager})


@login_required
@require_POST
def ops_user_ops(request: HttpRequest, pk: int) -> HttpResponse:
    """Make a user platform ops (``ops=true``) or take it away (``ops=false``); never your own."""
    actor = _ops_only(request)
    user = get_object_or_404(selectors.users_for(actor=actor), pk=pk)
    make = request.POST.get("ops")
    if make not in ("true", "false"):
        messages.error(request, "Say whether to make the user ops or not.")
    else:
        name = user.get_username()
        try:
            if make == "true":
                changed = services.ops_user_ensure(actor=actor, user=user)
                done = f"{name} is now platform ops." if changed else f"{name} was already platform ops."
            else:
                changed = services.ops_user_remove(actor=actor, user=user)
                done = f"{name} is no longer platform ops." if changed else f"{name} was not platform ops."
        except PortalError as exc:
            messages.error(request, exc.message)
        else:
            messages.success(request, done)
    back = request.POST.get("next", "")
    return redirect(reverse("ops-users") + (back if back.startswith("?") else ""))


@login_required
def ops_audit(request: HttpRequest) -> HttpResponse:
    actor = _ops_only(request)
    return _audit_page(request, actor, selectors.audit_entries_for(actor=actor), {"tab": "audit", "ops": True})



# Single sign-on: group mappings and login settings ----------------------------------------------


def _identity_page(request: HttpRequest, actor: Actor, *, mapping_form: GroupMappingForm | None = None,
                   settings_form: LoginSettingsForm | None = None, status: int = 200) -> HttpResponse:
    tenants = selectors.tenants_for(actor=actor).order_by("name")
    projects = selectors.projects_for(actor=actor).filter(status=Project.Status.ACTIVE).order_by("slug")
    current = identity.login_settings_get()
    mapping_form = mapping_form or GroupMappingForm(tenants=tenants, projects=projects, initial={"role": Role.MEMBER})
    settings_form = settings_form or LoginSettingsForm(
        initial={"password_login_staff_only": current.password_login_staff_only, "default_role": current.default_role})
    filterset = filtered(GroupMappingFilter, request, selectors.group_mappings_for(actor=actor),
                         selects={"tenant": [(t.slug, t.name) for t in tenants]})
    pager = Pager(request, filterset.qs)
    tried = (request.GET.get("try") or "")[:2000]
    groups = [g.strip() for g in tried.replace("\n", ",").split(",") if g.strip()][:100]
    context = {"tab": "identity", "tried": tried, "preview": identity.rules_preview(groups) if groups else None, "filterset": filterset, "pager": pager, "mapping_form": mapping_form,
               "settings_form": settings_form, "login_settings": current, "sso_enabled": oidc.sso_enabled(),
               "sso_provider": oidc.provider_name(), "identities": selectors.identities_for(actor=actor)[:10]}
    return page(request, "ops/identity.html", context, status=status)


@login_required
@require_http_methods(["GET", "POST"])
def ops_identity(request: HttpRequest) -> HttpResponse:
    """Ops map the identity provider's groups to tenants and roles, and say who may sign in with a password."""
    actor = _ops_only(request)
    if request.method == "GET":
        return _identity_page(request, actor)
    if request.POST.get("action") == "settings":
        form = LoginSettingsForm(request.POST)
        if form.is_valid():
            try:
                identity.login_settings_update(actor=actor, **form.cleaned_data)
            except PortalError as exc:
                add_service_error(form, exc)
            else:
                messages.success(request, "Login settings saved.")
                return redirect("ops-identity")
        return _identity_page(request, actor, settings_form=form, status=400)
    tenants = selectors.tenants_for(actor=actor).order_by("name")
    projects = selectors.projects_for(actor=actor).filter(status=Project.Status.ACTIVE).order_by("slug")
    form = GroupMappingForm(request.POST, tenants=tenants, projects=projects)
    if form.is_valid():
        tenant, project = form.cleaned_objects()
        data = form.cleaned_data
        try:
            mapping = identity.group_mapping_create(actor=actor, group=data["group"], match=data["match"],
                                                    role=data["role"], tenant=tenant, project=project)
        except PortalError as exc:
            add_service_error(form, exc)
        else:
            messages.success(request, f"Group mapping {mapping.group} added.")
            return redirect("ops-identity")
    return _identity_page(request, actor, mapping_form=form, status=400)


@login_required
@require_POST
def ops_identity_mapping_delete(request: HttpRequest, pk: int) -> HttpResponse:
    actor = _ops_only(request)
    mapping = get_object_or_404(selectors.group_mappings_for(actor=actor), pk=pk)
    identity.group_mapping_delete(actor=actor, mapping=mapping)
    messages.success(request, f"Group mapping {mapping.group} removed; roles it gave go at each person's next sign-in.")
    return redirect("ops-identity")
