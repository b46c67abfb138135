"""Portal forms for capacity, flavors and quotas. They shape and check input; the views hand the
cleaned data to ``quotas.services``, whose refusals (with their numbers) are shown on these forms.

A quota is always for one (flavor, resource): the forms offer them as one choice, ``"<flavor id>|<resource>"``.
"""

from __future__ import annotations

from collections.abc import Iterable
from decimal import Decimal
from typing import Any

from django import forms
from django.core.exceptions import ValidationError
from django.db.models import QuerySet
from django.utils import timezone

from portal.forms import DecimalField, IntegerField, JSONField
from tenants.models import Project, Tenant

from .models import Architecture, Cluster, Flavor

QUANTITY_HELP = "GPUs, MIG slices and vGPU slots are whole numbers; CPU in cores, memory in GiB."
LIMIT_HELP = "Empty: no limit (Kueue's default)."


def target_key(flavor: Flavor, resource: str) -> str:
    return f"{flavor.pk}|{resource}"


RESOURCE_UNITS = {"nvidia.com/total-gpucores": "% of a card's cores", "nvidia.com/total-gpumem": "MiB", "memory": "GiB",
                  "cpu": "cores"}


def target_choices(flavors: Iterable[Flavor], *, in_shares: bool = False) -> list[tuple[str, str]]:
    """One choice per (flavor, resource) the flavors cover, labelled for people; names the cluster
    only when there is more than one. ``in_shares`` (quota requests): a HAMi flavor is one choice, its shares
    ("L40S shared (HAMi) — shares of 11 GiB, 25 % of the cores"), not its three rows."""
    flavors = list(flavors)
    several = len({f.cluster_id for f in flavors}) > 1
    choices = []
    for flavor in flavors:
        where = f"{flavor.cluster.name} · " if several else ""
        if in_shares and flavor.kind == Flavor.Kind.HAMI:
            size = f"shares of {flavor.share}" if flavor.share else "shares (give their size)"
            choices.append((target_key(flavor, flavor.primary_resource), f"{where}{flavor} — {size}"))
            continue
        for resource in flavor.resource_names:
            unit = f" ({RESOURCE_UNITS[resource]})" if resource in RESOURCE_UNITS else ""
            choices.append((target_key(flavor, resource), f"{where}{flavor.name} — {resource}{unit}"))
    return choices


def _quantity(label: str, *, required: bool = True, help_text: str = "", positive: bool = False) -> forms.DecimalField:
    # ``positive``: more than 0, checked with the chosen resource in mind (``QuotaRequestForm.clean``), so
    # a GPU request is asked for "at least 1", never for "0.001".
    return DecimalField(
        label=label, required=required, min_value=None if positive else Decimal(0),
        max_digits=14, decimal_places=3, help_text=help_text,
    )


def whole_units(resource: str) -> bool:
    """GPUs, MIG slices and vGPU slots (``nvidia.com/...``) are counted in whole units."""
    return resource.startswith("nvidia.com/")


class TargetMixin:
    """A ``target`` choice field resolved to (flavor, resource) among the flavors given."""

    flavors: dict[int, Flavor]
    in_shares = False

    def _set_targets(self, flavors: Iterable[Flavor]) -> None:
        flavors = list(flavors)
        self.flavors = {f.pk: f for f in flavors}
        self.fields["target"].choices = [("", "Choose…")] + target_choices(flavors, in_shares=self.in_shares)  # type: ignore[attr-defined]

    def cleaned_target(self) -> tuple[Flavor, str]:
        flavor_id, _, resource = self.cleaned_data["target"].partition("|")  # type: ignore[attr-defined]
        return self.flavors[int(flavor_id)], resource


