"""The real control plane on loopback: etcd, kube-apiserver, kube-controller-manager, kube-scheduler and Kueue.

Every binary is built from its released Go module by ``go build`` in this folder's Go module (``go.mod`` pins
Kubernetes and Kueue; see :func:`build`). :class:`ControlPlane` makes its own certificates (a CA, the API
server's and Kueue's webhook serving certificates, the service-account signing key), a static admin token, starts
the processes on free loopback ports, installs Kueue's CRDs and webhook configurations from the Kueue module
(``config/components``) rewritten to reach Kueue on loopback (``clientConfig.url`` with the project's CA, Kueue's
own certificate management off), and writes a kubeconfig. Nodes are registered by the caller (``nodes.py``):
no kubelet runs here.

Standalone: stdlib, ``cryptography`` and PyYAML only (no Django); ``python -m realcluster`` runs it.
"""

from __future__ import annotations

import base64
import datetime as _dt
import hashlib
import json
import os
import secrets
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import yaml

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
BIN = HERE / "bin"
BINARIES = {
    "etcd": "./cmd/etcd",
    "kube-apiserver": "k8s.io/kubernetes/cmd/kube-apiserver",
    "kube-controller-manager": "k8s.io/kubernetes/cmd/kube-controller-manager",
    "kube-scheduler": "k8s.io/kubernetes/cmd/kube-scheduler",
    "kueue": "sigs.k8s.io/kueue/cmd/kueue",
}
# Kueue's integrations that the portal uses (a Job per training/batch request, a StatefulSet per notebook, a
# Deployment per inference service, plain pods for pod groups). Others need CRDs that are not installed.
KUEUE_FRAMEWORKS = ["batch/job", "pod", "deployment", "statefulset"]
HAMI_IGNORED = ("nvidia.com/gpumem", "nvidia.com/gpucores", "nvidia.com/gpumem-percentage")
KUEUE_WEBHOOK_KINDS = ("clusterqueue", "cohort", "resourceflavor", "workload", "job", "pod", "deployment",
                       "statefulset")
# CRDs that Kueue converts between v1beta1 and v1beta2 (its config/components/crd/patches).
KUEUE_CONVERTED = ("localqueues", "clusterqueues", "cohorts", "workloads", "multikueueclusters")


def hami_transformations() -> list[dict]:
    """Kueue's ``resources.transformations`` for HAMi, as the sandbox applies them."""
    sys.path.insert(0, str(ROOT))
    from sandbox.controllers.kueue import DEFAULT_TRANSFORMATIONS

    return [dict(t) for t in DEFAULT_TRANSFORMATIONS]


def log(msg: str) -> None:
    print(f"realcluster: {msg}", file=sys.stderr, flush=True)


# -- build ----------------------------------------------------------------------------------------------------------
def go_env() -> dict[str, str]:
    env = dict(os.environ)
    env.setdefault("GOFLAGS", "-mod=mod")
    env.setdefault("CGO_ENABLED", "0")
    return env


def stale(names: list[str] | None = None) -> list[str]:
    """The binaries missing or older than go.mod/go.sum."""
    newest = max((HERE / "go.mod").stat().st_mtime, (HERE / "go.sum").stat().st_mtime,
                 *(p.stat().st_mtime for p in (HERE / "cmd").rglob("*.go")))
    out = []
    for name in names or list(BINARIES):
        path = BIN / name
        if not path.exists() or path.stat().st_mtime < newest:
            out.append(name)
    return out


def module_version(module: str, gomod: Path | None = None) -> str:
    """The version ``go.mod`` requires of ``module``."""
    for line in (gomod or HERE / "go.mod").read_text().splitlines():
        parts = line.split()
        if len(parts) >= 2 and parts[0] == module and parts[1].startswith("v"):
            return parts[1]
    raise RuntimeError(f"{module} is not required in go.mod")


