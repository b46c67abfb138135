"""Pod resource math shared by the controllers.

Resource lists are plain ``dict[str, Decimal]`` (resource name -> amount). Helpers:

* :func:`pod_requests` — what one pod asks for, as the scheduler and Kueue compute it: per resource the sum over
  containers (``requests``, falling back to ``limits`` when a request is missing — the apiserver's defaulting),
  the max with each init container, plus ``spec.overhead``.
* :func:`hami_container_requests` — HAMi's per-container view (number of vGPUs, memory MiB / percentage, cores %).
* arithmetic (:func:`add`, :func:`sub`, :func:`scale`), comparison (:func:`insufficient`) and formatting
  (:func:`fmt`, :func:`fmt_list`) helpers.
"""

from __future__ import annotations

from decimal import Decimal

try:  # the store helper's parser (exact Kubernetes grammar)
    from sandbox.quantity import format_quantity as _format_quantity
    from sandbox.quantity import parse_quantity as _parse_quantity
except ImportError:  # pragma: no cover - fallback when quantity.py is absent
    _format_quantity = None
    _parse_quantity = None

GPU = "nvidia.com/gpu"
MIG_PREFIX = "nvidia.com/mig-"
HAMI_MEM = "nvidia.com/gpumem"
HAMI_MEM_PCT = "nvidia.com/gpumem-percentage"
HAMI_CORES = "nvidia.com/gpucores"
HAMI_PRIORITY = "nvidia.com/priority"
# Resources that HAMi's scheduler extender handles itself: nodes do not advertise them, the kube-scheduler part
# ignores them, and they only fit on a HAMi node (tracked per physical device).
HAMI_RESOURCES = frozenset({HAMI_MEM, HAMI_MEM_PCT, HAMI_CORES, HAMI_PRIORITY})
BINARY_RESOURCES = ("memory", "ephemeral-storage", "storage")

_SUFFIX = {
    "Ki": Decimal(1024), "Mi": Decimal(1024) ** 2, "Gi": Decimal(1024) ** 3, "Ti": Decimal(1024) ** 4,
    "Pi": Decimal(1024) ** 5, "Ei": Decimal(1024) ** 6, "n": Decimal("1e-9"), "u": Decimal("1e-6"),
    "m": Decimal("1e-3"), "k": Decimal("1e3"), "M": Decimal("1e6"), "G": Decimal("1e9"), "T": Decimal("1e12"),
    "P": Decimal("1e15"), "E": Decimal("1e18"),
}


def q(value) -> Decimal:
    """Parse a quantity (``"500m"``, ``"2Gi"``, ``4``) to a Decimal. Bad input raises ValueError."""
    if value is None:
        return Decimal(0)
    if _parse_quantity is not None:
        return _parse_quantity(value)
    if isinstance(value, (int, Decimal)):  # pragma: no cover
        return Decimal(value)
    s = str(value).strip()  # pragma: no cover
    for suf in sorted(_SUFFIX, key=len, reverse=True):  # pragma: no cover
        if s.endswith(suf):
            return Decimal(s[: -len(suf)]) * _SUFFIX[suf]
    return Decimal(s)  # pragma: no cover


def fmt(name: str, value: Decimal) -> str:
    """Canonical quantity string; memory-like resources in binary units when exact (``"12Gi"``)."""
    value = Decimal(value)
    if _format_quantity is None:  # pragma: no cover
        return str(value.normalize()) if value == value.to_integral_value() else f"{int(value * 1000)}m"
    if any(name == r or name.endswith("/" + r) for r in BINARY_RESOURCES):
        return _format_quantity(value, "BinarySI")
    return _format_quantity(value, "DecimalSI")


def fmt_list(res: dict[str, Decimal]) -> dict[str, str]:
    return {k: fmt(k, v) for k, v in sorted(res.items())}


def parse_list(res: dict | None) -> dict[str, Decimal]:
    out: dict[str, Decimal] = {}
    for k, v in (res or {}).items():
        try:
            out[k] = q(v)
        except (ValueError, ArithmeticError):
            continue
    return out


def add(a: dict[str, Decimal], b: dict[str, Decimal]) -> dict[str, Decimal]:
    out = dict(a)
    for k, v in b.items():
        out[k] = out.get(k, Decimal(0)) + v
    return out


def sub(a: dict[str, Decimal], b: dict[str, Decimal]) -> dict[str, Decimal]:
    out = dict(a)
    for k, v in b.items():
        out[k] = out.get(k, Decimal(0)) - v
    return out


def scale(a: dict[str, Decimal], n: int | Decimal) -> dict[str, Decimal]:
    return {k: v * n for k, v in a.items()}


def nonzero(a: dict[str, Decimal]) -> dict[str, Decimal]:
    return {k: v for k, v in a.items() if v != 0}


def insufficient(req: dict[str, Decimal], free: dict[str, Decimal]) -> list[str]:
    """Names of the requested (non-zero) resources that ``free`` cannot cover, sorted."""
    return sorted(k for k, v in req.items() if v > 0 and free.get(k, Decimal(0)) < v)


def container_requests(c: dict) -> dict[str, Decimal]:
    """One container's effective requests: ``requests`` with missing entries defaulted from ``limits``."""
    res = c.get("resources") or {}
    out = parse_list(res.get("limits"))
    out.update(parse_list(res.get("requests")))
    return out


def pod_requests(spec: dict | None) -> dict[str, Decimal]:
    """Effective requests of one pod (containers summed, init containers maxed, overhead added). Zero entries dropped."""
    spec = spec or {}
    total: dict[str, Decimal] = {}
    for c in spec.get("containers") or []:
        total = add(total, container_requests(c))
    for c in spec.get("initContainers") or []:
        if c.get("restartPolicy") == "Always":  # sidecar: runs alongside the main containers
            total = add(total, container_requests(c))
            continue
        for k, v in container_requests(c).items():
            if v > total.get(k, Decimal(0)):
                total[k] = v
    total = add(total, parse_list(spec.get("overhead")))
    return nonzero(total)


def hami_container_requests(spec: dict | None) -> list[dict]:
    """HAMi's per-container GPU asks: ``[{"nums", "mem" (MiB or None), "mem_pct" (or None), "cores"}]``.

    Only containers that ask for a vGPU are returned. As HAMi's webhook does (``defaultGPUNum: 1``), a container
    that asks only for memory or cores gets one vGPU. A container with neither memory nor cores gets a whole card
    (memory 100 %, cores 100).
    """
    out = []
    for c in (spec or {}).get("containers") or []:
        r = container_requests(c)
        nums = int(r.get(GPU, 0))
        has_mem = HAMI_MEM in r or HAMI_MEM_PCT in r
        has_cores = HAMI_CORES in r
        if nums == 0 and (has_mem or has_cores):
            nums = 1
        if nums <= 0:
            continue
        mem = int(r[HAMI_MEM]) if HAMI_MEM in r else None
        mem_pct = int(r[HAMI_MEM_PCT]) if HAMI_MEM_PCT in r else None
        cores = int(r.get(HAMI_CORES, 0))
        if not has_mem and not has_cores:
            mem_pct, cores = 100, 100
        elif not has_mem:
            mem_pct = 100
        out.append({"name": c.get("name", ""), "nums": nums, "mem": mem, "mem_pct": mem_pct, "cores": cores})
    return out


def is_gpu_resource(name: str) -> bool:
    return name == GPU or name.startswith(MIG_PREFIX) or name in HAMI_RESOURCES
