# The resurge services' image: detector, restarter, scaler and the node monitor
# (deploy/base sets it as ghcr.io/resurge/resurge:<version> through kustomize `images:`).
#
#   docker build -t ghcr.io/resurge/resurge:0.1.0 .
#
# With the `kubernetes` extra (the official client), without the `train` extra: none of
# the services imports torch. The node agent's launch mode runs the workers, so torch
# (and `pip install resurge`) belongs in the *training* image the TrainingJob's pods
# run, not in this one.
FROM python:3.11-slim AS build
WORKDIR /src
COPY pyproject.toml README.md LICENSE ./
COPY shared/ shared/
COPY services/ services/
RUN pip install --no-cache-dir --prefix=/install ".[kubernetes]"

FROM python:3.11-slim
COPY --from=build /install /usr/local
# A fixed non-root user: the manifests run as 10001:10001 (runAsNonRoot needs a numeric
# user), on a read-only root filesystem with an emptyDir at /tmp.
RUN groupadd --system --gid 10001 resurge \
    && useradd --system --uid 10001 --gid 10001 --no-create-home --shell /usr/sbin/nologin resurge
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    RESURGE_CLUSTER=kubernetes \
    RESURGE_METRICS_HOST=0.0.0.0 \
    RESURGE_METRICS_PORT=9100
USER 10001:10001
WORKDIR /tmp
EXPOSE 9100
# Each workload names its own command (resurge-detector, resurge-restarter,
# resurge-scaler, resurge-node-agent monitor); the CLI is the default.
CMD ["resurge", "--help"]
