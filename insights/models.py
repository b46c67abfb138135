"""Samples of the cluster's state over time, the history that metrics which depend on "while" are computed from.

The status follower and the queue reconciler keep only the present (``quotas.Quota.used`` / ``borrowed``, node
allocatable); ``insights.samples_take`` (beat, every 5 minutes; ``insights/samples.py``) writes one ``QueueSample`` per project quota
and one ``PoolSample`` per flavor, so "while a queue had pending work, what share of its quota did it get" can be
answered for any past period. Rows the demo seeds carry ``seeded=True`` and the pages say so.
"""

from __future__ import annotations

from decimal import Decimal
from typing import Any

from django.db import models

from quotas.models import Cluster, Flavor
from tenants.models import Project, Tenant


class QueueSample(models.Model):
    """A project's queue (its ClusterQueue) for one flavor at one moment: promised, given, waiting."""

    at = models.DateTimeField()
    cluster = models.ForeignKey(Cluster, on_delete=models.CASCADE, related_name="+")
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="+")
    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="+")
    flavor = models.ForeignKey(Flavor, on_delete=models.CASCADE, related_name="+")
    nominal = models.DecimalField(max_digits=14, decimal_places=3, default=Decimal(0), help_text="Promised (nominal quota), in the flavor's unit.")
    borrowing_limit = models.DecimalField(max_digits=14, decimal_places=3, null=True, blank=True)
    admitted = models.DecimalField(max_digits=14, decimal_places=3, default=Decimal(0), help_text="Given: admitted usage.")
    borrowed = models.DecimalField(max_digits=14, decimal_places=3, default=Decimal(0), help_text="Admitted beyond nominal, from the cohort.")
    # What this queue lent to its cohort at that moment: the cohort's (tenant and flavor's) borrowed units split over
    # its queues in proportion to their unused nominal quota (``samples.fill_lent``; lending limits are not sampled).
    lent = models.DecimalField(max_digits=14, decimal_places=3, default=Decimal(0), help_text="Lent to the cohort.")
    pending = models.DecimalField(max_digits=14, decimal_places=3, default=Decimal(0), help_text="Demand waiting (queued, not admitted).")
    pending_count = models.PositiveIntegerField(default=0)
    # The smallest waiting request (gpus x replicas), so "could a waiting request fit in the unused guarantee?"
    # can be asked of the sample (the guarantee-violation rule, docs/insights.md). 0 when nothing waits.
    pending_smallest = models.DecimalField(max_digits=14, decimal_places=3, default=Decimal(0))
    seeded = models.BooleanField(default=False)

    class Meta:
        indexes = [models.Index(fields=["at", "project"]), models.Index(fields=["tenant", "at"])]
        constraints = [models.UniqueConstraint(fields=["at", "project", "flavor"], name="one_queue_sample_per_slot")]

    def __str__(self) -> str:
        return f"{self.project_id}/{self.flavor_id} at {self.at}: {self.admitted} of {self.nominal}"


class PoolSample(models.Model):
    """A flavor's capacity and allocation at one moment, and how much pending demand could not be placed."""

    at = models.DateTimeField()
    cluster = models.ForeignKey(Cluster, on_delete=models.CASCADE, related_name="+")
    flavor = models.ForeignKey(Flavor, on_delete=models.CASCADE, related_name="+")
    capacity = models.DecimalField(max_digits=14, decimal_places=3, default=Decimal(0), help_text="Allocatable units now.")
    allocated = models.DecimalField(max_digits=14, decimal_places=3, default=Decimal(0), help_text="Units held by admitted work.")
    idle_allocated = models.DecimalField(max_digits=14, decimal_places=3, default=Decimal(0), help_text="Allocated to idle notebooks / inference without traffic.")
    pending = models.DecimalField(max_digits=14, decimal_places=3, default=Decimal(0))
    # MIG: pending slices that no free slice of the right shape could take although enough slice memory was free.
    shape_mismatch = models.DecimalField(max_digits=14, decimal_places=3, default=Decimal(0))
    free_memory_gib = models.DecimalField(max_digits=14, decimal_places=3, default=Decimal(0))
    # The sum of the projects' nominal quotas of the flavor, and the cluster's overcommit setting, at that moment.
    promised = models.DecimalField(max_digits=14, decimal_places=3, default=Decimal(0))
    overcommit_percent = models.PositiveIntegerField(default=0)
    seeded = models.BooleanField(default=False)

    class Meta:
        indexes = [models.Index(fields=["at", "flavor"])]
        constraints = [models.UniqueConstraint(fields=["at", "flavor"], name="one_pool_sample_per_slot")]

    def __str__(self) -> str:
        return f"{self.flavor_id} at {self.at}: {self.allocated} of {self.capacity}"


