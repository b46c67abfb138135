"""Load and faults on the production-like stack (deploy/prodstack.py); prints figures; exit 1 on trouble.

    .venv/bin/python tests/bench/prodload.py                    # 50 users, 3 minutes
    .venv/bin/python tests/bench/prodload.py --users 10 --duration 60

It starts the stack (a fresh database, gunicorn with 4 workers, 2 Celery workers, beat, 2 status followers, the
sandbox cluster), then runs ``--users`` virtual users for ``--duration`` seconds, each looping over a weighted mix
with a think time of about ``--think`` seconds:

* page views as carol (signed in): /requests/, a request's page, the dashboard;
* API lists with carol's project token: GET /api/v1/requests/;
* submissions: POST /api/v1/requests/ (each with its own Idempotency-Key, kept across retries); one in five asks
  for more hours than the auto-approval allows and waits for an approver;
* approvals as bob (signed in): GET /api/v1/approvals/, then approve the oldest waiting request;
* polling: GET /api/v1/requests/<id>/ of the user's latest submission, with If-None-Match.

A call that breaks (connection reset) or answers 502/503/504 is retried, up to 4 times, the same call with the
same key: those are the in-flight calls of a killed process. At a third of the run it kills (SIGKILL) one
gunicorn worker; at a half one Celery worker (its whole process group: the supervisor starts it again, as
Kubernetes would); at two thirds the status follower holding its cluster's lease (the other one takes over).

Afterwards: bob approves what still waits, then the check waits (``--settle``) for every submission to leave
submitted/approved and checks that the database holds exactly the submitted ids (none lost, none extra), that
the cluster has exactly one Job and one Kueue Workload per request, that none is stuck, and that no call ended
in a 5xx. Figures: throughput, p50/p95/p99 per kind, error rate, retries, takeover time of the follower lease.
"""

from __future__ import annotations

import argparse
import itertools
import os
import random
import signal
import sys
import tempfile
import threading
import time
from collections import Counter, defaultdict
from pathlib import Path

import requests

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from deploy.prodstack import Stack
from tests.bench.soak import check_requests

MIX = (("page", 30), ("list", 25), ("submit", 15), ("approve", 10), ("poll", 20))
RETRY_STATUSES = {502, 503, 504}
PASSWORD = "portal-demo"


class _Session(requests.Session):
    """The stack is plain HTTP behind no proxy; its cookies are Secure (the client says https through
    X-Forwarded-Proto, as the ingress would): keep sending them over HTTP."""

    def prepare_request(self, request: requests.Request) -> requests.PreparedRequest:
        for cookie in self.cookies:
            cookie.secure = False
        return super().prepare_request(request)


def pct(values: list[float], p: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(round(p / 100 * (len(values) - 1))))] if values else 0.0


class Stats:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.latency: dict[str, list[float]] = defaultdict(list)
        self.final: Counter = Counter()  # (kind, status) of each call's last attempt
        self.retried: Counter = Counter()  # kind -> calls that needed a retry
        self.retry_causes: Counter = Counter()
        self.problems: list[str] = []

    def record(self, kind: str, seconds: float, status: int, attempts: int, causes: list[str]) -> None:
        with self.lock:
            self.latency[kind].append(seconds * 1000)
            self.final[(kind, status)] += 1
            if attempts > 1:
                self.retried[kind] += 1
                self.retry_causes.update(causes)


def session(base: str, username: str | None = None) -> requests.Session:
    s = _Session()
    s.headers.update({"X-Forwarded-Proto": "https", "Referer": base.replace("http://", "https://") + "/"})
    if username:
        s.get(f"{base}/accounts/login/", timeout=60)
        answer = s.post(f"{base}/accounts/login/", timeout=60, allow_redirects=False,
                        data={"username": username, "password": PASSWORD, "csrfmiddlewaretoken": s.cookies.get("csrftoken", "")})
        if answer.status_code != 302:
            raise SystemExit(f"could not sign in as {username}: {answer.status_code} {answer.text[:300]}")
        s.headers["X-CSRFToken"] = s.cookies.get("csrftoken", "")
    return s


