"""HTTP front end of the sandbox cluster: a loopback server speaking enough of the Kubernetes API for
``kubectl`` 1.32 and the official ``kubernetes`` Python client (sandbox/README.md, "What clients expect").

Stdlib only: ``http.server.ThreadingHTTPServer`` with HTTP/1.1 keep-alive, one thread per connection.
Watches are streamed with chunked transfer encoding, one JSON event per line.
"""

from __future__ import annotations

import collections
import contextlib
import hmac
import json
import re
import select
import socket
import threading
import time
from datetime import datetime, UTC
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, unquote, urlsplit

import yaml

from . import discovery, protowire
from .faults import REASONS, Faults
from .openapi import OpenAPI

from .store import ApiError

LOG_ANNOTATION = "sandbox.gpuportal.dev/log"
PROTOBUF_TYPES = ("application/vnd.kubernetes.protobuf", "application/cbor", "application/apply-patch+cbor")
PATCH_TYPES = {
    "application/json-patch+json": "json",
    "application/merge-patch+json": "merge",
    "application/strategic-merge-patch+json": "strategic",
    "application/apply-patch+yaml": "apply",
}
CRD_PATCH_TYPES = "application/json-patch+json, application/merge-patch+json, application/apply-patch+yaml"
ALL_PATCH_TYPES = CRD_PATCH_TYPES + ", application/strategic-merge-patch+json"
NOT_FOUND_MSG = "the server could not find the requested resource"
PUBLIC_PATHS = frozenset({"/healthz", "/readyz", "/livez", "/version"})
BOOKMARK_INTERVAL_S = 5.0  # idle time before a BOOKMARK is sent on watches that allow them


class _YamlLoader(getattr(yaml, "CSafeLoader", yaml.SafeLoader)):  # type: ignore[misc]
    """Safe loader that keeps timestamps as strings (Kubernetes objects carry RFC 3339 strings)."""


_YamlLoader.yaml_implicit_resolvers = {
    k: [(tag, rx) for tag, rx in v if tag != "tag:yaml.org,2002:timestamp"]
    for k, v in _YamlLoader.yaml_implicit_resolvers.copy().items()
}


def status_body(code: int, reason: str, message: str, details: dict | None = None) -> dict:
    body = {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure", "message": message,
            "reason": reason, "code": code}
    if details:
        body["details"] = details
    return body


def _dumps(obj) -> bytes:
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode()


def _truthy(v: str | None) -> bool:
    return v is not None and v.lower() in ("true", "1", "yes")


class _Reply(Exception):
    """Raised inside a handler to answer at once with a Status."""

    def __init__(self, code: int, message: str, reason: str | None = None, details: dict | None = None,
                 retry_after: int | None = None):
        super().__init__(message)
        self.code, self.message = code, message
        self.reason = reason or REASONS.get(code, "InternalError" if code >= 500 else "BadRequest")
        self.details, self.retry_after = details, retry_after


class _DupKeyError(ValueError):
    pass


def _pairs_no_dup(pairs):
    d = {}
    for k, v in pairs:
        if k in d:
            raise _DupKeyError(k)
        d[k] = v
    return d


# ---------------------------------------------------------------------------------------------------------
# Tables (kubectl get human-readable output)
# ---------------------------------------------------------------------------------------------------------

