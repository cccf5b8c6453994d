#!/usr/bin/env bash
# Installs what tests/test_k8s.py and tests/test_prometheus_scrape.py need, offline afterwards:
# a kustomize renderer (kubectl, else a standalone kustomize), kubernetes-validate with its bundled
# schemas, Debian's prometheus/promtool, and the operators' own CustomResourceDefinitions (below)
# in tools/k8s/crds. Safe to rerun; each step skips what is installed.
set -euo pipefail
export DEBIAN_FRONTEND=noninteractive

# Versions pinned here are the ones tests/test_k8s.py validates against.
KUBERNETES_VALIDATE_VERSION=1.37.0
KUSTOMIZE_VERSION=v5.5.0
# The CRDs whose schemas KafkaTopic, KafkaUser, ServiceMonitor, PrometheusRule and RayCluster are
# checked against:
#  - Strimzi: the v1 CRDs that Strimzi's build generates from its API classes, shipped in the test jar
#    of io.strimzi:api on Maven Central (crds/v1/*.yaml); the main jar has only the classes.
#  - Prometheus Operator: example/prometheus-operator-crd/ of its Go module, from the Go module proxy
#    (v0.85.0 is the newest version of github.com/prometheus-operator/prometheus-operator the proxy
#    serves here; later tags are refused).
#  - KubeRay: config/crd/bases/ray.io_rayclusters.yaml of its Go module
#    github.com/ray-project/kuberay/ray-operator, from the Go module proxy (v1.6.2 is the newest
#    version the proxy serves here; v1.6.3 and v1.7.0 are refused).
# The sha256 of each file pins the content as well as the version.
STRIMZI_VERSION=0.49.0
PROMETHEUS_OPERATOR_VERSION=v0.85.0
KUBERAY_VERSION=v1.6.2
CRD_SHA256="
36390f0731c699448076d4ee739e8b7f331d083e91a7fb71500aaa830ab1127e  kafkatopics.kafka.strimzi.io.yaml
c1c74853d7143264da8d13239fe95dc2d82f374fb1dd2a44040266b882007de7  kafkausers.kafka.strimzi.io.yaml
1dae27b7189b5ce7b9ab764656c18b4c75a45cde1e6f3af6a5e84c4317628919  servicemonitors.monitoring.coreos.com.yaml
98fd16c9ab79fba8dcd6ef62c957c98cd6546ab74ce0a4ecf09ddf2fda03020e  prometheusrules.monitoring.coreos.com.yaml
1d51d8c4ce065b22c2069af0ebd72ae25f4a6968e5c5f93a3106ba6fc35bcc1d  rayclusters.ray.io.yaml
"

apt_install() {
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "$@"
}

if ! command -v promtool >/dev/null 2>&1 || ! command -v prometheus >/dev/null 2>&1; then
  echo "[k8s-setup] apt-get install prometheus"
  apt_install prometheus
fi

# The manifests need kustomize v4.1 or later (the `labels` field): kubectl 1.22 or later embeds
# one. Debian's kubernetes-client (1.20) is too old, so without a kubectl that renders the
# overlays we build kustomize itself with Go, from its Go module.
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
if ! kubectl kustomize "$ROOT/k8s/overlays/prod" >/dev/null 2>&1 && ! command -v kustomize >/dev/null 2>&1; then
  if ! command -v go >/dev/null 2>&1 && [ -x /usr/local/go/bin/go ]; then
    export PATH="$PATH:/usr/local/go/bin"
  fi
  if command -v go >/dev/null 2>&1; then
    echo "[k8s-setup] go install sigs.k8s.io/kustomize/kustomize/v5@${KUSTOMIZE_VERSION}"
    GOBIN=/usr/local/bin go install "sigs.k8s.io/kustomize/kustomize/v5@${KUSTOMIZE_VERSION}"
  else
    echo "[k8s-setup] no kubectl >= 1.22 and no Go: tests/test_k8s.py cannot render the overlays" >&2
    exit 1
  fi
fi

