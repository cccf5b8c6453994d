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

# `kubectl kustomize` needs kubectl >= 1.21 (kustomize v4+). Debian's kubernetes-client is 1.20,
# too old for the `patches` field, so without a recent kubectl we build kustomize itself with Go
# from its Go module.
if ! kubectl kustomize --help >/dev/null 2>&1 && ! command -v kustomize >/dev/null 2>&1; then
  if command -v go >/dev/null 2>&1; then
    echo "[k8s-setup] go install sigs.k8s.io/kustomize/kustomize/v5@${KUSTOMIZE_VERSION}"
    GOBIN=/usr/local/bin go install "sigs.k8s.io/kustomize/kustomize/v5@${KUSTOMIZE_VERSION}"
  else
    echo "[k8s-setup] apt-get install kubernetes-client (no Go available for kustomize)"
    apt_install kubernetes-client
  fi
fi

if ! python3 -c "import kubernetes_validate, sys; sys.exit(kubernetes_validate.__version__ != '${KUBERNETES_VALIDATE_VERSION}')" 2>/dev/null; then
  echo "[k8s-setup] pip install kubernetes-validate==${KUBERNETES_VALIDATE_VERSION}"
  python3 -m pip install -q "kubernetes-validate==${KUBERNETES_VALIDATE_VERSION}"
fi
