"""The image definition (deploy/Containerfile) against our rules, and its entry point run outside a container."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CONTAINERFILE = ROOT / "deploy" / "Containerfile"
ENTRYPOINT = ROOT / "deploy" / "entrypoint.py"


def instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuation lines joined and comments dropped."""
    text = re.sub(r"\\\n", " ", CONTAINERFILE.read_text())
    out = []
    for raw in text.splitlines():
        line = raw.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            out.append((word.upper(), rest.strip()))
    return out


def test_containerfile_follows_the_rules():
    steps = instructions()
    args = {a.split("=", 1)[0]: a.split("=", 1)[1] for w, a in steps if w == "ARG" and "=" in a}
    froms = [a.split()[0] for w, a in steps if w == "FROM"]
    assert froms, "no FROM"
    for ref in froms:
        image = args.get(ref.strip("${}"), ref)
        # A Debian base, pinned: a digest or a dated tag, never latest or a bare name.
        assert "debian" in image
        assert "@sha256:" in image or re.search(r":[a-z]+-\d{8}(-slim)?$", image), image
    # No ADD (let alone of a URL): COPY only; no curl|wget piped into a shell.
    assert not [a for w, a in steps if w == "ADD"]
    assert not [a for w, a in steps if w == "RUN" and re.search(r"(curl|wget)[^|]*\|\s*(ba)?sh", a)]
    # Runs as a non-root numeric user, set after the last RUN of the final stage.
    final = steps[max(i for i, (w, _) in enumerate(steps) if w == "FROM"):]
    users = [(i, a) for i, (w, a) in enumerate(final) if w == "USER"]
    assert users and users[-1][1].split(":")[0] not in ("0", "root")
    assert users[-1][0] > max(i for i, (w, _) in enumerate(final) if w == "RUN")
    # Static files collected at build time; a HEALTHCHECK; one entry point.
    assert any("collectstatic" in a for w, a in final if w == "RUN")
    assert [w for w, _ in final].count("HEALTHCHECK") == 1
    entry = [json.loads(a) for w, a in final if w == "ENTRYPOINT"]
    assert entry == [["/opt/venv/bin/python", "/app/deploy/entrypoint.py"]]
    # apt lists do not stay in the layers; no recommends.
    for w, a in steps:
        if w == "RUN" and "apt-get install" in a:
            assert "--no-install-recommends" in a and "rm -rf /var/lib/apt/lists" in a


def test_build_context_leaves_out_what_the_image_must_not_hold():
    ignored = set((ROOT / ".dockerignore").read_text().split())
    assert {".git", ".venv", "var", "tests", "sandbox", "realcluster"} <= ignored


def local_apps() -> list[str]:
    """The project's own packages the settings install (INSTALLED_APPS entries that live in this tree), and portal."""
    from django.conf import settings

    names = {app.split(".")[0] for app in settings.INSTALLED_APPS}
    return sorted({"portal", *(n for n in names if (ROOT / n / "__init__.py").is_file())})


def _glob_regex(pattern: str) -> str:
    out, i = "", 0
    while i < len(pattern):
        if pattern.startswith("**", i):
            out, i = out + ".*", i + 2
        elif pattern[i] == "*":
            out, i = out + "[^/]*", i + 1
        elif pattern[i] == "?":
            out, i = out + "[^/]", i + 1
        else:
            out, i = out + re.escape(pattern[i]), i + 1
    return out


def _ignored(rel: str, patterns: list[str]) -> bool:
    """Whether .dockerignore leaves ``rel`` out of the build context: the last matching pattern wins, a
    pattern matches a path or any folder above it, ``**`` spans folders, ``!`` takes back."""
    parts = rel.split("/")
    prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    result = False
    for pattern in patterns:
        negate = pattern.startswith("!")
        regex = _glob_regex(pattern.lstrip("!").strip("/"))
        if any(re.fullmatch(regex, p) for p in prefixes):
            result = not negate
    return result


def _context_files(base: Path, patterns: list[str]) -> list[Path]:
    """Files under ``base`` in the build context (folders left out whole are not walked)."""
    if base.is_file():
        return [] if _ignored(base.relative_to(ROOT).as_posix(), patterns) else [base]
    found = []
    for folder, dirs, files in os.walk(base):
        rel = Path(folder).relative_to(ROOT).as_posix()
        inside = (lambda name: name) if rel == "." else (lambda name, rel=rel: f"{rel}/{name}")
        # A folder ignored whole is skipped unless a "!" pattern may take back something inside it.
        dirs[:] = [d for d in dirs if not _ignored(inside(d), patterns)
                   or any(p.startswith("!") and p[1:].startswith(inside(d) + "/") for p in patterns)]
        found += [Path(folder) / f for f in files if not _ignored(inside(f), patterns)]
    return found


