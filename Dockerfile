# stream_vips pipeline image: `stream-vips run` on a mounted config file, as a non-root user, on a
# read-only root filesystem (k8s/base/app/statefulset.yaml).
#
#   docker build -t stream-vips:0.1.0 .                                  # official Python base
#   podman build --build-arg BASE_IMAGE=localhost/bookworm-python:12 .    # any Debian-like base
#
# BASE_IMAGE must provide python3 (>= 3.11) with the venv module (Debian: python3, python3-venv,
# ca-certificates). Nothing else is assumed: the build makes its own virtual environment, upgrades
# pip and installs wheel in it, so an sdist among the dependencies (autodp) builds on a base whose
# pip is old or has no `wheel`. docs/deploy.md, "1. Build the image", and .ci/image-test.sh build it
# from a Debian bookworm base made with mmdebstrap, without Docker Hub.
ARG BASE_IMAGE=python:3.11-slim-bookworm

FROM ${BASE_IMAGE} AS build
# Optional, for builds behind a PyPI mirror or a TLS-inspecting proxy (build stage only, not in the
# final image): --build-arg PIP_INDEX_URL=https://mirror/simple, --build-arg PIP_CERT=/path/in/build
# (with the CA bundle mounted there: podman build -v /etc/ssl/certs/ca-certificates.crt:/path/in/build:ro).
ARG PIP_INDEX_URL
ARG PIP_CERT
# Optional extras of the package: --build-arg EXTRAS=ray for the sharded runtime on a RayCluster
# (k8s/overlays/ray: the same image runs the head's driver and the workers' shards).
ARG EXTRAS
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_ROOT_USER_ACTION=ignore
RUN python3 -m venv /opt/stream-vips \
 && /opt/stream-vips/bin/pip install --upgrade pip setuptools wheel
WORKDIR /src
COPY pyproject.toml README.md ./
COPY stream_vips ./stream_vips
COPY connectors ./connectors
# Non-editable install into the venv (compiled to .pyc here: nothing is written at run time);
# the build tools are removed afterwards, they are not needed to run.
RUN /opt/stream-vips/bin/pip install ".${EXTRAS:+[$EXTRAS]}" \
 && /opt/stream-vips/bin/pip uninstall --yes pip setuptools wheel \
 && for d in /opt/stream-vips/lib/python3*/site-packages/numpy /opt/stream-vips/lib/python3*/site-packages/scipy; do \
      find "$d" -type d -name tests -prune -exec rm -rf {} + ; \
    done \
 && /opt/stream-vips/bin/python -c "import stream_vips, connectors.kafka, numpy, scipy, autodp, dp_accounting"

FROM ${BASE_IMAGE}
# One BLAS thread (see docs/deploy.md); no .pyc writes (the root filesystem is read-only).
ENV PATH=/opt/stream-vips/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    OMP_NUM_THREADS=1 \
    OPENBLAS_NUM_THREADS=1 \
    MKL_NUM_THREADS=1 \
    HOME=/var/lib/stream-vips
# The user and group are written directly: a minimal Debian base has no useradd (package passwd).
RUN echo 'stream-vips:x:10001:10001:stream-vips:/var/lib/stream-vips:/usr/sbin/nologin' >> /etc/passwd \
 && echo 'stream-vips:x:10001:' >> /etc/group \
 && mkdir -p /var/lib/stream-vips /etc/stream-vips \
 && chown 10001:10001 /var/lib/stream-vips \
 && chmod 0750 /var/lib/stream-vips
COPY --from=build /opt/stream-vips /opt/stream-vips
WORKDIR /var/lib/stream-vips
USER 10001:10001
# metrics.port in the config: /metrics, /healthz, /readyz
EXPOSE 9108
ENTRYPOINT ["stream-vips", "run", "--config", "/etc/stream-vips/config.yaml"]