class DigestSent(models.Model):
    """The weekly digest of one tenant for one week (its Monday, UTC), claimed before it is sent: a second run of
    ``insights.digests_send`` finds the row and sends nothing (docs/insights.md, "Pages, API and reports")."""

    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="+")
    week = models.DateField(help_text="The Monday (UTC) the digested week starts on.")
    sent_at = models.DateTimeField(auto_now_add=True)
    recipients = models.PositiveIntegerField(default=0)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["tenant", "week"], name="digest_once_per_tenant_week")]

    def __str__(self) -> str:
        return f"{self.tenant_id} week of {self.week}"


class RequestRollup(models.Model):
    """Requests approved on one UTC day, per tenant, cluster and flavor: the counts and wait histograms the
    scheduling metrics read for closed days (``insights/rollups.py``, docs/insights.md "Rollups").

    The histograms map a bucket index (``rollups.bucket_index``: fixed logarithmic buckets of seconds) to a count;
    only buckets with a request are stored."""

    day = models.DateField()
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="+")
    cluster = models.ForeignKey(Cluster, on_delete=models.CASCADE, related_name="+")
    flavor = models.ForeignKey(Flavor, on_delete=models.CASCADE, related_name="+")
    reached = models.PositiveIntegerField(default=0, help_text="Approved and reached the queue (queued or admitted).")
    in_time = models.PositiveIntegerField(default=0, help_text="Of those, first admitted within the target.")
    admitted = models.PositiveIntegerField(default=0, help_text="With an approval → first admission wait.")
    started = models.PositiveIntegerField(default=0, help_text="With an admission → running time.")
    admit_hist = models.JSONField(default=dict)
    start_hist = models.JSONField(default=dict)
    admit_p95 = models.FloatField(null=True, blank=True, help_text=(
        "P95 of admit_hist alone (rollups.histogram_percentile, seconds): a chart point made of this row only reads "
        "it instead of merging the histogram. Null: merge."))

    class Meta:
        indexes = [models.Index(fields=["day"])]
        constraints = [models.UniqueConstraint(fields=["day", "tenant", "cluster", "flavor"],
                                               name="one_request_rollup_per_day_group")]

    def __str__(self) -> str:
        return f"{self.day} {self.tenant_id}/{self.cluster_id}/{self.flavor_id}: {self.reached}"


class RequestRollupWeek(models.Model):
    """The ``RequestRollup`` rows of one ISO week (Monday to Sunday, UTC), summed per tenant, cluster and flavor:
    what the weekly charts read for whole weeks. Complete when its ``RollupWeek`` row exists; rebuilt from the day
    rows whenever one of its days is rolled up again."""

    week = models.DateField(help_text="The Monday the week starts on.")
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="+")
    cluster = models.ForeignKey(Cluster, on_delete=models.CASCADE, related_name="+")
    flavor = models.ForeignKey(Flavor, on_delete=models.CASCADE, related_name="+")
    reached = models.PositiveIntegerField(default=0)
    in_time = models.PositiveIntegerField(default=0)
    admitted = models.PositiveIntegerField(default=0)
    started = models.PositiveIntegerField(default=0)
    admit_hist = models.JSONField(default=dict)
    start_hist = models.JSONField(default=dict)
    admit_p95 = models.FloatField(null=True, blank=True)

    class Meta:
        indexes = [models.Index(fields=["week"])]
        constraints = [models.UniqueConstraint(fields=["week", "tenant", "cluster", "flavor"],
                                               name="one_request_rollup_per_week_group")]

    def __str__(self) -> str:
        return f"week of {self.week} {self.tenant_id}/{self.cluster_id}/{self.flavor_id}: {self.reached}"


