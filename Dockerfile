# stream_vips pipeline image: `stream-vips run` on a mounted config file, as a non-root user.
# Build: docker build -t stream-vips:0.1.0 .
FROM python:3.11-slim-bookworm AS build
WORKDIR /src
COPY pyproject.toml README.md ./
COPY stream_vips ./stream_vips
COPY connectors ./connectors
RUN pip wheel --no-cache-dir --wheel-dir /wheels .

FROM python:3.11-slim-bookworm
# One BLAS thread (DESIGN performance notes); no .pyc writes (the root filesystem is read-only).
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    OMP_NUM_THREADS=1 \
    OPENBLAS_NUM_THREADS=1 \
    MKL_NUM_THREADS=1
RUN groupadd --system --gid 10001 stream-vips \
 && useradd --system --uid 10001 --gid 10001 --home-dir /var/lib/stream-vips \
      --no-create-home --shell /usr/sbin/nologin stream-vips \
 && mkdir -p /var/lib/stream-vips /etc/stream-vips \
 && chown 10001:10001 /var/lib/stream-vips
COPY --from=build /wheels /wheels
RUN pip install --no-cache-dir /wheels/*.whl && rm -rf /wheels
WORKDIR /var/lib/stream-vips
USER 10001:10001
# metrics.port in the config: /metrics, /healthz, /readyz
EXPOSE 9108
ENTRYPOINT ["stream-vips", "run", "--config", "/etc/stream-vips/config.yaml"]