def ldflags(name: str) -> str:
    """Strip symbols, and stamp the release's version as Kubernetes' own build does (hack/lib/version.sh): without
    it the API server says v0.0.0-master, which Kueue cannot parse (it then refuses to start)."""
    flags = ["-s", "-w"]
    if name.startswith("kube-"):
        version = module_version("k8s.io/kubernetes")
        major, minor = version.lstrip("v").split(".")[:2]
        for pkg in ("k8s.io/component-base/version", "k8s.io/client-go/pkg/version"):
            flags += [f"-X {pkg}.gitVersion={version}", f"-X {pkg}.gitMajor={major}", f"-X {pkg}.gitMinor={minor}",
                      f"-X {pkg}.gitTreeState=clean", f"-X {pkg}.buildDate=1970-01-01T00:00:00Z"]
    elif name == "kueue":
        flags += [f"-X sigs.k8s.io/kueue/pkg/version.GitVersion={module_version('sigs.k8s.io/kueue')}"]
    return " ".join(flags)


def build(names: list[str] | None = None, *, force: bool = False) -> dict[str, float]:
    """``go build`` each binary that is missing or stale into ``realcluster/bin`` (``go_build``: from the binary
    cache when the same build was made before, in another checkout too). Returns the seconds each build took."""
    todo = list(names or BINARIES) if force else stale(names)
    took: dict[str, float] = {}
    inputs = [HERE / "go.mod", HERE / "go.sum", *sorted((HERE / "cmd").rglob("*.go"))]
    for name in todo:
        started = time.monotonic()
        go_build(BIN / name, BINARIES[name], ldflags(name), cwd=HERE, inputs=inputs, use_cache=not force)
        took[name] = time.monotonic() - started
        log(f"built {name} in {took[name]:.0f} s")
    return took


def binary_cache() -> Path:
    """Where built binaries are kept between checkouts: ``REALCLUSTER_CACHE``, else the user's cache folder."""
    if os.environ.get("REALCLUSTER_CACHE"):
        return Path(os.environ["REALCLUSTER_CACHE"])
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "gpu-portal-realcluster"


def cached_binary(name: str, package: str, flags: str, *, cwd: Path, inputs: list[Path]) -> Path:
    """Where ``go_build`` keeps (or finds) the binary ``name`` of this build in the binary cache."""
    digest = hashlib.sha256()
    go = subprocess.run(["go", "env", "GOVERSION", "GOOS", "GOARCH"], cwd=cwd, env=go_env(), capture_output=True,
                        text=True, check=False).stdout
    for part in (package, flags, go, *(f"{p.relative_to(cwd)}\0{p.read_text()}" for p in inputs)):
        digest.update(part.encode() + b"\0")
    return binary_cache() / digest.hexdigest()[:32] / name


def go_build(target: Path, package: str, flags: str, *, cwd: Path, inputs: list[Path], use_cache: bool = True) -> None:
    """``go build -o target package`` in ``cwd``, or a copy of the binary the same build made before. Go's build
    cache keeps the compiled packages but links again every time (minutes for the API server on a small machine);
    this cache keeps the linked binary under a key of everything it is made from: the package, the link flags, the Go
    version and platform, and the contents of ``inputs`` (go.mod, go.sum, the module's own sources). A fresh checkout
    (CI's) then copies what an earlier one built."""
    kept = cached_binary(target.name, package, flags, cwd=cwd, inputs=inputs)
    target.parent.mkdir(exist_ok=True)
    if use_cache and kept.is_file():
        shutil.copyfile(kept, target)
        target.chmod(0o755)
        log(f"{target.name}: the same build from the binary cache ({kept.parent})")
        return
    log(f"building {target.name} ({package}) ...")
    out = subprocess.run(["go", "build", "-trimpath", f"-ldflags={flags}", "-o", str(target), package],
                         cwd=cwd, env=go_env(), capture_output=True, text=True, check=False)
    if out.returncode != 0:
        raise RuntimeError(f"go build {package} failed:\n{out.stderr[-4000:]}")
    try:  # kept for the next checkout; a cache that cannot be written is only slower
        kept.parent.mkdir(parents=True, exist_ok=True)
        partial = kept.with_name(f".{kept.name}.{os.getpid()}")
        shutil.copyfile(target, partial)
        partial.replace(kept)
    except OSError as exc:
        log(f"{target.name}: not kept in the binary cache ({exc})")


