"""Every write to clusters, flavors, quotas and quota requests: check the rules, write, audit, and
schedule the reconcile (and notifications) for after commit. One transaction each.

Quota invariants, kept under row locks so concurrent changes cannot break them:

1. a tenant's projects' nominal quotas for (flavor, resource) sum to at most the tenant's nominal
   quota: every change of a project row, and every lowering of a tenant row, holds the lock on the
   tenant's ``Quota`` row (created with nominal 0 when missing, under a lock on the ``Tenant`` row);
2. the tenants' nominal quotas sum to at most capacity x (1 + overcommit_percent / 100): every
   raise of a tenant row holds the lock on the ``Cluster`` row.

Locks are always taken in one order: quota request, cluster, tenant, tenant quota row, project
quota row. Only increases are checked against the limit above them, so a cluster that lost nodes
can still have its promises lowered; ``selectors.overcommit_for`` shows what is over.
"""

from __future__ import annotations

import re
from datetime import datetime
from decimal import Decimal, InvalidOperation
from typing import Any, cast

import yaml
from django.core.exceptions import ValidationError
from django.db import transaction
from django.utils import timezone

from portal.events import after_commit, enqueue_chain
from portal.exceptions import ConflictError, Invalid, NotAllowed, ReadOnlyTenant
from portal.quantities import fmt
from tenants.access import Actor
from tenants.audit import audit_record, snapshot
from tenants.guards import require
from tenants.models import DNS1123_LABEL, Project, Tenant

from . import architectures, policy, selectors, states
from . import manifests as qm
from .events import schedule_reconcile
from .exceptions import AlreadyDecided, QuotaExceeded
from .manifests import topology_flavor
from .mig import MIG_PROFILES, validate_mig_profile
from .models import AppliedObject, Architecture, Cluster, Flavor, Quota, QuotaRequest, gib_words
from .notify import quota_request_notify

ZERO = Decimal(0)
MILLI = Decimal("0.001")
MAX_QUANTITY = Decimal("99999999999")  # fits Quota's DecimalField(max_digits=14, decimal_places=3)
Approver = QuotaRequest.Approver
Status = QuotaRequest.Status
# RegexValidator compiles its pattern; the stubs type the attribute as ``str | Pattern``.
_LABEL_RE = cast("re.Pattern[str]", DNS1123_LABEL.regex)

CLUSTER_FIELDS = ["name", "architecture", "use_mig", "use_hami", "volcano_capacity_plugin", "overcommit_percent", "kubeconfig_path",
                  "topology", "topology_levels", "prometheus_cluster", "role", "manager_id", "admission_check"]
FLAVOR_FIELDS = [
    "cluster", "name", "display_name", "kind", "gpu_product", "gpu_model", "mig_profile", "hami_memory_mib",
    "hami_cores_percent", "pool_label", "node_labels", "taints", "tolerations", "order", "active",
]
REQUEST_FIELDS = ["status", "approver", "comment", "decided_at"]
MAX_OVERCOMMIT_PERCENT = 1000
POOL_LABELS = {"", "online", "offline"}
TAINT_EFFECTS = {"NoSchedule", "PreferNoSchedule", "NoExecute"}


def _require_writable(actor: Actor, tenant: Tenant) -> None:
    if not tenant.is_active and not actor.is_ops and actor.user is not None:
        raise ReadOnlyTenant(f"Tenant {tenant.slug} is suspended: its data can be read but not changed.")


def _full_clean(obj: Any, exclude: list[str] | None = None) -> None:
    """Model validation as field errors (``non_field_errors`` rather than Django's ``__all__``)."""
    try:
        obj.full_clean(exclude=exclude, validate_unique=False, validate_constraints=False)
    except ValidationError as exc:
        raise ValidationError({("non_field_errors" if k == "__all__" else k): v for k, v in exc.message_dict.items()}) from None


# Clusters --------------------------------------------------------------------------------------


def _cluster_check(cluster: Cluster, changed: set[str] | frozenset[str] = frozenset()) -> None:
    if cluster.architecture not in architectures.letters():
        raise Invalid(f"Architecture must be one of {', '.join(architectures.letters())}.", field="architecture")
    for flag, kind, words in (("use_mig", Flavor.Kind.MIG, "MIG"), ("use_hami", Flavor.Kind.HAMI, "HAMi")):
        having = architectures.where(lambda a, kind=kind: a.may_use(kind))
        if getattr(cluster, flag) and cluster.architecture not in having:
            raise Invalid(f"{words} flavors belong to architectures {architectures.names(having)}, not {cluster.architecture}.",
                          field=flag)
    if not 0 <= int(cluster.overcommit_percent) <= MAX_OVERCOMMIT_PERCENT:
        raise Invalid(f"Overcommit is a percentage from 0 to {MAX_OVERCOMMIT_PERCENT}.", field="overcommit_percent")
    if cluster.kubeconfig_path and not cluster.kubeconfig_path.startswith("/"):
        raise Invalid("Give the absolute path of the kubeconfig file mounted into the portal.", field="kubeconfig_path")
    _topology_levels_check(cluster)
    _multikueue_check(cluster)
    multikueue_match_check(cluster, changed)
    _full_clean(cluster, exclude=["kubeconfig_encrypted"])
    if Cluster.objects.filter(name=cluster.name).exclude(pk=cluster.pk).exists():
        raise Invalid(f"A cluster named {cluster.name!r} already exists.", field="name")


# A Kubernetes label key: an optional DNS subdomain prefix and "/", then a name of up to 63 characters.
_LABEL_NAME_RE = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$")
_LABEL_PREFIX_RE = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")


def label_key_error(key: str) -> str:
    """Why ``key`` is not a Kubernetes label key ("" when it is one)."""
    prefix, _slash, name = key.rpartition("/")
    if "/" in prefix:
        return "has more than one '/'"
    if "/" in key and not prefix:
        return "has an empty prefix before '/'"
    if prefix and (len(prefix) > 253 or not _LABEL_PREFIX_RE.match(prefix)):
        return "has a prefix that is not a DNS subdomain (lower-case letters, digits, '-' and '.', up to 253)"
    if not _LABEL_NAME_RE.match(name):
        return ("has a name that is not 1 to 63 letters, digits, '-', '_' or '.', beginning and ending with a letter "
                "or digit")
    return ""


