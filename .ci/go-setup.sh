#!/usr/bin/env bash
# Fills the Go module cache for examples/go-consumer from the Go module proxy (GOPROXY as the
# environment has it; go.sum pins every module), then builds it with the proxy off: afterwards
# tests/test_model_topic_consumers.py builds and runs it without the network. Safe to rerun.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
if ! command -v go >/dev/null 2>&1 && [ -x /usr/local/go/bin/go ]; then
  export PATH="$PATH:/usr/local/go/bin"
fi
if ! command -v go >/dev/null 2>&1; then
  echo "[go-setup] no Go: install Go 1.26 (/usr/local/go) for examples/go-consumer" >&2
  exit 1
fi
cd "$ROOT/examples/go-consumer"
echo "[go-setup] go mod download (examples/go-consumer)"
GOFLAGS=-mod=mod go mod download
out="$(mktemp -d)"
GOFLAGS=-mod=mod GOPROXY=off go build -o "$out/go-consumer" .
rm -rf "$out"
echo "[go-setup] examples/go-consumer builds offline"
