"""Measured GPU use in the sandbox: NVIDIA's DCGM exporter per GPU node, and a small Prometheus query API.

Two HTTP surfaces, both public on the sandbox's port (as an exporter and an in-cluster Prometheus are):

* ``GET /dcgm/<node>/metrics`` -- the text exposition format of dcgm-exporter for one GPU node: the metrics of its
  default counters that the portal reads (:data:`METRICS`), one series per GPU (per MIG instance on MIG nodes, with
  ``GPU_I_PROFILE``/``GPU_I_ID``), labelled as dcgm-exporter labels them: ``gpu``, ``UUID``, ``pci_bus_id``,
  ``device``, ``modelName``, ``Hostname``, ``DCGM_FI_DRIVER_VERSION``, and ``pod``/``namespace``/``container`` on
  a GPU allocated to a pod (its Kubernetes pod-resources mapping).
* ``GET|POST /prometheus/api/v1/query`` and ``/prometheus/api/v1/query_range`` -- what a Prometheus scraping those
  exporters every :data:`SCRAPE_SECONDS` would answer (``job="dcgm-exporter"``, ``instance="<node>:9400"`` added),
  for the PromQL subset of :func:`parse` (documented in docs/measured-use.md).

Nothing is stored but an allocation log: a series' value at any instant is a pure function of the pod that held
the GPU then (its *usage profile* and how long it had run), the GPU's UUID and the sandbox clock, so a range query
over the past is recomputed, deterministically. Usage profiles (:data:`PROFILES`): ``idle`` (a notebook left
open), ``light`` (a memory-light training job on a whole GPU: ~9 GiB, SM active ~12 %), ``saturated``, ``xid``
(saturated, then XID 79 after ten minutes). A pod picks one with the annotation ``sandbox.gpuportal.dev/usage``
(inherited from its owner like the duration annotation); else the cluster profile's ``usage.byKind`` on the pod's
``gpuportal.dev/kind`` label; else ``usage.default`` (``saturated``). ``usage.xid`` lists GPUs that raise an XID
whatever runs on them: ``[{node: gpu-h100-3, gpu: 5, code: 79, afterSeconds: 0}]``.

One Prometheus over several clusters (the profile's ``prometheus`` section, or the attributes of the same names):
``externalLabels`` (``{cluster: zone-a}``) are added to every series this sandbox's Prometheus scraped, as a
relabelling or a Prometheus' external labels name the cluster; ``peers`` lists the base URLs of other sandboxes whose
series this one's query API answers with too (as a Thanos or Mimir querier over several clusters' Prometheus), read
from their query API with ``local=1`` (their own series only).
"""

from __future__ import annotations

import hashlib
import math
import re
import threading
from datetime import UTC, datetime

from .clock import parse_time
from .profile import GPU_MODELS, MIG_CONFIG_LABEL, group_of_node, mig_layout, mig_resource

SCRAPE_SECONDS = 30
USAGE_ANNOTATION = "sandbox.gpuportal.dev/usage"
KIND_LABEL = "gpuportal.dev/kind"
DRIVER_VERSION = "550.127.08"
XID_AFTER_SECONDS = 600
MAX_POINTS = 11000  # Prometheus refuses a range query of more than 11,000 points per series

# dcgm-exporter's default-counters.csv: field, type, help
METRICS = (
    ("DCGM_FI_DEV_GPU_UTIL", "gauge", "GPU utilization (in %)."),
    ("DCGM_FI_DEV_FB_FREE", "gauge", "Framebuffer memory free (in MiB)."),
    ("DCGM_FI_DEV_FB_USED", "gauge", "Framebuffer memory used (in MiB)."),
    ("DCGM_FI_DEV_POWER_USAGE", "gauge", "Power draw (in W)."),
    ("DCGM_FI_DEV_XID_ERRORS", "gauge", "Value of the last XID error encountered."),
    ("DCGM_FI_PROF_GR_ENGINE_ACTIVE", "gauge", "Ratio of time the graphics engine is active."),
    ("DCGM_FI_PROF_SM_ACTIVE", "gauge", "The ratio of cycles an SM has at least 1 warp assigned."),
)
METRIC_NAMES = tuple(m[0] for m in METRICS)
TDP_WATTS = {"H100-80GB": 700, "H200-141GB": 700, "B200": 1000, "A100-80GB": 400, "A100-40GB": 400,
             "A30-24GB": 165, "L40S": 350}


