"""The template kinds' registry: what a kind declares (:class:`Kind`) and the table of registered kinds.

Kept apart from the package's ``__init__`` (which discovers the kind modules) so that a kind module imports the
registry and the building blocks of ``workloads/manifests.py``, and nothing imports back: no import cycle, counting
the discovery.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover
    from ..manifests import Manifest, Target
    from ..models import WorkloadRequest

# What a user (or ops) may do to a request of any kind; a kind adds to it (e.g. ``scale``).
BASE_ACTIONS = frozenset({"cancel", "stop", "restart", "extend", "delete"})
# The top-level objects the status follower knows how to summarise (workloads/status.py:FOLLOWED).
FOLLOWABLE = frozenset({"job", "vcjob", "deployment", "statefulset"})


@dataclass(frozen=True)
class RenderOptions:
    notebook_token: str = ""
    job_ttl_seconds: int | None = None
    # Serving kinds: the domain their routes live under (empty: no route), the ingress class, and the portal's own
    # address (the route's forward-auth check is ``<portal_url>/inference/auth/<request id>/``).
    inference_domain: str = ""
    ingress_class: str = ""
    portal_url: str = ""
    # Where the cluster serves them (discovered by the materializer, portal/kube.py ``Kube.serves``): the route is a
    # Gateway API HTTPRoute attached to ``gateway`` ("namespace/name"), its forward auth the portal's Service
    # ``auth_service`` ("namespace/name:port"), instead of an Ingress; the autoscaler a KEDA ScaledObject whose
    # Prometheus trigger asks ``prometheus_url``, instead of an HPA.
    gateway_api: bool = False
    gateway: str = ""
    auth_service: str = ""
    keda: bool = False
    prometheus_url: str = ""

    def inference_auth_url(self, request_id: int) -> str:
        return f"{self.portal_url.rstrip('/')}/inference/auth/{int(request_id)}/"


@dataclass(frozen=True)
class TemplateDefaults:
    """The catalogue's default template of a kind (``workloads/catalogue.py:seed_catalogue``)."""

    slug: str
    name: str
    description: str
    default_gpus: int = 1
    max_gpus: int = 8
    max_duration_hours: int = 72
    idle_timeout_minutes: int | None = None
    default_cpu: int = 4
    max_cpu: int = 64
    default_memory_gib: int = 32
    max_memory_gib: int = 512


# derive(objects, admitted, running) -> (state, reason) or None: the kind's reading of its top-level object.
Derive = Callable[[dict[str, dict[str, Any]], bool, int], "tuple[str, str] | None"]


