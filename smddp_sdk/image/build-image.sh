#!/usr/bin/env bash
# Build the smddp-sdk training image: torch + this package on a Python base, with `train` as the
# command SageMaker runs (`docker run <image> train`).
#
#   scripts/build-image.sh                       # CPU image smddp-sdk:<version> (also tagged :latest)
#   scripts/build-image.sh --base-image python:3.11-slim-bookworm --tag my/repo:1
#   scripts/build-image.sh --gpu                 # GPU variant: CUDA torch wheels (bundle CUDA and NCCL)
#
# The wheels are resolved and downloaded on the host (where pip trusts the network's certificates), once
# per set into ~/.cache/smddp-sdk/wheels [SMDDP_WHEEL_CACHE], linked into .build/wheels, and the build
# installs them offline: nothing inside the build needs the network, so the
# build runs with --network none. When the base image is neither present nor pullable (no registry
# reachable), a Debian bookworm base with Python is bootstrapped with debootstrap from the Debian mirror.
#
# Options (environment fallbacks in brackets):
#   --tag NAME            image name [SMDDP_IMAGE]; default smddp-sdk:<version>, -gpu suffix for --gpu
#   --base-image NAME     base with python3 + venv [SMDDP_BASE_IMAGE]; default python:3.11-slim-bookworm,
#                         "bootstrap" to skip the pull and bootstrap Debian right away
#   --torch-version V     [SMDDP_TORCH_VERSION]; default 2.13.0
#   --torch-index URL     extra index for torch wheels [SMDDP_TORCH_INDEX]; CPU default:
#                         https://download.pytorch.org/whl/cpu (where the host has no CPU wheel at hand)
#   --gpu                 CUDA build of torch (from PyPI), tag suffix -gpu
#   --extra-requirements FILE  more packages for the image, a pip requirements file
#                         [SMDDP_EXTRA_REQUIREMENTS]; added to container/image-requirements.txt (which
#                         lists what SageMaker's PyTorch containers ship and scripts commonly import)
#   --extra-wheels DIR    wheels to install in the image as they are (your own packages, a CPU torchvision
#                         matching the image's torch) [SMDDP_EXTRA_WHEELS]; their dependencies are downloaded
#   --quiet               only errors and the final image name
set -euo pipefail
# SMDDP_BUILD_CONTEXT: the build context when this script runs from an installed package (smddp-launch image build).
cd "${SMDDP_BUILD_CONTEXT:-$(dirname "$0")/..}"
ROOT=$PWD

VERSION=$(python3 -c 'import re,sys; print(re.search(r"^version = \"([^\"]+)\"", open("pyproject.toml").read(), re.M).group(1))')
TAG=${SMDDP_IMAGE:-}
BASE_IMAGE=${SMDDP_BASE_IMAGE:-python:3.11-slim-bookworm}
TORCH_VERSION=${SMDDP_TORCH_VERSION:-2.13.0}
TORCH_INDEX=${SMDDP_TORCH_INDEX:-}
EXTRA_REQUIREMENTS=${SMDDP_EXTRA_REQUIREMENTS:-}
EXTRA_WHEELS=${SMDDP_EXTRA_WHEELS:-}
IMAGE_REQUIREMENTS=container/image-requirements.txt
GPU=0
QUIET=0
BOOTSTRAP_IMAGE=smddp-sdk-base:bookworm-python3-toolchain
WHEELS=.build/wheels
WHEEL_CACHE=${SMDDP_WHEEL_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/smddp-sdk/wheels}

usage() { sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; }

while [[ $# -gt 0 ]]; do
  case $1 in
    --tag) TAG=$2; shift 2 ;;
    --base-image) BASE_IMAGE=$2; shift 2 ;;
    --torch-version) TORCH_VERSION=$2; shift 2 ;;
    --torch-index) TORCH_INDEX=$2; shift 2 ;;
    --gpu) GPU=1; shift ;;
    --extra-requirements) EXTRA_REQUIREMENTS=$2; shift 2 ;;
    --extra-wheels) EXTRA_WHEELS=$2; shift 2 ;;
    --quiet) QUIET=1; shift ;;
    -h|--help) usage; exit 0 ;;
    *) echo "build-image: unknown option '$1' (see --help)" >&2; exit 2 ;;
  esac
