# The cache coordinator image (also carries the `chunkattn` client and the demo model).
#   docker build -f deploy/docker/coordinator.Dockerfile -t chunkattn-coordinator .
# Built with the same scripts as CI: install-deps.sh, build.sh, then bundle.sh.
ARG DEBIAN_VERSION=bookworm

FROM debian:${DEBIAN_VERSION} AS build
WORKDIR /src
COPY scripts/install-deps.sh scripts/install-deps.sh
RUN CHUNKATTN_DEPS=build scripts/install-deps.sh && rm -rf /var/lib/apt/lists/*
COPY . .
RUN BUILD_DIR=/build scripts/build.sh -DCHUNKATTN_CUDA=OFF -DBUILD_TESTING=OFF \
 && BUILD_DIR=/build scripts/bundle.sh /opt/chunkattn

FROM debian:${DEBIAN_VERSION}-slim
COPY --from=build /opt/chunkattn /opt/chunkattn
ENV LD_LIBRARY_PATH=/opt/chunkattn/lib \
    PATH=/opt/chunkattn/bin:$PATH
# The chart's podSecurityContext runs as this uid; the root filesystem may be read-only.
USER 10001:10001
# gRPC API, Prometheus /metrics, plaintext health for probes, the OpenAI-compatible HTTP API
# (--http_port, on by default).
EXPOSE 50051 9400 8081 8000
ENTRYPOINT ["/opt/chunkattn/bin/chunkattn-coordinator"]
CMD ["--workers=127.0.0.1:50061", "--model=/opt/chunkattn/models/demo", "--health_port=8081"]
