#!/usr/bin/env bash
# Installs what tests/test_k8s.py and tests/test_prometheus_scrape.py need, offline afterwards:
# a kustomize renderer (kubectl, else a standalone kustomize), kubernetes-validate with its bundled
# schemas, and Debian's prometheus/promtool. Safe to rerun; each step skips what is installed.
set -euo pipefail
export DEBIAN_FRONTEND=noninteractive

# Versions pinned here are the ones tests/test_k8s.py validates against.
KUBERNETES_VALIDATE_VERSION=1.37.0
KUSTOMIZE_VERSION=v5.5.0

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
