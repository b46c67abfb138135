"""Throughput and memory benchmark of the sandbox cluster's HTTP API (a script, not a test).

    python tests/bench/sandbox_bench.py [--workloads 10000] [--apply 1000] [--updates 1000] [--gets 3000]

The server runs in a child process (``--serve`` mode of this script, controllers off so that only API work is
measured) with N Workloads seeded straight into its store; this process drives it through the official Python
client (and raw keep-alive HTTP for the GET rate). Printed: list throughput with pagination, simple GETs per
second (http and https), server-side apply rate, watch delivery through a burst of updates, and peak RSS of
the server process and of the client process.
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


# ----------------------------------------------------------------------------------------------------- client side
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
    args = ap.parse_args()
    if args.serve:
        return serve(args)

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
