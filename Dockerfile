# kf-culler container image.
#
#   docker build -t kf-culler:0.1.0 .          # or: podman build, or bash hack/image/build.sh
#
# Build stage: install the package and its runtime dependencies (no test extras), as requirements.lock pins
# them, into a virtual environment (.dockerignore leaves out the demo and its local components,
# kf_culler/local), then take pip and setuptools out of it. Final stage: the same base, that environment, no
# sources, no pip, no root.
#
# BASE_IMAGE: any Debian-based image with Python 3.11 as `python3` and its venv module. The default is
# Docker Hub's slim Python on Debian bookworm; pin it by digest for a reproducible build, e.g.
#   --build-arg BASE_IMAGE=python:3.11-slim-bookworm@sha256:<digest>
# hack/image/build.sh builds where no registry is reachable, from a Debian bookworm base of its own
# making (python3 3.11, python3-venv, ca-certificates, tzdata).
ARG BASE_IMAGE=python:3.11-slim-bookworm

FROM ${BASE_IMAGE} AS build
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_INPUT=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    MALLOC_ARENA_MAX=2
WORKDIR /src
COPY requirements.lock pyproject.toml ./
COPY kf_culler ./kf_culler
# The dependencies exactly as requirements.lock pins them (each file by its hash; hack/image/lock.sh writes it),
# then the project itself without dependencies, built with the locked setuptools; `pip check` fails the build if
# the lock no longer satisfies pyproject.toml.
RUN python3 -m venv /opt/kf-culler \
 && /opt/kf-culler/bin/pip install --no-cache-dir --require-hashes --only-binary=:all: -r requirements.lock \
 && /opt/kf-culler/bin/pip install --no-cache-dir --no-deps --no-build-isolation . \
 && /opt/kf-culler/bin/pip check \
 && /opt/kf-culler/bin/python -m pip uninstall --yes --quiet pip setuptools

FROM ${BASE_IMAGE}
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
# 9090: /metrics, /healthz, /readyz; 9091: the verdict API (the Deployment's two ports).
EXPOSE 9090 9091
ENTRYPOINT ["kf-culler"]
CMD ["--help"]