class RollupWeek(models.Model):
    """An ISO week whose ``RequestRollupWeek`` rows sum its seven complete ``RequestRollup`` days, rolled up under
    ``admit_target_minutes``. Read only while all seven days are complete, clean and under the current target."""

    week = models.DateField(unique=True)
    computed_at = models.DateTimeField()
    admit_target_minutes = models.PositiveIntegerField()

    def __str__(self) -> str:
        return f"week of {self.week} at {self.computed_at}"


class RollupDay(models.Model):
    """A UTC day whose ``RequestRollup`` rows are complete: written by the refresh, read by the metrics. A day
    without this row (never rolled up), ``dirty`` or rolled up under another admission target is computed live."""

    day = models.DateField(unique=True)
    computed_at = models.DateTimeField()
    admit_target_minutes = models.PositiveIntegerField()
    dirty = models.BooleanField(default=False)

    def __str__(self) -> str:
        return f"{self.day} at {self.computed_at}"


class QueueSampleHour(models.Model):
    """One queue's (project and flavor's) ``QueueSample`` rows of one UTC hour, summed: what the sample metrics need
    to give over whole hours the same answers as from the samples (``insights/sample_rollups.py``, docs/insights.md
    "Rollups"). Bit ``i`` of a mask is the hour's ``i``-th 5-minute slot."""

    hour = models.DateTimeField()
    cluster = models.ForeignKey(Cluster, on_delete=models.CASCADE, related_name="+")
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="+")
    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="+")
    flavor = models.ForeignKey(Flavor, on_delete=models.CASCADE, related_name="+")
    samples = models.PositiveIntegerField(default=0)
    slots = models.PositiveIntegerField(default=0, help_text="Mask of the slots sampled.")
    pending_count = models.PositiveBigIntegerField(default=0, help_text="Sum of pending_count.")
    wanting = models.PositiveIntegerField(default=0, help_text="Samples with pending work and a nominal quota.")
    given_share = models.DecimalField(max_digits=24, decimal_places=12, default=Decimal(0),
                                      help_text="Sum over the wanting samples of min(admitted, nominal) / nominal.")
    borrowed = models.DecimalField(max_digits=20, decimal_places=3, default=Decimal(0))
    admitted = models.DecimalField(max_digits=20, decimal_places=3, default=Decimal(0))
    lent = models.DecimalField(max_digits=20, decimal_places=3, default=Decimal(0), help_text="Sum of the samples' lent shares.")
    violating = models.PositiveIntegerField(default=0, help_text="Mask of the slots violating the guarantee.")

    class Meta:
        indexes = [models.Index(fields=["hour", "project"]), models.Index(fields=["tenant", "hour"])]
        constraints = [models.UniqueConstraint(fields=["hour", "project", "flavor", "tenant", "cluster"],
                                               name="one_queue_sample_hour_per_queue")]

    def __str__(self) -> str:
        return f"{self.project_id}/{self.flavor_id} hour {self.hour}: {self.samples} samples"


class PoolSampleHour(models.Model):
    """One flavor's ``PoolSample`` rows of one UTC hour, summed (``insights/sample_rollups.py``)."""

    hour = models.DateTimeField()
    cluster = models.ForeignKey(Cluster, on_delete=models.CASCADE, related_name="+")
    flavor = models.ForeignKey(Flavor, on_delete=models.CASCADE, related_name="+")
    samples = models.PositiveIntegerField(default=0)
    capacity = models.DecimalField(max_digits=20, decimal_places=3, default=Decimal(0))
    allocated = models.DecimalField(max_digits=20, decimal_places=3, default=Decimal(0))
    idle_allocated = models.DecimalField(max_digits=20, decimal_places=3, default=Decimal(0))
    pending = models.DecimalField(max_digits=20, decimal_places=3, default=Decimal(0))
    shape_mismatch = models.DecimalField(max_digits=20, decimal_places=3, default=Decimal(0))
    with_capacity = models.PositiveIntegerField(default=0, help_text="Samples with a capacity above 0.")
    promised_share = models.DecimalField(max_digits=32, decimal_places=12, default=Decimal(0),
                                         help_text="Sum over those of promised / capacity.")
    promised_share_max = models.DecimalField(max_digits=32, decimal_places=12, null=True, blank=True)
    overcommit_percent_max = models.PositiveIntegerField(default=0)
    over = models.PositiveIntegerField(default=0, help_text="Samples above capacity or the overcommit setting.")

    class Meta:
        indexes = [models.Index(fields=["hour", "flavor"])]
        constraints = [models.UniqueConstraint(fields=["hour", "flavor", "cluster"], name="one_pool_sample_hour_per_flavor")]

    def __str__(self) -> str:
        return f"{self.flavor_id} hour {self.hour}: {self.samples} samples"


