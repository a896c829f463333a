"""The Kubernetes install path of docs/deploy.md, built offline with `kubectl kustomize` and validated like
the shipped manifests (kubernetes-validate --strict, the Prometheus Operator's CRD schemas). No cluster runs
here: what a cluster does with them (the NetworkPolicy enforced, probes run) is not tested."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support.tools import python_module
from tokwatch.cli import build_parser

ROOT = Path(__file__).resolve().parents[1]
KUBE = ROOT / "deploy" / "kubernetes"
DOC = ROOT / "docs" / "deploy.md"
BASE_IN_DOC = "../tokwatch/deploy/kubernetes"  # the overlay in docs/deploy.md sits beside a checkout


def _docs(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text(encoding="utf-8")) if d]


def _statefulsets() -> list[dict[str, Any]]:
    return [d for p in (KUBE / "statefulset.yaml", KUBE / "sharded" / "statefulset.yaml") for d in _docs(p)
            if d["kind"] == "StatefulSet"]  # fmt: skip


def _container(sts: dict[str, Any]) -> dict[str, Any]:
    (container,) = sts["spec"]["template"]["spec"]["containers"]
    return container  # type: ignore[no-any-return]


def _documented_overlay() -> str:
    text = DOC.read_text(encoding="utf-8")
    blocks = re.findall(r"```yaml\n(.*?)```", text, re.S)
    (overlay,) = [b for b in blocks if "kind: Kustomization" in b]
    return overlay


def _kustomize(directory: Path) -> list[dict[str, Any]]:
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("kubectl not installed")
    proc = subprocess.run(
        [kubectl, "kustomize", str(directory)], capture_output=True, text=True, timeout=120, check=False
    )
    assert proc.returncode == 0, proc.stderr
    return [d for d in yaml.safe_load_all(proc.stdout) if d]


def test_the_documented_overlay_sets_image_release_label_and_prometheus_namespace(tmp_path: Path) -> None:
    """docs/deploy.md's overlay (image from your registry, kube-prometheus-stack installed as `prometheus`,
    Prometheus in `observability`) builds, and the result validates like the shipped manifests."""
    overlay = tmp_path / "my-tokwatch"
    overlay.mkdir()
    text = _documented_overlay()
    assert BASE_IN_DOC in text
    (overlay / "kustomization.yaml").write_text(text.replace(BASE_IN_DOC, os.path.relpath(KUBE, overlay)))
    built = _kustomize(overlay)
    by_kind: dict[str, list[dict[str, Any]]] = {}
    for doc in built:
        by_kind.setdefault(doc["kind"], []).append(doc)
    (sts,) = by_kind["StatefulSet"]
    assert _container(sts)["image"] == "registry.example.com/platform/tokwatch:0.1.0"
    for kind in ("ServiceMonitor", "PrometheusRule"):
        (doc,) = by_kind[kind]
        assert doc["metadata"]["labels"]["release"] == "prometheus", kind
    (policy,) = by_kind["NetworkPolicy"]
    (peer,) = policy["spec"]["ingress"][0]["from"]
    assert peer["namespaceSelector"]["matchLabels"] == {"kubernetes.io/metadata.name": "observability"}
    assert {d["metadata"].get("namespace") for d in built} == {"llm-monitoring"}

    tool = python_module("kubernetes_validate")
    if tool is None:
        pytest.skip("kubernetes-validate not installed (pip install -e '.[test]')")
    files = []
    for i, doc in enumerate(d for d in built if d["apiVersion"] != "monitoring.coreos.com/v1"):
        files.append(tmp_path / f"built-{i}.yaml")
        files[-1].write_text(yaml.safe_dump(doc))
    proc = subprocess.run(
        [*tool, "--strict", *map(str, files)], capture_output=True, text=True, timeout=300, check=False
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    import jsonschema

    schemas = ROOT / "tests" / "data" / "schemas"
    for kind, plural in (("ServiceMonitor", "servicemonitors"), ("PrometheusRule", "prometheusrules")):
        schema = json.loads((schemas / f"{plural}.monitoring.coreos.com-v1.json").read_text())
        jsonschema.Draft7Validator(schema).validate(by_kind[kind][0])


def test_images_entries_name_the_image_the_statefulsets_use() -> None:
    """`kustomize edit set image tokwatch=REGISTRY/tokwatch:TAG` rewrites the `images:` entry named
    `tokwatch`, which both kustomizations carry for the image both StatefulSets name."""
    for kustomization in (KUBE / "kustomization.yaml", KUBE / "sharded" / "kustomization.yaml"):
        (entry,) = yaml.safe_load(kustomization.read_text(encoding="utf-8"))["images"]
        assert entry == {"name": "tokwatch", "newName": "tokwatch", "newTag": "0.1.0"}, kustomization
    for sts in _statefulsets():
        assert _container(sts)["image"] == "tokwatch:0.1.0"
    built = _kustomize(KUBE / "sharded")
    (sts,) = [d for d in built if d["kind"] == "StatefulSet"]
    assert _container(sts)["image"] == "tokwatch:0.1.0"


def test_both_statefulsets_take_api_keys_from_an_optional_secret_and_no_token() -> None:
    for sts in _statefulsets():
        pod = sts["spec"]["template"]["spec"]
        assert pod["automountServiceAccountToken"] is False, sts["metadata"]["name"]
        assert _container(sts)["envFrom"] == [{"secretRef": {"name": "tokwatch-api-keys", "optional": True}}]


def test_health_checks_run_tokwatch_healthcheck_everywhere() -> None:
    """Kubernetes exec probes, the compose healthchecks and the Dockerfile HEALTHCHECK all run `tokwatch
    healthcheck` with flags the real parser accepts (tests/commands/test_healthcheck.py runs the command)."""
    commands = []
    for sts in _statefulsets():
        container = _container(sts)
        commands.append(container["livenessProbe"]["exec"]["command"])
        commands.append(container["readinessProbe"]["exec"]["command"])
        assert container["readinessProbe"]["exec"]["command"][-2:] == ["--url", "/-/ready"]
        assert all(container[p]["timeoutSeconds"] >= 5 for p in ("livenessProbe", "readinessProbe"))
    services = yaml.safe_load((ROOT / "docker-compose.yml").read_text(encoding="utf-8"))["services"]
    for name in ("tokwatch", "tokwatch-demo"):
        test = services[name]["healthcheck"]["test"]
        assert test[0] == "CMD"
        commands.append(test[1:])
    (line,) = [
        x for x in (ROOT / "deploy" / "Dockerfile").read_text().splitlines() if x.startswith("HEALTHCHECK")
    ]
    commands.append(json.loads(line.split(" CMD ", 1)[1]))
    assert len(commands) == 7
    parser = build_parser()
    for command in commands:
        assert command[:2] == ["tokwatch", "healthcheck"], command
        args = parser.parse_args(command[1:])
        assert args.command == "healthcheck", shlex.join(command)


def test_network_policies_admit_only_prometheus_on_9477() -> None:
    for path, pods in (
        (KUBE / "networkpolicy.yaml", KUBE / "statefulset.yaml"),
        (KUBE / "sharded" / "networkpolicy.yaml", KUBE / "sharded" / "statefulset.yaml"),
    ):
        (policy,) = _docs(path)
        (sts,) = [d for d in _docs(pods) if d["kind"] == "StatefulSet"]
        spec = policy["spec"]
        assert (
            spec["podSelector"]["matchLabels"].items()
            <= sts["spec"]["template"]["metadata"]["labels"].items()
        )
        assert spec["policyTypes"] == ["Ingress"]
        (rule,) = spec["ingress"]
        # one peer holding both selectors: Prometheus pods AND in the monitoring namespace (two peers
        # would admit either)
        (peer,) = rule["from"]
        assert peer == {
            "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}},
            "podSelector": {"matchLabels": {"app.kubernetes.io/name": "prometheus"}},
        }
        assert rule["ports"] == [{"protocol": "TCP", "port": 9477}]
        assert _container(sts)["ports"] == [{"name": "http", "containerPort": 9477}]


def test_monitor_and_rule_carry_the_kube_prometheus_stack_release_label() -> None:
    for path in (
        KUBE / "servicemonitor.yaml",
        KUBE / "sharded" / "servicemonitor.yaml",
        KUBE / "prometheusrule.yaml",
    ):
        (doc,) = _docs(path)
        assert doc["metadata"]["labels"]["release"] == "kube-prometheus-stack", path