def _topology_levels_check(cluster: Cluster) -> None:
    """A "custom" topology's levels (``Cluster.topology_levels``), highest first, as Kueue's Topology takes them: 1 to
    ``MAX_TOPOLOGY_LEVELS``, each a name (a DNS label: rack, nvlink, zone...) and a node label key, no name or label
    twice, ``kubernetes.io/hostname`` only as the lowest. Other topologies name no levels."""
    levels = cluster.topology_levels
    field = "topology_levels"
    if cluster.topology != qm.CUSTOM_TOPOLOGY:
        if levels:
            raise Invalid(f'Levels are named with topology "{qm.CUSTOM_TOPOLOGY}" only: set it, or send no levels.',
                          field=field)
        return
    if not isinstance(levels, list) or not levels:
        raise Invalid("Name the levels, highest first: e.g. [{\"name\": \"rack\", \"label\": \"example.com/rack\"}, "
                      "{\"name\": \"host\", \"label\": \"kubernetes.io/hostname\"}].", field=field)
    if len(levels) > qm.MAX_TOPOLOGY_LEVELS:
        raise Invalid(f"At most {qm.MAX_TOPOLOGY_LEVELS} levels, not {len(levels)}.", field=field)
    names: set[str] = set()
    keys: set[str] = set()
    for n, level in enumerate(levels, 1):
        if not isinstance(level, dict) or set(level) - {"name", "label"}:
            raise Invalid(f"Level {n}: give an object with a name and a label only.", field=field)
        name, label = level.get("name"), level.get("label")
        if not isinstance(name, str) or not _LABEL_RE.match(name) or len(name) > 20:
            raise Invalid(f"Level {n}: the name {name!r} is not lower-case letters, digits and '-' (up to 20), "
                          "e.g. zone, block, rack, nvlink, host.", field=field)
        if not isinstance(label, str) or not label:
            raise Invalid(f"Level {n} ({name}): give its node label key, e.g. topology.kubernetes.io/zone.", field=field)
        why = label_key_error(label)
        if why:
            raise Invalid(f"Level {n} ({name}): {label!r} is not a Kubernetes label key: it {why}.", field=field)
        if name in names:
            raise Invalid(f"Level {n}: the name {name!r} is used twice.", field=field)
        if label in keys:
            raise Invalid(f"Level {n} ({name}): the label {label!r} is used twice.", field=field)
        if label == qm.HOSTNAME_LABEL and n != len(levels):
            raise Invalid(f"Level {n} ({name}): {qm.HOSTNAME_LABEL} can only be the lowest level (Kueue's rule).",
                          field=field)
        names.add(name)
        keys.add(label)
    cluster.topology_levels = [{"name": str(lv["name"]), "label": str(lv["label"])} for lv in levels]


def _multikueue_check(cluster: Cluster) -> None:
    """Kueue MultiKueue roles (docs/federation.md): a worker names its manager; nothing else names one."""
    if cluster.role == "worker":
        manager = Cluster.objects.filter(pk=cluster.manager_id).first() if cluster.manager_id else None
        if manager is None or manager.pk == cluster.pk:
            raise Invalid("A MultiKueue worker needs its manager cluster.", field="manager_id")
        if manager.role != "manager":
            raise Invalid(f"Cluster {manager.name} is not a MultiKueue manager: set its role first.", field="manager_id")
    elif cluster.manager_id:
        raise Invalid("Only a MultiKueue worker has a manager.", field="manager_id")
    if cluster.role != "manager" and cluster.admission_check:
        raise Invalid("Only a MultiKueue manager names an admission check.", field="admission_check")
    if cluster.admission_check and not _LABEL_RE.match(cluster.admission_check):
        raise Invalid("Give the AdmissionCheck's name: lower-case letters, digits and '-'.", field="admission_check")
    if cluster.pk and cluster.role != "manager" and Cluster.objects.filter(manager_id=cluster.pk).exists():
        raise Invalid("Workers name this cluster as their manager: change their role first.", field="role")


def _setting_words(differences: list[tuple[str, str]]) -> str:
    return " and ".join(words for _, words in differences)


def multikueue_match_check(cluster: Cluster, changed: set[str] | frozenset[str] = frozenset()) -> None:
    """A MultiKueue worker has its manager's queues (``architectures.queue_mismatch``: the same architecture and MIG
    and HAMi switches), else the dispatched workload is never admitted there. A field error (on the setting that
    changed, else ``manager_id``) for a worker that would differ from its manager, and for a manager whose change
    would leave its workers differing (saying what to change first). ``changed``: the settings being changed."""
    if cluster.role == "worker" and cluster.manager_id:
        manager = Cluster.objects.filter(pk=cluster.manager_id).first()
        found = architectures.queue_mismatch(manager, cluster) if manager is not None else []
        if found and manager is not None:
            field = next((f for f, _ in found if f in changed), "manager_id")
            raise Invalid(
                f"A MultiKueue worker needs its manager's queues (same ClusterQueue and LocalQueue names and flavors): "
                f"{cluster.name} would have {_setting_words(found)} as on its manager {manager.name}. Set it as on "
                f"{manager.name}, or choose another manager.", field=field)
    if cluster.role == "manager" and cluster.pk:
        differing = [(w.name, architectures.queue_mismatch(cluster, w))
                     for w in Cluster.objects.filter(role="worker", manager_id=cluster.pk).order_by("name")]
        differing = [(name, found) for name, found in differing if found]
        if differing:
            field = next((f for _, found in differing for f, _ in found if f in changed), "architecture")
            names = ", ".join(name for name, _ in differing)
            raise Invalid(
                f"Its MultiKueue workers would no longer have its queues: {'; '.join(f'{n} would have {_setting_words(found)}' for n, found in differing)}. "
                f"Make {names} standalone first (their role), change {cluster.name}, change {names} the same way, "
                f"then make them its workers again.", field=field)


def _kubeconfig_encrypted(kubeconfig: str) -> str:
    """Check that ``kubeconfig`` looks like one, and encrypt it for storage (portal/crypto.py)."""
    from portal.crypto import encrypt

    if len(kubeconfig) > 1_000_000:
        raise Invalid("The kubeconfig is larger than 1 MB.", field="kubeconfig")
    try:
        data = yaml.safe_load(kubeconfig)
    except yaml.YAMLError:
        raise Invalid("The kubeconfig is not valid YAML.", field="kubeconfig") from None
    if not isinstance(data, dict) or not isinstance(data.get("clusters"), list) or not data["clusters"]:
        raise Invalid("The kubeconfig has no clusters: paste the whole file.", field="kubeconfig")
    return encrypt(kubeconfig)


@transaction.atomic
def cluster_create(
    *,
    actor: Actor,
    name: str,
    architecture: str = Architecture.B,
    use_mig: bool = False,
    use_hami: bool = False,
    volcano_capacity_plugin: bool = False,
    overcommit_percent: int = 0,
    kubeconfig: str = "",
    kubeconfig_path: str = "",
    topology: str = "",
    topology_levels: list | None = None,
    role: str = "standalone",
    manager_id: int | None = None,
    admission_check: str = "",
) -> Cluster:
    require(policy.may_manage_capacity(actor), "Only platform ops register clusters.")
    cluster = Cluster(
        name=name, architecture=architecture, use_mig=use_mig, use_hami=use_hami,
        volcano_capacity_plugin=volcano_capacity_plugin, overcommit_percent=overcommit_percent,
        kubeconfig_path=kubeconfig_path, topology=topology, topology_levels=topology_levels or [], role=role,
        manager_id=manager_id, admission_check=admission_check,
    )
    _cluster_check(cluster, frozenset({"architecture", "use_mig", "use_hami"}))
    if kubeconfig:
        cluster.kubeconfig_encrypted = _kubeconfig_encrypted(kubeconfig)
    cluster.save()
    after = snapshot(cluster, CLUSTER_FIELDS) | {"kubeconfig": "set" if kubeconfig else ""}
    audit_record(actor=actor, action="cluster.create", target=cluster, after=after)
    schedule_reconcile(cluster.pk)
    if cluster.manager_id:
        schedule_reconcile(cluster.manager_id)  # its manager writes the new worker's MultiKueue objects
    return cluster


@transaction.atomic
def cluster_sync(*, actor: Actor, cluster: Cluster) -> None:
    """On demand: read the cluster's nodes again, then reconcile (both as Celery tasks after commit)."""
    require(policy.may_manage_capacity(actor), "Only platform ops sync a cluster's inventory.")
    audit_record(actor=actor, action="cluster.sync", target=cluster)

    after_commit(enqueue_chain, ("quotas.inventory_sync", (cluster.pk,)),
                 ("quotas.reconcile_cluster", (cluster.pk,)))


