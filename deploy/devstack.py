"""`make run`: the portal with demo data on http://127.0.0.1:8000/, plus everything it needs.

Migrates, seeds the demo, starts the embedded sandbox cluster, a Celery worker, Celery beat (the scheduler)
and the web server, prints the URL and the logins, and supervises them: a child that exits is started again
after a backoff (1 s, 2 s, 4 s ... 30 s; back to 1 s once it has run for a minute), with a one-line
notice on stdout::

    devstack: worker exited (killed by SIGKILL) after 41s; restarting in 1s
    devstack: started worker (pid 12345)

Beat is a child of its own, not embedded in the worker: a beat that dies is noticed and restarted like any
child (embedded, it died alone while its worker ran on, and nothing followed the requests' states). Its
schedule's state is kept in the shared cache, not in a file (portal/beat.py), and its lease keeps it to one.

Only Ctrl-C, SIGTERM or SIGHUP (its terminal closed) stops everything, and so does the end of the process that
started it (``make`` killed: it passes no signal on): each child runs in its own process group (so Ctrl-C reaches
only this supervisor), which gets SIGTERM, then SIGKILL for whatever is left; all within 10 seconds.

Without DATABASE_URL / REDIS_URL it needs no server: SQLite for the data and the cache, and the
embedded SQLite broker (portal/broker.py) under var/.

With DATABASE_URL on PostgreSQL, that URL's role (or DATABASE_MIGRATE_URL's) is the tables' owner: it
migrates and creates the runtime role PORTAL_RUNTIME_DB_ROLE (default portal_app; its password from
PORTAL_RUNTIME_DB_PASSWORD or kept in the runtime folder), which owns nothing and may only append to
the audit log (docs/security.md). Everything else (the demo data, the worker, the web server) connects
as the runtime role and never sees the owner's URL. PORTAL_RUNTIME_DB_ROLE= (empty) runs all as owner.

PORTAL_CLUSTER=real (`make run CLUSTER=real`) runs it on the real control plane (docs/real-cluster.md) instead.

Environment: PORTAL_HOST, PORTAL_PORT (web server), SANDBOX_PORT (the sandbox cluster's API; default
a free port, kept across restarts), SANDBOX_SPEED (default 60), PORTAL_VAR_DIR (runtime files).
PORTAL_DEV_SSO=1 also starts the test OpenID provider (tests/oidc, needs node and npm; OIDC_DEV_PORT,
default 8400) and points the portal's single sign-on at it (README "Single sign-on").
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
VAR = Path(os.environ.get("PORTAL_VAR_DIR", ROOT / "var"))
PY = sys.executable
HOST = os.environ.get("PORTAL_HOST", "127.0.0.1")
PORT = os.environ.get("PORTAL_PORT", "8000")
SPEED = os.environ.get("SANDBOX_SPEED", "60")
STOP_WITHIN = 10.0  # seconds from Ctrl-C/SIGTERM to every child gone
BACKOFF_MAX = 30.0
HEALTHY_AFTER = 60.0  # a child that ran this long starts again after the first backoff step

_stopping: list[str] = []


def say(text: str) -> None:
    print(f"devstack: {text}", flush=True)


def describe(returncode: int) -> str:
    if returncode < 0:
        try:
            return f"killed by {signal.Signals(-returncode).name}"
        except ValueError:
            return f"killed by signal {-returncode}"
    return f"exit code {returncode}"


def kill_group(pgid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def group_alive(pgid: int) -> bool:
    """Whether any live process is in the group (zombies waiting for their reaper do not count)."""
    proc = Path("/proc")
    if proc.is_dir():
        for entry in proc.iterdir():
            if entry.name.isdigit():
                try:
                    stat = (entry / "stat").read_text()
                except OSError:
                    continue
                fields = stat[stat.rindex(")") + 2:].split()
                if int(fields[2]) == pgid and fields[0] not in "ZX":
                    return True
        return False
    try:
        os.killpg(pgid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True


class Child:
    """One supervised program, in a process group of its own."""

    def __init__(self, name: str, argv: list[str], before_start=None) -> None:
        self.name, self.argv, self.before_start = name, argv, before_start
        self.proc: subprocess.Popen | None = None
        self.started_at = 0.0
        self.failures = 0
        self.restart_at: float | None = None

    def start(self) -> None:
        if self.before_start:
            self.before_start()
        self.proc = subprocess.Popen(self.argv, cwd=ROOT, start_new_session=True)
        self.started_at = time.monotonic()
        self.restart_at = None
        say(f"started {self.name} (pid {self.proc.pid})")

    def check(self) -> None:
        """Notice an exit (and schedule the restart), or start again when the backoff is over."""
        now = time.monotonic()
        if self.proc is not None and self.proc.poll() is not None:
            code, ran = self.proc.returncode, now - self.started_at
            kill_group(self.proc.pid, signal.SIGKILL)  # whatever it left behind in its group
            self.failures = 1 if ran >= HEALTHY_AFTER else self.failures + 1
            delay = min(BACKOFF_MAX, 2.0 ** (self.failures - 1))
            say(f"{self.name} exited ({describe(code)}) after {ran:.0f}s; restarting in {delay:.0f}s")
            self.proc, self.restart_at = None, now + delay
        if self.proc is None and self.restart_at is not None and now >= self.restart_at:
            try:
                self.start()
            except Exception as exc:
                self.failures += 1
                delay = min(BACKOFF_MAX, 2.0 ** (self.failures - 1))
                say(f"{self.name} did not start ({exc}); retrying in {delay:.0f}s")
                self.restart_at = time.monotonic() + delay


# The demo's two more zones (docs/federation.md): sandbox clusters of their own, each with its own endpoint and
# kubeconfig next to the main one's (quotas/demo.py registers them: A100 inference, L40S development).
ZONES = (("zone-a100", "zone-a100.yaml", "zone-a100.kubeconfig"), ("zone-l40s", "zone-l40s.yaml", "zone-l40s.kubeconfig"))
# One Prometheus over the three clusters (docs/measured-use.md): the main sandbox's query API also answers for the
# zones' exporters, each cluster's series labelled cluster="<its demo cluster name>" (quotas/demo.py).
CLUSTER_LABEL = "cluster"
DEMO_CLUSTER_OF = {"sandbox": "sandbox", "zone-a100": "a100-inference", "zone-l40s": "l40s-dev"}
# One GPU of the H100 training zone raises XID 79 (a fallen-off-the-bus GPU) from the start: the health page
# (Capacity -> Health) flags it and lists what runs on its node (docs/measured-use.md, "The demo").
DEMO_XID = "gpu-h100-3:7:79"
CLUSTER_CHILDREN = ("sandbox", "cluster", *(name for name, _, _ in ZONES))  # stopped last


def stop_all(children: list[Child]) -> None:
    """SIGTERM every group (web and worker first, the sandbox last), SIGKILL what is left, within 10 s.

    The worker's SIGTERM is a warm shutdown (it finishes running tasks); after 3 s it gets SIGQUIT, a
    cold shutdown (what it had not finished goes back to the broker, acks are late).
    """
    started = time.monotonic()
    deadline = started + STOP_WITHIN - 1.5
    groups = {c.name: c.proc.pid for c in children if c.proc is not None}
    gone: dict[str, float] = {}
    order = [[n for n in groups if n not in CLUSTER_CHILDREN], [n for n in groups if n in CLUSTER_CHILDREN]]
    for step, names in enumerate(order):
        for name in names:
            kill_group(groups[name], signal.SIGTERM)
        # The sandbox saves its state on SIGTERM: it gets at least the last 3 seconds of the budget.
        step_deadline = deadline - 3 if step == 0 else deadline
        quit_at = time.monotonic() + 3
        while time.monotonic() < step_deadline:
            for child in children:
                if child.proc is not None:
                    child.proc.poll()
            for name in names:
                if name not in gone and not group_alive(groups[name]):
                    gone[name] = time.monotonic() - started
            if all(name in gone for name in names):
                break
            if "worker" in names and "worker" not in gone and time.monotonic() > quit_at:
                kill_group(groups["worker"], signal.SIGQUIT)
                quit_at = float("inf")
            time.sleep(0.05)
    for name, pgid in groups.items():
        if name not in gone:
            kill_group(pgid, signal.SIGKILL)
            gone[name] = time.monotonic() - started
    for child in children:
        if child.proc is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                child.proc.wait(timeout=1)
    timings = ", ".join(f"{name} {at:.1f}s" for name, at in sorted(gone.items(), key=lambda kv: kv[1]))
    say(f"stopped: web server, worker, beat, sandbox cluster ({timings})")


def watch_parent() -> None:
    """Stop everything once whoever started devstack is gone: ``make`` killed with SIGTERM does not pass the signal
    on, and the children (each in a process group of its own) would otherwise run on unseen, holding the ports. A
    devstack started as an orphan has nothing to watch."""
    parent = os.getppid()
    if parent == 1:
        return

    def watch() -> None:
        while not _stopping:
            if os.getppid() != parent:
                say(f"the process that started it (pid {parent}) exited; stopping")
                _stopping.append("parent exited")
                return
            time.sleep(0.5)

    threading.Thread(target=watch, name="parent-watch", daemon=True).start()


def step(*args: str, env: dict[str, str] | None = None) -> None:
    """One `manage.py` command, stoppable by Ctrl-C/SIGTERM like the rest."""
    proc = subprocess.Popen([PY, "manage.py", *args], cwd=ROOT, start_new_session=True, env=env)
    while proc.poll() is None:
        if _stopping:
            kill_group(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=3)
            except subprocess.TimeoutExpired:
                kill_group(proc.pid, signal.SIGKILL)
            raise SystemExit(0)
        time.sleep(0.1)
    if proc.returncode != 0:
        say(f"manage.py {' '.join(args)} failed ({describe(proc.returncode)})")
        raise SystemExit(1)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def runtime_database(owner_url: str, role: str, password: str) -> str:
    """The URL of ``owner_url``'s database as ``role`` (same host, port, database and options)."""
    from urllib.parse import quote, urlsplit, urlunsplit

    parts = urlsplit(owner_url)
    host = parts.hostname or ""
    host = f"[{host}]" if ":" in host else host
    netloc = f"{quote(role, safe='')}:{quote(password, safe='')}@{host}{f':{parts.port}' if parts.port else ''}"
    return urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))


