"""A stand-in volume provisioner for the real control plane: no CSI driver runs here, so a claim would stay
Pending and the scheduler would refuse its pod ("pod has unbound immediate PersistentVolumeClaims").

Every two seconds, each Pending PersistentVolumeClaim without a volume gets a PersistentVolume of its size and
access modes (a ``hostPath`` under the state folder; kwok's pods never mount it), pre-bound to it through
``claimRef``; kube-controller-manager's persistent-volume binder then binds the two, as with a real provisioner.
"""

from __future__ import annotations

import contextlib
import threading


def provision_once(cp) -> int:
    status, body = cp._request("GET", "/api/v1/persistentvolumeclaims")
    if status != 200:
        return 0
    made = 0
    for pvc in body.get("items") or []:
        meta, spec = pvc["metadata"], pvc.get("spec") or {}
        if (pvc.get("status") or {}).get("phase") != "Pending" or spec.get("volumeName"):
            continue
        name = f"pv-{meta['uid']}"
        pv = {"apiVersion": "v1", "kind": "PersistentVolume",
              "metadata": {"name": name, "labels": {"realcluster.gpuportal.dev/provisioned": "true"}},
              "spec": {"capacity": {"storage": ((spec.get("resources") or {}).get("requests") or {}).get("storage", "1Gi")},
                       "accessModes": spec.get("accessModes") or ["ReadWriteOnce"],
                       "persistentVolumeReclaimPolicy": "Delete",
                       "storageClassName": spec.get("storageClassName") or "",
                       "volumeMode": spec.get("volumeMode") or "Filesystem",
                       "hostPath": {"path": str(cp.state_dir / "volumes" / meta["uid"])},
                       "claimRef": {"namespace": meta["namespace"], "name": meta["name"], "uid": meta["uid"]}}}
        status, _ = cp._request("POST", "/api/v1/persistentvolumes", pv)
        made += status == 201
    return made


def start_provisioner(cp, interval: float = 2.0) -> threading.Event:
    """Run :func:`provision_once` every ``interval`` seconds until the returned event is set."""
    stop = threading.Event()

    def loop() -> None:
        while not stop.wait(interval):
            with contextlib.suppress(OSError):
                provision_once(cp)

    threading.Thread(target=loop, name="realcluster-volumes", daemon=True).start()
    return stop
