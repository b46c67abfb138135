"""The image, built for real (deploy/build_image.py, `make image`): a Debian base made with mmdebstrap from apt's
mirror, buildah with chroot isolation, Python packages from the package index. Then every role runs from the
built image as uid 10001 on a read-only root with only /tmp writable (the script's `run`), against the test
database and Redis: migrate, web, worker and beat, each checked by its own healthcheck. And no installed app
is left out of the image (the static rule over the Containerfile and .dockerignore is in test_image.py).

Minutes the first time (the base is cached under var/image/, buildah keeps the layers). CI sets
PORTAL_REQUIRE_SERVICES=1: the script installs buildah and mmdebstrap there; elsewhere, without buildah, skipped.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.deploy.test_image import free_port, local_apps, production_env

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "deploy" / "build_image.py"
TAG = "localhost/gpu-portal:test"

# The first build takes minutes (base, packages); reruns reuse the cached base and buildah's layers.
pytestmark = pytest.mark.timeout(3600)

if not shutil.which("buildah") and os.environ.get("PORTAL_REQUIRE_SERVICES") != "1":
    pytest.skip("buildah is not installed (CI installs it: PORTAL_REQUIRE_SERVICES=1)", allow_module_level=True)


@pytest.fixture(scope="module")
def image() -> dict:
    out = subprocess.run([sys.executable, str(SCRIPT), "--tag", TAG], cwd=ROOT, capture_output=True, text=True,
                         timeout=3600, check=False)
    assert out.returncode == 0, out.stdout[-5000:] + out.stderr[-5000:]
    built = json.loads(out.stdout.strip().splitlines()[-1])
    print(f"image built: {built}")
    return built


def in_image(script: str, env: dict[str, str], timeout: int = 600) -> subprocess.CompletedProcess:
    """``sh -c script`` in the image as uid 10001 on a read-only root (deploy/build_image.py run)."""
    argv = [sys.executable, str(SCRIPT), "run", TAG]
    for key, value in env.items():
        argv += ["-e", f"{key}={value}"]
    # In a session of its own: on a timeout the whole tree goes (subprocess.run would kill the runner alone, and leave
    # the role running in the image, a beat holding its lease while the rest of the suite runs).
    with subprocess.Popen([*argv, "--", "/bin/sh", "-c", script], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          text=True, start_new_session=True) as proc:
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
            raise
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def role_env(tmp_path: Path) -> dict[str, str]:
    host_env = production_env(tmp_path)
    keep = ("SECRET_KEY", "DATABASE_URL", "ALLOWED_HOSTS", "EMAIL_HOST", "REDIS_URL")
    return {**{k: host_env[k] for k in keep if host_env.get(k)}, "HOST": "127.0.0.1", "PORT": str(free_port()),
            "WEB_WORKERS": "1", "CELERY_CONCURRENCY": "1", "CELERY_WORKER_SOFT_SHUTDOWN_TIMEOUT": "2"}


# Start the role in the background, wait (at most 120 s) for its own healthcheck to pass, stop it with SIGTERM.
ROLE_UNTIL_HEALTHY = """
python /app/deploy/entrypoint.py {role} &
pid=$!
ok=0
for i in $(seq 120); do
  if python /app/deploy/entrypoint.py healthcheck {role}; then ok=1; break; fi
  kill -0 $pid 2>/dev/null || break
  sleep 1
done
kill -TERM $pid 2>/dev/null; wait $pid
echo "healthy=$ok"
"""


def test_the_image_holds_every_installed_app_and_runs_read_only_as_10001(image, tmp_path):
    assert image["tag"] == TAG
    out = in_image("id -u; id -g; ls -d /app/*/__init__.py; touch /app/x /opt/venv/x 2>&1; touch /tmp/x && echo tmp-ok",
                   {})
    assert out.returncode == 0, out.stdout + out.stderr
    lines = out.stdout.splitlines()
    assert lines[:2] == ["10001", "10001"], out.stdout
    packages = {Path(line).parent.name for line in lines if line.endswith("/__init__.py")}
    assert set(local_apps()) <= packages, f"left out of the image: {set(local_apps()) - packages}"
    assert "tmp-ok" in lines
    assert (out.stdout + out.stderr).count("Read-only file system") == 2, out.stdout + out.stderr


@pytest.mark.django_db(transaction=True)
def test_every_role_runs_from_the_image(image, tmp_path):
    env = role_env(tmp_path)
    migrate = in_image("python /app/deploy/entrypoint.py migrate", env)
    assert migrate.returncode == 0, migrate.stdout + migrate.stderr
    assert "No migrations to apply" in migrate.stdout, migrate.stdout
    for role in ("web", "worker", "beat"):
        out = in_image(ROLE_UNTIL_HEALTHY.format(role=role), env)
        assert "healthy=1" in out.stdout, f"{role}:\n{out.stdout[-4000:]}\n{out.stderr[-4000:]}"
        # JSON lines only (LOG_FORMAT=json is the image's default), the healthcheck's own message aside.
        logs = [line for line in (out.stdout + out.stderr).splitlines() if line.strip() and not line.startswith("healthy=")
                and not line.startswith("healthcheck:")]
        assert all(line.startswith("{") for line in logs), f"{role}: " + "\n".join(l for l in logs if not l.startswith("{"))
