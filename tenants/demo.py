"""Demo data: two tenants, four projects and a user for each role. Idempotent."""

from __future__ import annotations

from django.contrib.auth import get_user_model
from django.db import transaction

from .access import Actor
from .models import Membership, Project, Role, Tenant
from .services import membership_create, ops_user_ensure, project_create, tenant_create

DEMO_PASSWORD = "portal-demo"

TENANTS = [
    {"name": "Acme Research", "slug": "acme", "cost_centre": "CC-1001", "contact_email": "gpu@acme.example"},
    {"name": "Globex AI", "slug": "globex", "cost_centre": "CC-2002", "contact_email": "platform@globex.example"},
]
# Slugs follow the "<tenant>-" convention, so each namespace is the slug itself (docs/ownership.md).
PROJECTS = [
    {"tenant": "acme", "name": "Vision", "slug": "acme-vision", "description": "Image models and data pipelines."},
    {"tenant": "acme", "name": "NLP", "slug": "acme-nlp", "description": "Language models research."},
    {"tenant": "globex", "name": "LLM training", "slug": "globex-llm", "description": "Pre-training and fine-tuning."},
    {"tenant": "globex", "name": "Serving", "slug": "globex-serving", "description": "Production inference."},
]
# (username, full name, tenant, project or None, role, what to try)
USERS = [
    ("alice", "Alice Admin", "acme", None, Role.TENANT_ADMIN, "tenant admin of Acme: members, projects, tokens, audit"),
    ("bob", "Bob Lead", "acme", "acme-vision", Role.PROJECT_ADMIN, "project admin of acme-vision: approves requests"),
    ("carol", "Carol Researcher", "acme", "acme-vision", Role.MEMBER, "member of acme-vision: submits requests"),
    ("dave", "Dave Auditor", "acme", "acme-vision", Role.VIEWER, "viewer of acme-vision: reads only"),
    ("erin", "Erin Admin", "globex", None, Role.TENANT_ADMIN, "tenant admin of Globex"),
    ("frank", "Frank Engineer", "globex", "globex-llm", Role.MEMBER, "member of globex-llm"),
]
OPS_USER = ("ops", "Olivia Ops", "platform ops: every tenant, Django admin at /admin/")


@transaction.atomic
def seed_demo() -> list[tuple[str, str]]:
    """Create the demo (skipping what exists). Returns (username, description) for the login list."""
    User = get_user_model()
    system = Actor.system()
    for spec in TENANTS:
        if not Tenant.objects.filter(slug=spec["slug"]).exists():
            tenant_create(actor=system, **spec)
    for spec in PROJECTS:
        if not Project.objects.filter(slug=spec["slug"]).exists():
            values = dict(spec)
            tenant = Tenant.objects.get(slug=values.pop("tenant"))
            project_create(actor=system, tenant=tenant, **values)

    def ensure_user(username: str, full_name: str) -> object:
        user, created = User.objects.get_or_create(
            username=username,
            defaults={"first_name": full_name.split(maxsplit=1)[0], "last_name": full_name.rsplit(maxsplit=1)[-1], "email": f"{username}@example.com"},
        )
        if created:
            user.set_password(DEMO_PASSWORD)
            user.save()
        return user

    ops = ensure_user(OPS_USER[0], OPS_USER[1])
    ops_user_ensure(actor=system, user=ops)
    logins = [(OPS_USER[0], OPS_USER[2])]
    for username, full_name, tenant_slug, project_slug, role, what in USERS:
        user = ensure_user(username, full_name)
        tenant = Tenant.objects.get(slug=tenant_slug)
        project = Project.objects.get(slug=project_slug) if project_slug else None
        if not Membership.objects.filter(user=user, tenant=tenant, project=project).exists():
            membership_create(actor=system, tenant=tenant, project=project, user=user, role=role)
        logins.append((username, what))
    return logins
