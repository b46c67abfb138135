"""The one module that talks to Kubernetes (docs/conventions.md, "Kubernetes: render, then apply"): apply, get, list, delete, watch.

Every app renders plain dicts and hands them to a :class:`Kube`. Requests go through the official
client's ``ApiClient`` (authentication, TLS and proxies from the kubeconfig exactly as in production);
we build the REST paths ourselves from a small discovery cache, so any kind the server serves works,
built-in or custom, without the generated per-kind methods.

Errors become two exceptions: :class:`ClusterUnavailable` (5xx, 429, timeouts, connection refused:
worth retrying, carries ``retry_after``) and :class:`ClusterRejected` (any other 4xx: the request is
wrong; carries the Kubernetes ``reason``, ``message`` and the field ``causes``). "Already gone"
is not an error for :meth:`Kube.delete`.

``Kube.calls`` counts requests by verb (``get``, ``list``, ``apply``, ``delete``, ``watch``,
``discovery``) for benchmarks and tests.
"""

from __future__ import annotations

import json
import threading
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import urllib3
import yaml
from kubernetes import client as k8s_client
from kubernetes import config as k8s_config

from . import kueue_compat

FIELD_MANAGER = "gpu-portal"
PAGE_SIZE = 500
REQUEST_TIMEOUT = (5, 30)  # (connect, read) seconds


class ClusterError(Exception):
    """Base of the two cluster errors."""