def database_prepare() -> None:
    """Migrate; on PostgreSQL as the owner, then make the runtime role (docs above) and switch DATABASE_URL to it.
    The owner's URL is left out of the environment the demo data and the children get."""
    url = os.environ.get("DATABASE_URL", "")
    role = os.environ.get("PORTAL_RUNTIME_DB_ROLE", "portal_app")
    if not url.startswith(("postgres://", "postgresql://", "pgsql://")) or not role:
        step("migrate", "--no-input", "-v", "0")
        step("createcachetable")  # the cache table (login throttling, task locks) when there is no Redis
        return
    owner_url = os.environ.pop("DATABASE_MIGRATE_URL", "") or url
    password = os.environ.get("PORTAL_RUNTIME_DB_PASSWORD", "")
    if not password:
        kept = VAR / "runtime-db-password"
        if not kept.exists():
            import secrets

            kept.touch(mode=0o600)
            kept.write_text(secrets.token_urlsafe(24))
        password = kept.read_text().strip()
    # The owner as the default connection, the only one, for migrate and the steps after it (the runtime role does
    # not exist yet on a first run). Data migrations use their own connection either way (docs/security.md).
    owner_env = {**os.environ, "DATABASE_URL": owner_url, "PORTAL_RUNTIME_DB_PASSWORD": password}
    step("migrate", "--no-input", "-v", "0", env=owner_env)
    step("createcachetable", env=owner_env)
    step("db_runtime_role", role, "--apply", "--database", "default", env=owner_env)
    os.environ["DATABASE_URL"] = runtime_database(owner_url, role, password)
    os.environ.pop("PORTAL_RUNTIME_DB_PASSWORD", None)
    say(f"the portal connects as {role}, which owns no table (migrations ran as the owner)")


