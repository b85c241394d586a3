"""deploy/k8s: every manifest is valid Kubernetes, offline (kubernetes-validate's bundled
schemas), and the StatefulSet is wired to what the worker really reads."""

from __future__ import annotations

import copy
import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from onceflow.app.settings import WorkerSettings
from onceflow.triggers import load_triggers

kubernetes_validate = pytest.importorskip(
    "kubernetes_validate.utils",
    reason="kubernetes-validate comes with the dev extra (pip install -e '.[dev]')")

K8S = Path(__file__).resolve().parents[2] / "deploy" / "k8s"
# The oldest Kubernetes the manifests are meant for, and the newest the package knows.
VERSIONS = ("1.30.0", kubernetes_validate.latest_version())


def documents(path: Path) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc]


def manifests() -> dict[str, list[dict[str, Any]]]:
    return {path.name: documents(path) for path in sorted(K8S.glob("*.yaml"))
            if path.name != "kustomization.yaml"}


def every_resource() -> dict[tuple[str, str], dict[str, Any]]:
    return {(doc["kind"], doc["metadata"]["name"]): doc
            for docs in manifests().values() for doc in docs}


def worker() -> dict[str, Any]:
    return every_resource()[("StatefulSet", "onceflow")]


def container() -> dict[str, Any]:
    (only,) = worker()["spec"]["template"]["spec"]["containers"]
    return only


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("name", sorted(manifests()))
def test_every_manifest_is_valid_kubernetes(name: str, version: str) -> None:
    for doc in manifests()[name]:
        kubernetes_validate.validate(doc, version, strict=True)


def test_the_validator_rejects_a_broken_statefulset() -> None:
    broken = copy.deepcopy(worker())
    broken["spec"]["template"]["spec"]["containers"][0]["livenessProbe"]["httpGet"][
        "paht"] = "/livez"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, VERSIONS[-1], strict=True)
    broken = copy.deepcopy(worker())
    broken["spec"]["replicas"] = "three"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, VERSIONS[-1], strict=True)


def test_kustomization_applies_every_manifest_but_the_example_secrets() -> None:
    kustomization = yaml.safe_load((K8S / "kustomization.yaml").read_text())
    assert sorted(kustomization["resources"]) == sorted(
        name for name in manifests() if name != "secrets.example.yaml")


def test_every_setting_the_pods_get_is_one_the_worker_reads() -> None:
    known = {f"ONCEFLOW_{name.upper()}" for name in WorkerSettings.model_fields}
    try:
        from onceflow.app.security import SECURITY_FIELDS
    except ImportError:
        SECURITY_FIELDS = ()
    known |= {f"ONCEFLOW_{name.upper()}" for name in SECURITY_FIELDS}
    settings = every_resource()[("ConfigMap", "onceflow-settings")]["data"]
    given = set(settings) | {var["name"] for var in container()["env"]}
    assert given <= known, f"not a worker setting: {sorted(given - known)}"


def test_the_pod_advertises_its_pod_ip_and_listens_on_every_address() -> None:
    env = {var["name"]: var for var in container()["env"]}
    assert env["ONCEFLOW_WEB_BIND"]["value"] == "0.0.0.0"
    assert env["ONCEFLOW_WEB_ADVERTISE"]["valueFrom"]["fieldRef"]["fieldPath"] == \
        "status.podIP"
    port = int(env["ONCEFLOW_WEB_PORT"]["value"])
    assert container()["ports"] == [{"name": "web", "containerPort": port}]


def test_probes_ask_livez_and_servingz_on_the_web_port() -> None:
    """Readiness is /servingz: /readyz drops every pod at once during a rebalance."""
    assert container()["livenessProbe"]["httpGet"] == {"path": "/livez", "port": "web"}
    assert container()["readinessProbe"]["httpGet"] == {"path": "/servingz", "port": "web"}


