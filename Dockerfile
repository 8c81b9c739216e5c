# ckpt sidecar image. Build: docker build -t ckpt .
# Run:   docker run -v ckpt-data:/data -v ckpt-sock:/run/ckpt -p 127.0.0.1:50051:50051 ckpt
#        (this host only: the port is plaintext; to publish it further, serve TLS, see docs/operations.md, "TLS on TCP")
FROM python:3.11-slim

RUN useradd --system --uid 10001 --home-dir /nonexistent --shell /usr/sbin/nologin ckpt \
    && mkdir -p /data /run/ckpt && chown ckpt:ckpt /data /run/ckpt

WORKDIR /app
COPY pyproject.toml README.md ./
COPY proto/ proto/
COPY ckpt/ ckpt/
COPY codec/ codec/
COPY sidecar/ sidecar/
COPY bench/ bench/
RUN pip install --no-cache-dir . && rm -rf /root/.cache

USER ckpt
VOLUME ["/data", "/run/ckpt"]
EXPOSE 50051
# Every option is also an environment variable (see `ckpt serve --help`).
# CKPT_TARGET points the client commands (`docker exec ... ckpt get s`) at
# the socket the server listens on, which is not the data directory's.
ENV CKPT_DATA_DIR=/data \
    CKPT_LISTEN=unix:/run/ckpt/ckpt.sock,0.0.0.0:50051 \
    CKPT_TARGET=unix:/run/ckpt/ckpt.sock \
    CKPT_METRICS_ADDRESS=0.0.0.0
STOPSIGNAL SIGTERM
# The standard grpc.health.v1 check, through the sidecar's own Python client stack.
HEALTHCHECK --interval=10s --timeout=3s --start-period=5s --retries=3 \
    CMD ["python", "-c", "import sys; from ckpt.sidecar.server import wait_until_serving; wait_until_serving('unix:/run/ckpt/ckpt.sock', 2)"]
ENTRYPOINT ["ckpt"]
CMD ["serve"]
