"""Prices, usage intervals and the month close (docs/billing.md).

* ``Price``: what one unit of one priced thing costs from ``effective_from`` on, until the next price of the same
  unit and key. A change is a new row; past prices stay, so usage before the change keeps its price.
* ``Discount``: a tenant's discount in percent, effective-dated the same way.
* ``BillingPeriod``: one month; once ``finalised``, no price or discount may take effect inside it (the statement
  work finalises months; ``selectors.finalised_through`` is the end of the last finalised one).
* ``UsageInterval``: one run of one request (a Kueue admission, or a pod of a Volcano Job) for one priced unit,
  with the quantity held, opened and closed at the cluster's own timestamps. Unique per (request, run key, unit,
  key): replaying what the cluster said never counts twice.
* ``ClusterClock``: the latest instant a cluster's objects showed, and when the portal saw it.
"""

from __future__ import annotations

from decimal import Decimal

from django.conf import settings
from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models
from django.db.models import Q

from quotas.models import Cluster, Flavor
from tenants.models import Project, Tenant
from workloads.models import WorkloadRequest


class Unit(models.TextChoices):
    """What a price is per. ``gpu`` and ``mig`` are keyed (GPU model / MIG profile); the others have no key."""

    GPU = "gpu", "Whole GPU, per GPU-hour (key: GPU model)"
    MIG = "mig", "MIG slice, per slice-hour (key: MIG profile)"
    HAMI_MEMORY = "hami_memory", "HAMi vGPU memory, per GiB-hour"
    HAMI_CORES = "hami_cores", "HAMi vGPU compute, per card-hour (cores % / 100)"
    CPU = "cpu", "CPU, per core-hour"
    MEMORY = "memory", "Memory, per GiB-hour"
    STORAGE = "storage", "Notebook volume, per GiB-month"


KEYED_UNITS = (Unit.GPU, Unit.MIG)
HOURS_PER_MONTH = Decimal(730)  # a storage GiB-month is charged as 730 GiB-hours (docs/billing.md)


class Price(models.Model):
    unit = models.CharField(max_length=12, choices=Unit.choices)
    key = models.CharField(max_length=60, blank=True, default="",
                           help_text="GPU model (e.g. h100-80gb) for whole GPUs, MIG profile (e.g. 1g.10gb) for slices; empty otherwise.")
    amount = models.DecimalField(max_digits=14, decimal_places=6, validators=[MinValueValidator(Decimal(0))],
                                 help_text="Per unit (see the unit), in the currency.")
    currency = models.CharField(max_length=3)
    effective_from = models.DateTimeField(help_text="Usage from this instant on is priced so.")
    note = models.CharField(max_length=200, blank=True, default="")
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, blank=True, related_name="+")
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["unit", "key", "-effective_from"]
        constraints = [
            models.UniqueConstraint(fields=["unit", "key", "effective_from"], name="one_price_per_unit_and_instant"),
            models.CheckConstraint(condition=Q(amount__gte=0), name="price_not_negative"),
        ]
        indexes = [models.Index(fields=["unit", "key", "effective_from"])]

    def __str__(self) -> str:
        key = f" {self.key}" if self.key else ""
        return f"{self.unit}{key}: {self.amount} {self.currency} from {self.effective_from:%Y-%m-%d %H:%M}"


class Discount(models.Model):
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="discounts")
    percent = models.DecimalField(max_digits=5, decimal_places=2,
                                  validators=[MinValueValidator(Decimal(0)), MaxValueValidator(Decimal(100))])
    effective_from = models.DateTimeField()
    note = models.CharField(max_length=200, blank=True, default="")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["tenant", "-effective_from"]
        constraints = [
            models.UniqueConstraint(fields=["tenant", "effective_from"], name="one_discount_per_tenant_and_instant"),
            models.CheckConstraint(condition=Q(percent__gte=0) & Q(percent__lte=100), name="discount_is_a_percentage"),
        ]

    def __str__(self) -> str:
        return f"{self.tenant.slug}: {self.percent}% from {self.effective_from:%Y-%m-%d}"


class BillingPeriod(models.Model):
    """A calendar month (UTC). ``finalised_at`` set: its statements are final and its prices fixed."""

    month = models.DateField(unique=True, help_text="The first day of the month.")
    finalised_at = models.DateTimeField(null=True, blank=True)
    finalised_by = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, blank=True, related_name="+")

    class Meta:
        ordering = ["-month"]

    def __str__(self) -> str:
        return f"{self.month:%Y-%m}{' (final)' if self.finalised_at else ''}"


