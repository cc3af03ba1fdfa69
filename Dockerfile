# syntax=docker/dockerfile:1
# The prediction service (ehr-serve) in a slim, non-root image with only what serving needs
# (the `serve` optional dependencies of pyproject.toml, pinned by constraints.txt).
#
#   docker build --target serve -t ehr-serve .   # the serve stage; also what `docker build .` builds (the last stage)
#   docker run --rm -p 8000:8000 -v "$PWD/out/demo/run/export:/model:ro" \
#       -e EHR_API_KEYS="$(paste -sd, keys.txt)" ehr-serve
#
# GPU training image (same pinned stack + CUDA wheels; needs the NVIDIA container toolkit):
#   docker build --build-arg TF_EXTRAS=and-cuda --target train -t ehr-train-gpu .
#
# Beam worker image for the job on Flink / Spark / Dataflow (the `job` group: no TensorFlow):
#   docker build --target beam-worker -t ehr-beam-worker .

# An exact tag: a floating one (3.11-slim) changes under a rebuild. 3.11.7 is the Python the
# pinned stack was resolved and tested on.
ARG PYTHON_IMAGE=python:3.11.7-slim-bookworm
# Beam's own SDK image for the pinned Beam and Python: its entry point is the worker harness.
ARG BEAM_SDK_IMAGE=apache/beam_python3.11_sdk:2.77.0

# ---------------------------------------------------------------- venv: an empty venv to install into
FROM ${PYTHON_IMAGE} AS venv
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1
RUN python -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH
WORKDIR /src

# ---------------------------------------------------------------- build: the whole pinned stack (training)
FROM venv AS build
# Empty for CPU; "and-cuda" installs tensorflow[and-cuda] (CUDA/cuDNN as pip wheels) for training on GPUs.
ARG TF_EXTRAS=""
# Dependencies first, in their own layer: code edits do not re-download TensorFlow.
COPY requirements.txt constraints.txt ./
RUN pip install -r requirements.txt -c constraints.txt \
 && if [ -n "$TF_EXTRAS" ]; then \
        pip install "tensorflow[${TF_EXTRAS}]==$(grep -i '^tensorflow==' constraints.txt | cut -d= -f3)" \
            -c constraints.txt; \
    fi
COPY pyproject.toml README.md ./
COPY ehr_base ./ehr_base
COPY ehr_pipeline ./ehr_pipeline
COPY model ./model
COPY serving ./serving
# --no-deps: everything the package needs is already pinned above; this only adds our code and
# the console scripts (ehr-serve, ehr-train, ...).
RUN pip install --no-deps .

# ---------------------------------------------------------------- build-serve: the serve set only
FROM venv AS build-serve
COPY constraints.txt pyproject.toml README.md ./
# pyproject.toml's `serve` group names the packages; constraints.txt pins their versions.
RUN python -c "import tomllib; print('\n'.join(tomllib.load(open('pyproject.toml', 'rb'))['project']['optional-dependencies']['serve']))" > serve.txt \
 && pip install -r serve.txt -c constraints.txt
COPY ehr_base ./ehr_base
COPY ehr_pipeline ./ehr_pipeline
COPY model ./model
COPY serving ./serving
RUN pip install --no-deps .

# ---------------------------------------------------------------- runtime: non-root user, no venv yet
FROM ${PYTHON_IMAGE} AS runtime
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    TF_CPP_MIN_LOG_LEVEL=2
RUN groupadd --system --gid 10001 ehr \
 && useradd --system --uid 10001 --gid ehr --home-dir /home/ehr --create-home --shell /usr/sbin/nologin ehr
USER ehr
WORKDIR /home/ehr

# ---------------------------------------------------------------- train: ehr-train on the whole stack
FROM runtime AS train
COPY --from=build /opt/venv /opt/venv
# The experiment configs, e.g. ehr-train --config /opt/ehr/configs/ehr_rank1_normal.yaml ...
COPY --chown=ehr:ehr configs /opt/ehr/configs
ENTRYPOINT ["ehr-train"]
CMD ["--help"]

# ---------------------------------------------------------------- beam-worker: the job's workers, no TensorFlow
# Used as the SDK harness of a portable runner: --sdk_container_image=IMAGE (Dataflow), or
# --environment_type=DOCKER --environment_config=IMAGE (Flink, Spark). pyproject.toml's `job`
# group names what the DoFns import; constraints.txt pins it to the driver's versions.
FROM ${BEAM_SDK_IMAGE} AS beam-worker
WORKDIR /opt/ehr
COPY constraints.txt pyproject.toml README.md ./
RUN python -c "import tomllib; print('\n'.join(tomllib.load(open('pyproject.toml', 'rb'))['project']['optional-dependencies']['job']))" > job.txt \
 && pip install --no-cache-dir -r job.txt -c constraints.txt
COPY ehr_base ./ehr_base
COPY ehr_pipeline ./ehr_pipeline
COPY model ./model
COPY serving ./serving
RUN pip install --no-cache-dir --no-deps .

# ---------------------------------------------------------------- serve (default target): the serve set only
# The last stage: what `docker build .` builds when no target is given.
FROM runtime AS serve
COPY --from=build-serve /opt/venv /opt/venv
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
