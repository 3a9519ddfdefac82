# The compute worker image: CUDA runtime base, the kernels built for Ampere and Hopper.
# CUDA 13 needs an NVIDIA driver of the R580 series or newer on the nodes.
#   docker build -f deploy/docker/worker.Dockerfile -t chunkattn-worker .
# Built with the same scripts as CI: install-deps.sh, build.sh, then bundle.sh. The same
# image serves --device=cpu (no GPU needed) and, with the GPU executor, --device=cuda.
ARG CUDA_VERSION=13.0.1
ARG UBUNTU_VERSION=24.04

FROM nvidia/cuda:${CUDA_VERSION}-devel-ubuntu${UBUNTU_VERSION} AS build
WORKDIR /src
COPY scripts/install-deps.sh scripts/install-deps.sh
RUN CHUNKATTN_DEPS=build scripts/install-deps.sh && rm -rf /var/lib/apt/lists/*
COPY . .
RUN BUILD_DIR=/build scripts/build.sh -DCHUNKATTN_CUDA=ON -DCHUNKATTN_CUDA_ARCHITECTURES="80;90a" \
      -DBUILD_TESTING=OFF \
 && BUILD_DIR=/build scripts/bundle.sh /opt/chunkattn

FROM nvidia/cuda:${CUDA_VERSION}-runtime-ubuntu${UBUNTU_VERSION}
COPY --from=build /opt/chunkattn /opt/chunkattn
ENV LD_LIBRARY_PATH=/opt/chunkattn/lib:/usr/local/cuda/lib64:/usr/local/nvidia/lib:/usr/local/nvidia/lib64 \
    PATH=/opt/chunkattn/bin:$PATH \
    NVIDIA_VISIBLE_DEVICES=all \
    NVIDIA_DRIVER_CAPABILITIES=compute,utility
USER 10001:10001
# gRPC: Join, the plan stream and rank 0's rendezvous store; plaintext health for probes
# (8082: not the coordinator's 8081, should both share a network namespace).
EXPOSE 50061 8082
ENTRYPOINT ["/opt/chunkattn/bin/chunkattn-worker"]
CMD ["--listen=0.0.0.0:50061", "--device=cpu", "--health_port=8082"]
