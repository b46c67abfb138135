import cProfile
import pstats
import time
from datetime import UTC, datetime, timedelta

from django.db import connection
from django.test.utils import CaptureQueriesContext

from insights.models import MeasuredSample
from insights.reclaimable import reclaimable
from workloads.models import RequestState, WorkloadRequest

from ..workloads.factories import make_request
from .test_measured import fleet  # noqa: F401


def test_bench(cast, fleet) -> None:  # noqa: F811
    base = make_request(fleet, cast.vision, cast.carol, state=RequestState.RUNNING, gpus=1)
    rows = []
    for i in range(3000):
        r = WorkloadRequest(**{f.attname: getattr(base, f.attname) for f in WorkloadRequest._meta.concrete_fields if f.attname != "id"})
        r.name = f"b{i}"
        if i % 2:
            r.project_id, r.tenant_id = cast.llm.pk, cast.globex.pk
        rows.append(r)
    reqs = WorkloadRequest.objects.bulk_create(rows)
    t0 = datetime(2026, 11, 2, tzinfo=UTC)
    MeasuredSample.objects.bulk_create([MeasuredSample(
        at=t0 + timedelta(minutes=5 * k), request_id=r.pk, cluster_id=r.cluster_id, tenant_id=r.tenant_id,
        project_id=r.project_id, flavor_id=r.flavor_id, seconds=300, gpus=1, memory_mib=81559, util_avg=40,
        sm_active_avg=0.12, fb_used_max=9000 + k) for r in reqs for k in range(24)], batch_size=5000)
    reclaimable()
    with CaptureQueriesContext(connection) as q:
        p = cProfile.Profile()
        p.enable()
        s = time.perf_counter()
        reclaimable()
        total = time.perf_counter() - s
        p.disable()
    print("\nBENCH total", round(total, 3), [(x["time"], x["sql"][:80]) for x in q.captured_queries])
    pstats.Stats(p).sort_stats("cumulative").print_stats(18)
    assert 0