def test_the_grace_period_outlasts_the_longest_retry_wait(tmp_path: Path) -> None:
    """SIGTERM waits for the batch in hand, which may be waiting out a trigger's retries."""
    data = every_resource()[("ConfigMap", "onceflow-triggers")]["data"]
    path = tmp_path / "triggers.toml"
    path.write_text(data["triggers.toml"])
    longest = max(t.max_retry_attempts * t.retry_interval / 1000  # ms -> s
                  for t in load_triggers(path).triggers)
    grace = worker()["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
    assert longest > 0 and grace >= longest + 60, (grace, longest)


def test_the_network_policy_admits_workers_and_prometheus_on_the_web_port_only() -> None:
    policy = every_resource()[("NetworkPolicy", "onceflow")]["spec"]
    selector = worker()["spec"]["selector"]["matchLabels"]
    assert policy["podSelector"]["matchLabels"] == selector
    assert sorted(policy["policyTypes"]) == ["Egress", "Ingress"]
    (rule,) = policy["ingress"]
    assert rule["ports"] == [{"port": "web", "protocol": "TCP"}]
    peers = rule["from"]
    assert {"podSelector": {"matchLabels": selector}} in peers
    (prometheus,) = [p for p in peers if "namespaceSelector" in p]
    assert prometheus["podSelector"]["matchLabels"] == {"app.kubernetes.io/name": "prometheus"}
    port = int({v["name"]: v for v in container()["env"]}["ONCEFLOW_WEB_PORT"]["value"])
    egress = {(port_["port"], port_["protocol"]) for rule in policy["egress"]
              for port_ in rule["ports"]}
    brokers = {int(url.rsplit(":", 1)[1]) for url in every_resource()[
        ("ConfigMap", "onceflow-settings")]["data"]["ONCEFLOW_BROKER_URL"].split(",")}
    assert egress >= {(port, "TCP"), (53, "UDP"), (53, "TCP")} | {
        (b, "TCP") for b in brokers}, egress


def test_the_image_is_set_by_kustomize() -> None:
    """`kustomize edit set image onceflow=...` rewrites the entry the container names."""
    kustomization = yaml.safe_load((K8S / "kustomization.yaml").read_text())
    assert container()["image"] in {image["name"] for image in kustomization["images"]}


def kubectl_kustomize(folder: Path) -> list[dict[str, Any]]:
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("kubectl is not installed")
    done = subprocess.run([kubectl, "kustomize", str(folder)], capture_output=True,
                          text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    return [doc for doc in yaml.safe_load_all(done.stdout) if doc]


def test_an_overlay_sets_the_image_and_adds_the_operator_component(tmp_path: Path) -> None:
    overlay = tmp_path / "overlay"
    overlay.mkdir()
    (overlay / "kustomization.yaml").write_text(yaml.safe_dump({
        "apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization",
        "resources": [os.path.relpath(K8S, overlay)],
        "components": [os.path.relpath(K8S / "prometheus-operator", overlay)],
        "images": [{"name": "onceflow", "newName": "registry.test/team/onceflow",
                    "newTag": "9.9.9"}]}))
    rendered = {(doc["kind"], doc["metadata"]["name"]): doc
                for doc in kubectl_kustomize(overlay)}
    pod = rendered[("StatefulSet", "onceflow")]["spec"]["template"]["spec"]
    assert pod["containers"][0]["image"] == "registry.test/team/onceflow:9.9.9"
    assert ("ServiceMonitor", "onceflow") in rendered
    assert ("PrometheusRule", "onceflow") in rendered
    base = {(doc["kind"], doc["metadata"]["name"]) for doc in kubectl_kustomize(K8S)}
    assert not any(kind.startswith(("ServiceMonitor", "PrometheusRule")) for kind, _ in base)


def operator_resources() -> dict[str, dict[str, Any]]:
    folder = K8S / "prometheus-operator"
    kustomization = yaml.safe_load((folder / "kustomization.yaml").read_text())
    assert kustomization["kind"] == "Component"
    return {doc["kind"]: doc for name in kustomization["resources"]
            for doc in documents(folder / name)}


def test_the_service_monitor_scrapes_every_worker_on_the_web_port() -> None:
    """kubernetes-validate knows no CRDs: the ServiceMonitor's structure is checked here."""
    monitor = operator_resources()["ServiceMonitor"]
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    assert set(monitor) == {"apiVersion", "kind", "metadata", "spec"}
    assert set(monitor["spec"]) == {"selector", "endpoints"}
    selected = [svc for (kind, _), svc in every_resource().items() if kind == "Service"
                and monitor["spec"]["selector"]["matchLabels"].items()
                <= svc["metadata"]["labels"].items()]
    assert [svc["metadata"]["name"] for svc in selected] == [worker()["spec"]["serviceName"]]
    assert selected[0]["spec"]["publishNotReadyAddresses"] is True
    (endpoint,) = monitor["spec"]["endpoints"]
    assert set(endpoint) <= {"port", "path", "interval", "scrapeTimeout"}
    assert endpoint["port"] in {port["name"] for port in selected[0]["spec"]["ports"]}
    assert endpoint["path"] == "/metrics"
    # The CRD's duration pattern: digits and a unit.
    for key in ("interval", "scrapeTimeout"):
        assert re.fullmatch(r"([0-9]+(ms|s|m|h))+", endpoint[key]), endpoint[key]


def test_each_pod_keeps_its_tables_on_its_own_volume() -> None:
    spec = worker()["spec"]
    env = {var["name"]: var.get("value") for var in container()["env"]}
    (claim,) = spec["volumeClaimTemplates"]
    mounts = {m["name"]: m["mountPath"] for m in container()["volumeMounts"]}
    assert mounts[claim["metadata"]["name"]] == env["ONCEFLOW_DATA_DIR"]
    assert claim["spec"]["accessModes"] == ["ReadWriteOnce"]
    headless = every_resource()[("Service", spec["serviceName"])]
    assert headless["spec"]["clusterIP"] == "None"
    selector = spec["selector"]["matchLabels"]
    assert headless["spec"]["selector"] == selector
    pdb = every_resource()[("PodDisruptionBudget", "onceflow")]
    assert pdb["spec"]["selector"]["matchLabels"] == selector


def test_non_root_with_a_read_only_root_filesystem_and_resources() -> None:
    pod = worker()["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] != 0
    context = container()["securityContext"]
    assert context["readOnlyRootFilesystem"] is True
    assert context["allowPrivilegeEscalation"] is False
    assert context["capabilities"]["drop"] == ["ALL"]
    resources = container()["resources"]
    assert resources["requests"]["cpu"] and resources["requests"]["memory"]
    assert resources["limits"]["memory"]


def test_secrets_come_from_the_secrets_the_example_describes() -> None:
    examples = {doc["metadata"]["name"]: doc for doc in manifests()["secrets.example.yaml"]}
    pod = worker()["spec"]["template"]["spec"]
    refs = [var["valueFrom"]["secretKeyRef"] for var in container()["env"]
            if "secretKeyRef" in var.get("valueFrom", {})]
    refs += [{"name": volume["secret"]["secretName"], "key": item["key"]}
             for volume in pod["volumes"] if "secret" in volume
             for item in volume["secret"]["items"]]
    assert {ref["name"] for ref in refs} == {"onceflow-admin", "onceflow-kafka"}
    for ref in refs:
        assert ref["key"] in examples[ref["name"]]["stringData"], ref
    secret_env = {var["name"] for var in container()["env"] if "secretKeyRef"
                  in var.get("valueFrom", {})}
    assert {"ONCEFLOW_ADMIN_TOKEN", "ONCEFLOW_SASL_USERNAME"} <= secret_env


def test_the_mounted_files_are_where_the_settings_point(tmp_path: Path) -> None:
    pod = worker()["spec"]["template"]["spec"]
    mounts = {m["name"]: m["mountPath"] for m in container()["volumeMounts"]}
    files = set()
    for volume in pod["volumes"]:
        source = volume.get("secret") or volume.get("configMap")
        if source is None:
            continue
        if "items" in source:
            files |= {f"{mounts[volume['name']]}/{item['path']}" for item in source["items"]}
        else:
            name = source.get("name")
            data = every_resource()[("ConfigMap", name)]["data"]
            files |= {f"{mounts[volume['name']]}/{key}" for key in data}
    settings = every_resource()[("ConfigMap", "onceflow-settings")]["data"]
    for name in ("ONCEFLOW_SSL_CAFILE", "ONCEFLOW_SASL_PASSWORD_FILE"):
        assert settings[name] in files, name
    args = container()["args"]
    assert args[:2] == ["worker", "--triggers"] and args[2] in files


def test_the_trigger_file_of_the_configmap_loads(tmp_path: Path) -> None:
    data = every_resource()[("ConfigMap", "onceflow-triggers")]["data"]
    path = tmp_path / "triggers.toml"
    path.write_text(data["triggers.toml"])
    triggers = load_triggers(path)
    assert [t.name for t in triggers.triggers] == ["billing", "fulfil"]
