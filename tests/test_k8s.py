"""Offline checks of the deployment in k8s/ and the Dockerfile.

Every overlay is rendered with kustomize; core resources are validated strictly against the
Kubernetes schemas that kubernetes-validate ships (pinned version below); custom resources against
the operators' own CustomResourceDefinitions (Strimzi's KafkaTopic and KafkaUser, the Prometheus
Operator's ServiceMonitor and PrometheusRule, KubeRay's RayCluster, pinned and fetched by .ci/k8s-setup.sh into
tools/k8s/crds), strictly: an unknown field fails as it does under the API server's strict field
validation, except where the CRD preserves unknown fields; their metadata with the core ObjectMeta
schema. Alert rules with ``promtool check rules`` and the unit
tests in k8s/tests/alerts-test.yaml (overlays/ray: those of the base rules it keeps, and
k8s/tests/alerts-test-ray.yaml); dashboard queries with promtool's parser. The manifests are
also held to the code they deploy (overlays/ray, the sharded runtime on a RayCluster, in its own
section below): the mounted config loads with :func:`stream_vips.service.build.load_config`,
metric names exist in :class:`stream_vips.service.metrics.Metrics`, ports, paths and topics agree.

Tools come from .ci/k8s-setup.sh. Outside CI a missing tool skips the tests that need it; in CI
(``CI`` set) it fails them.

Write the rendered alert rules for a manual ``promtool test rules``::

    python tests/test_k8s.py --write-rules k8s/overlays/prod /tmp/rules
"""

from __future__ import annotations

import copy
import hashlib
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import sysconfig
from collections.abc import Iterator
from functools import cache
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
K8S = ROOT / "k8s"
KUBERNETES_VERSION = "1.32.0"  # a version kubernetes-validate 1.37.0 ships strict schemas for
RULES_FILE = "stream-vips.rules.yaml"
CRDS = ROOT / "tools" / "k8s" / "crds"  # .ci/k8s-setup.sh: the operators' CRDs, pinned by sha256
CUSTOM_KINDS = {
    ("kafka.strimzi.io/v1", "KafkaTopic"): "kafkatopics.kafka.strimzi.io.yaml",  # Strimzi 0.49.0
    ("kafka.strimzi.io/v1", "KafkaUser"): "kafkausers.kafka.strimzi.io.yaml",
    ("monitoring.coreos.com/v1", "ServiceMonitor"): "servicemonitors.monitoring.coreos.com.yaml",  # v0.85.0
    ("monitoring.coreos.com/v1", "PrometheusRule"): "prometheusrules.monitoring.coreos.com.yaml",
    ("ray.io/v1", "RayCluster"): "rayclusters.ray.io.yaml",  # KubeRay v1.6.2
}
# The only CEL rules in a pinned CRD (a JSON Schema validator skips them): KubeRay's on
# spec.managedBy, which the RayCluster leaves unset (checked below), so they never apply.
KNOWN_CEL_RULES = {
    "rayclusters.ray.io.yaml": ["self == oldSelf", "self in ['ray.io/kuberay-operator', 'kueue.x-k8s.io/multikueue']"],
}
# DNS-1123 subdomain: what the API server requires of every object's name (ObjectMeta validation)
DNS1123_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
REQUIRED_ALERTS = {
    "StreamVipsBudget80PercentSpent",
    "StreamVipsBudgetExhausted",
    "StreamVipsUpdatesStalled",
    "StreamVipsDeadLetterRateHigh",
    "StreamVipsPublishFailures",
    "StreamVipsConsumerLagGrowing",
    "StreamVipsHaltedOnRejectedData",
    "StreamVipsInputTopicMissing",
    "StreamVipsNoInputPartitions",
    "StreamVipsRecordsNotConsumed",
}
# Grafana's variables, replaced by a value of the same syntactic kind before promtool parses a query.
GRAFANA_VARIABLES = {
    "$__rate_interval": "1m",
    "$__interval": "1m",
    "$__range": "1h",
    "$namespace": "stream-vips",
    "$pod": ".*",
}

RAY_OVERLAY = "overlays/ray"  # the sharded runtime: a RayCluster instead of the StatefulSet
OVERLAYS = ["base"] + sorted(
    str(p.parent.relative_to(K8S)) for p in K8S.glob("overlays/*/kustomization.yaml")
    if str(p.parent.relative_to(K8S)) != RAY_OVERLAY
)


# ---------------------------------------------------------------------------------------------
# tools


def require(tool: str, installed_by: str = ".ci/k8s-setup.sh") -> str:
    """Path of ``tool``; a missing tool skips locally and fails in CI."""
    path = shutil.which(tool)
    if path is None:
        message = f"{tool} not found (installed by {installed_by})"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    return path


def require_script(name: str, installed_by: str) -> str:
    """A console script of this interpreter's environment (pyenv may have no shim for it yet)."""
    path = Path(sysconfig.get_path("scripts")) / name
    return str(path) if path.is_file() else require(name, installed_by)


@cache
def _kustomize_command() -> tuple[str, ...] | None:
    """``kubectl kustomize`` when this kubectl renders the base, else a standalone ``kustomize build``."""
    kubectl, kustomize = shutil.which("kubectl"), shutil.which("kustomize")
    if kubectl and (kustomize is None or subprocess.run(
            [kubectl, "kustomize", str(K8S / "base")], capture_output=True).returncode == 0):
        return (kubectl, "kustomize")  # with no alternative, its errors are the ones to show
    return (kustomize, "build") if kustomize else None


@cache
def _render(overlay: str) -> tuple[str, str, int]:
    cmd = _kustomize_command()
    assert cmd is not None
    proc = subprocess.run([*cmd, str(K8S / overlay)], capture_output=True, text=True, timeout=120)
    return proc.stdout, proc.stderr, proc.returncode


def render(overlay: str) -> list[dict[str, Any]]:
    """The overlay's resources as rendered by ``kubectl kustomize`` (or ``kustomize build``)."""
    if _kustomize_command() is None:
        require("kustomize")
    out, err, code = _render(overlay)
    assert code == 0, f"kustomize failed on {overlay}:\n{err}"
    return copy.deepcopy([d for d in yaml.safe_load_all(out) if d])


