"""PostgreSQL's timestamps and JSON are read by psycopg's C loaders (portal/db_types.py), with the very values Django's
own loaders give: the same instants, the same ``datetime.timezone.utc`` object, the same JSON text, on every
connection the portal opens."""

from __future__ import annotations

import datetime
import json

import psycopg
import pytest
from django.db import connection, connections
from django.db.backends.postgresql.psycopg_any import get_adapters_template

from portal.db_types import use_c_loaders
from tests.workloads.factories import make_catalogue, make_request
from workloads.models import WorkloadRequest

pytestmark = [pytest.mark.postgresql, pytest.mark.django_db]

VALUES = """SELECT t, '{"a": [1, 2.5, "é"], "b": null}'::jsonb, '10.0.0.1/24'::inet, '10.1.0.0/16'::cidr
            FROM unnest(ARRAY[
              '2026-12-04 17:13:28.123456+00', '2026-12-04 17:13:28+00', '2026-12-04 17:13:28.5+05:30',
              '1999-12-31 23:59:59.999999-08', '0001-01-01 00:00:00+00', '9999-12-31 23:59:59.999999+00',
              '2024-02-29 12:00:00+14', NULL]::timestamptz[]) AS t"""


def _django_reads() -> list[tuple]:
    """The rows as Django's own loaders read them, on a connection of their own."""
    params = connection.get_connection_params()
    with psycopg.connect(**{**params, "context": get_adapters_template(True, datetime.UTC)}) as raw:
        raw.execute("SET TIME ZONE 'UTC'")
        assert raw.adapters.get_loader(1184, 0).__module__.startswith("django")
        return raw.execute(VALUES).fetchall()


def test_the_portal_reads_timestamps_and_json_with_the_c_loaders_and_gets_what_django_would() -> None:
    connection.ensure_connection()
    loader = connection.connection.adapters.get_loader(1184, 0)  # timestamptz, text
    assert loader.__name__ == "UtcTimestamptzLoader" and loader.timezone is datetime.UTC
    assert connection.connection.adapters.get_loader(3802, 0).__module__ == "psycopg_binary._psycopg"  # jsonb
    with connection.cursor() as cursor:
        cursor.execute(VALUES)
        ours = cursor.fetchall()
    theirs = _django_reads()
    assert ours == theirs
    assert all(r[0] is None or r[0].tzinfo is datetime.UTC for r in ours)
    assert ours[2][0] == datetime.datetime(2026, 12, 4, 11, 43, 28, 500000, tzinfo=datetime.UTC)
    assert json.loads(ours[0][1]) == {"a": [1, 2.5, "é"], "b": None}


def test_models_round_trip_through_the_c_loaders(cast) -> None:
    req = make_request(make_catalogue(cast), cast.vision, cast.carol,
                       parameters={"command": "python train.py", "env": {"K": "é"}})
    moment = datetime.datetime(2026, 3, 29, 1, 30, 0, 250000, tzinfo=datetime.UTC)
    WorkloadRequest.objects.filter(pk=req.pk).update(started_at=moment)
    read = WorkloadRequest.objects.get(pk=req.pk)
    assert read.started_at == moment and read.started_at.tzinfo is datetime.UTC
    assert read.parameters == {"command": "python train.py", "env": {"K": "é"}}
    assert WorkloadRequest.objects.filter(started_at=moment).values_list("pk", flat=True).get() == req.pk


def test_a_database_in_another_time_zone_keeps_djangos_loader(settings) -> None:
    """Only UTC connections get the C loader: another zone needs Django's tzinfo replacement."""
    wrapper = connections.create_connection("default")
    wrapper.settings_dict = {**wrapper.settings_dict, "TIME_ZONE": "Europe/Paris"}
    try:
        wrapper.ensure_connection()
        use_c_loaders(sender=type(wrapper), connection=wrapper)
        loader = wrapper.connection.adapters.get_loader(1184, 0)
        assert loader.__name__ == "SpecificTzLoader" and str(loader.timezone) == "Europe/Paris"
        with wrapper.cursor() as cursor:
            cursor.execute("SELECT '2026-12-04 17:00:00+00'::timestamptz")
            (value,) = cursor.fetchone()
        assert value == datetime.datetime(2026, 12, 4, 18, 0, tzinfo=datetime.timezone(datetime.timedelta(hours=1)))
        assert str(value.tzinfo) == "Europe/Paris"
    finally:
        wrapper.close()