def human_duration(seconds: float) -> str:
    """k8s.io/apimachinery/pkg/util/duration.HumanDuration."""
    s = int(seconds)
    if s < 0:
        return "<invalid>" if s < -1 else "0s"
    if s < 120:
        return f"{s}s"
    m = s // 60
    if m < 10:
        return f"{m}m{s % 60}s" if s % 60 else f"{m}m"
    if m < 180:
        return f"{m}m"
    h = s // 3600
    if h < 8:
        return f"{h}h{(s % 3600) // 60}m" if (s % 3600) // 60 else f"{h}h"
    if h < 48:
        return f"{h}h"
    if h < 24 * 8:
        return f"{h // 24}d{h % 24}h" if h % 24 else f"{h // 24}d"
    if h < 24 * 365 * 2:
        return f"{h // 24}d"
    if h < 24 * 365 * 8:
        y = h // (24 * 365)
        d = (h // 24) % 365
        return f"{y}y{d}d" if d else f"{y}y"
    return f"{h // (24 * 365)}y"


def _parse_ts(v) -> datetime | None:
    if not isinstance(v, str) or not v:
        return None
    try:
        return datetime.fromisoformat(v.replace("Z", "+00:00"))
    except ValueError:
        return None


_JP_TOKEN = re.compile(r"\.([A-Za-z0-9_\-]+)|\[(\d+)\]|\[\?\(@\.([A-Za-z0-9_.\-]+)\s*==\s*['\"]([^'\"]*)['\"]\)\]|\[\*\]")


_LOG_PREFIX = re.compile(r"^(\d{4}-\d\d-\d\d[ T]\d\d:\d\d:\d\d(?:\.\d+)?Z?) ")


def _log_time(line: str) -> datetime | None:
    """The runtime timestamp a stored log line starts with (simulated time), or None."""
    m = _LOG_PREFIX.match(line)
    if not m:
        return None
    return _parse_ts(m.group(1).replace(" ", "T") + ("" if m.group(1).endswith("Z") else "Z"))


def _log_text(line: str) -> str:
    m = _LOG_PREFIX.match(line)
    return line[m.end():] if m else line


def _stand_in_page(namespace: str, service: str, pod: str, path: str) -> bytes:
    from html import escape

    title = f"Notebook of {service}"
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>{escape(title)} (sandbox)</title></head>
<body>
<h1>{escape(title)}</h1>
<p id="stand-in">This is the sandbox cluster's stand-in for the notebook of {escape(service)} in namespace
<code>{escape(namespace)}</code>, served by pod <code>{escape(pod)}</code>: no JupyterLab runs in the sandbox.</p>
<p>Path asked for: <code id="path">{escape(path)}</code></p>
<form method="post" action="api/kernels/echo">
<label for="code">Code for the echo kernel</label> <input id="code" name="code" value="print('hello')">
<button type="submit">Run</button>
</form>
</body></html>
""".encode()


def jsonpath(obj, path: str):
    """Tiny JSONPath subset used by CRD printer columns: .a.b, [0], [*], [?(@.x=='y')]. Returns a list of matches."""
    path = path.strip()
    if path.startswith("{") and path.endswith("}"):
        path = path[1:-1]
    if path.startswith("$"):
        path = path[1:]
    cur = [obj]
    pos = 0
    while pos < len(path):
        m = _JP_TOKEN.match(path, pos)
        if not m:
            return []
        pos = m.end()
        nxt = []
        for c in cur:
            if m.group(1) is not None:
                if isinstance(c, dict) and m.group(1) in c:
                    nxt.append(c[m.group(1)])
            elif m.group(2) is not None:
                i = int(m.group(2))
                if isinstance(c, list) and i < len(c):
                    nxt.append(c[i])
            elif m.group(3) is not None:
                if isinstance(c, list):
                    for item in c:
                        val = item
                        for part in m.group(3).split("."):
                            val = val.get(part) if isinstance(val, dict) else None
                        if val is not None and str(val) == m.group(4):
                            nxt.append(item)
            elif isinstance(c, list):
                nxt.extend(c)
            elif isinstance(c, dict):
                nxt.extend(c.values())
        cur = nxt
    return cur


def _cond(obj, ctype):
    for c in (obj.get("status") or {}).get("conditions") or []:
        if c.get("type") == ctype:
            return c.get("status")
    return None


def _pod_cells(o, now):
    st = o.get("status") or {}
    spec = o.get("spec") or {}
    cs = st.get("containerStatuses") or []
    total = len(spec.get("containers") or []) or len(cs)
    ready = sum(1 for c in cs if c.get("ready"))
    status = st.get("reason") or st.get("phase") or "Pending"
    if (o.get("metadata") or {}).get("deletionTimestamp"):
        status = "Terminating"
    restarts = sum(int(c.get("restartCount") or 0) for c in cs)
    return [f"{ready}/{total}", status, restarts]


def _node_cells(o, now):
    ready = _cond(o, "Ready")
    status = "Ready" if ready == "True" else "NotReady"
    if (o.get("spec") or {}).get("unschedulable"):
        status += ",SchedulingDisabled"
    labels = (o.get("metadata") or {}).get("labels") or {}
    roles = sorted(k.split("/", 1)[1] for k in labels if k.startswith("node-role.kubernetes.io/")) or ["<none>"]
    version = ((o.get("status") or {}).get("nodeInfo") or {}).get("kubeletVersion") or ""
    return [status, ",".join(roles)], [version]


_BUILTIN_COLUMNS = {
    ("", "Pod"): ([("Ready", "string"), ("Status", "string"), ("Restarts", "integer")], _pod_cells),
    ("", "Namespace"): ([("Status", "string")], lambda o, now: [(o.get("status") or {}).get("phase") or "Active"]),
    ("", "ConfigMap"): ([("Data", "integer")], lambda o, now: [len(o.get("data") or {}) + len(o.get("binaryData") or {})]),
    ("", "Secret"): ([("Type", "string"), ("Data", "integer")],
                     lambda o, now: [o.get("type") or "Opaque", len(o.get("data") or {})]),
    ("apps", "Deployment"): ([("Ready", "string"), ("Up-to-date", "integer"), ("Available", "integer")],
                             lambda o, now: [f"{(o.get('status') or {}).get('readyReplicas', 0)}/{(o.get('spec') or {}).get('replicas', 1)}",
                                             (o.get("status") or {}).get("updatedReplicas", 0),
                                             (o.get("status") or {}).get("availableReplicas", 0)]),
    ("apps", "StatefulSet"): ([("Ready", "string")],
                              lambda o, now: [f"{(o.get('status') or {}).get('readyReplicas', 0)}/{(o.get('spec') or {}).get('replicas', 1)}"]),
    ("batch", "Job"): ([("Status", "string"), ("Completions", "string")],
                       lambda o, now: ["Complete" if _cond(o, "Complete") == "True" else "Failed" if _cond(o, "Failed") == "True"
                                       else "Suspended" if (o.get("spec") or {}).get("suspend") else "Running",
                                       f"{(o.get('status') or {}).get('succeeded', 0)}/{(o.get('spec') or {}).get('completions', 1)}"]),
}


class TableBuilder:
    """Converts objects to meta.k8s.io/v1 Tables the way the apiserver does (CRD additionalPrinterColumns)."""

    def __init__(self, now_fn):
        self.now_fn = now_fn

    def columns(self, rt) -> list[dict]:
        cols = [{"name": "Name", "type": "string", "format": "name", "description": "Name must be unique within a namespace.",
                 "priority": 0}]
        pcs = getattr(rt, "printer_columns", ()) or ()
        if getattr(rt, "crd", False) and pcs:
            for pc in pcs:
                cols.append({"name": pc.get("name", ""), "type": pc.get("type", "string"), "format": pc.get("format", ""),
                             "description": pc.get("description", ""), "priority": int(pc.get("priority", 0))})
            return cols
        if rt.kind == "Node" and rt.group == "":
            cols += [{"name": "Status", "type": "string", "format": "", "description": "", "priority": 0},
                     {"name": "Roles", "type": "string", "format": "", "description": "", "priority": 0},
                     {"name": "Age", "type": "string", "format": "", "description": "", "priority": 0},
                     {"name": "Version", "type": "string", "format": "", "description": "", "priority": 0}]
            return cols
        extra = _BUILTIN_COLUMNS.get((rt.group, rt.kind))
        if extra:
            cols += [{"name": n, "type": t, "format": "", "description": "", "priority": 0} for n, t in extra[0]]
        cols.append({"name": "Age", "type": "string", "format": "", "description": "", "priority": 0})
        return cols

    def cells(self, rt, obj: dict, now: datetime) -> list:
        meta = obj.get("metadata") or {}
        out: list = [meta.get("name", "")]
        pcs = getattr(rt, "printer_columns", ()) or ()
        if getattr(rt, "crd", False) and pcs:
            for pc in pcs:
                found = jsonpath(obj, pc.get("jsonPath", ""))
                val = found[0] if found else None
                if pc.get("type") == "date":
                    ts = _parse_ts(val)
                    val = human_duration((now - ts).total_seconds()) if ts else "<unknown>"
                elif val is None:
                    val = None
                elif isinstance(val, (dict, list)):
                    val = json.dumps(val, separators=(",", ":"))
                out.append(val)
            return out
        age = "<unknown>"
        ts = _parse_ts(meta.get("creationTimestamp"))
        if ts:
            age = human_duration((now - ts).total_seconds())
        if rt.kind == "Node" and rt.group == "":
            first, last = _node_cells(obj, now)
            return out + first + [age] + last
        extra = _BUILTIN_COLUMNS.get((rt.group, rt.kind))
        if extra:
            out += extra[1](obj, now)
        out.append(age)
        return out

    def table(self, rt, objs: list[dict], list_meta: dict | None, include: str = "Metadata", with_columns: bool = True) -> dict:
        now = self.now_fn()
        rows = []
        for o in objs:
            row = {"cells": self.cells(rt, o, now)}
            if include == "Object":
                row["object"] = o
            elif include != "None":
                m = o.get("metadata") or {}
                pm = {k: m[k] for k in ("name", "namespace", "uid", "resourceVersion", "creationTimestamp", "labels",
                                        "annotations", "deletionTimestamp", "generation", "ownerReferences") if k in m}
                row["object"] = {"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1", "metadata": pm}
            rows.append(row)
        return {"kind": "Table", "apiVersion": "meta.k8s.io/v1", "metadata": dict(list_meta or {}),
                "columnDefinitions": self.columns(rt) if with_columns else [], "rows": rows}


# ---------------------------------------------------------------------------------------------------------
# TLS (kubectl only sends bearer tokens over https: client-go clientcmd drops auth info for http servers)
# ---------------------------------------------------------------------------------------------------------

def make_tls_material(hosts: tuple[str, ...] = ("127.0.0.1", "localhost")) -> tuple[bytes, bytes, bytes]:
    """A throwaway CA and a server certificate signed by it: (ca_pem, cert_pem, key_pem)."""
    import datetime as _dt
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    now = _dt.datetime.now(_dt.UTC) - _dt.timedelta(hours=1)
    until = now + _dt.timedelta(days=3650)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "sandbox-ca")])
    ca_ski = x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key())
    ca = (
        x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name).public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number()).not_valid_before(now).not_valid_after(until)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(x509.KeyUsage(digital_signature=True, content_commitment=False, key_encipherment=False,
                                     data_encipherment=False, key_agreement=False, key_cert_sign=True, crl_sign=True,
                                     encipher_only=False, decipher_only=False), critical=True)
        .add_extension(ca_ski, critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    sans: list = []
    for h in hosts:
        try:
            sans.append(x509.IPAddress(ipaddress.ip_address(h)))
        except ValueError:
            sans.append(x509.DNSName(h))
    cert = (
        x509.CertificateBuilder().subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "sandbox-apiserver")]))
        .issuer_name(ca_name).public_key(key.public_key()).serial_number(x509.random_serial_number())
        .not_valid_before(now).not_valid_after(until)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.KeyUsage(digital_signature=True, content_commitment=False, key_encipherment=True,
                                     data_encipherment=False, key_agreement=False, key_cert_sign=False, crl_sign=False,
                                     encipher_only=False, decipher_only=False), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(x509.SubjectAlternativeName(sans), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(ca_ski), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    pem = serialization.Encoding.PEM
    key_pem = key.private_bytes(pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    return ca.public_bytes(pem), cert.public_bytes(pem), key_pem


def make_ssl_context(cert_pem: bytes, key_pem: bytes):
    import os
    import ssl
    import tempfile

    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.set_alpn_protocols(["http/1.1"])
    fd, path = tempfile.mkstemp(suffix=".pem")
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(cert_pem + b"\n" + key_pem)
        ctx.load_cert_chain(path)
    finally:
        os.unlink(path)
    return ctx


# ---------------------------------------------------------------------------------------------------------
# The server
# ---------------------------------------------------------------------------------------------------------

class _HTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 128

    def __init__(self, addr, handler, owner: SandboxServer):
        self.owner = owner
        super().__init__(addr, handler)

    def handle_error(self, request, client_address):  # quiet: clients drop connections all the time
        pass

    def finish_request(self, request, client_address):
        """Runs in the connection's thread: sniff a TLS ClientHello and wrap the socket (http and https share the port)."""
        ctx = self.owner.ssl_context
        if ctx is not None:
            try:
                request.settimeout(10)
                first = request.recv(1, socket.MSG_PEEK)
                if first == b"\x16":
                    request = ctx.wrap_socket(request, server_side=True)
                request.settimeout(None)
            except OSError:
                return
        self.RequestHandlerClass(request, client_address, self)


class SandboxServer:
    """Owns the listening socket, the open connections and the watch streams.

    ``hooks`` (optional) provides ``advance(seconds) -> dict``, ``tick() -> dict`` and ``restart()`` for the
    ``/sandbox/*`` control endpoints (the ``Sandbox`` app passes itself).
    """

    def __init__(self, store, *, host: str = "127.0.0.1", port: int = 0, token: str | None = None,
                 faults: Faults | None = None, clock=None, logs: dict | None = None, hooks=None, tls: bool = True):
        self.store = store
        self.ssl_context = None
        self.ca_pem: bytes | None = None
        if tls:
            self.ca_pem, cert_pem, key_pem = make_tls_material((host, "localhost"))
            self.ssl_context = make_ssl_context(cert_pem, key_pem)
        self.registry = store.registry
        self.host = host
        self.port = port
        self.token = token
        self.faults = faults or Faults()
        self.clock = clock
        self.logs = logs if logs is not None else {}
        self.hooks = hooks
        self.openapi = OpenAPI(self.registry)
        self.tables = TableBuilder(self.now)
        self._httpd: _HTTPServer | None = None
        self._thread: threading.Thread | None = None
        self._conns: set[socket.socket] = set()
        self._conns_lock = threading.Lock()
        self._stopping = threading.Event()
        self._restart_lock = threading.Lock()
        self._discovery_cache: dict[str, bytes] = {}
        self.requests_served = 0
        # The last requests as they arrived (method, path as sent, before any decoding), for tests that must show
        # where a request went (GET /sandbox/requests).
        self.seen: collections.deque[tuple[str, str]] = collections.deque(maxlen=20000)
        self.bookmark_interval = BOOKMARK_INTERVAL_S

    # -- lifecycle ------------------------------------------------------------------------------------------
    @property
    def url(self) -> str:
        """The URL clients should use: https when TLS is on (kubectl sends tokens only over https)."""
        return f"{'https' if self.ssl_context is not None else 'http'}://{self.host}:{self.port}"

    @property
    def http_url(self) -> str:
        """Plain-http URL of the same port (handy for curl/requests; kubectl will not send the token to it)."""
        return f"http://{self.host}:{self.port}"

    def now(self) -> datetime:
        if self.clock is not None:
            return self.clock.now()
        return datetime.now(UTC)

    def start(self) -> None:
        self._stopping = threading.Event()
        self._httpd = _HTTPServer((self.host, self.port), _Handler, self)
        self.port = self._httpd.server_address[1]
        self._thread = threading.Thread(target=self._httpd.serve_forever, kwargs={"poll_interval": 0.1},
                                        name=f"sandbox-http-{self.port}", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stopping.set()
        httpd, self._httpd = self._httpd, None
        if httpd is not None:
            httpd.shutdown()
            httpd.server_close()
        self._close_connections()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None

    def restart(self) -> None:
        """Simulated crash and restart: drop every connection and watch, listen again on the same port."""
        with self._restart_lock:
            self.stop()
            deadline = time.monotonic() + 5
            while True:
                try:
                    self.start()
                    return
                except OSError:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.05)

    def _close_connections(self) -> None:
        with self._conns_lock:
            conns = list(self._conns)
            self._conns.clear()
        for s in conns:
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)

    def _track(self, sock: socket.socket, add: bool) -> None:
        with self._conns_lock:
            if add:
                self._conns.add(sock)
            else:
                self._conns.discard(sock)

    # -- cached discovery bodies ------------------------------------------------------------------------------
    def discovery_body(self, path: str) -> bytes | None:
        body = self._discovery_cache.get(path)
        if body is not None:
            return body
        reg = self.registry
        doc = None
        if path == "/version":
            doc = discovery.VERSION_INFO
        elif path == "/api":
            doc = discovery.api_versions()
        elif path == "/apis":
            doc = discovery.api_group_list(reg)
        else:
            parts = path.strip("/").split("/")
            if parts[0] == "api" and len(parts) == 2:
                doc = discovery.resource_list(reg, "", parts[1])
            elif parts[0] == "apis" and len(parts) == 2:
                doc = discovery.api_group(reg, parts[1])
            elif parts[0] == "apis" and len(parts) == 3:
                doc = discovery.resource_list(reg, parts[1], parts[2])
        if doc is None:
            return None
        body = _dumps(doc)
        self._discovery_cache[path] = body
        return body


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "sandbox-apiserver"
    sys_version = ""
    server: _HTTPServer

    # -- plumbing -------------------------------------------------------------------------------------------------
    def setup(self):
        super().setup()
        with contextlib.suppress(OSError):
            self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.owner = self.server.owner
        self.owner._track(self.connection, True)

    def finish(self):
        try:
            super().finish()
        finally:
            self.owner._track(self.connection, False)

    def log_message(self, format, *args):
        pass

    def do_GET(self):
        self._dispatch("GET")

    def do_POST(self):
        self._dispatch("POST")

    def do_PUT(self):
        self._dispatch("PUT")

    def do_PATCH(self):
        self._dispatch("PATCH")

    def do_DELETE(self):
        self._dispatch("DELETE")

    def do_HEAD(self):
        self._dispatch("HEAD")

    def _read_body(self) -> bytes:
        te = (self.headers.get("Transfer-Encoding") or "").lower()
        if "chunked" in te:
            chunks = []
            while True:
                line = self.rfile.readline()
                size = int(line.split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass
                    break
                chunks.append(self.rfile.read(size))
                self.rfile.readline()
            return b"".join(chunks)
        n = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(n) if n > 0 else b""

    def _send(self, code: int, body: bytes, ctype: str = "application/json", headers: list[tuple[str, str]] | None = None):
        try:
            phrase = HTTPStatus(code).phrase
        except ValueError:
            phrase = ""
        head = [f"HTTP/1.1 {code} {phrase}", f"Content-Type: {ctype}", f"Content-Length: {len(body)}",
                "Cache-Control: no-cache, private"]
        if headers:
            head.extend(f"{k}: {v}" for k, v in headers)
        if self.close_connection:
            head.append("Connection: close")
        data = ("\r\n".join(head) + "\r\n\r\n").encode("latin-1", "replace")
        if self.command != "HEAD":
            data += body
        self.wfile.write(data)
        self.owner.requests_served += 1

    def _send_json(self, code: int, obj, headers=None):
        self._send(code, _dumps(obj), "application/json", headers)

    def _send_status(self, code: int, message: str, reason: str | None = None, details: dict | None = None,
                     retry_after: int | None = None, headers=None):
        reason = reason or REASONS.get(code, "InternalError" if code >= 500 else "BadRequest")
        hdrs = list(headers or [])
        if retry_after is not None:
            hdrs.append(("Retry-After", str(retry_after)))
        self._send_json(code, status_body(code, reason, message, details), hdrs)

    def _send_api_error(self, e, headers=None):
        hdrs = list(headers or [])
        ra = getattr(e, "retry_after", None)
        if ra is not None:
            hdrs.append(("Retry-After", str(ra)))
        try:
            body = e.status()
        except Exception:  # pragma: no cover - defensive
            body = status_body(getattr(e, "code", 500), getattr(e, "reason", "InternalError"), str(e))
        self._send_json(int(body.get("code") or getattr(e, "code", 500)), body, hdrs)

    # -- dispatch ------------------------------------------------------------------------------------------------
    def _dispatch(self, method: str):
        owner = self.owner
        try:
            body = self._read_body()
        except (ValueError, OSError):
            self.close_connection = True
            return
        self.method = method
        self.body = body
        self.warnings = []
        parts = urlsplit(self.path)
        self.rawpath = parts.path
        if not self.rawpath.startswith("/sandbox/"):
            owner.seen.append((method, self.rawpath))
        self.query = {k: v[-1] for k, v in parse_qs(parts.query, keep_blank_values=True).items()}
        try:
            path = self.rawpath
            # token "" or None: no authentication; health and version are public, as with system:public-info-viewer
            if path.startswith(("/dcgm/", "/prometheus/")) and getattr(owner.hooks, "dcgm", None) is not None:
                return self._metrics(method, path)  # public, as an exporter and an in-cluster Prometheus are
            if owner.token and path not in PUBLIC_PATHS and not self._authorized():
                raise _Reply(401, "Unauthorized", "Unauthorized")
            if path.startswith("/sandbox/"):
                return self._control(method, path)
            if path in ("/healthz", "/readyz", "/livez"):
                return self._send(200, b"ok", "text/plain; charset=utf-8")
            if path == "/openapi/v3" or path.startswith("/openapi/"):
                return self._openapi(method, path)
            segs = [unquote(s) for s in path.strip("/").split("/")] if path.strip("/") else []
            is_resource = (len(segs) >= 3 and segs[0] == "api") or (len(segs) >= 4 and segs[0] == "apis")
            if not is_resource:
                if method not in ("GET", "HEAD"):
                    raise _Reply(405 if path in ("/api", "/apis", "/version") else 404,
                                 NOT_FOUND_MSG if path not in ("/api", "/apis", "/version") else f"{method} is not allowed")
                disc = owner.discovery_body(path.rstrip("/") or "/")
                if disc is None:
                    if path in ("/", ""):
                        return self._send_json(200, {"paths": ["/api", "/api/v1", "/apis", "/openapi/v3", "/version"]})
                    raise _Reply(404, NOT_FOUND_MSG)
                return self._send(200, disc)
            # an API request: apply faults
            faults = owner.faults
            lat = faults.latency_s
            if lat > 0:
                time.sleep(lat)
            err = faults.roll()
            if err is not None:
                hdrs = [("Retry-After", str(err.retry_after))] if err.retry_after is not None else None
                return self._send_json(err.code, status_body(err.code, err.reason, err.message,
                                                             {"retryAfterSeconds": err.retry_after} if err.retry_after else None),
                                       hdrs)
            if len(segs) >= 7 and segs[:3] == ["api", "v1", "namespaces"] and segs[4] == "services" and segs[6] == "proxy":
                return self._service_proxy(method, segs[3], segs[5], "/".join(self.rawpath.split("/")[8:]))
            return self._resource(method, segs)
        except _Reply as r:
            self._send_status(r.code, r.message, r.reason, r.details, r.retry_after)
        except ApiError as e:
            self._send_api_error(e, self._warning_headers())
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True
        except Exception as e:
            import traceback

            traceback.print_exc()
            try:
                self._send_status(500, f"Internal error occurred: {type(e).__name__}: {e}", "InternalError")
            except OSError:
                self.close_connection = True

    def _authorized(self) -> bool:
        auth = self.headers.get("Authorization") or ""
        if auth[:7].lower() == "bearer ":
            return hmac.compare_digest(auth[7:].strip().encode(), self.owner.token.encode())
        return False

    def _metrics(self, method: str, path: str):
        """The simulated DCGM exporters and Prometheus query API (``sandbox/dcgm.py``)."""
        params = dict(self.query)
        if method == "POST" and self.body:
            params.update({k: v[-1] for k, v in parse_qs(self.body.decode("utf-8", "replace")).items()})
        code, body, ctype = self.owner.hooks.dcgm.handle(method, path, params)
        return self._send(code, body, ctype)

    # -- control endpoints ------------------------------------------------------------------------------------------
    def _control(self, method: str, path: str):
        owner = self.owner
        hooks = owner.hooks
        name = path[len("/sandbox/"):].strip("/")
        payload = self._json_body(allow_empty=True) if self.body else {}
        if name == "faults":
            if method == "GET":
                return self._send_json(200, owner.faults.get())
            if method in ("PUT", "POST", "PATCH"):
                try:
                    cfg = owner.faults.update(payload) if method == "PATCH" else owner.faults.replace(payload)
                except (ValueError, TypeError) as e:
                    raise _Reply(400, str(e)) from None
                return self._send_json(200, cfg)
            raise _Reply(405, f"{method} is not allowed on /sandbox/faults")
        if method != "POST" and name in ("advance", "tick", "restart"):
            raise _Reply(405, f"{method} is not allowed on /sandbox/{name}")
        if name == "advance":
            try:
                seconds = float((payload or {}).get("seconds", 0))
            except (TypeError, ValueError, AttributeError):
                raise _Reply(400, "body must be {\"seconds\": N}") from None
            if hooks is None:
                raise _Reply(503, "no clock/controllers attached", "ServiceUnavailable")
            return self._send_json(200, hooks.advance(seconds))
        if name == "tick":
            if hooks is None:
                raise _Reply(503, "no controllers attached", "ServiceUnavailable")
            return self._send_json(200, hooks.tick())
        if name == "restart":
            self.close_connection = True
            self._send_json(200, {"restarting": True, "port": owner.port})
            restart = hooks.restart if hooks is not None else owner.restart
            threading.Thread(target=restart, name="sandbox-restart", daemon=True).start()
            return None
        if name == "requests" and method == "GET":
            return self._send_json(200, {"requests": [{"method": m, "path": p} for m, p in list(owner.seen)]})
        if name == "state" and method == "GET":
            state = getattr(hooks, "state_data", None)
            return self._send_json(200, state() if state is not None else owner.store.dump())
        raise _Reply(404, NOT_FOUND_MSG)

    # -- openapi -------------------------------------------------------------------------------------------------
    def _openapi(self, method: str, path: str):
        if method not in ("GET", "HEAD"):
            raise _Reply(405, f"{method} is not allowed")
        if path.rstrip("/") == "/openapi/v3":
            return self._send(200, self.owner.openapi.index())
        if path.startswith("/openapi/v3/"):
            doc = self.owner.openapi.document(path[len("/openapi/v3/"):])
            if doc is not None:
                return self._send(200, doc)
        raise _Reply(404, NOT_FOUND_MSG)

    # -- request helpers ----------------------------------------------------------------------------------------------
    def _content_type(self) -> str:
        return (self.headers.get("Content-Type") or "application/json").split(";")[0].strip().lower()

    def _is_protobuf(self) -> bool:
        return self._content_type() == protowire.MEDIA_TYPE

    def _protobuf_object(self) -> dict:
        """A ``k8s\\x00`` + ``runtime.Unknown`` body of a built-in kind, decoded into its JSON form (sandbox/protowire.py)."""
        if not self.body:
            raise _Reply(400, "the body of the request was empty")
        try:
            return protowire.decode_object(self.body)
        except protowire.UnsupportedKind as e:
            raise _Reply(415, "the body of the request was in an unknown format - accepted media types include: "
                              f"application/json, application/yaml ({e})", "UnsupportedMediaType") from None
        except protowire.ProtobufError as e:
            raise _Reply(400, f"the body of the request could not be decoded as protobuf: {e}") from None

    def _json_body(self, allow_empty: bool = False, strict_dups: bool = False):
        ctype = self._content_type()
        if ctype in PROTOBUF_TYPES or ctype.startswith("application/vnd.kubernetes.protobuf"):
            raise _Reply(415, "the body of the request was in an unknown format - accepted media types include: "
                              "application/json, application/yaml", "UnsupportedMediaType")
        if not self.body:
            if allow_empty:
                return None
            raise _Reply(400, "the body of the request was empty")
        raw = self.body
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            raise _Reply(400, "the body of the request is not valid UTF-8") from None
        if ctype in ("application/yaml", "application/apply-patch+yaml") and text.lstrip()[:1] not in ("{", "["):
            try:
                return yaml.load(text, Loader=_YamlLoader)
            except yaml.YAMLError as e:
                raise _Reply(400, f"error converting YAML to JSON: {e}") from None
        try:
            if strict_dups:
                return json.loads(text, object_pairs_hook=_pairs_no_dup)
            return json.loads(text)
        except _DupKeyError as e:
            raise _Reply(400, f"strict decoding error: json: duplicate field \"{e.args[0]}\"") from None
        except json.JSONDecodeError as e:
            if ctype == "application/apply-patch+yaml":
                try:
                    return yaml.load(text, Loader=_YamlLoader)
                except yaml.YAMLError:
                    pass
            raise _Reply(400, f"couldn't get version/kind; json parse error: {e}") from None

    def _warning_headers(self) -> list[tuple[str, str]]:
        warns = getattr(self, "warnings", None) or []
        out = []
        for warning in warns:
            w = str(warning).replace("\\", "\\\\").replace('"', '\\"').replace("\n", " ")
            out.append(("Warning", f'299 - "{w}"'))
        return out

    def _wants_table(self) -> bool:
        """kubectl's human-readable output asks for ``application/json;as=Table;v=v1;g=meta.k8s.io`` (we answer v1)."""
        accept = self.headers.get("Accept") or ""
        if "as=Table" not in accept:
            return False
        return any("as=Table" in part and "g=meta.k8s.io" in part for part in accept.replace(" ", "").split(","))

    def _dry_run(self) -> bool:
        return self.query.get("dryRun", "") == "All"

    def _field_validation(self) -> str:
        fv = self.query.get("fieldValidation") or "Warn"
        if fv not in ("Strict", "Warn", "Ignore"):
            raise _Reply(400, f"fieldValidation must be one of Ignore, Warn, Strict, got \"{fv}\"")
        return fv

    # -- resources ------------------------------------------------------------------------------------------------------
    def _resolve(self, segs: list[str]):
        """-> (rt, namespace, name, subresource)."""
        reg = self.owner.registry
        if segs[0] == "api":
            group, version, rest = "", segs[1], segs[2:]
        else:
            group, version, rest = segs[1], segs[2], segs[3:]
        namespace = name = sub = None
        if rest and rest[0] == "watch":
            raise _Reply(404, NOT_FOUND_MSG)  # legacy /watch/ paths are not served
        if len(rest) >= 3 and rest[0] == "namespaces" and not (
            group == "" and len(rest) == 3 and rest[2] in ("status", "finalize")
        ):
            namespace, plural, rest = rest[1], rest[2], rest[3:]
        else:
            plural, rest = rest[0], rest[1:]
        if len(rest) > 2:
            raise _Reply(404, NOT_FOUND_MSG)
        if rest:
            name = rest[0]
        if len(rest) == 2:
            sub = rest[1]
        try:
            rt = reg.by_plural(group, version, plural)
        except KeyError:
            raise _Reply(404, NOT_FOUND_MSG) from None
        if namespace is not None and not rt.namespaced:
            raise _Reply(404, NOT_FOUND_MSG)
        if rt.namespaced and name is not None and namespace is None:
            raise _Reply(404, NOT_FOUND_MSG)
        if sub is not None and sub not in discovery.subresources_of(rt):
            raise _Reply(404, NOT_FOUND_MSG)
        return rt, namespace, name, sub

    def _resource(self, method: str, segs: list[str]):
        rt, namespace, name, sub = self._resolve(segs)
        self.warnings = []
        store = self.owner.store
        q = self.query
        if method in ("GET", "HEAD"):
            if name is None:
                if _truthy(q.get("watch")):
                    return self._watch(rt, namespace)
                return self._list(rt, namespace)
            if sub == "log":
                return self._pod_log(rt, namespace, name)
            if sub == "scale":
                return self._send_json(200, store.get_scale(rt.api_version, rt.kind, name, namespace))
            obj = store.get(rt.api_version, rt.kind, name, namespace)
            return self._reply_object(200, rt, obj)
        if sub in ("log",) or sub == "scale" and method not in ("PATCH", "PUT"):
            raise _Reply(405, f"{method} is not allowed on {rt.plural}/{sub}", "MethodNotAllowed")
        if method == "POST":
            if name is not None:
                raise _Reply(405, "the server does not allow this method on the requested resource", "MethodNotAllowed")
            return self._create(rt, namespace)
        if method == "PUT":
            if name is None:
                raise _Reply(405, "the server does not allow this method on the requested resource", "MethodNotAllowed")
            return self._update(rt, namespace, name, sub)
        if method == "PATCH":
            if name is None:
                raise _Reply(405, "the server does not allow this method on the requested resource", "MethodNotAllowed")
            return self._patch(rt, namespace, name, sub)
        if method == "DELETE":
            if sub is not None:
                raise _Reply(405, "the server does not allow this method on the requested resource", "MethodNotAllowed")
            if name is None:
                return self._delete_collection(rt, namespace)
            return self._delete(rt, namespace, name)
        raise _Reply(405, "the server does not allow this method on the requested resource", "MethodNotAllowed")

    def _reply_object(self, code: int, rt, obj: dict, headers=None):
        hdrs = self._warning_headers() + list(headers or [])
        if self._wants_table():
            meta = obj.get("metadata") or {}
            tbl = self.owner.tables.table(rt, [obj], {"resourceVersion": meta.get("resourceVersion", "")},
                                          self.query.get("includeObject", "Metadata"))
            return self._send_json(code, tbl, hdrs)
        return self._send_json(code, obj, hdrs)

    def _list(self, rt, namespace):
        q = self.query
        limit = q.get("limit")
        try:
            limit_n = int(limit) if limit not in (None, "") else None
        except ValueError:
            raise _Reply(400, f"invalid limit: {limit!r}") from None
        if limit_n is not None and limit_n <= 0:
            limit_n = None
        try:
            result = self.owner.store.list(rt.api_version, rt.kind, namespace, label_selector=q.get("labelSelector") or None,
                                           field_selector=q.get("fieldSelector") or None, limit=limit_n,
                                           continue_token=q.get("continue") or None)
        except ValueError as e:
            raise _Reply(400, str(e)) from None
        if self._wants_table():
            tbl = self.owner.tables.table(rt, result.get("items") or [], result.get("metadata"),
                                          q.get("includeObject", "Metadata"))
            return self._send_json(200, tbl)
        return self._send_json(200, result)

    def _prepare_body(self, rt, namespace, name=None) -> dict:
        if self._is_protobuf():
            obj = self._protobuf_object()
        else:
            obj = self._json_body(strict_dups=self.query.get("fieldValidation") == "Strict")
        if not isinstance(obj, dict):
            raise _Reply(400, "the object provided is unrecognized (must be a JSON object)")
        api_version, kind = obj.get("apiVersion"), obj.get("kind")
        if not api_version and not kind:
            obj["apiVersion"], obj["kind"] = rt.api_version, rt.kind
        elif api_version != rt.api_version or kind != rt.kind:
            if kind == rt.kind and not api_version:
                obj["apiVersion"] = rt.api_version
            elif api_version == rt.api_version and not kind:
                obj["kind"] = rt.kind
            else:
                raise _Reply(400, f"the API version in the data ({api_version}) does not match the expected API version "
                                  f"({rt.api_version})" if api_version != rt.api_version else
                             f"the kind in the data ({kind}) does not match the expected kind ({rt.kind})")
        meta = obj.get("metadata")
        if meta is None:
            meta = obj["metadata"] = {}
        if not isinstance(meta, dict):
            raise _Reply(400, "metadata must be an object")
        if rt.namespaced:
            ns_body = meta.get("namespace")
            if ns_body and ns_body != namespace:
                raise _Reply(400, "the namespace of the provided object does not match the namespace sent on the request")
            meta["namespace"] = namespace
        elif "namespace" in meta and meta.get("namespace"):
            meta.pop("namespace")
        if name is not None:
            if meta.get("name") and meta["name"] != name:
                raise _Reply(400, f"the name of the object ({meta['name']}) does not match the name on the URL ({name})")
            meta["name"] = name
        return obj

    def _create(self, rt, namespace):
        if rt.namespaced and namespace is None:
            raise _Reply(405, "the server does not allow this method on the requested resource", "MethodNotAllowed")
        obj = self._prepare_body(rt, namespace)
        out = self.owner.store.create(obj, dry_run=self._dry_run(), field_validation=self._field_validation(),
                                      field_manager=self.query.get("fieldManager") or None, warnings=self.warnings)
        return self._reply_object(201, rt, out)

    def _update(self, rt, namespace, name, sub):
        if sub == "scale":
            scale = self._json_body()
            if not isinstance(scale, dict):
                raise _Reply(400, "the object provided is unrecognized (must be a Scale object)")
            out = self.owner.store.update_scale(rt.api_version, rt.kind, name, namespace, scale, dry_run=self._dry_run(),
                                                field_manager=self.query.get("fieldManager") or None)
            return self._send_json(200, out, self._warning_headers())
        obj = self._prepare_body(rt, namespace, name)
        out = self.owner.store.update(obj, subresource=sub, dry_run=self._dry_run(),
                                      field_validation=self._field_validation(),
                                      field_manager=self.query.get("fieldManager") or None, warnings=self.warnings)
        return self._reply_object(200, rt, out)

    def _patch(self, rt, namespace, name, sub):
        ctype = self._content_type()
        ptype = PATCH_TYPES.get(ctype)
        is_crd = bool(getattr(rt, "crd", rt.schema is not None))
        if ptype is None or (ptype == "strategic" and is_crd):
            accepted = CRD_PATCH_TYPES if is_crd else ALL_PATCH_TYPES
            raise _Reply(415, f"the body of the request was in an unknown format - accepted media types include: {accepted}",
                         "UnsupportedMediaType")
        body = self._json_body(strict_dups=self.query.get("fieldValidation") == "Strict")
        if ptype == "json":
            if not isinstance(body, list):
                raise _Reply(400, "json: cannot unmarshal object into Go value of type jsonpatch.Patch")
        elif not isinstance(body, dict):
            raise _Reply(400, "the body of the request must be a JSON object for this patch type")
        q = self.query
        store = self.owner.store
        kwargs = dict(subresource=sub, field_manager=q.get("fieldManager") or None, force=_truthy(q.get("force")),
                      dry_run=self._dry_run(), field_validation=self._field_validation(), warnings=self.warnings)
        code = 200
        if ptype == "apply":
            with store.lock:
                try:
                    store.get(rt.api_version, rt.kind, name, namespace)
                except ApiError as e:
                    if getattr(e, "code", None) == 404 and sub is None:
                        code = 201
                out = store.patch(rt.api_version, rt.kind, name, namespace, body, ptype, **kwargs)
        else:
            out = store.patch(rt.api_version, rt.kind, name, namespace, body, ptype, **kwargs)
        if sub == "scale":
            return self._send_json(code, out, self._warning_headers())
        return self._reply_object(code, rt, out)

    def _delete_options(self) -> dict:
        opts = {}
        if self.body and self._is_protobuf():
            b = self._protobuf_object()
            if b.get("kind") != "DeleteOptions":
                raise _Reply(400, f"the body of the request must be DeleteOptions, not {b.get('kind')}")
            opts.update(b)
        elif self.body:
            try:
                b = json.loads(self.body)
            except (ValueError, UnicodeDecodeError):
                raise _Reply(400, "the body of the request could not be decoded as DeleteOptions") from None
            if isinstance(b, dict):
                opts.update(b)
        q = self.query
        if q.get("propagationPolicy"):
            opts["propagationPolicy"] = q["propagationPolicy"]
        if q.get("dryRun"):
            opts["dryRun"] = [q["dryRun"]]
        pp = opts.get("propagationPolicy")
        if pp is None and opts.get("orphanDependents") is not None:
            pp = "Orphan" if opts["orphanDependents"] else "Background"
        if pp is not None and pp not in ("Orphan", "Background", "Foreground"):
            raise _Reply(422, f"propagationPolicy: Unsupported value: \"{pp}\": supported values: \"Foreground\", "
                              f"\"Background\", \"Orphan\"", "Invalid")
        return {"propagation_policy": pp, "preconditions": opts.get("preconditions") or None,
                "dry_run": "All" in (opts.get("dryRun") or [])}

    def _delete(self, rt, namespace, name):
        o = self._delete_options()
        out = self.owner.store.delete(rt.api_version, rt.kind, name, namespace, propagation_policy=o["propagation_policy"],
                                      preconditions=o["preconditions"], dry_run=o["dry_run"])
        meta = (out or {}).get("metadata") or {}
        if meta.get("deletionTimestamp") and not o["dry_run"]:  # still there (finalizers, namespace termination)
            return self._send_json(200, out, self._warning_headers())
        details = {"name": name, "kind": rt.plural, "uid": meta.get("uid", "")}
        if rt.group:
            details["group"] = rt.group
        return self._send_json(200, {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success",
                                     "details": details}, self._warning_headers())

    def _delete_collection(self, rt, namespace):
        o = self._delete_options()
        q = self.query
        try:
            out = self.owner.store.delete_collection(rt.api_version, rt.kind, namespace,
                                                     label_selector=q.get("labelSelector") or None,
                                                     field_selector=q.get("fieldSelector") or None,
                                                     propagation_policy=o["propagation_policy"], dry_run=o["dry_run"])
        except ValueError as e:
            raise _Reply(400, str(e)) from None
        return self._send_json(200, out)

    # -- pod logs ----------------------------------------------------------------------------------------------------
    def _pod_log(self, rt, namespace, name):
        """``GET .../pods/{name}/log``: ``tailLines``, ``sinceTime``, ``sinceSeconds``, ``timestamps``, ``limitBytes``
        as kubelet does (``follow`` answers once, with what there is). Lines are stored as ``YYYY-mm-dd HH:MM:SS text``
        in simulated time; that prefix is the runtime's timestamp, shown (as RFC 3339) only with ``timestamps=true``."""
        pod = self.owner.store.get(rt.api_version, rt.kind, name, namespace)
        lines: list[str] = []
        stored = self.owner.logs.get((namespace, name))
        if stored:
            lines.extend(stored if isinstance(stored, list) else str(stored).splitlines())
        ann = ((pod.get("metadata") or {}).get("annotations") or {}).get(LOG_ANNOTATION)
        if ann:
            lines.extend(ann.splitlines())
        if not lines:
            st = pod.get("status") or {}
            ts = (pod.get("metadata") or {}).get("creationTimestamp", "")
            lines.append(f"{ts} sandbox: pod {namespace}/{name} created")
            if (pod.get("spec") or {}).get("nodeName"):
                lines.append(f"{st.get('startTime', ts)} sandbox: scheduled on node {pod['spec']['nodeName']}")
            lines.append(f"{ts} sandbox: phase={st.get('phase', 'Pending')}")
        q = self.query
        created = _parse_ts((pod.get("metadata") or {}).get("creationTimestamp")) or self.owner.now()
        stamped = [(_log_time(line) or created, line) for line in lines]
        since = None
        if q.get("sinceTime"):
            since = _parse_ts(q["sinceTime"])
            if since is None:
                raise _Reply(400, f'parsing time "{q["sinceTime"]}" as RFC 3339: cannot parse')
        elif q.get("sinceSeconds"):
            try:
                seconds = int(q["sinceSeconds"])
            except ValueError:
                raise _Reply(400, "sinceSeconds must be an integer") from None
            if seconds < 1:
                raise _Reply(422, "PodLogOptions.sinceSeconds: Invalid value: must be greater than 0", "Invalid")
            since = self.owner.now().timestamp() - seconds
            since = datetime.fromtimestamp(since, UTC)
        if since is not None:
            stamped = [(t, line) for t, line in stamped if t >= since]
        tail = q.get("tailLines")
        if tail:
            try:
                n = int(tail)
                stamped = stamped[-n:] if n > 0 else []
            except ValueError:
                pass
        if _truthy(q.get("timestamps")):
            out = [f"{t.strftime('%Y-%m-%dT%H:%M:%S.%f')}000Z {_log_text(line)}" for t, line in stamped]
        else:  # like kubelet: the runtime's timestamps only when asked for
            out = [_log_text(line) for _, line in stamped]
        data = "".join(line if line.endswith("\n") else line + "\n" for line in out).encode()
        if q.get("limitBytes"):
            with contextlib.suppress(ValueError):
                data = data[: max(0, int(q["limitBytes"]))]
        return self._send(200, data, "text/plain")

    # -- service proxy -----------------------------------------------------------------------------------------------
    def _service_proxy(self, method: str, namespace: str, target: str, path: str):
        """``/api/v1/namespaces/{ns}/services/{name}[:{port}]/proxy/{path}``: no real process runs behind a sandbox
        Service, so a Service with a ready pod behind it answers with a stand-in page (the notebook's), and one
        without answers 503 like the API server does. A Service with a ``<name>-token`` Secret (a notebook) wants
        that token (``?token=`` or ``Authorization: token ...``), as Jupyter does."""
        store = self.owner.store
        name, _, port = target.partition(":")
        svc = store.get("v1", "Service", name, namespace)  # 404 Status when missing
        spec = svc.get("spec") or {}
        ports = spec.get("ports") or []
        if port and not any(port in (str(p.get("name", "")), str(p.get("port", ""))) for p in ports):
            raise _Reply(503, f'no endpoints available for service "{target}"', "ServiceUnavailable")
        selector = spec.get("selector") or {}
        ready = []
        if selector:
            sel = ",".join(f"{k}={v}" for k, v in sorted(selector.items()))
            for pod in store.list("v1", "Pod", namespace, label_selector=sel)["items"]:
                st = pod.get("status") or {}
                if (pod.get("metadata") or {}).get("deletionTimestamp") or st.get("phase") != "Running":
                    continue
                if any(c.get("type") == "Ready" and c.get("status") == "True" for c in st.get("conditions") or []):
                    ready.append(pod)
        if not ready:
            raise _Reply(503, f'no endpoints available for service "{target}"', "ServiceUnavailable")
        token = self._service_token(namespace, name)
        if token is not None:
            given = self.query.get("token") or ""
            auth = self.headers.get("Authorization") or ""
            if auth[:6].lower() == "token ":
                given = auth[6:].strip()
            if not hmac.compare_digest(given.encode(), token.encode()):
                return self._send(403, b"<!doctype html><title>403 Forbidden</title><h1>403 Forbidden</h1>"
                                       b"<p>Invalid credentials: the notebook wants its token.</p>", "text/html; charset=utf-8")
        pod = sorted(ready, key=lambda p: p["metadata"]["name"])[0]
        from .inference import answer, model_of, owner_deployment

        model = model_of(pod)
        if model is not None:  # a model server: an OpenAI-compatible answer, counted as load (sandbox/inference.py)
            controllers = getattr(self.owner.hooks, "controllers", None)
            deployment = owner_deployment(pod)
            if controllers is not None and deployment and "/v1/" in "/" + path:
                controllers.inference_load.record(namespace, deployment)
            code, payload = answer(method, path, self.body, model, self.owner.now())
            return self._send_json(code, payload)
        if method in ("GET", "HEAD"):
            return self._send(200, _stand_in_page(namespace, name, pod["metadata"]["name"], "/" + path),
                              "text/html; charset=utf-8")
        text = self.body.decode("utf-8", "replace")
        return self._send_json(200, {"kernel": "echo", "service": name, "path": "/" + path, "method": method,
                                     "input": text, "output": text})

    def _service_token(self, namespace: str, name: str) -> str | None:
        import base64

        try:
            secret = self.owner.store.get("v1", "Secret", f"{name}-token", namespace)
        except ApiError:
            return None
        if (secret.get("stringData") or {}).get("token") is not None:
            return str(secret["stringData"]["token"])
        raw = (secret.get("data") or {}).get("token")
        if raw is None:
            return None
        try:
            return base64.b64decode(raw).decode()
        except ValueError:
            return None

    # -- watch -------------------------------------------------------------------------------------------------------------
    def _start_stream(self):
        head = (b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nCache-Control: no-cache, private\r\n"
                b"Transfer-Encoding: chunked\r\n\r\n")
        self.wfile.write(head)

    def _chunk(self, data: bytes):
        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))

    def _client_gone(self) -> bool:
        """Clients never send anything while a watch streams, so a readable socket means EOF (or TLS close_notify)."""
        try:
            r, _, _ = select.select([self.connection], [], [], 0)
            if r:
                if hasattr(self.connection, "pending"):  # ssl.SSLSocket
                    return True
                return self.connection.recv(1, socket.MSG_PEEK) == b""
        except (OSError, ValueError):
            return True
        return False

    def _watch(self, rt, namespace):
        q = self.query
        owner = self.owner
        store = owner.store
        stopping = owner._stopping
        table = self._wants_table()
        include = q.get("includeObject", "Metadata")
        timeout = q.get("timeoutSeconds")
        try:
            timeout_s = float(timeout) if timeout not in (None, "") else None
        except ValueError:
            raise _Reply(400, f"invalid timeoutSeconds: {timeout!r}") from None
        rv = q.get("resourceVersion")
        bookmarks = _truthy(q.get("allowWatchBookmarks"))
        initial = _truthy(q.get("sendInitialEvents"))
        ls, fs = q.get("labelSelector") or None, q.get("fieldSelector") or None
        pre_events: list[tuple[str, dict]] = []
        try:
            if initial:
                if not bookmarks:
                    raise _Reply(422, "sendInitialEvents is forbidden for watch unless allowWatchBookmarks=true", "Invalid")
                lst = store.list(rt.api_version, rt.kind, namespace, label_selector=ls, field_selector=fs)
                list_rv = lst["metadata"]["resourceVersion"]
                pre_events = [("ADDED", o) for o in lst.get("items") or []]
                pre_events.append(("BOOKMARK", {"kind": rt.kind, "apiVersion": rt.api_version, "metadata": {
                    "resourceVersion": list_rv, "annotations": {"k8s.io/initial-events-end": "true"}}}))
                watcher = store.watch(rt.api_version, rt.kind, namespace, resource_version=list_rv, label_selector=ls,
                                      field_selector=fs, allow_bookmarks=bookmarks)
            else:
                watcher = store.watch(rt.api_version, rt.kind, namespace, resource_version=rv or None, label_selector=ls,
                                      field_selector=fs, allow_bookmarks=bookmarks)
        except ApiError as e:
            if getattr(e, "code", None) == 410:
                self._start_stream()
                self._chunk(_dumps({"type": "ERROR", "object": e.status()}) + b"\n")
                self.wfile.write(b"0\r\n\r\n")
                return None
            raise
        except ValueError as e:
            raise _Reply(400, str(e)) from None
        self._start_stream()
        self.owner.requests_served += 1
        started = time.monotonic()
        deadline = started + timeout_s if timeout_s is not None else None
        first_table = True

        def encode(etype: str, obj: dict) -> bytes:
            nonlocal first_table
            if table and etype in ("ADDED", "MODIFIED", "DELETED"):
                obj = owner.tables.table(rt, [obj], {"resourceVersion": (obj.get("metadata") or {}).get("resourceVersion", "")},
                                         include, with_columns=first_table)
                first_table = False
            return _dumps({"type": etype, "object": obj}) + b"\n"

        clean_end = True
        try:
            if pre_events:
                self._chunk(b"".join(encode(t, o) for t, o in pre_events))
            last_sent = last_check = time.monotonic()
            while True:
                if stopping.is_set() or getattr(watcher, "closed", False):
                    clean_end = False
                    break
                now = time.monotonic()
                drop = owner.faults.drop_watches_after_s
                limits = [1.0]
                if deadline is not None:
                    limits.append(deadline - now)
                if drop is not None:
                    limits.append(started + drop - now)
                wait = min(limits)
                if wait <= 0:
                    if drop is not None and now >= started + drop and owner.faults.drop_watches_reset:
                        clean_end = False
                    break
                try:
                    ev = watcher.next(wait)
                except ApiError as e:
                    self._chunk(_dumps({"type": "ERROR", "object": e.status()}) + b"\n")
                    break
                if ev is None:
                    now = time.monotonic()
                    if now - last_check >= 1.0:
                        last_check = now
                        if self._client_gone():
                            clean_end = False
                            break
                    if bookmarks and now - last_sent >= owner.bookmark_interval:
                        with store.lock:  # nothing can be committed between "queue empty" and reading the RV
                            ev = watcher.next(0)
                            bm = watcher.bookmark() if ev is None else None
                        if bm is not None:
                            self._chunk(encode("BOOKMARK", bm))
                            last_sent = time.monotonic()
                    if ev is None:
                        continue
                buf = [encode(*ev)]
                while len(buf) < 256:
                    try:
                        more = watcher.next(0)
                    except ApiError:
                        more = None
                    if more is None:
                        break
                    buf.append(encode(*more))
                self._chunk(b"".join(buf))
                last_sent = time.monotonic()
            if clean_end:
                self.wfile.write(b"0\r\n\r\n")
            else:
                self.close_connection = True
        except (BrokenPipeError, ConnectionResetError, OSError):
            self.close_connection = True
        finally:
            with contextlib.suppress(Exception):
                watcher.close()
        return None