def clone(base: str, signed_in: requests.Session) -> requests.Session:
    s = session(base)
    s.cookies.update(signed_in.cookies)
    s.headers["X-CSRFToken"] = signed_in.headers.get("X-CSRFToken", "")
    return s


class User(threading.Thread):
    def __init__(self, n: int, base: str, carol: requests.Session, bob: requests.Session, token: str, run: str,
                 stop: threading.Event, stats: Stats, submitted: list[int], think: float, seed: int) -> None:
        super().__init__(daemon=True, name=f"user-{n}")
        self.n, self.base, self.run_id, self.stop, self.stats, self.submitted = n, base, run, stop, stats, submitted
        self.pages, self.approver = clone(base, carol), clone(base, bob)
        self.api = session(base)
        self.api.headers["Authorization"] = f"Bearer {token}"
        self.think, self.rng = think, random.Random(seed)
        self.mine: list[int] = []
        self.etag: dict[int, str] = {}
        self.count = itertools.count(1)

    def call(self, kind: str, s: requests.Session, method: str, path: str, ok: set[int], **kw) -> requests.Response | None:
        started, causes = time.monotonic(), []
        for attempt in range(1, 6):
            try:
                answer = s.request(method, self.base + path, timeout=60, **kw)
            except requests.RequestException as exc:
                causes.append(type(exc).__name__)
                answer = None
            else:
                if answer.status_code not in RETRY_STATUSES:
                    break
                causes.append(str(answer.status_code))
            time.sleep(0.5 * attempt)
        status = answer.status_code if answer is not None else 0
        self.stats.record(kind, time.monotonic() - started, status, attempt, causes)
        if status not in ok:
            with self.stats.lock:
                self.stats.problems.append(f"{kind} {method} {path}: {status} {answer.text[:200] if answer is not None else causes}")
        return answer

    def run(self) -> None:
        kinds, weights = zip(*MIX, strict=True)
        while not self.stop.is_set():
            kind = self.rng.choices(kinds, weights)[0]
            try:
                getattr(self, kind)()
            except Exception as exc:  # a bug in the client must not pass for a server error
                with self.stats.lock:
                    self.stats.problems.append(f"{kind}: client error {exc!r}")
            self.stop.wait(self.rng.uniform(0, 2 * self.think))

    def page(self) -> None:
        path = self.rng.choice(["/requests/", "/", f"/requests/{self.submitted[-1]}/" if self.submitted else "/requests/"])
        self.call("page", self.pages, "GET", path, {200})

    def list(self) -> None:
        self.call("list", self.api, "GET", "/api/v1/requests/?page_size=20", {200})

    def submit(self) -> None:
        n = next(self.count)
        hours = 12 if self.rng.random() < 0.2 else 1  # over the 8 hours approved automatically: an approver's
        body = {"template": "training", "parameters": {"command": "python train.py", "args": ["--epochs", "1"]},
                "gpus": 1, "duration_hours": hours, "name": f"load-{self.n}-{n}"}
        answer = self.call("submit", self.api, "POST", "/api/v1/requests/", {200, 201}, json=body,
                           headers={"Idempotency-Key": f"{self.run_id}-{self.n}-{n}"})
        if answer is not None and answer.status_code in (200, 201):
            request_id = answer.json()["id"]
            self.mine.append(request_id)
            with self.stats.lock:
                self.submitted.append(request_id)

    def approve(self) -> None:
        answer = self.call("approve", self.approver, "GET", "/api/v1/approvals/?page_size=5", {200})
        if answer is None or answer.status_code != 200:
            return
        waiting = answer.json().get("results") or []
        if waiting:
            # Another approver may win the race: 409 (no longer waiting) is a correct answer.
            self.call("approve", self.approver, "POST", f"/api/v1/requests/{waiting[0]['id']}/approve/", {200, 409},
                      json={"comment": "load test"})

    def poll(self) -> None:
        if not self.mine:
            return self.list()
        request_id = self.mine[-1]
        headers = {"If-None-Match": self.etag[request_id]} if request_id in self.etag else {}
        answer = self.call("poll", self.api, "GET", f"/api/v1/requests/{request_id}/", {200, 304}, headers=headers)
        if answer is not None and answer.headers.get("ETag"):
            self.etag[request_id] = answer.headers["ETag"]