class SampleHour(models.Model):
    """A UTC hour whose ``QueueSampleHour`` / ``PoolSampleHour`` rows are complete, with the sample counts they were
    computed from (a refresh that counts otherwise recomputes the hour). Without this row, or ``dirty``, the hour is
    read from the samples."""

    hour = models.DateTimeField(unique=True)
    computed_at = models.DateTimeField()
    queue_samples = models.PositiveIntegerField(default=0)
    pool_samples = models.PositiveIntegerField(default=0)
    dirty = models.BooleanField(default=False)

    def __str__(self) -> str:
        return f"{self.hour} at {self.computed_at}"


class PreemptionRollup(models.Model):
    """Times requests lost their admission on one UTC day (timeline entries to ``preempted``), per tenant, cluster,
    flavor and reason (``rollups.REASONS``, the `preemptions` reasons): what ``preemptions`` reads for closed days. Written with the day's
    ``RequestRollup`` rows and complete under the same ``RollupDay``."""

    day = models.DateField()
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="+")
    cluster = models.ForeignKey(Cluster, on_delete=models.CASCADE, related_name="+")
    flavor = models.ForeignKey(Flavor, on_delete=models.CASCADE, related_name="+")
    reason = models.CharField(max_length=20)
    count = models.PositiveIntegerField(default=0)

    class Meta:
        indexes = [models.Index(fields=["day"])]
        constraints = [models.UniqueConstraint(fields=["day", "tenant", "cluster", "flavor", "reason"],
                                               name="one_preemption_rollup_per_day_group_reason")]

    def __str__(self) -> str:
        return f"{self.day} {self.tenant_id}/{self.cluster_id}/{self.flavor_id} {self.reason}: {self.count}"


SLOTS_PER_DAY = 288


class SlotMaskField(models.Field):
    """A day's 288 five-minute slots as a bit string: character ``i`` is slot ``i`` of the UTC day ("1" set). A
    PostgreSQL ``bit(288)`` (``bit_or`` and ``bit_count`` work on it); text of "0" and "1" elsewhere."""

    description = "Mask of a day's 5-minute slots"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("default", "0" * SLOTS_PER_DAY)
        super().__init__(*args, **kwargs)

    def db_type(self, connection: Any) -> str:
        return f"bit({SLOTS_PER_DAY})" if connection.vendor == "postgresql" else f"varchar({SLOTS_PER_DAY})"

    def get_placeholder(self, value: Any, compiler: Any, connection: Any) -> str:
        return f"%s::bit({SLOTS_PER_DAY})" if connection.vendor == "postgresql" else "%s"

    def from_db_value(self, value: Any, expression: Any, connection: Any) -> str | None:
        return value if value is None else str(value)

    def to_python(self, value: Any) -> str | None:
        return value if value is None else str(value)