def _noise(uuid: str, t: float) -> float:
    """A deterministic number in [0, 1) for a GPU and a scrape interval."""
    h = hashlib.blake2b(f"{uuid}/{int(t // SCRAPE_SECONDS)}".encode(), digest_size=4).digest()
    return int.from_bytes(h, "big") / 2**32


def _idle(n: float, run: float, total: float, tdp: float) -> dict:
    return {"util": 3.0 if n > 0.95 else 0.0, "sm": 0.002, "gr": 0.003, "fb": min(1230.0, total * 0.5),
            "power": round(tdp * 0.09, 3), "xid": 0}


def _light(n: float, run: float, total: float, tdp: float) -> dict:
    return {"util": round(30 + 20 * n, 3), "sm": round(0.10 + 0.04 * n, 4), "gr": round(0.15 + 0.04 * n, 4),
            "fb": min(9318.0 - 600 * n, total * 0.98), "power": round(tdp * (0.30 + 0.1 * n), 3), "xid": 0}


def _saturated(n: float, run: float, total: float, tdp: float) -> dict:
    return {"util": round(95 + 5 * n, 3), "sm": round(0.85 + 0.1 * n, 4), "gr": round(0.9 + 0.09 * n, 4),
            "fb": round(total * (0.88 + 0.05 * n), 1), "power": round(tdp * (0.85 + 0.1 * n), 3), "xid": 0}


def _xid(n: float, run: float, total: float, tdp: float) -> dict:
    if run < XID_AFTER_SECONDS:
        return _saturated(n, run, total, tdp)
    return {"util": 0.0, "sm": 0.0, "gr": 0.0, "fb": round(total * 0.9, 1), "power": round(tdp * 0.12, 3),
            "xid": 79}


PROFILES = {"idle": _idle, "light": _light, "saturated": _saturated, "xid": _xid}


def _ts(dt: datetime) -> float:
    return dt.timestamp()


