#!/usr/bin/env bash
# Builds the container image without Docker Hub and without a Docker daemon, then runs it:
#
#   1. a Debian bookworm base (python3, python3-venv, ca-certificates) made with mmdebstrap from
#      Debian's own packages, imported into podman's store;
#   2. the project image, `podman build --isolation chroot --build-arg BASE_IMAGE=<that base>`;
#   3. its size, against IMAGE_BUDGET_MB below;
#   4. inside the image, as user 10001 with the root filesystem read-only and only /tmp and
#      /var/lib/stream-vips writable (as in k8s/base/app/statefulset.yaml): `stream-vips plan`, the
#      demo, and the image's own ENTRYPOINT (`stream-vips run --config /etc/stream-vips/config.yaml`)
#      against the test broker (tools/kafka/broker.py) on loopback, whose model topic is then read
#      back from the host.
#
# The container is started with `podman run --read-only --user 10001`: with podman's default OCI
# runtime (crun) where it works, else with runc (Debian's package), which copes with hosts whose
# cgroups are in hybrid mode, with rlimits lowered to 4096 (without CAP_SYS_RESOURCE a runtime
# cannot set the host's own limits again). Where neither can start a container, the same image is
# run the way a runtime would set it up, minus the namespaces it cannot have: the image's read-only
# root filesystem (`podman image mount`) in a private mount and PID namespace, tmpfs on /tmp and
# /var/lib/stream-vips, the config bind-mounted read-only, chrooted as 10001:10001 with the image's
# environment. The log says which one ran.
#
# Needs root (mmdebstrap, podman). Installs podman, buildah, runc and mmdebstrap with apt-get. Under CI=true
# every failure fails the run; nothing is skipped. Usage: bash .ci/image-test.sh
# (IMAGE_TEST_RUNNER=chroot forces the last-resort runner)
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT="$PWD"
export DEBIAN_FRONTEND=noninteractive

SUITE=bookworm
BASE_PACKAGES=python3,python3-venv,ca-certificates
BASE_IMAGE=localhost/stream-vips-base:$SUITE
IMAGE=localhost/stream-vips:ci
# The image on the bookworm base measures 513 MB (the base alone 179 MB; numpy, scipy, and
# matplotlib, which autodp requires, make most of the rest).
IMAGE_BUDGET_MB=650
CACHE="$ROOT/tools/image/cache"     # gitignored: the base tarball, reused while under a week old
BASE_MAX_AGE_DAYS=7
UID_RUN=10001

t_start=$(date +%s)
log() { echo "[image-test] $*"; }
die() { echo "[image-test] FAIL: $*" >&2; exit 1; }
in_ci() { case "${CI:-}" in 1|true|TRUE|yes) return 0;; *) return 1;; esac; }
elapsed() { echo "$(( $(date +%s) - $1 ))s"; }

if [ "$(id -u)" != 0 ]; then
  in_ci && die "needs root (mmdebstrap, podman)"
  log "SKIP: needs root (mmdebstrap, podman); CI runs it as root"
  exit 0
fi

