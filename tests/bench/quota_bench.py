"""Materialization benchmark (a script, not a test): 200 tenants x 5 projects x 4 flavors.

    python tests/bench/quota_bench.py [--tenants 200] [--projects 5] [--architecture C] [--no-controllers]

Runs the sandbox cluster in a child process (``python -m sandbox``, demo profile, controllers on unless
``--no-controllers``) and the portal in this one, on a throw-away SQLite database (or ``DATABASE_URL``).
Prints, for the apply from scratch and for the no-op reconcile after it: wall time, cluster calls by
verb and database queries. The no-op must write nothing to the cluster and use one list call per kind.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from collections import Counter
from decimal import Decimal
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))


def start_sandbox(workdir: Path, controllers: bool) -> tuple[subprocess.Popen, Path]:
    kubeconfig = workdir / "kubeconfig"
    if controllers:
        cmd = [sys.executable, "-m", "sandbox", "--kubeconfig", str(kubeconfig)]
    else:
        code = ("import sys, threading; from sandbox.app import Sandbox; "
                "sb = Sandbox(kubeconfig=sys.argv[1], controllers=False); sb.start(); threading.Event().wait()")
        cmd = [sys.executable, "-c", code, str(kubeconfig)]
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.time() + 60
    while not kubeconfig.exists():
        if proc.poll() is not None or time.time() > deadline:
            raise SystemExit(f"the sandbox did not start: {proc.stderr.read().decode() if proc.stderr else ''}")
        time.sleep(0.1)
    return proc, kubeconfig


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tenants", type=int, default=200)
    parser.add_argument("--projects", type=int, default=5, help="projects per tenant")
    parser.add_argument("--architecture", default="C", choices=list("ABCDEF"))
    parser.add_argument("--no-controllers", action="store_true", help="sandbox API only (no Kueue simulation)")
    args = parser.parse_args(argv)

    workdir = Path(tempfile.mkdtemp(prefix="quota-bench-"))
    os.environ.setdefault("PORTAL_VAR_DIR", str(workdir / "var"))
    os.environ.setdefault("DATABASE_URL", f"sqlite:///{workdir / 'bench.sqlite3'}")
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "portal.settings")
    import django

    django.setup()
    from django.core.management import call_command
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from portal.kube import Kube
    from quotas import manifests as m
    from quotas.models import Cluster, Flavor, Quota
    from quotas.reconcile import reconcile
    from tenants.models import Project, Tenant

    call_command("migrate", verbosity=0)
    proc, kubeconfig = start_sandbox(workdir, controllers=not args.no_controllers)
    try:
        cluster = Cluster.objects.create(name="bench", architecture=args.architecture, use_mig=True, use_hami=True,
                                         kubeconfig_path=str(kubeconfig))
        gpu_taint = [{"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}]
        gpu_tol = [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
        flavors = Flavor.objects.bulk_create([
            Flavor(cluster=cluster, name="h100-80gb", kind="whole", order=10, taints=gpu_taint, tolerations=gpu_tol,
                   node_labels={"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}),
            Flavor(cluster=cluster, name="a100-80gb-mig-1g.10gb", kind="mig", mig_profile="1g.10gb", order=20,
                   taints=gpu_taint, tolerations=gpu_tol, node_labels={"nvidia.com/mig.strategy": "mixed"}),
            Flavor(cluster=cluster, name="a100-80gb-mig-3g.40gb", kind="mig", mig_profile="3g.40gb", order=21,
                   taints=gpu_taint, tolerations=gpu_tol, node_labels={"nvidia.com/mig.strategy": "mixed"}),
            Flavor(cluster=cluster, name="cpu", kind="cpu", order=90),
        ])
        tenants = Tenant.objects.bulk_create([Tenant(name=f"Bench {i:03d}", slug=f"t{i:03d}") for i in range(args.tenants)])
        projects = Project.objects.bulk_create([
            Project(tenant=t, name=f"p{j}", slug=f"{t.slug}-p{j}") for t in tenants for j in range(args.projects)
        ])
        rows = []
        for t in tenants:
            for f in flavors:
                for r in f.resource_names:
                    rows.append(Quota(tenant=t, flavor=f, resource=r, nominal=Decimal(8 * args.projects)))
        for p in projects:
            for f in flavors:
                for r in f.resource_names:
                    rows.append(Quota(tenant=p.tenant, project=p, flavor=f, resource=r, nominal=Decimal(6), borrowing_limit=Decimal(2)))
        Quota.objects.bulk_create(rows, batch_size=2000)
        print(f"fixture: {len(tenants)} tenants x {args.projects} projects x {len(flavors)} flavors "
              f"({len(rows)} quota rows), architecture {args.architecture}, "
              f"sandbox controllers {'off' if args.no_controllers else 'on'}")

        def run(label: str) -> tuple[Counter, object]:
            kube = Kube(kubeconfig_path=str(kubeconfig))
            with CaptureQueriesContext(connection) as queries:
                started = time.perf_counter()
                result = reconcile(Cluster.objects.get(pk=cluster.pk), kube=kube)
                wall = time.perf_counter() - started
            calls = Counter(kube.calls)
            total = sum(calls.values())
            print(f"{label:<22} wall {wall:7.2f} s   cluster calls {total:5d} {dict(sorted(calls.items()))}   "
                  f"db queries {len(queries)}   applied {result.applied} deleted {result.deleted} failed {len(result.failed)}")
            return calls, result

        first, result = run("apply from scratch")
        objects = result.applied
        noop, again = run("no-op reconcile")
        print(f"objects: {objects} ({objects / max(1, args.tenants):.0f} per tenant)")
        ok = (not result.failed and again.applied == 0 and again.deleted == 0 and noop["apply"] == 0
              and noop["delete"] == 0 and noop["get"] == 0 and noop["list"] <= len(m.KIND_ORDER) * (1 + objects // 500))
        print("no-op check:", "OK (no writes, list calls bounded by kinds and pages)" if ok else "FAILED")
        return 0 if ok else 1
    finally:
        proc.terminate()
        proc.wait(timeout=30)


if __name__ == "__main__":
    sys.exit(main())