@transaction.atomic
def cluster_update(*, actor: Actor, cluster: Cluster, **changes: Any) -> Cluster:
    """Change a cluster's settings. ``kubeconfig`` replaces the stored one (write-only)."""
    require(policy.may_manage_capacity(actor), "Only platform ops change clusters.")
    cluster = Cluster.objects.select_for_update().get(pk=cluster.pk)
    allowed = set(CLUSTER_FIELDS) | {"kubeconfig"}
    for key in changes:
        if key not in allowed:
            raise Invalid("This field cannot be changed.", field=key)
    before = snapshot(cluster, CLUSTER_FIELDS)
    old_overcommit = cluster.overcommit_percent
    switching_off = cluster.topology and not changes.get("topology", cluster.topology)
    if changes.get("topology", cluster.topology) != qm.CUSTOM_TOPOLOGY and "topology_levels" not in changes:
        changes["topology_levels"] = []  # the preset or off: the levels named for "custom" go
    old_levels = qm.cluster_levels(cluster)
    carrying = _flavors_carrying_topology(cluster) if cluster.topology else []
    kubeconfig = changes.pop("kubeconfig", None)
    old_manager = cluster.manager_id
    changed = {field for field, value in changes.items() if getattr(cluster, field) != value}
    for field, value in changes.items():
        setattr(cluster, field, value)
    _cluster_check(cluster, changed)
    quotas = Quota.objects.filter(flavor__cluster=cluster)
    if not architectures.get(cluster.architecture).cohorts and quotas.filter(project__isnull=False).exclude(
        borrowing_limit__isnull=True, lending_limit__isnull=True
    ).exists():
        raise Invalid(
            f"Architecture {cluster.architecture} has no cohorts: clear the borrowing and lending limits of this cluster's quotas first.",
            field="architecture",
        )
    for flag, kind in (("use_mig", Flavor.Kind.MIG), ("use_hami", Flavor.Kind.HAMI)):
        if not getattr(cluster, flag) and cluster.flavors.filter(kind=kind, active=True).exists():
            raise Invalid(f"Deactivate the cluster's {kind} flavors first.", field=flag)
    if cluster.overcommit_percent < old_overcommit:
        _check_promises_fit(cluster)
    relabelled = bool(old_levels) and qm.has_topology(cluster) and [lbl for _n, lbl in qm.cluster_levels(cluster)] \
        != [lbl for _n, lbl in old_levels]
    if carrying and relabelled:
        names = ", ".join(carrying)
        raise Invalid(
            f"The topology's levels cannot change while flavors {names} carry it: Kueue does not allow changing a "
            "Topology's levels, nor removing a flavor's topology. Drain the queues using them, deactivate "
            f"{names} and apply the plan (the reconcile takes them off the queues and deletes them), then change the "
            "levels (the reconcile replaces the Topology) and activate them again.",
            field="topology_levels" if cluster.topology == qm.CUSTOM_TOPOLOGY else "topology",
        )
    if carrying and switching_off:
        names = ", ".join(carrying)
        raise Invalid(
            f"Topology cannot be switched off while flavors {names} carry it: Kueue does not allow removing a flavor's "
            "topology, and keeps a deleted flavor as long as a queue names it. Drain the queues using them, deactivate "
            f"{names} and apply the plan (the reconcile takes them off the queues and deletes them), then switch "
            "topology off and activate them again: they are recreated without it.",
            field="topology",
        )
    extra = {}
    if kubeconfig is not None:
        cluster.kubeconfig_encrypted = _kubeconfig_encrypted(kubeconfig) if kubeconfig else ""
        extra = {"kubeconfig": "replaced" if kubeconfig else "removed"}
    cluster.save()
    audit_record(actor=actor, action="cluster.update", target=cluster, before=before, after=snapshot(cluster, CLUSTER_FIELDS) | extra)
    schedule_reconcile(cluster.pk)
    for manager_id in {m for m in (old_manager, cluster.manager_id) if m is not None}:
        schedule_reconcile(manager_id)  # a MultiKueue manager writes its workers' Secrets and MultiKueueClusters
    return cluster


def _flavors_carrying_topology(cluster: Cluster) -> list[str]:
    """The flavors of ``cluster`` whose ResourceFlavor on the cluster names its Topology: placed flavors
    (``topology_flavor``) that were applied, once the Topology itself was. Kueue refuses to take
    ``spec.topologyName`` off them (docs/cluster-objects.md, "Topology-aware placement")."""
    applied = AppliedObject.objects.filter(cluster=cluster)
    if not applied.filter(kind="Topology", applied_at__isnull=False).exists():
        return []
    written = set(applied.filter(kind="ResourceFlavor", applied_at__isnull=False).values_list("name", flat=True))
    return [f.name for f in cluster.flavors.order_by("order", "name") if f.name in written and topology_flavor(cluster, f)]


def cluster_set_kubeconfig(*, actor: Actor, cluster: Cluster, kubeconfig: str) -> Cluster:
    """Store a new kubeconfig, encrypted at rest (an empty string removes it)."""
    return cluster_update(actor=actor, cluster=cluster, kubeconfig=kubeconfig)


def clusters_kubeconfig_reencrypt() -> tuple[int, list[str]]:
    """After a Fernet key rotation (``PORTAL_ENCRYPTION_KEY=NEW,OLD``): encrypt every stored kubeconfig again with
    the newest key, so the old one can go. Returns (clusters rewritten, names of those no configured key opens)."""
    from portal.crypto import InvalidToken, reencrypt

    done, unreadable = 0, []
    for cluster in Cluster.objects.exclude(kubeconfig_encrypted="").order_by("pk"):
        try:
            token = reencrypt(cluster.kubeconfig_encrypted)
        except InvalidToken:
            unreadable.append(cluster.name)
            continue
        # Only if nobody stored another kubeconfig in the meantime (a compare-and-set on the old token).
        done += Cluster.objects.filter(pk=cluster.pk, kubeconfig_encrypted=cluster.kubeconfig_encrypted).update(
            kubeconfig_encrypted=token)
    return done, unreadable


def _check_promises_fit(cluster: Cluster) -> None:
    """Lowering the overcommit must leave every (flavor, resource)'s promises within the new limit."""
    for row in selectors.overcommit_for(cluster=cluster):
        if not row["within_limit"]:
            over = row["promised"] - row["allowed"]
            raise QuotaExceeded(
                f"tenants of cluster {cluster.name} are promised {fmt(row['promised'])} x {row['resource']} in "
                f"{row['flavor']} but {cluster.overcommit_percent}% overcommit allows {fmt(row['allowed'])} "
                f"({fmt(over)} over); lower the tenants' quotas first",
                constraint="cluster", over=over,
            )


# Flavors ---------------------------------------------------------------------------------------


