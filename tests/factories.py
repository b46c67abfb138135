"""factory_boy factories. Tenancy objects go through the services so permissions stay in sync."""

from __future__ import annotations

import factory
from django.contrib.auth import get_user_model

from tenants.access import Actor
from tenants.models import Project, Tenant
from tenants.services import membership_create, project_create, tenant_create

PASSWORD = "s3cret-pass-word"


class UserFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = get_user_model()
        django_get_or_create = ("username",)
        skip_postgeneration_save = True

    username = factory.Sequence(lambda n: f"user{n}")
    email = factory.LazyAttribute(lambda u: f"{u.username}@example.com")
    @factory.post_generation
    def password(self, create: bool, extracted: str | None, **kwargs) -> None:
        self.set_password(extracted or PASSWORD)
        if create:
            self.save(update_fields=["password"])


_seq = iter(range(1, 10**9))


def make_tenant(slug: str | None = None, **kwargs) -> Tenant:
    slug = slug or f"tenant-{next(_seq)}"
    return tenant_create(actor=Actor.system(), name=kwargs.pop("name", slug.title()), slug=slug, **kwargs)


def make_project(tenant: Tenant, slug: str | None = None, **kwargs) -> Project:
    slug = slug or f"{tenant.slug}-p{next(_seq)}"
    return project_create(actor=Actor.system(), tenant=tenant, name=kwargs.pop("name", slug), slug=slug, **kwargs)


def make_member(user, tenant: Tenant, role: str, project: Project | None = None):
    return membership_create(actor=Actor.system(), tenant=tenant, project=project, user=user, role=role)