class Dcgm:
    """The simulated exporters of one sandbox cluster and the Prometheus that scrapes them."""

    def __init__(self, store, clock, profile: dict | None):
        self.store = store
        self.clock = clock
        self.profile = profile or {}
        usage = self.profile.get("usage") or {}
        self.default_usage = str(usage.get("default") or "saturated")
        self.by_kind = dict(usage.get("byKind") or {})
        self.xid_faults = list(usage.get("xid") or [])
        prometheus = self.profile.get("prometheus") or {}
        self.external_labels = {str(k): str(v) for k, v in (prometheus.get("externalLabels") or {}).items()}
        self.peers = [str(u).rstrip("/") for u in (prometheus.get("peers") or [])]
        self.t0 = _ts(clock.now())
        self.log: dict[str, dict] = {}  # pod uid -> allocation (node, devices, pod, namespace, ...)
        self.lock = threading.Lock()

    # -- the fleet: GPU devices per node ------------------------------------------------------------------------
    def devices(self, node: dict) -> list[dict]:
        """The GPU devices dcgm-exporter reports on ``node``: whole GPUs, or MIG instances (empty: not a GPU node)."""
        meta = node.get("metadata") or {}
        labels = meta.get("labels") or {}
        if labels.get("nvidia.com/gpu.present") != "true":
            return []
        name = meta["name"]
        group = group_of_node(self.profile, name) or {}
        gpu = group.get("gpu") or {}
        model = gpu.get("model") or next((k for k, v in GPU_MODELS.items()
                                          if v["product"] == labels.get("nvidia.com/gpu.product")), "H100-80GB")
        spec = GPU_MODELS.get(model) or GPU_MODELS["H100-80GB"]
        count = int(gpu.get("count") or labels.get("nvidia.com/gpu.count") or 0)
        layout = None
        if gpu.get("sharing") == "mig":
            layout = mig_layout(model, labels.get(MIG_CONFIG_LABEL) or (gpu.get("mig") or {}).get("config",
                                                                                                  "all-balanced"), count)
        out = []
        for i in range(count):
            uuid = "GPU-" + str(_uuid5(f"{name}/{i}"))
            base = {"gpu": str(i), "UUID": uuid, "pci_bus_id": f"00000000:{0x18 + 0x10 * i:02X}:00.0",
                    "device": f"nvidia{i}", "modelName": spec["product"].replace("-", " "), "Hostname": name,
                    "DCGM_FI_DRIVER_VERSION": DRIVER_VERSION}
            dev = layout[i] if layout is not None and i < len(layout) else None
            if dev is None:
                out.append({"key": f"{i}", "labels": base, "memory": float(spec["memory"]), "model": model,
                            "resource": "nvidia.com/gpu", "tdp": TDP_WATTS.get(model, 400)})
                continue
            gi = 0
            for prof, c in sorted(dev.items()):
                mem = float(spec["mig"][prof][2]) if spec.get("mig") and prof in spec["mig"] else spec["memory"] / 7
                for _ in range(int(c)):
                    gi += 1
                    labels_i = dict(base, GPU_I_PROFILE=prof, GPU_I_ID=str(gi))
                    out.append({"key": f"{i}/{gi}", "labels": labels_i, "memory": mem, "model": model,
                                "resource": mig_resource(prof), "tdp": TDP_WATTS.get(model, 400) / 7})
        return out

    def gpu_nodes(self) -> list[dict]:
        nodes = self.store.list("v1", "Node").get("items") or []
        return [n for n in nodes if ((n.get("metadata") or {}).get("labels") or {}).get("nvidia.com/gpu.present") == "true"]

    # -- which pod holds which device, and since when ---------------------------------------------------------------
    def refresh(self) -> None:
        """Bring the allocation log up to date with the pods now in the store."""
        now = _ts(self.clock.now())
        pods = self.store.list("v1", "Pod").get("items") or []
        nodes = {n["metadata"]["name"]: n for n in self.gpu_nodes()}
        seen = set()
        with self.lock:
            for pod in pods:
                meta, spec, status = pod.get("metadata") or {}, pod.get("spec") or {}, pod.get("status") or {}
                node = nodes.get(spec.get("nodeName") or "")
                if node is None:
                    continue
                start, end = _run_span(status)
                if start is None:
                    continue
                uid = meta.get("uid") or f"{meta.get('namespace')}/{meta.get('name')}"
                seen.add(uid)
                entry = self.log.get(uid)
                if entry is None:
                    entry = self._allocate(pod, node, start, now)
                    if entry is None:
                        continue
                    self.log[uid] = entry
                entry["end"] = end
            for uid, entry in self.log.items():
                if uid not in seen and entry["end"] is None:
                    entry["end"] = now  # the pod is gone: its devices were freed when we last looked

    def _allocate(self, pod: dict, node: dict, start: float, now: float) -> dict | None:
        meta, spec = pod.get("metadata") or {}, pod.get("spec") or {}
        want: dict[str, int] = {}
        container = ""
        for c in spec.get("containers") or []:
            limits = ((c.get("resources") or {}).get("limits") or {})
            for res, q in limits.items():
                if res == "nvidia.com/gpu" or res.startswith("nvidia.com/mig-"):
                    try:
                        want[res] = want.get(res, 0) + int(str(q))
                    except ValueError:
                        continue
                    container = container or c.get("name", "")
        if not want:
            return None
        node_name = node["metadata"]["name"]
        shared = ((node["metadata"].get("labels") or {}).get("gpuportal.dev/gpu-sharing") == "hami")
        held: dict[str, int] = {}
        for e in self.log.values():
            if e["node"] == node_name and e["end"] is None:
                for k in e["devices"]:
                    held[k] = held.get(k, 0) + 1
        devices = []
        for res, n in want.items():
            free = [d for d in self.devices(node) if d["resource"] == res and (shared or d["key"] not in held)]
            if shared:  # HAMi: vGPUs on the least used cards
                free.sort(key=lambda d: (held.get(d["key"], 0), int(d["key"].split("/")[0])))
            for d in free[:n]:
                devices.append(d["key"])
                held[d["key"]] = held.get(d["key"], 0) + 1
        ann = meta.get("annotations") or {}
        usage = ann.get(USAGE_ANNOTATION) or self.by_kind.get((meta.get("labels") or {}).get(KIND_LABEL, "")) \
            or self.default_usage
        if usage not in PROFILES:
            usage = self.default_usage if self.default_usage in PROFILES else "saturated"
        return {"node": node_name, "devices": devices, "pod": meta.get("name", ""),
                "namespace": meta.get("namespace", ""), "container": container, "usage": usage,
                "start": start, "end": None}

    # -- values ---------------------------------------------------------------------------------------------------
    def series_at(self, t: float, node_names: set[str] | None = None) -> list[tuple[dict, float]]:
        """Every exporter series at instant ``t``: (labels with ``__name__``, value)."""
        out: list[tuple[dict, float]] = []
        with self.lock:
            entries = [e for e in self.log.values() if e["start"] <= t and (e["end"] is None or t < e["end"])]
            past = list(self.log.values())
        for node in self.gpu_nodes():
            name = node["metadata"]["name"]
            if node_names is not None and name not in node_names:
                continue
            holders = {}
            for e in entries:
                if e["node"] == name:
                    for k in e["devices"]:
                        holders.setdefault(k, e)
            for d in self.devices(node):
                labels = dict(d["labels"])
                e = holders.get(d["key"])
                n = _noise(labels["UUID"] + labels.get("GPU_I_ID", ""), t)
                if e is not None:
                    labels.update(pod=e["pod"], namespace=e["namespace"], container=e["container"])
                    v = PROFILES[e["usage"]](n, t - e["start"], d["memory"], d["tdp"])
                else:
                    v = {"util": 0.0, "sm": 0.0, "gr": 0.0, "fb": 0.0, "power": round(d["tdp"] * 0.08, 3), "xid": 0}
                v["xid"] = v["xid"] or self._xid_before(name, d["key"], t, past)
                fb = float(v["fb"])
                values = {"DCGM_FI_DEV_GPU_UTIL": v["util"], "DCGM_FI_DEV_FB_USED": round(fb),
                          "DCGM_FI_DEV_FB_FREE": round(d["memory"] - fb), "DCGM_FI_DEV_POWER_USAGE": v["power"],
                          "DCGM_FI_DEV_XID_ERRORS": v["xid"], "DCGM_FI_PROF_GR_ENGINE_ACTIVE": v["gr"],
                          "DCGM_FI_PROF_SM_ACTIVE": v["sm"]}
                for metric in METRIC_NAMES:
                    out.append(({"__name__": metric, **labels}, float(values[metric])))
        return out

    def _xid_before(self, node: str, key: str, t: float, past: list[dict]) -> int:
        """The last XID a device raised by ``t`` (dcgm-exporter keeps reporting it): a configured fault, or a pod
        of the ``xid`` profile that had run long enough on it."""
        gpu = key.split("/", maxsplit=1)[0]
        for f in self.xid_faults:
            after = float(f.get("afterSeconds") or 0)  # 0: from the start, even in scrapes older than the sandbox
            if f.get("node") == node and str(f.get("gpu")) == gpu and (after <= 0 or t >= self.t0 + after):
                return int(f.get("code") or 79)
        for e in past:
            if e["node"] == node and e["usage"] == "xid" and key in e["devices"]:
                at = e["start"] + XID_AFTER_SECONDS
                if at <= t and (e["end"] is None or at < e["end"]):
                    return 79
        return 0

    def exposition(self, node_name: str) -> str | None:
        """dcgm-exporter's ``/metrics`` text for one node (None: no such GPU node)."""
        self.refresh()
        if node_name not in {n["metadata"]["name"] for n in self.gpu_nodes()}:
            return None
        series = self.series_at(_ts(self.clock.now()), {node_name})
        lines = []
        for metric, mtype, help_ in METRICS:
            lines.append(f"# HELP {metric} {help_}")
            lines.append(f"# TYPE {metric} {mtype}")
            for labels, value in series:
                if labels["__name__"] != metric:
                    continue
                body = ",".join(f'{k}="{_escape(v)}"' for k, v in labels.items() if k != "__name__")
                lines.append(f"{metric}{{{body}}} {_fmt(value)}")
        return "\n".join(lines) + "\n"

    # -- Prometheus ------------------------------------------------------------------------------------------------
    def scraped_local(self, t: float) -> list[tuple[dict, float]]:
        """This sandbox's series as its Prometheus holds them at ``t``: the last scrape at or before ``t``,
        job/instance and the external labels added."""
        ts = math.floor(t / SCRAPE_SECONDS) * SCRAPE_SECONDS
        return [({**lab, "job": "dcgm-exporter", "instance": f"{lab['Hostname']}:9400", **self.external_labels}, v)
                for lab, v in self.series_at(ts)]

    def scraped_at(self, t: float) -> list[tuple[dict, float]]:
        """Every series the query API answers with at ``t``: this sandbox's and its peers' (``peers``)."""
        out = self.scraped_local(t)
        for peer in self.peers:
            out.extend(_peer_series(peer, t))
        return out

    def query(self, expr: str, t: float | None, *, local: bool = False) -> dict:
        self.refresh()
        t = _ts(self.clock.now()) if t is None else t
        scraped = self.scraped_local if local else self.scraped_at
        node = parse(expr)
        if node[0] == "range":  # a bare range selector: its raw samples, a matrix
            _, sel, width = node
            rows: dict[tuple, dict] = {}
            s = math.floor((t - width) / SCRAPE_SECONDS) * SCRAPE_SECONDS + SCRAPE_SECONDS
            while s <= t:
                for labels, value in _select(sel[1], scraped(s)):
                    row = rows.setdefault(tuple(sorted(labels.items())), {"metric": labels, "values": []})
                    row["values"].append([_num(s), _fmt(value)])
                s += SCRAPE_SECONDS
            return {"resultType": "matrix", "result": list(rows.values())}
        return _result(evaluate(node, t, scraped), t)

    def query_range(self, expr: str, start: float, end: float, step: float) -> dict:
        if step <= 0:
            raise QueryError("zero or negative query resolution step widths are not accepted. Try a positive integer")
        if end < start:
            raise QueryError("end timestamp must not be before start time")
        if (end - start) / step > MAX_POINTS:
            raise QueryError("exceeded maximum resolution of 11,000 points per timeseries. Try decreasing the query "
                             "resolution (?step=XX)")
        self.refresh()
        node = parse(expr)
        if node[0] == "range":
            raise QueryError("invalid expression type \"range vector\" for range query, must be Scalar or "
                             "instant Vector")
        matrix: dict[tuple, dict] = {}
        n = int((end - start) // step)
        for i in range(n + 1):
            t = start + i * step
            for labels, value in evaluate(node, t, self.scraped_at):
                key = tuple(sorted(labels.items()))
                row = matrix.setdefault(key, {"metric": labels, "values": []})
                row["values"].append([_num(t), _fmt(value)])
        return {"resultType": "matrix", "result": list(matrix.values())}

    # -- HTTP -------------------------------------------------------------------------------------------------------
    def handle(self, method: str, path: str, params: dict) -> tuple[int, bytes, str]:
        """Answer ``/dcgm/...`` and ``/prometheus/...``: (status, body, content type)."""
        import json

        if path.startswith("/dcgm/"):
            parts = path.strip("/").split("/")
            if method not in ("GET", "HEAD") or len(parts) != 3 or parts[2] != "metrics":
                return 404, b"404 page not found\n", "text/plain; charset=utf-8"
            text = self.exposition(parts[1])
            if text is None:
                return 404, b"404 page not found\n", "text/plain; charset=utf-8"
            return 200, text.encode(), "text/plain; version=0.0.4; charset=utf-8"
        endpoint = path[len("/prometheus"):].rstrip("/")
        if endpoint not in ("/api/v1/query", "/api/v1/query_range"):
            return 404, b"404 page not found\n", "text/plain; charset=utf-8"
        if method not in ("GET", "POST"):
            return 405, b"405 method not allowed\n", "text/plain; charset=utf-8"
        try:
            expr = params.get("query")
            if not expr:
                raise QueryError("invalid parameter \"query\": unknown position: parse error: no expression found "
                                 "in input")
            if endpoint == "/api/v1/query":
                data = self.query(expr, _param_time(params, "time", None), local=params.get("local") in ("1", "true"))
            else:
                start = _param_time(params, "start")
                end = _param_time(params, "end")
                step = _param_duration(params.get("step"), "step")
                data = self.query_range(expr, start, end, step)
        except QueryError as e:
            body = {"status": "error", "errorType": "bad_data", "error": str(e)}
            return 400, json.dumps(body).encode(), "application/json"
        return 200, json.dumps({"status": "success", "data": data}).encode(), "application/json"


def _peer_series(base: str, t: float) -> list[tuple[dict, float]]:
    """A peer sandbox's own series at ``t`` (``local=1``: not its peers'), through its query API; a peer that does
    not answer is left out, as a querier's partial response leaves out a store that is down."""
    import json
    import urllib.error
    import urllib.parse
    import urllib.request

    params = urllib.parse.urlencode({"query": '{__name__=~"DCGM_.+"}', "time": repr(float(t)), "local": "1"})
    try:
        with urllib.request.urlopen(f"{base}/prometheus/api/v1/query?{params}", timeout=10) as resp:
            body = json.loads(resp.read())
    except (urllib.error.URLError, OSError, ValueError):
        return []
    return [(row["metric"], float(row["value"][1])) for row in (body.get("data") or {}).get("result") or []]


def _uuid5(s: str) -> str:
    h = hashlib.md5(s.encode()).hexdigest()
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:32]}"


