"""Measured GPU use (insights/measured.py): the metrics on constructed histories with known answers, rightsizing for
the sandbox's usage profiles, and the request page's suggestion with "Clone with the suggestion"."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from insights import measured
from insights.models import MeasuredSample
from insights.registry import METRICS, Query
from quotas.models import Flavor
from tenants.access import scope_of
from workloads.models import RequestState

from ..workloads.factories import make_quota, make_request

T0 = datetime(2026, 11, 2, 10, 0, tzinfo=UTC)
START, END = datetime(2026, 11, 1, tzinfo=UTC), datetime(2026, 11, 8, tzinfo=UTC)
SLOT = timedelta(minutes=5)
H100_MIB = 81559


@pytest.fixture
def fleet(cast, cat) -> Any:
    """The catalogue's H100 with its memory, and a 2g.20gb MIG flavor beside the 1g.10gb one, both allowed."""
    Flavor.objects.filter(pk=cat.h100.pk).update(gpu_memory_mib=H100_MIB)
    cat.h100.refresh_from_db()
    mig2 = Flavor.objects.create(cluster=cat.cluster, name="a100-2g.20gb", display_name="A100 2g.20gb",
                                 kind=Flavor.Kind.MIG, gpu_model="a100-80gb", mig_profile="2g.20gb", order=21)
    for t in (cat.training, cat.notebook):
        if t.allowed_flavors.exists():
            t.allowed_flavors.add(mig2, cat.mig)
    make_quota(cast.vision, mig2, 4)
    cat.mig2 = mig2
    return cat


def sample(req: Any, slot: int, *, util: float, sm: float = 0.5, fb: float = 1000.0, gpus: int | None = None,
           memory: int | None = None) -> MeasuredSample:
    return MeasuredSample.objects.create(
        at=T0 + slot * SLOT, request=req, cluster_id=req.cluster_id, tenant_id=req.tenant_id,
        project_id=req.project_id, flavor_id=req.flavor_id, seconds=300, gpus=gpus or req.gpus,
        memory_mib=memory or measured.device_memory_mib(req.flavor), util_avg=util, sm_active_avg=sm, fb_used_max=fb)


def q(cast: Any, who: str, **kwargs: Any) -> Query:
    return Query(scope=scope_of(cast.actor(who)), start=START, end=END, **kwargs)


def rows(result: Any) -> dict[str, dict[str, Any]]:
    return {r.group: r.values for r in result.rows}


def test_measured_metrics_on_a_constructed_history(cast, fleet) -> None:
    a = make_request(fleet, cast.vision, cast.carol, state=RequestState.RUNNING, gpus=2)
    b = make_request(fleet, cast.nlp, cast.alice, state=RequestState.RUNNING, gpus=1)
    c = make_request(fleet, cast.llm, cast.frank, state=RequestState.RUNNING, gpus=1)
    # a: 2 GPUs for 4 slots at 80, 80, 2, 2 % -> 41 %; 2 idle slots x 2 GPUs x 5 min = 20 min idle
    for slot, util in enumerate((80, 80, 2, 2)):
        sample(a, slot, util=util, fb=H100_MIB / 4)  # a quarter of each card: 75 % headroom
    # b: 1 GPU for 2 slots at 10 %, using all its memory
    for slot in range(2):
        sample(b, slot, util=10, fb=H100_MIB)
    sample(c, 0, util=0, fb=0)
    ops = rows(METRICS["measured-utilisation"].compute(q(cast, "ops", group_by="project")))
    assert ops["acme-vision"]["measured_utilisation"] == 41.0
    assert ops["acme-vision"]["allocated_gpu_hours"] == pytest.approx(8 * 5 / 60, abs=1e-3)
    assert ops["acme-vision"]["measured_busy_gpu_hours"] == pytest.approx(0.41 * 8 * 5 / 60, abs=1e-3)
    assert ops["acme-nlp"]["measured_utilisation"] == 10.0
    # the tenant: (80*2*2 + 2*2*2 + 10*2) / (8 + 2) device-slots = 348 / 10 = 34.8 %
    tenants = rows(METRICS["measured-utilisation"].compute(q(cast, "ops", group_by="tenant")))
    assert tenants["acme"]["measured_utilisation"] == 34.8 and tenants["globex"]["measured_utilisation"] == 0.0
    idle = rows(METRICS["idle-gpu-hours"].compute(q(cast, "ops", group_by="project")))
    assert idle["acme-vision"]["measured_idle_gpu_hours"] == pytest.approx(20 / 60, abs=1e-3)
    assert idle["acme-vision"]["measured_idle_share"] == 50.0
    assert idle["acme-nlp"]["measured_idle_gpu_hours"] == 0  # 10 % is above the 5 % threshold
    head = rows(METRICS["memory-headroom"].compute(q(cast, "ops", group_by="project")))
    assert head["acme-vision"]["measured_memory_headroom"] == 75.0 and head["acme-nlp"]["measured_memory_headroom"] == 0.0
    # every figure says which it is
    result = METRICS["idle-gpu-hours"].compute(q(cast, "ops"))
    assert all(title.startswith(("Measured", "Allocated")) for title, _ in result.columns.values())
    # scoped: a tenant admin sees only their tenant's projects
    alice = rows(METRICS["measured-utilisation"].compute(q(cast, "alice", group_by="project")))
    assert set(alice) == {"acme-vision", "acme-nlp"}
    erin = rows(METRICS["measured-utilisation"].compute(q(cast, "erin", group_by="project")))
    assert set(erin) == {"globex-llm"}


