# kf-culler container image.
#
#   docker build -t kf-culler:0.1.0 .
#
# Build stage: install the package and its runtime dependencies (no test extras) into a virtual
# environment (.dockerignore leaves out the demo and its local components, kf_culler/local). Final
# stage: the same slim Python base, that environment, no sources, no root.

FROM python:3.11-slim AS build
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_INPUT=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    MALLOC_ARENA_MAX=2
WORKDIR /src
COPY pyproject.toml ./
COPY kf_culler ./kf_culler
RUN python -m venv /opt/kf-culler \
 && /opt/kf-culler/bin/pip install --no-cache-dir .

FROM python:3.11-slim
LABEL org.opencontainers.image.title="kf-culler" \
      org.opencontainers.image.description="Idle culler for Kubeflow Notebooks" \
      org.opencontainers.image.licenses="Apache-2.0"
COPY --from=build /opt/kf-culler /opt/kf-culler
ENV PATH=/opt/kf-culler/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    MALLOC_ARENA_MAX=2
# A numeric, unprivileged user (the conventional "nonroot" id), so that runAsNonRoot can verify it.
USER 65532:65532
EXPOSE 9090
ENTRYPOINT ["kf-culler"]
CMD ["--help"]