class UsageInterval(models.Model):
    class Source(models.TextChoices):
        WORKLOAD = "workload", "Kueue Workload (admitted → finished / evicted)"
        POD = "pod", "Pod (started → finished), for objects Kueue does not own"

    class EndReason(models.TextChoices):
        FINISHED = "finished", "Finished"
        EVICTED = "evicted", "Evicted (preempted)"
        DELETED = "deleted", "Deleted"
        GONE = "gone", "Gone (last seen)"

    request = models.ForeignKey(WorkloadRequest, on_delete=models.CASCADE, related_name="usage_intervals")
    # Copied from the request, so statements and budgets sum by tenant / project without a join.
    tenant = models.ForeignKey(Tenant, on_delete=models.PROTECT, related_name="+")
    project = models.ForeignKey(Project, on_delete=models.PROTECT, related_name="+")
    cluster = models.ForeignKey(Cluster, on_delete=models.PROTECT, related_name="+")
    run_key = models.CharField(max_length=200, help_text="The run's identity from the cluster: object uid + start time.")
    source = models.CharField(max_length=10, choices=Source.choices)
    object_uid = models.CharField(max_length=100)
    object_name = models.CharField(max_length=253)
    unit = models.CharField(max_length=12, choices=Unit.choices)
    key = models.CharField(max_length=60, blank=True, default="")
    quantity = models.DecimalField(max_digits=14, decimal_places=4, help_text="Units held during the run (e.g. 8 GPUs).")
    started_at = models.DateTimeField(help_text="Cluster time: the Admitted condition's (or the pod's) start.")
    ended_at = models.DateTimeField(null=True, blank=True, help_text="Cluster time; empty while it runs.")
    end_reason = models.CharField(max_length=10, choices=EndReason.choices, blank=True, default="")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["started_at", "id"]
        constraints = [
            models.UniqueConstraint(fields=["request", "run_key", "unit", "key"], name="one_interval_per_run_and_unit"),
            models.CheckConstraint(condition=Q(ended_at__isnull=True) | Q(ended_at__gte=models.F("started_at")),
                                   name="interval_never_negative"),
        ]
        indexes = [
            models.Index(fields=["cluster", "ended_at"]),
            models.Index(fields=["tenant", "started_at"]),
            models.Index(fields=["project", "started_at"]),
        ]

    def __str__(self) -> str:
        return f"req {self.request_id} {self.unit}{' ' + self.key if self.key else ''} x{self.quantity} {self.started_at}–{self.ended_at or '…'}"


class ClusterClock(models.Model):
    cluster = models.OneToOneField(Cluster, on_delete=models.CASCADE, related_name="+")
    cluster_time = models.DateTimeField(help_text="The latest timestamp seen on the cluster's objects.")
    seen_at = models.DateTimeField(help_text="Portal time when it was seen.")

    def __str__(self) -> str:
        return f"{self.cluster}: {self.cluster_time} seen {self.seen_at}"


# ------------------------------------------------------------------------------------------------ budgets
def default_thresholds() -> list[int]:
    return [50, 80, 100]


class Budget(models.Model):
    """A monthly budget for a tenant (``project`` empty) or one of its projects, in the billing currency.

    ``thresholds``: the percentages at which an alert goes out (once per threshold and month, ``BudgetAlert``).
    ``refuse_when_spent`` (ops only): new submissions in its scope are refused once the month's spend reaches
    the amount (docs/billing.md, "Budgets and cost views")."""

    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="budgets")
    project = models.ForeignKey(Project, on_delete=models.CASCADE, null=True, blank=True, related_name="budgets")
    amount = models.DecimalField(max_digits=14, decimal_places=2, validators=[MinValueValidator(Decimal("0.01"))])
    thresholds = models.JSONField(default=default_thresholds)
    refuse_when_spent = models.BooleanField(default=False)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["tenant", "project"]
        constraints = [
            models.UniqueConstraint(fields=["tenant"], condition=Q(project__isnull=True), name="one_budget_per_tenant"),
            models.UniqueConstraint(fields=["project"], condition=Q(project__isnull=False), name="one_budget_per_project"),
            models.CheckConstraint(condition=Q(amount__gt=0), name="budget_positive"),
        ]

    def __str__(self) -> str:
        return f"{self.project.slug if self.project_id else self.tenant.slug}: {self.amount}/month"


class BudgetAlert(models.Model):
    """One alert sent (claimed before sending): unique per budget, month and threshold, so it goes out once."""

    budget = models.ForeignKey(Budget, on_delete=models.CASCADE, related_name="alerts")
    month = models.DateField()
    threshold = models.PositiveSmallIntegerField()
    spent = models.DecimalField(max_digits=16, decimal_places=2)
    sent_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-month", "threshold"]
        constraints = [models.UniqueConstraint(fields=["budget", "month", "threshold"], name="one_alert_per_threshold_and_month")]

    def __str__(self) -> str:
        return f"{self.budget}: {self.threshold}% in {self.month:%Y-%m}"
