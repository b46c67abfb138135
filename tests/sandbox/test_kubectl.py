"""The real ``kubectl`` binary against the sandbox cluster (``--kubeconfig``, private KUBECACHEDIR), and ``python -m sandbox``."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest
import yaml

from sandbox.testing import kubectl, kubectl_env

# A laptop without kubectl skips these; CI (PORTAL_REQUIRE_SERVICES=1) has it and never skips them.
pytestmark = pytest.mark.skipif(
    shutil.which("kubectl") is None and os.environ.get("PORTAL_REQUIRE_SERVICES") != "1",
    reason="kubectl is not installed",
)

REPO = Path(__file__).resolve().parents[2]


def _uid() -> str:
    return uuid.uuid4().hex[:8]


def _write(tmp_path: Path, name: str, docs) -> str:
    p = tmp_path / name
    p.write_text(yaml.safe_dump_all(docs if isinstance(docs, list) else [docs], sort_keys=False))
    return str(p)


def _cq(name: str, **spec) -> dict:
    return {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ClusterQueue", "metadata": {"name": name},
            "spec": {"namespaceSelector": {}, **spec}}


@pytest.fixture
def ns(sandbox_cluster):
    name = f"k-{_uid()}"
    kubectl(sandbox_cluster, "create", "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "Namespace",
                                                                     "metadata": {"name": name}}))
    return name


def test_api_resources_and_get_multiple_kinds(sandbox_cluster, ns):
    out = kubectl(sandbox_cluster, "api-resources").stdout
    lines = {line.split()[0]: line for line in out.splitlines()[1:]}
    assert "clusterqueues" in lines and "kueue.x-k8s.io/v1beta2" in lines["clusterqueues"]
    assert "localqueues" in lines and "lq" in lines["localqueues"]
    assert "pods" in lines and "nodes" in lines
    kubectl(sandbox_cluster, "create", "-f", "-", input=json.dumps(_cq(f"cq-{_uid()}")))
    kubectl(sandbox_cluster, "create", "-n", ns, "-f", "-", input=json.dumps({
        "apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "LocalQueue", "metadata": {"name": "lq1"},
        "spec": {"clusterQueue": "whatever"}}))
    out = kubectl(sandbox_cluster, "get", "nodes,clusterqueues,localqueues", "-A").stdout
    assert "clusterqueue.kueue.x-k8s.io/" in out
    assert f"{ns}" in out and "localqueue.kueue.x-k8s.io/lq1" in out
    out = kubectl(sandbox_cluster, "get", "lq", "-n", ns, "-o", "name").stdout
    assert out.strip() == "localqueue.kueue.x-k8s.io/lq1"


def test_create_get_and_printer_columns(sandbox_cluster, tmp_path):
    name = f"cq-{_uid()}"
    f = _write(tmp_path, "cq.yaml", _cq(name, cohortName="research"))
    assert "created" in kubectl(sandbox_cluster, "create", "-f", f).stdout
    out = kubectl(sandbox_cluster, "get", "clusterqueue", name).stdout.splitlines()
    assert out[0].split()[:2] == ["NAME", "COHORT"]
    assert out[1].split()[:2] == [name, "research"]
    obj = json.loads(kubectl(sandbox_cluster, "get", "cq", name, "-o", "json").stdout)
    assert obj["kind"] == "ClusterQueue" and obj["spec"]["cohortName"] == "research"
    err = kubectl(sandbox_cluster, "create", "-f", f, check=False)
    assert err.returncode != 0 and "AlreadyExists" in err.stderr
    missing = kubectl(sandbox_cluster, "get", "cq", "nope-" + name, check=False)
    assert missing.returncode != 0 and "NotFound" in missing.stderr


def test_client_side_apply_and_server_side_apply(sandbox_cluster, tmp_path, ns):
    name = f"cq-{_uid()}"
    f = _write(tmp_path, "cq.yaml", _cq(name, cohortName="a"))
    assert "created" in kubectl(sandbox_cluster, "apply", "-f", f).stdout
    f = _write(tmp_path, "cq.yaml", _cq(name, cohortName="b"))
    assert "configured" in kubectl(sandbox_cluster, "apply", "-f", f).stdout
    assert "unchanged" in kubectl(sandbox_cluster, "apply", "-f", f).stdout
    obj = json.loads(kubectl(sandbox_cluster, "get", "cq", name, "-o", "json").stdout)
    assert obj["spec"]["cohortName"] == "b"
    assert "kubectl.kubernetes.io/last-applied-configuration" in obj["metadata"]["annotations"]

    # a built-in kind (strategic merge patch computed from the OpenAPI v3 document)
    cm = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "cfg", "namespace": ns}, "data": {"a": "1"}}
    f2 = _write(tmp_path, "cm.yaml", cm)
    kubectl(sandbox_cluster, "apply", "-f", f2)
    cm["data"] = {"a": "2", "b": "3"}
    f2 = _write(tmp_path, "cm.yaml", cm)
    res = kubectl(sandbox_cluster, "apply", "-f", f2)
    assert "configured" in res.stdout and "warning" not in res.stderr.lower()
    data = json.loads(kubectl(sandbox_cluster, "get", "cm", "cfg", "-n", ns, "-o", "json").stdout)["data"]
    assert data == {"a": "2", "b": "3"}

    # server-side apply: creates, then updates; fieldManager conflicts are reported
    name2 = f"cq-{_uid()}"
    f3 = _write(tmp_path, "ssa.yaml", _cq(name2, cohortName="ssa"))
    assert "serverside-applied" in kubectl(sandbox_cluster, "apply", "--server-side", "-f", f3).stdout
    f3 = _write(tmp_path, "ssa.yaml", _cq(name2, cohortName="ssa2"))
    kubectl(sandbox_cluster, "apply", "--server-side", "-f", f3)
    obj = json.loads(kubectl(sandbox_cluster, "get", "cq", name2, "-o", "json").stdout)
    assert obj["spec"]["cohortName"] == "ssa2"
    f4 = _write(tmp_path, "ssa-other.yaml", _cq(name2, cohortName="other"))
    conflict = kubectl(sandbox_cluster, "apply", "--server-side", "--field-manager", "someone-else", "-f", f4, check=False)
    assert conflict.returncode != 0 and "conflict" in conflict.stderr.lower()
    kubectl(sandbox_cluster, "apply", "--server-side", "--field-manager", "someone-else", "--force-conflicts", "-f", f4)
    obj = json.loads(kubectl(sandbox_cluster, "get", "cq", name2, "-o", "json").stdout)
    assert obj["spec"]["cohortName"] == "other"


def test_invalid_kueue_object_is_rejected_naming_the_field(sandbox_cluster, tmp_path):
    name = f"cq-{_uid()}"
    f = _write(tmp_path, "bad.yaml", _cq(name, queueingStrategy=42))
    res = kubectl(sandbox_cluster, "apply", "-f", f, check=False)
    assert res.returncode != 0
    assert "spec.queueingStrategy" in res.stderr and "is invalid" in res.stderr
    # an unknown field is refused under kubectl's default --validate=strict
    bad = _cq(name)
    bad["spec"]["bogus"] = True
    f = _write(tmp_path, "unknown.yaml", bad)
    res = kubectl(sandbox_cluster, "apply", "-f", f, check=False)
    assert res.returncode != 0 and 'strict decoding error: unknown field "spec.bogus"' in res.stderr
    assert kubectl(sandbox_cluster, "get", "cq", name, check=False).returncode != 0
    # --validate=warn: created, the field dropped, a "Warning: 299" header shown by kubectl
    res = kubectl(sandbox_cluster, "apply", "--validate=warn", "-f", f)
    assert 'Warning: unknown field "spec.bogus"' in res.stderr
    assert "bogus" not in json.loads(kubectl(sandbox_cluster, "get", "cq", name, "-o", "json").stdout)["spec"]


def test_patch_merge_json_strategic(sandbox_cluster, ns):
    name = f"cq-{_uid()}"
    kubectl(sandbox_cluster, "create", "-f", "-", input=json.dumps(_cq(name, cohortName="x")))
    kubectl(sandbox_cluster, "patch", "cq", name, "--type", "merge", "-p", '{"spec":{"cohortName":"m"}}')
    kubectl(sandbox_cluster, "patch", "cq", name, "--type", "json", "-p",
            '[{"op":"replace","path":"/spec/cohortName","value":"j"}]')
    obj = json.loads(kubectl(sandbox_cluster, "get", "cq", name, "-o", "json").stdout)
    assert obj["spec"]["cohortName"] == "j"
    # strategic merge on a custom resource: refused as a real apiserver does
    res = kubectl(sandbox_cluster, "patch", "cq", name, "-p", '{"spec":{"cohortName":"s"}}', check=False)
    assert res.returncode != 0 and "application/strategic-merge-patch+json is not supported" in res.stderr
    # strategic merge on a built-in kind
    kubectl(sandbox_cluster, "create", "-n", ns, "-f", "-", input=json.dumps(
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "p"}, "data": {"a": "1"}}))
    kubectl(sandbox_cluster, "patch", "-n", ns, "cm", "p", "-p", '{"data":{"b":"2"}}')
    kubectl(sandbox_cluster, "label", "-n", ns, "cm", "p", "team=ml")
    obj = json.loads(kubectl(sandbox_cluster, "get", "-n", ns, "cm", "p", "-o", "json").stdout)
    assert obj["data"] == {"a": "1", "b": "2"} and obj["metadata"]["labels"] == {"team": "ml"}
    # --dry-run=server changes nothing
    kubectl(sandbox_cluster, "patch", "cq", name, "--type", "merge", "-p", '{"spec":{"cohortName":"dry"}}',
            "--dry-run=server")
    obj = json.loads(kubectl(sandbox_cluster, "get", "cq", name, "-o", "json").stdout)
    assert obj["spec"]["cohortName"] == "j"


def test_delete(sandbox_cluster, ns):
    name = f"cq-{_uid()}"
    kubectl(sandbox_cluster, "create", "-f", "-", input=json.dumps(_cq(name)))
    res = kubectl(sandbox_cluster, "delete", "cq", name, timeout=30)
    assert f'clusterqueue.kueue.x-k8s.io "{name}" deleted' in res.stdout
    res = kubectl(sandbox_cluster, "delete", "cq", name, check=False)
    assert res.returncode != 0 and "NotFound" in res.stderr
    # an object with a finalizer: kubectl waits for the DELETED event (here: until the finalizer is removed)
    kubectl(sandbox_cluster, "create", "-n", ns, "-f", "-", input=json.dumps(
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "fin", "finalizers": ["example.com/hold"]}}))
    proc = subprocess.Popen(["kubectl", "--kubeconfig", str(sandbox_cluster.kubeconfig), "delete", "-n", ns, "cm", "fin"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=kubectl_env(sandbox_cluster))
    time.sleep(1.5)
    assert proc.poll() is None  # still waiting
    kubectl(sandbox_cluster, "patch", "-n", ns, "cm", "fin", "--type", "merge", "-p", '{"metadata":{"finalizers":null}}')
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    assert 'configmap "fin" deleted' in out


def test_get_watch_prints_changes(sandbox_cluster, ns):
    name = f"cq-{_uid()}"
    kubectl(sandbox_cluster, "create", "-f", "-", input=json.dumps(_cq(name, cohortName="w0")))
    proc = subprocess.Popen(["kubectl", "--kubeconfig", str(sandbox_cluster.kubeconfig), "get", "cq", name, "-w"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=kubectl_env(sandbox_cluster))
    lines: list[str] = []

    def reader():
        for line in proc.stdout:
            lines.append(line.rstrip("\n"))

    t = threading.Thread(target=reader, daemon=True)
    t.start()
    try:
        deadline = time.monotonic() + 15
        while len(lines) < 2 and time.monotonic() < deadline:
            time.sleep(0.1)
        for i in (1, 2):
            kubectl(sandbox_cluster, "patch", "cq", name, "--type", "merge", "-p", json.dumps({"spec": {"cohortName": f"w{i}"}}))
        while not any("w2" in line for line in lines) and time.monotonic() < deadline:
            time.sleep(0.1)
    finally:
        proc.terminate()
        proc.wait(timeout=10)
    assert lines[0].split()[:2] == ["NAME", "COHORT"]
    cohorts = [line.split()[1] for line in lines[1:] if line.split() and line.split()[0] == name]
    assert cohorts[0] == "w0"
    assert "w1" in cohorts and "w2" in cohorts
    assert cohorts.index("w1") < cohorts.index("w2")


def test_explain_kueue_kind(sandbox_cluster):
    out = kubectl(sandbox_cluster, "explain", "clusterqueue.spec").stdout
    assert "KIND:       ClusterQueue" in out
    assert "cohortName" in out and "resourceGroups" in out
    out = kubectl(sandbox_cluster, "explain", "localqueue.spec.clusterQueue").stdout
    assert "clusterQueue" in out and "<string>" in out


def test_describe_and_logs(sandbox_cluster, ns):
    kubectl(sandbox_cluster, "create", "-n", ns, "-f", "-", input=json.dumps({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "lp", "annotations": {"sandbox.gpuportal.dev/log": "epoch 1 loss 0.5"}},
        "spec": {"containers": [{"name": "main", "image": "busybox"}]}}))
    out = kubectl(sandbox_cluster, "logs", "-n", ns, "lp").stdout
    assert "epoch 1 loss 0.5" in out
    out = kubectl(sandbox_cluster, "describe", "-n", ns, "pod", "lp").stdout
    assert "Name:" in out and "lp" in out


def test_without_token_kubectl_is_refused(sandbox_cluster, tmp_path):
    cfg = yaml.safe_load(Path(sandbox_cluster.kubeconfig).read_text())
    cfg["users"][0]["user"] = {"token": "not-the-token"}
    kc = tmp_path / "kc"
    kc.write_text(yaml.safe_dump(cfg))
    env = kubectl_env(sandbox_cluster)
    env["KUBECACHEDIR"] = str(tmp_path / "cache")
    res = subprocess.run(["kubectl", "--kubeconfig", str(kc), "get", "ns"], capture_output=True, text=True, env=env,
                         timeout=30, stdin=subprocess.DEVNULL, check=False)
    assert res.returncode != 0
    assert "You must be logged in to the server" in res.stderr


def test_python_m_sandbox_cli(tmp_path):
    kc = tmp_path / "kubeconfig"
    state = tmp_path / "state.json"
    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    proc = subprocess.Popen([sys.executable, "-m", "sandbox", "--kubeconfig", str(kc), "--state-file", str(state)],
                            cwd=str(REPO), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        line = proc.stdout.readline()
        assert "https://127.0.0.1:" in line, line + proc.stderr.read() if proc.poll() is not None else line
        cfg = yaml.safe_load(kc.read_text())
        assert cfg["current-context"] == "sandbox"
        assert cfg["clusters"][0]["cluster"]["server"] in line
        assert cfg["users"][0]["user"]["token"]

        class _SB:
            kubeconfig = str(kc)
            kubecache = str(tmp_path / "cache")

        res = kubectl(_SB, "create", "-f", "-", input=json.dumps(_cq("from-cli")))
        assert "created" in res.stdout
        assert "from-cli" in kubectl(_SB, "get", "clusterqueues").stdout
    finally:
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=20)
    assert proc.returncode == 0, err
    assert "stopped" in out
    saved = json.loads(state.read_text())
    assert saved  # the state file was written on SIGTERM

    # a new process restores the state
    proc = subprocess.Popen([sys.executable, "-m", "sandbox", "--kubeconfig", str(kc), "--state-file", str(state)],
                            cwd=str(REPO), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        proc.stdout.readline()

        class _SB2:
            kubeconfig = str(kc)
            kubecache = str(tmp_path / "cache2")

        assert "from-cli" in kubectl(_SB2, "get", "clusterqueues").stdout
    finally:
        proc.send_signal(signal.SIGINT)
        proc.communicate(timeout=20)
    assert proc.returncode == 0
