# syntax=docker/dockerfile:1
# The fleetpilot image: one `fleetpilot` entry point for the operator (`fleetpilot operator run`), the
# planner (`fleetpilot planner run`), the frontend (`fleetpilot frontend ...`) and the simulator engine
# (`fleetpilot sim worker ...`). The Helm chart and the operator's rendered pods run it as
# `command: [fleetpilot]` with those arguments, as uid 65532 on a read-only root filesystem.
#
#   docker build -t fleetpilot/fleetpilot:0.1.0 .
#
# Both stages use the same pinned base, so the virtualenv built in the first runs unchanged in the
# second; pass --build-arg PYTHON_IMAGE=python:3.11.13-slim-bookworm@sha256:... to pin by digest.
ARG PYTHON_IMAGE=python:3.11.13-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
RUN python -m venv /opt/fleetpilot
WORKDIR /src
COPY pyproject.toml README.md ./
COPY fleetpilot ./fleetpilot
COPY operator ./operator
COPY planner ./planner
# Every dependency ships wheels for linux/amd64 and arm64: no compiler in this stage either.
RUN /opt/fleetpilot/bin/pip install . \
 && /opt/fleetpilot/bin/pip uninstall --yes pip \
 && find /opt/fleetpilot -name '__pycache__' -prune -exec rm -rf {} + \
 && /opt/fleetpilot/bin/python -m compileall -q /opt/fleetpilot/lib

FROM ${PYTHON_IMAGE}
LABEL org.opencontainers.image.title="fleetpilot" \
      org.opencontainers.image.description="DynamoGraph operator, SLA planner, frontend and simulator engine" \
      org.opencontainers.image.licenses="Apache-2.0"
COPY --from=build /opt/fleetpilot /opt/fleetpilot
# Bytecode is compiled at build time (the root filesystem is read-only at run time); temporary files
# (the predictors' model fits) go to /tmp, an emptyDir in the chart. One BLAS thread, as the planner wants.
ENV PATH=/opt/fleetpilot/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    HOME=/tmp \
    OPENBLAS_NUM_THREADS=1
# The distroless convention for "nonroot": Pod Security "restricted" needs a numeric non-root user.
USER 65532:65532
WORKDIR /tmp
ENTRYPOINT ["fleetpilot"]
CMD ["--help"]