def _run_span(status: dict) -> tuple[float | None, float | None]:
    """(started, finished) of a pod's containers, in epoch seconds."""
    start = end = None
    for cs in status.get("containerStatuses") or []:
        state = cs.get("state") or {}
        run = state.get("running") or state.get("terminated") or {}
        s = parse_time(run.get("startedAt"))
        if s is not None and (start is None or s.timestamp() < start):
            start = s.timestamp()
        f = parse_time((state.get("terminated") or {}).get("finishedAt"))
        if f is not None:
            end = max(end or 0.0, f.timestamp())
    if start is not None and status.get("phase") not in ("Succeeded", "Failed"):
        end = None
    return start, end


def _escape(v: str) -> str:
    return str(v).replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _fmt(v: float) -> str:
    if v == int(v) and abs(v) < 1e15:
        return str(int(v))
    return repr(float(v))


def _num(t: float) -> float | int:
    return int(t) if t == int(t) else round(t, 3)


# -- PromQL, the subset ------------------------------------------------------------------------------------------------
class QueryError(ValueError):
    pass


_DURATION = re.compile(r"^(?:(\d+)d)?(?:(\d+)h)?(?:(\d+)m(?!s))?(?:(\d+)s)?(?:(\d+)ms)?$")
_FUNCS = {"avg_over_time", "max_over_time", "min_over_time", "sum_over_time", "count_over_time", "last_over_time"}
_AGGS = {"avg", "max", "min", "sum", "count"}
_TOKEN = re.compile(r'\s*(?:(?P<str>"(?:[^"\\]|\\.)*")|(?P<op>=~|!=|!~|=|[{}()\[\],])|(?P<word>[A-Za-z_:][A-Za-z0-9_:]*)'
                    r'|(?P<dur>\d+(?:ms|[smhdwy])(?:\d+(?:ms|[smhdwy]))*))')