def embedded_broker() -> str | None:
    """The embedded broker's URL (as portal/settings.py builds it), or None when Redis is configured."""
    if os.environ.get("CELERY_BROKER_URL") or os.environ.get("REDIS_URL"):
        return None
    return f"portal+sqlite:///{VAR / 'celery-broker.sqlite3'}"


def dev_sso() -> Child | None:
    """PORTAL_DEV_SSO=1: the test OpenID provider as a child, and the portal's OIDC_* settings pointing at it."""
    if os.environ.get("PORTAL_DEV_SSO", "").lower() not in {"1", "true", "yes", "on"}:
        return None
    node, npm = shutil.which("node"), shutil.which("npm")
    if node is None or npm is None:
        say("PORTAL_DEV_SSO: node and npm are not installed, so single sign-on stays off (password sign-in only)")
        return None
    here = ROOT / "tests" / "oidc"
    if not (here / "node_modules" / "oidc-provider").exists():
        subprocess.run([npm, "ci", "--no-audit", "--no-fund"], cwd=here, check=True)
    port = os.environ.get("OIDC_DEV_PORT", "8400")
    os.environ.update({"OIDC_ISSUER": f"http://127.0.0.1:{port}", "OIDC_CLIENT_ID": "portal",
                       "OIDC_CLIENT_SECRET": "portal-test-secret", "OIDC_SCOPES": "openid email profile groups",
                       "OIDC_PROVIDER_NAME": os.environ.get("OIDC_PROVIDER_NAME", "the local test IdP")})
    return Child("sso", [node, str(here / "server.js"), "--port", port])