def lease_holder_pid(stack: Stack) -> int | None:
    import pickle

    import redis

    r = redis.Redis.from_url(stack.redis_url)
    for key in r.scan_iter("*portal:lease:follow:*"):
        value = r.get(key)
        if value:
            return int(pickle.loads(value).split(":")[1])
    return None


def faults(stack: Stack, duration: float, stop: threading.Event, notes: list[str]) -> None:
    started = time.monotonic()

    def at(fraction: float) -> bool:
        return not stop.wait(max(0.0, started + duration * fraction - time.monotonic()))

    if at(1 / 3):
        web = stack.pids("web")
        if len(web) > 1:
            os.kill(web[1], signal.SIGKILL)
            notes.append(f"t={time.monotonic() - started:.0f}s: killed gunicorn worker {web[1]} (of {len(web) - 1})")
    if at(1 / 2):
        worker = stack.children["worker-1"]
        pids = stack.pids("worker-1")
        worker.signal(signal.SIGKILL)
        notes.append(f"t={time.monotonic() - started:.0f}s: killed Celery worker-1 ({len(pids)} processes)")
    if at(2 / 3):
        holder = lease_holder_pid(stack)
        followers = {pid: name for name in stack.children if name.startswith("follower-") for pid in stack.pids(name)}
        if holder in followers:
            os.kill(holder, signal.SIGKILL)
            killed = time.monotonic()
            while lease_holder_pid(stack) in (holder, None) and time.monotonic() - killed < 120:
                time.sleep(0.5)
            new = lease_holder_pid(stack)
            now = {pid: name for name in stack.children for pid in stack.pids(name)}  # the killed one restarted
            notes.append(f"t={killed - started:.0f}s: killed the lease holder {followers[holder]} (pid {holder}); "
                         f"pid {new} ({now.get(new, 'gone')}) took over after {time.monotonic() - killed:.1f}s")
        else:
            notes.append(f"lease holder {holder} is not a follow_cluster process ({followers}): not killed")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--users", type=int, default=50)
    parser.add_argument("--duration", type=float, default=180, help="seconds of load")
    parser.add_argument("--think", type=float, default=1.0, help="mean pause between a user's calls (s)")
    parser.add_argument("--settle", type=float, default=240, help="seconds to wait for the submissions to settle")
    parser.add_argument("--no-faults", action="store_true")
    parser.add_argument("--var", default=None, help="runtime folder (default: a temporary one)")
    parser.add_argument("--keep-database", action="store_true")
    args = parser.parse_args(argv)

    var = Path(args.var) if args.var else Path(tempfile.mkdtemp(prefix="prodload-"))
    stack = Stack(var=var)
    stats, submitted, notes = Stats(), [], []
    stop = threading.Event()
    failed = False
    try:
        stack.start()
        base = stack.base
        carol, bob = session(base, "carol"), session(base, "bob")
        answer = carol.post(f"{base}/api/v1/tokens/", timeout=60, json={"name": "load", "project": "acme-vision",
                                                                        "scope": "read+submit"})
        answer.raise_for_status()
        token = answer.json()["secret"]
        run = f"load-{int(time.time())}"
        users = [User(n, base, carol, bob, token, run, stop, stats, submitted, args.think, seed=n) for n in range(args.users)]
        chaos = threading.Thread(target=faults, args=(stack, args.duration, stop, notes), daemon=True)
        print(f"load: {args.users} users for {args.duration:.0f}s against {base}", flush=True)
        started = time.monotonic()
        for user in users:
            user.start()
        if not args.no_faults:
            chaos.start()
        while time.monotonic() - started < args.duration:
            stack.check()
            time.sleep(0.5)
        stop.set()
        for user in users:
            user.join(timeout=120)
        elapsed = time.monotonic() - started
        if chaos.is_alive():
            chaos.join(timeout=130)

        calls = sum(stats.final.values())
        errors5 = sum(n for (_, status), n in stats.final.items() if status >= 500)
        broken = sum(n for (_, status), n in stats.final.items() if status == 0)
        bad = sum(n for (kind, status), n in stats.final.items() if status not in (200, 201, 302, 304, 409))
        ids = set(submitted)
        print("\n== figures ==")
        print(f"users {args.users}, {elapsed:.0f}s of load, {calls} calls, {calls / elapsed:.1f} calls/s")
        for kind, _ in MIX:
            values = stats.latency.get(kind, [])
            print(f"  {kind:<8} {len(values):>6} calls  p50 {pct(values, 50):7.0f} ms  p95 {pct(values, 95):7.0f} ms  "
                  f"p99 {pct(values, 99):7.0f} ms  retried {stats.retried[kind]}")
        allv = [v for values in stats.latency.values() for v in values]
        print(f"  {'all':<8} {len(allv):>6} calls  p50 {pct(allv, 50):7.0f} ms  p95 {pct(allv, 95):7.0f} ms  p99 {pct(allv, 99):7.0f} ms")
        print(f"final statuses: {dict(sorted(Counter({f'{k}:{s}': n for (k, s), n in stats.final.items()}).items()))}")
        print(f"error rate (final answers not 2xx/302/304/409): {bad}/{calls} = {100 * bad / max(calls, 1):.2f}%; "
              f"5xx {errors5}, broken {broken}")
        print(f"calls retried (in flight at a kill): {sum(stats.retried.values())}, causes {dict(stats.retry_causes)}")
        print("faults: " + ("; ".join(notes) or "none"))
        print("restarts: " + ", ".join(f"{name} {child.restarts}" for name, child in stack.children.items()))
        for problem in stats.problems[:15]:
            print(f"  problem: {problem}")
        sys.stdout.flush()

        # Approve what still waits, so that every submission should end up queued or beyond.
        waiting = []
        while True:
            page = bob.get(f"{base}/api/v1/approvals/?page_size=100", timeout=60).json().get("results") or []
            if not page:
                break
            for item in page:
                bob.post(f"{base}/api/v1/requests/{item['id']}/approve/", json={"comment": "load test: after"}, timeout=60)
                waiting.append(item["id"])
            stack.check()
        settle_started = time.monotonic()
        checked = check_requests(base, token, sorted(set(submitted)), stack.kubeconfig, args.settle, api=session(base))
        settled = time.monotonic() - settle_started

        os.environ.update({k: stack.env[k] for k in ("DATABASE_URL", "REDIS_URL", "SECRET_KEY", "PORTAL_ENCRYPTION_KEY")})
        os.environ["DJANGO_SETTINGS_MODULE"] = "portal.settings"
        import django

        django.setup()
        from workloads.models import WorkloadRequest

        in_db = set(WorkloadRequest.objects.filter(name__startswith="load-").values_list("pk", flat=True))
        dup_names = [n for n, c in Counter(WorkloadRequest.objects.filter(name__startswith="load-").values_list("name", flat=True)).items() if c > 1]

        print(f"submissions {len(ids)} ({len(waiting)} approved after the run); in the database {len(in_db)}; "
              f"settled in {settled:.0f}s; states {checked['states'][0]}")
        print(f"lost {checked['lost']}; duplicated in the cluster {checked['duplicated']}; finished and gone "
              f"{len(checked['finished_gone'])}")
        print(f"database vs client: missing {sorted(ids - in_db)}, extra {sorted(in_db - ids)}, duplicate names {dup_names}")
        failed = bool(errors5 or broken or checked["lost"] or checked["duplicated"] or ids != in_db or dup_names
                      or (not args.no_faults and len(notes) < 3))
        print("RESULT: " + ("FAIL" if failed else "PASS"), flush=True)
    finally:
        stop.set()
        stack.stop()
        if not args.keep_database:
            stack.drop_database()
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