# --- tools --------------------------------------------------------------------------------------
need=()
command -v podman >/dev/null 2>&1 || need+=(podman)
command -v buildah >/dev/null 2>&1 || need+=(buildah)
command -v mmdebstrap >/dev/null 2>&1 || need+=(mmdebstrap)
command -v runc >/dev/null 2>&1 || need+=(runc)
command -v unshare >/dev/null 2>&1 || need+=(util-linux)
if [ ${#need[@]} -gt 0 ]; then
  log "apt-get install ${need[*]}"
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi
for tool in podman buildah mmdebstrap unshare chroot; do
  command -v "$tool" >/dev/null 2>&1 || die "$tool not installed"
done
log "$(podman --version), $(buildah --version | cut -d' ' -f1-3), mmdebstrap $(mmdebstrap --version | awk '{print $2}')"

# --- 1. the base: Debian's packages only ------------------------------------------------------
mkdir -p "$CACHE"
tarball="$CACHE/$SUITE-python3.tar"
t0=$(date +%s)
if [ ! -s "$tarball" ] || [ -n "$(find "$tarball" -mtime +"$BASE_MAX_AGE_DAYS" 2>/dev/null)" ]; then
  log "mmdebstrap $SUITE ($BASE_PACKAGES) -> $tarball"
  mirror=http://deb.debian.org/debian
  mmdebstrap --quiet --variant=minbase --include="$BASE_PACKAGES" \
    --aptopt='Acquire::Retries "3"' \
    --dpkgopt='path-exclude=/usr/share/man/*' --dpkgopt='path-exclude=/usr/share/locale/*' \
    --dpkgopt='path-exclude=/usr/share/doc/*' --dpkgopt='path-include=/usr/share/doc/*/copyright' \
    "$SUITE" "$CACHE/partial.tar" \
    "deb $mirror $SUITE main" "deb $mirror $SUITE-updates main" "deb $mirror-security $SUITE-security main" \
    || die "mmdebstrap failed"
  mv "$CACHE/partial.tar" "$tarball"   # (mmdebstrap picks the format from the .tar name)
fi
# Re-import only a new tarball: every import is a new image id, which would void the build cache.
stamp="$CACHE/base.image-id"
if [ ! -f "$stamp" ] || [ "$tarball" -nt "$stamp" ] \
   || [ "$(podman image inspect --format '{{.Id}}' "$BASE_IMAGE" 2>/dev/null)" != "$(cat "$stamp")" ]; then
  podman import --quiet --change 'CMD ["/bin/bash"]' "$tarball" "$BASE_IMAGE" > "$stamp" || die "podman import failed"
  podman image inspect --format '{{.Id}}' "$BASE_IMAGE" > "$stamp"
fi
log "base $BASE_IMAGE ready in $(elapsed "$t0")"

# --- 2. the project image ---------------------------------------------------------------------
t0=$(date +%s)
build_args=(--build-arg "BASE_IMAGE=$BASE_IMAGE")
# A host that reaches PyPI through a TLS-inspecting proxy trusts extra CAs; lend the build stage
# the host's bundle (mounted for the RUN steps only, never copied into a layer).
host_ca=/etc/ssl/certs/ca-certificates.crt
if [ -s "$host_ca" ]; then
  build_args+=(-v "$host_ca:/run/host-ca.crt:ro" --build-arg PIP_CERT=/run/host-ca.crt)
fi
[ -n "${PIP_INDEX_URL:-}" ] && build_args+=(--build-arg "PIP_INDEX_URL=$PIP_INDEX_URL")
log "podman build --isolation chroot ${build_args[*]} -t $IMAGE ."
podman build --isolation chroot --layers "${build_args[@]}" -t "$IMAGE" . > "$CACHE/build.log" 2>&1 \
  || { tail -40 "$CACHE/build.log" >&2; die "image build failed (log: $CACHE/build.log)"; }
build_time=$(elapsed "$t0")
log "image $IMAGE built in $build_time"

# --- 3. size ----------------------------------------------------------------------------------
size_bytes=$(podman image inspect --format '{{.Size}}' "$IMAGE")
size_mb=$(( size_bytes / 1000000 ))
base_mb=$(( $(podman image inspect --format '{{.Size}}' "$BASE_IMAGE") / 1000000 ))
log "image size: ${size_mb} MB (base ${base_mb} MB), budget ${IMAGE_BUDGET_MB} MB"
[ "$size_mb" -le "$IMAGE_BUDGET_MB" ] || die "image is ${size_mb} MB, over the ${IMAGE_BUDGET_MB} MB budget"
[ "$(podman image inspect --format '{{.Config.User}}' "$IMAGE")" = "$UID_RUN:$UID_RUN" ] \
  || die "the image does not run as $UID_RUN:$UID_RUN"

# --- 4. run it: non-root, read-only root filesystem -------------------------------------------
work=$(mktemp -d /tmp/stream-vips-image-test.XXXXXX)
broker_pid=""
rootfs=""
image_id=""
STEP_TIMEOUT_S=300  # each command in the image; the run against the broker takes a few seconds
cleanup() {
  [ -n "$broker_pid" ] && kill "$broker_pid" 2>/dev/null && wait "$broker_pid" 2>/dev/null || true
  [ -n "$rootfs" ] && podman image unmount "$image_id" >/dev/null 2>&1 || true
  rm -rf "$work"
}
trap cleanup EXIT
mkdir -p "$work/etc"
chmod 0755 "$work" "$work/etc"

mapfile -t image_env < <(podman image inspect --format '{{range .Config.Env}}{{println .}}{{end}}' "$IMAGE" | sed '/^$/d')

# How to start a container: podman with its default OCI runtime (crun); else runc, which copes
# with a host whose cgroups are in hybrid mode, with rlimits below the host's (a process without
# CAP_SYS_RESOURCE may lower its limits but not set them again); else the chroot runner below.
probe() { "$@" run --rm --read-only --user "$UID_RUN:$UID_RUN" --network host --entrypoint /bin/true "$IMAGE" \
            > "$work/probe.log" 2>&1; }
podman_cmd=()
if [ "${IMAGE_TEST_RUNNER:-auto}" = chroot ]; then  # force the last resort (to test it)
  echo "IMAGE_TEST_RUNNER=chroot" > "$work/probe.log"
elif probe podman; then
  podman_cmd=(podman)
fi
ulimits=()
if [ ${#podman_cmd[@]} -eq 0 ] && [ "${IMAGE_TEST_RUNNER:-auto}" != chroot ] && command -v runc >/dev/null 2>&1; then
  ulimits=(--ulimit nofile=4096:4096 --ulimit nproc=4096:4096)
  if podman --runtime runc run --rm "${ulimits[@]}" --read-only --user "$UID_RUN:$UID_RUN" --network host \
       --entrypoint /bin/true "$IMAGE" > "$work/probe.log" 2>&1; then
    podman_cmd=(podman --runtime runc)
  fi
fi
if [ ${#podman_cmd[@]} -gt 0 ]; then
  mode="${podman_cmd[*]} run"
else
  mode=chroot
  log "podman run is not possible here ($(tail -1 "$work/probe.log")); running the image's" \
      "read-only root filesystem chrooted as $UID_RUN in private mount and PID namespaces"
  image_id=$(podman image inspect --format '{{.Id}}' "$IMAGE")
  rootfs=$(podman image mount "$image_id")
  [ -d "$rootfs/opt/stream-vips" ] || die "podman image mount gave no root filesystem"
fi

# the image's environment, for the chroot runner (podman run applies it itself)
printf 'ENV=(' > "$work/env.sh"; printf '%q ' "${image_env[@]}" >> "$work/env.sh"; printf ')\n' >> "$work/env.sh"

# in_image ARGV...: run ARGV inside the image as 10001:10001 in /var/lib/stream-vips; /tmp and
# /var/lib/stream-vips are fresh and empty (tmpfs, or a host directory under podman), $work/etc is /etc/stream-vips (read-only), the network is
# the host's (the test broker listens on loopback).
in_image() {
  if [ "$mode" != chroot ]; then
    # a fresh state directory owned by 10001, as the PersistentVolume is (fsGroup) in the pod
    local state
    state=$(mktemp -d "$work/state.XXXXXX")
    chown "$UID_RUN:$UID_RUN" "$state" && chmod 0750 "$state"
    timeout "$STEP_TIMEOUT_S" "${podman_cmd[@]}" run --rm --timeout "$STEP_TIMEOUT_S" "${ulimits[@]}" \
      --read-only --read-only-tmpfs=false --tmpfs /tmp:rw,size=64m,mode=1777 \
      --user "$UID_RUN:$UID_RUN" --network host \
      -v "$state:/var/lib/stream-vips" -v "$work/etc:/etc/stream-vips:ro" \
      --entrypoint "$1" "$IMAGE" "${@:2}"
    return
  fi
  # shellcheck disable=SC2016
  timeout "$STEP_TIMEOUT_S" unshare --mount --pid --fork --kill-child --propagation private -- /bin/bash -euc '
    r=$1; uid=$2; etc=$3; source "$4"; shift 4
    mount -t proc proc "$r/proc"
    mount -t tmpfs -o size=8m,mode=0755 tmpfs "$r/dev"
    for d in null zero full random urandom tty; do touch "$r/dev/$d"; mount --bind "/dev/$d" "$r/dev/$d"; done
    mkdir "$r/dev/shm" && mount -t tmpfs -o size=64m,mode=1777 tmpfs "$r/dev/shm"
    ln -s /proc/self/fd "$r/dev/fd"
    mount -t tmpfs -o size=64m,mode=1777 tmpfs "$r/tmp"
    mount -t tmpfs -o "size=256m,mode=0750,uid=$uid,gid=$uid" tmpfs "$r/var/lib/stream-vips"
    mount --bind "$etc" "$r/etc/stream-vips" && mount -o remount,bind,ro "$r/etc/stream-vips"
    exec chroot --userspec="$uid:$uid" --groups="$uid" "$r" \
      /bin/sh -c "cd /var/lib/stream-vips && exec \"\$@\"" sh /usr/bin/env -i "${ENV[@]}" "$@"
  ' in-image "$rootfs" "$UID_RUN" "$work/etc" "$work/env.sh" "$@"
}
log "running the image via: $mode"

# 4a. who and where: uid 10001, root filesystem read-only, /tmp and the state directory writable
t0=$(date +%s)
in_image /bin/sh -c '
  set -e
  test "$(id -u):$(id -g)" = "10001:10001" || { echo "runs as $(id -u):$(id -g)"; exit 1; }
  for p in /opt/stream-vips/probe /etc/probe /usr/probe /probe; do
    if touch "$p" 2>/dev/null; then echo "root filesystem is writable at $p"; exit 1; fi
  done
  touch /tmp/probe /var/lib/stream-vips/probe
  test "$(pwd)" = /var/lib/stream-vips
  echo "uid $(id -u), read-only root, writable /tmp and /var/lib/stream-vips"
' || die "the container does not run as $UID_RUN with a read-only root filesystem"

# 4b. stream-vips plan
in_image stream-vips plan --sampling poisson --batch-size 1000 --reservoir 10000 --steps 500 \
    --delta 1e-5 --epsilon 1.0 --json > "$work/plan.json" || die "stream-vips plan failed in the image"
python3 - "$work/plan.json" <<'EOF' || die "stream-vips plan printed no usable plan"
import json, sys
plan = json.load(open(sys.argv[1]))
z = plan.get("noise_multiplier")
assert isinstance(z, (int, float)) and z > 0, plan
print(f"[image-test] plan in the image: noise multiplier {z:.4f} for epsilon 1 over 500 steps")
EOF

# 4c. the demo (synthetic stream, model and ledger files on the state volume)
in_image stream-vips demo --no-progress --records 20000 --seed 1 --out /var/lib/stream-vips/demo \
    > "$work/demo.out" || { cat "$work/demo.out" >&2; die "stream-vips demo failed in the image"; }
grep -q "epsilon spent" "$work/demo.out" || { cat "$work/demo.out" >&2; die "the demo printed no summary"; }
log "demo in the image: $(grep -m1 'private updates' "$work/demo.out" | tr -s ' ')"

# 4d. stream-vips run (the image's ENTRYPOINT) against the test broker on loopback
[ -n "$(ls tools/kafka/lib/kafka_2.13-*.jar 2>/dev/null)" ] || bash .ci/kafka-setup.sh
python3 tools/kafka/broker.py serve > "$work/broker.log" 2>&1 &
broker_pid=$!
for _ in $(seq 120); do
  grep -q "broker ready at" "$work/broker.log" && break
  kill -0 "$broker_pid" 2>/dev/null || { cat "$work/broker.log" >&2; die "the test broker did not start"; }
  sleep 1
done
bootstrap=$(sed -n 's/.*broker ready at \([^ ]*\) .*/\1/p' "$work/broker.log")
[ -n "$bootstrap" ] || die "the test broker did not report its address"
log "test broker at $bootstrap"

python3 - "$bootstrap" "$work/etc/config.yaml" <<'EOF' || die "could not prepare topics and config"
import sys
sys.path.insert(0, "tests")
import yaml
from kafka_broker import create_topic, linreg_records, produce

bootstrap, path = sys.argv[1], sys.argv[2]
create_topic(bootstrap, "image-test.records", partitions=2)
create_topic(bootstrap, "image-test.models", configs={"cleanup.policy": "compact", "max.message.bytes": "1048576"})
create_topic(bootstrap, "image-test.dead-letters")
produce(bootstrap, "image-test.records", linreg_records(6000, dim=4, seed=5), partitions=2)
kafka = {"bootstrap_servers": bootstrap}
config = {
    "model": {"family": "linreg", "id": "image-test", "params": {"dim": 4}},
    "privacy": {"epsilon": 1.0, "delta": 1.0e-5, "planned_steps": 20,
                "ledger": {"type": "file", "path": "/var/lib/stream-vips/ledger.jsonl"}},
    "sampling": {"method": "poisson", "reservoir": 2000, "batch_size": 500},
    "schedule": {"every_records": 500},
    "source": {"type": "kafka", **kafka, "topics": "image-test.records", "group_id": "image-test",
               "group_instance_id": "stream-vips-0", "until_end": True},
    "sink": {"type": "kafka", **kafka, "topic": "image-test.models", "create_topic": False,
             "transactional_id": "stream-vips-0-models"},
    "dead_letter": {"type": "kafka", **kafka, "topic": "image-test.dead-letters", "create_topic": False},
    "metrics": {"enabled": True, "host": "127.0.0.1", "port": 0},
    "runtime": {"checkpoint_path": "/var/lib/stream-vips/reservoir-checkpoint.npz", "publish_interval_s": 0},
}
with open(path, "w") as f:
    yaml.safe_dump(config, f, sort_keys=False)
EOF
chmod 0644 "$work/etc/config.yaml"

entrypoint=$(podman image inspect --format '{{range .Config.Entrypoint}}{{.}} {{end}}' "$IMAGE")
read -r -a entrypoint_argv <<< "$entrypoint"
[ "${entrypoint_argv[*]}" = "stream-vips run --config /etc/stream-vips/config.yaml" ] \
  || die "unexpected ENTRYPOINT: $entrypoint"
t_run=$(date +%s)
in_image "${entrypoint_argv[@]}" --log-level WARNING --no-progress --json-summary - > "$work/run.out" 2> "$work/run.err" \
  || { tail -30 "$work/run.err" >&2; die "stream-vips run failed in the image"; }
log "stream-vips run in the image: $(elapsed "$t_run") (exit 0)"

python3 - "$bootstrap" "$work/run.out" <<'EOF' || die "the run in the image published no readable model"
import json, sys
from stream_vips.client import ModelReader

bootstrap, out = sys.argv[1], sys.argv[2]
summary = json.loads(open(out).read())
reader = ModelReader(bootstrap, "image-test.models")
try:
    model = reader.posterior("image-test", wait_s=30)
finally:
    reader.close()
assert model.private and 0 < model.epsilon_spent <= 1.0, model.privacy
assert model.version >= 0
print(f"[image-test] model read back from the host: version {model.version}, "
      f"epsilon spent {model.epsilon_spent:.3f}; run summary keys: {sorted(summary)[:8]}")
EOF
log "image checks passed in $(elapsed "$t0") (mode $mode); whole script $(elapsed "$t_start"), build $build_time"