def module_dir(module: str) -> Path:
    out = subprocess.run(["go", "list", "-m", "-f", "{{.Dir}}", module], cwd=HERE, env=go_env(),
                         capture_output=True, text=True, check=True)
    return Path(out.stdout.strip())


# -- certificates ----------------------------------------------------------------------------------------------------
def _pem_cert(cert) -> bytes:
    from cryptography.hazmat.primitives import serialization

    return cert.public_bytes(serialization.Encoding.PEM)


def _pem_key(key) -> bytes:
    from cryptography.hazmat.primitives import serialization

    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def make_certs(folder: Path) -> None:
    """A CA; serving certificates for the API server and Kueue's webhooks; an RSA service-account key pair."""
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec, rsa
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    folder.mkdir(parents=True, exist_ok=True)
    now = _dt.datetime.now(_dt.UTC) - _dt.timedelta(hours=1)
    until = now + _dt.timedelta(days=365)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "gpu-portal-realcluster-ca")])
    ca = (x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name).public_key(ca_key.public_key())
          .serial_number(x509.random_serial_number()).not_valid_before(now).not_valid_after(until)
          .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
          .add_extension(x509.KeyUsage(digital_signature=True, content_commitment=False, key_encipherment=False,
                                       data_encipherment=False, key_agreement=False, key_cert_sign=True,
                                       crl_sign=True, encipher_only=False, decipher_only=False), critical=True)
          .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False)
          .sign(ca_key, hashes.SHA256()))
    (folder / "ca.crt").write_bytes(_pem_cert(ca))
    (folder / "ca.key").write_bytes(_pem_key(ca_key))

    def serving(name: str, dns: list[str], ips: list[str]) -> None:
        key = ec.generate_private_key(ec.SECP256R1())
        sans = [x509.DNSName(d) for d in dns] + [x509.IPAddress(ipaddress.ip_address(i)) for i in ips]
        cert = (x509.CertificateBuilder().subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)]))
                .issuer_name(ca_name).public_key(key.public_key()).serial_number(x509.random_serial_number())
                .not_valid_before(now).not_valid_after(until)
                .add_extension(x509.SubjectAlternativeName(sans), critical=False)
                .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]),
                               critical=False)
                .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
                .sign(ca_key, hashes.SHA256()))
        sub = folder / name
        sub.mkdir(exist_ok=True)
        (sub / "tls.crt").write_bytes(_pem_cert(cert))
        (sub / "tls.key").write_bytes(_pem_key(key))

    serving("apiserver", ["localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc",
                          "kubernetes.default.svc.cluster.local"], ["127.0.0.1", "10.0.0.1"])
    serving("webhook", ["localhost"], ["127.0.0.1"])
    sa = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    (folder / "sa.key").write_bytes(_pem_key(sa))
    (folder / "sa.pub").write_bytes(sa.public_key().public_bytes(serialization.Encoding.PEM,
                                                                  serialization.PublicFormat.SubjectPublicKeyInfo))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# -- the control plane -----------------------------------------------------------------------------------------------