def parse_duration(s: str) -> float:
    m = _DURATION.match(s or "")
    if not s or not m or not any(m.groups()):
        raise QueryError(f"not a valid duration string: {s!r}")
    d, h, mi, sec, ms = (int(g or 0) for g in m.groups())
    return d * 86400 + h * 3600 + mi * 60 + sec + ms / 1000


def _tokens(expr: str) -> list[tuple[str, str]]:
    out, pos = [], 0
    expr = expr.strip()
    while pos < len(expr):
        m = _TOKEN.match(expr, pos)
        if not m or m.end() == pos:
            raise QueryError(f"1:{pos + 1}: parse error: unexpected character: {expr[pos]!r}")
        kind = m.lastgroup
        out.append((kind, m.group(kind)))
        pos = m.end()
        while pos < len(expr) and expr[pos].isspace():
            pos += 1
    return out


def parse(expr: str) -> tuple:
    """The subset: ``metric{l="v",l=~"re",l!="v",l!~"re"}``, ``metric{...}[5m]``, ``<f>_over_time(selector[d])``
    for avg/max/min/sum/count/last, and ``avg|max|min|sum|count [by|without (labels)] (expr)`` (the clause before
    or after). Anything else is a 400 ``bad_data``."""
    toks = _tokens(expr)
    node, i = _expr(toks, 0)
    if i != len(toks):
        raise QueryError(f"parse error: unexpected {toks[i][1]!r}")
    return node


