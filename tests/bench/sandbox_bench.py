"""Throughput and memory benchmark of the sandbox cluster's HTTP API (a script, not a test).

    python tests/bench/sandbox_bench.py [--section api|controllers|all] [--workloads 10000] [--apply 1000]
        [--updates 1000] [--gets 3000] [--cluster-queues 1000] [--jobs 2000] [--speed 600]

Section ``api``: the server runs in a child process (``--serve`` mode of this script, controllers off so that only
API work is measured) with N Workloads seeded straight into its store; this process drives it through the official
Python client (and raw keep-alive HTTP for the GET rate). Printed: list throughput with pagination, simple GETs per
second (http and https), server-side apply rate, watch delivery through a burst of updates, and peak RSS of
the server process and of the client process.

Section ``controllers`` ("controllers on"): a fresh child server with the demo profile and the controllers running
(``--speed``, default 600: a 60 s job lasts 0.1 s). Printed: time to server-side apply N ClusterQueues (cohorts of
10) while the controllers run, with the rate of the first and the last tenth (it must not degrade as the store
grows); then N Jobs (100m CPU, 60 s) submitted to one LocalQueue whose ClusterQueue admits 200 at a time: time to
create them and time until every Job is Complete, with the controllers' tick count.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import resource
import signal
import ssl
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from urllib.parse import urlsplit

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

NS = "bench"


def _workload(i: int) -> dict:
    return {
        "apiVersion": "kueue.x-k8s.io/v1beta2",
        "kind": "Workload",
        "metadata": {"name": f"wl-{i:05d}", "namespace": NS, "labels": {"bench": "yes", "shard": str(i % 10)}},
        "spec": {
            "queueName": "main",
            "podSets": [{"name": "main", "count": 1, "template": {"spec": {"containers": [
                {"name": "train", "image": "pytorch:latest",
                 "resources": {"requests": {"cpu": "4", "memory": "16Gi", "nvidia.com/gpu": "1"}}}]}}}],
        },
    }


def _peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0  # ru_maxrss is KiB on Linux


# ----------------------------------------------------------------------------------------------------- server side
def serve(args) -> int:
    from sandbox.app import Sandbox

    if args.with_controllers:
        return serve_controllers(args)
    sb = Sandbox(kubeconfig=args.kubeconfig, controllers=False)
    store = sb.store
    t0 = time.perf_counter()
    store.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}})
    for i in range(args.workloads):
        store.create(_workload(i), field_manager="bench-seed")
    seed_s = time.perf_counter() - t0
    sb.start()
    print(json.dumps({"url": sb.url, "http_url": sb.http_url, "token": sb.token, "seed_s": seed_s}), flush=True)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    while not stop.wait(0.2):
        pass
    sb.stop()
    print(json.dumps({"server_peak_rss_mb": _peak_rss_mb(), "requests": sb.server.requests_served}), flush=True)
    return 0


def serve_controllers(args) -> int:
    from sandbox.app import Sandbox

    sb = Sandbox(kubeconfig=args.kubeconfig, controllers=True, speed=args.speed)
    sb.start()
    print(json.dumps({"url": sb.url, "http_url": sb.http_url, "token": sb.token}), flush=True)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    while not stop.wait(0.2):
        pass
    ticks = sb.controllers.ticks
    skipped = getattr(sb.controllers, "skipped", None)
    errors = list(sb.controllers.errors)[-3:]
    sb.stop()
    print(json.dumps({"server_peak_rss_mb": _peak_rss_mb(), "requests": sb.server.requests_served, "ticks": ticks,
                      "skipped": skipped, "errors": errors}), flush=True)
    return 0


# ----------------------------------------------------------------------------------------------------- client side
def _start_server(args, tmp: Path, extra: list[str]) -> tuple[subprocess.Popen, dict, Path]:
    kc = tmp / "kubeconfig"
    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    proc = subprocess.Popen([sys.executable, __file__, "--serve", "--kubeconfig", str(kc), *extra],
                            stdout=subprocess.PIPE, text=True, env=env, cwd=str(REPO))
    return proc, json.loads(proc.stdout.readline()), kc


def bench_controllers(args) -> int:
    """The "controllers on" section: ClusterQueue apply rate and 2,000 queued Jobs run to completion."""
    from kubernetes import client, config

    tmp = Path(tempfile.mkdtemp(prefix="sandbox-bench-ctl-"))
    t0 = time.perf_counter()
    proc, info, kc = _start_server(args, tmp, ["--with-controllers", "--speed", str(args.speed)])
    print(f"[controllers on] server up in {time.perf_counter() - t0:.1f}s (demo profile, speed {args.speed:g})")
    try:
        api = config.new_client_from_config(config_file=str(kc))
        co = client.CustomObjectsApi(api)
        v1 = client.CoreV1Api(api)
        batch = client.BatchV1Api(api)
        grp, ver = "kueue.x-k8s.io", "v1beta2"
        co.patch_cluster_custom_object(grp, ver, "resourceflavors", "bench-flavor",
                                       {"apiVersion": f"{grp}/{ver}", "kind": "ResourceFlavor",
                                        "metadata": {"name": "bench-flavor"}, "spec": {}},
                                       field_manager="bench", force=True, _content_type="application/apply-patch+yaml")

        # 1. server-side apply of N ClusterQueues while the controllers run
        n = args.cluster_queues
        tenth = max(1, n // 10)
        marks = []
        t0 = time.perf_counter()
        for i in range(n):
            if i % tenth == 0:
                marks.append(time.perf_counter())
            body = {"apiVersion": f"{grp}/{ver}", "kind": "ClusterQueue", "metadata": {"name": f"cq-{i:04d}"},
                    "spec": {"cohortName": f"cohort-{i // 10:03d}", "namespaceSelector": {},
                             "resourceGroups": [{"coveredResources": ["cpu", "memory", "nvidia.com/gpu"], "flavors": [
                                 {"name": "bench-flavor", "resources": [
                                     {"name": "cpu", "nominalQuota": "32"}, {"name": "memory", "nominalQuota": "256Gi"},
                                     {"name": "nvidia.com/gpu", "nominalQuota": "4"}]}]}]}}
            co.patch_cluster_custom_object(grp, ver, "clusterqueues", body["metadata"]["name"], body,
                                           field_manager="bench", force=True,
                                           _content_type="application/apply-patch+yaml")
        marks.append(time.perf_counter())
        dt = marks[-1] - t0
        first = tenth / (marks[1] - marks[0])
        last = (n - tenth * (len(marks) - 2)) / (marks[-1] - marks[-2])
        print(f"[controllers on] server-side applied {n} ClusterQueues in {dt:.2f}s ({n / dt:,.0f}/s; "
              f"first tenth {first:,.0f}/s, last tenth {last:,.0f}/s)")
        deadline = time.time() + 60
        while time.time() < deadline:  # the controllers catch up: every ClusterQueue gets its Active condition
            cqs = co.list_cluster_custom_object(grp, ver, "clusterqueues")["items"]
            if sum(1 for q in cqs if (q.get("status") or {}).get("conditions")) >= n:
                break
            time.sleep(0.2)
        print(f"[controllers on] ... and every ClusterQueue had its status {time.perf_counter() - t0:.2f}s after the "
              f"first apply")

        # 2. N queued Jobs, 200 admitted at a time, run to completion
        ns = "bench-jobs"
        v1.create_namespace({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})
        co.create_cluster_custom_object(grp, ver, "clusterqueues", {
            "apiVersion": f"{grp}/{ver}", "kind": "ClusterQueue", "metadata": {"name": "bench-jobs"},
            "spec": {"namespaceSelector": {}, "resourceGroups": [{"coveredResources": ["cpu"], "flavors": [
                {"name": "bench-flavor", "resources": [{"name": "cpu", "nominalQuota": "20"}]}]}]}})
        co.create_namespaced_custom_object(grp, ver, ns, "localqueues", {
            "apiVersion": f"{grp}/{ver}", "kind": "LocalQueue", "metadata": {"name": "lq", "namespace": ns},
            "spec": {"clusterQueue": "bench-jobs"}})
        njobs = args.jobs
        t0 = time.perf_counter()
        for i in range(njobs):
            res = {"cpu": "100m"}
            batch.create_namespaced_job(ns, {
                "apiVersion": "batch/v1", "kind": "Job",
                "metadata": {"name": f"job-{i:05d}", "namespace": ns, "labels": {"kueue.x-k8s.io/queue-name": "lq"},
                             "annotations": {"sandbox.gpuportal.dev/duration": "60s"}},
                "spec": {"parallelism": 1, "completions": 1, "template": {"spec": {
                    "restartPolicy": "Never",
                    "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
                    "containers": [{"name": "main", "image": "registry.example/train:1",
                                    "resources": {"requests": res, "limits": res}}]}}}})
        t_create = time.perf_counter() - t0
        print(f"[controllers on] created {njobs} queued Jobs in {t_create:.2f}s ({njobs / t_create:,.0f}/s)")
        done = 0
        deadline = time.time() + args.timeout
        while time.time() < deadline:
            jobs = batch.list_namespaced_job(ns).items
            done = sum(1 for j in jobs if any(c.type == "Complete" and c.status == "True"
                                              for c in (j.status.conditions or [])))
            if done >= njobs:
                break
            time.sleep(0.5)
        t_all = time.perf_counter() - t0
        print(f"[controllers on] {done}/{njobs} Jobs admitted and Complete {t_all:.2f}s after the first create "
              f"({done / t_all:,.0f} Jobs/s end to end)" + ("" if done >= njobs else " (TIMED OUT)"))
    finally:
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=120)
    srv = json.loads(out.strip().splitlines()[-1])
    print(f"[controllers on] server: {srv['ticks']} ticks ({srv.get('skipped')} controller passes skipped), "
          f"{srv['requests']} requests, peak RSS {srv['server_peak_rss_mb']:.0f} MiB"
          + (f"; last controller errors: {srv['errors']}" if srv.get("errors") else ""))
    return 0

def _raw_get_rate(url: str, token: str, path: str, n: int, ca: str | None) -> float:
    u = urlsplit(url)
    if u.scheme == "https":
        conn = http.client.HTTPSConnection(u.hostname, u.port, context=ssl.create_default_context(cafile=ca))
    else:
        conn = http.client.HTTPConnection(u.hostname, u.port)
    headers = {"Authorization": f"Bearer {token}", "Accept": "application/json"}
    t0 = time.perf_counter()
    for _ in range(n):
        conn.request("GET", path, headers=headers)
        resp = conn.getresponse()
        resp.read()
        assert resp.status == 200, resp.status
    dt = time.perf_counter() - t0
    conn.close()
    return n / dt


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--kubeconfig", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--workloads", type=int, default=10000)
    ap.add_argument("--page", type=int, default=500)
    ap.add_argument("--apply", type=int, default=1000)
    ap.add_argument("--updates", type=int, default=1000)
    ap.add_argument("--gets", type=int, default=3000)
    ap.add_argument("--section", choices=("api", "controllers", "all"), default="all")
    ap.add_argument("--cluster-queues", type=int, default=1000)
    ap.add_argument("--jobs", type=int, default=2000)
    ap.add_argument("--speed", type=float, default=600.0, help="simulated seconds per real second (controllers on)")
    ap.add_argument("--timeout", type=float, default=600.0, help="seconds to wait for the Jobs to finish")
    ap.add_argument("--with-controllers", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.serve:
        return serve(args)
    if args.section == "controllers":
        return bench_controllers(args)
    rc = bench_api(args)
    if args.section == "all":
        rc = bench_controllers(args) or rc
    return rc


def bench_api(args) -> int:
    from kubernetes import client, config, watch

    tmp = Path(tempfile.mkdtemp(prefix="sandbox-bench-"))
    kc = tmp / "kubeconfig"
    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    t0 = time.perf_counter()
    proc = subprocess.Popen([sys.executable, __file__, "--serve", "--kubeconfig", str(kc), "--workloads", str(args.workloads)],
                            stdout=subprocess.PIPE, text=True, env=env, cwd=str(REPO))
    info = json.loads(proc.stdout.readline())
    print(f"server up in {time.perf_counter() - t0:.1f}s; seeded {args.workloads} Workloads into the store in {info['seed_s']:.1f}s")
    ca = tmp / "ca.pem"
    import base64

    import yaml

    cfg = yaml.safe_load(kc.read_text())
    ca.write_bytes(base64.b64decode(cfg["clusters"][0]["cluster"]["certificate-authority-data"]))
    results: dict[str, str] = {}
    try:
        api = config.new_client_from_config(config_file=str(kc))
        co = client.CustomObjectsApi(api)
        v1 = client.CoreV1Api(api)

        # 1. list 10,000 Workloads with pagination
        t0 = time.perf_counter()
        total, pages, token = 0, 0, None
        while True:
            page = co.list_namespaced_custom_object("kueue.x-k8s.io", "v1beta2", NS, "workloads", limit=args.page,
                                                    _continue=token)
            total += len(page["items"])
            pages += 1
            token = page["metadata"].get("continue")
            if not token:
                break
        dt = time.perf_counter() - t0
        assert total == args.workloads, total
        results["list"] = (f"listed {total} Workloads in {pages} pages of {args.page} in {dt:.2f}s "
                           f"({total / dt:,.0f} objects/s, {pages / dt:.1f} pages/s)")
        print(results["list"])

        # 2. simple GETs on one keep-alive connection
        path = f"/apis/kueue.x-k8s.io/v1beta2/namespaces/{NS}/workloads/wl-00000"
        rate_http = _raw_get_rate(info["http_url"], info["token"], path, args.gets, None)
        rate_https = _raw_get_rate(info["url"], info["token"], path, args.gets, str(ca))
        rate_small = _raw_get_rate(info["http_url"], info["token"], "/api/v1/namespaces/bench", args.gets, None)
        results["get"] = (f"simple GETs, one keep-alive connection: {rate_http:,.0f}/s (Workload, http), "
                          f"{rate_https:,.0f}/s (Workload, https), {rate_small:,.0f}/s (Namespace, http)")
        print(results["get"])

        # 3. server-side apply of 1,000 objects (ConfigMaps through the official client)
        t0 = time.perf_counter()
        for i in range(args.apply):
            body = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": f"cm-{i:04d}", "namespace": NS},
                    "data": {"index": str(i), "payload": "x" * 200}}
            v1.patch_namespaced_config_map(f"cm-{i:04d}", NS, body, field_manager="bench", force=True,
                                           _content_type="application/apply-patch+yaml")
        dt = time.perf_counter() - t0
        results["apply"] = f"server-side applied {args.apply} ConfigMaps in {dt:.2f}s ({args.apply / dt:,.0f} applies/s)"
        print(results["apply"])

        # 4. follow a watch through 1,000 updates
        rv = co.get_namespaced_custom_object("kueue.x-k8s.io", "v1beta2", NS, "workloads", "wl-00001")["metadata"]["resourceVersion"]
        received: list[str] = []
        done = threading.Event()

        def follow():
            api2 = config.new_client_from_config(config_file=str(kc))
            co2 = client.CustomObjectsApi(api2)
            w = watch.Watch()
            for ev in w.stream(co2.list_namespaced_custom_object, "kueue.x-k8s.io", "v1beta2", NS, "workloads",
                               resource_version=rv, field_selector="metadata.name=wl-00001", timeout_seconds=300):
                received.append(ev["object"]["metadata"]["labels"].get("step", ""))
                if len(received) >= args.updates:
                    w.stop()
            done.set()

        th = threading.Thread(target=follow, daemon=True)
        th.start()
        time.sleep(0.3)
        t0 = time.perf_counter()
        for i in range(args.updates):
            co.patch_namespaced_custom_object("kueue.x-k8s.io", "v1beta2", NS, "workloads", "wl-00001",
                                              {"metadata": {"labels": {"step": str(i)}}},
                                              _content_type="application/merge-patch+json")
        t_writes = time.perf_counter() - t0
        ok = done.wait(120)
        t_all = time.perf_counter() - t0
        in_order = received == [str(i) for i in range(args.updates)]
        results["watch"] = (f"watch followed {len(received)}/{args.updates} updates (in order: {in_order}); "
                            f"writes took {t_writes:.2f}s ({args.updates / t_writes:,.0f} patches/s), "
                            f"last event arrived {t_all:.2f}s after the first write" + ("" if ok else " (TIMED OUT)"))
        print(results["watch"])
    finally:
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=60)
    srv = json.loads(out.strip().splitlines()[-1])
    print(f"peak RSS: server process {srv['server_peak_rss_mb']:.0f} MiB (10k Workloads + {args.apply} ConfigMaps, "
          f"{srv['requests']} requests served); client process {_peak_rss_mb():.0f} MiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