class TenantQuotaForm(TargetMixin, forms.Form):
    """Ops: what one tenant is promised of one (flavor, resource)."""

    # A slug or a name typed (suggestions as one types: tenants.filters.tenant_search_widget), never a list of
    # every tenant: there may be thousands.
    tenant = forms.CharField(max_length=200, help_text="The tenant's slug or name.")
    target = forms.ChoiceField(label="Flavor and resource")
    nominal = _quantity("Nominal quota", help_text=QUANTITY_HELP)

    def __init__(self, *args: Any, tenants: QuerySet[Tenant] | None = None, flavors: Iterable[Flavor] = (),
                 **kwargs: Any) -> None:
        kwargs.setdefault("prefix", "tq")
        super().__init__(*args, **kwargs)
        self.tenants = tenants if tenants is not None else Tenant.objects.none()  # read only when a form is sent
        self._set_targets(flavors)

    def clean_tenant(self) -> Tenant:
        value = self.cleaned_data["tenant"].strip()
        tenant = self.tenants.filter(slug=value).first() or self.tenants.filter(name__iexact=value).order_by("slug").first()
        if tenant is None:
            raise ValidationError("No such tenant: type its slug or its name.", code="invalid_choice")
        return tenant

    def cleaned_tenant(self) -> Tenant:
        return self.cleaned_data["tenant"]


class ProjectQuotaForm(TargetMixin, forms.Form):
    """Tenant admins: one project's share of the tenant's quota, with its cohort limits."""

    project = forms.ChoiceField()
    target = forms.ChoiceField(label="Flavor and resource")
    nominal = _quantity("Nominal quota", help_text=QUANTITY_HELP)
    borrowing_limit = _quantity("Borrowing limit", required=False, help_text="How much more it may take from the tenant's cohort. " + LIMIT_HELP)
    lending_limit = _quantity("Lending limit", required=False, help_text="How much of its unused quota it lends out. " + LIMIT_HELP)

    def __init__(self, *args: Any, projects: Iterable[Project] = (), flavors: Iterable[Flavor] = (), **kwargs: Any) -> None:
        kwargs.setdefault("prefix", "pq")
        super().__init__(*args, **kwargs)
        self.projects = {p.slug: p for p in projects}
        self.fields["project"].choices = [("", "Choose…")] + [(slug, f"{p.name} ({slug})") for slug, p in self.projects.items()]
        self._set_targets(flavors)

    def cleaned_project(self) -> Project:
        return self.projects[self.cleaned_data["project"]]


class QuotaRequestForm(TargetMixin, forms.Form):
    """A member asks for more of one (flavor, resource), maybe until a date; of a HAMi flavor, for shares (of its
    preset size, or of the GiB and % given), which approval turns into its three quota rows together."""

    in_shares = True
    target = forms.ChoiceField(label="Flavor and resource")
    amount = _quantity("How much more", positive=True,
                       help_text=QUANTITY_HELP + " For a HAMi shared flavor: the number of shares.")
    share_memory_gib = DecimalField(
        label="HAMi share: GPU memory (GiB)", required=False, max_digits=8, decimal_places=3,
        help_text="HAMi flavors only: the memory of each share. Empty: the flavor's preset size.")
    share_cores_percent = IntegerField(
        label="HAMi share: % of the cores", required=False,
        help_text="HAMi flavors only: each share's percentage of a card's cores, 1 to 100. Empty: the preset.")
    until = forms.DateTimeField(
        required=False, label="Until", help_text="Empty: permanent. The extra quota is removed when it ends.",
        widget=forms.DateTimeInput(attrs={"type": "datetime-local"}, format="%Y-%m-%dT%H:%M"),
        input_formats=["%Y-%m-%dT%H:%M", "%Y-%m-%d %H:%M", "%Y-%m-%dT%H:%M:%S", "%Y-%m-%d"],
    )
    reason = forms.CharField(widget=forms.Textarea(attrs={"rows": 3}), max_length=2000, help_text="What it is for; approvers see this.")

    def __init__(self, *args: Any, flavors: Iterable[Flavor] = (), **kwargs: Any) -> None:
        kwargs.setdefault("prefix", "qr")
        super().__init__(*args, **kwargs)
        self.fields["until"].label = f"Until ({timezone.get_current_timezone_name()})"
        self._set_targets(flavors)

    def clean(self) -> dict[str, Any]:
        data = super().clean()
        amount, target = data.get("amount"), data.get("target")
        if amount is None:
            return data
        resource = target.partition("|")[2] if target else ""
        if whole_units(resource):
            if amount < 1:
                self.add_error("amount", f"Ask for at least 1: {resource} is counted in whole units.")
            elif amount != amount.to_integral_value():
                self.add_error("amount", f"{resource} is counted in whole units: ask for a whole number.")
        elif amount <= 0:
            self.add_error("amount", "Ask for more than 0.")
        return data


