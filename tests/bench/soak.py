"""Soak: run the stack as `make run` does and lean on it for N minutes; print figures; fail on trouble.

    .venv/bin/python tests/bench/soak.py --minutes 20            # embedded defaults (SQLite, SQLite broker)
    DATABASE_URL=postgres://postgres@127.0.0.1:5432/soak1 REDIS_URL=redis://127.0.0.1:6379/3 \\
        .venv/bin/python tests/bench/soak.py --minutes 20         # a fresh PostgreSQL database, Redis

It starts deploy/devstack.py (migrate, demo seed, sandbox cluster, worker, beat, web server) on free
ports with its own runtime folder, then, for the duration:

- beat runs its schedule and the demo requests live their lives (devstack seeds them);
- a trickle of API submissions: a one-GPU, one-hour training job every --interval seconds with a project
  token of carol's (acme-vision, read+submit), each with its own Idempotency-Key;
- a browser (Playwright driving /usr/bin/chromium) signed in as carol reloads /requests/ and a request's
  detail page.

Then it waits (--settle seconds at most) for every submitted request to leave submitted/approved and checks
each one: its state through the API, and in the sandbox cluster exactly one Job and one Kueue Workload
(through var/sandbox.kubeconfig). Figures: worker crashes/restarts (devstack's notices), submissions,
requests lost or duplicated, HTTP 5xx, p50/p95 latency of the API and of the pages. Exit status 1 when
anything crashed, was lost or duplicated, or answered 5xx.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

import requests

ROOT = Path(__file__).resolve().parents[2]
CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
                 "--disable-sync"]
REQUEST_LABEL = "gpuportal.dev/request"
KUEUE = ("kueue.x-k8s.io", "v1beta2", "workloads")
WAITING = {"submitted", "approved"}
# The runtime environment of the parent never leaks into the stack (a test run's settings, its worker id).
DROP = {"PYTEST_XDIST_WORKER", "PYTEST_CURRENT_TEST", "PORTAL_KUBECONFIG", "DJANGO_SETTINGS_MODULE",
        "CELERY_TASK_ALWAYS_EAGER", "PORTAL_TEST_RUN_ID", "PORTAL_REQUIRE_SERVICES"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def percentile(values: list[float], p: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(p / 100 * len(ordered)) - 1))]


class Stats:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.latency: dict[str, list[float]] = {"api": [], "page": []}
        self.status: Counter = Counter()
        self.errors: list[str] = []

    def record(self, kind: str, seconds: float, status: int, what: str) -> None:
        with self.lock:
            self.latency[kind].append(seconds)
            self.status[status // 100 * 100 if status else 0] += 1
            if status >= 500 or status == 0:
                self.errors.append(f"{status} {what}")


class Stack:
    """deploy/devstack.py in a subprocess (its own process group); output goes to a log and is scanned."""

    def __init__(self, var_dir: Path, log: Path) -> None:
        self.port = free_port()
        self.var_dir = var_dir
        env = {k: v for k, v in os.environ.items() if k not in DROP}
        env.update(PORTAL_VAR_DIR=str(var_dir), PORTAL_PORT=str(self.port), SANDBOX_PORT=str(free_port()),
                   PYTHONUNBUFFERED="1")
        self.base = f"http://127.0.0.1:{self.port}"
        self.log = log.open("w")
        self.lines: list[str] = []
        self.proc = subprocess.Popen([sys.executable, "deploy/devstack.py"], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, text=True, start_new_session=True)
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.log.write(line)
            self.log.flush()
            self.lines.append(line.rstrip("\n"))

    def wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if any("GPU portal:" in line for line in self.lines):
                return
            if self.proc.poll() is not None:
                break
            time.sleep(0.5)
        raise SystemExit("the stack did not start; its output:\n" + "\n".join(self.lines[-60:]))

    def notices(self) -> dict[str, Counter]:
        exits: Counter = Counter()
        for line in self.lines:
            if match := re.match(r"devstack: (\w+) exited \((.*?)\)", line):
                exits[match[1]] += 1
        unrecoverable = sum(1 for line in self.lines if "Unrecoverable error" in line)
        return {"exits": exits, "unrecoverable": Counter({"worker": unrecoverable})}

    def stop(self) -> float:
        started = time.monotonic()
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        for match in (re.match(r"devstack: started \w+ \(pid (\d+)\)", line) for line in self.lines):
            if match:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(int(match[1]), signal.SIGKILL)
        return time.monotonic() - started


def login(base: str, username: str, password: str) -> requests.Session:
    session = requests.Session()
    session.get(f"{base}/accounts/login/", timeout=30)
    answer = session.post(f"{base}/accounts/login/", timeout=30, headers={"Referer": f"{base}/accounts/login/"},
                          data={"username": username, "password": password,
                                "csrfmiddlewaretoken": session.cookies.get("csrftoken", "")})
    if answer.status_code >= 400 or "/accounts/login/" in answer.url:
        raise SystemExit(f"could not sign in as {username}: {answer.status_code}")
    return session


def make_token(base: str, session: requests.Session, project: str) -> str:
    answer = session.post(f"{base}/api/v1/tokens/", timeout=30, json={"name": f"soak-{int(time.time())}",
                                                                       "project": project, "scope": "read+submit"},
                          headers={"X-CSRFToken": session.cookies.get("csrftoken", ""), "Referer": base})
    answer.raise_for_status()
    body = answer.json()
    return body["secret"]


def submitter(base: str, token: str, stop: threading.Event, interval: float, stats: Stats, submitted: list[int],
              failures: list[str]) -> None:
    api = requests.Session()
    api.headers["Authorization"] = f"Bearer {token}"
    run = f"{os.getpid()}-{int(time.time())}"
    n = 0
    while not stop.is_set():
        n += 1
        body = {"template": "training", "parameters": {"command": "python train.py", "args": ["--epochs", "1"]},
                "gpus": 1, "duration_hours": 1, "name": f"soak-{n}"}
        started = time.monotonic()
        try:
            answer = api.post(f"{base}/api/v1/requests/", json=body, timeout=60, headers={"Idempotency-Key": f"soak-{run}-{n}"})
            stats.record("api", time.monotonic() - started, answer.status_code, f"POST /api/v1/requests/ #{n}")
            if answer.status_code in (200, 201):
                submitted.append(answer.json()["id"])
            else:
                failures.append(f"#{n}: {answer.status_code} {answer.text[:200]}")
        except requests.RequestException as exc:
            stats.record("api", time.monotonic() - started, 0, f"POST #{n}: {exc}")
        # Follow the latest one as a pipeline would (ci_submit.py polls with If-None-Match).
        if submitted:
            started = time.monotonic()
            try:
                answer = api.get(f"{base}/api/v1/requests/{submitted[-1]}/", timeout=60)
                stats.record("api", time.monotonic() - started, answer.status_code, f"GET request {submitted[-1]}")
            except requests.RequestException as exc:
                stats.record("api", time.monotonic() - started, 0, f"GET: {exc}")
        stop.wait(interval)


def browser(base: str, stop: threading.Event, stats: Stats, pause: float, problems: list[str]) -> None:
    from playwright.sync_api import Error as PlaywrightError
    from playwright.sync_api import sync_playwright

    try:
        with sync_playwright() as playwright:
            chromium = playwright.chromium.launch(executable_path=str(CHROMIUM), headless=True, args=CHROMIUM_ARGS)
            page = chromium.new_context(base_url=base).new_page()
            page.set_default_timeout(60_000)
            page.goto("/accounts/login/")
            page.fill("input[name=username]", "carol")
            page.fill("input[name=password]", "portal-demo")
            with page.expect_navigation():
                page.click("button[type=submit], input[type=submit]")

            def visit(path: str) -> None:
                started = time.monotonic()
                try:
                    response = page.goto(path)
                    stats.record("page", time.monotonic() - started, response.status if response else 0, f"page {path}")
                except PlaywrightError as exc:
                    stats.record("page", time.monotonic() - started, 0, f"page {path}: {exc}")

            while not stop.is_set():
                visit("/requests/")
                links = page.eval_on_selector_all("a[href^='/requests/']", "els => els.map(e => e.getAttribute('href'))")
                details = [h for h in links if re.fullmatch(r"/requests/\d+/", h or "")]
                if details:
                    stop.wait(pause)
                    visit(details[0])
                stop.wait(pause)
            chromium.close()
    except Exception as exc:
        problems.append(f"browser: {exc!r}")


def check_requests(base: str, token: str, ids: list[int], kubeconfig: Path | list[Path], settle: float,
                   api: requests.Session | None = None) -> dict[str, list]:
    """Wait for every request to leave submitted/approved, then count its objects in the clusters (every zone's
    kubeconfig: routing may place a request in any zone, and a request in two zones is duplicated)."""
    from kubernetes import client, config

    api = api or requests.Session()
    api.headers["Authorization"] = f"Bearer {token}"
    states: dict[int, str] = {}
    deadline = time.monotonic() + settle
    while True:
        for request_id in ids:
            if states.get(request_id) not in WAITING and request_id in states:
                continue
            answer = api.get(f"{base}/api/v1/requests/{request_id}/", timeout=60)
            states[request_id] = answer.json().get("state", f"http {answer.status_code}") if answer.ok else f"http {answer.status_code}"
        if not any(s in WAITING for s in states.values()) or time.monotonic() > deadline:
            break
        time.sleep(3)
    jobs, workloads = [], []
    for path in (kubeconfig if isinstance(kubeconfig, list) else [kubeconfig]):
        kube = config.new_client_from_config(config_file=str(path))
        jobs += client.BatchV1Api(kube).list_job_for_all_namespaces(label_selector=REQUEST_LABEL).items
        workloads += client.CustomObjectsApi(kube).list_cluster_custom_object(*KUEUE)["items"]
    jobs_by_request = Counter(j.metadata.labels[REQUEST_LABEL] for j in jobs)
    job_uids = {j.metadata.uid: j.metadata.labels[REQUEST_LABEL] for j in jobs}
    workloads_by_request: Counter = Counter()
    for w in workloads:
        labels = w["metadata"].get("labels") or {}
        owner = next((job_uids[r["uid"]] for r in w["metadata"].get("ownerReferences") or [] if r.get("uid") in job_uids), None)
        if owner or labels.get(REQUEST_LABEL):
            workloads_by_request[owner or labels[REQUEST_LABEL]] += 1
    lost, duplicated, finished_gone = [], [], []
    for request_id in ids:
        state, n_jobs, n_workloads = states.get(request_id), jobs_by_request[str(request_id)], workloads_by_request[str(request_id)]
        if state in WAITING or (state or "").startswith("http") or state == "failed":
            lost.append((request_id, state, n_jobs, n_workloads))
        elif n_jobs > 1 or n_workloads > 1:
            duplicated.append((request_id, state, n_jobs, n_workloads))
        elif n_jobs == 0 or n_workloads == 0:
            # Queued or running without its objects is lost; a finished one may have been cleaned up.
            (finished_gone if state in {"succeeded", "cancelled", "stopped", "expired", "deleted"} else lost).append(
                (request_id, state, n_jobs, n_workloads))
    return {"states": [Counter(states.values())], "lost": lost, "duplicated": duplicated, "finished_gone": finished_gone}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--minutes", type=float, default=float(os.environ.get("SOAK_MINUTES", "5")))
    parser.add_argument("--interval", type=float, default=5.0, help="seconds between API submissions (default 5)")
    parser.add_argument("--page-pause", type=float, default=2.0, help="seconds between page loads (default 2)")
    parser.add_argument("--settle", type=float, default=180.0, help="seconds to wait for the last submissions")
    parser.add_argument("--var-dir", help="the stack's runtime folder (default: a temporary one, removed after)")
    parser.add_argument("--no-browser", action="store_true", help="skip the browser (not for CI)")
    args = parser.parse_args(argv)
    if not args.no_browser and not CHROMIUM.exists():
        print(f"{CHROMIUM} is missing (apt-get install chromium, or `make browser-deps`)", file=sys.stderr)
        return 2

    # With --var-dir the log lies next to it and everything stays; else all goes unless the soak failed.
    tmp = Path(args.var_dir).resolve().parent if args.var_dir else Path(tempfile.mkdtemp(prefix="soak-"))
    var_dir = Path(args.var_dir).resolve() if args.var_dir else tmp / "var"
    tmp.mkdir(parents=True, exist_ok=True)
    stack = Stack(var_dir, tmp / "devstack.log")
    database = (os.environ.get("DATABASE_URL") or "sqlite").split("@")[-1]
    broker = (os.environ.get("CELERY_BROKER_URL") or os.environ.get("REDIS_URL") or "sqlite").split("@")[-1]
    print(f"soak: {args.minutes:g} min on {database} / {broker}; stack log {tmp / 'devstack.log'}", flush=True)
    stats, submitted, refused, problems = Stats(), [], [], []
    result: dict[str, list] = {"lost": [], "duplicated": [], "finished_gone": [], "states": [Counter()]}
    stop = threading.Event()
    try:
        stack.wait_ready(timeout=600)
        token = make_token(stack.base, login(stack.base, "carol", "portal-demo"), "acme-vision")
        threads = [threading.Thread(target=submitter, args=(stack.base, token, stop, args.interval, stats, submitted, refused))]
        if not args.no_browser:
            threads.append(threading.Thread(target=browser, args=(stack.base, stop, stats, args.page_pause, problems)))
        for thread in threads:
            thread.start()
        end = time.monotonic() + args.minutes * 60
        while time.monotonic() < end and stack.proc.poll() is None:
            time.sleep(1)
        stop.set()
        for thread in threads:
            thread.join(timeout=120)
        if stack.proc.poll() is not None:
            problems.append(f"devstack exited with {stack.proc.returncode}")
        else:
            try:
                result = check_requests(stack.base, token, list(submitted),
                                        sorted(var_dir.glob("*.kubeconfig")), args.settle)
            except Exception as exc:
                problems.append(f"checking the requests: {exc!r}")
    finally:
        stop.set()
        notices = stack.notices()
        took = stack.stop()

    exits = notices["exits"]
    api, pages = stats.latency["api"], stats.latency["page"]
    fivexx = stats.status[500]
    print("\n=== soak figures ===")
    print(f"duration            {args.minutes:g} min on {database} / {broker}")
    print(f"child exits         {dict(exits) or 'none'} (worker restarts: {exits['worker']}); unrecoverable errors: {notices['unrecoverable']['worker']}")
    print(f"submissions         {len(submitted)} accepted, {len(refused)} refused")
    print(f"final states        {dict(result['states'][0])}")
    print(f"lost                {len(result['lost'])} {result['lost'][:10]}")
    print(f"duplicated          {len(result['duplicated'])} {result['duplicated'][:10]}")
    print(f"finished, cleaned   {len(result['finished_gone'])}")
    print(f"HTTP                {dict(stats.status)}; 5xx: {fivexx}; no answer: {stats.status[0]} {stats.errors[:5]}")
    print(f"API latency         p50 {percentile(api, 50) * 1000:.0f} ms, p95 {percentile(api, 95) * 1000:.0f} ms ({len(api)} calls)")
    print(f"page latency        p50 {percentile(pages, 50) * 1000:.0f} ms, p95 {percentile(pages, 95) * 1000:.0f} ms ({len(pages)} loads)")
    print(f"stop                {took:.1f} s")
    for line in refused[:5] + problems:
        print(f"problem             {line}")
    bad = (sum(exits.values()) + notices["unrecoverable"]["worker"] + len(result["lost"]) + len(result["duplicated"])
           + fivexx + stats.status[0] + len(problems) + len(refused)) > 0 or not submitted
    print("soak: FAILED" if bad else "soak: OK", flush=True)
    if not args.var_dir and not bad:
        shutil.rmtree(tmp, ignore_errors=True)
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