@dataclass(frozen=True)
class Kind:
    name: str  # the TemplateKind value (at most 10 characters)
    label: str  # the TemplateKind label
    render: Callable[[WorkloadRequest, Target, RenderOptions], list[Manifest]]
    schema: dict[str, Any]  # the default template's parameter JSON Schema
    defaults: TemplateDefaults
    default_priority: str  # Priority value when the request names none
    follows: tuple[str, ...]  # top-level objects (FOLLOWABLE keys) whose status the follower reads
    derive: Derive | None = None  # kind-specific state from those objects (None: the generic Job/Workload rule)
    actions: frozenset[str] = BASE_ACTIONS
    replicas: str = "free"  # "one" (always 1), "workers" (parameters.workers when distributed) or "free"
    pod_group: int = 1000  # the pods' runAsGroup/fsGroup
    interactive: bool = False  # has an access token, a home volume, is culled when idle
    needs_admin_rule: bool = False  # ApprovalRule.require_admin_for_inference applies to it
    gone_message: str = "Its objects are gone from the cluster (deleted outside the portal)."
    order: int = 100  # position in the catalogue and in TemplateKind's choices
    # What the other apps ask of a kind instead of naming one:
    gang: bool = False  # gang-scheduled: on a Volcano-owned pool (architecture E) it runs as a Volcano Job
    serving: bool = False  # a long-running server: under an architecture with an online pool (F) it goes there
    proxied: bool = False  # opened in the browser through the portal's proxy (``/notebooks/<id>/``)
    # Volumes it keeps besides its pods' GPUs, CPU and memory, in GiB from the parameters (billed as storage).
    extra_volumes_gib: Callable[[dict[str, Any]], int] | None = None
    stop_note: str = ""  # what the stop confirmation adds (e.g. "the home volume stays")
    # Curated images the catalogue seeds for it: (name, reference, description); one image may serve several kinds.
    images: tuple[tuple[str, str, str], ...] = ()
    # Its requests always run at ``default_priority`` (inference: the online class): another one is refused.
    priority_fixed: bool = False
    # size_check(schema, parameters, replicas) -> [(field, message)]: what a submission's or a scale's size may not
    # be for this kind beyond the generic limits (inference: the minimum above the maximum, the template's bounds).
    size_check: Callable[[dict[str, Any], dict[str, Any], int], list[tuple[str, str]]] | None = None

    def allows(self, action: str) -> bool:
        return action in self.actions

    @property
    def scalable(self) -> bool:
        """Its replicas may be changed while it runs (the ``scale`` action, scale requests)."""
        return self.allows("scale")

    def billed_pods(self, replicas: int | None, parameters: dict[str, Any] | None) -> int:
        """How many pods a request of this kind holds (what billing prices): ``workers`` when it is distributed."""
        parameters = parameters or {}
        if self.replicas == "workers" and parameters.get("distributed"):
            return int(parameters.get("workers") or replicas or 1)
        return 1 if self.replicas == "one" else int(replicas or 1)

    def storage_gib(self, parameters: dict[str, Any] | None) -> int:
        """GiB of the extra volumes a request keeps (0: none)."""
        return int(self.extra_volumes_gib(parameters or {})) if self.extra_volumes_gib else 0


KINDS: dict[str, Kind] = {}


def register(kind: Kind) -> Kind:
    if len(kind.name) > 10:
        raise ValueError(f"Kind name {kind.name!r} is longer than the 10 characters TemplateKind stores.")
    unknown = set(kind.follows) - FOLLOWABLE
    if unknown:
        raise ValueError(f"Kind {kind.name!r} follows {sorted(unknown)}; the status follower knows {sorted(FOLLOWABLE)}.")
    KINDS[kind.name] = kind
    ordered = sorted(KINDS.values(), key=lambda k: k.order)  # stable: equal orders keep registration order
    KINDS.clear()
    KINDS.update({k.name: k for k in ordered})
    return kind


def get(name: str) -> Kind:
    try:
        return KINDS[str(name)]
    except KeyError:
        raise ValueError(f"Unknown template kind {name!r}.") from None


def names() -> list[str]:
    return list(KINDS)


def choices() -> list[tuple[str, str]]:
    return [(k.name, k.label) for k in KINDS.values()]


def allows(kind: str, action: str) -> bool:
    """May a request of template ``kind`` take ``action`` (stop, restart, extend, scale, ...)?"""
    return get(kind).allows(action)


def where(**traits: Any) -> list[str]:
    """The names of the kinds with these attribute values, e.g. ``where(gang=True)`` (a queryset's ``kind__in``)."""
    return [k.name for k in KINDS.values() if all(getattr(k, a) == v for a, v in traits.items())]


def top_level_keys() -> tuple[str, ...]:
    """Every top-level object key any kind follows (the follower's "are its objects still there" check)."""
    out: list[str] = []
    for kind in KINDS.values():
        out += [k for k in kind.follows if k not in out]
    return tuple(out)


@contextmanager
def registered(kind: Kind) -> Iterator[Kind]:
    """Register ``kind`` for the duration of the block (tests: a new kind as data), then restore the registry."""
    before = dict(KINDS)
    register(kind)
    try:
        yield kind
    finally:
        KINDS.clear()
        KINDS.update(before)
