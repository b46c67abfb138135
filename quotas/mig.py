"""The MIG profile table (docs/cluster-objects.md, "MIG profiles"): which slices each GPU model can be cut into.

Keys are the short model keys flavors use (``Flavor.gpu_model``); values map a profile name
(``<compute slices>g.<memory GB>gb``) to the most instances of that one profile per GPU. ``+me``
(with media engines, at most one per GPU) is written ``.me`` here, the spelling of mig-parted's
config names (``all-1g.10gb.me``), because ``+`` is not allowed in a Kubernetes resource name.
"""

from __future__ import annotations

from portal.exceptions import Invalid

_A100_80GB = {"1g.10gb": 7, "1g.10gb.me": 1, "1g.20gb": 4, "2g.20gb": 3, "3g.40gb": 2, "4g.40gb": 1, "7g.80gb": 1}

MIG_PROFILES: dict[str, dict[str, int]] = {
    "a30-24gb": {"1g.6gb": 4, "1g.6gb.me": 1, "2g.12gb": 2, "2g.12gb.me": 1, "4g.24gb": 1},
    "a100-40gb": {"1g.5gb": 7, "1g.5gb.me": 1, "1g.10gb": 4, "2g.10gb": 3, "3g.20gb": 2, "4g.20gb": 1, "7g.40gb": 1},
    "a100-80gb": dict(_A100_80GB),
    # Same names and counts as the A100-80GB (4g.40gb from the operator's generic section).
    "h100-80gb": dict(_A100_80GB),
    "h200-141gb": {"1g.18gb": 7, "1g.18gb.me": 1, "1g.35gb": 4, "2g.35gb": 3, "3g.71gb": 2, "4g.71gb": 1, "7g.141gb": 1},
    # Only 1g.23gb (and its .me) is confirmed per GPU; the rest appear in the operator's config under
    # generic headings and match the B200's balanced layout (docs/cluster-objects.md, "MIG profiles").
    "b200": {"1g.23gb": 7, "1g.23gb.me": 1, "1g.45gb": 4, "2g.45gb": 3, "3g.90gb": 2, "4g.90gb": 1, "7g.180gb": 1},
}

UNCONFIRMED: dict[str, set[str]] = {"b200": {"1g.45gb", "2g.45gb", "3g.90gb", "4g.90gb", "7g.180gb"}}


def canonical_profile(profile: str) -> str:
    """``1g.10gb+me`` and ``1g.10gb.me`` are the same profile; we store the second."""
    profile = profile.strip().lower()
    return profile[:-3] + ".me" if profile.endswith("+me") else profile


def mig_profiles_for(model: str) -> dict[str, int]:
    return MIG_PROFILES.get(model.strip().lower(), {})


def validate_mig_profile(model: str, profile: str) -> str:
    """Return the canonical profile name, or raise ``Invalid`` naming what the GPU model allows."""
    key = (model or "").strip().lower()
    if key not in MIG_PROFILES:
        known = ", ".join(sorted(MIG_PROFILES))
        raise Invalid(f"No MIG profile table for GPU model {model!r}; known models: {known}.", field="gpu_model")
    name = canonical_profile(profile or "")
    if not name:
        raise Invalid(f"A MIG flavor needs a profile; {key} allows {', '.join(MIG_PROFILES[key])}.", field="mig_profile")
    if name not in MIG_PROFILES[key]:
        raise Invalid(
            f"MIG profile {profile!r} does not exist on {key}; it allows {', '.join(MIG_PROFILES[key])}.",
            field="mig_profile",
        )
    return name