def of_kind(docs: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [d for d in docs if d["kind"] == kind]


def one(docs: list[dict[str, Any]], kind: str, name: str | None = None) -> dict[str, Any]:
    found = [d for d in of_kind(docs, kind) if name is None or d["metadata"]["name"] == name]
    assert len(found) == 1, f"expected one {kind} {name or ''}, found {len(found)}"
    return found[0]


def workload(docs: list[dict[str, Any]]) -> dict[str, Any]:
    found = of_kind(docs, "StatefulSet") + of_kind(docs, "Deployment")
    assert len(found) == 1, f"expected one workload, found {[d['kind'] for d in found]}"
    return found[0]


def container(docs: list[dict[str, Any]]) -> dict[str, Any]:
    containers = workload(docs)["spec"]["template"]["spec"]["containers"]
    assert len(containers) == 1
    return containers[0]


def rule_groups(docs: list[dict[str, Any]]) -> dict[str, Any]:
    """The PrometheusRule's groups as a Prometheus rule file."""
    return {"groups": one(docs, "PrometheusRule")["spec"]["groups"]}


def write_rules(overlay: str, directory: Path) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / RULES_FILE
    path.write_text(yaml.safe_dump(rule_groups(render(overlay)), sort_keys=False))
    return path


def alerts(docs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {r["alert"]: r for g in rule_groups(docs)["groups"] for r in g["rules"] if "alert" in r}


def mounted_config(docs: list[dict[str, Any]]) -> tuple[str, dict[str, Any]]:
    """(mount path, parsed YAML) of the config file the container reads."""
    pod = workload(docs)["spec"]["template"]["spec"]
    c = container(docs)
    volumes = {v["name"]: v for v in pod["volumes"]}
    for m in c["volumeMounts"]:
        cm = volumes.get(m["name"], {}).get("configMap")
        if cm and m.get("subPath") == "config.yaml":
            data = one(docs, "ConfigMap", cm["name"])["data"]["config.yaml"]
            return m["mountPath"], yaml.safe_load(data)
    raise AssertionError("no config.yaml mounted from a ConfigMap")


def dockerfile_instruction(name: str) -> str:
    lines = (ROOT / "Dockerfile").read_text().splitlines()
    found = [ln.split(None, 1)[1] for ln in lines if ln.split(None, 1)[:1] == [name]]
    assert found, f"Dockerfile has no {name}"
    return found[-1]  # the final stage's


def dashboard(docs: list[dict[str, Any]]) -> dict[str, Any]:
    cm = one(docs, "ConfigMap", "stream-vips-dashboard")
    assert cm["metadata"]["labels"].get("grafana_dashboard") == "1", "Grafana's sidecar selects this label"
    (text,) = cm["data"].values()
    return json.loads(text)


def dashboard_exprs(dash: dict[str, Any]) -> Iterator[tuple[str, str]]:
    """(panel title, PromQL) of every query in the dashboard, Grafana variables substituted."""
    for panel in dash["panels"]:
        for target in panel.get("targets", []):
            expr = target["expr"]
            for var, value in GRAFANA_VARIABLES.items():
                expr = expr.replace(var, value)
            assert "$" not in expr, f"unknown Grafana variable in {target['expr']!r}"
            yield panel["title"], expr


def exported_metric_names() -> set[str]:
    """Sample names the real :class:`stream_vips.service.metrics.Metrics` exports (with labelled ones touched)."""
    from stream_vips.service.metrics import Metrics

    m = Metrics(family="linreg", sampling="poisson", accountant="pld")
    m.records_rejected.labels(reason="x").inc()
    m.consumer_lag.labels(topic="t", partition="0").set(1)
    m.halt_cause.labels(cause="budget").set(1)
    m.source_topic_missing.labels(topic="t").set(0)
    m.update_duration.observe(0.1)
    return {s.name for metric in m.registry.collect() for s in metric.samples}


def promql_metric_names(expr: str) -> set[str]:
    return set(re.findall(r"\b(stream_vips_[a-z_]+)\b", expr))


def run(cmd: list[str], **kw: Any) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120, **kw)


# ---------------------------------------------------------------------------------------------
# rendering and schema validation


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_overlay_renders_every_component(overlay: str) -> None:
    docs = render(overlay)
    kinds = sorted(d["kind"] for d in docs)
    for kind, count in {
        "Namespace": 1, "ServiceAccount": 1, "StatefulSet": 1, "Service": 1, "PodDisruptionBudget": 1,
        "NetworkPolicy": 2, "ConfigMap": 2, "ServiceMonitor": 1, "PrometheusRule": 1,
        "KafkaTopic": 4, "KafkaUser": 2,
    }.items():
        assert kinds.count(kind) == count, f"{overlay}: {kinds.count(kind)} {kind}, expected {count}"
    app_ns = one(docs, "Namespace")["metadata"]["name"]
    for d in docs:
        if d["kind"] == "Namespace":
            continue
        expected = "kafka" if d["apiVersion"].startswith("kafka.strimzi.io") else app_ns
        assert d["metadata"]["namespace"] == expected, (d["kind"], d["metadata"]["name"])


def _validate_core(docs: list[dict[str, Any]], tmp_path: Path) -> subprocess.CompletedProcess[str]:
    exe = require_script("kubernetes-validate", ".ci/k8s-setup.sh")
    path = tmp_path / "core.yaml"
    path.write_text(yaml.safe_dump_all(docs))
    return run([exe, "--strict", "--quiet", "-k", KUBERNETES_VERSION, str(path)])


def core_resources(docs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [d for d in docs if (d["apiVersion"], d["kind"]) not in CUSTOM_KINDS]


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_core_resources_pass_strict_schema_validation(overlay: str, tmp_path: Path) -> None:
    docs = core_resources(render(overlay))
    assert {d["apiVersion"].split("/")[0] for d in docs} >= {"v1", "apps", "policy", "networking.k8s.io"}
    proc = _validate_core(docs, tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_strict_validation_rejects_an_unknown_field(tmp_path: Path) -> None:
    docs = core_resources(render("base"))
    sts = one(docs, "StatefulSet")
    sts["spec"]["template"]["spec"]["containers"][0]["readOnlyRootFileSystem"] = True  # wrong case
    proc = _validate_core([sts], tmp_path)
    assert proc.returncode != 0 and "readOnlyRootFileSystem" in proc.stdout + proc.stderr


def strict_crd_schema(schema: Any) -> Any:
    """An OpenAPI v3 schema of a CRD as a JSON Schema, strict like the API server's field validation:
    an object with ``properties`` accepts no other field unless the CRD marks it
    ``x-kubernetes-preserve-unknown-fields``; ``nullable`` admits null."""
    if isinstance(schema, list):
        return [strict_crd_schema(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: strict_crd_schema(v) for k, v in schema.items() if k != "description"}
    if "properties" in out and "additionalProperties" not in out \
            and not schema.get("x-kubernetes-preserve-unknown-fields"):
        out["additionalProperties"] = False
    if schema.get("nullable") and "type" in out:
        out["type"] = [out["type"], "null"]
    return out


@cache
def crd(filename: str) -> dict[str, Any]:
    path = CRDS / filename
    if not path.is_file():
        if os.environ.get("CI"):
            pytest.fail(f"{path} missing (fetched by .ci/k8s-setup.sh)")
        pytest.skip(f"{path} missing (fetched by .ci/k8s-setup.sh)")
    return yaml.safe_load(path.read_text())


@cache
def _cr_schema(api_version: str, kind: str) -> dict[str, Any]:
    """The CRD's schema of ``api_version``, with apiVersion and kind pinned to the served ones."""
    definition = crd(CUSTOM_KINDS[(api_version, kind)])["spec"]
    group, version = api_version.split("/")
    assert definition["group"] == group and definition["names"]["kind"] == kind
    (served,) = [v for v in definition["versions"] if v["name"] == version and v["served"]]
    schema = strict_crd_schema(served["schema"]["openAPIV3Schema"])
    schema["properties"]["apiVersion"] = {"const": api_version}
    schema["properties"]["kind"] = {"const": kind}
    schema["required"] = sorted({*schema.get("required", []), "apiVersion", "kind", "metadata", "spec"})
    schema["properties"].pop("status", None)  # written by the operator, never by us
    return schema


def cr_errors(doc: dict[str, Any]) -> list[str]:
    """Schema errors of a custom resource against its operator's CRD (empty when it conforms)."""
    import jsonschema

    key = (doc.get("apiVersion"), doc.get("kind"))
    crd_for_kind = {k: f for (_, k), f in CUSTOM_KINDS.items()}
    if key not in CUSTOM_KINDS:
        if doc.get("kind") in crd_for_kind:  # a version the pinned CRD does not serve
            served = [f"{v['name']}" for v in crd(crd_for_kind[doc["kind"]])["spec"]["versions"] if v["served"]]
            return [f"apiVersion {doc.get('apiVersion')} not served by the CRD (served: {served})"]
        return [f"no CRD for {key}"]
    validator = jsonschema.Draft7Validator(_cr_schema(*key))
    errors = [f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in validator.iter_errors(doc)]
    name = doc.get("metadata", {}).get("name", "")
    if not (DNS1123_SUBDOMAIN.match(name) and len(name) <= 253):
        errors.append(f"metadata/name: {name!r} is not a DNS-1123 subdomain")
    return errors


def test_pinned_crds_are_the_operators_own() -> None:
    """The CRD files are the real, complete ones (not subsets): served versions, the full
    specification fields, and no CEL rules that a JSON Schema validator would silently skip."""
    setup = (ROOT / ".ci" / "k8s-setup.sh").read_text()
    pinned = {name: digest for digest, name in re.findall(r"^([0-9a-f]{64})  (\S+)$", setup, flags=re.M)}
    assert set(pinned) == set(CUSTOM_KINDS.values())
    for (_api_version, kind), filename in CUSTOM_KINDS.items():
        definition = crd(filename)
        assert definition["kind"] == "CustomResourceDefinition"
        assert definition["spec"]["names"]["kind"] == kind
        cel = [v["rule"] for v in _walk_cel(definition)]
        assert cel == KNOWN_CEL_RULES.get(filename, []), f"{filename}: CEL rules are not checked here"
        assert hashlib.sha256((CRDS / filename).read_bytes()).hexdigest() == pinned[filename], \
            f"{filename} differs from the file pinned in .ci/k8s-setup.sh"
    topic_spec = _cr_schema("kafka.strimzi.io/v1", "KafkaTopic")["properties"]["spec"]["properties"]
    assert {"topicName", "partitions", "replicas", "config"} <= set(topic_spec)
    ray_spec = _cr_schema("ray.io/v1", "RayCluster")["properties"]["spec"]["properties"]
    assert {"headGroupSpec", "workerGroupSpecs", "rayVersion", "enableInTreeAutoscaling"} <= set(ray_spec)
    ray_pod = ray_spec["headGroupSpec"]["properties"]["template"]["properties"]["spec"]
    assert {"containers", "volumes", "securityContext"} <= set(ray_pod["properties"])
    sm_spec = _cr_schema("monitoring.coreos.com/v1", "ServiceMonitor")["properties"]["spec"]
    sm_endpoint = sm_spec["properties"]["endpoints"]
    assert {"port", "path", "interval", "scrapeTimeout", "tlsConfig", "relabelings"} \
        <= set(sm_endpoint["items"]["properties"])


def _walk_cel(node: Any) -> Iterator[dict[str, Any]]:
    """Every CEL rule (``x-kubernetes-validations`` entry) in a CRD."""
    if isinstance(node, dict):
        yield from node.get("x-kubernetes-validations", [])
        for value in node.values():
            yield from _walk_cel(value)
    elif isinstance(node, list):
        for value in node:
            yield from _walk_cel(value)


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_custom_resources_have_their_required_fields(overlay: str) -> None:
    docs = render(overlay)
    custom = [d for d in docs if (d["apiVersion"], d["kind"]) in CUSTOM_KINDS]
    assert len(custom) == 8
    for d in custom:
        assert cr_errors(d) == [], (d["kind"], d["metadata"]["name"])


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_custom_resource_metadata_passes_the_core_object_meta_schema(overlay: str, tmp_path: Path) -> None:
    """A CRD leaves ``metadata`` to the API server; check it with the core ObjectMeta schema (a
    ConfigMap carrying each custom resource's metadata, validated strictly)."""
    probes = [{"apiVersion": "v1", "kind": "ConfigMap", "metadata": d["metadata"]}
              for d in render(overlay) if (d["apiVersion"], d["kind"]) in CUSTOM_KINDS]
    assert len(probes) == 8
    proc = _validate_core(probes, tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    probes[0]["metadata"]["lables"] = {"a": "b"}  # misspelt: refused
    assert _validate_core(probes[:1], tmp_path).returncode != 0


@pytest.mark.parametrize(
    "kind, mutate",
    [
        # v1beta2's single `operation`, dropped by kafka.strimzi.io/v1
        ("KafkaUser", lambda d: d["spec"]["authorization"]["acls"][0].update(operation="Read")),
        ("KafkaUser", lambda d: d["spec"]["authorization"]["acls"][0]["resource"].update(type="topics")),
        ("KafkaUser", lambda d: d["spec"]["authentication"].update(type="scram-sha-256")),
        ("KafkaTopic", lambda d: d["spec"].update(replicas=0)),
        ("KafkaTopic", lambda d: d["spec"].update(partition=3)),
        ("KafkaTopic", lambda d: d.update(apiVersion="kafka.strimzi.io/v1beta3")),
        ("KafkaTopic", lambda d: d["metadata"].update(name="Stream_VIPS")),
        ("ServiceMonitor", lambda d: d["spec"].pop("selector")),
        ("ServiceMonitor", lambda d: d["spec"]["endpoints"][0].update(scrape_timeout="10s")),
        ("ServiceMonitor", lambda d: d["spec"]["endpoints"][0].update(interval="15 seconds")),
        ("PrometheusRule", lambda d: d["spec"]["groups"][0]["rules"][0].pop("expr")),
        ("PrometheusRule", lambda d: d["spec"]["groups"][0]["rules"][0].update(labels={"severity": 1})),
    ],
)
def test_crd_schemas_reject_broken_custom_resources(kind: str, mutate: Any) -> None:
    doc = of_kind(render("base"), kind)[0]
    assert cr_errors(doc) == []
    mutate(doc)
    assert cr_errors(doc) != []


def test_every_topic_and_user_names_its_strimzi_cluster() -> None:
    """Strimzi's operators act only on resources labelled with their cluster (not in the CRD)."""
    for d in render("base"):
        if d["apiVersion"].startswith("kafka.strimzi.io/"):
            assert d["metadata"]["labels"].get("strimzi.io/cluster") == "my-cluster", d["metadata"]["name"]


def test_every_custom_resource_kind_is_checked() -> None:
    docs = render("base")
    for d in docs:
        group = d["apiVersion"].split("/")[0]
        if "." in group and not group.endswith(".k8s.io"):
            assert (d["apiVersion"], d["kind"]) in CUSTOM_KINDS, f"no CRD schema check for {d['kind']}"


# ---------------------------------------------------------------------------------------------
# the workload


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_one_replica_that_never_overlaps_another(overlay: str) -> None:
    w = workload(render(overlay))
    assert w["spec"]["replicas"] == 1
    if w["kind"] == "Deployment":
        assert w["spec"]["strategy"]["type"] == "Recreate"
    else:  # a StatefulSet replaces pod 0 only after it is gone
        assert w["spec"]["podManagementPolicy"] == "OrderedReady"
        assert w["spec"]["updateStrategy"]["type"] in ("RollingUpdate", "OnDelete")


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_pod_meets_the_restricted_pod_security_standard(overlay: str) -> None:
    docs = render(overlay)
    pod = workload(docs)["spec"]["template"]["spec"]
    c = container(docs)
    psc, csc = pod["securityContext"], c["securityContext"]
    assert psc["runAsNonRoot"] is True and psc["runAsUser"] > 0
    assert psc["seccompProfile"]["type"] == "RuntimeDefault"
    assert csc["allowPrivilegeEscalation"] is False
    assert csc["capabilities"]["drop"] == ["ALL"] and not csc["capabilities"].get("add")
    assert csc["readOnlyRootFilesystem"] is True
    assert not csc.get("privileged") and "hostPath" not in json.dumps(pod["volumes"])
    assert pod["automountServiceAccountToken"] is False
    assert one(docs, "ServiceAccount")["automountServiceAccountToken"] is False
    ns = one(docs, "Namespace")["metadata"]["labels"]
    assert ns["pod-security.kubernetes.io/enforce"] == "restricted"
    # the image runs as the same non-root user
    assert dockerfile_instruction("USER").split(":")[0] == str(psc["runAsUser"])


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_probes_resources_and_grace_period(overlay: str) -> None:
    docs = render(overlay)
    pod = workload(docs)["spec"]["template"]["spec"]
    c = container(docs)
    _, cfg = mounted_config(docs)
    (port,) = [p for p in c["ports"] if p["name"] == "metrics"]
    assert port["containerPort"] == cfg["metrics"]["port"]
    for probe, path in (("startupProbe", "/healthz"), ("livenessProbe", "/healthz"), ("readinessProbe", "/readyz")):
        assert c[probe]["httpGet"] == {"path": path, "port": "metrics"}, probe
    for kind in ("requests", "limits"):
        assert {"cpu", "memory"} <= set(c["resources"][kind]), kind
    # a step plus the producers' final flush: beyond the liveness window and Kafka's 30 s default
    assert pod["terminationGracePeriodSeconds"] >= 60


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_entrypoint_reads_the_mounted_config_and_state_is_persistent(overlay: str) -> None:
    docs = render(overlay)
    w = workload(docs)
    c = container(docs)
    entrypoint = json.loads(dockerfile_instruction("ENTRYPOINT"))
    mount_path, cfg = mounted_config(docs)
    assert entrypoint == ["stream-vips", "run", "--config", mount_path]
    assert "command" not in c and "args" not in c, "the container runs the image's ENTRYPOINT"
    # the root filesystem is read-only: every file the pipeline writes is on a writable volume,
    # and the ledger (spent budget) on the PersistentVolume
    pvcs = {t["metadata"]["name"] for t in w["spec"].get("volumeClaimTemplates", [])}
    volumes = {v["name"]: v for v in w["spec"]["template"]["spec"]["volumes"]}
    writable = {
        m["mountPath"]: m["name"] for m in c["volumeMounts"]
        if not m.get("readOnly") and (m["name"] in pvcs or "emptyDir" in volumes.get(m["name"], {}))
    }

    def volume_of(path: str) -> str | None:
        hits = [(mp, name) for mp, name in writable.items() if path.startswith(mp.rstrip("/") + "/")]
        return max(hits)[1] if hits else None

    assert cfg["privacy"]["ledger"]["type"] == "file"
    assert volume_of(cfg["privacy"]["ledger"]["path"]) in pvcs
    assert ("privacy.ledger.path", cfg["privacy"]["ledger"]["path"]) in written_paths(cfg)
    for key, path in written_paths(cfg):
        assert path.startswith("/"), f"{key}: relative to the working directory"
        assert volume_of(path) in pvcs, f"{key}: {path} is not on the PersistentVolume"
    assert w["spec"]["persistentVolumeClaimRetentionPolicy"]["whenDeleted"] == "Retain"


def written_paths(cfg: Any, key: str = "") -> list[tuple[str, str]]:
    """(dotted key, value) of every file the configuration makes the pipeline write: keys named
    ``path`` or containing ``checkpoint`` (CA and key files are read, not written)."""
    if isinstance(cfg, dict):
        return [hit for k, v in cfg.items() for hit in written_paths(v, f"{key}.{k}".lstrip("."))]
    leaf = key.rsplit(".", 1)[-1]
    if isinstance(cfg, str) and (leaf == "path" or "checkpoint" in leaf):
        return [(key, cfg)]
    return []


def test_image_build_context_holds_the_whole_package() -> None:
    """The Dockerfile copies, and .dockerignore lets through, everything pyproject builds from."""
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    needed = {"pyproject.toml", project["project"]["readme"]}
    needed |= {pattern.rstrip("*") for pattern in project["tool"]["setuptools"]["packages"]["find"]["include"]}
    lines = [ln.split() for ln in (ROOT / "Dockerfile").read_text().splitlines()]
    copied = {src.rstrip("/") for ln in lines if ln[:1] == ["COPY"] and not ln[1].startswith("--from")
              for src in ln[1:-1]}
    allowed = {ln[1:].rstrip("/") for ln in (ROOT / ".dockerignore").read_text().splitlines() if ln.startswith("!")}
    assert needed <= copied <= allowed, (needed, copied, allowed)
    assert all((ROOT / path).exists() for path in needed)


def test_dockerfile_builds_on_any_python_base_as_non_root() -> None:
    """The base is a build argument (default the official slim image); the build stage brings its
    own pip and wheel (autodp is an sdist); the final stage runs as 10001 without writing .pyc."""
    text = (ROOT / "Dockerfile").read_text()
    assert re.search(r"^ARG BASE_IMAGE=python:3\.\d+-slim-bookworm$", text, flags=re.M)
    stages = re.findall(r"^FROM (\S+)", text, flags=re.M)
    assert stages and all(s == "${BASE_IMAGE}" for s in stages), stages
    assert re.search(r"pip install --upgrade pip setuptools wheel", text)
    assert "PYTHONDONTWRITEBYTECODE=1" in text
    assert dockerfile_instruction("USER") == "10001:10001"


def _pod_env(c: dict[str, Any], pod_name: str = "stream-vips-0") -> dict[str, str]:
    """The container's environment as the kubelet would set it (values and the pod's name)."""
    env = {}
    for e in c.get("env", []):
        if "value" in e:
            env[e["name"]] = e["value"]
        else:
            assert e["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name", e["name"]
            env[e["name"]] = pod_name
    return env


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_mounted_config_loads_with_the_real_config_loader(overlay: str) -> None:
    from stream_vips.service.build import config_from_dict

    docs = render(overlay)
    c = container(docs)
    cm_name = next(v["configMap"]["name"] for v in workload(docs)["spec"]["template"]["spec"]["volumes"]
                   if "configMap" in v)
    text = one(docs, "ConfigMap", cm_name)["data"]["config.yaml"]
    env = _pod_env(c)
    cfg = config_from_dict(yaml.safe_load(text), env=env)
    assert cfg.metrics.enabled and cfg.metrics.port == 9108
    assert cfg.runtime.on_halt == "stay", "a halted pod keeps serving metrics instead of crash-looping"
    assert cfg.privacy.seed is None, "production noise is OS-seeded (privacy rule 9 in docs/privacy.md)"
    assert cfg.privacy.mode == "private"
    assert cfg.source.options["group_instance_id"] == "stream-vips-0"  # static membership, per pod
    # a fixed transactional id (not the sink's random default): a restarted pod's sink aborts the
    # transaction a crash left open instead of leaving read-committed readers blocked until it times out
    restarted = config_from_dict(yaml.safe_load(text), env=_pod_env(c))
    assert cfg.sink.options["transactional_id"] and \
        cfg.sink.options["transactional_id"] == restarted.sink.options["transactional_id"]
    assert cfg.runtime.checkpoint_path, "a restart restores the reservoir and offsets"


def _secret_mounts(docs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """mount path -> Secret volume source, for the container's read-only Secret mounts."""
    volumes = {v["name"]: v for v in workload(docs)["spec"]["template"]["spec"]["volumes"]}
    return {m["mountPath"]: volumes[m["name"]]["secret"] for m in container(docs)["volumeMounts"]
            if "secret" in volumes.get(m["name"], {}) and m.get("readOnly")}


KAFKA_SECTIONS = ("source", "sink", "dead_letter")


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_kafka_credentials_come_from_a_mounted_secret(overlay: str) -> None:
    """The password is a file from the Secret volume (sasl_password_file), never an environment
    variable or a ConfigMap value."""
    from stream_vips.logsafety import is_secret

    docs = render(overlay)
    c = container(docs)
    _, cfg = mounted_config(docs)
    for e in c.get("env", []):
        assert not re.search(r"PASSWORD|SECRET|TOKEN|JAAS", e["name"]), f"{e['name']}: a secret in the environment"
        assert "secretKeyRef" not in e.get("valueFrom", {}), e["name"]
    mounts = _secret_mounts(docs)
    for section in KAFKA_SECTIONS:
        path = cfg[section]["sasl_password_file"]
        (mount,) = [m for m in mounts if path.startswith(m.rstrip("/") + "/")]
        secret = mounts[mount]
        assert secret["secretName"] == "stream-vips-kafka", section
        assert [i["path"] for i in secret["items"]] == [path[len(mount.rstrip("/")) + 1:]]
        # owner root, group fsGroup: readable by the pipeline's group, by nobody else
        assert secret["defaultMode"] & 0o007 == 0 and secret["defaultMode"] & 0o040, oct(secret["defaultMode"])

    def secret_values(node: Any, key: str = "") -> list[str]:
        if isinstance(node, dict):
            return [v for k, item in node.items() for v in secret_values(item, str(k))]
        return [key] if is_secret(key) and node is not None else []

    assert secret_values(cfg) == [], "no secret in the ConfigMap"
    assert not of_kind(docs, "Secret"), "credentials are not committed as Secret manifests"
    assert workload(docs)["spec"]["template"]["spec"]["securityContext"]["fsGroup"] == 10001


# ---------------------------------------------------------------------------------------------
# Service, monitoring, network policy, disruption budget


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_service_monitor_reaches_the_metrics_port(overlay: str) -> None:
    docs = render(overlay)
    pod_labels = workload(docs)["spec"]["template"]["metadata"]["labels"]
    svc = one(docs, "Service")
    sm = one(docs, "ServiceMonitor")
    assert svc["spec"]["selector"].items() <= pod_labels.items()
    assert sm["spec"]["selector"]["matchLabels"].items() <= svc["metadata"]["labels"].items()
    (port,) = svc["spec"]["ports"]
    assert [e["port"] for e in sm["spec"]["endpoints"]] == [port["name"]]
    assert port["targetPort"] == "metrics" and sm["spec"]["endpoints"][0]["path"] == "/metrics"
    # kube-prometheus-stack picks up monitors and rules carrying its release label
    assert sm["metadata"]["labels"]["release"] == one(docs, "PrometheusRule")["metadata"]["labels"]["release"]
    pdb = one(docs, "PodDisruptionBudget")
    assert pdb["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()
    # the job label Prometheus gives the target is the one the down alert selects
    job = svc["metadata"]["labels"][sm["spec"]["jobLabel"]]
    assert f'up{{job="{job}"}}' in alerts(docs)["StreamVipsDown"]["expr"]


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_network_policy_denies_by_default_and_allows_only_kafka_dns_and_scrapes(overlay: str) -> None:
    docs = render(overlay)
    pod_labels = workload(docs)["spec"]["template"]["metadata"]["labels"]
    policies = of_kind(docs, "NetworkPolicy")
    (deny,) = [p for p in policies if p["spec"]["podSelector"] == {}]
    assert sorted(deny["spec"]["policyTypes"]) == ["Egress", "Ingress"]
    assert not deny["spec"].get("ingress") and not deny["spec"].get("egress")
    (app,) = [p for p in policies if p["spec"]["podSelector"] != {}]
    assert app["spec"]["podSelector"]["matchLabels"].items() <= pod_labels.items()
    (ingress,) = app["spec"]["ingress"]
    assert ingress["from"] == [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}]
    assert ingress["ports"] == [{"port": "metrics", "protocol": "TCP"}]
    egress = {json.dumps(r["to"], sort_keys=True): r["ports"] for r in app["spec"]["egress"]}
    assert len(egress) == 2
    dns = [p for to, p in egress.items() if "kube-dns" in to]
    kafka = [p for to, p in egress.items() if "strimzi.io/cluster" in to]
    assert dns and sorted(p["protocol"] for p in dns[0]) == ["TCP", "UDP"] and {p["port"] for p in dns[0]} == {53}
    # the broker port is the one in the configured bootstrap servers
    _, cfg = mounted_config(docs)
    ports = {int(s.rsplit(":", 1)[1]) for sec in ("source", "sink", "dead_letter")
             for s in str(cfg[sec]["bootstrap_servers"]).split(",")}
    assert kafka and ports <= {p["port"] for p in kafka[0]}


# ---------------------------------------------------------------------------------------------
# Strimzi topics and users (the privacy wall)


def _topics(docs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {t["spec"].get("topicName", t["metadata"]["name"]): t for t in of_kind(docs, "KafkaTopic")}


def _grants(user: dict[str, Any]) -> set[tuple[str, str, str, str]]:
    """(resource type, name, pattern type, operation) the user is allowed."""
    out = set()
    for acl in user["spec"]["authorization"]["acls"]:
        assert acl.get("type", "allow") == "allow"
        r = acl["resource"]
        for op in acl["operations"]:
            out.add((r["type"], r["name"], r.get("patternType", "literal"), op))
    return out


def kafka_topics_of(cfg: dict[str, Any], section: str) -> list[str]:
    """Topics a Kafka connector section names (the source takes ``topics``, the sinks ``topic``)."""
    value = cfg[section].get("topics", cfg[section].get("topic"))
    return [value] if isinstance(value, str) else list(value)


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_topics_match_the_config_and_their_roles(overlay: str) -> None:
    docs = render(overlay)
    _, cfg = mounted_config(docs)
    topics = _topics(docs)
    clusters = {t["metadata"]["labels"]["strimzi.io/cluster"] for t in topics.values()}
    clusters |= {u["metadata"]["labels"]["strimzi.io/cluster"] for u in of_kind(docs, "KafkaUser")}
    assert len(clusters) == 1
    for section, policy in (("source", "delete"), ("sink", "compact"), ("dead_letter", "delete")):
        assert cfg[section]["type"] == "kafka", section
        for name in kafka_topics_of(cfg, section):
            topic = topics[name]
            assert topic["spec"]["config"]["cleanup.policy"] == policy, section
            assert topic["spec"]["config"]["min.insync.replicas"] <= topic["spec"]["replicas"]
        if section != "source":
            assert cfg[section]["create_topic"] is False, "Strimzi owns the topics"
    # the model sink refuses to start on a topic whose limit is below its own
    (model_topic,) = kafka_topics_of(cfg, "sink")
    assert topics[model_topic]["spec"]["config"]["max.message.bytes"] >= cfg["sink"]["max_message_bytes"]
    ledger = [t for name, t in topics.items() if "ledger" in name]
    assert len(ledger) == 1 and ledger[0]["spec"]["config"]["cleanup.policy"] == "compact"
    assert str(ledger[0]["spec"]["config"]["retention.ms"]) == "-1"


def required_grants(docs: list[dict[str, Any]]) -> dict[str, list[Any]]:
    """user -> the grants (connectors.kafka.Grant) the code declares for the mounted config: the
    pipeline's connectors, the Kafka ledger on the manifests' ledger topic (privacy.ledger.type:
    kafka, topics owned by Strimzi), and the downstream reader of the model topic."""
    from connectors.kafka import KafkaDeadLetterSink, KafkaLedger, KafkaModelSink, KafkaSource, connector_grants
    from stream_vips.client import ModelReader

    _, cfg = mounted_config(docs)
    (ledger_topic,) = [name for name in _topics(docs) if "ledger" in name]
    (model_topic,) = kafka_topics_of(cfg, "sink")
    pipeline = [*connector_grants(KafkaSource, cfg["source"]), *connector_grants(KafkaModelSink, cfg["sink"]),
                *connector_grants(KafkaDeadLetterSink, cfg["dead_letter"]),
                *connector_grants(KafkaLedger, {"topic": ledger_topic, "create_topic": False})]
    users = {u["metadata"]["name"] for u in of_kind(docs, "KafkaUser")}
    (reader,) = users - {cfg["source"]["sasl_username"]}
    return {cfg["source"]["sasl_username"]: pipeline, reader: ModelReader.grants(model_topic)}


def _as_acls(grants: list[Any]) -> set[tuple[str, str, str, str]]:
    return {(g.resource_type, g.name, g.pattern, g.operation) for g in grants}


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_acls_are_exactly_what_the_code_needs(overlay: str) -> None:
    """users.yaml grants what the connectors declare (connectors.kafka.access), no more and no less."""
    docs = render(overlay)
    users = {u["metadata"]["name"]: _grants(u) for u in of_kind(docs, "KafkaUser")}
    needed = required_grants(docs)
    assert users.keys() == needed.keys()
    for user, grants in needed.items():
        assert users[user] == _as_acls(grants), user
        assert not any(op == "Describe" for *_, op in users[user]), "Describe is implied by Read and Write"


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_acls_let_only_the_pipeline_read_raw_records(overlay: str) -> None:
    docs = render(overlay)
    _, cfg = mounted_config(docs)
    users = {u["metadata"]["name"]: _grants(u) for u in of_kind(docs, "KafkaUser")}
    topics = _topics(docs)
    (model_topic,) = kafka_topics_of(cfg, "sink")
    raw_topics = set(kafka_topics_of(cfg, "source")) | set(kafka_topics_of(cfg, "dead_letter"))
    assert raw_topics <= set(topics) and model_topic not in raw_topics
    pipeline = users.pop(cfg["source"]["sasl_username"])
    for section in ("sink", "dead_letter"):
        assert cfg[section]["sasl_username"] == cfg["source"]["sasl_username"]
    assert all(op != "All" and rtype != "cluster" for rtype, _, _, op in pipeline)
    source_ops = {op for rtype, name, _, op in pipeline if rtype == "topic" and name in kafka_topics_of(cfg, "source")}
    assert source_ops == {"Read"}, "the pipeline never writes its input"
    dead_letter_ops = {op for rtype, name, _, op in pipeline
                       if rtype == "topic" and name in kafka_topics_of(cfg, "dead_letter")}
    assert "Read" not in dead_letter_ops, "dead letters are raw records: operators read them, not the pipeline"
    (reader,) = users.values()
    assert reader == {("topic", model_topic, "literal", "Read")}


def _doc_table(heading: str) -> list[list[str]]:
    """The cells of the first table under ``heading`` in docs/deploy.md."""
    text = (ROOT / "docs" / "deploy.md").read_text()
    section = text.split(f"\n{heading}\n", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("|")]
    return [[c.strip() for c in row.strip("|").split("|")] for row in rows[2:]]


def test_the_deploy_docs_list_every_grant_with_its_code_path() -> None:
    """docs/deploy.md's access table is the code's declarations, row for row."""
    docs = render("base")
    expected = {(f"`{user}`", f"{g.resource_type}{' prefix' if g.pattern == 'prefix' else ''} `{g.name}`",
                 g.operation, g.why, f"`{g.code}`") for user, grants in required_grants(docs).items() for g in grants}
    rows = _doc_table("## Access: the ACLs and what needs them")
    assert rows and all(len(r) == 5 for r in rows), rows[:2]
    assert {tuple(r) for r in rows} == expected
    assert len(rows) == len(expected)


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_connectors_find_the_kafka_password_the_pod_gets(overlay: str, tmp_path: Path) -> None:
    """Each Kafka connector's security settings resolve from the config plus the mounted Secret
    (its mount point stood in for by a directory here); without the file, a one-line error names
    the key."""
    from connectors.kafka import FILE_KEYS, SECURITY_KEYS, security_options
    from stream_vips.config import ConfigError

    docs = render(overlay)
    _, cfg = mounted_config(docs)
    (mount,) = [m for m, s in _secret_mounts(docs).items() if s["secretName"] == "stream-vips-kafka"]
    for section in KAFKA_SECTIONS:
        options = {k: v for k, v in cfg[section].items() if k in (*SECURITY_KEYS, *FILE_KEYS)}
        stand_in = tmp_path / Path(options["sasl_password_file"]).relative_to(mount)
        stand_in.write_text("placeholder-password\n")  # as kubectl create secret --from-file writes it
        resolved = security_options({**options, "sasl_password_file": str(stand_in)}, env={})
        assert resolved["security_protocol"] == "SASL_SSL", section
        assert resolved["sasl_plain_password"] == "placeholder-password", section
        with pytest.raises(ConfigError, match=r"^sasl_password_file: cannot read .*: No such file"):
            security_options(options, env={})  # the real mount path does not exist here
    # the CA file is mounted where the config says
    mounts = [m["mountPath"] for m in container(docs)["volumeMounts"]]
    assert any(cfg["source"]["ssl_cafile"].startswith(m.rstrip("/") + "/") for m in mounts)


# ---------------------------------------------------------------------------------------------
# alert rules


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_rules_pass_promtool_check(overlay: str, tmp_path: Path) -> None:
    promtool = require("promtool")
    path = write_rules(overlay, tmp_path)
    proc = run([promtool, "check", "rules", str(path)])
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert REQUIRED_ALERTS <= set(alerts(render(overlay)))


def _promtool_test(rules: dict[str, Any], tmp_path: Path) -> subprocess.CompletedProcess[str]:
    promtool = require("promtool")
    (tmp_path / RULES_FILE).write_text(yaml.safe_dump(rules, sort_keys=False))
    shutil.copy(K8S / "tests" / "alerts-test.yaml", tmp_path / "alerts-test.yaml")
    return run([promtool, "test", "rules", "alerts-test.yaml"], cwd=tmp_path)


@pytest.mark.parametrize("overlay", ["base", RAY_OVERLAY])
def test_every_alert_links_to_its_runbook_section(overlay: str) -> None:
    headings = re.findall(r"^#+ (.+)$", (ROOT / "docs" / "deploy.md").read_text(), flags=re.M)
    slugs = {re.sub(r"[^a-z0-9 _-]", "", h.strip().lower()).replace(" ", "-") for h in headings}
    for name, rule in alerts(render(overlay)).items():
        path, _, anchor = rule["annotations"]["runbook"].partition("#")
        assert path == "docs/deploy.md" and anchor in slugs, name


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_alert_unit_tests_pass(overlay: str, tmp_path: Path) -> None:
    tests = yaml.safe_load((K8S / "tests" / "alerts-test.yaml").read_text())
    tested = {t["alertname"] for group in tests["tests"] for t in group["alert_rule_test"] if t["exp_alerts"]}
    assert tested == set(alerts(render(overlay))), "every alert has a unit test that fires it"
    proc = _promtool_test(rule_groups(render(overlay)), tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.mark.parametrize(
    "alert, old, new",
    [
        ("StreamVipsBudget80PercentSpent", ">= 0.8", ">= 0.9"),
        ("StreamVipsBudget80PercentSpent", "and stream_vips_epsilon_budget > 0", ""),
        ("StreamVipsUpdatesStalled", "and stream_vips_halted == 0", ""),
        ("StreamVipsUpdatesStalled", "> 0\n", ">= 0\n"),
        ("StreamVipsConsumerLagGrowing", "unless ignoring (topic) stream_vips_halted == 1", ""),
        ("StreamVipsDeadLetterRateHigh", "sum without (reason) ", ""),
        ("StreamVipsBudgetExhausted", '{cause="budget"}', ""),
        ("StreamVipsNoInputPartitions", " unless stream_vips_halted == 1", ""),
        ("StreamVipsRecordsNotConsumed", "unless stream_vips_halted == 1", ""),
        ("StreamVipsRecordsNotConsumed", "== 0\n", ">= 0\n"),
    ],
)
def test_alert_unit_tests_catch_a_broken_rule(alert: str, old: str, new: str, tmp_path: Path) -> None:
    rules = rule_groups(render("base"))
    (rule,) = [r for g in rules["groups"] for r in g["rules"] if r.get("alert") == alert]
    assert old in rule["expr"]
    rule["expr"] = rule["expr"].replace(old, new)
    proc = _promtool_test(rules, tmp_path)
    assert proc.returncode != 0 and alert in proc.stdout + proc.stderr


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_rules_and_dashboard_use_only_exported_metrics(overlay: str) -> None:
    docs = render(overlay)
    exported = exported_metric_names()
    used = set()
    for rule in alerts(docs).values():
        used |= promql_metric_names(rule["expr"])
    for _, expr in dashboard_exprs(dashboard(docs)):
        used |= promql_metric_names(expr)
    assert used and used <= exported, sorted(used - exported)


# ---------------------------------------------------------------------------------------------
# dashboard


def test_dashboard_json_is_valid_and_covers_the_operator_questions() -> None:
    dash = dashboard(render("base"))
    assert dash["uid"] and dash["title"] and dash["panels"]
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids))
    exprs = " ".join(e for _, e in dashboard_exprs(dash))
    for needle in (
        "stream_vips_epsilon_spent", "stream_vips_epsilon_budget", "rate(stream_vips_updates_total",
        "rate(stream_vips_records_consumed_total", "sum by (reason) (rate(stream_vips_records_rejected_total",
        "stream_vips_reservoir_records", "histogram_quantile(0.99", "stream_vips_consumer_lag_records",
        "stream_vips_model_version",
    ):
        assert needle in exprs, needle
    for panel in dash["panels"]:
        assert panel["datasource"]["uid"] == "${datasource}", panel["title"]


@pytest.mark.parametrize("overlay", ["base", RAY_OVERLAY])
def test_dashboard_queries_parse_with_promtool(overlay: str, tmp_path: Path) -> None:
    promtool = require("promtool")
    exprs = list(dashboard_exprs(dashboard(render(overlay))))
    rules = {"groups": [{"name": "dashboard", "rules": [
        {"record": f"dashboard:query_{i}", "expr": expr} for i, (_, expr) in enumerate(exprs)
    ]}]}
    path = tmp_path / "dashboard.rules.yaml"
    path.write_text(yaml.safe_dump(rules))
    proc = run([promtool, "check", "rules", str(path)])
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"{len(exprs)} rules found" in proc.stdout
    # and a broken one is refused
    rules["groups"][0]["rules"][0]["expr"] = "sum by (reason (rate(stream_vips_updates_total[1m]))"
    path.write_text(yaml.safe_dump(rules))
    assert run([promtool, "check", "rules", str(path)]).returncode != 0


# ---------------------------------------------------------------------------------------------
# overlays/ray: the sharded runtime on a KubeRay RayCluster (privacy rule 14)


def raycluster(docs: list[dict[str, Any]]) -> dict[str, Any]:
    return one(docs, "RayCluster")


def ray_templates(docs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """The pod templates of the RayCluster: ``head`` and each worker group by name."""
    spec = raycluster(docs)["spec"]
    return {"head": spec["headGroupSpec"]["template"],
            **{g["groupName"]: g["template"] for g in spec["workerGroupSpecs"]}}


def ray_start_flags(command: str) -> dict[str, str]:
    """The ``--key=value`` flags of the ``ray start`` in a shell command (``--flag``: "true")."""
    words = shlex.split(command)
    start = next(i for i in range(len(words) - 1) if words[i:i + 2] == ["ray", "start"])
    flags = {}
    for word in words[start + 2:]:
        if word in ("&&", ";") or not word.startswith("--"):
            break
        key, _, value = word[2:].partition("=")
        flags[key] = value or "true"
    return flags


def head_command(docs: list[dict[str, Any]]) -> str:
    (c,) = ray_templates(docs)["head"]["spec"]["containers"]
    assert c["command"] == ["/bin/bash", "-c"] and len(c["args"]) == 1
    return str(c["args"][0])


def ray_config(docs: list[dict[str, Any]]) -> tuple[str, dict[str, Any]]:
    """(mount path, parsed YAML) of the config file the head's driver reads."""
    tpl = ray_templates(docs)["head"]["spec"]
    (c,) = tpl["containers"]
    volumes = {v["name"]: v for v in tpl["volumes"]}
    (mount,) = [m for m in c["volumeMounts"] if m.get("subPath") == "config.yaml"]
    data = one(docs, "ConfigMap", volumes[mount["name"]]["configMap"]["name"])["data"]["config.yaml"]
    return mount["mountPath"], yaml.safe_load(data)


def test_ray_overlay_renders_a_raycluster_in_place_of_the_statefulset() -> None:
    docs = render(RAY_OVERLAY)
    kinds = sorted(d["kind"] for d in docs)
    for kind, count in {
        "Namespace": 1, "ServiceAccount": 1, "RayCluster": 1, "PersistentVolumeClaim": 1, "Service": 2,
        "NetworkPolicy": 2, "ConfigMap": 2, "ServiceMonitor": 1, "KafkaTopic": 4, "KafkaUser": 2,
        "StatefulSet": 0, "Deployment": 0, "PodDisruptionBudget": 0, "PrometheusRule": 1,
    }.items():
        assert kinds.count(kind) == count, f"{kinds.count(kind)} {kind}, expected {count}"
    app_ns = one(docs, "Namespace")["metadata"]["name"]
    for d in docs:
        if d["kind"] != "Namespace":
            expected = "kafka" if d["apiVersion"].startswith("kafka.strimzi.io") else app_ns
            assert d["metadata"]["namespace"] == expected, (d["kind"], d["metadata"]["name"])
    # the generated (hash-suffixed) ConfigMap's name reaches every pod template
    (cm,) = [c for c in of_kind(docs, "ConfigMap") if c["metadata"]["name"] != "stream-vips-dashboard"]
    for name, tpl in ray_templates(docs).items():
        names = [v["configMap"]["name"] for v in tpl["spec"]["volumes"] if "configMap" in v]
        assert names == [cm["metadata"]["name"]], name


def test_ray_overlay_core_resources_and_pod_templates_pass_strict_schema_validation(tmp_path: Path) -> None:
    """Core resources strictly; each pod template of the RayCluster as a Pod, strictly, with the
    core schema (stricter than the copy of it in KubeRay's CRD)."""
    docs = render(RAY_OVERLAY)
    pods = [{"apiVersion": "v1", "kind": "Pod", "metadata": {"name": f"probe-{name}", **tpl["metadata"]},
             "spec": tpl["spec"]} for name, tpl in ray_templates(docs).items()]
    assert len(pods) == 2
    proc = _validate_core(core_resources(docs) + pods, tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    pods[1]["spec"]["containers"][0]["securityContext"]["readOnlyRootFileSystem"] = True  # wrong case
    proc = _validate_core(pods[1:], tmp_path)
    assert proc.returncode != 0 and "readOnlyRootFileSystem" in proc.stdout + proc.stderr


def test_raycluster_passes_kuberays_crd_schema_and_leaves_managed_by_unset(tmp_path: Path) -> None:
    docs = render(RAY_OVERLAY)
    rc = raycluster(docs)
    assert cr_errors(rc) == []
    assert "managedBy" not in rc["spec"]  # KubeRay's only CEL rules are on it (KNOWN_CEL_RULES)
    probe = [{"apiVersion": "v1", "kind": "ConfigMap", "metadata": rc["metadata"]}]
    proc = _validate_core(probe, tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for d in docs:  # and the rest of the overlay's custom resources
        if (d["apiVersion"], d["kind"]) in CUSTOM_KINDS:
            assert cr_errors(d) == [], (d["kind"], d["metadata"]["name"])


@pytest.mark.parametrize(
    "mutate",
    [
        lambda d: d["spec"].update(headGroupSpecs=d["spec"]["headGroupSpec"]),  # unknown field
        lambda d: d["spec"]["headGroupSpec"]["rayStartParams"].update({"num-cpus": 0}),  # strings only
        lambda d: d["spec"]["workerGroupSpecs"][0].pop("groupName"),
        lambda d: d["spec"]["workerGroupSpecs"][0].update(replicas="2"),
        lambda d: d["spec"]["headGroupSpec"]["template"]["spec"].pop("containers"),
        lambda d: d["spec"]["headGroupSpec"]["template"]["spec"]["containers"][0].update(imagePullPolicy=1),
        lambda d: d.update(apiVersion="ray.io/v1beta1"),
    ],
)
def test_kuberays_crd_schema_rejects_a_broken_raycluster(mutate: Any) -> None:
    doc = raycluster(render(RAY_OVERLAY))
    assert cr_errors(doc) == []
    mutate(doc)
    assert cr_errors(doc) != []


def test_ray_head_runs_the_driver_on_the_mounted_config() -> None:
    """The head starts Ray, then execs ``stream-vips run --config`` on the mounted file, which loads
    with the real loader as a sharded Ray run; the workers run KubeRay's generated ``ray start``."""
    from stream_vips.service.build import config_from_dict

    docs = render(RAY_OVERLAY)
    command = head_command(docs)
    mount_path, raw = ray_config(docs)
    entrypoint = json.loads(dockerfile_instruction("ENTRYPOINT"))
    # KubeRay keeps a command containing `ray start` as written; --block would never return
    assert "ray start --head" in " ".join(shlex.split(command)) and "block" not in ray_start_flags(command)
    assert command.rstrip().endswith("exec " + shlex.join(entrypoint))
    assert entrypoint == ["stream-vips", "run", "--config", mount_path]
    assert "RAY_ADDRESS=auto" in command  # the driver joins the head's cluster, not a new local one
    cfg = config_from_dict(raw)
    assert cfg.runtime.engine == "ray" and cfg.runtime.shards > 1
    (group,) = raycluster(docs)["spec"]["workerGroupSpecs"]
    assert group["replicas"] == group["minReplicas"] == group["maxReplicas"] == cfg.runtime.shards
    for c in group["template"]["spec"]["containers"]:
        assert "command" not in c and "args" not in c, "KubeRay builds the workers' `ray start`"
    # every shard gets input partitions (build.shard_connectors refuses fewer partitions than shards)
    assert _topics(docs)[raw["source"]["topics"]]["spec"]["partitions"] >= cfg.runtime.shards
    # the ledger (the spent budget) is on the head's PersistentVolumeClaim, the one writer
    head = ray_templates(docs)["head"]["spec"]
    volumes = {v["name"]: v for v in head["volumes"]}
    pvc = one(docs, "PersistentVolumeClaim")["metadata"]["name"]
    (data,) = [m for m in head["containers"][0]["volumeMounts"]
               if raw["privacy"]["ledger"]["path"].startswith(m["mountPath"].rstrip("/") + "/")]
    assert volumes[data["name"]]["persistentVolumeClaim"]["claimName"] == pvc
    assert raycluster(docs)["spec"]["headGroupSpec"].get("replicas", 1) == 1


def test_ray_pods_meet_the_restricted_pod_security_standard() -> None:
    docs = render(RAY_OVERLAY)
    for name, tpl in ray_templates(docs).items():
        pod = tpl["spec"]
        psc = pod["securityContext"]
        assert psc["runAsNonRoot"] is True and str(psc["runAsUser"]) == dockerfile_instruction("USER").split(":")[0]
        assert psc["seccompProfile"]["type"] == "RuntimeDefault"
        assert pod["automountServiceAccountToken"] is False, name
        assert "hostPath" not in json.dumps(pod["volumes"]) and not pod.get("hostNetwork")
        for c in pod["containers"]:
            csc = c["securityContext"]
            assert csc["allowPrivilegeEscalation"] is False and csc["readOnlyRootFilesystem"] is True
            assert csc["capabilities"]["drop"] == ["ALL"] and not csc["capabilities"].get("add")
            for kind in ("requests", "limits"):
                assert {"cpu", "memory"} <= set(c["resources"][kind]), (name, kind)
            # Ray writes its session under /tmp and its object store in /dev/shm: both writable
            mounted = {m["mountPath"] for m in c["volumeMounts"] if not m.get("readOnly")}
            assert {"/tmp", "/dev/shm"} <= mounted, name


def _ray_ports(docs: list[dict[str, Any]]) -> tuple[set[int], tuple[int, int]]:
    """The pinned single ports and the worker-process port range, as the head's command has them."""
    flags = ray_start_flags(head_command(docs))
    single = {int(flags[k]) for k in flags if k.endswith("port") and k != "metrics-export-port"}
    single.add(8265)  # the dashboard's default port
    return single, (int(flags["min-worker-port"]), int(flags["max-worker-port"]))


def test_ray_ports_are_pinned_alike_on_head_and_workers() -> None:
    docs = render(RAY_OVERLAY)
    rc = raycluster(docs)["spec"]
    flags = ray_start_flags(head_command(docs))
    head_params = rc["headGroupSpec"]["rayStartParams"]
    # the head's command and its rayStartParams (which KubeRay's Services and probes read) agree
    assert {k: v for k, v in flags.items() if k not in ("head", "disable-usage-stats")} == head_params
    for group in rc["workerGroupSpecs"]:
        params = group["rayStartParams"]
        for key in [k for k in head_params if k.endswith("port") and k != "port"]:
            assert params[key] == head_params[key], (group["groupName"], key)
        assert "port" not in params  # workers join the head's GCS port (KubeRay sets --address)


def test_network_policy_keeps_ray_traffic_inside_the_cluster() -> None:
    """Ray's ports are open only between pods of the RayCluster; from outside, only Prometheus
    reaches the metrics port; out of it, only DNS and the Kafka brokers."""
    docs = render(RAY_OVERLAY)
    policies = of_kind(docs, "NetworkPolicy")
    (deny,) = [p for p in policies if p["spec"]["podSelector"] == {}]
    assert sorted(deny["spec"]["policyTypes"]) == ["Egress", "Ingress"]
    assert not deny["spec"].get("ingress") and not deny["spec"].get("egress")
    (ray,) = [p for p in policies if p["spec"]["podSelector"] != {}]
    selector = ray["spec"]["podSelector"]["matchLabels"]
    for name, tpl in ray_templates(docs).items():
        assert selector.items() <= tpl["metadata"]["labels"].items(), name
    cluster_peer = [{"podSelector": {"matchLabels": selector}}]
    single, (low, high) = _ray_ports(docs)

    def covered(rules: list[dict[str, Any]]) -> set[int]:
        out: set[int] = set()
        for p in rules:
            assert p["protocol"] == "TCP"
            out |= set(range(p["port"], p.get("endPort", p["port"]) + 1))
        return out

    inside = [r for r in ray["spec"]["ingress"] if r["from"] == cluster_peer]
    outside = [r for r in ray["spec"]["ingress"] if r["from"] != cluster_peer]
    assert len(inside) == 1 and covered(inside[0]["ports"]) == single | set(range(low, high + 1))
    assert outside == [{"from": [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}],
                        "ports": [{"port": "ray-metrics", "protocol": "TCP"}, {"port": "metrics", "protocol": "TCP"}]}]
    egress = {json.dumps(r["to"], sort_keys=True): r["ports"] for r in ray["spec"]["egress"]}
    assert len(egress) == 3
    assert covered(egress[json.dumps(cluster_peer, sort_keys=True)]) == single | set(range(low, high + 1))
    dns = [p for to, p in egress.items() if "kube-dns" in to]
    kafka = [p for to, p in egress.items() if "strimzi.io/cluster" in to]
    assert dns and {p["port"] for p in dns[0]} == {53}
    _, cfg = ray_config(docs)
    ports = {int(s.rsplit(":", 1)[1]) for sec in ("source", "sink", "dead_letter")
             for s in str(cfg[sec]["bootstrap_servers"]).split(",")}
    assert kafka and ports == {p["port"] for p in kafka[0]}
    # nothing else in the namespace is selected by a policy that opens Ray's ports
    assert not of_kind(docs, "StatefulSet") and not of_kind(docs, "Deployment")


def test_shards_run_on_the_workers_and_never_beside_the_driver() -> None:
    """Each worker declares the shard resource a shard actor asks for; the head declares none and
    no CPU, so the scheduler can only place shards on the workers, one per worker pod."""
    from stream_vips.distributed.pool import SHARD_RESOURCE, shard_actor_options

    docs = render(RAY_OVERLAY)
    rc = raycluster(docs)["spec"]
    _, raw = ray_config(docs)
    head = rc["headGroupSpec"]["rayStartParams"]
    assert head["num-cpus"] == "0" and "resources" not in head
    assert SHARD_RESOURCE not in head_command(docs)
    offered = 0
    for group in rc["workerGroupSpecs"]:
        declared = json.loads(yaml.safe_load(group["rayStartParams"]["resources"]))  # KubeRay's quoted JSON
        assert declared == {SHARD_RESOURCE: 1}
        offered += declared[SHARD_RESOURCE] * group["replicas"]
    assert offered == raw["runtime"]["shards"]
    assert shard_actor_options({SHARD_RESOURCE: offered, "CPU": 2.0})["resources"] == {SHARD_RESOURCE: 1}


def test_service_monitor_scrapes_ray_metrics_on_every_ray_pod() -> None:
    docs = render(RAY_OVERLAY)
    svc = next(d for d in of_kind(docs, "Service") if d["metadata"]["name"] == "stream-vips-ray-metrics")
    sm = one(docs, "ServiceMonitor")
    flags = ray_start_flags(head_command(docs))
    for name, tpl in ray_templates(docs).items():
        assert svc["spec"]["selector"].items() <= tpl["metadata"]["labels"].items(), name
        (port,) = [p for c in tpl["spec"]["containers"] for p in c["ports"] if p["name"] == "ray-metrics"]
        assert port["containerPort"] == int(flags["metrics-export-port"]), name
    assert sm["spec"]["selector"]["matchLabels"].items() <= svc["metadata"]["labels"].items()
    (port,) = svc["spec"]["ports"]
    assert port["name"] in [e["port"] for e in sm["spec"]["endpoints"]] and port["targetPort"] == "ray-metrics"
    assert sm["metadata"]["labels"]["release"] == "kube-prometheus-stack"


def test_the_drivers_metrics_are_served_on_the_head_and_scraped() -> None:
    """The driver (the head's ``stream-vips run``) serves the service's metrics on metrics.port:
    the head's container declares it, a Service selects the head only and names it, the
    ServiceMonitor scrapes it and the NetworkPolicy admits Prometheus to it."""
    docs = render(RAY_OVERLAY)
    _, cfg = ray_config(docs)
    assert cfg["metrics"]["enabled"] is True and cfg["metrics"]["host"] == "0.0.0.0"
    templates = ray_templates(docs)
    declared = {name: [p for c in tpl["spec"]["containers"] for p in c.get("ports", []) if p["name"] == "metrics"]
                for name, tpl in templates.items()}
    heads = [name for name, tpl in templates.items() if tpl["metadata"]["labels"]["stream-vips/ray-node"] == "head"]
    assert len(heads) == 1 and [p["containerPort"] for p in declared[heads[0]]] == [cfg["metrics"]["port"]]
    assert all(not ports for name, ports in declared.items() if name != heads[0])  # the shards serve none
    (svc,) = [d for d in of_kind(docs, "Service") if any(p["targetPort"] == "metrics" for p in d["spec"]["ports"])]
    selected = [name for name, tpl in templates.items()
                if svc["spec"]["selector"].items() <= tpl["metadata"]["labels"].items()]
    assert selected == heads
    (port,) = svc["spec"]["ports"]
    sm = one(docs, "ServiceMonitor")
    assert sm["spec"]["selector"]["matchLabels"].items() <= svc["metadata"]["labels"].items()
    assert [e for e in sm["spec"]["endpoints"] if e["port"] == port["name"]] == [
        {"port": "metrics", "path": "/metrics", "interval": "15s", "scrapeTimeout": "10s"}]
    (ray,) = [p for p in of_kind(docs, "NetworkPolicy") if p["spec"]["podSelector"] != {}]
    monitoring = [r for r in ray["spec"]["ingress"] if "namespaceSelector" in r["from"][0]]
    assert {"port": "metrics", "protocol": "TCP"} in monitoring[0]["ports"]


# -- overlays/ray: alerts and dashboard on the sharded driver's metrics

RAY_ALERTS_TEST = K8S / "tests" / "alerts-test-ray.yaml"
#: the base's alerts the overlay drops (k8s/overlays/ray/app/prometheusrule-patch.yaml): they read
#: series of the driver's own source, and the driver has none
RAY_DROPPED_ALERTS = {"StreamVipsConsumerLagGrowing", "StreamVipsInputTopicMissing", "StreamVipsNoInputPartitions",
                      "StreamVipsRecordsNotConsumed"}
RAY_SHARD_ALERTS = {"StreamVipsShardReadsNothing", "StreamVipsShardSliceNotFilling", "StreamVipsShardDeadLettersMost",
                    "StreamVipsStepsAbandoned", "StreamVipsStepGatherSlow"}
#: series of the service's registry the sharded driver never sets: the source's (partitions held,
#: missing topics, lag; the shards read with assign() and report none of them) and the counts of
#: records a reservoir did not decode or dropped as duplicates (the shards do not report them)
SHARDED_NEVER_SET = {"stream_vips_source_partitions", "stream_vips_source_topic_missing",
                     "stream_vips_consumer_lag_records", "stream_vips_records_not_decoded_total",
                     "stream_vips_records_duplicate_total"}
#: the base dashboard's panels the ray dashboard leaves out (their series are in SHARDED_NEVER_SET)
RAY_DROPPED_PANELS = {"Consumer lag"}


def ray_base_tests() -> dict[str, Any]:
    """The base's alert unit tests (k8s/tests/alerts-test.yaml) of the rules the ray overlay keeps
    as they are; those of rules it drops or changes are left out."""
    base, ray = alerts(render("base")), alerts(render(RAY_OVERLAY))
    kept = {name for name, rule in ray.items() if base.get(name) == rule}
    tests = yaml.safe_load((K8S / "tests" / "alerts-test.yaml").read_text())
    groups = []
    for group in tests["tests"]:
        checks = [t for t in group["alert_rule_test"] if t["alertname"] in kept]
        if checks:
            groups.append({**group, "alert_rule_test": checks})
    return {**tests, "tests": groups}


def _ray_promtool_test(rules: dict[str, Any], tmp_path: Path) -> subprocess.CompletedProcess[str]:
    promtool = require("promtool")
    (tmp_path / RULES_FILE).write_text(yaml.safe_dump(rules, sort_keys=False))
    (tmp_path / "alerts-test.yaml").write_text(yaml.safe_dump(ray_base_tests(), sort_keys=False))
    shutil.copy(RAY_ALERTS_TEST, tmp_path / RAY_ALERTS_TEST.name)
    return run([promtool, "test", "rules", "alerts-test.yaml", RAY_ALERTS_TEST.name], cwd=tmp_path)


def ray_used_metric_names(docs: list[dict[str, Any]]) -> set[str]:
    used = set()
    for rule in alerts(docs).values():
        used |= promql_metric_names(rule["expr"])
    for _, expr in dashboard_exprs(dashboard(docs)):
        used |= promql_metric_names(expr)
    return used


def test_ray_alerts_are_the_bases_that_hold_and_the_shard_alerts(tmp_path: Path) -> None:
    promtool = require("promtool")
    base, ray = alerts(render("base")), alerts(render(RAY_OVERLAY))
    assert set(ray) == (set(base) - RAY_DROPPED_ALERTS) | RAY_SHARD_ALERTS
    for name in RAY_DROPPED_ALERTS:  # dropped because the driver never sets what they read
        assert promql_metric_names(base[name]["expr"]) & SHARDED_NEVER_SET, name
    changed = {name for name in set(base) & set(ray) if ray[name] != base[name]}
    assert changed == {"StreamVipsDeadLetterRateHigh"}
    assert "stream_vips_records_not_decoded_total" in base["StreamVipsDeadLetterRateHigh"]["expr"]
    for name, rule in ray.items():
        assert not promql_metric_names(rule["expr"]) & SHARDED_NEVER_SET, name
        assert rule["labels"]["severity"] in ("info", "warning", "critical"), name
    proc = run([promtool, "check", "rules", str(write_rules(RAY_OVERLAY, tmp_path))])
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert one(render(RAY_OVERLAY), "PrometheusRule")["metadata"]["labels"]["release"] == \
        one(render(RAY_OVERLAY), "ServiceMonitor")["metadata"]["labels"]["release"]


def test_ray_alert_unit_tests_pass(tmp_path: Path) -> None:
    """alerts-test-ray.yaml tests what the overlay changes or adds; the base's tests of the rules
    it keeps run beside them; every alert of the overlay is fired by one of them."""
    base, ray = alerts(render("base")), alerts(render(RAY_OVERLAY))
    own = yaml.safe_load(RAY_ALERTS_TEST.read_text())["tests"]
    assert {t["alertname"] for g in own for t in g["alert_rule_test"]} == \
        {name for name, rule in ray.items() if base.get(name) != rule}
    fired = {t["alertname"] for g in ray_base_tests()["tests"] + own for t in g["alert_rule_test"] if t["exp_alerts"]}
    assert fired == set(ray)
    proc = _ray_promtool_test(rule_groups(render(RAY_OVERLAY)), tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.mark.parametrize(
    "alert, old, new",
    [
        ("StreamVipsDeadLetterRateHigh", None, None),  # the base's expression
        ("StreamVipsShardReadsNothing", "unless ignoring (shard) stream_vips_halted == 1", ""),
        ("StreamVipsShardReadsNothing",
         "and ignoring (shard) sum without (shard) (rate(stream_vips_shard_records_total[15m])) > 0\n", ""),
        ("StreamVipsShardReadsNothing", "== 0\n", ">= 0\n"),
        ("StreamVipsShardSliceNotFilling", "unless ignoring (shard) stream_vips_halted == 1", ""),
        ("StreamVipsShardSliceNotFilling", "and changes(stream_vips_shard_reservoir_records[15m]) == 0\n", ""),
        ("StreamVipsShardSliceNotFilling", " < stream_vips_shard_reservoir_capacity",
         " <= stream_vips_shard_reservoir_capacity"),
        ("StreamVipsShardDeadLettersMost", "> 0.5", "> 0.05"),
        ("StreamVipsStepGatherSlow", '{phase="gather"}', ""),
        ("StreamVipsStepGatherSlow", "> 30", "> 60"),
        ("StreamVipsStepsAbandoned", ">= 3", ">= 1"),
    ],
)
def test_ray_alert_unit_tests_catch_a_broken_rule(alert: str, old: str | None, new: str | None,
                                                  tmp_path: Path) -> None:
    rules = rule_groups(render(RAY_OVERLAY))
    (rule,) = [r for g in rules["groups"] for r in g["rules"] if r.get("alert") == alert]
    if old is None:
        rule["expr"] = alerts(render("base"))[alert]["expr"]
    else:
        assert old in rule["expr"]
        rule["expr"] = rule["expr"].replace(old, new or "")
    proc = _ray_promtool_test(rules, tmp_path)
    assert proc.returncode != 0 and alert in proc.stdout + proc.stderr


def test_ray_gather_alert_is_half_the_configured_shard_timeout() -> None:
    """StreamVipsStepGatherSlow's threshold follows runtime.shard_timeout_s of the mounted config
    (the driver does not export it)."""
    docs = render(RAY_OVERLAY)
    _, cfg = ray_config(docs)
    expr = alerts(docs)["StreamVipsStepGatherSlow"]["expr"]
    (threshold,) = re.findall(r">\s*([0-9.]+)$", expr.strip())
    assert float(threshold) == cfg["runtime"]["shard_timeout_s"] / 2


def test_ray_down_alert_selects_the_job_of_both_scraped_services() -> None:
    """Prometheus names the job of both endpoints (the driver's and Ray's) after the Services'
    jobLabel; StreamVipsDown selects that job."""
    docs = render(RAY_OVERLAY)
    sm = one(docs, "ServiceMonitor")
    selected = [d for d in of_kind(docs, "Service")
                if sm["spec"]["selector"]["matchLabels"].items() <= d["metadata"]["labels"].items()]
    assert len(selected) == 2
    (job,) = {svc["metadata"]["labels"][sm["spec"]["jobLabel"]] for svc in selected}
    assert f'up{{job="{job}"}}' in alerts(docs)["StreamVipsDown"]["expr"]


def test_the_sharded_driver_sets_what_the_ray_rules_and_dashboard_read(tmp_path: Path) -> None:
    """A local sharded run's /metrics (the driver's registry): every series the overlay's rules and
    dashboard read has a sample, and SHARDED_NEVER_SET (what the dropped rules and panel read) has
    none, or only zeros."""
    from stream_vips.cli import sharded
    from stream_vips.service.build import config_from_dict
    from test_distributed_operator import samples, settings, write_shards

    write_shards(tmp_path, [600, 600], malformed=[3, 5])  # read until the budget halts updates
    service = sharded.start(config_from_dict(settings(tmp_path, privacy={"epsilon": 1.0, "planned_steps": 3}),
                                             env={}))
    try:
        sharded.serve(service)
    finally:
        service.close()
    got = samples(service.metrics.exposition().decode())
    assert service.learner.halt_cause == "budget"
    for name in SHARDED_NEVER_SET:
        assert all(value == 0 for (n, _), value in got.items() if n == name), name
    exported = {name for name, _ in got} - SHARDED_NEVER_SET
    used = ray_used_metric_names(render(RAY_OVERLAY))
    assert used and used <= exported, sorted(used - exported)
    # and the base's rules and dashboard read series the sharded driver never sets
    assert ray_used_metric_names(render("base")) & SHARDED_NEVER_SET


def test_ray_dashboard_is_the_bases_with_per_shard_panels() -> None:
    base, ray = dashboard(render("base")), dashboard(render(RAY_OVERLAY))
    assert ray["uid"] != base["uid"] and ray["templating"] == base["templating"]
    ids = [p["id"] for p in ray["panels"]]
    assert len(ids) == len(set(ids))
    panels = {p["title"]: p for p in ray["panels"]}
    for panel in base["panels"]:
        if panel["title"] in RAY_DROPPED_PANELS:
            assert panel["title"] not in panels
            assert {n for t in panel["targets"] for n in promql_metric_names(t["expr"])} <= SHARDED_NEVER_SET
            continue
        assert panels[panel["title"]]["targets"] == panel["targets"], panel["title"]
    exprs = " ".join(e for _, e in dashboard_exprs(ray))
    for needle in (
        "sum by (shard) (rate(stream_vips_shard_records_total",
        "sum by (shard) (rate(stream_vips_shard_records_accepted",
        "sum by (shard) (rate(stream_vips_shard_dead_letters_total",
        "sum by (shard) (stream_vips_shard_reservoir_records",
        "sum by (shard) (stream_vips_shard_reservoir_capacity", "stream_vips_step_phase_duration_seconds_sum",
        "sum by (phase, le) (rate(stream_vips_step_phase_duration_seconds_bucket",
    ):
        assert needle in exprs, needle
    for panel in ray["panels"]:
        assert panel["datasource"]["uid"] == "${datasource}", panel["title"]
        for target in panel.get("targets", []):
            assert 'namespace="$namespace", pod=~"$pod"' in target["expr"], panel["title"]
    # no two panels overlap on Grafana's 24-column grid
    cells = [(x, y) for p in ray["panels"] for g in [p["gridPos"]]
             for x in range(g["x"], g["x"] + g["w"]) for y in range(g["y"], g["y"] + g["h"])]
    assert len(set(cells)) == len(cells) and all(x < 24 for x, _ in cells)


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "--write-rules":
        overlay = str(Path(sys.argv[2]).resolve().relative_to(K8S))
        print(write_rules(overlay, Path(sys.argv[3])))
    else:
        sys.exit(f"usage: {shlex.join([sys.argv[0], '--write-rules', 'OVERLAY_DIR', 'OUT_DIR'])}")