# ------------------------------------------------------------------------------------------------ statements
# (docs/billing.md, "Statements": billing/statements.py rates the month in the database and writes these rows.)
class BillingProfile(models.Model):
    """How a tenant is billed (an ops setting): showback (costs shown, nothing charged) or chargeback (charged to
    its cost centre). Printed on every statement; a tenant without one is shown back. The cost centre is the
    tenant's own (``Tenant.cost_centre``, the one field of that name), printed on every statement."""

    class Mode(models.TextChoices):
        SHOWBACK = "showback", "Showback (costs shown, not charged)"
        CHARGEBACK = "chargeback", "Chargeback (charged to the cost centre)"

    tenant = models.OneToOneField(Tenant, on_delete=models.CASCADE, related_name="billing_profile")
    mode = models.CharField(max_length=10, choices=Mode.choices, default=Mode.SHOWBACK)
    updated_at = models.DateTimeField(auto_now=True)

    def __str__(self) -> str:
        return f"{self.tenant.slug}: {self.mode}"


class StatementQuerySet(models.QuerySet):
    def update(self, **kwargs):
        if self.filter(status=Statement.Status.FINAL).exists():
            raise PermissionError("A finalised statement cannot change.")
        return super().update(**kwargs)

    def delete(self):
        if self.filter(status=Statement.Status.FINAL).exists():
            raise PermissionError("A finalised statement cannot be removed.")
        return super().delete()


class Statement(models.Model):
    """One tenant's month. A draft is recomputed on request; once final it never changes (save, delete and the
    queryset's update / delete refuse) and carries a number from the year's gapless sequence."""

    class Status(models.TextChoices):
        DRAFT = "draft", "Draft"
        FINAL = "final", "Final"

    tenant = models.ForeignKey(Tenant, on_delete=models.PROTECT, related_name="statements")
    month = models.DateField(help_text="The first day of the month (UTC).")
    status = models.CharField(max_length=5, choices=Status.choices, default=Status.DRAFT)
    number = models.CharField(max_length=20, null=True, blank=True, unique=True, help_text="YYYY-NNNNNN, once final.")
    currency = models.CharField(max_length=3)
    mode = models.CharField(max_length=10, choices=BillingProfile.Mode.choices, default=BillingProfile.Mode.SHOWBACK)
    cost_centre = models.CharField(max_length=60, blank=True, default="")
    subtotal = models.DecimalField(max_digits=16, decimal_places=2, default=Decimal(0), help_text="Before discount.")
    discount = models.DecimalField(max_digits=16, decimal_places=2, default=Decimal(0))
    total = models.DecimalField(max_digits=16, decimal_places=2, default=Decimal(0), help_text="The sum of the lines.")
    generated_at = models.DateTimeField()
    finalised_at = models.DateTimeField(null=True, blank=True)

    objects = StatementQuerySet.as_manager()

    class Meta:
        ordering = ["-month", "tenant__slug"]
        constraints = [
            models.UniqueConstraint(fields=["tenant", "month"], name="one_statement_per_tenant_and_month"),
            models.CheckConstraint(condition=Q(status="draft") | Q(number__isnull=False), name="final_statement_numbered"),
        ]

    def __str__(self) -> str:
        return f"{self.number or 'draft'} {self.tenant.slug} {self.month:%Y-%m}"

    @property
    def is_final(self) -> bool:
        return self.status == self.Status.FINAL

    def save(self, *args, **kwargs):
        if self.pk is not None and Statement.objects.filter(pk=self.pk, status=self.Status.FINAL).exists():
            raise PermissionError("A finalised statement cannot change.")
        super().save(*args, **kwargs)

    def delete(self, *args, **kwargs):
        if self.pk is not None and Statement.objects.filter(pk=self.pk, status=self.Status.FINAL).exists():
            raise PermissionError("A finalised statement cannot be removed.")
        return super().delete(*args, **kwargs)


class StatementLineQuerySet(models.QuerySet):
    def update(self, **kwargs):
        if self.filter(statement__status=Statement.Status.FINAL).exists():
            raise PermissionError("A finalised statement cannot change.")
        return super().update(**kwargs)

    def delete(self):
        if self.filter(statement__status=Statement.Status.FINAL).exists():
            raise PermissionError("A finalised statement cannot be removed.")
        return super().delete()