def _expect(toks, i, value):
    if i >= len(toks) or toks[i][1] != value:
        got = toks[i][1] if i < len(toks) else "end of input"
        raise QueryError(f"parse error: expected {value!r}, got {got!r}")
    return i + 1


def _expr(toks, i):
    if i >= len(toks):
        raise QueryError("parse error: unexpected end of input")
    kind, word = toks[i]
    if kind == "word" and word in _AGGS and i + 1 < len(toks) and toks[i + 1][1] in ("(", "by", "without"):
        grouping, i = _grouping(toks, i + 1)
        i = _expect(toks, i, "(")
        inner, i = _expr(toks, i)
        i = _expect(toks, i, ")")
        if grouping is None and i < len(toks) and toks[i][1] in ("by", "without"):
            grouping, i = _grouping(toks, i)
        if inner[0] == "range":
            raise QueryError("expected type instant vector in aggregation expression, got range vector")
        return ("agg", word, grouping, inner), i
    if kind == "word" and word in _FUNCS and i + 1 < len(toks) and toks[i + 1][1] == "(":
        inner, j = _expr(toks, i + 2)
        j = _expect(toks, j, ")")
        if inner[0] != "range":
            raise QueryError(f"expected type range vector in call to function \"{word}\", got instant vector")
        return ("func", word, inner), j
    if kind == "word" or (kind == "op" and word == "{"):
        return _selector(toks, i)
    raise QueryError(f"parse error: unexpected {word!r}")


