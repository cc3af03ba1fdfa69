# syntax=docker/dockerfile:1
# The prediction service (ehr-serve) in a slim, non-root image with the pinned stack.
#
#   docker build -t ehr-serve .
#   docker run --rm -p 8000:8000 -v "$PWD/runs/demo/export:/model:ro" \
#       -e EHR_API_KEYS="$(paste -sd, keys.txt)" ehr-serve
#
# GPU training image (same pinned stack + CUDA wheels; needs the NVIDIA container toolkit):
#   docker build --build-arg TF_EXTRAS=and-cuda --target train -t ehr-train-gpu .

ARG PYTHON_IMAGE=python:3.11-slim

# ---------------------------------------------------------------- build: a venv with the pinned stack
FROM ${PYTHON_IMAGE} AS build
# Empty for CPU; "and-cuda" installs tensorflow[and-cuda] (CUDA/cuDNN as pip wheels) for training on GPUs.
ARG TF_EXTRAS=""
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1
RUN python -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH
WORKDIR /src
# Dependencies first, in their own layer: code edits do not re-download TensorFlow.
COPY requirements.txt constraints.txt ./
RUN pip install -r requirements.txt -c constraints.txt \
 && if [ -n "$TF_EXTRAS" ]; then \
        pip install "tensorflow[${TF_EXTRAS}]==$(grep -i '^tensorflow==' constraints.txt | cut -d= -f3)" \
            -c constraints.txt; \
    fi
COPY pyproject.toml README.md ./
COPY ehr_pipeline ./ehr_pipeline
COPY model ./model
COPY serving ./serving
# --no-deps: everything the package needs is already pinned above; this only adds our code and
# the console scripts (ehr-serve, ehr-train, ...).
RUN pip install --no-deps .

# ---------------------------------------------------------------- runtime: venv + non-root user
FROM ${PYTHON_IMAGE} AS runtime
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    TF_CPP_MIN_LOG_LEVEL=2
RUN groupadd --system --gid 10001 ehr \
 && useradd --system --uid 10001 --gid ehr --home-dir /home/ehr --create-home --shell /usr/sbin/nologin ehr
COPY --from=build /opt/venv /opt/venv
USER ehr
WORKDIR /home/ehr

# ---------------------------------------------------------------- train: ehr-train on the same stack
FROM runtime AS train
# The experiment configs, e.g. ehr-train --config /opt/ehr/configs/ehr_rank1_normal.yaml ...
COPY --chown=ehr:ehr configs /opt/ehr/configs
ENTRYPOINT ["ehr-train"]
CMD ["--help"]

# ---------------------------------------------------------------- serve (default target)
FROM runtime AS serve
# The export directory (model.export) is mounted here, read-only.
VOLUME ["/model"]
EXPOSE 8000
# No curl in slim images: the standard library does the probe. /healthz needs no API key.
HEALTHCHECK --interval=30s --timeout=5s --start-period=60s --retries=3 \
    CMD ["python", "-c", "import sys, urllib.request; sys.exit(urllib.request.urlopen('http://127.0.0.1:8000/healthz', timeout=4).status != 200)"]
# 0.0.0.0 inside the container: ehr-serve then REQUIRES API keys (EHR_API_KEYS or --api-keys-file);
# it refuses --no-auth on a non-loopback host.
ENTRYPOINT ["ehr-serve"]
CMD ["--model", "/model", "--host", "0.0.0.0", "--port", "8000"]
