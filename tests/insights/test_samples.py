"""The sampler (``insights.samples_take``, the beat task) on a constructed cluster: one sample per project quota and
per GPU flavor, the pending demand, MIG shape mismatch, and one row per 5-minute slot however often it runs."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from decimal import Decimal

from insights.models import PoolSample, QueueSample
from insights.samples import samples_take, slot_of
from insights.tasks import samples_take_task
from quotas.models import Flavor, Node, Quota
from workloads.models import RequestState

from ..workloads.factories import make_quota, make_request

S = RequestState


def test_one_sample_per_queue_and_flavor_per_slot(cast, cat) -> None:
    mig3 = Flavor.objects.create(cluster=cat.cluster, name="a100-3g.40gb", kind=Flavor.Kind.MIG, gpu_model="a100-80gb",
                                 mig_profile="3g.40gb", order=30)
    make_quota(cast.vision, mig3, 2)
    Node.objects.create(cluster=cat.cluster, name="gpu-1", allocatable={"nvidia.com/gpu": "8"})
    Node.objects.create(cluster=cat.cluster, name="mig-1",
                        allocatable={"nvidia.com/mig-1g.10gb": "1", "nvidia.com/mig-3g.40gb": "2"})
    Quota.objects.filter(project=cast.vision, flavor=cat.h100).update(used=Decimal(6), borrowed=Decimal(0))
    now = datetime.now(UTC)
    make_request(cat, cast.vision, cast.carol, state=S.RUNNING, gpus=4, admitted_at=now)
    make_request(cat, cast.vision, cast.carol, state=S.QUEUED, gpus=2, admitted_at=now)  # admitted, pods starting
    make_request(cat, cast.vision, cast.carol, state=S.QUEUED, gpus=2, replicas=2)
    make_request(cat, cast.vision, cast.carol, state=S.PREEMPTED, gpus=1)
    make_request(cat, cast.vision, cast.carol, state=S.SUCCEEDED, gpus=8)
    # An idle notebook: past its template's timeout since its start.
    cat.notebook.idle_timeout_minutes = 30
    cat.notebook.save()
    make_request(cat, cast.llm, cast.frank, template=cat.notebook, state=S.RUNNING, gpus=1,
                 started_at=now - timedelta(hours=2), admitted_at=now - timedelta(hours=2))
    for _ in range(4):  # MIG: four 1g.10gb slices wait; one free 1g slice, 80 GiB free in 3g.40gb slices
        make_request(cat, cast.vision, cast.carol, state=S.QUEUED, gpus=1, flavor=cat.mig)

    assert samples_take(now) == {"queue_samples": 5, "pool_samples": 3}
    assert samples_take_task.apply().get() == {"queue_samples": 5, "pool_samples": 3}
    assert samples_take(now + timedelta(seconds=1)) == {"queue_samples": 5, "pool_samples": 3}
    at = slot_of(now)
    assert QueueSample.objects.count() == 5 and PoolSample.objects.count() == 3
    assert set(QueueSample.objects.values_list("at", flat=True)) == {at}
    assert at.minute % 5 == 0 and at.second == 0 and at <= now < at + timedelta(minutes=5)

    vision = QueueSample.objects.get(project=cast.vision, flavor=cat.h100)
    assert (vision.nominal, vision.borrowing_limit, vision.admitted) == (8, 2, 6)
    assert (vision.pending, vision.pending_count, vision.pending_smallest) == (5, 2, 1)
    nlp = QueueSample.objects.get(project=cast.nlp, flavor=cat.h100)
    assert (nlp.pending, nlp.pending_count, nlp.borrowing_limit) == (0, 0, None)

    h100 = PoolSample.objects.get(flavor=cat.h100)
    assert (h100.capacity, h100.allocated, h100.pending, h100.idle_allocated) == (8, 7, 5, 1)
    assert h100.promised == 8 + 2 + 4 and h100.shape_mismatch == 0
    one_g = PoolSample.objects.get(flavor=cat.mig)
    # One of the four fits the free 1g slice; three could have been cut from the 80 GiB free elsewhere.
    assert (one_g.capacity, one_g.pending, one_g.shape_mismatch, one_g.free_memory_gib) == (1, 4, 3, 90)
    assert PoolSample.objects.get(flavor=mig3).shape_mismatch == 0

    # A later slot is a new sample; the earlier one stays.
    samples_take(now + timedelta(minutes=5))
    assert QueueSample.objects.count() == 10 and PoolSample.objects.count() == 6
