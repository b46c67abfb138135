"""The reference architectures A–F, as data. The one place that knows what a letter means.

Everything that behaves differently per architecture asks this registry instead of comparing letters:
the quota renderer (``quotas/manifests.py``), the request renderer (``workloads/manifests.py``), the
enforcement rule (``quotas/capacity.py:flavor_enforcement`` and its query twin
``quotas/selectors.py:enforced_flavor_q``), the services' checks and the ``Architecture`` choices of
``quotas/models.py``. Adding an architecture G is one :class:`Arch` entry in :data:`ARCHITECTURES` (plus its
tests, and the migration Django writes for the new choice). docs/extending.md ("Reference architectures") explains each entry.

What an entry says:

* ``queues`` — the Kueue queue layout: ``SHARED`` (one ClusterQueue ``shared`` for every namespace, no
  cohort), ``COHORT`` (a Cohort per tenant, a ClusterQueue per project) or ``POOLS`` (COHORT with an
  offline and an online ClusterQueue per project and explicit lending from offline to online).
* ``mig`` / ``hami`` — whether the pools get MIG / HAMi flavors: ``NEVER``, ``ALWAYS`` or ``SWITCH`` (as the
  cluster's ``use_mig`` / ``use_hami`` say). Whole-GPU and CPU flavors exist everywhere.
* ``volcano_pool`` — the node pool whose whole-GPU flavors Volcano owns instead of Kueue (empty: none);
  gang-scheduled template kinds run there as Volcano Jobs (a kind says it is one: ``Kind.gang``, workloads/kinds/).
* ``online_pool`` — the pool kept for serving kinds (``Kind.serving``: they get the ``<project>-online``
  LocalQueue and are pinned to that pool); empty: no online/offline split.
* ``cohorts`` (derived) — whether quotas may set borrowing and lending limits.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

SHARED, COHORT, POOLS = "shared", "cohort", "pools"
NEVER, ALWAYS, SWITCH = "never", "always", "switch"
WHOLE, MIG, HAMI, CPU = "whole", "mig", "hami", "cpu"  # Flavor.Kind values


@dataclass(frozen=True)
class Arch:
    letter: str
    label: str
    queues: str = COHORT
    mig: str = NEVER
    hami: str = NEVER
    volcano_pool: str = ""  # the pool Volcano owns: gang-scheduled kinds run there (``Kind.gang``, workloads/kinds/)
    online_pool: str = ""  # the pool kept for long-running servers (``Kind.serving``)

    @property
    def cohorts(self) -> bool:
        """Quotas may borrow and lend (there is a cohort to do it in)."""
        return self.queues != SHARED

    @property
    def shared_queue(self) -> bool:
        return self.queues == SHARED

    @property
    def switchable(self) -> bool:
        """MIG or HAMi is switched per cluster rather than fixed by the letter."""
        return SWITCH in (self.mig, self.hami)

    def may_use(self, kind: str) -> bool:
        """May this architecture ever offer flavors of ``kind`` (whole | mig | hami | cpu)?"""
        if kind == MIG:
            return self.mig != NEVER
        if kind == HAMI:
            return self.hami != NEVER
        return True

    def offers(self, kind: str, *, use_mig: bool = False, use_hami: bool = False) -> bool:
        """Does a cluster of this architecture (with these switches) materialize flavors of ``kind``?"""
        mode, switch = {MIG: (self.mig, use_mig), HAMI: (self.hami, use_hami)}.get(kind, (ALWAYS, True))
        return mode == ALWAYS or (mode == SWITCH and switch)

    def offered_kinds(self, *, use_mig: bool = False, use_hami: bool = False) -> set[str]:
        return {k for k in (WHOLE, CPU, MIG, HAMI) if self.offers(k, use_mig=use_mig, use_hami=use_hami)}

    def online_for(self, *, serving: bool) -> bool:
        """Does a request go to the online pool (and its ``-online`` queue)? Those of a serving kind do, where the
        architecture keeps an online pool (the kind says whether it serves: ``Kind.serving`` in workloads/kinds/)."""
        return bool(self.online_pool) and serving


ARCHITECTURES: dict[str, Arch] = {a.letter: a for a in (
    Arch("A", "A · one queue for everyone, whole GPUs", queues=SHARED),
    Arch("B", "B · cohort per tenant, ClusterQueue per project, whole GPUs"),
    Arch("C", "C · B plus MIG flavors", mig=ALWAYS),
    Arch("D", "D · B plus HAMi shared vGPU flavors", hami=ALWAYS),
    Arch("E", "E · B/C/D plus Volcano queues for gang-scheduled training", mig=SWITCH, hami=SWITCH, volcano_pool="offline"),
    Arch("F", "F · separate online (inference) and offline (training) pools", queues=POOLS, mig=SWITCH, hami=SWITCH,
         online_pool="online"),
)}


def get(letter: str) -> Arch:
    """The entry for ``letter``; ``KeyError`` names the known letters."""
    try:
        return ARCHITECTURES[str(letter)]
    except KeyError:
        raise KeyError(f"Unknown architecture {letter!r}; known: {', '.join(ARCHITECTURES)}.") from None


def of(cluster: object) -> Arch:
    """The entry for anything with an ``architecture`` attribute (a Cluster, a ClusterRow, a Target)."""
    return get(cluster.architecture)


def letters() -> list[str]:
    return list(ARCHITECTURES)


def choices() -> list[tuple[str, str]]:
    return [(a.letter, a.label) for a in ARCHITECTURES.values()]


def where(predicate) -> list[str]:
    """The letters whose entry satisfies ``predicate`` (for building database filters)."""
    return [a.letter for a in ARCHITECTURES.values() if predicate(a)]


def names(letters_: list[str]) -> str:
    """``["C", "E", "F"]`` → ``"C, E and F"``."""
    return letters_[0] if len(letters_) == 1 else f"{', '.join(letters_[:-1])} and {letters_[-1]}"


def queue_mismatch(manager: object, worker: object) -> list[tuple[str, str]]:
    """How a Kueue MultiKueue worker's queues would differ from its manager's (both have ``architecture``,
    ``use_mig``, ``use_hami``): MultiKueue dispatches a workload by the manager's LocalQueue and ClusterQueue names and
    flavors, so the worker needs the same architecture and, where it switches MIG or HAMi flavors, the same switches.
    ``[(setting, "its value here, the manager's there")]``; empty when they match."""
    ours, theirs = str(worker.architecture), str(manager.architecture)
    if ours != theirs:
        return [("architecture", f"architecture {ours}, not {theirs}")]
    arch = get(theirs)
    out = []
    for setting, mode, words in (("use_mig", arch.mig, "MIG"), ("use_hami", arch.hami, "HAMi")):
        if mode == SWITCH and bool(getattr(worker, setting)) != bool(getattr(manager, setting)):
            state = "on" if getattr(worker, setting) else "off"
            out.append((setting, f"{words} flavors {state}, not {'off' if state == 'on' else 'on'}"))
    return out


@contextmanager
def registered(arch: Arch) -> Iterator[Arch]:
    """Register ``arch`` for the duration of the block (tests: a new architecture as data), then restore."""
    before = dict(ARCHITECTURES)
    ARCHITECTURES[arch.letter] = arch
    try:
        yield arch
    finally:
        ARCHITECTURES.clear()
        ARCHITECTURES.update(before)
