"""Protobuf request bodies: the decoder (sandbox/protowire.py) and the real kubectl's ``create`` generators.

kubectl 1.32's typed clients POST ``application/vnd.kubernetes.protobuf`` (``k8s\\x00`` + ``runtime.Unknown``) for
built-in kinds and never fall back to JSON after a 415, so every ``kubectl create <generator>`` depends on it.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import ssl
import subprocess
import threading
import urllib.error
import urllib.request
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from sandbox import protowire
from sandbox.testing import kubectl

HAS_KUBECTL = shutil.which("kubectl") is not None or os.environ.get("PORTAL_REQUIRE_SERVICES") == "1"
needs_kubectl = pytest.mark.skipif(not HAS_KUBECTL, reason="kubectl is not installed")
PB = "application/vnd.kubernetes.protobuf"


# -- a tiny protobuf encoder (the test's own, independent of the decoder) ----------------------------------------

def _varint(n: int) -> bytes:
    n &= (1 << 64) - 1
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def vi(num: int, v: int) -> bytes:
    return _varint(num << 3) + _varint(v)


def ld(num: int, data: bytes | str) -> bytes:
    data = data.encode() if isinstance(data, str) else data
    return _varint(num << 3 | 2) + _varint(len(data)) + data


def msg(num: int, *fields: bytes) -> bytes:
    return ld(num, b"".join(fields))


def entry(num: int, key: str, value: bytes | str) -> bytes:
    return msg(num, ld(1, key), ld(2, value))


def envelope(api_version: str, kind: str, *fields: bytes, encoding: str = "", ctype: str = "") -> bytes:
    return b"k8s\x00" + msg(1, ld(1, api_version), ld(2, kind)) + ld(2, b"".join(fields)) + ld(3, encoding) + ld(4, ctype)


# ObjectMeta as Go writes it: every non-pointer field, empty or not, and an empty creationTimestamp
def meta(name: str, namespace: str = "", *extra: bytes) -> bytes:
    return msg(1, ld(1, name), ld(2, ""), ld(3, namespace), ld(4, ""), ld(5, ""), ld(6, ""), vi(7, 0), msg(8), *extra)


DECODE_CASES = [
    ("namespace-as-go-writes-it",
     envelope("v1", "Namespace", meta("x"), msg(2), msg(3, ld(1, ""))),
     {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "x"}, "spec": {}, "status": {}}),
    ("labels-annotations-finalizers",
     envelope("v1", "ConfigMap", meta("c", "ns", entry(11, "app", "web"), entry(11, "tier", "1"),
                                      entry(12, "note", "é"), ld(14, "a/b"), ld(14, "c/d"))),
     {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {
         "name": "c", "namespace": "ns", "labels": {"app": "web", "tier": "1"}, "annotations": {"note": "é"},
         "finalizers": ["a/b", "c/d"]}}),
    ("configmap-data-binarydata-immutable-false-kept",
     envelope("v1", "ConfigMap", meta("c"), entry(2, "a", "b"), entry(2, "empty", ""), entry(3, "bin", b"\x00\xff"),
              vi(4, 0)),
     {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c"}, "data": {"a": "b", "empty": ""},
      "binaryData": {"bin": "AP8="}, "immutable": False}),
    ("secret-bytes-are-base64",
     envelope("v1", "Secret", meta("s"), entry(2, "k", b"v"), entry(2, "raw", bytes(range(5))), ld(3, "Opaque"),
              entry(4, "plain", "text")),
     {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "s"},
      "data": {"k": "dg==", "raw": base64.b64encode(bytes(range(5))).decode()}, "type": "Opaque",
      "stringData": {"plain": "text"}}),
    ("secret-empty-type-dropped",
     envelope("v1", "Secret", meta("s"), ld(3, "")),
     {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "s"}}),
    ("pointer-zero-kept-omitempty-zero-dropped",
     envelope("apps/v1", "Deployment", meta("d"),
              msg(2, vi(1, 0), vi(5, 0), vi(7, 0), msg(2, entry(1, "app", "d")))),
     {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "d"},
      "spec": {"replicas": 0, "selector": {"matchLabels": {"app": "d"}}}}),
    ("negative-int32-ten-byte-varint-and-required-zero",
     envelope("scheduling.k8s.io/v1", "PriorityClass", meta("p"), vi(2, -5), vi(3, 0), ld(4, "")),
     {"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass", "metadata": {"name": "p"}, "value": -5}),
    ("priorityclass-zero-value-kept",
     envelope("scheduling.k8s.io/v1", "PriorityClass", meta("p"), vi(2, 0)),
     {"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass", "metadata": {"name": "p"}, "value": 0}),
    ("time-and-microtime",
     envelope("events.k8s.io/v1", "Event", meta("e", "ns", msg(9, vi(1, 1700000000))),
              msg(2, vi(1, 1700000000), vi(2, 123456789)), ld(7, "Started")),
     {"apiVersion": "events.k8s.io/v1", "kind": "Event",
      "metadata": {"name": "e", "namespace": "ns", "deletionTimestamp": "2023-11-14T22:13:20Z"},
      "eventTime": "2023-11-14T22:13:20.123456Z", "reason": "Started"}),
    ("intorstring-int-and-string",
     envelope("v1", "Service", meta("s"), msg(2, msg(1, ld(1, "a"), ld(2, "TCP"), vi(3, 80), msg(4, vi(1, 0), vi(2, 8080))),
                                          msg(1, ld(1, "b"), vi(3, 81), msg(4, vi(1, 1), ld(3, "http"))))),
     {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "s"}, "spec": {"ports": [
         {"name": "a", "protocol": "TCP", "port": 80, "targetPort": 8080},
         {"name": "b", "port": 81, "targetPort": "http"}]}}),
    ("quantity-map",
     envelope("v1", "ResourceQuota", meta("q"), msg(2, msg(1, ld(1, "cpu"), msg(2, ld(1, "1500m"))),
                                                msg(1, ld(1, "pods"), msg(2, ld(1, "2"))))),
     {"apiVersion": "v1", "kind": "ResourceQuota", "metadata": {"name": "q"},
      "spec": {"hard": {"cpu": "1500m", "pods": "2"}}}),
    ("inline-struct-joins-parent",
     envelope("networking.k8s.io/v1", "Ingress", meta("i"),
              msg(2, msg(3, ld(1, "foo.com"), msg(2, msg(1, msg(1, ld(1, "/"), ld(3, "Prefix"))))))),
     {"apiVersion": "networking.k8s.io/v1", "kind": "Ingress", "metadata": {"name": "i"},
      "spec": {"rules": [{"host": "foo.com", "http": {"paths": [{"path": "/", "pathType": "Prefix"}]}}]}}),
    ("packed-and-unpacked-repeated-int32",
     # Job.spec.podFailurePolicy.rules[].onExitCodes.values: one packed run, then one unpacked value
     envelope("batch/v1", "Job", meta("j"), msg(2, msg(11, msg(1, ld(1, "FailJob"), msg(2, ld(2, "In"),
                                                                                         ld(3, _varint(1) + _varint(-2)),
                                                                                         vi(3, 3)))))),
     {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "j"}, "spec": {"podFailurePolicy": {"rules": [
         {"action": "FailJob", "onExitCodes": {"operator": "In", "values": [1, -2, 3]}}]}}}),
    ("fieldsv1-raw-json-and-unknown-fields-skipped",
     envelope("v1", "ConfigMap", meta("c", "", msg(17, ld(1, "kubectl"), ld(2, "Update"), ld(6, "FieldsV1"),
                                                    msg(7, ld(1, b'{"f:data":{}}')))), vi(99, 7), ld(98, "junk")),
     {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c", "managedFields": [
         {"manager": "kubectl", "operation": "Update", "fieldsType": "FieldsV1", "fieldsV1": {"f:data": {}}}]}}),
    ("delete-options-under-any-group-version",
     envelope("apps/v1", "DeleteOptions", ld(4, "Foreground"), ld(5, "All")),
     {"apiVersion": "apps/v1", "kind": "DeleteOptions", "propagationPolicy": "Foreground", "dryRun": ["All"]}),
]


@pytest.mark.parametrize("body,expected", [c[1:] for c in DECODE_CASES], ids=[c[0] for c in DECODE_CASES])
def test_decoder_table(body, expected):
    assert protowire.decode_object(body) == expected


ERROR_CASES = [
    ("no-magic", b"\x0a\x00", "magic"),
    ("json-body", b'{"kind": "Namespace"}', "magic"),
    ("length-past-end", b"k8s\x00" + _varint(1 << 3 | 2) + _varint(50) + b"ab", "past the end"),
    ("truncated-varint", b"k8s\x00" + b"\x08\xff", "truncated varint"),
    ("varint-too-long", b"k8s\x00" + b"\x08" + b"\xff" * 11, "longer than 10"),
    ("group-wire-type", b"k8s\x00" + _varint(5 << 3 | 3), "wire type 3"),
    ("string-sent-as-varint", envelope("v1", "ConfigMap", msg(1, vi(1, 5))), "metadata.name"),
    ("invalid-utf8", envelope("v1", "ConfigMap", msg(1, ld(1, b"\xff\xfe"))), "UTF-8"),
    ("gzip-content-encoding", envelope("v1", "ConfigMap", meta("c"), encoding="gzip"), "contentEncoding"),
    ("json-content-type-in-envelope", envelope("v1", "ConfigMap", meta("c"), ctype="application/json"), "contentType"),
]


@pytest.mark.parametrize("body,fragment", [c[1:] for c in ERROR_CASES], ids=[c[0] for c in ERROR_CASES])
def test_decoder_refuses_malformed_bodies(body, fragment):
    with pytest.raises(protowire.ProtobufError) as e:
        protowire.decode_object(body)
    assert fragment in str(e.value)
    assert not isinstance(e.value, protowire.UnsupportedKind)


def test_decoder_names_an_unsupported_kind():
    with pytest.raises(protowire.UnsupportedKind) as e:
        protowire.decode_object(envelope("kueue.x-k8s.io/v1beta2", "ClusterQueue", meta("cq")))
    assert e.value.kind == "ClusterQueue" and "kueue.x-k8s.io/v1beta2, Kind=ClusterQueue" in str(e.value)


@pytest.mark.parametrize("ns,text", [(0, "0s"), (999, "999ns"), (1500, "1.5µs"), (250_000_000, "250ms"),
                                     (1_500_000_000, "1.5s"), (90_000_000_000, "1m30s"), (3_600_000_000_000, "1h0m0s"),
                                     (-2_000_000_000, "-2s")])
def test_go_duration(ns, text):
    assert protowire.go_duration(ns) == text


# -- what the real kubectl sends ---------------------------------------------------------------------------------

GENERATORS = [
    ["create", "namespace", "cap-ns"],
    ["create", "configmap", "cap-cm", "-n", "n1", "--from-literal=a=b", "--from-literal=empty="],
    ["create", "secret", "generic", "cap-sec", "-n", "n1", "--from-literal=user=admin", "--type=Opaque"],
    ["create", "secret", "docker-registry", "cap-reg", "-n", "n1", "--docker-server=r.example",
     "--docker-username=u", "--docker-password=p"],
    ["create", "serviceaccount", "cap-sa", "-n", "n1"],
    ["create", "quota", "cap-q", "-n", "n1", "--hard=cpu=1500m,memory=1Gi,pods=2", "--scopes=NotTerminating"],
    ["create", "priorityclass", "cap-pc", "--value=-7", "--description=low", "--preemption-policy=Never"],
    ["create", "deployment", "cap-d", "-n", "n1", "--image=nginx", "--replicas=0", "--port=80"],
    ["create", "job", "cap-j", "-n", "n1", "--image=busybox", "--", "echo", "hi"],
    ["create", "cronjob", "cap-cj", "-n", "n1", "--image=busybox", "--schedule=*/5 * * * *"],
    ["create", "service", "clusterip", "cap-svc", "-n", "n1", "--tcp=80:8080", "--tcp=81:http"],
    ["create", "poddisruptionbudget", "cap-pdb", "-n", "n1", "--selector=app=x", "--min-available=50%"],
    ["create", "ingress", "cap-ing", "-n", "n1", "--rule=foo.com/bar*=svc:80", "--class=nginx"],
    ["create", "rolebinding", "cap-rb", "-n", "n1", "--role=r", "--serviceaccount=n1:cap-sa", "--user=u"],
    ["create", "clusterrolebinding", "cap-crb", "--clusterrole=cr", "--group=g"],
]


def _drop_nulls(v):
    if isinstance(v, dict):
        return {k: _drop_nulls(x) for k, x in v.items() if x is not None}
    if isinstance(v, list):
        return [_drop_nulls(x) for x in v]
    return v


@needs_kubectl
def test_bodies_kubectl_really_sends_decode_to_its_own_json(tmp_path):
    """Capture each generator's POST on a small local server; its decoding must equal ``--dry-run=client -o json``."""
    captured: list[tuple[str, str, bytes]] = []

    class Capture(BaseHTTPRequestHandler):
        def do_POST(self):
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            captured.append((self.path, self.headers.get("Content-Type", ""), body))
            reply = json.dumps({"kind": "Status", "apiVersion": "v1", "status": "Failure", "message": "captured",
                                "reason": "Forbidden", "code": 403}).encode()
            self.send_response(403)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(reply)))
            self.end_headers()
            self.wfile.write(reply)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Capture)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    env = dict(os.environ, KUBECACHEDIR=str(tmp_path / "cache"))
    base = [shutil.which("kubectl"), "--kubeconfig", os.devnull, "--server", f"http://127.0.0.1:{server.server_port}"]
    (tmp_path / "bin").write_bytes(b"\x00\x01\xfe\xff")
    generators = GENERATORS + [["create", "configmap", "cap-files", "-n", "n1", f"--from-file={tmp_path / 'bin'}",
                                f"--from-file=note.txt={__file__}"],
                               ["create", "secret", "generic", "cap-secfile", "-n", "n1",
                                f"--from-file=key={tmp_path / 'bin'}"]]
    try:
        for args in generators:
            before = len(captured)
            subprocess.run(base + args, capture_output=True, env=env, timeout=60, check=False)
            assert len(captured) == before + 1, f"kubectl {' '.join(args)} posted nothing"
            path, ctype, body = captured[-1]
            assert ctype == PB and body.startswith(b"k8s\x00"), (args, ctype)
            cut = args.index("--") if "--" in args else len(args)
            dry = args[:cut] + ["--dry-run=client", "-o", "json"] + args[cut:]
            expected = json.loads(subprocess.run(base + dry, capture_output=True, env=env, timeout=60, check=True).stdout)
            assert protowire.decode_object(body) == _drop_nulls(expected), args
    finally:
        server.shutdown()
        server.server_close()