@dataclass
class ControlPlane:
    """``with ControlPlane(state_dir) as cp:`` starts everything and stops it on exit; ``cp.kubeconfig`` is the
    admin kubeconfig's path, ``cp.url`` the API server's."""

    state_dir: Path
    kueue: bool = True
    controllers: bool = True
    procs: dict[str, subprocess.Popen] = field(default_factory=dict)
    ports: dict[str, int] = field(default_factory=dict)
    token: str = ""
    timings: dict[str, float] = field(default_factory=dict)
    threads_stop: list = field(default_factory=list)  # helper threads (volumes.py) stopped with the processes

    @property
    def kubeconfig(self) -> Path:
        return self.state_dir / "kubeconfig"

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.ports['apiserver']}"

    @property
    def certs(self) -> Path:
        return self.state_dir / "pki"

    # lifecycle
    def __enter__(self) -> ControlPlane:
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def start(self) -> None:
        started = time.monotonic()
        missing = [n for n in BINARIES if not (BIN / n).exists()]
        if missing:
            raise RuntimeError(f"not built: {', '.join(missing)} (run `make cluster-build`)")
        if self.state_dir.exists():
            shutil.rmtree(self.state_dir)
        (self.state_dir / "logs").mkdir(parents=True)
        make_certs(self.certs)
        self.token = secrets.token_urlsafe(32)
        (self.state_dir / "tokens.csv").write_text(f'{self.token},admin,admin-uid,"system:masters"\n')
        for name in ("etcd", "etcd-peer", "apiserver", "kcm", "scheduler", "webhook", "kueue-health",
                     "kueue-metrics"):
            self.ports[name] = free_port()
        self._write_kubeconfig()
        self._start_etcd()
        self._start_apiserver()
        self._wait(lambda: self._get("/readyz") == 200, "kube-apiserver /readyz", 90)
        self.timings["apiserver_ready_s"] = time.monotonic() - started
        if self.controllers:
            self._start_controller_manager()
            self._start_scheduler()
        if self.kueue:
            self._install_kueue()
            self._start_kueue()
        self.timings["ready_s"] = time.monotonic() - started
        log(f"ready in {self.timings['ready_s']:.1f} s: {self.url}, kubeconfig {self.kubeconfig}")

    def stop(self) -> None:
        """SIGTERM everything but etcd at once, then etcd (so the API server exits cleanly); within ~8 s."""
        for stop in self.threads_stop:
            stop.set()
        others = [p for n, p in self.procs.items() if n != "etcd"]
        last = [p for n, p in self.procs.items() if n == "etcd"]
        for group, within in ((others, 5.0), (last, 3.0)):
            for proc in group:
                if proc.poll() is None:
                    proc.send_signal(signal.SIGTERM)
            deadline = time.monotonic() + within
            for proc in group:
                try:
                    proc.wait(timeout=max(0.05, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
        self.procs.clear()

    def dead(self) -> list[str]:
        """The processes that have exited."""
        return [n for n, p in self.procs.items() if p.poll() is not None]

    # helpers
    def _spawn(self, name: str, args: list[str], env: dict[str, str] | None = None) -> None:
        logf = open(self.state_dir / "logs" / f"{name}.log", "ab")  # noqa: SIM115 kept open for the child
        self.procs[name] = subprocess.Popen([str(BIN / args[0]), *args[1:]], stdout=logf, stderr=subprocess.STDOUT,
                                            stdin=subprocess.DEVNULL, env={**os.environ, **(env or {})})

    def _ssl(self) -> ssl.SSLContext:
        return ssl.create_default_context(cafile=str(self.certs / "ca.crt"))

    def _request(self, method: str, path: str, body: dict | None = None,
                 content_type: str = "application/json") -> tuple[int, dict | str]:
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(self.url + path, data=data, method=method,
                                     headers={"Authorization": f"Bearer {self.token}", "Content-Type": content_type,
                                              "Accept": "application/json"})
        try:
            with urllib.request.urlopen(req, context=self._ssl(), timeout=10) as resp:
                raw = resp.read()
                status = resp.status
        except urllib.error.HTTPError as e:
            raw, status = e.read(), e.code
        except (urllib.error.URLError, OSError) as e:
            return 0, str(e)
        try:
            return status, json.loads(raw) if raw else {}
        except ValueError:
            return status, raw.decode("utf-8", "replace")

    def _get(self, path: str) -> int:
        return self._request("GET", path)[0]

    def apply(self, obj: dict) -> dict:
        """Server-side apply of one object with the admin token (field manager ``realcluster``)."""
        api = obj["apiVersion"]
        kind = obj["kind"]
        plural = {"CustomResourceDefinition": "customresourcedefinitions", "Namespace": "namespaces",
                  "MutatingWebhookConfiguration": "mutatingwebhookconfigurations",
                  "ValidatingWebhookConfiguration": "validatingwebhookconfigurations",
                  "Node": "nodes", "PriorityClass": "priorityclasses"}[kind]
        base = "/api/v1" if api == "v1" else f"/apis/{api}"
        path = f"{base}/{plural}/{obj['metadata']['name']}?fieldManager=realcluster&force=true"
        status, body = self._request("PATCH", path, obj, "application/apply-patch+yaml")
        if status not in (200, 201):
            raise RuntimeError(f"apply {kind} {obj['metadata']['name']}: {status} {body}")
        return body  # type: ignore[return-value]

    def _wait(self, check, what: str, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            dead = self.dead()
            if dead:
                tail = (self.state_dir / "logs" / f"{dead[0]}.log").read_text(errors="replace")[-3000:]
                raise RuntimeError(f"{dead[0]} exited while waiting for {what}:\n{tail}")
            try:
                if check():
                    return
            except OSError:
                pass
            time.sleep(0.25)
        raise RuntimeError(f"timed out after {timeout:.0f} s waiting for {what}")

    def _write_kubeconfig(self) -> None:
        ca = base64.b64encode((self.certs / "ca.crt").read_bytes()).decode()
        cfg = {
            "apiVersion": "v1", "kind": "Config", "current-context": "realcluster",
            "clusters": [{"name": "realcluster", "cluster": {"server": self.url, "certificate-authority-data": ca}}],
            "users": [{"name": "admin", "user": {"token": self.token}}],
            "contexts": [{"name": "realcluster", "context": {"cluster": "realcluster", "user": "admin"}}],
        }
        self.kubeconfig.write_text(yaml.safe_dump(cfg))
        self.kubeconfig.chmod(0o600)

    # the processes
    def _start_etcd(self) -> None:
        p = self.ports
        self._spawn("etcd", ["etcd", "--data-dir", str(self.state_dir / "etcd"), "--name", "realcluster",
                             f"--listen-client-urls=http://127.0.0.1:{p['etcd']}",
                             f"--advertise-client-urls=http://127.0.0.1:{p['etcd']}",
                             f"--listen-peer-urls=http://127.0.0.1:{p['etcd-peer']}",
                             f"--initial-advertise-peer-urls=http://127.0.0.1:{p['etcd-peer']}",
                             f"--initial-cluster=realcluster=http://127.0.0.1:{p['etcd-peer']}",
                             "--unsafe-no-fsync", "--quota-backend-bytes=4294967296", "--log-level=warn"])

    def _start_apiserver(self) -> None:
        p, c = self.ports, self.certs
        self._spawn("kube-apiserver", [
            "kube-apiserver", f"--etcd-servers=http://127.0.0.1:{p['etcd']}",
            "--bind-address=127.0.0.1", "--advertise-address=127.0.0.1", f"--secure-port={p['apiserver']}",
            f"--tls-cert-file={c / 'apiserver/tls.crt'}", f"--tls-private-key-file={c / 'apiserver/tls.key'}",
            f"--client-ca-file={c / 'ca.crt'}", f"--token-auth-file={self.state_dir / 'tokens.csv'}",
            f"--service-account-key-file={c / 'sa.pub'}", f"--service-account-signing-key-file={c / 'sa.key'}",
            "--service-account-issuer=https://kubernetes.default.svc", "--api-audiences=https://kubernetes.default.svc",
            "--service-cluster-ip-range=10.0.0.0/24", "--authorization-mode=RBAC", "--allow-privileged=true",
            "--enable-priority-and-fairness=false", "--profiling=false", "--v=1",
            f"--cert-dir={c / 'apiserver'}",
        ])

    def _component_kubeconfig(self) -> str:
        return str(self.kubeconfig)

    def _start_controller_manager(self) -> None:
        p, c, kc = self.ports, self.certs, self._component_kubeconfig()
        self._spawn("kube-controller-manager", [
            "kube-controller-manager", f"--kubeconfig={kc}", f"--authentication-kubeconfig={kc}",
            f"--authorization-kubeconfig={kc}", "--bind-address=127.0.0.1", f"--secure-port={p['kcm']}",
            "--leader-elect=false", f"--service-account-private-key-file={c / 'sa.key'}",
            f"--root-ca-file={c / 'ca.crt'}", "--use-service-account-credentials=false",
            "--controllers=*,-nodeipam,-nodelifecycle,-cloud-node-lifecycle,-service-lb-controller,"
            "-node-route-controller,-attachdetach,-persistentvolume-expander",
            "--concurrent-job-syncs=20", "--v=1",
        ])

    def _start_scheduler(self) -> None:
        """kube-scheduler as HAMi deploys it beside its extender: the node fit ignores HAMi's per-vGPU memory and
        cores (``nvidia.com/gpumem``/``gpucores``, which no node advertises; HAMi's extender checks them per card).
        No HAMi extender runs here, so a HAMi pod is placed on a node with a free ``nvidia.com/gpu`` slot of its
        flavor, without the per-card check (sandbox/README.md, "Known differences")."""
        p, kc = self.ports, self._component_kubeconfig()
        config = {
            "apiVersion": "kubescheduler.config.k8s.io/v1", "kind": "KubeSchedulerConfiguration",
            "clientConnection": {"kubeconfig": kc, "qps": 200, "burst": 400},
            "leaderElection": {"leaderElect": False},
            "profiles": [{"schedulerName": "default-scheduler", "pluginConfig": [{
                "name": "NodeResourcesFit",
                "args": {"ignoredResources": list(HAMI_IGNORED)},
            }]}],
        }
        cfg_path = self.state_dir / "scheduler-config.yaml"
        cfg_path.write_text(yaml.safe_dump(config))
        self._spawn("kube-scheduler", [
            "kube-scheduler", f"--config={cfg_path}", f"--authentication-kubeconfig={kc}",
            f"--authorization-kubeconfig={kc}", "--bind-address=127.0.0.1", f"--secure-port={p['scheduler']}",
            "--v=1",
        ])

    def _install_kueue(self) -> None:
        """Kueue's CRDs and webhook configurations from its module, rewritten to reach Kueue on loopback."""
        src = module_dir("sigs.k8s.io/kueue") / "config" / "components"
        ca = base64.b64encode((self.certs / "ca.crt").read_bytes()).decode()
        webhook = f"https://127.0.0.1:{self.ports['webhook']}"
        self.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "kueue-system"}})
        names = []
        for path in sorted((src / "crd" / "bases").glob("*.yaml")):
            crd = yaml.safe_load(path.read_text())
            plural = crd["spec"]["names"]["plural"]
            if plural in KUEUE_CONVERTED:
                crd["spec"]["conversion"] = {"strategy": "Webhook", "webhook": {
                    "clientConfig": {"url": f"{webhook}/convert", "caBundle": ca},
                    "conversionReviewVersions": ["v1"]}}
            self.apply(crd)
            names.append(crd["metadata"]["name"])

        def established() -> bool:
            for name in names:
                status, body = self._request("GET", f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{name}")
                conds = (body.get("status") or {}).get("conditions") or [] if isinstance(body, dict) else []
                if not any(c.get("type") == "Established" and c.get("status") == "True" for c in conds):
                    return False
            return True

        self._wait(established, "Kueue's CRDs Established", 60)
        plurals = [n.split(".", 1)[0] for n in names]

        def listable() -> bool:  # Established comes before the API server's cache for it ("storage is initializing")
            return all(self._request("GET", f"/apis/kueue.x-k8s.io/v1beta2/{p}?limit=1")[0] == 200 for p in plurals)

        self._wait(listable, "Kueue's resources listable", 60)
        docs = [d for d in yaml.safe_load_all((src / "webhook" / "manifests.yaml").read_text()) if d]
        self._kueue_webhooks = []
        for doc in docs:
            kept = []
            for hook in doc["webhooks"]:
                path = hook["clientConfig"]["service"]["path"]
                kind = hook["name"].split(".", 1)[0][1:]
                if kind not in KUEUE_WEBHOOK_KINDS:
                    continue
                hook["clientConfig"] = {"url": webhook + path, "caBundle": ca}
                if kind in ("pod", "deployment", "statefulset"):  # as Kueue's kustomization patches them
                    hook["namespaceSelector"] = {"matchExpressions": [{
                        "key": "kubernetes.io/metadata.name", "operator": "NotIn",
                        "values": ["kube-system", "kueue-system"]}]}
                kept.append(hook)
            doc["webhooks"] = kept
            doc["metadata"] = {"name": f"kueue-{doc['metadata']['name']}"}
            self._kueue_webhooks.append(doc)

    def _kueue_metrics_certs(self) -> None:
        """Kueue v0.17 with its own certificate management off reads its metrics server's certificate from a fixed
        path, /etc/kueue/metrics/certs (cmd/kueue/main.go); it gets the webhook's (127.0.0.1). Writing there
        needs root, as on CI's machine; elsewhere, create that folder writable once (see docs/real-cluster.md)."""
        target = Path(os.environ.get("KUEUE_METRICS_CERT_DIR", "/etc/kueue/metrics/certs"))
        try:
            target.mkdir(parents=True, exist_ok=True)
            for name in ("tls.crt", "tls.key"):
                shutil.copyfile(self.certs / "webhook" / name, target / name)
        except PermissionError as exc:
            raise RuntimeError(f"Kueue reads its metrics certificate from {target}, which this user cannot write "
                               f"({exc}): `sudo install -d -o $USER {target}` once") from None

    def _start_kueue(self) -> None:
        p = self.ports
        config = {
            "apiVersion": "config.kueue.x-k8s.io/v1beta2", "kind": "Configuration",
            "namespace": "kueue-system",
            "health": {"healthProbeBindAddress": f"127.0.0.1:{p['kueue-health']}"},
            "metrics": {"bindAddress": f"127.0.0.1:{p['kueue-metrics']}"},
            "webhook": {"host": "127.0.0.1", "port": p["webhook"], "certDir": str(self.certs / "webhook")},
            "leaderElection": {"leaderElect": False},
            "internalCertManagement": {"enable": False},
            "clientConnection": {"qps": 200, "burst": 400},
            "integrations": {"frameworks": KUEUE_FRAMEWORKS},
            # HAMi's per-vGPU memory and cores counted as totals (docs/cluster-objects.md, "HAMi"): the recipe the
            # portal's HAMi quotas assume, the same the sandbox applies.
            "resources": {"transformations": hami_transformations()},
            "managedJobsNamespaceSelector": {"matchExpressions": [{
                "key": "kubernetes.io/metadata.name", "operator": "NotIn", "values": ["kube-system", "kueue-system"]}]},
        }
        self._kueue_metrics_certs()
        cfg_path = self.state_dir / "kueue-config.yaml"
        cfg_path.write_text(yaml.safe_dump(config))
        # The on-demand visibility API is an aggregated API server Kueue serves with a certificate from a fixed
        # path (/visibility); the portal does not use it.
        self._spawn("kueue", ["kueue", f"--config={cfg_path}", f"--kubeconfig={self.kubeconfig}", "--zap-log-level=2",
                              "--feature-gates=VisibilityOnDemand=false"],
                    env={"POD_NAMESPACE": "kueue-system"})

        def webhook_up() -> bool:
            with socket.create_connection(("127.0.0.1", p["webhook"]), timeout=1) as raw, self._ssl().wrap_socket(raw, server_hostname="127.0.0.1"):
                return True

        self._wait(webhook_up, "Kueue's webhook server", 90)

        def kueue_ready() -> bool:
            with urllib.request.urlopen(f"http://127.0.0.1:{p['kueue-health']}/readyz", timeout=2) as r:
                return r.status == 200

        self._wait(kueue_ready, "Kueue /readyz", 90)
        for doc in self._kueue_webhooks:
            self.apply(doc)