class DecisionForm(forms.Form):
    decision = forms.ChoiceField(choices=[("approve", "Approve"), ("reject", "Reject")])
    comment = forms.CharField(required=False, max_length=2000, widget=forms.Textarea(attrs={"rows": 2}),
                              help_text="Required to reject: say why, so the requester knows what to do.")


class ClusterSettingsForm(forms.Form):
    """Settings that change what may be promised or offered; the architecture changes through a plan."""

    overcommit_percent = IntegerField(
        min_value=0, label="Overcommit (%)",
        help_text="How far the tenants' nominal quotas may exceed capacity. 0: promises must fit.",
    )
    use_mig = forms.BooleanField(required=False, label="Offer MIG flavors (C, E, F)")
    use_hami = forms.BooleanField(required=False, label="Offer HAMi flavors (D, E, F)")
    volcano_capacity_plugin = forms.BooleanField(required=False, label="Volcano runs the capacity plugin")
    topology = forms.ChoiceField(
        choices=Cluster._meta.get_field("topology").choices, required=False, label="Topology-aware placement",
        help_text="Block, rack, host: Kueue places distributed training within one rack or block, from the nodes' "
                  "cloud.provider.com/topology-block and -rack labels; or the levels named below. Applied through the "
                  "plan below; switching it off or changing its levels needs the placed flavors deleted first (Kueue "
                  "cannot take a flavor's topology off, nor change a Topology's levels).",
    )
    topology_levels = forms.CharField(
        required=False, label="Topology levels (with “The levels named below”)",
        widget=forms.Textarea(attrs={"rows": 4, "spellcheck": "false"}),
        help_text="One level a line, highest first: its name and its node label key, e.g. “zone "
                  "topology.kubernetes.io/zone”, “rack example.com/rack”, “nvlink nvidia.com/gpu.clique”, “host "
                  "kubernetes.io/hostname”. At most 8; the hostname only last. Requests may ask for one rack, block or "
                  "NVLink domain (level nvlink).",
    )
    prometheus_cluster = forms.CharField(
        max_length=63, required=False, label="Prometheus cluster label value",
        help_text="Where one Prometheus answers for several clusters (PROMETHEUS_CLUSTER_LABEL set): the value of that "
                  "label on this cluster's DCGM series. Empty: the cluster's name.",
    )

    role = forms.ChoiceField(
        choices=Cluster._meta.get_field("role").choices, required=False, label="How work reaches it",
        help_text="Standalone: the portal routes to it. A Kueue MultiKueue manager dispatches what the portal sends "
                  "there to its workers; a worker takes work from its manager only (docs/federation.md).",
    )
    manager_id = forms.TypedChoiceField(
        coerce=int, empty_value=None, required=False, label="MultiKueue manager",
        help_text="A worker's manager cluster (its MultiKueueCluster there carries this cluster's name).",
    )
    admission_check = forms.CharField(
        max_length=63, required=False, label="MultiKueue admission check",
        help_text="A manager's AdmissionCheck (controllerName kueue.x-k8s.io/multikueue) its ClusterQueues name. "
                  "Empty: multikueue.",
    )

    @classmethod
    def for_cluster(cls, cluster: Cluster, data: Any = None) -> ClusterSettingsForm:
        initial = {name: getattr(cluster, name) for name in cls.base_fields}
        initial["topology_levels"] = "\n".join(f"{lv.get('name', '')} {lv.get('label', '')}"
                                                for lv in cluster.topology_levels or () if isinstance(lv, dict))
        form = cls(data, initial=initial, prefix="settings")
        form.fields["manager_id"].choices = [("", "—")] + [  # type: ignore[attr-defined]
            (c.pk, c.name) for c in Cluster.objects.exclude(pk=cluster.pk).only("pk", "name").order_by("name")]
        return form

    def clean_role(self) -> str:
        return self.cleaned_data.get("role") or self.initial.get("role") or "standalone"  # not sent: unchanged

    def clean_topology_levels(self) -> list[dict[str, str]]:
        """"name label" lines -> [{"name", "label"}]; the service checks the names and label keys."""
        levels = []
        for n, line in enumerate((self.cleaned_data.get("topology_levels") or "").splitlines(), 1):
            parts = line.split()
            if not parts:
                continue
            if len(parts) != 2:
                raise forms.ValidationError(f"Line {n}: give a level's name and its node label key, separated by a "
                                            f"space (e.g. rack example.com/rack), not {line.strip()!r}.")
            levels.append({"name": parts[0], "label": parts[1]})
        return levels