class ClusterUnavailable(ClusterError):
    """The cluster could not answer now (5xx, 429, timeout, connection refused). Retry later."""

    def __init__(self, message: str, *, status: int | None = None, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.retry_after = retry_after


@dataclass
class ClusterRejected(ClusterError):
    """The cluster refused the request (4xx other than 429). Retrying the same request will not help."""

    status: int
    reason: str
    message: str
    causes: list[dict[str, Any]] = field(default_factory=list)
    details: dict[str, Any] = field(default_factory=dict)  # the Status's ``details`` (name, group, kind)

    def __post_init__(self) -> None:
        super().__init__(self.message)

    @property
    def missing_namespace(self) -> str | None:
        """The namespace a namespaced write was refused for because it is gone, else None: it does not exist (404
        with ``details.kind`` ``namespaces``) or is being deleted (403 with the cause ``NamespaceTerminating``,
        "namespace X is being terminated"), as kube-apiserver answers."""
        if self.status == 404 and self.details.get("kind") == "namespaces" and not self.details.get("group"):
            return str(self.details.get("name") or "") or None
        if self.status == 403:
            for cause in self.causes:
                words = str(cause.get("message") or "").split()
                if cause.get("reason") == "NamespaceTerminating" and len(words) > 1 and words[0] == "namespace":
                    return words[1]
        return None

    def __str__(self) -> str:
        return f"{self.status} {self.reason}: {self.message}"

    @property
    def fields(self) -> list[str]:
        return [c.get("field", "") for c in self.causes if c.get("field")]


class NotOwned(ClusterRejected):
    """A forced apply was refused here, before any write: the live object lacks the owner labels asked for."""

    def __init__(self, what: str, labels: dict[str, Any]) -> None:
        shown = ", ".join(f"{k}={v}" for k, v in sorted(labels.items())) or "none"
        super().__init__(status=409, reason="NotOwned",
                         message=f"{what} exists and is not ours (its labels: {shown}); not applied")


@dataclass(frozen=True)
class Resource:
    api_version: str
    kind: str
    plural: str
    namespaced: bool

    def path(self, namespace: str | None = None, name: str | None = None) -> str:
        base = f"/api/{self.api_version}" if "/" not in self.api_version else f"/apis/{self.api_version}"
        if self.namespaced and namespace:
            base += f"/namespaces/{namespace}"
        base += f"/{self.plural}"
        if name:
            base += f"/{name}"
        return base


def _split(api_version: str) -> tuple[str, str]:
    return tuple(api_version.split("/", 1)) if "/" in api_version else ("", api_version)  # type: ignore[return-value]


class Kube:
    """A client for one cluster. Thread-safe; build it with :func:`kube_for` or from a kubeconfig."""

    def __init__(self, *, kubeconfig_path: str | None = None, kubeconfig_text: str | None = None,
                 context: str | None = None, timeout: tuple[float, float] = REQUEST_TIMEOUT) -> None:
        configuration = k8s_client.Configuration()
        if kubeconfig_text:
            k8s_config.load_kube_config_from_dict(yaml.safe_load(kubeconfig_text), context=context,
                                                  client_configuration=configuration)
        elif kubeconfig_path:
            k8s_config.load_kube_config(config_file=kubeconfig_path, context=context, client_configuration=configuration)
        else:
            raise ValueError("Kube needs a kubeconfig path or text")
        # Our callers decide about retries (with backoff and Retry-After); urllib3 must not retry behind them.
        configuration.retries = 0
        self.api = k8s_client.ApiClient(configuration)
        self.timeout = timeout
        self.calls: Counter[str] = Counter()
        self._resources: dict[tuple[str, str], Resource] = {}
        self._lock = threading.Lock()
        # The Kueue API version spoken on this cluster: None until discovery says (see :meth:`kueue_api`).
        # ``kueue_pin`` fixes one instead ("v1beta1": speak to a v0.17 Kueue as to one older than v0.15).
        self.kueue_version: str | None = None
        self.kueue_served: list[str] = []
        self.kueue_pin: str | None = None
        # (apiVersion, kind) -> when discovery last said the server does not serve it (see :meth:`serves`).
        self._absent: dict[tuple[str, str], float] = {}

    def close(self) -> None:
        self.api.close()

    # -- transport ---------------------------------------------------------------------------------------------
    def _request(self, verb: str, method: str, path: str, *, query: list[tuple[str, Any]] | None = None,
                 body: Any = None, content_type: str | None = None, stream: bool = False,
                 timeout: Any = None) -> tuple[int, Any]:
        headers = {"Accept": "application/json"}
        if content_type:
            headers["Content-Type"] = content_type
        method, url, headers, body, _ = self.api.param_serialize(
            method, path, query_params=query or [], header_params=headers, body=body, auth_settings=["BearerToken"]
        )
        with self._lock:
            self.calls[verb] += 1
        try:
            response = self.api.call_api(method, url, header_params=headers, body=body,
                                         _request_timeout=timeout or self.timeout)
        except (urllib3.exceptions.HTTPError, OSError) as exc:
            raise ClusterUnavailable(f"{method} {path}: {exc.__class__.__name__}: {exc}") from exc
        except k8s_client.ApiException as exc:  # only raised for transport-level trouble here
            raise ClusterUnavailable(f"{method} {path}: {exc}", status=exc.status) from exc
        if stream and 200 <= response.status < 300:
            return response.status, response.response
        try:
            raw = response.read()
        except (urllib3.exceptions.HTTPError, OSError) as exc:
            raise ClusterUnavailable(f"{method} {path}: reading the answer failed: {exc}") from exc
        status = response.status
        payload: Any = None
        if raw:
            try:
                payload = json.loads(raw)
            except ValueError:
                payload = raw.decode("utf-8", "replace")
        if 200 <= status < 300:
            return status, payload
        self._raise(status, payload, response.headers, f"{method} {path}")
        raise AssertionError("unreachable")

    @staticmethod
    def _raise(status: int, payload: Any, headers: Any, what: str) -> None:
        body = payload if isinstance(payload, dict) else {}
        reason = str(body.get("reason") or "")
        message = str(body.get("message") or payload or what)
        if status == 429 or status >= 500 or status == 0:
            retry_after: float | None = None
            value = (headers or {}).get("Retry-After")
            if value:
                try:
                    retry_after = float(value)
                except ValueError:
                    retry_after = None
            if retry_after is None:
                retry_after = (body.get("details") or {}).get("retryAfterSeconds")
            raise ClusterUnavailable(f"{what}: {status} {reason or 'error'}: {message}", status=status, retry_after=retry_after)
        details = body.get("details") if isinstance(body.get("details"), dict) else {}
        causes = list(details.get("causes") or [])
        raise ClusterRejected(status=status, reason=reason or str(status), message=message, causes=causes,
                              details=details)

    # -- discovery ---------------------------------------------------------------------------------------------
    def kueue_api(self, *, refresh: bool = False) -> str | None:
        """The Kueue version the portal speaks here ("v1beta2", or "v1beta1" where Kueue is older than v0.15; None
        without Kueue): one discovery request (``/apis``), remembered with the versions served (``kueue_served``)
        until ``refresh`` (the inventory sync's, so an upgraded Kueue is noticed)."""
        if self.kueue_version is None or refresh:
            _, doc = self._request("discovery", "GET", "/apis")
            group = next((g for g in (doc or {}).get("groups") or [] if g.get("name") == kueue_compat.GROUP), None)
            self.kueue_served = [v.get("version", "") for v in (group or {}).get("versions") or []]
            self.kueue_version = kueue_compat.choose(self.kueue_served) or ""
        if self.kueue_pin and self.kueue_pin in self.kueue_served:
            return self.kueue_pin
        return self.kueue_version or None

    def _wire(self, api_version: str) -> tuple[str, bool]:
        """The version sent for ``api_version``, and whether objects are converted (Kueue v1beta2 on a v1beta1
        cluster; portal/kueue_compat.py)."""
        if api_version == kueue_compat.V1BETA2 and self.kueue_api() == "v1beta1":
            return kueue_compat.V1BETA1, True
        return api_version, False

    def resource(self, api_version: str, kind: str) -> Resource:
        """The REST resource of a kind; one discovery request per group-version, cached."""
        key = (api_version, kind)
        found = self._resources.get(key)
        if found is not None:
            return found
        group, version = _split(api_version)
        path = f"/apis/{group}/{version}" if group else f"/api/{version}"
        try:
            _, doc = self._request("discovery", "GET", path)
        except ClusterRejected as exc:
            raise ClusterRejected(status=exc.status, reason=exc.reason,
                                  message=f"the server does not serve {api_version}", causes=[]) from exc
        for item in (doc or {}).get("resources") or []:
            if "/" in item.get("name", ""):
                continue
            res = Resource(api_version, item["kind"], item["name"], bool(item.get("namespaced")))
            self._resources.setdefault((api_version, item["kind"]), res)
        found = self._resources.get(key)
        if found is None:
            raise ClusterRejected(status=404, reason="NotFound", message=f"the server has no kind {kind} in {api_version}")
        return found

    def serves(self, api_version: str, kind: str, *, max_age: float = 300.0) -> bool:
        """Does the cluster serve ``kind`` in ``api_version`` (an optional API: Gateway API's HTTPRoute, KEDA's
        ScaledObject)? Discovery, cached: a kind served is remembered with the resource; one not served is asked
        again after ``max_age`` seconds (so an API installed later is noticed). ClusterUnavailable when discovery
        cannot be read."""
        key = (api_version, kind)
        if key in self._resources:
            return True
        absent = self._absent.get(key)
        if absent is not None and time.monotonic() - absent < max_age:
            return False
        try:
            self.resource(api_version, kind)
        except ClusterRejected:
            self._absent[key] = time.monotonic()
            return False
        self._absent.pop(key, None)
        return True

    # -- verbs -------------------------------------------------------------------------------------------------
    def apply(self, obj: dict[str, Any], *, field_manager: str = FIELD_MANAGER, force: bool = True,
              dry_run: bool = False, owner: dict[str, str] | None = None) -> dict[str, Any]:
        """Server-side apply ``obj`` (creates it when missing); returns the object as stored.

        ``force`` takes fields over from other managers, so it must never land on an object someone else
        owns: with ``owner`` (labels, e.g. managed-by and installation id) a forced apply first reads the
        live object and raises :class:`NotOwned` — writing nothing — when it exists without those labels.
        Without ``force`` the server itself refuses (409) to take over fields another manager set.
        """
        wire, convert = self._wire(obj["apiVersion"])
        if convert:
            obj = kueue_compat.down(obj)
        res = self.resource(wire, obj["kind"])
        meta = obj.get("metadata") or {}
        if force and owner:
            live = self.get(res.api_version, obj["kind"], meta["name"], meta.get("namespace"))
            live_labels = ((live or {}).get("metadata") or {}).get("labels") or {}
            if live is not None and any(live_labels.get(k) != v for k, v in owner.items()):
                where = f"{meta['namespace']}/" if meta.get("namespace") else ""
                raise NotOwned(f"{obj['kind']} {where}{meta['name']}", live_labels)
        query: list[tuple[str, Any]] = [("fieldManager", field_manager), ("fieldValidation", "Strict")]
        if force:
            query.append(("force", "true"))
        if dry_run:
            query.append(("dryRun", "All"))
        _, stored = self._request("apply", "PATCH", res.path(meta.get("namespace"), meta["name"]), query=query,
                                  body=obj, content_type="application/apply-patch+yaml")
        return kueue_compat.up(stored) if convert and isinstance(stored, dict) else stored

    def sandbox_faults(self, values: dict[str, Any]) -> dict[str, Any]:
        """The sandbox cluster's fault injection (``PUT /sandbox/faults``; sandbox/faults.py), for the demo's "take a
        zone down" (``manage.py zone_fault``). A real cluster has no such endpoint: ClusterRejected (404)."""
        _, payload = self._request("sandbox", "PUT", "/sandbox/faults", body=values, content_type="application/json")
        return payload if isinstance(payload, dict) else {}

    def sandbox_faults_read(self, *, timeout: float = 2.0) -> dict[str, Any]:
        """The sandbox cluster's fault settings (``GET /sandbox/faults``; never failed on purpose, so a zone taken down
        still answers). A real cluster has no such endpoint: ClusterRejected (404 or 403)."""
        _, payload = self._request("sandbox", "GET", "/sandbox/faults", timeout=(timeout, timeout))
        return payload if isinstance(payload, dict) else {}

    def get(self, api_version: str, kind: str, name: str, namespace: str | None = None) -> dict[str, Any] | None:
        wire, convert = self._wire(api_version)
        res = self.resource(wire, kind)
        try:
            _, obj = self._request("get", "GET", res.path(namespace, name))
        except ClusterRejected as exc:
            if exc.status == 404:
                return None
            raise
        return kueue_compat.up(obj) if convert and isinstance(obj, dict) else obj

    def pod_log(self, namespace: str, name: str, *, tail_lines: int = 200) -> str | None:
        """The last ``tail_lines`` lines of a pod's log; None if the pod is gone."""
        try:
            _, text = self._request("log", "GET", f"/api/v1/namespaces/{namespace}/pods/{name}/log",
                                    query=[("tailLines", tail_lines)])
        except ClusterRejected as exc:
            if exc.status in (400, 404):  # gone, or not started yet
                return None
            raise
        if text is None:
            return ""
        return text if isinstance(text, str) else json.dumps(text)

    def list(self, api_version: str, kind: str, namespace: str | None = None,
             label_selector: str | None = None) -> tuple[list[dict[str, Any]], str]:
        """Every object of a kind (in ``namespace``, or all), following ``continue`` pages.

        Returns (items, resourceVersion of the list) — start a watch from that version.
        """
        wire, convert = self._wire(api_version)
        res = self.resource(wire, kind)
        items: list[dict[str, Any]] = []
        token: str | None = None
        version = ""
        while True:
            query: list[tuple[str, Any]] = [("limit", PAGE_SIZE)]
            if label_selector:
                query.append(("labelSelector", label_selector))
            if token:
                query.append(("continue", token))
            _, page = self._request("list", "GET", res.path(namespace), query=query)
            page = page or {}
            for item in page.get("items") or []:
                item.setdefault("apiVersion", wire)
                item.setdefault("kind", kind)
                items.append(kueue_compat.up(item) if convert else item)
            meta = page.get("metadata") or {}
            version = meta.get("resourceVersion") or version
            token = meta.get("continue")
            if not token:
                return items, version

    def delete(self, api_version: str, kind: str, name: str, namespace: str | None = None) -> bool:
        """Delete (background propagation). True when deleted now, False when it was already gone."""
        res = self.resource(self._wire(api_version)[0], kind)
        try:
            self._request("delete", "DELETE", res.path(namespace, name), query=[("propagationPolicy", "Background")])
        except ClusterRejected as exc:
            if exc.status == 404:
                return False
            raise
        return True

    def finalizer_remove(self, api_version: str, kind: str, name: str, namespace: str | None = None, *,
                         finalizer: str) -> bool:
        """Take ``finalizer`` off one object, leaving any other finalizer alone; an object being deleted goes once its
        last finalizer is off. True when it was removed now; False when the object or the finalizer was gone already.
        The list is replaced with the stored ``resourceVersion`` as a precondition: a concurrent change (409) is read
        again, so another controller's finalizer added meanwhile is never dropped."""
        for _ in range(3):
            obj = self.get(api_version, kind, name, namespace)
            meta = (obj or {}).get("metadata") or {}
            current = list(meta.get("finalizers") or [])
            if finalizer not in current:
                return False
            body = {"metadata": {"finalizers": [f for f in current if f != finalizer],
                                 "resourceVersion": meta.get("resourceVersion")}}
            try:
                self.patch(api_version, kind, name, body, namespace)
            except ClusterRejected as exc:
                if exc.status == 404:
                    return False
                if exc.status == 409:
                    continue
                raise
            return True
        raise ClusterUnavailable(f"{kind} {name}: its finalizers kept changing; try again")

    def patch(self, api_version: str, kind: str, name: str, body: dict[str, Any],
              namespace: str | None = None) -> dict[str, Any]:
        """A JSON merge patch (RFC 7386) of one object; returns it as stored. For fields of objects the portal does
        not own (a node's labels, its ``unschedulable``), where server-side apply would take the fields over."""
        wire, convert = self._wire(api_version)
        res = self.resource(wire, kind)
        if convert:
            body = kueue_compat.down({"apiVersion": api_version, "kind": kind, **body})
            body.pop("apiVersion"), body.pop("kind")
        _, stored = self._request("patch", "PATCH", res.path(namespace, name), body=body,
                                  content_type="application/merge-patch+json")
        return kueue_compat.up(stored) if convert and isinstance(stored, dict) else stored

    def watch(self, api_version: str, kind: str, namespace: str | None = None, resource_version: str | None = None,
              timeout_seconds: int = 60, label_selector: str | None = None) -> Iterator[tuple[str, dict[str, Any]]]:
        """Yield (type, object) events until the server ends the stream (after ``timeout_seconds``).

        An ``ERROR`` event (e.g. 410 Expired) is raised as :class:`ClusterRejected`; re-list and watch again.
        A stream cut in the middle raises :class:`ClusterUnavailable`.
        """
        wire, convert = self._wire(api_version)
        res = self.resource(wire, kind)
        query: list[tuple[str, Any]] = [("watch", "true"), ("timeoutSeconds", timeout_seconds),
                                        ("allowWatchBookmarks", "true")]
        if resource_version:
            query.append(("resourceVersion", resource_version))
        if label_selector:
            query.append(("labelSelector", label_selector))
        _, raw = self._request("watch", "GET", res.path(namespace), query=query, stream=True,
                               timeout=(self.timeout[0], timeout_seconds + 10))
        buffer = b""
        try:
            for chunk in raw.stream(4096, decode_content=True):
                buffer += chunk
                while b"\n" in buffer:
                    line, buffer = buffer.split(b"\n", 1)
                    if not line.strip():
                        continue
                    event = json.loads(line)
                    etype, obj = event.get("type", ""), event.get("object") or {}
                    if etype == "ERROR":
                        self._raise(int(obj.get("code") or 500), obj, {}, f"watch {kind}")
                    yield etype, (kueue_compat.up(obj) if convert else obj)
        except (urllib3.exceptions.HTTPError, OSError) as exc:
            raise ClusterUnavailable(f"watch {kind}: stream broken: {exc}") from exc
        finally:
            raw.release_conn()


_cache: dict[tuple[int, str], Kube] = {}
_cache_lock = threading.Lock()


def kubeconfig_text(cluster: Any) -> str:
    """A ``quotas.models.Cluster``'s kubeconfig: the decrypted ``kubeconfig_encrypted`` or the file at
    ``kubeconfig_path`` (ValueError when it has neither). Secret: never logged nor shown."""
    from .crypto import decrypt

    if cluster.kubeconfig_encrypted:
        return decrypt(cluster.kubeconfig_encrypted)
    if cluster.kubeconfig_path:
        with open(cluster.kubeconfig_path, encoding="utf-8") as fh:
            return fh.read()
    raise ValueError(f"cluster {cluster.name} has no kubeconfig")


def kube_for(cluster: Any) -> Kube:
    """The :class:`Kube` of a ``quotas.models.Cluster``, cached per cluster and kubeconfig.

    The kubeconfig is the decrypted ``kubeconfig_encrypted`` or the file at ``kubeconfig_path``.
    A changed kubeconfig (new text or file content) gets a new client.
    """
    text = kubeconfig_text(cluster)
    key = (cluster.pk, text)
    with _cache_lock:
        kube = _cache.get(key)
        if kube is None:
            for old in [k for k in _cache if k[0] == cluster.pk]:
                _cache.pop(old).close()
            kube = _cache[key] = Kube(kubeconfig_text=text)
        return kube


def kube_cache_clear() -> None:
    with _cache_lock:
        for kube in _cache.values():
            kube.close()
        _cache.clear()


# -- nodes (maintenance: MIG changes) -----------------------------------------------------------------------------
# Module functions so the cluster role derivation (tests/deploy/rbac_from_code.py) sees exactly which object a patch
# touches: nodes, nothing else.


def node_cordon(kube: Kube, name: str, *, cordoned: bool = True) -> dict[str, Any]:
    """Cordon (``spec.unschedulable: true``) or uncordon a node, as ``kubectl cordon`` / ``uncordon`` do."""
    return kube.patch("v1", "Node", name, {"spec": {"unschedulable": True if cordoned else None}})


def node_label(kube: Kube, name: str, labels: dict[str, str | None]) -> dict[str, Any]:
    """Set (or, with None, remove) labels of a node, as ``kubectl label --overwrite`` does."""
    return kube.patch("v1", "Node", name, {"metadata": {"labels": labels}})


# -- notebooks and logs (read paths of the request pages) -------------------------------------------------------
# Module functions on purpose: they use a Kube's transport but return raw answers (a proxied page, log text)
# instead of parsed JSON, and they never raise for the upstream's own status codes.

# Hop-by-hop headers (RFC 9110 §7.6.1) and those the transport sets itself: never forwarded either way.
HOP_BY_HOP = frozenset({
    "connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te", "trailer", "transfer-encoding",
    "upgrade", "host", "content-length", "accept-encoding", "content-encoding",
})


@dataclass
class ProxyAnswer:
    """What a Service answered through the API server's service proxy."""

    status: int
    headers: list[tuple[str, str]]
    body: bytes

    def header(self, name: str) -> str:
        return next((v for k, v in self.headers if k.lower() == name.lower()), "")


def _raw(kube: Kube, verb: str, method: str, url_path: str, *, query: list[tuple[str, Any]] | None = None,
         headers: dict[str, str] | None = None, body: bytes | None = None,
         timeout: tuple[float, float] = (5, 60)) -> ProxyAnswer:
    """One request with the cluster's credentials whose answer is kept raw (bytes, any status)."""
    from urllib.parse import urlencode

    send = {k: v for k, v in (headers or {}).items() if k.lower() not in HOP_BY_HOP and k.lower() != "authorization"}
    send.setdefault("Accept", "*/*")
    url = kube.api.configuration.host.rstrip("/") + url_path
    if query:
        url += "?" + urlencode(query)
    auth: dict[str, str] = {}
    kube.api.update_params_for_auth(auth, [], ["BearerToken"], url_path, method, body)
    send.update(auth)  # the cluster's credentials, never anything the browser sent
    with kube._lock:
        kube.calls[verb] += 1
    try:
        response = kube.api.rest_client.pool_manager.request(
            method, url, body=body if body else None, headers=send, preload_content=False, redirect=False,
            timeout=urllib3.Timeout(connect=timeout[0], read=timeout[1]), retries=False,
        )
        raw = response.read()
    except (urllib3.exceptions.HTTPError, OSError) as exc:
        raise ClusterUnavailable(f"{method} {url_path}: {exc.__class__.__name__}: {exc}") from exc
    out = [(k, v) for k, v in response.headers.items() if k.lower() not in HOP_BY_HOP]
    response.release_conn()
    return ProxyAnswer(response.status, out, raw)


def service_proxy(kube: Kube, namespace: str, service: str, port: str | int, path: str, *, method: str = "GET",
                  query: list[tuple[str, str]] | None = None, headers: dict[str, str] | None = None,
                  body: bytes | None = None, timeout: tuple[float, float] = (5, 60)) -> ProxyAnswer:
    """Send one HTTP request to ``service:port`` through ``/api/v1/namespaces/{ns}/services/{name}:{port}/proxy/{path}``.

    Whatever status the Service (or the API server, e.g. 503 "no endpoints available") answers is returned as is;
    only a cluster that cannot be reached raises :class:`ClusterUnavailable`. The caller filters ``headers``; an
    ``Authorization`` among them is replaced by the cluster's credentials (the API server authenticates with it and
    removes it before proxying, so a credential for the Service itself has to travel in ``query``).

    The path is refused (:class:`portal.urlpaths.PathRefused`) when any of its segments could walk out of the
    Service's proxy prefix (``..``, ``.``, backslashes, ...); it is sent with each segment percent-encoded on its own
    and only after the URL, as the HTTP client parses it, still lies under that prefix (``portal.urlpaths``).
    """
    from urllib.parse import quote

    from .urlpaths import PathRefused, rebuilt, under_prefix

    prefix = f"/api/v1/namespaces/{quote(namespace, safe='')}/services/{quote(f'{service}:{port}', safe=':')}/proxy/"
    url_path = prefix + rebuilt(path.lstrip("/"))
    if not under_prefix(url_path, prefix):
        raise PathRefused(f"{url_path!r} does not stay under {prefix!r}")
    return _raw(kube, "proxy", method, url_path, query=query, headers=headers, body=body, timeout=timeout)


def pod_log_read(kube: Kube, namespace: str, name: str, *, tail_lines: int | None = None, since_time: str | None = None,
                 timestamps: bool = False, container: str | None = None, limit_bytes: int | None = None) -> str | None:
    """A pod's log through the ``log`` subresource: all of it, the last ``tail_lines``, or what came at or after
    ``since_time`` (RFC 3339). ``timestamps`` prefixes each line with the time the runtime recorded it (cluster time).
    None when the pod is gone or has not started."""
    from urllib.parse import quote

    query: list[tuple[str, Any]] = []
    if tail_lines is not None:
        query.append(("tailLines", int(tail_lines)))
    if since_time:
        query.append(("sinceTime", since_time))
    if timestamps:
        query.append(("timestamps", "true"))
    if container:
        query.append(("container", container))
    if limit_bytes:
        query.append(("limitBytes", int(limit_bytes)))
    path = f"/api/v1/namespaces/{quote(namespace, safe='')}/pods/{quote(name, safe='')}/log"
    answer = _raw(kube, "log", "GET", path, query=query, timeout=kube.timeout)
    if 200 <= answer.status < 300:
        return answer.body.decode("utf-8", "replace")
    if answer.status in (400, 404):  # gone, or not started yet
        return None
    try:
        payload: Any = json.loads(answer.body) if answer.body else None
    except ValueError:
        payload = answer.body.decode("utf-8", "replace")
    Kube._raise(answer.status, payload, dict(answer.headers), f"GET {path}")
    return None