def image_files() -> set[str]:
    """The paths the final stage's COPY instructions put in the image, from the build context."""
    patterns = [line.strip() for line in (ROOT / ".dockerignore").read_text().splitlines()
                if line.strip() and not line.startswith("#")]
    steps = instructions()
    final = steps[max(i for i, (w, _) in enumerate(steps) if w == "FROM"):]
    workdir, out = "/", set()
    for word, arg in final:
        if word == "WORKDIR":
            workdir = arg
        if word != "COPY" or arg.startswith("--from"):
            continue
        *sources, dest = arg.split()
        dest = dest if dest.startswith("/") else f"{workdir.rstrip('/')}/{dest.removeprefix('./')}"
        for source in sources:
            base = (ROOT / source).resolve()
            for path in _context_files(base, patterns):
                if base.is_file():
                    out.add(f"{dest.rstrip('/')}/{path.name}" if dest.endswith("/") else dest)
                else:
                    out.add(f"{dest.rstrip('/')}/{path.relative_to(base).as_posix()}")
    return out


def test_every_installed_app_is_copied_into_the_image():
    files = image_files()
    apps = local_apps()
    assert {"maintenance", "insights", "tenants", "portal"} <= set(apps)
    missing = [app for app in apps if f"/app/{app}/__init__.py" not in files]
    assert not missing, f"installed apps the image would not hold: {missing}"
    assert "/app/manage.py" in files and "/app/deploy/entrypoint.py" in files and "/app/deploy/gunicorn.conf.py" in files
    # What must not reach the image stays out.
    assert not [f for f in files if f.startswith(("/app/tests/", "/app/sandbox/", "/app/.venv/", "/app/var/", "/app/.git/"))]
    assert not [f for f in files if f.startswith("/app/deploy/") and f not in ("/app/deploy/entrypoint.py", "/app/deploy/gunicorn.conf.py")]


def dry_run(*argv: str, env: dict | None = None) -> dict:
    out = subprocess.run([sys.executable, str(ENTRYPOINT), "--dry-run", *argv], capture_output=True, text=True,
                         env={**os.environ, **(env or {})}, timeout=30, check=False)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def test_each_role_builds_its_command_line():
    web = dry_run("web")["commands"]
    assert web == [[sys.executable, "-m", "gunicorn", "--config", str(ROOT / "deploy/gunicorn.conf.py"),
                    "portal.wsgi:application"]]
    worker = dry_run("worker", env={"CELERY_CONCURRENCY": "3", "CELERY_QUEUES": "celery,bulk"})
    assert worker["commands"][0][1:5] == ["-m", "celery", "--app", "portal"]
    assert worker["commands"][0][5] == "worker"
    assert "--concurrency" in worker["commands"][0] and "3" in worker["commands"][0]
    assert worker["commands"][0][-2:] == ["--queues", "celery,bulk"]
    assert worker["env"] == {"PORTAL_ROLE": "worker", "REMAP_SIGTERM": "SIGQUIT", "CELERY_WORKER_SOFT_SHUTDOWN_TIMEOUT": "45"}
    beat = dry_run("beat", env={"TMPDIR": "/tmp"})["commands"][0]
    assert beat[5] == "beat" and beat[-2:] == ["--schedule", "/tmp/celerybeat-schedule"]
    migrate = dry_run("migrate", env={"DATABASE_MIGRATE_URL": "postgres://owner@db/portal"})["commands"]
    assert migrate[0][-4:] == ["migrate", "--noinput", "--database", "migrate"]
    assert migrate[1][-1] == "createcachetable" and len(migrate) == 2
    # With a runtime role named, the migration Job also grants it what it may do (it owns no table).
    migrate = dry_run("migrate", env={"DATABASE_MIGRATE_URL": "postgres://owner@db/portal",
                                      "PORTAL_RUNTIME_DB_ROLE": "portal_app"})["commands"]
    assert migrate[2][-3:] == ["db_runtime_role", "portal_app", "--apply"]
    assert dry_run("manage", "check", "--deploy")["commands"] == [[sys.executable, str(ROOT / "manage.py"), "check", "--deploy"]]


def test_unknown_role_is_refused():
    out = subprocess.run([sys.executable, str(ENTRYPOINT), "serve"], capture_output=True, text=True, timeout=30, check=False)
    assert out.returncode == 2 and "usage" in out.stderr