def _check_label_key(key: Any, field: str) -> None:
    if not isinstance(key, str) or not key:
        raise Invalid("Label and taint keys are non-empty strings.", field=field)
    prefix, _, name = key.rpartition("/")
    if prefix and (len(prefix) > 253 or not all(_LABEL_RE.match(part) for part in prefix.split("."))):
        raise Invalid(f"{key!r}: the prefix must be a DNS subdomain.", field=field)
    if len(name) > 63 or not re.fullmatch(r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?", name):
        raise Invalid(f"{key!r} is not a valid Kubernetes label key.", field=field)


def _check_label_value(value: Any, field: str) -> None:
    if not isinstance(value, str) or len(value) > 63 or not re.fullmatch(r"([A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)?", value):
        raise Invalid(f"{value!r} is not a valid Kubernetes label value (a string of at most 63 characters).", field=field)


def _flavor_check(flavor: Flavor, cluster: Cluster) -> None:
    if flavor.kind not in Flavor.Kind.values:
        raise Invalid(f"Unknown kind {flavor.kind!r}; use one of {', '.join(Flavor.Kind.values)}.", field="kind")
    if flavor.kind == Flavor.Kind.MIG:
        if not cluster.use_mig:
            raise Invalid(f"Cluster {cluster.name} does not offer MIG flavors (use_mig is off).", field="kind")
        flavor.gpu_model = (flavor.gpu_model or "").strip().lower()
        flavor.mig_profile = validate_mig_profile(flavor.gpu_model, flavor.mig_profile)
    else:
        if flavor.mig_profile:
            raise Invalid("Only MIG flavors have a MIG profile.", field="mig_profile")
        if flavor.gpu_model and flavor.gpu_model.lower() not in MIG_PROFILES and not _LABEL_RE.match(flavor.gpu_model):
            raise Invalid("Use a short model key like h100-80gb.", field="gpu_model")
    if flavor.kind == Flavor.Kind.HAMI:
        if not cluster.use_hami:
            raise Invalid(f"Cluster {cluster.name} does not offer HAMi flavors (use_hami is off).", field="kind")
        if not flavor.hami_memory_mib or flavor.hami_memory_mib <= 0:
            raise Invalid("A HAMi flavor needs the memory per vGPU in MiB (more than 0).", field="hami_memory_mib")
        if not flavor.hami_cores_percent or not 0 < flavor.hami_cores_percent <= 100:
            raise Invalid("A HAMi flavor needs the compute per vGPU, 1 to 100 (% of a card).", field="hami_cores_percent")
    else:
        if flavor.hami_memory_mib:
            raise Invalid("Only HAMi flavors have memory per vGPU.", field="hami_memory_mib")
        if flavor.hami_cores_percent:
            raise Invalid("Only HAMi flavors have cores per vGPU.", field="hami_cores_percent")
    if flavor.pool_label not in POOL_LABELS:
        raise Invalid("The pool is empty, 'online' or 'offline'.", field="pool_label")
    if not isinstance(flavor.node_labels, dict):
        raise Invalid("Node labels are an object of label key to value.", field="node_labels")
    for key, value in flavor.node_labels.items():
        _check_label_key(key, "node_labels")
        _check_label_value(value, "node_labels")
    if not isinstance(flavor.taints, list):
        raise Invalid("Taints are a list.", field="taints")
    for taint in flavor.taints:
        if not isinstance(taint, dict) or set(taint) - {"key", "value", "effect"} or "key" not in taint:
            raise Invalid("Each taint is {key, value, effect}.", field="taints")
        _check_label_key(taint["key"], "taints")
        _check_label_value(taint.get("value", ""), "taints")
        if taint.get("effect") not in TAINT_EFFECTS:
            raise Invalid(f"A taint's effect is one of {', '.join(sorted(TAINT_EFFECTS))}.", field="taints")
    if not isinstance(flavor.tolerations, list):
        raise Invalid("Tolerations are a list.", field="tolerations")
    for toleration in flavor.tolerations:
        if not isinstance(toleration, dict) or set(toleration) - {"key", "operator", "value", "effect", "tolerationSeconds"}:
            raise Invalid("Each toleration is {key, operator, value, effect, tolerationSeconds}.", field="tolerations")
        if toleration.get("operator", "Equal") not in ("Equal", "Exists"):
            raise Invalid("A toleration's operator is Equal or Exists.", field="tolerations")
        if toleration.get("effect", "") not in TAINT_EFFECTS | {""}:
            raise Invalid(f"A toleration's effect is empty or one of {', '.join(sorted(TAINT_EFFECTS))}.", field="tolerations")
        if toleration.get("key"):
            _check_label_key(toleration["key"], "tolerations")
    _full_clean(flavor, exclude=["cluster"])
    if Flavor.objects.filter(cluster=cluster, name=flavor.name).exclude(pk=flavor.pk).exists():
        raise Invalid(f"Cluster {cluster.name} already has a flavor named {flavor.name!r}.", field="name")


@transaction.atomic
def flavor_create(
    *,
    actor: Actor,
    cluster: Cluster,
    name: str,
    kind: str,
    display_name: str = "",
    gpu_product: str = "",
    gpu_model: str = "",
    mig_profile: str = "",
    hami_memory_mib: int = 0,
    hami_cores_percent: int = 0,
    pool_label: str = "",
    node_labels: dict[str, str] | None = None,
    taints: list[dict[str, Any]] | None = None,
    tolerations: list[dict[str, Any]] | None = None,
    order: int = 100,
) -> Flavor:
    require(policy.may_manage_capacity(actor), "Only platform ops define flavors.")
    cluster = Cluster.objects.select_for_update().get(pk=cluster.pk)
    flavor = Flavor(
        cluster=cluster, name=name, kind=kind, display_name=display_name, gpu_product=gpu_product,
        gpu_model=gpu_model, mig_profile=mig_profile, hami_memory_mib=hami_memory_mib,
        hami_cores_percent=hami_cores_percent, pool_label=pool_label, node_labels=node_labels or {},
        taints=taints or [], tolerations=tolerations or [], order=order,
    )
    _flavor_check(flavor, cluster)
    flavor.save()
    audit_record(actor=actor, action="flavor.create", target=flavor, after=snapshot(flavor, FLAVOR_FIELDS))
    schedule_reconcile(cluster.pk)
    return flavor


@transaction.atomic
def flavor_update(*, actor: Actor, flavor: Flavor, **changes: Any) -> Flavor:
    """Change a flavor. Its cluster, name and kind name cluster objects and quota rows: fixed.
    Its GPU model and MIG profile decide its resource names: fixed once it has quotas."""
    require(policy.may_manage_capacity(actor), "Only platform ops change flavors.")
    cluster = Cluster.objects.select_for_update().get(pk=flavor.cluster_id)
    flavor = Flavor.objects.get(pk=flavor.pk)
    for key, value in changes.items():
        if key not in FLAVOR_FIELDS:
            raise Invalid("Unknown field.", field=key)
        if key in ("cluster", "name", "kind") and value != getattr(flavor, key if key != "cluster" else "cluster_id"):
            raise Invalid(f"The {key} of a flavor cannot change; create another flavor.", field=key)
    before = snapshot(flavor, FLAVOR_FIELDS)
    old_resources = flavor.resource_names
    for field, value in changes.items():
        if field != "cluster":
            setattr(flavor, field, value)
    _flavor_check(flavor, cluster)
    if flavor.resource_names != old_resources and Quota.objects.filter(flavor=flavor).exists():
        raise Invalid("This flavor has quotas: its MIG profile cannot change; create another flavor.", field="mig_profile")
    flavor.save()
    action = "flavor.update"
    if before and before["active"] != flavor.active:
        action = "flavor.activate" if flavor.active else "flavor.deactivate"
    audit_record(actor=actor, action=action, target=flavor, before=before, after=snapshot(flavor, FLAVOR_FIELDS))
    schedule_reconcile(cluster.pk)
    return flavor


def flavor_deactivate(*, actor: Actor, flavor: Flavor) -> Flavor:
    """Stop offering a flavor: new quotas and requests refuse it; the reconcile removes its
    ResourceFlavor and the quota entries that name it. Its quota rows stay, for history."""
    return flavor_update(actor=actor, flavor=flavor, active=False)


# Quantities ------------------------------------------------------------------------------------


def parse_quantity(value: Any, *, field: str, resource: str, allow_none: bool = False, positive: bool = False) -> Decimal | None:
    """A quota number from user input: a non-negative decimal with at most 3 places; whole numbers
    for GPU-like resources (``nvidia.com/...``). Raises ``Invalid`` naming ``field``."""
    if value is None or value == "":
        if allow_none:
            return None
        raise Invalid("A number is required.", field=field)
    if isinstance(value, bool):
        raise Invalid("A number is required.", field=field)
    try:
        number = Decimal(str(value).strip())
    except (InvalidOperation, ValueError):
        raise Invalid(f"{value!r} is not a number.", field=field) from None
    if not number.is_finite():
        raise Invalid("A finite number is required.", field=field)
    if number < 0:
        raise Invalid("Must be 0 or more.", field=field)
    if positive and number == 0:
        raise Invalid("Must be more than 0.", field=field)
    if number > MAX_QUANTITY:
        raise Invalid(f"Must be at most {fmt(MAX_QUANTITY)}.", field=field)
    if number != number.quantize(MILLI):
        raise Invalid("At most 3 decimal places.", field=field)
    if resource.startswith("nvidia.com/") and number != number.to_integral_value():
        raise Invalid(f"{resource} is counted in whole units.", field=field)
    return number.quantize(MILLI)


def _check_flavor_resource(flavor: Flavor, resource: str) -> Flavor:
    flavor = Flavor.objects.select_related("cluster").get(pk=flavor.pk)
    if not flavor.active:
        raise Invalid(f"Flavor {flavor.name} is no longer offered.", field="flavor")
    if resource not in flavor.resource_names:
        raise Invalid(f"Flavor {flavor.name} covers {', '.join(flavor.resource_names)}, not {resource!r}.", field="resource")
    return flavor


# Quotas ----------------------------------------------------------------------------------------


def _quota_snapshot(row: Quota, tenant: Tenant, project: Project | None, flavor: Flavor) -> dict[str, Any]:
    return {
        "tenant": tenant.slug,
        "project": project.slug if project else None,
        "cluster": flavor.cluster.name,
        "flavor": flavor.name,
        "resource": row.resource,
        "nominal": fmt(row.nominal),
        "borrowing_limit": None if row.borrowing_limit is None else fmt(row.borrowing_limit),
        "lending_limit": None if row.lending_limit is None else fmt(row.lending_limit),
    }


class _Locked:
    """The rows one quota change holds locks on, in the order they were locked."""

    def __init__(self, *, cluster: Cluster, cluster_locked: bool, tenant: Tenant, project: Project | None, flavor: Flavor,
                 resource: str, tenant_row: Quota, project_row: Quota | None):
        self.cluster, self.cluster_locked = cluster, cluster_locked
        self.tenant, self.project, self.flavor, self.resource = tenant, project, flavor, resource
        self.tenant_row, self.project_row = tenant_row, project_row


def _lock(*, tenant: Tenant, project: Project | None, flavor: Flavor, resource: str, with_cluster: bool) -> _Locked:
    """Lock cluster (when a tenant row may grow), tenant, the tenant's row, the project's row."""
    if with_cluster:
        cluster = Cluster.objects.select_for_update().get(pk=flavor.cluster_id)
        flavor.cluster = cluster
    else:
        cluster = flavor.cluster
    # The tenant lock serialises creating its Quota rows (no unique-violation races) and re-reads its status.
    tenant = Tenant.objects.select_for_update().get(pk=tenant.pk)
    tenant_row = _row(tenant=tenant, project=None, flavor=flavor, resource=resource)
    project_row = _row(tenant=tenant, project=project, flavor=flavor, resource=resource) if project else None
    if project is not None:
        project.tenant = tenant
    return _Locked(cluster=cluster, cluster_locked=with_cluster, tenant=tenant, project=project, flavor=flavor, resource=resource,
                   tenant_row=tenant_row, project_row=project_row)


def _row(*, tenant: Tenant, project: Project | None, flavor: Flavor, resource: str) -> Quota:
    row, _ = Quota.objects.get_or_create(tenant=tenant, project=project, flavor=flavor, resource=resource)
    return Quota.objects.select_for_update().get(pk=row.pk)


def _project_of(locked: _Locked) -> Project:
    if locked.project is None:
        raise RuntimeError("a project row's check needs the project")
    return locked.project


def _raise_tenant_fit(locked: _Locked, *, new: Decimal) -> None:
    """Invariant 1, for a project row growing to ``new``."""
    others = selectors.projects_promised(
        tenant=locked.tenant, flavor=locked.flavor, resource=locked.resource, exclude_project_id=_project_of(locked).pk
    )
    total, has = others + new, locked.tenant_row.nominal
    if total > has:
        raise QuotaExceeded(
            f"projects of {locked.tenant.slug} would be promised {fmt(total)} x {locked.resource} in {locked.flavor.name} "
            f"but the tenant has {fmt(has)} ({fmt(total - has)} over)",
            constraint="tenant", over=total - has,
        )


def _raise_projects_fit(locked: _Locked, *, new: Decimal) -> None:
    """Invariant 1, for a tenant row shrinking to ``new``."""
    promised = selectors.projects_promised(tenant=locked.tenant, flavor=locked.flavor, resource=locked.resource)
    if promised > new:
        raise QuotaExceeded(
            f"projects of {locked.tenant.slug} are promised {fmt(promised)} x {locked.resource} in {locked.flavor.name} "
            f"but the tenant would have {fmt(new)} ({fmt(promised - new)} over); lower the projects' quotas first",
            constraint="projects", over=promised - new,
        )


def _raise_cluster_fit(locked: _Locked, *, new: Decimal) -> None:
    """Invariant 2, for a tenant row growing to ``new``. Needs the cluster lock."""
    cluster = locked.cluster
    capacity = selectors.capacity_of(cluster, locked.flavor, locked.resource)
    allowed = selectors.allowed_promise(cluster, capacity)
    total = selectors.tenants_promised(flavor=locked.flavor, resource=locked.resource, exclude_tenant_id=locked.tenant.pk) + new
    if total > allowed:
        if cluster.overcommit_percent:
            limit = f"allows {fmt(allowed)} ({fmt(capacity)} with {cluster.overcommit_percent}% overcommit)"
        else:
            limit = f"has {fmt(capacity)}"
        raise QuotaExceeded(
            f"tenants of cluster {cluster.name} would be promised {fmt(total)} x {locked.resource} in {locked.flavor.name} "
            f"but the cluster {limit} ({fmt(total - allowed)} over)",
            constraint="cluster", over=total - allowed,
        )


_KEEP: Any = object()


def _write(locked: _Locked, row: Quota, *, actor: Actor, action: str, nominal: Decimal,
           borrowing_limit: Any = _KEEP, lending_limit: Any = _KEEP) -> Quota:
    """Check the invariant the change could break, write the row, audit, schedule the reconcile."""
    project = locked.project if row.project_id else None
    if project is not None:
        if nominal > row.nominal:
            _raise_tenant_fit(locked, new=nominal)
    elif nominal < row.nominal:
        _raise_projects_fit(locked, new=nominal)
    elif nominal > row.nominal:
        if not locked.cluster_locked:
            raise RuntimeError("a tenant quota may only grow under the cluster lock")
        _raise_cluster_fit(locked, new=nominal)
    before = _quota_snapshot(row, locked.tenant, project, locked.flavor)
    row.nominal = nominal
    if borrowing_limit is not _KEEP:
        row.borrowing_limit = borrowing_limit
    if lending_limit is not _KEEP:
        row.lending_limit = lending_limit
    if row.lending_limit is not None and row.lending_limit > row.nominal:
        row.lending_limit = row.nominal  # a ClusterQueue cannot lend more than it is promised
    row.save(update_fields=["nominal", "borrowing_limit", "lending_limit", "updated_at"])
    after = _quota_snapshot(row, locked.tenant, project, locked.flavor)
    if after != before:
        audit_record(actor=actor, action=action, target=row, tenant=locked.tenant, project=project, before=before, after=after)
        schedule_reconcile(locked.cluster.pk)
    return row


@transaction.atomic
def quota_set(
    *,
    actor: Actor,
    flavor: Flavor,
    resource: str,
    nominal: Any,
    tenant: Tenant | None = None,
    project: Project | None = None,
    borrowing_limit: Any = None,
    lending_limit: Any = None,
) -> Quota:
    """Set the nominal quota and limits of a tenant (ops) or a project (tenant admins, ops).

    ``None`` limits mean "no limit" (Kueue's default). Raises ``QuotaExceeded`` naming the broken
    invariant and the excess; ``Invalid`` (with a field) for bad input; ``NotAllowed``.
    """
    if (tenant is None) == (project is None):
        raise Invalid("Give either a tenant or a project.", field="project" if project is None else "tenant")
    if project is not None:
        project = Project.objects.select_related("tenant").get(pk=project.pk)
        tenant = project.tenant
        require(policy.may_set_quota(actor, project=project),
                "Only tenant admins and ops split the tenant's quota across its projects.")
    else:
        require(policy.may_set_quota(actor, tenant=tenant), "Only platform ops set a tenant's quota.")
    assert tenant is not None
    _require_writable(actor, tenant)
    if not isinstance(resource, str) or not resource:
        raise Invalid("A resource name is required.", field="resource")
    flavor = _check_flavor_resource(flavor, resource)
    nominal = parse_quantity(nominal, field="nominal", resource=resource)
    borrowing = parse_quantity(borrowing_limit, field="borrowing_limit", resource=resource, allow_none=True)
    lending = parse_quantity(lending_limit, field="lending_limit", resource=resource, allow_none=True)
    if borrowing is not None or lending is not None:
        field = "borrowing_limit" if borrowing is not None else "lending_limit"
        if not architectures.of(flavor.cluster).cohorts:
            raise Invalid(
                f"Cluster {flavor.cluster.name} runs architecture {flavor.cluster.architecture}: there is no cohort to borrow from or lend to.", field=field
            )
        if project is None:
            raise Invalid(
                "A tenant's quota is its cohort's pool, and a cohort without a parent cannot borrow or lend: "
                "set limits on project quotas.", field=field,
            )
    if lending is not None and lending > nominal:
        raise Invalid(f"A project cannot lend more than its nominal quota ({fmt(nominal)}).", field="lending_limit")
    locked = _lock(tenant=tenant, project=project, flavor=flavor, resource=resource, with_cluster=project is None)
    _require_writable(actor, locked.tenant)
    row = locked.project_row if project is not None else locked.tenant_row
    if row is None:  # _lock reads the project's row whenever a project is given
        raise RuntimeError("the project's quota row was not locked")
    return _write(locked, row, actor=actor, action="quota.set", nominal=nominal, borrowing_limit=borrowing, lending_limit=lending)


# Quota requests --------------------------------------------------------------------------------


def _request_snapshot(request: QuotaRequest) -> dict[str, Any]:
    return {
        "project": request.project.slug,
        "flavor": request.flavor.name,
        "resource": request.resource,
        "amount": fmt(request.amount),
        **({"share_memory_mib": request.share_memory_mib, "share_cores_percent": request.share_cores_percent}
           if request.is_share else {}),
        "until": request.until.isoformat() if request.until else None,
        "status": request.status,
        "approver": request.approver,
        "decided_by": request.decided_by.get_username() if request.decided_by is not None else None,
        "comment": request.comment,
        "applied": request.applied or {},
    }


def _units(flavor: Flavor, resource: str, *, one: bool) -> str:
    s = "" if one else "s"
    if resource == "nvidia.com/gpu":
        return f"{flavor} {'vGPU slot' if flavor.kind == Flavor.Kind.HAMI else 'GPU'}{s}"
    if resource.startswith("nvidia.com/mig-"):
        return f"{flavor} MIG slice{s}"
    if resource == "nvidia.com/total-gpucores":
        return f"% of GPU cores of {flavor}"
    if resource == "nvidia.com/total-gpumem":
        return f"MiB of GPU memory of {flavor}"
    if resource == "cpu":
        return f"CPU core{s}"
    if resource == "memory":
        return "GiB of memory"
    return f"× {resource} of {flavor}"


def amount_words(flavor: Flavor, resource: str, amount: Decimal) -> str:
    """``16 h100-80gb GPUs``, ``1 a100-80gb-mig-1g.10gb MIG slice``, ``96 CPU cores``: an amount for people."""
    units = _units(flavor, resource, one=amount == 1)
    return f"{fmt(amount)}{'' if units.startswith('%') else ' '}{units}"


def _check_request_fits_cluster(*, project: Project, flavor: Flavor, resource: str, amount: Decimal) -> None:
    """A project can never use more than the cluster has: refuse asking for more than the capacity of
    the flavor's nodes that count (``capacity.capacity_by_flavor``) less what the project already has,
    and say so with the numbers."""
    cluster = flavor.cluster
    capacity = selectors.capacity_of(cluster, flavor, resource)
    row = Quota.objects.filter(project=project, flavor=flavor, resource=resource).first()
    has = row.nominal if row is not None else ZERO
    if has + amount <= capacity:
        return
    if capacity <= 0:
        raise Invalid(f"Cluster {cluster.name} has no {_units(flavor, resource, one=False).removeprefix('% of ')} on nodes "
                      "that count today (none is ready), so none can be asked for.", field="amount")
    room = max(capacity - has, ZERO)
    already = f"{project.name} already has {fmt(has)}, so" if has else "so"
    more = f"it can ask for at most {fmt(room)} more" if room > 0 else "it cannot ask for more"
    raise Invalid(f"Cluster {cluster.name} has {amount_words(flavor, resource, capacity)} in all; {already} {more} "
                  f"(asked for {fmt(amount)}).", field="amount")


GPU = "nvidia.com/gpu"


def share_size(flavor: Flavor, *, memory_gib: Any = None, cores_percent: Any = None) -> tuple[int, int]:
    """The size of a HAMi share as (memory MiB, % of a card's cores): the flavor's preset, or what was asked
    (GiB and %) within bounds (more than 0, at most one card's memory and 100 %). ``Invalid`` names the field."""
    card = selectors.hami_card_mib(flavor)
    if memory_gib is None or memory_gib == "":
        memory = flavor.hami_memory_mib
    else:
        try:
            gib = Decimal(str(memory_gib).strip())
        except (InvalidOperation, ValueError):
            raise Invalid(f"{memory_gib!r} is not a number of GiB.", field="share_memory_gib") from None
        if isinstance(memory_gib, bool) or not gib.is_finite():
            raise Invalid("Give the GPU memory of a share in GiB.", field="share_memory_gib")
        memory = int((gib * 1024).to_integral_value())
        if gib <= 0 or memory < 1:
            raise Invalid("A share needs more than 0 GiB of GPU memory.", field="share_memory_gib")
        if card and memory > card:
            raise Invalid(f"A share holds at most one card's memory: {gib_words(card)} GiB on {flavor}.",
                          field="share_memory_gib")
    if cores_percent is None or cores_percent == "":
        cores = flavor.hami_cores_percent
    else:
        try:
            cores_number = Decimal(str(cores_percent).strip())
        except (InvalidOperation, ValueError):
            raise Invalid(f"{cores_percent!r} is not a percentage.", field="share_cores_percent") from None
        if isinstance(cores_percent, bool) or not cores_number.is_finite() or cores_number != cores_number.to_integral_value():
            raise Invalid("Give the share of the cores as a whole percentage, 1 to 100.", field="share_cores_percent")
        cores = int(cores_number)
        if not 0 < cores <= 100:
            raise Invalid("A share gets 1 to 100 % of a card's cores.", field="share_cores_percent")
    if not memory or not cores:
        raise Invalid(f"HAMi flavor {flavor.name} has no share size yet: give the GPU memory (GiB) and the % of the "
                      "cores of a share, or ask platform ops to set the flavor's.", field="share_memory_gib")
    return memory, cores


def _request_share(flavor: Flavor, resource: str, memory_gib: Any, cores_percent: Any) -> tuple[int, int]:
    """(0, 0) for a request that is not in HAMi shares; else the share size. A HAMi flavor is asked for in shares
    only: one request for its vGPU slots, cores and memory together, never one raw row of the three."""
    if flavor.kind != Flavor.Kind.HAMI:
        for value, field in ((memory_gib, "share_memory_gib"), (cores_percent, "share_cores_percent")):
            if value not in (None, ""):
                raise Invalid(f"Only HAMi flavors are asked for in shares; {flavor.name} is not one.", field=field)
        return 0, 0
    if resource != GPU:
        raise Invalid(f"{flavor} is asked for in shares, not in {resource}: the amount is a number of shares "
                      f"({flavor.share or 'of the size you give'} each), and approval raises its vGPU slots, cores "
                      "and memory together.", field="resource")
    return share_size(flavor, memory_gib=memory_gib, cores_percent=cores_percent)


def _check_shares_fit_cluster(request: QuotaRequest) -> None:
    """``_check_request_fits_cluster`` for a request in HAMi shares, said in shares: how many more of that size
    the cluster could ever give the project, and which of slots, cores or memory runs out first."""
    project, flavor = request.project, request.flavor
    per_share = dict(QuotaRequest(amount=Decimal(1), share_memory_mib=request.share_memory_mib,
                                  share_cores_percent=request.share_cores_percent).share_rows())
    room: list[tuple[Decimal, str]] = []
    for resource, one in per_share.items():
        row = Quota.objects.filter(project=project, flavor=flavor, resource=resource).first()
        left = selectors.capacity_of(flavor.cluster, flavor, resource) - (row.nominal if row is not None else ZERO)
        room.append(((max(left, ZERO) / one).to_integral_value(rounding="ROUND_FLOOR"), resource))
    fits, short = min(room)
    if request.amount <= fits:
        return
    what = {GPU: "vGPU slots", "nvidia.com/total-gpucores": "GPU cores", "nvidia.com/total-gpumem": "GPU memory"}[short]
    more = f"at most {fmt(fits)} more" if fits > 0 else "no more"
    raise Invalid(f"Cluster {flavor.cluster.name} can give {project.name} {more} shares of {request.share_size} on "
                  f"{flavor} ({what} run out first; asked for {fmt(request.amount)}).", field="amount")


def _approver_for_rows(project: Project, flavor: Flavor, rows: list[tuple[str, Decimal]]) -> str:
    """Who owns the headroom for every row a request raises: the highest tier any of them needs."""
    tiers = [selectors.approver_for(project=project, flavor=flavor, resource=resource, amount=amount)
             for resource, amount in rows]
    return max(tiers, key=lambda tier: selectors.TIER_RANK[tier])


def _reload(request: QuotaRequest) -> QuotaRequest:
    return QuotaRequest.objects.select_related("project__tenant", "flavor__cluster", "requested_by", "decided_by").get(pk=request.pk)


@transaction.atomic
def quota_request_create(
    *,
    actor: Actor,
    project: Project,
    flavor: Flavor,
    resource: str,
    amount: Any,
    reason: str,
    until: datetime | None = None,
    share_memory_gib: Any = None,
    share_cores_percent: Any = None,
) -> QuotaRequest:
    """A member asks for ``amount`` more of (flavor, resource) for the project, maybe until a date.
    It is routed to whoever owns the headroom (``selectors.approver_for``; for HAMi shares, of all three rows).

    A HAMi flavor is asked for in shares: ``resource`` is ``nvidia.com/gpu`` and ``amount`` the number of
    shares, each of the flavor's preset size or of ``share_memory_gib`` GiB and ``share_cores_percent`` % of
    the cores (``share_size``); approval raises the vGPU slots, cores and memory rows together."""
    project = Project.objects.select_related("tenant").get(pk=project.pk)
    if actor.user is None:
        raise NotAllowed("Quota requests are made by people.")
    require(policy.may_request_quota(actor, project), "Your role in this project cannot ask for quota.")
    _require_writable(actor, project.tenant)
    if not project.is_active:
        raise Invalid("The project is archived.", field="project")
    if not isinstance(resource, str) or not resource:
        raise Invalid("A resource name is required.", field="resource")
    flavor = _check_flavor_resource(flavor, resource)
    memory_mib, cores_percent = _request_share(flavor, resource, share_memory_gib, share_cores_percent)
    amount = parse_quantity(amount, field="amount", resource=resource, positive=True)
    request = QuotaRequest(
        project=project, flavor=flavor, resource=resource, amount=amount, until=until, reason=reason,
        requested_by=actor.user, share_memory_mib=memory_mib, share_cores_percent=cores_percent,
    )
    if request.is_share:
        _check_shares_fit_cluster(request)
    else:
        _check_request_fits_cluster(project=project, flavor=flavor, resource=resource, amount=amount)
    if until is not None and until <= timezone.now():
        raise Invalid("The end must be in the future.", field="until")
    request.reason = (reason or "").strip()
    if not request.reason:
        raise Invalid("Say why the project needs it.", field="reason")
    request.approver = _approver_for_rows(project, flavor, request.share_rows())
    _full_clean(request, exclude=["applied", "decided_by", "requested_by", "project", "flavor"])
    request.save()
    request = _reload(request)
    audit_record(actor=actor, action="quota_request.create", target=request, tenant=project.tenant, project=project,
                 after=_request_snapshot(request))
    quota_request_notify(request=request, event="submitted", actor_label=actor.label)
    return request


_TIER_WHO: dict[str, str] = {
    Approver.PROJECT_ADMIN: "a project admin (not the requester), a tenant admin or ops",
    Approver.TENANT_ADMIN: "a tenant admin or ops",
    Approver.OPS: "platform ops",
}


def _require_decider(actor: Actor, request: QuotaRequest, *, tier: str, why: str = "") -> None:
    if not policy.may_decide(actor, request, tier=tier):
        raise NotAllowed(f"{why}Only {_TIER_WHO[tier]} may decide this request.")


def _decide(request: QuotaRequest, *, to: str, actor: Actor, action: str, fields: dict[str, Any],
            effect: Any = None) -> QuotaRequest:
    """Move a pending request (``quotas.states``): of two deciders clicking at once exactly one wins."""
    moved = states.move(request, to=to, actor=actor, action=action, fields=fields, effect=effect,
                        snapshot=_request_snapshot)
    if moved is None:
        raise AlreadyDecided(f"The request is already {states.current_status(request.pk)}.")
    return moved


@transaction.atomic
def quota_request_approve(*, actor: Actor, request: QuotaRequest, comment: str = "") -> QuotaRequest:
    """Approve and apply at once: the project's quota grows by the amount; when the tenant's
    unassigned quota does not cover it, the tenant's grows by the shortfall (tenant admins, ops).
    ``applied`` records what was added to which rows so the revert subtracts exactly that."""
    request = _reload(request)
    if request.status != Status.PENDING:
        raise AlreadyDecided(f"The request is already {request.status}.")
    _require_decider(actor, request, tier=request.approver)
    _require_writable(actor, request.project.tenant)
    now = timezone.now()
    if request.until is not None and request.until <= now:
        raise ConflictError("The request's end date has passed; ask again.")
    request = _decide(request, to=Status.APPROVED, actor=actor, action="quota_request.approve",
                      fields={"decided_by": actor.user, "decided_at": now, "comment": comment or ""},
                      effect=lambda locked: _approval_apply(actor, locked))
    quota_request_notify(request=request, event="approved", actor_label=actor.label, also=[actor.user])
    return request


def _approval_apply(actor: Actor, request: QuotaRequest) -> None:
    """The quota writes of an approval, under the request's row lock (``states.move``'s effect). A request in
    HAMi shares raises its three rows (vGPU slots, cores, memory) in this one transaction: all or none.
    ``applied``: ``{"tenant": ..., "project": ...}`` for one row; ``{"rows": {resource: {...}}}`` for shares."""
    flavor = _check_flavor_resource(request.flavor, request.resource)
    rows: dict[str, dict[str, Any]] = {}
    for resource, amount in request.share_rows():  # always in the flavor's resource order: one lock order
        rows[resource] = _approval_apply_row(actor, request, flavor, resource, amount)
    request.applied = rows[request.resource] if not request.is_share else {"rows": rows}
    request.save(update_fields=["applied"])


def _approval_apply_row(actor: Actor, request: QuotaRequest, flavor: Flavor, resource: str, amount: Decimal) -> dict[str, Any]:
    project = request.project
    locked = _lock(tenant=project.tenant, project=project, flavor=flavor, resource=resource, with_cluster=True)
    # Who owns the headroom now, under the locks: the routing at submission is a floor.
    need = selectors.approver_for(project=project, flavor=flavor, resource=resource, amount=amount)
    if selectors.TIER_RANK[need] > selectors.TIER_RANK[request.approver]:
        why = ("The tenant's unassigned quota no longer covers this. " if need == Approver.TENANT_ADMIN
               else "Neither the tenant's unassigned quota nor the cluster's unpromised capacity covers this any more. ")
        _require_decider(actor, request, tier=need, why=why)
    unassigned = locked.tenant_row.nominal - selectors.projects_promised(tenant=locked.tenant, flavor=flavor, resource=resource)
    shortfall = max(amount - max(unassigned, ZERO), ZERO)
    applied: dict[str, Any] = {}
    if shortfall > 0:
        _write(locked, locked.tenant_row, actor=actor, action="quota.raise", nominal=locked.tenant_row.nominal + shortfall)
        applied["tenant"] = {"quota": locked.tenant_row.pk, "added": fmt(shortfall)}
    assert locked.project_row is not None
    _write(locked, locked.project_row, actor=actor, action="quota.raise", nominal=locked.project_row.nominal + amount)
    applied["project"] = {"quota": locked.project_row.pk, "added": fmt(amount)}
    return applied


@transaction.atomic
def quota_request_reject(*, actor: Actor, request: QuotaRequest, comment: str) -> QuotaRequest:
    request = _reload(request)
    if request.status != Status.PENDING:
        raise AlreadyDecided(f"The request is already {request.status}.")
    _require_decider(actor, request, tier=request.approver)
    _require_writable(actor, request.project.tenant)
    comment = (comment or "").strip()
    if not comment:
        raise Invalid("Say why, so the requester knows what to do.", field="comment")
    request = _decide(request, to=Status.REJECTED, actor=actor, action="quota_request.reject",
                      fields={"decided_by": actor.user, "decided_at": timezone.now(), "comment": comment})
    quota_request_notify(request=request, event="rejected", actor_label=actor.label, also=[actor.user])
    return request


@transaction.atomic
def quota_request_cancel(*, actor: Actor, request: QuotaRequest) -> QuotaRequest:
    """The requester withdraws a pending request."""
    request = _reload(request)
    require(policy.may_withdraw(actor, request), "Only the requester can cancel a request; approvers reject it.")
    _require_writable(actor, request.project.tenant)
    if request.status != Status.PENDING:
        raise AlreadyDecided(f"The request is already {request.status}.")
    request = _decide(request, to=Status.CANCELLED, actor=actor, action="quota_request.cancel",
                      fields={"decided_at": timezone.now()})
    quota_request_notify(request=request, event="cancelled", actor_label=actor.label)
    return request


@transaction.atomic
def quota_request_revert(*, request_id: int, now: datetime) -> bool:
    """End an approved request whose ``until`` has passed: subtract what approval added, never
    taking the project's quota below 0 nor the tenant's below what its projects are still promised.
    False when there is nothing to do (not due, or another worker got there first)."""
    actor = Actor.system()
    request = states.move(QuotaRequest(pk=request_id), to=Status.REVERTED, actor=actor, action="quota_request.revert",
                          where={"until__lte": now}, effect=lambda locked: _revert_apply(actor, locked, now),
                          snapshot=_request_snapshot)
    if request is None:
        return False
    quota_request_notify(request=request, event="reverted", actor_label=actor.label)
    return True


def _revert_apply(actor: Actor, request: QuotaRequest, now: datetime) -> None:
    """Subtract what approval added, under the request's row lock (``states.move``'s effect): each row it
    raised (HAMi shares: the three, in one transaction)."""
    applied = dict(request.applied or {})
    if "rows" in applied:
        reverted_rows = {resource: _revert_row(actor, request, resource, added)
                         for resource, added in applied["rows"].items()}
        request.applied = applied | {"reverted": reverted_rows, "reverted_at": now.isoformat()}
    else:
        request.applied = applied | {"reverted": _revert_row(actor, request, request.resource, applied),
                                     "reverted_at": now.isoformat()}
    request.save(update_fields=["applied"])


def _revert_row(actor: Actor, request: QuotaRequest, resource: str, applied: dict[str, Any]) -> dict[str, str]:
    project, flavor = request.project, request.flavor
    locked = _lock(tenant=project.tenant, project=project, flavor=flavor, resource=resource, with_cluster=True)
    reverted: dict[str, str] = {}
    added = Decimal(applied.get("project", {}).get("added", "0"))
    assert locked.project_row is not None
    take = min(added, locked.project_row.nominal)
    _write(locked, locked.project_row, actor=actor, action="quota.revert", nominal=locked.project_row.nominal - take)
    reverted["project"] = fmt(take)
    added = Decimal(applied.get("tenant", {}).get("added", "0"))
    if added > 0:
        promised = selectors.projects_promised(tenant=locked.tenant, flavor=flavor, resource=resource)
        take = min(added, max(locked.tenant_row.nominal - promised, ZERO))
        _write(locked, locked.tenant_row, actor=actor, action="quota.revert", nominal=locked.tenant_row.nominal - take)
        reverted["tenant"] = fmt(take)
    return reverted


@transaction.atomic
def quota_request_lapse(*, request_id: int, now: datetime) -> bool:
    """A pending request whose ``until`` passed before anyone decided is closed (rejected by the system)."""
    request = states.move(QuotaRequest(pk=request_id), to=Status.REJECTED, actor=Actor.system(),
                          action="quota_request.lapse", where={"until__lte": now},
                          fields={"decided_at": now, "comment": "Ended before anyone decided."}, snapshot=_request_snapshot)
    if request is None:
        return False
    quota_request_notify(request=request, event="lapsed", actor_label="system")
    return True