class ArchitectureForm(forms.Form):
    architecture = forms.ChoiceField(choices=Architecture.choices, label="Reference architecture")


class FlavorForm(forms.Form):
    """Create or edit a flavor. On edit, cluster, name and kind are fixed (they name cluster objects)."""

    cluster = forms.ChoiceField()
    name = forms.CharField(max_length=63, help_text="Becomes the ResourceFlavor's name, e.g. h100-80gb.")
    display_name = forms.CharField(max_length=100, required=False, label="Display name")
    kind = forms.ChoiceField(choices=Flavor.Kind.choices)
    gpu_product = forms.CharField(max_length=100, required=False, label="GPU product", help_text="nvidia.com/gpu.product of the nodes.")
    gpu_model = forms.CharField(max_length=40, required=False, label="GPU model", help_text="Short key for the MIG profile table, e.g. a100-80gb.")
    mig_profile = forms.CharField(max_length=20, required=False, label="MIG profile", help_text="MIG flavors only, e.g. 1g.10gb.")
    hami_memory_mib = IntegerField(min_value=0, initial=0, label="HAMi memory per vGPU (MiB)", help_text="HAMi flavors only.")
    hami_cores_percent = IntegerField(min_value=0, initial=0, label="HAMi cores per vGPU (%)", help_text="HAMi flavors only.")
    pool_label = forms.ChoiceField(choices=[("", "Any pool"), ("online", "online"), ("offline", "offline")], required=False,
                                   label="Pool", help_text="Architecture F: the pool this flavor's nodes are in.")
    node_labels = JSONField(required=False, label="Node labels (JSON object)", widget=forms.Textarea(attrs={"rows": 3}),
                                  help_text='e.g. {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}')
    taints = JSONField(required=False, label="Taints (JSON list)", widget=forms.Textarea(attrs={"rows": 3}))
    tolerations = JSONField(required=False, label="Tolerations (JSON list)", widget=forms.Textarea(attrs={"rows": 3}))
    order = IntegerField(min_value=0, initial=100, help_text="Kueue tries flavors in this order.")

    FIXED = ("cluster", "name", "kind")

    def __init__(self, *args: Any, clusters: Iterable[Cluster] = (), flavor: Flavor | None = None, **kwargs: Any) -> None:
        kwargs.setdefault("prefix", "flavor")
        if flavor is not None and "initial" not in kwargs:
            kwargs["initial"] = {
                "cluster": flavor.cluster.name, "name": flavor.name, "display_name": flavor.display_name,
                "kind": flavor.kind, "gpu_product": flavor.gpu_product, "gpu_model": flavor.gpu_model,
                "mig_profile": flavor.mig_profile, "hami_memory_mib": flavor.hami_memory_mib,
                "hami_cores_percent": flavor.hami_cores_percent, "pool_label": flavor.pool_label,
                "node_labels": flavor.node_labels, "taints": flavor.taints, "tolerations": flavor.tolerations,
                "order": flavor.order,
            }
        super().__init__(*args, **kwargs)
        self.clusters = {c.name: c for c in clusters}
        self.fields["cluster"].choices = [(name, name) for name in self.clusters]
        self.flavor = flavor
        if flavor is not None:
            for name in self.FIXED:
                self.fields[name].disabled = True
                self.fields[name].help_text = "Fixed: it names cluster objects and quota rows."
            self.fields["cluster"].choices = [(flavor.cluster.name, flavor.cluster.name)]

    def clean_node_labels(self) -> dict[str, Any]:
        value = self.cleaned_data.get("node_labels") or {}
        if not isinstance(value, dict):
            raise forms.ValidationError("Give a JSON object of label key to value.")
        return value

    def _clean_list(self, name: str) -> list[Any]:
        value = self.cleaned_data.get(name) or []
        if not isinstance(value, list):
            raise forms.ValidationError("Give a JSON list.")
        return value

    def clean_taints(self) -> list[Any]:
        return self._clean_list("taints")

    def clean_tolerations(self) -> list[Any]:
        return self._clean_list("tolerations")

    def service_kwargs(self) -> dict[str, Any]:
        """What ``flavor_create`` (or, without the fixed fields, ``flavor_update``) takes."""
        data = dict(self.cleaned_data)
        data["pool_label"] = data.get("pool_label") or ""
        if self.flavor is not None:
            for name in self.FIXED:
                data.pop(name, None)
        else:
            data["cluster"] = self.clusters[data["cluster"]]
        return data