def test_gunicorn_settings_come_from_the_environment():
    code = "import runpy,json; c=runpy.run_path('deploy/gunicorn.conf.py'); print(json.dumps({k: c[k] for k in ('workers','threads','bind','graceful_timeout','worker_tmp_dir')}))"
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=30,
                         env={**os.environ, "WEB_WORKERS": "5", "WEB_THREADS": "2", "PORT": "9000", "TMPDIR": "/tmp"}, check=True)
    assert json.loads(out.stdout) == {"workers": 5, "threads": 2, "bind": "0.0.0.0:9000", "graceful_timeout": 30, "worker_tmp_dir": "/tmp"}


def database_url() -> str:
    from django.db import connection

    s = connection.settings_dict
    if s["ENGINE"].endswith("sqlite3"):
        return f"sqlite:///{s['NAME']}"
    auth = s["USER"] + (f":{s['PASSWORD']}" if s["PASSWORD"] else "")
    return f"postgres://{auth}@{s['HOST'] or '127.0.0.1'}:{s['PORT'] or 5432}/{s['NAME']}"


def production_env(tmp_path: Path, **extra: str) -> dict:
    # DJANGO_ALLOW_ASYNC_UNSAFE is set by the browser tests when they share this process; `check --deploy` refuses it.
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_MIGRATE_URL", "DJANGO_ALLOW_ASYNC_UNSAFE")}
    env.update({"PORTAL_ENV": "production", "SECRET_KEY": "x" * 20 + "entrypoint-test-secret-key-0123456789",
                "DATABASE_URL": database_url(), "ALLOWED_HOSTS": "gpu.example.org", "LOG_FORMAT": "json",
                "EMAIL_HOST": "smtp.example.org",
                "PORTAL_VAR_DIR": str(tmp_path / "var"), "STATIC_ROOT": str(tmp_path / "static"), "TMPDIR": str(tmp_path)})
    env.update(extra)
    return env


@pytest.mark.django_db(transaction=True)
def test_migrate_and_check_deploy_run_against_the_test_database(tmp_path):
    env = production_env(tmp_path)
    migrate = subprocess.run([sys.executable, str(ENTRYPOINT), "migrate"], env=env, capture_output=True, text=True, timeout=240, check=False)
    assert migrate.returncode == 0, migrate.stderr + migrate.stdout
    assert "No migrations to apply" in migrate.stdout
    check = subprocess.run([sys.executable, str(ENTRYPOINT), "manage", "check", "--deploy", "--fail-level", "WARNING"],
                           env=env, capture_output=True, text=True, timeout=120, check=False)
    assert check.returncode == 0, check.stderr + check.stdout
    assert "no issues" in check.stdout


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.django_db(transaction=True)
def test_web_role_serves_probes_logs_json_and_stops_on_sigterm(tmp_path):
    port = free_port()
    env = production_env(tmp_path, HOST="127.0.0.1", PORT=str(port), WEB_WORKERS="2", WEB_THREADS="2")
    proc = subprocess.Popen([sys.executable, str(ENTRYPOINT), "web"], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                req = urllib.request.Request(f"http://127.0.0.1:{port}/healthz/live", headers={"X-Request-ID": "probe-1"})
                with urllib.request.urlopen(req, timeout=5) as answer:
                    assert answer.status == 200 and answer.headers["X-Request-ID"] == "probe-1"
                    break
            except OSError:
                assert proc.poll() is None and time.monotonic() < deadline, "gunicorn did not start"
                time.sleep(0.3)
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz/ready", timeout=10) as answer:
            assert json.load(answer)["status"] == "ok"
        urllib.request.urlopen(urllib.request.Request(f"http://127.0.0.1:{port}/healthz/ready",
                                                      headers={"Host": "gpu.example.org"}), timeout=10).read()
        try:
            urllib.request.urlopen(urllib.request.Request(f"http://127.0.0.1:{port}/nope/", headers={
                "Host": "gpu.example.org", "X-Forwarded-Proto": "https", "X-Request-ID": "page-7"}), timeout=10)
        except urllib.error.HTTPError as exc:
            assert exc.code == 404 and exc.headers["X-Request-ID"] == "page-7"
        os.killpg(proc.pid, signal.SIGTERM)
        out, _ = proc.communicate(timeout=40)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 0, out
    records = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    assert any(r["logger"] == "portal.access" and r["request_id"] == "page-7" and r["status"] == 404 for r in records), out
    assert any(r["logger"] == "gunicorn.error" and "Shutting down" in r["message"] for r in records), out
    assert not [line for line in out.splitlines() if line.strip() and not line.startswith("{")], out
