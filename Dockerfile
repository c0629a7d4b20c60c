# The readfold image: one binary for every command (`run`, `serve`,
# `gateway`, `replay`, ...), configured by READFOLD__SECTION__KEY variables
# (config/default.toml lists every key). Kubernetes manifests: deploy/.
#
#   docker build -t readfold .
#   docker run --rm -e READFOLD__KAFKA__BOOTSTRAP_SERVERS=broker:9092 readfold        # run
#   docker run --rm -p 8090:8090 readfold gateway

FROM rust:1-bookworm AS build
# rdkafka builds librdkafka from source, linking the system's OpenSSL and zlib.
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends pkg-config libssl-dev zlib1g-dev \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY . .
# Plain RUN (no BuildKit cache mounts), so any builder takes it: the
# legacy docker builder, BuildKit, buildah, kaniko.
RUN cargo build --release --locked -p readfold --bin readfold \
 && install -D -m 0755 target/release/readfold /out/readfold

FROM debian:bookworm-slim
# What the binary links (`ldd target/release/readfold`): libssl3/libcrypto,
# zlib, libgcc_s, libc; ca-certificates for TLS to brokers, Redis, CQL and
# the schema registry.
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends ca-certificates libssl3 zlib1g \
 && rm -rf /var/lib/apt/lists/* \
 && groupadd --system --gid 10001 readfold \
 && useradd --system --uid 10001 --gid readfold --home-dir /var/lib/readfold --no-create-home readfold \
 && install -d -o readfold -g readfold /var/lib/readfold
COPY --from=build /out/readfold /usr/local/bin/readfold
# The schemas and the defaults are compiled in; these copies are for reading
# (and for registering the schemas elsewhere).
COPY schemas/ /usr/share/readfold/schemas/
COPY config/default.toml /usr/share/readfold/default.toml
# In a container every listener must take connections from outside it.
ENV READFOLD__METRICS__LISTEN=0.0.0.0:9464 \
    READFOLD__SERVE__LISTEN=0.0.0.0:8080 \
    READFOLD__GATEWAY__LISTEN=0.0.0.0:8090
# Numeric, so that Kubernetes' runAsNonRoot can check it.
USER 10001:10001
WORKDIR /var/lib/readfold
# 9464: /metrics, /healthz, /readyz (every command); 8080: serve; 8090: gateway.
EXPOSE 9464 8080 8090
ENTRYPOINT ["readfold"]
CMD ["run"]
