"""Shared fixtures: the cast (one per role, plus an outsider tenant), API clients, the sandbox cluster.

The cast (docs/conventions.md, "Tests"): in tenant A ("acme") alice is tenant admin, bob project admin of
acme-vision, carol member, dave viewer; in tenant B ("globex") erin is tenant admin and frank a
member of globex-llm; ops is platform ops; nobody has no role anywhere.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from django.conf import settings
from rest_framework.test import APIClient

from tenants.access import Actor
from tenants.models import Project, Role, Tenant
from tenants.services import ops_user_ensure, token_create

from .factories import PASSWORD, UserFactory, make_member, make_project, make_tenant

pytest_plugins = ["sandbox.testing", "realcluster.testing", "tests.oidc.provider"]  # the test OpenID provider (single sign-on)


def _services_in_use() -> tuple[str, str]:
    db = settings.DATABASES["default"]
    database = f"{db['ENGINE'].rsplit('.', 1)[-1]} {db.get('HOST') or ''}{':' + str(db['PORT']) if db.get('PORT') else ''}".strip()
    broker = settings.CELERY_BROKER_URL.split("@")[-1]
    return database, broker


def pytest_report_header(config: pytest.Config) -> list[str]:
    database, broker = _services_in_use()
    return [f"portal database: {database}", f"portal broker: {broker}"]


def pytest_configure(config: pytest.Config) -> None:
    # CI insists on the production stack: a run that fell back to SQLite or the embedded SQLite broker fails.
    if os.environ.get("PORTAL_REQUIRE_SERVICES") == "1":
        database, broker = _services_in_use()
        if not database.startswith("postgresql") or not broker.startswith(("redis", "127.0.0.1:6379")):
            raise pytest.UsageError(f"PORTAL_REQUIRE_SERVICES=1 but tests would use {database} and {broker}")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # PostgreSQL-only tests (marker ``postgresql``) are left out of SQLite runs, loudly; CI runs on PostgreSQL.
    if settings.DATABASES["default"]["ENGINE"].endswith("postgresql"):
        return
    left_out = [item for item in items if item.get_closest_marker("postgresql")]
    if left_out:
        config.hook.pytest_deselected(items=left_out)
        items[:] = [item for item in items if not item.get_closest_marker("postgresql")]
        print(f"\n{len(left_out)} PostgreSQL-only tests left out: this run uses SQLite")


@pytest.fixture(autouse=True)
def _fast_password_hashing(settings) -> None:
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


@pytest.fixture(autouse=True)
def private_cache(settings) -> Iterator[None]:
    """Task locks count in the cache: give every test an empty in-memory one."""
    settings.CACHES = {"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache", "LOCATION": "tests"}}
    from django.core.cache import cache

    cache.clear()
    yield
    cache.clear()


@dataclass
class Cast:
    acme: Tenant
    vision: Project
    nlp: Project
    globex: Tenant
    llm: Project
    ops: Any
    alice: Any
    bob: Any
    carol: Any
    dave: Any
    erin: Any
    frank: Any
    nobody: Any

    def actor(self, who: str) -> Actor:
        return Actor(user=getattr(self, who))


@pytest.fixture
def cast(db) -> Cast:
    acme = make_tenant("acme", name="Acme Research")
    globex = make_tenant("globex", name="Globex AI")
    vision = make_project(acme, "acme-vision", name="Vision")
    nlp = make_project(acme, "acme-nlp", name="NLP")
    llm = make_project(globex, "globex-llm", name="LLM")
    users = {name: UserFactory(username=name) for name in ["ops", "alice", "bob", "carol", "dave", "erin", "frank", "nobody"]}
    ops_user_ensure(actor=Actor.system(), user=users["ops"])
    make_member(users["alice"], acme, Role.TENANT_ADMIN)
    make_member(users["bob"], acme, Role.PROJECT_ADMIN, vision)
    make_member(users["carol"], acme, Role.MEMBER, vision)
    make_member(users["dave"], acme, Role.VIEWER, vision)
    make_member(users["erin"], globex, Role.TENANT_ADMIN)
    make_member(users["frank"], globex, Role.MEMBER, llm)
    return Cast(acme=acme, vision=vision, nlp=nlp, globex=globex, llm=llm, **users)


@pytest.fixture
def api(cast: Cast):
    """``api("carol")`` is an APIClient logged in as carol (session auth, like the browser)."""

    def make(who: str) -> APIClient:
        client = APIClient()
        client.force_login(getattr(cast, who))
        return client

    return make


@pytest.fixture
def as_user(cast: Cast, client):
    """``as_user("carol")`` is the test client (pages, session) signed in as carol."""

    def make(who: str):
        client.logout()
        client.force_login(getattr(cast, who))
        return client

    return make


@pytest.fixture
def token_client(cast: Cast):
    """``token_client("carol", project, scope)`` -> (APIClient with a Bearer token, token row)."""

    def make(who: str, project: Project, scope: str = "read") -> tuple[APIClient, Any]:
        token, raw = token_create(actor=cast.actor(who), project=project, name=f"{who}-ci", scope=scope)
        client = APIClient()
        client.credentials(HTTP_AUTHORIZATION=f"Bearer {raw}")
        return client, token

    return make


@pytest.fixture
def password() -> str:
    return PASSWORD


@pytest.fixture
def jinja_renders(monkeypatch) -> list[str]:
    """The names of the Jinja2 templates rendered from the top, in order (an include or a macro inside one is not a
    render): those the pages write (``portal.jinja_env.render_released``) and the htmx answers (``Template.render``)."""
    from jinja2 import Template

    from portal import jinja_env

    names: list[str] = []
    real_render, real_released = Template.render, jinja_env.render_released

    def render(self, *args, **kwargs):
        names.append(self.name)
        return real_render(self, *args, **kwargs)

    def released(template, values):
        names.append(template.name)
        return real_released(template, values)

    monkeypatch.setattr(Template, "render", render)
    monkeypatch.setattr(jinja_env, "render_released", released)
    return names