class QueueSampleDay(models.Model):
    """One queue's ``QueueSampleHour`` rows of one UTC day, summed: the same figures per day, the masks 288 bits
    long (``insights/sample_rollups.py``, docs/insights.md "Rollups")."""

    day = models.DateTimeField(help_text="Start of the UTC day.")
    cluster = models.ForeignKey(Cluster, on_delete=models.CASCADE, related_name="+")
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="+")
    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="+")
    flavor = models.ForeignKey(Flavor, on_delete=models.CASCADE, related_name="+")
    samples = models.PositiveIntegerField(default=0)
    slots = SlotMaskField(help_text="Mask of the slots sampled.")
    pending_count = models.PositiveBigIntegerField(default=0, help_text="Sum of pending_count.")
    wanting = models.PositiveIntegerField(default=0, help_text="Samples with pending work and a nominal quota.")
    given_share = models.DecimalField(max_digits=24, decimal_places=12, default=Decimal(0),
                                      help_text="Sum over the wanting samples of min(admitted, nominal) / nominal.")
    borrowed = models.DecimalField(max_digits=20, decimal_places=3, default=Decimal(0))
    admitted = models.DecimalField(max_digits=20, decimal_places=3, default=Decimal(0))
    lent = models.DecimalField(max_digits=20, decimal_places=3, default=Decimal(0), help_text="Sum of the samples' lent shares.")
    violating = SlotMaskField(help_text="Mask of the slots violating the guarantee.")

    class Meta:
        indexes = [models.Index(fields=["day", "project"]), models.Index(fields=["tenant", "day"])]
        constraints = [models.UniqueConstraint(fields=["day", "project", "flavor", "tenant", "cluster"],
                                               name="one_queue_sample_day_per_queue")]

    def __str__(self) -> str:
        return f"{self.project_id}/{self.flavor_id} day {self.day}: {self.samples} samples"


class PoolSampleDay(models.Model):
    """One flavor's ``PoolSampleHour`` rows of one UTC day, summed (``insights/sample_rollups.py``)."""

    day = models.DateTimeField(help_text="Start of the UTC day.")
    cluster = models.ForeignKey(Cluster, on_delete=models.CASCADE, related_name="+")
    flavor = models.ForeignKey(Flavor, on_delete=models.CASCADE, related_name="+")
    samples = models.PositiveIntegerField(default=0)
    capacity = models.DecimalField(max_digits=20, decimal_places=3, default=Decimal(0))
    allocated = models.DecimalField(max_digits=20, decimal_places=3, default=Decimal(0))
    idle_allocated = models.DecimalField(max_digits=20, decimal_places=3, default=Decimal(0))
    pending = models.DecimalField(max_digits=20, decimal_places=3, default=Decimal(0))
    shape_mismatch = models.DecimalField(max_digits=20, decimal_places=3, default=Decimal(0))
    with_capacity = models.PositiveIntegerField(default=0, help_text="Samples with a capacity above 0.")
    promised_share = models.DecimalField(max_digits=32, decimal_places=12, default=Decimal(0),
                                         help_text="Sum over those of promised / capacity.")
    promised_share_max = models.DecimalField(max_digits=32, decimal_places=12, null=True, blank=True)
    overcommit_percent_max = models.PositiveIntegerField(default=0)
    over = models.PositiveIntegerField(default=0, help_text="Samples above capacity or the overcommit setting.")

    class Meta:
        indexes = [models.Index(fields=["day", "flavor"])]
        constraints = [models.UniqueConstraint(fields=["day", "flavor", "cluster"], name="one_pool_sample_day_per_flavor")]

    def __str__(self) -> str:
        return f"{self.flavor_id} day {self.day}: {self.samples} samples"


class SampleDay(models.Model):
    """A UTC day whose ``QueueSampleDay`` / ``PoolSampleDay`` rows were built from its 24 complete hours, with their
    sample counts. Read only while those 24 hours are still complete, clean and count the same."""

    day = models.DateTimeField(unique=True)
    computed_at = models.DateTimeField()
    queue_samples = models.PositiveIntegerField(default=0)
    pool_samples = models.PositiveIntegerField(default=0)

    def __str__(self) -> str:
        return f"{self.day} at {self.computed_at}"


