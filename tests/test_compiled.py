"""``portal.compiled.Compiled``: a query compiled once per shape, then run with each call's values, gives what the
queryset itself gives (model instances with their ``select_related`` objects and annotations, ``values()`` dicts),
asks one query per call, and builds the queryset only once per shape. A build that does not pass a value into the
query's parameters is never kept (it runs as it is, every time)."""

from __future__ import annotations

from typing import Any

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


# PostgreSQL: the kept SQL runs as a prepared statement ---------------------------------------------------------------


def _prepared_statements() -> list[str]:
    with connection.cursor() as cursor:
        cursor.execute("SELECT statement FROM pg_prepared_statements WHERE from_sql = false")
        return [row[0] for row in cursor.fetchall()]


postgres_only = pytest.mark.skipif(connection.vendor != "postgresql", reason="prepared statements: PostgreSQL")


@postgres_only
def test_on_postgresql_a_kept_query_is_prepared_once_per_connection(cast) -> None:
    compiled = Compiled(lambda slug: Project.objects.filter(slug=slug).values_list("slug", flat=True))
    assert compiled.rows(cast.vision.slug) == [cast.vision.slug]
    mine = [s for s in _prepared_statements() if '"tenants_project"."slug" = $1' in s]
    assert len(mine) == 1  # bound on the server: $1, not the value
    with CaptureQueriesContext(connection) as ctx:
        assert compiled.rows(cast.nlp.slug) == [cast.nlp.slug]
    assert len([s for s in _prepared_statements() if '"tenants_project"."slug" = $1' in s]) == 1  # not again
    assert len(ctx.captured_queries) == 1 and f"'{cast.nlp.slug}'" in ctx.captured_queries[0]["sql"]  # logged with its value


@postgres_only
def test_db_prepare_off_binds_on_the_client(cast, settings) -> None:
    settings.DB_PREPARE = False
    compiled = Compiled(lambda slug: Project.objects.filter(slug=slug).exclude(slug="zz-off").values_list("slug", flat=True))
    assert compiled.rows(cast.vision.slug) == [cast.vision.slug]
    assert not [s for s in _prepared_statements() if "zz-off" in s]


@postgres_only
def test_a_statement_the_server_will_not_prepare_runs_unprepared_from_then_on(cast) -> None:
    from django.db import DatabaseError, transaction

    # "$1 IS NULL": the server cannot infer the parameter's type, so it refuses to prepare the statement.
    compiled = Compiled(lambda slug: Project.objects.extra(where=["%s IS NULL OR TRUE"], params=[slug])
                        .filter(slug=cast.vision.slug).values_list("slug", flat=True))
    with pytest.raises(DatabaseError), transaction.atomic():  # inside a transaction the refusal stands (the transaction is lost)
        compiled.rows("x")
    assert compiled.rows("y") == [cast.vision.slug]  # never prepared again: bound on the client
    assert compiled._unpreparable


