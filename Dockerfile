# The deployable worker image: the stevedore binary as a worker, FROM scratch, non-root.
# Nothing is pulled, so it builds on an engine without a registry. The binary and (when it
# is dynamically linked) its loader and libraries are prepared on the host first:
#
#   cargo build --release
#   rm -rf target/worker-rootfs
#   target/release/stevedore image rootfs --exe target/release/stevedore --dir target/worker-rootfs
#   docker build -t stevedore-worker:latest $(cat target/worker-rootfs.args) .
#
# `image rootfs` writes /app/stevedore, the loader and libraries at their host paths (so
# /app/stevedore runs as is) and /etc/passwd + /etc/group; target/worker-rootfs.args holds
# `--build-arg FINGERPRINT=...` (the handler-set fingerprint the image is labelled with).
# .dockerignore keeps the rest of the checkout out of the build context. Use it with
# `stevedore run --image stevedore-worker:latest --handler NAME ...`.
FROM scratch
ARG ROOTFS=target/worker-rootfs
ARG FINGERPRINT=
COPY ${ROOTFS}/ /
# dev.stevedore.entry: how stevedore's init execs the worker inside the image.
LABEL dev.stevedore.entry="[\"/app/stevedore\"]" \
      dev.stevedore.fingerprint="${FINGERPRINT}"
USER 65532:65532
ENTRYPOINT ["/app/stevedore"]
CMD ["--help"]
