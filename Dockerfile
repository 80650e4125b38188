# The smddp-sdk training image: what SageMaker (and smddp-sdk's Docker mode) runs as
# `docker run <image> train`. Build it with scripts/build-image.sh, which prepares the wheelhouse on the
# host and passes the build arguments; a plain `docker build` needs the same wheelhouse in .build/wheels.
#
# Classic builder only (no RUN --mount, no heredocs): it must build where BuildKit/buildx is missing.
# Nothing here downloads: every wheel comes from the host's wheelhouse, so the build runs offline
# (`docker build --network none`) and behind proxies whose CA only the host trusts.
#
# CPU (default): BASE_IMAGE is any image with python3 and its venv module, for example
#   python:3.11-slim-bookworm, or a locally bootstrapped Debian (scripts/build-image.sh does it when no
#   registry is reachable). The wheelhouse must match the base image's Python (the script checks).
# GPU variant: scripts/build-image.sh --gpu puts PyPI's CUDA build of torch in the wheelhouse; its
#   nvidia-* wheels bring the CUDA runtime, cuDNN and NCCL, so the same python base works and only the
#   host needs the NVIDIA driver and the NVIDIA Container Toolkit (docker run --gpus all).
#   An nvidia/cuda:*-runtime-ubuntu* base with python3-venv installed works as well.
ARG BASE_IMAGE=python:3.11-slim-bookworm

# Stage 1 installs the third-party wheels into the venv; the final image copies only the venv, so the
# wheel files themselves (over 200 MB) never become a layer of it. Each stage's layers are cached: only
# what changed since the last build is redone (scripts/build-image.sh prints each step).
FROM ${BASE_IMAGE} AS deps
ARG WHEELS=.build/wheels
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
# A venv keeps the image's packages apart from the distribution's Python (Debian refuses global pip
# installs, PEP 668) and puts `python`, `pip` and `train` first on PATH for every user.
RUN python3 -m venv /opt/smddp/venv
COPY ${WHEELS}/deps /tmp/wheels/deps
RUN /opt/smddp/venv/bin/pip install --no-index --find-links /tmp/wheels/deps -r /tmp/wheels/deps/requirements.txt

# Stage 2: smddp's native kernels (C) and core (C++ against the installed torch), built from their sources
# alone (the builder is stdlib plus torch), so this slow layer (half a minute or more) is reused until they or
# the wheels change, not rebuilt by every change to smddp-sdk. Where the base image has no compilers or
# Python headers, nothing is prebuilt: the backend builds them on first use if it can, else runs its
# Python path and says so once.
FROM deps AS native
COPY smddp_sdk/collectives/native/__init__.py smddp_sdk/collectives/native/smddp_native.c /tmp/native/
COPY smddp_sdk/collectives/native/core/ /tmp/native/core/
RUN mkdir -p /opt/smddp/native \
    && { /opt/smddp/venv/bin/python /tmp/native/__init__.py --into /opt/smddp/native \
         || echo "no C/C++ toolchain in the base image: smddp's collectives build their native code on first use or use the Python path"; }

FROM ${BASE_IMAGE}
ARG WHEELS=.build/wheels
ARG SMDDP_VERSION=0.0.0
LABEL org.opencontainers.image.title="smddp-sdk" \
      org.opencontainers.image.description="SageMaker-style PyTorch training image with the smddp backend" \
      org.opencontainers.image.version="${SMDDP_VERSION}" \
      org.opencontainers.image.licenses="Apache-2.0"
ENV VIRTUAL_ENV=/opt/smddp/venv \
    PATH=/opt/smddp/venv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    LANG=C.UTF-8

# Third-party packages in their own layer: it stays cached while only smddp-sdk changes.
COPY --from=deps /opt/smddp/venv /opt/smddp/venv
COPY --from=native /opt/smddp/native /tmp/native
# smddp-sdk itself, with the prebuilt native code placed next to its sources (where the backend looks first).
COPY ${WHEELS}/project /tmp/wheels/project
RUN pip install --no-index --no-deps /tmp/wheels/project/*.whl \
    && native=$(python -c 'import importlib.util as u, os; print(os.path.dirname(u.find_spec("smddp_sdk").origin))')/collectives/native \
    && cp -r /tmp/native/. "$native"/ \
    && rm -rf /tmp/wheels /tmp/native \
    && python -c "import torch, boto3, smddp_sdk, smddp_sdk.specs.contract; print('torch', torch.__version__, '| smddp-sdk', smddp_sdk.__version__)"

# `train` is the command SageMaker runs; it execs the node runtime (python -m smddp_sdk.runtime).
COPY container/train /usr/local/bin/train

# Non-root safe: the platform or `docker run -v` mounts /opt/ml, but an unmounted container run as any
# user (docker run --user 1000:1000) still finds a writable tree; pip installs world-readable files
# (no chmod -R over the venv: it would copy the whole layer). No WORKDIR under /opt/ml: Docker would
# create it as root inside a bind-mounted host folder.
RUN chmod 0755 /usr/local/bin/train \
    && mkdir -p /opt/ml/input/config /opt/ml/input/data /opt/ml/code /opt/ml/model /opt/ml/output/data \
    && chmod -R a+rwX /opt/ml

CMD ["train"]
