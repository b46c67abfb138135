"""MIG changes: a new MIG layout for one node pool, proposed, approved and carried out in a maintenance window
(docs/mig-changes.md). ``status`` and ``step`` move only through ``maintenance/states.py``."""

from __future__ import annotations

from django.conf import settings
from django.db import models

from quotas.models import Cluster, NodePool
from tenants.models import Tenant


class MigChange(models.Model):
    class Status(models.TextChoices):
        PROPOSED = "proposed", "Proposed"  # waiting for an approval
        APPROVED = "approved", "Approved"  # waiting for its window
        RUNNING = "running", "Running"  # in its window, one step after the other
        ROLLING_BACK = "rolling_back", "Rolling back"
        SUCCEEDED = "succeeded", "Succeeded"
        ROLLED_BACK = "rolled_back", "Rolled back"  # failed, and the previous layout is back
        FAILED = "failed", "Failed"  # failed and could not be rolled back: ops must look
        REJECTED = "rejected", "Rejected"
        CANCELLED = "cancelled", "Cancelled"

    class Step(models.TextChoices):
        WAITING = "waiting", "Waiting for the window"
        CORDON = "cordon", "Cordon the nodes"
        DRAIN = "drain", "Let running work finish"
        RELABEL = "relabel", "Set the new layout"
        RECONFIGURE = "reconfigure", "Wait for the MIG manager"
        VERIFY = "verify", "Verify the new capacity"
        QUOTAS = "quotas", "Update flavors and quotas"
        UNCORDON = "uncordon", "Uncordon the nodes"
        ROLLBACK_RELABEL = "rollback_relabel", "Set the previous layout back"
        ROLLBACK_WAIT = "rollback_wait", "Wait for the previous layout"
        ROLLBACK_UNCORDON = "rollback_uncordon", "Uncordon after the rollback"
        DONE = "done", "Done"

    cluster = models.ForeignKey(Cluster, on_delete=models.CASCADE, related_name="mig_changes")
    pool = models.ForeignKey(NodePool, on_delete=models.SET_NULL, null=True, blank=True, related_name="+",
                             help_text="The pool as the inventory grouped it when proposed (a new layout regroups it).")
    pool_name = models.CharField(max_length=100)
    nodes = models.JSONField(default=list, help_text="The pool's node names when proposed: what the change touches.")
    gpu_model = models.CharField(max_length=40)
    gpus_per_node = models.PositiveIntegerField(default=0)
    from_layout = models.CharField(max_length=60)
    to_layout = models.CharField(max_length=60)
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, null=True, blank=True, related_name="+",
                               help_text="Set when a tenant admin proposed it (their tenant sees it).")
    reason = models.TextField(max_length=2000, blank=True)
    proposed_by = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="+")
    approved_by = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, null=True, blank=True,
                                    related_name="+")
    decided_at = models.DateTimeField(null=True, blank=True)
    decision_comment = models.TextField(max_length=2000, blank=True)
    window_start = models.DateTimeField(help_text="When the window opens: the nodes are cordoned then.")
    deadline = models.DateTimeField(help_text="Running work still on the nodes then is stopped (owners are told).")
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.PROPOSED, db_index=True)
    status_reason = models.TextField(blank=True)
    step = models.CharField(max_length=20, choices=Step.choices, default=Step.WAITING)
    step_started_at = models.DateTimeField(null=True, blank=True)
    progress = models.PositiveSmallIntegerField(default=0, help_text="Percent of the steps done.")
    impact = models.JSONField(default=dict, blank=True, help_text="What was shown before approval (impact.py).")
    rollback = models.JSONField(default=dict, blank=True, help_text="What a rollback restores and what it did.")
    created_at = models.DateTimeField(auto_now_add=True, db_index=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        indexes = [models.Index(fields=["cluster", "status"], name="migchange_cluster_status")]

    def __str__(self) -> str:
        return f"MIG change #{self.pk} {self.pool_name}: {self.from_layout} -> {self.to_layout}"


class MigChangeStep(models.Model):
    """One line of a change's log: a step started, progressed, finished or failed (append only)."""

    class Outcome(models.TextChoices):
        STARTED = "started", "Started"
        PROGRESS = "progress", "Progress"
        DONE = "done", "Done"
        FAILED = "failed", "Failed"
        INFO = "info", "Info"

    change = models.ForeignKey(MigChange, on_delete=models.CASCADE, related_name="steps")
    step = models.CharField(max_length=20, choices=MigChange.Step.choices)
    outcome = models.CharField(max_length=10, choices=Outcome.choices)
    message = models.CharField(max_length=1000)
    detail = models.JSONField(default=dict, blank=True)
    at = models.DateTimeField(auto_now_add=True)
    # The line's place in its change's log (1, 2, ...): the log's order. ``at`` is the writer's clock, and steps
    # written within the same second (or by workers whose clocks differ slightly) would sort wrongly by it.
    seq = models.PositiveIntegerField(default=0, help_text="Position in the change's log (1, 2, ...).")

    class Meta:
        ordering = ["seq", "id"]
        constraints = [models.UniqueConstraint(fields=["change", "seq"], name="mig_change_step_seq")]

    def __str__(self) -> str:
        return f"{self.step} {self.outcome}: {self.message}"