def _grouping(toks, i):
    if toks[i][1] not in ("by", "without"):
        return None, i
    mode = toks[i][1]
    i = _expect(toks, i + 1, "(")
    names = []
    while i < len(toks) and toks[i][1] != ")":
        if toks[i][0] != "word":
            raise QueryError(f"parse error: unexpected {toks[i][1]!r} in grouping opts")
        names.append(toks[i][1])
        i += 1
        if i < len(toks) and toks[i][1] == ",":
            i += 1
    i = _expect(toks, i, ")")
    return (mode, tuple(names)), i


def _selector(toks, i):
    matchers = []
    if toks[i][0] == "word":
        matchers.append(("__name__", "=", toks[i][1]))
        i += 1
    if i < len(toks) and toks[i][1] == "{":
        i += 1
        while i < len(toks) and toks[i][1] != "}":
            if toks[i][0] != "word" or i + 2 >= len(toks) or toks[i + 1][0] != "op" or toks[i + 2][0] != "str":
                raise QueryError("parse error: unexpected character inside braces")
            name, op, raw = toks[i][1], toks[i + 1][1], toks[i + 2][1]
            if op not in ("=", "!=", "=~", "!~"):
                raise QueryError(f"parse error: unexpected {op!r} in label matching")
            value = bytes(raw[1:-1], "utf-8").decode("unicode_escape")
            if op in ("=~", "!~"):
                try:
                    re.compile(value)
                except re.error as e:
                    raise QueryError(f"invalid regular expression {value!r}: {e}") from None
            matchers.append((name, op, value))
            i += 3
            if i < len(toks) and toks[i][1] == ",":
                i += 1
        i = _expect(toks, i, "}")
    if not matchers or all(_matches_empty(m) for m in matchers):
        raise QueryError("vector selector must contain at least one non-empty matcher")
    node = ("sel", tuple(matchers))
    if i < len(toks) and toks[i][1] == "[":
        if i + 2 >= len(toks) or toks[i + 1][0] != "dur":
            raise QueryError("parse error: bad duration in range selector")
        d = parse_duration(toks[i + 1][1])
        i = _expect(toks, i + 2, "]")
        return ("range", node, d), i
    return node, i