def profile_samples(req: Any, *, fb: float, sm: float, util: float, n: int = 6) -> None:
    for slot in range(n):
        sample(req, slot, util=util, sm=sm * (0.9 + 0.2 * slot / n), fb=fb * (0.95 + 0.05 * slot / (n - 1)))


@pytest.mark.parametrize("profile, fb, sm, util, expect", [
    # the sandbox's profiles (sandbox/dcgm.py): peak memory, SM activity, GPU utilisation
    ("light", 9318, 0.12, 40, "a100-2g.20gb"),  # 9.1 GiB x 1.2 > 10 GiB: the 20 GiB slice
    ("idle", 1230, 0.002, 0, "a100-1g.10gb"),
    ("saturated", 0.93 * H100_MIB, 0.95, 97, None),  # needs the whole card
])
def test_rightsizing_for_the_sandbox_profiles(cast, fleet, profile, fb, sm, util, expect) -> None:
    req = make_request(fleet, cast.vision, cast.carol, state=RequestState.SUCCEEDED, gpus=1, duration_hours=10)
    profile_samples(req, fb=fb, sm=sm, util=util)
    s = measured.suggestion(req)
    assert s is not None and s.peak_mib == pytest.approx(fb)
    if expect is None:
        assert s.flavor is None and "no smaller flavor" in s.sentence
        return
    assert s.flavor.name == expect and s.values == {"flavor": expect, "gpus": 1}
    assert f"peak {fb / 1024:.1f} GiB of 80 GiB" in s.sentence
    share = measured.device_compute_share(s.flavor)
    assert s.saving_gpu_hours == pytest.approx((1 - share) * 10, abs=0.01)


def test_fewer_whole_gpus_for_a_multi_gpu_request(cast, fleet) -> None:
    req = make_request(fleet, cast.vision, cast.carol, state=RequestState.RUNNING, gpus=4)
    profile_samples(req, fb=H100_MIB * 0.3, sm=0.3, util=30)  # each card a third busy: 4 x 0.36 -> 2 cards
    s = measured.suggestion(req)
    assert s.flavor == fleet.h100 and s.gpus == 2


def test_no_samples_no_suggestion(cast, fleet) -> None:
    req = make_request(fleet, cast.vision, cast.carol, state=RequestState.RUNNING)
    assert measured.suggestion(req) is None


def test_request_page_shows_the_suggestion_and_clone_prefills_it(cast, fleet, client) -> None:
    req = make_request(fleet, cast.vision, cast.carol, state=RequestState.SUCCEEDED, gpus=1)
    profile_samples(req, fb=9318, sm=0.12, util=40)
    client.force_login(cast.carol)
    page = client.get(f"/requests/{req.pk}/").content.decode()
    assert "peak 9.1 GiB of 80 GiB GPU memory, SM active 12 %" in page
    assert "Clone with the suggestion" in page and f"clone={req.pk}&amp;suggest=1" in page
    form = client.get(f"/requests/new/?template={req.template.slug}&project={cast.vision.slug}&clone={req.pk}&suggest=1")
    assert form.status_code == 200
    assert form.context["form"].initial["flavor"] == str(fleet.mig2.pk) and form.context["form"].initial["gpus"] == 1
    plain = client.get(f"/requests/new/?template={req.template.slug}&project={cast.vision.slug}&clone={req.pk}")
    assert plain.context["form"].initial["flavor"] == str(fleet.h100.pk)
    # outside the tenant: no page, no suggestion
    client.force_login(cast.frank)
    assert client.get(f"/requests/{req.pk}/").status_code == 404