# -- the sandbox takes them ------------------------------------------------------------------------------------

def _uid() -> str:
    return uuid.uuid4().hex[:8]


def _get(sb, *args) -> dict:
    return json.loads(kubectl(sb, "get", *args, "-o", "json").stdout)


def _raw(sb, method: str, path: str, body: bytes | None, ctype: str = PB):
    ctx = ssl.create_default_context(cadata=sb.ca_pem.decode()) if sb.ca_pem else None
    req = urllib.request.Request(sb.url + path, data=body, method=method)
    if body is not None:
        req.add_header("Content-Type", ctype)
    req.add_header("Accept", f"{PB},application/json")
    req.add_header("Authorization", f"Bearer {sb.token}")
    try:
        with urllib.request.urlopen(req, timeout=30, context=ctx) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


@pytest.fixture
def pns(sandbox_cluster):
    name = f"pb-{_uid()}"
    assert f"namespace/{name} created" in kubectl(sandbox_cluster, "create", "namespace", name).stdout
    return name


@needs_kubectl
def test_kubectl_create_generators_against_the_sandbox(sandbox_cluster, pns, tmp_path):
    sb, ns = sandbox_cluster, pns
    assert _get(sb, "namespace", ns)["metadata"]["name"] == ns

    kubectl(sb, "create", "configmap", "lit", "-n", ns, "--from-literal=a=b", "--from-literal=c=d e")
    (tmp_path / "bin").write_bytes(b"\x00\xff\x10")
    (tmp_path / "app.conf").write_text("port = 80\n")
    kubectl(sb, "create", "configmap", "files", "-n", ns, f"--from-file={tmp_path / 'app.conf'}",
            f"--from-file=blob={tmp_path / 'bin'}")
    assert _get(sb, "cm", "lit", "-n", ns)["data"] == {"a": "b", "c": "d e"}
    files = _get(sb, "cm", "files", "-n", ns)
    assert files["data"] == {"app.conf": "port = 80\n"} and files["binaryData"] == {"blob": "AP8Q"}

    kubectl(sb, "create", "secret", "generic", "creds", "-n", ns, "--from-literal=user=admin",
            f"--from-file=key={tmp_path / 'bin'}")
    sec = _get(sb, "secret", "creds", "-n", ns)
    assert sec["type"] == "Opaque"
    assert sec["data"] == {"user": base64.b64encode(b"admin").decode(), "key": base64.b64encode(b"\x00\xff\x10").decode()}

    kubectl(sb, "create", "serviceaccount", "runner", "-n", ns)
    assert _get(sb, "serviceaccount", "runner", "-n", ns)["metadata"]["namespace"] == ns

    kubectl(sb, "create", "quota", "q", "-n", ns, "--hard=cpu=2,memory=1Gi,pods=3")
    assert _get(sb, "resourcequota", "q", "-n", ns)["spec"]["hard"] == {"cpu": "2", "memory": "1Gi", "pods": "3"}

    pc = f"pc-{_uid()}"
    kubectl(sb, "create", "priorityclass", pc, "--value=1000", "--description=batch work", "--preemption-policy=Never")
    got = _get(sb, "priorityclass", pc)
    assert (got["value"], got["description"], got["preemptionPolicy"]) == (1000, "batch work", "Never")
    assert not got.get("globalDefault")

    kubectl(sb, "create", "deployment", "web", "-n", ns, "--image=nginx:1.27", "--replicas=0", "--port=80")
    dep = _get(sb, "deployment", "web", "-n", ns)
    assert dep["spec"]["replicas"] == 0  # a pointer's zero survives the wire (not defaulted to 1)
    assert dep["metadata"]["labels"] == {"app": "web"} and dep["spec"]["selector"] == {"matchLabels": {"app": "web"}}
    container = dep["spec"]["template"]["spec"]["containers"][0]
    assert container["image"] == "nginx:1.27" and container["ports"][0]["containerPort"] == 80

    kubectl(sb, "create", "job", "once", "-n", ns, "--image=busybox", "--", "echo", "hi")
    job = _get(sb, "job", "once", "-n", ns)
    assert job["spec"]["template"]["spec"]["containers"][0]["command"] == ["echo", "hi"]
    assert job["spec"]["template"]["spec"]["restartPolicy"] == "Never"

    kubectl(sb, "create", "service", "clusterip", "web", "-n", ns, "--tcp=80:8080")
    assert _get(sb, "service", "web", "-n", ns)["spec"]["ports"][0]["targetPort"] == 8080

    kubectl(sb, "create", "role", "reader", "-n", ns, "--verb=get,list", "--resource=pods")
    assert _get(sb, "role", "reader", "-n", ns)["rules"] == [
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list"]}]
    kubectl(sb, "create", "rolebinding", "reader", "-n", ns, "--role=reader", f"--serviceaccount={ns}:runner")
    rb = _get(sb, "rolebinding", "reader", "-n", ns)
    assert rb["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "reader"}
    assert rb["subjects"] == [{"kind": "ServiceAccount", "name": "runner", "namespace": ns}]
    cr = f"cr-{_uid()}"
    kubectl(sb, "create", "clusterrole", cr, "--verb=get", "--resource=nodes")
    kubectl(sb, "create", "clusterrolebinding", cr, f"--clusterrole={cr}", "--user=jane")
    assert _get(sb, "clusterrolebinding", cr)["subjects"] == [
        {"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": "jane"}]

    kubectl(sb, "create", "poddisruptionbudget", "pdb", "-n", ns, "--selector=app=web", "--min-available=50%")
    assert _get(sb, "pdb", "pdb", "-n", ns)["spec"]["minAvailable"] == "50%"
    kubectl(sb, "create", "ingress", "ing", "-n", ns, "--rule=foo.example/api*=web:80")
    rule = _get(sb, "ingress", "ing", "-n", ns)["spec"]["rules"][0]
    assert rule["host"] == "foo.example" and rule["http"]["paths"][0]["path"] == "/api"


@needs_kubectl
def test_protobuf_creates_go_through_validation_and_conflicts(sandbox_cluster, pns):
    sb, ns = sandbox_cluster, pns
    bad = kubectl(sb, "create", "configmap", "Not_Valid", "-n", ns, "--from-literal=a=b", check=False)
    assert bad.returncode != 0 and "Invalid" in bad.stderr
    kubectl(sb, "create", "configmap", "once", "-n", ns, "--from-literal=a=b")
    dup = kubectl(sb, "create", "configmap", "once", "-n", ns, "--from-literal=a=c", check=False)
    assert dup.returncode != 0 and "already exists" in dup.stderr
    assert _get(sb, "cm", "once", "-n", ns)["data"] == {"a": "b"}
    dry = kubectl(sb, "create", "configmap", "dry", "-n", ns, "--from-literal=a=b", "--dry-run=server")
    assert dry.returncode == 0
    assert kubectl(sb, "get", "cm", "dry", "-n", ns, check=False).returncode != 0


def test_protobuf_put_updates_and_delete_options_are_read(sandbox_cluster, pns):
    sb, ns = sandbox_cluster, pns
    path = f"/api/v1/namespaces/{ns}/configmaps"
    code, created = _raw(sb, "POST", path, envelope("v1", "ConfigMap", meta("pc", ns), entry(2, "a", "1")))
    assert code == 201 and created["data"] == {"a": "1"}
    rv = created["metadata"]["resourceVersion"]
    code, updated = _raw(sb, "PUT", f"{path}/pc",
                         envelope("v1", "ConfigMap", meta("pc", ns, ld(6, rv), entry(11, "x", "y")), entry(2, "a", "2")))
    assert code == 200 and updated["data"] == {"a": "2"} and updated["metadata"]["labels"] == {"x": "y"}
    # a stale resourceVersion is the same 409 as with JSON
    code, status = _raw(sb, "PUT", f"{path}/pc", envelope("v1", "ConfigMap", meta("pc", ns, ld(6, rv)), entry(2, "a", "3")))
    assert code == 409 and status["reason"] == "Conflict"
    # DeleteOptions as protobuf (client-go's typed Delete): a dry run leaves the object
    code, _ = _raw(sb, "DELETE", f"{path}/pc", envelope("v1", "DeleteOptions", ld(5, "All")))
    assert code == 200
    assert _raw(sb, "GET", f"{path}/pc", None)[0] == 200
    code, _ = _raw(sb, "DELETE", f"{path}/pc", envelope("v1", "DeleteOptions", ld(4, "Background")))
    assert code == 200
    assert _raw(sb, "GET", f"{path}/pc", None)[0] == 404


@needs_kubectl
def test_protobuf_refusals_are_clean_statuses(sandbox_cluster, pns):
    sb, ns = sandbox_cluster, pns
    # a kind without a protobuf table (a CRD, as on a real API server): 415 naming it
    code, status = _raw(sb, "POST", "/apis/kueue.x-k8s.io/v1beta2/clusterqueues",
                        envelope("kueue.x-k8s.io/v1beta2", "ClusterQueue", meta(f"cq-{_uid()}")))
    assert code == 415 and status["kind"] == "Status" and status["reason"] == "UnsupportedMediaType"
    assert "Kind=ClusterQueue" in status["message"]
    # malformed: 400 saying so
    code, status = _raw(sb, "POST", f"/api/v1/namespaces/{ns}/configmaps", b"k8s\x00\x0a\x7f")
    assert code == 400 and "could not be decoded as protobuf" in status["message"]
    # the envelope's kind must match the URL, as with JSON
    code, status = _raw(sb, "POST", f"/api/v1/namespaces/{ns}/configmaps", envelope("v1", "Secret", meta("s", ns)))
    assert code == 400 and "kind" in status["message"]
    # another namespace in the body than on the URL
    code, status = _raw(sb, "POST", f"/api/v1/namespaces/{ns}/configmaps", envelope("v1", "ConfigMap", meta("c", "other")))
    assert code == 400 and "namespace" in status["message"]
    # PATCH has no protobuf form: 415 listing the patch types
    _raw(sb, "POST", f"/api/v1/namespaces/{ns}/configmaps", envelope("v1", "ConfigMap", meta("p", ns)))
    code, status = _raw(sb, "PATCH", f"/api/v1/namespaces/{ns}/configmaps/p", envelope("v1", "ConfigMap", meta("p", ns)))
    assert code == 415 and "merge-patch" in status["message"]
    # a DELETE whose protobuf body is not DeleteOptions
    code, status = _raw(sb, "DELETE", f"/api/v1/namespaces/{ns}/configmaps/p", envelope("v1", "ConfigMap", meta("p", ns)))
    assert code == 400 and "DeleteOptions" in status["message"]
    # PUT on the scale subresource stays JSON-only
    kubectl(sb, "create", "deployment", "sc", "-n", ns, "--image=nginx")
    code, status = _raw(sb, "PUT", f"/apis/apps/v1/namespaces/{ns}/deployments/sc/scale",
                        envelope("autoscaling/v1", "Scale", meta("sc", ns)))
    assert code == 415 and status["reason"] == "UnsupportedMediaType"
