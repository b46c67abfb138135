"""deploy/kubernetes: every overlay renders (kubectl kustomize), validates strictly against the Kubernetes 1.37
schemas (kubernetes-validate), keeps the restricted security context, and the ClusterRole is exactly what the
code's cluster calls need (tests/deploy/rbac_from_code.py)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

from tests.deploy import rbac_from_code

ROOT = Path(__file__).resolve().parents[2]
OVERLAYS = ("sandbox", "production")
K8S_VERSION = "1.37.0"  # the newest schemas kubernetes-validate ships


def render(overlay: str) -> list[dict]:
    kubectl = shutil.which("kubectl")
    assert kubectl, "kubectl is needed to render the manifests"
    out = subprocess.run([kubectl, "kustomize", str(ROOT / "deploy/kubernetes/overlays" / overlay)],
                         capture_output=True, text=True, timeout=60, check=False)
    assert out.returncode == 0, out.stderr
    return [doc for doc in yaml.safe_load_all(out.stdout) if doc]


@pytest.fixture(scope="module")
def rendered() -> dict[str, list[dict]]:
    return {overlay: render(overlay) for overlay in OVERLAYS}


def by_kind(objects: list[dict], kind: str) -> dict[str, dict]:
    return {o["metadata"]["name"]: o for o in objects if o["kind"] == kind}


def pod_specs(objects: list[dict]) -> dict[str, dict]:
    return {o["metadata"]["name"]: o["spec"]["template"]["spec"] for o in objects if o["kind"] in ("Deployment", "Job")}


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_overlay_renders_the_workloads(rendered, overlay):
    objects = rendered[overlay]
    assert set(by_kind(objects, "Deployment")) == {"gpu-portal-web", "gpu-portal-worker", "gpu-portal-beat"}
    assert set(by_kind(objects, "Job")) == {"gpu-portal-migrate"}
    assert set(by_kind(objects, "PodDisruptionBudget")) == {"gpu-portal-web", "gpu-portal-worker"}
    assert set(by_kind(objects, "HorizontalPodAutoscaler")) == {"gpu-portal-web"}
    assert {o["metadata"].get("namespace") for o in objects if o["kind"] not in ("Namespace", "ClusterRole", "ClusterRoleBinding")} == {"gpu-portal"}
    beat = by_kind(objects, "Deployment")["gpu-portal-beat"]
    assert beat["spec"]["replicas"] == 1 and beat["spec"]["strategy"] == {"type": "Recreate"}
    web = by_kind(objects, "Deployment")["gpu-portal-web"]["spec"]["template"]["spec"]
    assert web["topologySpreadConstraints"]
    probes = web["containers"][0]
    assert probes["livenessProbe"]["httpGet"]["path"] == "/healthz/live"
    assert probes["readinessProbe"]["httpGet"]["path"] == "/healthz/ready"
    for role in ("worker", "beat"):  # liveness from the heartbeat file, no broker round trip
        container = by_kind(objects, "Deployment")[f"gpu-portal-{role}"]["spec"]["template"]["spec"]["containers"][0]
        for probe in ("livenessProbe", "readinessProbe"):
            assert container[probe]["exec"]["command"][-3:] == ["/app/deploy/entrypoint.py", "healthcheck", role]
    paths = {p["path"] for ing in by_kind(objects, "Ingress").values() for r in ing["spec"]["rules"] for p in r["http"]["paths"]}
    assert paths == {"/", "/notebooks/"}
    binding = by_kind(objects, "ClusterRoleBinding")["gpu-portal"]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "gpu-portal", "namespace": "gpu-portal"}]


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_object_validates_strictly(rendered, overlay):
    for obj in rendered[overlay]:
        kubernetes_validate.validate(obj, K8S_VERSION, strict=True)


def test_strict_validation_refuses_an_unknown_field(rendered):
    web = dict(by_kind(rendered["production"], "Deployment")["gpu-portal-web"])
    web["spec"] = {**web["spec"], "replica": 3}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(web, K8S_VERSION, strict=True)


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_pods_are_restricted(rendered, overlay):
    for name, spec in pod_specs(rendered[overlay]).items():
        pod = spec["securityContext"]
        assert pod["runAsNonRoot"] is True and pod["seccompProfile"] == {"type": "RuntimeDefault"}, name
        assert spec["automountServiceAccountToken"] is False, name
        assert spec["serviceAccountName"] == "gpu-portal", name
        for c in spec["containers"]:
            sc = c["securityContext"]
            assert sc["readOnlyRootFilesystem"] is True and sc["allowPrivilegeEscalation"] is False, name
            assert sc["capabilities"] == {"drop": ["ALL"]}, name
            assert c["resources"]["requests"] and c["resources"]["limits"], name
            # /tmp is the only writable place; the projected token is mounted read-only.
            assert [m["mountPath"] for m in c["volumeMounts"] if not m.get("readOnly")] == ["/tmp"], name
            # Settings from the ConfigMap and Secrets; the kubeconfig Fernet key from its own Secret.
            refs = {k: v["name"] for e in c["envFrom"] for k, v in e.items()}
            assert refs["configMapRef"].startswith("gpu-portal-config")
            fernet = next(e for e in c["env"] if e["name"] == "PORTAL_ENCRYPTION_KEY")
            assert fernet["valueFrom"]["secretKeyRef"]["name"].startswith("gpu-portal-fernet")


def test_sandbox_overlay_generates_its_secrets_production_expects_them(rendered):
    assert {n.rsplit("-", 1)[0] for n in by_kind(rendered["sandbox"], "Secret")} >= {"gpu-portal-env", "gpu-portal-fernet"}
    assert set(by_kind(rendered["production"], "Secret")) == set()  # the operator's; no long-lived token Secret


def test_network_policies_deny_by_default(rendered):
    policies = by_kind(rendered["production"], "NetworkPolicy")
    deny = policies["gpu-portal-default-deny"]["spec"]
    assert deny["podSelector"] == {} and set(deny["policyTypes"]) == {"Ingress", "Egress"} and "ingress" not in deny
    web = policies["gpu-portal-web-ingress"]["spec"]
    assert web["ingress"][0]["ports"] == [{"protocol": "TCP", "port": 8000}]


def test_no_cluster_call_is_left_unexplained():
    assert rbac_from_code.unmapped_sites() == []
    verbs = {s["verb"] for s in rbac_from_code.call_sites()}
    assert verbs == {"apply", "get", "list", "delete", "watch", "pod_log", "pod_log_read", "service_proxy", "node_cordon",
                     "node_label", "finalizer_remove", "patch"}


def test_cluster_role_grants_exactly_what_the_code_uses(rendered):
    roles = by_kind(rendered["production"], "ClusterRole")
    role = roles["gpu-portal"]
    # The one rule with a name: the portal may bind gpu-portal-namespaced (in the RoleBindings it writes), no other role.
    bind = [r for r in role["rules"] if "bind" in r["verbs"]]
    assert bind == [{"apiGroups": ["rbac.authorization.k8s.io"], "resources": ["clusterroles"],
                     "resourceNames": ["gpu-portal-namespaced"], "verbs": ["bind"]}]
    role = {**role, "rules": [r for r in role["rules"] if r not in bind]}
    # Secrets only through the per-namespace RoleBinding: the cluster-wide role holds none of them.
    namespaced = rbac_from_code.role_rules(roles["gpu-portal-namespaced"])
    assert {resource for _, resource, _ in namespaced} == {"secrets"}
    assert not [t for t in rbac_from_code.role_rules(role) if t[1] == "secrets"]
    granted = rbac_from_code.role_rules(role) | namespaced
    needed = rbac_from_code.required_rules()
    assert granted - needed == set(), "granted but never used by the code"
    assert needed - granted == set(), "used by the code but not granted"
    assert ("kueue.x-k8s.io", "clusterqueues", "patch") in needed  # the derivation sees the reconcile
    assert ("", "pods/log", "get") in needed and ("", "services/proxy", "create") in needed


def test_cluster_role_bindings_bind_only_the_cluster_wide_role(rendered):
    objects = rendered["production"]
    assert {b["roleRef"]["name"] for b in by_kind(objects, "ClusterRoleBinding").values()} == {"gpu-portal"}
    assert not by_kind(objects, "RoleBinding")  # the portal writes those into project namespaces itself


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_worker_and_beat_wait_for_the_migrations_like_web(rendered, overlay):
    deployments = by_kind(rendered[overlay], "Deployment")
    # web: not ready (so the rollout does not go on) until /healthz/ready finds every migration applied.
    web = deployments["gpu-portal-web"]["spec"]["template"]["spec"]
    assert web["containers"][0]["readinessProbe"]["httpGet"]["path"] == "/healthz/ready"
    for role in ("worker", "beat"):
        spec = deployments[f"gpu-portal-{role}"]["spec"]["template"]["spec"]
        inits = spec.get("initContainers") or []
        assert [c["args"] for c in inits] == [["await-migrations"]], role
        init, main = inits[0], spec["containers"][0]
        assert init["image"] == main["image"] and init["envFrom"] == main["envFrom"]
        assert init["securityContext"]["readOnlyRootFilesystem"] is True
        assert {m["mountPath"] for m in init["volumeMounts"]} == {"/tmp"}


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_portal_identity_is_a_projected_short_lived_token(rendered, overlay):
    objects = rendered[overlay]
    assert not [o for o in objects if o["kind"] == "Secret" and o.get("type") == "kubernetes.io/service-account-token"]
    for name, spec in pod_specs(objects).items():
        if name == "gpu-portal-migrate":
            assert not [v for v in spec.get("volumes", []) if "projected" in v]
            continue
        assert spec["automountServiceAccountToken"] is False
        [volume] = [v for v in spec["volumes"] if v["name"] == "cluster-token"]
        [source] = volume["projected"]["sources"]
        assert source["serviceAccountToken"]["expirationSeconds"] <= 3600
        mounts = [m for m in spec["containers"][0]["volumeMounts"] if m["name"] == "cluster-token"]
        assert mounts and all(m["readOnly"] for m in mounts)
