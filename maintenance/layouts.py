"""The MIG layouts a node pool may be switched to, by GPU model (docs/mig-changes.md, "Layouts").

The names are the NVIDIA MIG manager's (mig-parted) default config names, the value the label
``nvidia.com/mig.config`` takes:

* ``all-disabled``: MIG off, every GPU whole (``nvidia.com/gpu``);
* ``all-balanced``: every GPU cut into the operator's balanced mix for its model;
* ``all-<profile>`` (``all-1g.10gb``, ``all-3g.40gb``, ``all-1g.10gb.me``): every GPU cut into as many
  instances of one profile as fit (the counts of ``quotas/mig.py``'s profile table).

``all-enabled`` (MIG on, no instances) is left out on purpose: it offers nothing to schedule on. A
cluster's own custom mig-parted configs are not offered either: the portal could not show their capacity.
The sandbox's MIG manager accepts the same names (``tests/maintenance/test_layouts.py`` keeps them in step).
Pure data and functions: no queries.
"""

from __future__ import annotations

from portal.exceptions import Invalid
from quotas.mig import MIG_PROFILES

GPU = "nvidia.com/gpu"
MIG_PREFIX = "nvidia.com/mig-"
DISABLED = "all-disabled"
BALANCED = "all-balanced"

# The operator's "all-balanced" layout per GPU, by model key (``Flavor.gpu_model`` / ``inventory.model_key``).
BALANCED_MIX: dict[str, dict[str, int]] = {
    "a30-24gb": {"1g.6gb": 2, "2g.12gb": 1},
    "a100-40gb": {"1g.5gb": 2, "2g.10gb": 1, "3g.20gb": 1},
    "a100-80gb": {"1g.10gb": 2, "2g.20gb": 1, "3g.40gb": 1},
    "h100-80gb": {"1g.10gb": 2, "2g.20gb": 1, "3g.40gb": 1},
    "h200-141gb": {"1g.18gb": 2, "2g.35gb": 1, "3g.71gb": 1},
    "b200": {"1g.23gb": 2, "2g.45gb": 1, "3g.90gb": 1},
}


def layouts_for(model: str) -> dict[str, dict[str, int]]:
    """Layout name -> MIG instances per GPU (``{}`` for ``all-disabled``: whole GPUs), for a GPU model;
    empty when the model is not MIG capable."""
    key = (model or "").strip().lower()
    profiles = MIG_PROFILES.get(key)
    if not profiles:
        return {}
    out: dict[str, dict[str, int]] = {DISABLED: {}, BALANCED: dict(BALANCED_MIX.get(key, {}))}
    if not out[BALANCED]:
        del out[BALANCED]
    for profile, count in profiles.items():
        out[f"all-{profile}"] = {profile: count}
    return out


def layout_names(model: str) -> list[str]:
    return list(layouts_for(model))


def validate_layout(model: str, name: str, *, field: str = "to_layout") -> str:
    """The layout name as stored, or ``Invalid`` naming the layouts the model allows."""
    layouts = layouts_for(model)
    if not layouts:
        raise Invalid(f"GPU model {model or '(unknown)'!r} has no MIG layouts: its pool cannot be repartitioned.",
                      field=field)
    value = (name or "").strip().lower()
    if value not in layouts:
        raise Invalid(f"{name!r} is not a MIG layout of {model}; choose one of {', '.join(layouts)}.", field=field)
    return value


def layout_resources(model: str, name: str, gpus: int) -> dict[str, int]:
    """What one node with ``gpus`` GPUs of ``model`` advertises under layout ``name`` (GPU resources only):
    ``{"nvidia.com/mig-1g.10gb": 56}``, or ``{"nvidia.com/gpu": 8}`` for ``all-disabled``. Empty for an
    unknown layout."""
    layouts = layouts_for(model)
    if name not in layouts:
        return {}
    if name == DISABLED:
        return {GPU: gpus}
    return {MIG_PREFIX + profile: count * gpus for profile, count in layouts[name].items()}