@postgres_only
def test_every_compiled_query_of_the_portal_prepares(cast, token_client) -> None:
    """The hot paths that use ``Compiled``: a token's reads and a submission (token, replay and name, quota row),
    a request's detail, a signed-in page (the session's user), the quota pages' sums and confirmations, the
    approvals inbox's context. None may be refused by the server."""
    from django.test import Client

    from portal import compiled as module
    from quotas import selectors as quota_selectors
    from quotas.models import Quota, QuotaRequest
    from tests.workloads.factories import make_catalogue
    from workloads import selectors as wl_selectors

    cat = make_catalogue(cast)
    # A quota request, so the quota pages below show a card and a row (their related names: one compiled query).
    QuotaRequest.objects.create(project=cast.vision, flavor=cat.h100, resource="nvidia.com/gpu", amount=1,
                                reason="a second run", requested_by=cast.carol, approver=QuotaRequest.Approver.PROJECT_ADMIN)
    rows = list(Quota.objects.select_related("flavor__cluster", "project"))
    assert set(quota_selectors.quota_confirmations(rows)) == {r.pk for r in rows}
    assert quota_selectors.quota_sums_for(cluster=cat.cluster)
    assert wl_selectors._QUOTA_ROWS_OF.rows((cast.vision.pk, cast.nlp.pk))  # the approvals inbox's context
    assert wl_selectors._QUEUE_OF.rows((cast.vision.pk,), (cat.h100.pk,)) == []

    def by_key(found):
        return sorted(found, key=lambda r: (r["flavor_id"], r["resource"]))

    assert by_key(quota_selectors._QUOTA_SUMS.rows(cat.cluster.pk)) == by_key(quota_selectors._quota_sums_query(cat.cluster.pk))
    client, _ = token_client("carol", cast.vision, "read+submit")
    body = {"template": "training", "gpus": 1, "name": "prep", "parameters": {"command": "python train.py"}}
    made = client.post("/api/v1/requests/", body, format="json", HTTP_IDEMPOTENCY_KEY="prep-1")
    assert made.status_code == 201, made.content
    again = client.post("/api/v1/requests/", body | {"name": ""}, format="json", HTTP_IDEMPOTENCY_KEY="prep-2")
    assert again.status_code == 201, again.content
    # Refused submissions with a key look for the call they may repeat: by key and name, and by key alone.
    for name, key in (("prep", "prep-3"), ("", "prep-4")):
        refused = client.post("/api/v1/requests/", body | {"name": name, "gpus": 10_000}, format="json",
                              HTTP_IDEMPOTENCY_KEY=key)
        assert refused.status_code == 400, refused.content
    assert client.get(f"/api/v1/requests/{made.json()['id']}/").status_code == 200
    assert client.get("/api/v1/requests/").status_code == 200
    pending = client.post("/api/v1/requests/", body | {"name": "big", "gpus": 4}, format="json")
    assert pending.status_code == 201 and pending.json()["state"] == "pending_approval", pending.content
    # An extension request waiting, so the inbox reads its extension list (none is read while none waits).
    from tests.workloads.factories import make_request
    from workloads.extensions import extension_request_create
    from workloads.models import RequestState

    running = make_request(cat, cast.vision, cast.carol, state=RequestState.RUNNING, name="longer")
    extension_request_create(actor=cast.actor("carol"), request=running, hours=2, reason="more time")
    browser = Client()
    for who, path in [("carol", f"/api/v1/requests/{made.json()['id']}/"), ("ops", f"/api/v1/requests/{made.json()['id']}/"),
                      ("carol", "/requests/"),
                      ("carol", f"/projects/{cast.vision.slug}/quota/"), ("bob", f"/projects/{cast.vision.slug}/quota/"),
                      ("carol", f"/projects/{cast.vision.slug}/"), ("alice", f"/projects/{cast.vision.slug}/"),
                      ("bob", "/approvals/"), ("ops", "/approvals/"),
                      ("alice", f"/tenants/{cast.acme.slug}/quotas/"), ("ops", "/ops/capacity/"),
                      ("bob", "/quota-requests/"), ("ops", "/quota-requests/")]:
        browser.force_login(getattr(cast, who))
        assert browser.get(path).status_code == 200, (who, path)
    portal = [c for c in module.ALL if not c._build.__module__.startswith("tests")]
    # Every Compiled of the portal ran here: a new one must add the page or call that uses it above.
    assert all(c._kept for c in portal), [f"{c._build.__module__}.{c._build.__qualname__}:{c._build.__code__.co_firstlineno}" for c in portal if not c._kept]
    assert all(not c._unpreparable for c in portal), [c._build.__module__ for c in portal if c._unpreparable]
    assert len(_prepared_statements()) >= 5
    # The replay check is kept unprepared (its partial indexes need a plan made with the values).
    assert not [s for s in _prepared_statements() if s.startswith("SELECT") and "idempotency_key" in s]
    # A submission's INSERT is prepared (portal.compiled.KeptInsert).
    assert [s for s in _prepared_statements() if s.startswith('INSERT INTO "workloads_workloadrequest"')]


