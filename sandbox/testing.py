"""pytest fixtures and helpers for tests that need a Kubernetes API: the sandbox cluster over loopback.

Register with ``pytest_plugins = ["sandbox.testing"]`` in the root conftest. Fixtures:

* ``sandbox_cluster`` (session): one cluster for the whole run; use unique names/namespaces per test.
* ``fresh_sandbox`` (function): a new, empty cluster (nodes from the demo profile) for tests that need isolation.

Each yields a started :class:`sandbox.app.Sandbox`; ``.kubeconfig`` is the path of its kubeconfig and ``.kubecache``
a private ``KUBECACHEDIR`` for kubectl. Helpers: :func:`kubectl`, :func:`api_client`, :func:`control`.
"""

from __future__ import annotations

import json
import os
import shutil
import ssl
import subprocess
import urllib.request
from pathlib import Path

import pytest

from .app import Sandbox


def _start(tmpdir: Path, **kwargs) -> Sandbox:
    tmpdir.mkdir(parents=True, exist_ok=True)
    sb = Sandbox(kubeconfig=tmpdir / "kubeconfig", **kwargs)
    sb.kubecache = str(tmpdir / "kubecache")  # type: ignore[attr-defined]
    sb.start()
    return sb


@pytest.fixture(scope="session")
def sandbox_cluster(tmp_path_factory):
    sb = _start(tmp_path_factory.mktemp("sandbox-cluster"))
    try:
        yield sb
    finally:
        sb.stop()


@pytest.fixture
def fresh_sandbox(tmp_path):
    sb = _start(tmp_path / "sandbox")
    try:
        yield sb
    finally:
        sb.stop()


def kubectl_env(sb: Sandbox) -> dict:
    env = dict(os.environ)
    env["KUBECONFIG"] = str(sb.kubeconfig)
    env["KUBECACHEDIR"] = getattr(sb, "kubecache", None) or str(Path(str(sb.kubeconfig)).parent / "kubecache")
    env.pop("HTTPS_PROXY", None)
    env.pop("https_proxy", None)
    env.pop("HTTP_PROXY", None)
    env.pop("http_proxy", None)
    return env


def kubectl(sb: Sandbox, *args: str, input: str | None = None, check: bool = True, timeout: float = 60) -> subprocess.CompletedProcess:
    """Run the real kubectl binary against ``sb``; returns the CompletedProcess (text mode)."""
    exe = shutil.which("kubectl")
    if exe is None:  # pragma: no cover
        pytest.skip("kubectl is not installed")
    proc = subprocess.run([exe, "--kubeconfig", str(sb.kubeconfig), *args], input=input, capture_output=True, text=True,
                          env=kubectl_env(sb), timeout=timeout, check=False)
    if check and proc.returncode != 0:
        raise AssertionError(f"kubectl {' '.join(args)} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    return proc


def api_client(sb: Sandbox):
    """An official-client ``ApiClient`` configured from the sandbox kubeconfig."""
    from kubernetes import config

    return config.new_client_from_config(config_file=str(sb.kubeconfig))


def control(sb: Sandbox, method: str, path: str, body: dict | None = None, *, token: str | None = None, timeout: float = 30,
            headers: dict | None = None):
    """Call an HTTP endpoint of the sandbox (``/sandbox/faults`` ...) with the bearer token; returns (status, headers, json|text)."""
    ctx = ssl.create_default_context(cadata=sb.ca_pem.decode()) if sb.ca_pem else None
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(sb.url + path, data=data, method=method)
    if data is not None:
        req.add_header("Content-Type", "application/json")
    for k, v in (headers or {}).items():
        req.add_header(k, v)
    tok = sb.token if token is None else token
    if tok:
        req.add_header("Authorization", f"Bearer {tok}")
    try:
        with urllib.request.urlopen(req, timeout=timeout, context=ctx) as resp:
            raw, status, headers = resp.read(), resp.status, dict(resp.headers)
    except urllib.error.HTTPError as e:
        raw, status, headers = e.read(), e.code, dict(e.headers)
    try:
        payload = json.loads(raw) if raw else None
    except ValueError:
        payload = raw.decode()
    return status, headers, payload
