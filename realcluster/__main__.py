"""``python -m realcluster``: build what is missing, start the real control plane on loopback with the demo's
nodes, write a kubeconfig, and stop cleanly on Ctrl-C / SIGTERM (``make cluster``).

    python -m realcluster [--kubeconfig var/realcluster.kubeconfig] [--state-dir var/realcluster]
                          [--profile sandbox/profiles/demo.yaml] [--no-kwok] [--build-only]
"""

from __future__ import annotations

import argparse
import shutil
import signal
import sys
import threading
import time
from pathlib import Path

import yaml

from . import controlplane, migmanager, nodes, volumes

ROOT = Path(__file__).resolve().parent.parent


def build_kwok(*, force: bool = False) -> float | None:
    target = controlplane.BIN / "kwok"
    mod = controlplane.HERE / "kwok"
    if not force and target.exists() and target.stat().st_mtime >= max((mod / "go.mod").stat().st_mtime,
                                                                       (mod / "go.sum").stat().st_mtime):
        return None
    started = time.monotonic()
    controlplane.go_build(target, "sigs.k8s.io/kwok/cmd/kwok", "-s -w", cwd=mod, inputs=[mod / "go.mod", mod / "go.sum"],
                          use_cache=not force)
    took = time.monotonic() - started
    controlplane.log(f"built kwok in {took:.0f} s")
    return took


def start_kwok(cp: controlplane.ControlPlane, profile: Path | None = None) -> None:
    config = cp.state_dir / "kwok.yaml"
    docs = [{"apiVersion": "config.kwok.x-k8s.io/v1alpha1", "kind": "KwokConfiguration",
             "options": {"manageNodesWithAnnotationSelector": f"{nodes.KWOK_ANNOTATION}=fake",
                         "nodeLeaseDurationSeconds": 40, "nodeLeaseParallelism": 4, "nodePlayStageParallelism": 4,
                         "podPlayStageParallelism": 8, "podsOnNodeSyncParallelism": 4}}] + nodes.kwok_stages()
    config.write_text(yaml.safe_dump_all(docs))
    cp._spawn("kwok", ["kwok", f"--kubeconfig={cp.kubeconfig}", f"--config={config}",
                       "--manage-all-nodes=false", f"--manage-nodes-with-annotation-selector={nodes.KWOK_ANNOTATION}=fake",
                       "--server-address=127.0.0.1:0"])

    def leases() -> bool:  # kwok holds every node's lease once it manages them
        status, body = cp._request("GET", "/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases")
        return status == 200 and len(body.get("items") or []) >= len(names)

    names = [n["metadata"]["name"] for n in nodes.profile_nodes(profile)]  # the nodes of the profile started with
    cp._wait(leases, "kwok to take the nodes' leases", 60)


def start(state_dir: Path, profile: Path | None, kwok: bool = True) -> controlplane.ControlPlane:
    cp = controlplane.ControlPlane(state_dir)
    cp.start()
    try:
        nodes.register(cp, nodes.profile_nodes(profile))
        cp.threads_stop.append(volumes.start_provisioner(cp))
        cp.threads_stop.append(migmanager.start_mig_manager(cp, profile))
        if kwok:
            start_kwok(cp, profile)
    except BaseException:
        cp.stop()
        raise
    return cp


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m realcluster", description=__doc__.split("\n\n")[0])
    ap.add_argument("--kubeconfig", default=str(ROOT / "var" / "realcluster.kubeconfig"))
    ap.add_argument("--state-dir", default=str(ROOT / "var" / "realcluster"))
    ap.add_argument("--profile", default=None)
    ap.add_argument("--no-kwok", action="store_true")
    ap.add_argument("--build-only", action="store_true")
    ap.add_argument("--force", action="store_true", help="build every binary again, not from the binary cache")
    args = ap.parse_args(argv)
    try:
        took = controlplane.build(force=args.force)
        if not args.no_kwok:
            k = build_kwok(force=args.force)
            if k is not None:
                took["kwok"] = k
    except RuntimeError as exc:
        print(f"realcluster: {exc}", file=sys.stderr)
        return 1
    if took:
        controlplane.log("build times: " + ", ".join(f"{n} {s:.0f} s" for n, s in took.items()))
    if args.build_only:
        return 0
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    try:
        cp = start(Path(args.state_dir), Path(args.profile) if args.profile else None, kwok=not args.no_kwok)
    except RuntimeError as exc:
        print(f"realcluster: {exc}", file=sys.stderr)
        return 1
    try:
        Path(args.kubeconfig).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(cp.kubeconfig, args.kubeconfig)
        Path(args.kubeconfig).chmod(0o600)
        print(f"realcluster: up at {cp.url}; kubectl --kubeconfig {args.kubeconfig} get nodes,clusterqueues -A; "
              "Ctrl-C stops it", flush=True)
        while not stop.wait(1):
            dead = cp.dead()
            if dead:
                print(f"realcluster: {', '.join(dead)} exited; see {cp.state_dir / 'logs'}", file=sys.stderr)
                return 1
        return 0
    finally:
        cp.stop()
        Path(args.kubeconfig).unlink(missing_ok=True)
        print("realcluster: stopped", flush=True)


if __name__ == "__main__":
    raise SystemExit(main())