class WriteOnlyTextarea(forms.Textarea):
    """A secret's textarea: never shows a value back, not even the one just posted."""

    def format_value(self, value: Any) -> None:
        return None


class ClusterCreateForm(forms.Form):
    """Register a cluster. The kubeconfig is write-only: ``cluster_create`` checks and encrypts it."""

    name = forms.CharField(max_length=63, help_text="Lower-case letters, digits and '-'. Names the cluster on every page; cannot change.")
    architecture = forms.ChoiceField(choices=Architecture.choices, initial=Architecture.B, label="Reference architecture")
    use_mig = forms.BooleanField(required=False, label="Offer MIG flavors (C, E, F)")
    use_hami = forms.BooleanField(required=False, label="Offer HAMi flavors (D, E, F)")
    overcommit_percent = IntegerField(
        min_value=0, initial=0, label="Overcommit (%)",
        help_text="How far the tenants' nominal quotas may exceed capacity. 0: promises must fit.",
    )
    kubeconfig = forms.CharField(
        required=False, label="Kubeconfig", widget=WriteOnlyTextarea(attrs={"rows": 8, "spellcheck": "false", "autocomplete": "off"}),
        help_text="Paste the whole file. Stored encrypted and never shown again.",
    )
    kubeconfig_path = forms.CharField(
        max_length=500, required=False, label="Or: kubeconfig path",
        help_text="Absolute path of a kubeconfig file mounted into the portal.",
    )

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("prefix", "cluster")
        super().__init__(*args, **kwargs)

    def clean_name(self) -> str:
        name = self.cleaned_data["name"]
        if name == "new":  # /ops/clusters/new/ is this page
            raise forms.ValidationError("Choose another name: “new” is reserved.")
        return name

    def clean(self) -> dict[str, Any]:
        data = super().clean()
        if data.get("kubeconfig") and data.get("kubeconfig_path"):
            self.add_error("kubeconfig_path", "Give the kubeconfig or its path, not both.")
        return data