class MeasuredSample(models.Model):
    """One running request's measured GPU use over one 5-minute slot, from Prometheus (DCGM exporter), written by
    ``insights.measured_take`` (insights/measured.py). ``gpus`` is what it held (allocated devices: GPUs, MIG slices
    or vGPUs); ``memory_mib`` what one of them offers; the rest is measured. Kept per request so rightsizing reads a
    finished request's history whatever Prometheus still retains, and the metrics sum it in the database."""

    at = models.DateTimeField(help_text="The slot's end.")
    request = models.ForeignKey("workloads.WorkloadRequest", on_delete=models.CASCADE, related_name="+")
    cluster = models.ForeignKey(Cluster, on_delete=models.CASCADE, related_name="+")
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="+")
    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="+")
    flavor = models.ForeignKey(Flavor, on_delete=models.CASCADE, related_name="+")
    seconds = models.PositiveIntegerField(default=300)
    gpus = models.PositiveIntegerField(help_text="Allocated devices in the slot.")
    memory_mib = models.PositiveIntegerField(help_text="GPU memory one allocated device offers (MiB).")
    util_avg = models.FloatField(help_text="Measured: mean DCGM_FI_DEV_GPU_UTIL over the devices (%).")
    sm_active_avg = models.FloatField(help_text="Measured: mean DCGM_FI_PROF_SM_ACTIVE (ratio 0-1).")
    fb_used_max = models.FloatField(help_text="Measured: peak DCGM_FI_DEV_FB_USED of one device (MiB).")
    xid = models.PositiveIntegerField(default=0, help_text="Measured: the last XID error any of its GPUs raised.")
    seeded = models.BooleanField(default=False)

    class Meta:
        indexes = [models.Index(fields=["at", "tenant"], name="measured_at_tenant")]
        constraints = [models.UniqueConstraint(fields=["request", "at"], name="one_measured_sample_per_slot")]

    def __str__(self) -> str:
        return f"request {self.request_id} at {self.at}: {self.util_avg:.0f} %"


class MeasuredRollup(models.Model):
    """One group's ``MeasuredSample`` rows of one UTC day, summed: what the three measured metrics need to give over
    whole days the same answers as from the samples (``insights/measured_rollup.py``, docs/measured-use.md
    "Rollup"). A day has two parts, because a sample's ``at`` is its slot's end: a period ``(start, end]`` includes
    the sample taken at its end and not the one at its start, while a chart bucket holds ``[day, day + 1)``.
    ``at_start`` rows hold the samples taken at 00:00 exactly, the others those after it in the day.

    Weights are device-seconds (``gpus`` x ``seconds``); ``util`` and ``mem_used`` sum the sample's figure rounded
    to ``measured_rollup.PLACES`` places times its weight, as numerics, on both paths, so sums are exact."""

    day = models.DateField()
    at_start = models.BooleanField(default=False, help_text="The samples taken at 00:00 UTC exactly.")
    cluster = models.ForeignKey(Cluster, on_delete=models.CASCADE, related_name="+")
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="+")
    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="+")
    flavor = models.ForeignKey(Flavor, on_delete=models.CASCADE, related_name="+")
    samples = models.PositiveIntegerField(default=0)
    alloc = models.BigIntegerField(default=0, help_text="Allocated device-seconds.")
    util = models.DecimalField(max_digits=30, decimal_places=6, default=Decimal(0),
                               help_text="Sum of util_avg x device-seconds.")
    idle = models.BigIntegerField(default=0, help_text="Device-seconds of samples below the idle threshold.")
    mem_used = models.DecimalField(max_digits=30, decimal_places=6, default=Decimal(0),
                                   help_text="Sum of fb_used_max x device-seconds (MiB-seconds).")
    mem_total = models.BigIntegerField(default=0, help_text="Sum of memory_mib x device-seconds (MiB-seconds).")

    class Meta:
        indexes = [models.Index(fields=["day", "tenant"], name="measured_rollup_day_tenant")]
        constraints = [models.UniqueConstraint(fields=["day", "at_start", "project", "flavor", "cluster", "tenant"],
                                               name="one_measured_rollup_per_group")]

    def __str__(self) -> str:
        return f"{self.day}{' 00:00' if self.at_start else ''} project {self.project_id} flavor {self.flavor_id}"


class MeasuredDay(models.Model):
    """A UTC day whose ``MeasuredRollup`` rows are complete, with the idle threshold and the sample count they were
    computed from. Without this row, ``dirty``, or under another ``MEASURED_IDLE_PERCENT``, the day is read from the
    samples."""

    day = models.DateField(unique=True)
    computed_at = models.DateTimeField()
    idle_percent = models.FloatField()
    samples = models.PositiveIntegerField(default=0)
    dirty = models.BooleanField(default=False)

    def __str__(self) -> str:
        return f"{self.day} at {self.computed_at}"