def _matches_empty(m) -> bool:
    name, op, value = m
    return _match(op, value, "")


def _match(op: str, want: str, have: str) -> bool:
    if op == "=":
        return have == want
    if op == "!=":
        return have != want
    ok = re.fullmatch(want, have) is not None
    return ok if op == "=~" else not ok


def _select(matchers, series):
    return [(lab, v) for lab, v in series if all(_match(op, want, lab.get(name, "")) for name, op, want in matchers)]


LOOKBACK = 300.0  # Prometheus' default lookback delta for an instant selector


def evaluate(node: tuple, t: float, scraped_at) -> list[tuple[dict, float]]:
    """A vector at ``t`` (a range node gives its last sample per series; only the HTTP layer shows matrices)."""
    kind = node[0]
    if kind == "sel":
        return _select(node[1], scraped_at(t))
    if kind == "range":
        raise QueryError("a range vector is answered by the query endpoint only")
    if kind == "func":
        fn, (_, sel, width) = node[1], node[2]
        points: dict[tuple, tuple[dict, list[float]]] = {}
        first = math.floor((t - width) / SCRAPE_SECONDS) * SCRAPE_SECONDS + SCRAPE_SECONDS
        s = first
        while s <= t:
            for scraped, v in _select(sel[1], scraped_at(s)):
                lab = {k: x for k, x in scraped.items() if k != "__name__"}
                key = tuple(sorted(lab.items()))
                points.setdefault(key, (lab, []))[1].append(v)
            s += SCRAPE_SECONDS
        out = []
        for lab, vals in points.values():
            value = {"avg_over_time": lambda x: sum(x) / len(x), "max_over_time": max, "min_over_time": min,
                     "sum_over_time": sum, "count_over_time": len, "last_over_time": lambda x: x[-1]}[fn](vals)
            out.append((lab, float(value)))
        return out
    if kind == "agg":
        op, grouping, inner = node[1], node[2], node[3]
        groups: dict[tuple, tuple[dict, list[float]]] = {}
        for lab, v in evaluate(inner, t, scraped_at):
            if grouping is None:
                keep = {}
            elif grouping[0] == "by":
                keep = {k: lab[k] for k in grouping[1] if lab.get(k)}
            else:
                keep = {k: x for k, x in lab.items() if k not in grouping[1] and k != "__name__"}
            key = tuple(sorted(keep.items()))
            groups.setdefault(key, (keep, []))[1].append(v)
        fn = {"avg": lambda x: sum(x) / len(x), "max": max, "min": min, "sum": sum, "count": len}[op]
        return [(lab, float(fn(vals))) for lab, vals in groups.values()]
    raise QueryError(f"unsupported expression {kind}")


def _result(vector: list[tuple[dict, float]], t: float) -> dict:
    return {"resultType": "vector", "result": [{"metric": lab, "value": [_num(t), _fmt(v)]} for lab, v in vector]}


def _param_time(params: dict, name: str, default=...) -> float:
    raw = params.get(name)
    if raw in (None, ""):
        if default is ...:
            raise QueryError(f"invalid parameter \"{name}\": cannot parse \"\" to a valid timestamp")
        return default
    try:
        return float(raw)
    except ValueError:
        pass
    dt = parse_time(raw)
    if dt is None:
        raise QueryError(f"invalid parameter \"{name}\": cannot parse {raw!r} to a valid timestamp")
    return dt.astimezone(UTC).timestamp()


def _param_duration(raw: str | None, name: str) -> float:
    if raw in (None, ""):
        raise QueryError(f"invalid parameter \"{name}\": cannot parse \"\" to a valid duration")
    try:
        return float(raw)
    except ValueError:
        pass
    try:
        return parse_duration(raw)
    except QueryError:
        raise QueryError(f"invalid parameter \"{name}\": cannot parse {raw!r} to a valid duration") from None