done
[[ -z $EXTRA_REQUIREMENTS || -f $EXTRA_REQUIREMENTS ]] || { echo "build-image: --extra-requirements $EXTRA_REQUIREMENTS is not a file" >&2; exit 2; }
if [[ -n $EXTRA_WHEELS ]]; then
  [[ -d $EXTRA_WHEELS ]] || { echo "build-image: --extra-wheels $EXTRA_WHEELS is not a directory" >&2; exit 2; }
  ls "$EXTRA_WHEELS"/*.whl >/dev/null 2>&1 || { echo "build-image: --extra-wheels $EXTRA_WHEELS holds no .whl file" >&2; exit 2; }
  EXTRA_WHEELS=$(cd "$EXTRA_WHEELS" && pwd)
fi
[[ -n $TAG ]] || TAG="smddp-sdk:$VERSION$([[ $GPU == 1 ]] && echo -gpu || true)"
[[ $GPU == 1 ]] && WHEELS=.build/wheels-gpu  # never mix CPU and CUDA torch wheels

START=$SECONDS
step() { [[ $QUIET == 1 ]] || printf '==> [%3ds] %s\n' $((SECONDS - START)) "$*" >&2; }
die() { echo "build-image: error: $*" >&2; exit 1; }

docker info >/dev/null 2>&1 || {
  echo "build-image: no Docker engine answers${DOCKER_HOST:+ at $DOCKER_HOST}." >&2
  echo "  Start one with: eval \"\$(scripts/docker-engine.sh start)\"" >&2
  exit 3
}

image_exists() { docker image inspect "$1" >/dev/null 2>&1; }

bootstrap_base() {
  # A Debian bookworm root filesystem with Python 3.11 (what the cp311 wheels need) and the C/C++
  # toolchain and Python headers that the image's prebuild of smddp's native code needs, imported as an
  # image. Debian's mirror is reached over plain HTTP with signed packages, so no CA is involved.
  [[ $(id -u) == 0 ]] || die "bootstrapping a base image needs root (debootstrap); pass --base-image with an image you have"
  if ! command -v debootstrap >/dev/null; then
    step "installing debootstrap"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends debootstrap >/dev/null
  fi
  local work; work=$(mktemp -d "${TMPDIR:-/tmp}/smddp-rootfs.XXXXXX")
  local mirror=${SMDDP_DEBIAN_MIRROR:-http://deb.debian.org/debian}
  step "bootstrapping Debian bookworm + python3 + gcc/g++ from $mirror (about 2 minutes)"
  debootstrap --variant=minbase --include=python3,python3-venv,python3-dev,gcc,g++,libc6-dev bookworm "$work/rootfs" "$mirror" \
    >"$work/debootstrap.log" 2>&1 || die "debootstrap failed; last lines:
$(tail -n 20 "$work/debootstrap.log"; rm -rf "$work")"
  rm -rf "$work"/rootfs/var/cache/apt/*.bin "$work"/rootfs/var/cache/apt/archives/*.deb "$work"/rootfs/var/lib/apt/lists/*
  step "importing the root filesystem as $BOOTSTRAP_IMAGE"
  tar -C "$work/rootfs" -c . | docker import \
    -c 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
    -c 'ENV LANG=C.UTF-8' - "$BOOTSTRAP_IMAGE" >/dev/null
  rm -rf "$work"
}

resolve_base() {
  if [[ $BASE_IMAGE == bootstrap ]]; then
    image_exists "$BOOTSTRAP_IMAGE" || bootstrap_base
    BASE_IMAGE=$BOOTSTRAP_IMAGE; return
  fi
  image_exists "$BASE_IMAGE" && return
  step "pulling base image $BASE_IMAGE"
  if timeout 120 docker pull -q "$BASE_IMAGE" >/dev/null 2>&1; then return; fi
  step "cannot pull $BASE_IMAGE (no registry reachable?); using a bootstrapped Debian base instead"
  image_exists "$BOOTSTRAP_IMAGE" || bootstrap_base
  BASE_IMAGE=$BOOTSTRAP_IMAGE
}

base_python_version() {
  docker run --rm --network none --entrypoint python3 "$BASE_IMAGE" \
    -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")' 2>/dev/null ||
    die "base image $BASE_IMAGE has no working python3; pick a Python base image (for example python:3.11-slim-bookworm)"
}

download_deps() {
  local pyver=$1 torch_req=$2 project_wheel=$3; shift 3
  local more=(-r "$IMAGE_REQUIREMENTS")
  [[ -n $EXTRA_REQUIREMENTS ]] && more+=(-r "$EXTRA_REQUIREMENTS")
  [[ -n $EXTRA_WHEELS ]] && more+=(--find-links "$EXTRA_WHEELS" "$EXTRA_WHEELS"/*.whl)
  python3 -m pip download -q --only-binary=:all: --python-version "$pyver" "$@" \
    -d "$WHEELS/deps" "$torch_req" numpy boto3 "$project_wheel" "${more[@]}" \
    2> >(grep -v 'is ignored: it is neither a file nor a directory' >&2)
}

requirement_lines() {
  # A requirements file without comments, blank lines or pip options.
  sed -e 's/#.*//' -e 's/[[:space:]]*$//' "$1" | grep -v -e '^$' -e '^-' || true
}