class StatementLine(models.Model):
    """One project x unit (x key) x price window of a statement: ``quantity`` unit-hours (storage: unit-months) at
    ``unit_price``, less ``discount_percent``; ``amount`` is rounded to the cent, once, here."""

    statement = models.ForeignKey(Statement, on_delete=models.CASCADE, related_name="lines")
    project = models.ForeignKey(Project, on_delete=models.PROTECT, related_name="+")
    project_slug = models.CharField(max_length=63)
    unit = models.CharField(max_length=12, choices=Unit.choices)
    key = models.CharField(max_length=60, blank=True, default="")
    period_start = models.DateTimeField(help_text="Where this line's price (and discount) window starts in the month.")
    period_end = models.DateTimeField()
    quantity = models.DecimalField(max_digits=20, decimal_places=6, help_text="Unit-hours (storage: unit-months).")
    unit_price = models.DecimalField(max_digits=14, decimal_places=6)
    gross = models.DecimalField(max_digits=16, decimal_places=2, help_text="quantity x unit price, rounded.")
    discount_percent = models.DecimalField(max_digits=5, decimal_places=2, default=Decimal(0))
    amount = models.DecimalField(max_digits=16, decimal_places=2, help_text="Less the discount, rounded once.")

    objects = StatementLineQuerySet.as_manager()

    class Meta:
        ordering = ["project_slug", "unit", "key", "period_start"]

    def __str__(self) -> str:
        return f"{self.project_slug} {self.unit}{' ' + self.key if self.key else ''} {self.quantity} = {self.amount}"

    def save(self, *args, **kwargs):
        if Statement.objects.filter(pk=self.statement_id, status=Statement.Status.FINAL).exists():
            raise PermissionError("A finalised statement cannot change.")
        super().save(*args, **kwargs)

    def delete(self, *args, **kwargs):
        if Statement.objects.filter(pk=self.statement_id, status=Statement.Status.FINAL).exists():
            raise PermissionError("A finalised statement cannot be removed.")
        return super().delete(*args, **kwargs)


class StatementCounter(models.Model):
    """The last statement number given in a year. Finalising locks the row (select_for_update), so numbers are
    gapless and unique under concurrency: a rolled-back finalisation rolls its number back too."""

    year = models.PositiveIntegerField(unique=True)
    last = models.PositiveIntegerField(default=0)

    def __str__(self) -> str:
        return f"{self.year}: {self.last}"


# ------------------------------------------------------------------------------------------------ cost rollup
# (docs/billing.md, "Cost rollup": billing/rollup.py writes these rows; insights' cost metrics read them.)
class CostRollup(models.Model):
    """Priced usage of one closed UTC day per tenant, project, cluster, flavor, requesting user, unit and key:
    ``cost`` (prices and discounts in force, not rounded) and ``unit_seconds`` (quantity x seconds, exact)."""

    day = models.DateField()
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="+")
    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="+")
    cluster = models.ForeignKey(Cluster, on_delete=models.CASCADE, related_name="+")
    flavor = models.ForeignKey(Flavor, on_delete=models.CASCADE, related_name="+")
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="+")
    unit = models.CharField(max_length=12, choices=Unit.choices)
    key = models.CharField(max_length=60, blank=True, default="")
    cost = models.DecimalField(max_digits=40, decimal_places=20, help_text="In the billing currency, not rounded.")
    unit_seconds = models.DecimalField(max_digits=30, decimal_places=10, help_text="Quantity x seconds held that day.")

    class Meta:
        ordering = ["day", "tenant", "project"]
        indexes = [
            models.Index(fields=["day", "tenant"], name="costrollup_day_tenant"),
            models.Index(fields=["project", "day"], name="costrollup_project_day"),
        ]

    def __str__(self) -> str:
        return f"{self.day} t{self.tenant_id} p{self.project_id} {self.unit} {self.key}: {self.cost}"


class CostRollupDay(models.Model):
    """A UTC day whose ``CostRollup`` rows are complete (``dirty`` false). Every change that touches the day
    (usage opened or closed, a price or discount) sets ``dirty`` and bumps ``version``; a refresh marks the day clean
    only if the version it read before summing is still the day's, so a change racing the refresh is never lost."""

    day = models.DateField(unique=True)
    computed_at = models.DateTimeField(null=True, blank=True)
    dirty = models.BooleanField(default=True)
    version = models.PositiveBigIntegerField(default=0)
    rows = models.PositiveIntegerField(default=0)

    class Meta:
        ordering = ["day"]

    def __str__(self) -> str:
        return f"{self.day}{' (dirty)' if self.dirty else ''}"
