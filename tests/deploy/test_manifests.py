"""deploy/k8s: every manifest is valid Kubernetes, offline (kubernetes-validate's bundled
schemas), and the StatefulSet is wired to what the worker really reads."""

from __future__ import annotations

import copy
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


def test_probes_ask_livez_and_readyz_on_the_web_port() -> None:
    assert container()["livenessProbe"]["httpGet"] == {"path": "/livez", "port": "web"}
    assert container()["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "web"}


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