write_requirements() {
  # What the image installs from deps/: torch, numpy, boto3 and the project's own dependencies (read from
  # the wheel's metadata), so stale wheels from an older build in deps/ are never picked up. boto3:
  # on SageMaker the runtime fetches sagemaker_submit_directory from S3.
  local torch_req=$1 project_wheel=$2
  printf '%s\n' "$torch_req" numpy boto3
  requirement_lines "$IMAGE_REQUIREMENTS"
  [[ -z $EXTRA_REQUIREMENTS ]] || requirement_lines "$EXTRA_REQUIREMENTS"
  if [[ -n $EXTRA_WHEELS ]]; then
    # name==version from each wheel's file name (PEP 427: name-version-...whl)
    for wheel in "$EXTRA_WHEELS"/*.whl; do
      basename "$wheel" | awk -F- '{print $1 "==" $2}'
    done
  fi
  python3 - "$project_wheel" <<'PY'
import sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as wheel:
    meta = next(n for n in wheel.namelist() if n.endswith(".dist-info/METADATA"))
    for line in wheel.read(meta).decode().splitlines():
        if line.startswith("Requires-Dist:") and "extra ==" not in line:
            print(line.split(":", 1)[1].strip())
PY
}

wheelhouse_key() {
  # What decides the third-party wheels: Python, torch, the requirement files, the extra wheels and
  # smddp-sdk's own dependencies (not its code), so a change to smddp-sdk alone reuses the wheelhouse.
  local pyver=$1 torch_req=$2 project_wheel=$3
  {
    echo "$pyver $torch_req $GPU $TORCH_INDEX"
    write_requirements "$torch_req" "$project_wheel"
    [[ -z $EXTRA_WHEELS ]] || (cd "$EXTRA_WHEELS" && sha256sum ./*.whl)
  } | sha256sum | cut -c1-16
}

build_wheelhouse() {
  local pyver=$1
  rm -rf "$WHEELS/project" "$WHEELS/deps"; mkdir -p "$WHEELS/deps" "$WHEELS/project"
  step "building the smddp-sdk wheel"
  python3 -m pip wheel -q --no-deps --no-build-isolation -w "$WHEELS/project" . >/dev/null 2>&1 ||
    python3 -m pip wheel -q --no-deps -w "$WHEELS/project" . >/dev/null
  local torch_req="torch==$TORCH_VERSION"
  [[ $GPU == 0 ]] && torch_req="torch==$TORCH_VERSION+cpu"
  local extra=() project_wheel key cached
  project_wheel=$(ls "$WHEELS"/project/*.whl)
  # The wheels are resolved and downloaded once per key into the user's cache, outside the checkout, and
  # linked into the build context: a fresh clone reuses them, and identical files keep the image's big
  # layers cached.
  key=$(wheelhouse_key "$pyver" "$torch_req" "$project_wheel")
  cached=$WHEEL_CACHE/$(basename "$WHEELS")-$key
  if [[ ! -f $cached/requirements.txt ]]; then
    [[ -n $TORCH_INDEX ]] && extra=(--extra-index-url "$TORCH_INDEX")
    step "downloading wheels for Python $pyver: $torch_req, numpy, $IMAGE_REQUIREMENTS${EXTRA_REQUIREMENTS:+, $EXTRA_REQUIREMENTS}${EXTRA_WHEELS:+, $EXTRA_WHEELS} and smddp-sdk's dependencies (once; kept in $WHEEL_CACHE)"
    if ! download_deps "$pyver" "$torch_req" "$project_wheel" ${extra[@]+"${extra[@]}"}; then
      # Plain PyPI serves only the CUDA build on Linux; the CPU build lives on PyTorch's own index.
      [[ $GPU == 0 && -z $TORCH_INDEX ]] || die "pip could not download the wheels (see above)"
      step "no $torch_req on the configured indexes; trying PyTorch's CPU index"
      download_deps "$pyver" "$torch_req" "$project_wheel" --extra-index-url https://download.pytorch.org/whl/cpu ||
        die "pip could not download the wheels (see above); set SMDDP_TORCH_INDEX to an index with $torch_req"
    fi
    rm -f "$WHEELS"/deps/smddp_sdk-*.whl
    if [[ $GPU == 1 ]] && ls "$WHEELS"/deps/torch-*+cpu-*.whl >/dev/null 2>&1; then
      die "the configured package indexes gave the CPU build of torch for --gpu; set SMDDP_TORCH_INDEX to a CUDA wheel index (for example https://download.pytorch.org/whl/cu126)"
    fi
    write_requirements "$torch_req" "$project_wheel" >"$WHEELS/deps/requirements.txt"
    # Kept under its key (requirements.txt last: it marks a complete set); older sets of this kind go.
    rm -rf "$WHEEL_CACHE/$(basename "$WHEELS")"-*; mkdir -p "$cached.part"
    cp -al "$WHEELS"/deps/. "$cached.part"/ 2>/dev/null || cp -a "$WHEELS"/deps/. "$cached.part"/
    mv "$cached.part" "$cached"
  else
    step "reusing the wheels in $cached"
    cp -al "$cached"/. "$WHEELS"/deps/ 2>/dev/null || cp -a "$cached"/. "$WHEELS"/deps/
  fi
  step "wheelhouse ready: $(ls "$WHEELS/deps" | wc -l) wheels, $(du -sh "$WHEELS" | cut -f1)"
}

resolve_base
PYVER=$(base_python_version)
build_wheelhouse "$PYVER"

step "building $TAG on $BASE_IMAGE (classic builder, no network inside)"
build_log=$(mktemp "${TMPDIR:-/tmp}/smddp-build.XXXXXX")
trap 'rm -f "$build_log"' EXIT
# The classic builder prints one "Step i/n" line per instruction: that is the progress shown.
set +e
DOCKER_BUILDKIT=0 docker build --network none \
  --build-arg "BASE_IMAGE=$BASE_IMAGE" --build-arg "WHEELS=$WHEELS" --build-arg "SMDDP_VERSION=$VERSION" \
  -t "$TAG" . 2>&1 | tee "$build_log" | { if [[ $QUIET == 1 ]]; then cat >/dev/null; else grep --line-buffered -E '^Step [0-9]+/[0-9]+' >&2; fi; }
rc=${PIPESTATUS[0]}
set -e
[[ $rc == 0 ]] || die "docker build failed (exit $rc); last lines:
$(tail -n 25 "$build_log")"
if [[ $TAG == smddp-sdk:$VERSION ]]; then docker tag "$TAG" smddp-sdk:latest; fi
# Earlier builds of the image, untagged by this one, only take disk space.
docker image prune -f --filter dangling=true --filter label=org.opencontainers.image.title=smddp-sdk >/dev/null || true
step "built $TAG ($(docker image inspect -f '{{.Size}}' "$TAG" | awk '{printf "%.2f GB", $1/1e9}'))"
echo "$TAG"