def dev_sso_client() -> None:
    """Register the portal's address with the test provider (its callback and where logout returns)."""
    import urllib.request

    issuer = os.environ["OIDC_ISSUER"]
    bases = [f"http://{HOST}:{PORT}", f"http://localhost:{PORT}"]
    body = json.dumps({"redirect_uris": [f"{b}/oidc/callback/" for b in bases],
                       "post_logout_redirect_uris": [f"{b}/accounts/login/" for b in bases]}).encode()
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and not _stopping:
        try:
            request = urllib.request.Request(issuer + "/__test/client", data=body, method="POST",
                                             headers={"content-type": "application/json"})
            urllib.request.urlopen(request, timeout=2).close()
            say(f"single sign-on with the test provider at {issuer} (login: demo-sso)")
            return
        except OSError:
            time.sleep(0.2)
    say("the test OpenID provider did not answer: single sign-on will fail")


def main() -> int:
    VAR.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "portal.settings")
    os.environ["PORTAL_VAR_DIR"] = str(VAR)
    # PORTAL_CLUSTER=real (make run CLUSTER=real): the real control plane (realcluster/, docs/real-cluster.md)
    # instead of the sandbox; built first if it is not (that takes a while the first time).
    real = os.environ.get("PORTAL_CLUSTER", "").strip().lower() == "real"
    kubeconfig = VAR / ("realcluster.kubeconfig" if real else "sandbox.kubeconfig")
    os.environ.setdefault("PORTAL_KUBECONFIG", str(kubeconfig))
    database = (os.environ.get("DATABASE_URL") or f"sqlite {VAR / 'portal.sqlite3'}").split("@")[-1]
    broker_url = embedded_broker()
    broker = (os.environ.get("CELERY_BROKER_URL") or os.environ.get("REDIS_URL") or f"sqlite {VAR / 'celery-broker.sqlite3'}").split("@")[-1]
    print(f"database: {database}\nbroker:   {broker}", flush=True)

    def on_signal(signum: int, _frame: object) -> None:
        _stopping.append(signal.Signals(signum).name)

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGHUP, on_signal)  # its terminal closed (the children, in groups of their own, get none)
    watch_parent()

    # One Prometheus folder for the worker and the web server: /metrics sums both (portal/prometheus.py); emptied
    # here so a new run starts its counters at zero.
    metrics_dir = Path(os.environ.setdefault("PROMETHEUS_MULTIPROC_DIR", str(VAR / "prometheus")))
    if metrics_dir.is_dir():
        for item in metrics_dir.glob("*.db"):
            item.unlink(missing_ok=True)
    metrics_dir.mkdir(parents=True, exist_ok=True)

    database_prepare()

    sandbox_port = os.environ.get("SANDBOX_PORT") or str(free_port())
    zone_ports = {name: str(free_port()) for name, _, _ in ZONES}
    if not real and "PROMETHEUS_URL" not in os.environ:  # the sandbox's simulated DCGM exporters and Prometheus
        os.environ["PROMETHEUS_URL"] = f"http://127.0.0.1:{sandbox_port}/prometheus"  # query API (measured-use.md)
        os.environ.setdefault("PROMETHEUS_CLUSTER_LABEL", CLUSTER_LABEL)
    peers = [arg for name, _, _ in ZONES for arg in ("--prometheus-peer", f"http://127.0.0.1:{zone_ports[name]}")]

    def sandbox_ready() -> None:
        """Wait for the kubeconfig the sandbox writes once it listens (the real control plane: once it is up,
        which may include building it)."""
        deadline = time.monotonic() + (3600 if real else 15)
        while time.monotonic() < deadline and not _stopping:
            if kubeconfig.exists() or sandbox.proc is None or sandbox.proc.poll() is not None:
                break
            time.sleep(0.05)
        if not kubeconfig.exists() and not _stopping:
            say("the sandbox cluster did not write its kubeconfig (see its output above)")

    def sandbox_before() -> None:
        if kubeconfig.exists():
            kubeconfig.unlink()

    def worker_before() -> None:
        # The worker is the embedded broker's only consumer: what a killed worker had taken but not
        # finished is handed out again (tasks are idempotent).
        if broker_url:
            from portal.broker import restore_unacked

            restored = restore_unacked(broker_url)
            if restored:
                say(f"{restored} unfinished task(s) of the previous worker queued again")

    sandbox = Child(
        "sandbox",
        [PY, "-m", "sandbox", "--kubeconfig", str(kubeconfig), "--port", sandbox_port, "--speed", SPEED,
         "--state-file", str(VAR / "sandbox-state.json"),
         "--prometheus-label", f"{CLUSTER_LABEL}={DEMO_CLUSTER_OF['sandbox']}", *peers,
         "--xid", DEMO_XID],
        before_start=sandbox_before,
    ) if not real else Child(
        "cluster",
        [PY, "-m", "realcluster", "--kubeconfig", str(kubeconfig), "--state-dir", str(VAR / "realcluster")],
        before_start=sandbox_before,
    )
    zones = [] if real else [Child(
        name, [PY, "-m", "sandbox", "--kubeconfig", str(VAR / config), "--port", zone_ports[name], "--speed", SPEED,
               "--profile", str(ROOT / "sandbox" / "profiles" / profile), "--state-file", str(VAR / f"{name}-state.json"),
               "--prometheus-label", f"{CLUSTER_LABEL}={DEMO_CLUSTER_OF[name]}"],
        before_start=lambda config=config: (VAR / config).unlink(missing_ok=True)) for name, profile, config in ZONES]
    worker = Child(
        "worker",
        [PY, "-m", "celery", "-A", "portal", "worker", "--loglevel", "warning",
         "--pool", "threads", "--concurrency", "4", "--without-mingle", "--without-gossip", "--without-heartbeat"],
        before_start=worker_before,
    )
    # The scheduler (portal/beat.py): its state lives in the shared cache and its lease keeps it to one.
    beat = Child("beat", [PY, "-m", "celery", "-A", "portal", "beat", "--loglevel", "warning"])
    web = Child("web", [PY, "manage.py", "runserver", f"{HOST}:{PORT}", "--noreload"])
    sso = dev_sso()
    children = [sandbox, *zones, worker, beat, web] + ([sso] if sso else [])
    try:
        if sso is not None:
            sso.start()
            dev_sso_client()
        sandbox.start()
        for zone in zones:  # started together; each writes its kubeconfig while the main one does
            zone.start()
        sandbox_ready()
        zones_deadline = time.monotonic() + 15
        while zones and not _stopping and time.monotonic() < zones_deadline and not all(
                (VAR / config).exists() for _, _, config in ZONES):
            time.sleep(0.05)
        if not _stopping:
            step("seed_demo")
        for child in (worker, beat, web):
            if not _stopping:
                child.start()
        # The banner once the web server answers (a loaded laptop takes a few seconds to import Django).
        deadline = time.monotonic() + 60
        while not _stopping and time.monotonic() < deadline and web.proc is not None and web.proc.poll() is None:
            try:
                socket.create_connection((HOST, int(PORT)), timeout=1).close()
                break
            except OSError:
                time.sleep(0.2)
        if not _stopping:
            shown = kubeconfig.relative_to(ROOT) if kubeconfig.is_relative_to(ROOT) else kubeconfig
            print(
                f"\n  GPU portal:  http://{HOST}:{PORT}/    (API docs: http://{HOST}:{PORT}/api/docs/)\n"
                f"  kubectl:     kubectl --kubeconfig {shown} get nodes,clusterqueues,localqueues -A\n"
                "  Ctrl-C stops everything.\n",
                flush=True,
            )
        while not _stopping:
            for child in children:
                child.check()
                if child is sandbox and child.proc is not None and time.monotonic() - child.started_at < 1:
                    sandbox_ready()
            time.sleep(0.25)
    finally:
        stop_all(children)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