@postgres_only
def test_a_kept_insert_writes_what_save_writes_and_signals_as_save_does(cast, settings) -> None:
    from django.db.models.signals import post_save, pre_save

    from portal.compiled import KeptInsert

    seen: list[tuple[str, str, bool | None]] = []

    def noted(signal: str) -> Any:
        return lambda sender, instance, **kw: seen.append((signal, instance.slug, kw.get("created")))

    pre_save.connect(noted("pre"), sender=Project, weak=False, dispatch_uid="kept-pre")
    post_save.connect(noted("post"), sender=Project, weak=False, dispatch_uid="kept-post")
    try:
        kept = KeptInsert(Project)
        first = Project(tenant=cast.acme, name="Kept", slug="kept-one", description="by the kept insert")
        kept.insert(first)
        second = Project(tenant=cast.acme, name="Kept 2", slug="kept-two", description="by the kept insert")
        kept.insert(second)
        saved = Project(tenant=cast.acme, name="Saved", slug="kept-three", description="by the kept insert")
        saved.save(force_insert=True)
        settings.DB_PREPARE = False  # then it is save() itself
        unprepared = Project(tenant=cast.acme, name="Off", slug="kept-four", description="by the kept insert")
        kept.insert(unprepared)
    finally:
        pre_save.disconnect(dispatch_uid="kept-pre", sender=Project)
        post_save.disconnect(dispatch_uid="kept-post", sender=Project)
    assert seen == [(when, slug, created) for slug in ("kept-one", "kept-two", "kept-three", "kept-four")
                    for when, created in (("pre", None), ("post", True))]
    assert first.pk and second.pk > first.pk and not first._state.adding and first._state.db == "default"
    ignore = {"id", "slug", "name", "created_at", "updated_at"}
    rows = [{k: v for k, v in row.items() if k not in ignore}
            for row in Project.objects.filter(description="by the kept insert").order_by("pk").values()]
    assert len(rows) == 4 and all(row == rows[2] for row in rows)  # the kept inserts wrote what save() wrote
    assert Project.objects.get(pk=first.pk).created_at == first.created_at  # auto_now_add set on the instance too
    assert len([s for s in _prepared_statements() if s.startswith('INSERT INTO "tenants_project"')]) == 1


@postgres_only
def test_a_kept_statement_of_many_values_is_cut_once(cast) -> None:
    """psycopg's cache of how a statement is cut around its placeholders takes the request's INSERT (56 values)."""
    from psycopg import _queries

    from portal.compiled import KeptInsert
    from tests.workloads.factories import make_catalogue, make_request
    from workloads.models import WorkloadRequest

    cat = make_catalogue(cast)
    template = make_request(cat, cast.vision, cast.carol, name="model-row")
    kept = KeptInsert(WorkloadRequest)
    assert len(kept._fields) > 50
    rows = []
    for n in range(3):
        row = WorkloadRequest.objects.get(pk=template.pk)
        row.pk, row.id, row.name, row.idempotency_key = None, None, f"kept-{n}", ""
        rows.append(row)
    kept.insert(rows[0])
    before = _queries._query2pg.cache_info()
    kept.insert(rows[1])
    kept.insert(rows[2])
    after = _queries._query2pg.cache_info()
    assert after.hits >= before.hits + 2 and after.misses == before.misses
    assert WorkloadRequest.objects.filter(name__startswith="kept-").count() == 3


@postgres_only
def test_prepare_false_keeps_a_statement_unprepared(cast) -> None:
    compiled = Compiled(lambda slug: Project.objects.filter(slug=slug).exclude(slug="zz-unprepared")
                        .values_list("slug", flat=True), prepare=False)
    assert compiled.rows(cast.vision.slug) == [cast.vision.slug]
    assert not [s for s in _prepared_statements() if "zz-unprepared" in s]
