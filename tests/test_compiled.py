"""``portal.compiled.Compiled``: a query compiled once per shape, then run with each call's values, gives what the
queryset itself gives (model instances with their ``select_related`` objects and annotations, ``values()`` dicts),
asks one query per call, and builds the queryset only once per shape. A build that does not pass a value into the
query's parameters is never kept (it runs as it is, every time)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from portal.compiled import Compiled
from tenants.access import token_memberships
from tenants.authentication import token_generate
from tenants.models import ApiToken, Project

pytestmark = pytest.mark.django_db


def _token(cast, who: str, project: Project) -> ApiToken:
    _, prefix, hashed = token_generate()
    return ApiToken.objects.create(name=f"{who}-t", project=project, user=getattr(cast, who), scope="read",
                                   prefix=prefix, secret_hash=hashed, expires_at=timezone.now() + timedelta(days=1))


def _fields(token: ApiToken) -> tuple:
    return (token.pk, token.prefix, token.secret_hash, token.expires_at, token.user.pk, token.user.username,
            token.project.slug, token.project.tenant.slug, token.memberships_here)


def test_model_rows_with_related_objects_and_annotations_are_the_querysets(cast) -> None:
    builds = []

    def build(prefix):
        builds.append(prefix)
        return (ApiToken.objects.select_related("user", "project__tenant")
                .annotate(memberships_here=token_memberships()).filter(prefix=prefix))

    compiled = Compiled(build)
    tokens = [_token(cast, "carol", cast.vision), _token(cast, "alice", cast.nlp), _token(cast, "dave", cast.vision)]
    for token in tokens:
        with CaptureQueriesContext(connection) as ctx:
            got = compiled.rows(token.prefix)
        assert len(ctx.captured_queries) == 1
        expected = list(ApiToken.objects.select_related("user", "project__tenant")
                        .annotate(memberships_here=token_memberships()).filter(prefix=token.prefix))
        assert [_fields(t) for t in got] == [_fields(t) for t in expected]
        assert got[0].project.tenant.slug == token.project.tenant.slug  # the related objects came with it
    assert compiled.rows("nosuchprefix") == []
    assert len(builds) == 1  # built and compiled once, with a stand-in


def test_values_rows_per_number_of_ids_and_none_for_no_ids(cast) -> None:
    builds = []

    def build(ids, slug):
        builds.append(len(ids))
        return Project.objects.filter(pk__in=ids).exclude(slug=slug).order_by("pk").values("pk", "slug", "tenant__slug")

    compiled = Compiled(build)
    ids = sorted(Project.objects.values_list("pk", flat=True))
    assert len(ids) >= 3
    cases = [(ids[:1], "x"), (ids[1:2], "x"), (ids[:3], cast.nlp.slug), (ids[1:3], "x"), (ids, "x")]
    for chosen, slug in cases:
        expected = list(Project.objects.filter(pk__in=chosen).exclude(slug=slug).order_by("pk")
                        .values("pk", "slug", "tenant__slug"))
        assert compiled.rows(tuple(chosen), slug) == expected
    with CaptureQueriesContext(connection) as ctx:
        assert compiled.rows((), "x") == []
    assert ctx.captured_queries == []  # IN () matches nothing: no query, as Django does
    assert sorted(builds) == sorted({len(chosen) for chosen, _ in cases} | {0})  # once per number of ids


def test_a_value_not_passed_as_a_parameter_is_never_kept(cast) -> None:
    builds = []

    def build(slug):
        builds.append(slug)
        return Project.objects.filter(slug=cast.vision.slug).values_list("slug", flat=True)  # ignores its argument

    compiled = Compiled(build)
    assert compiled.rows("anything") == [cast.vision.slug]
    assert compiled.rows("else") == [cast.vision.slug]
    assert builds[-2:] == ["anything", "else"]  # built with the caller's values each time, never from a kept text


def test_only_ints_strings_and_tuples_of_ints(cast) -> None:
    compiled = Compiled(lambda value: Project.objects.filter(pk=value))
    for value in (1.5, None, True):
        with pytest.raises(TypeError):
            compiled.rows(value)