if ! python3 -c "import kubernetes_validate, sys; sys.exit(kubernetes_validate.__version__ != '${KUBERNETES_VALIDATE_VERSION}')" 2>/dev/null; then
  echo "[k8s-setup] pip install kubernetes-validate==${KUBERNETES_VALIDATE_VERSION}"
  python3 -m pip install -q "kubernetes-validate==${KUBERNETES_VALIDATE_VERSION}"
fi

# --- the operators' CRDs ---------------------------------------------------------------------
CRDS="$ROOT/tools/k8s/crds"
crds_ok() { [ -d "$CRDS" ] && (cd "$CRDS" && echo "$CRD_SHA256" | sed '/^$/d' | sha256sum --quiet -c - >/dev/null 2>&1); }
if ! crds_ok; then
  mkdir -p "$CRDS" "$ROOT/tools/k8s/cache"
  echo "[k8s-setup] Strimzi ${STRIMZI_VERSION} CRDs: io.strimzi:api:${STRIMZI_VERSION}:jar:tests from Maven Central"
  mvn -q -B org.apache.maven.plugins:maven-dependency-plugin:3.8.1:copy \
    "-Dartifact=io.strimzi:api:${STRIMZI_VERSION}:jar:tests" "-DoutputDirectory=$ROOT/tools/k8s/cache"
  python3 - "$ROOT/tools/k8s/cache/api-${STRIMZI_VERSION}-tests.jar" "$CRDS" <<'EOF'
import sys, zipfile
jar, out = sys.argv[1], sys.argv[2]
with zipfile.ZipFile(jar) as z:
    for member, name in (("crds/v1/043-Crd-kafkatopic.yaml", "kafkatopics.kafka.strimzi.io.yaml"),
                         ("crds/v1/044-Crd-kafkauser.yaml", "kafkausers.kafka.strimzi.io.yaml")):
        with open(f"{out}/{name}", "wb") as f:
            f.write(z.read(member))
EOF
  echo "[k8s-setup] Prometheus Operator ${PROMETHEUS_OPERATOR_VERSION} CRDs: its Go module from the Go module proxy"
  if ! command -v go >/dev/null 2>&1 && [ -x /usr/local/go/bin/go ]; then
    export PATH="$PATH:/usr/local/go/bin"
  fi
  command -v go >/dev/null 2>&1 || { echo "[k8s-setup] Go is needed to fetch the Prometheus Operator module" >&2; exit 1; }
  moddir=$(cd "$(mktemp -d)" && GOFLAGS=-mod=mod go mod download -json \
    "github.com/prometheus-operator/prometheus-operator@${PROMETHEUS_OPERATOR_VERSION}" \
    | python3 -c 'import json, sys; d = json.load(sys.stdin); print(d.get("Dir") or sys.exit(d.get("Error")))')
  for kind in servicemonitors prometheusrules; do
    cp "$moddir/example/prometheus-operator-crd/monitoring.coreos.com_${kind}.yaml" "$CRDS/${kind}.monitoring.coreos.com.yaml"
    chmod 0644 "$CRDS/${kind}.monitoring.coreos.com.yaml"
  done
  echo "[k8s-setup] KubeRay ${KUBERAY_VERSION} RayCluster CRD: its Go module from the Go module proxy"
  moddir=$(cd "$(mktemp -d)" && GOFLAGS=-mod=mod go mod download -json \
    "github.com/ray-project/kuberay/ray-operator@${KUBERAY_VERSION}" \
    | python3 -c 'import json, sys; d = json.load(sys.stdin); print(d.get("Dir") or sys.exit(d.get("Error")))')
  cp "$moddir/config/crd/bases/ray.io_rayclusters.yaml" "$CRDS/rayclusters.ray.io.yaml"
  chmod 0644 "$CRDS/rayclusters.ray.io.yaml"
  if ! crds_ok; then
    echo "[k8s-setup] the fetched CRDs do not match the pinned sha256:" >&2
    (cd "$CRDS" && echo "$CRD_SHA256" | sed '/^$/d' | sha256sum -c - >&2) || true
    exit 1
  fi
fi
echo "[k8s-setup] CRDs ready in $CRDS: $(cd "$CRDS" && ls | tr '\n' ' ')"
