#!/usr/bin/env bash
# The two commands of the README:
#   ./run.sh train [hpc_train options]   install what is missing, build, prepare Fashion-MNIST,
#                                        train the default configuration with mpirun
#   ./run.sh test                        the same set-up, then every test (what .ci/run runs)
# Environment: HPC_TRAIN_RANKS (ranks for `train`; default one per GPU, or 3 without GPUs),
# HPC_TRAIN_BUILD_DIR (default build), HPC_TRAIN_SKIP_APT=1 (never call apt-get).
set -euo pipefail
cd "$(dirname "$0")"
mode=${1:-train}
[ $# -gt 0 ] && shift
build_dir=${HPC_TRAIN_BUILD_DIR:-build}

# Debian 12 / Ubuntu 24.04 package names of everything the build, the data and the tests need.
# clang and libclang-rt-dev (libFuzzer and the sanitizers' runtimes) build the fuzz targets;
# python3-torch and python3-torchvision (the version of libtorch-dev) are the model zoo tests'
# reference (ctest -L models) and script the TorchScript modules of the tests.
# python3-protobuf reads the TensorBoard event files back in test_tensorboard_run.
# python3-matplotlib draws hpc_train_report's picture; python3-pil reads it back in test_report.
# libjpeg62-turbo-dev and libpng-dev decode the images of convert imagefolder (optional in CMake:
# without them that converter is left out); python3-pil writes and checks its test images.
packages=(build-essential cmake ninja-build ccache pkg-config libtorch-dev libopenmpi-dev
          openmpi-bin libhdf5-openmpi-dev libboost-program-options-dev nlohmann-json3-dev
          zlib1g-dev libgtest-dev dataset-fashion-mnist python3 python3-numpy python3-h5py
          slurm-wlm munge lmod
          clang libclang-rt-dev python3-torch python3-torchvision python3-protobuf
          python3-matplotlib python3-pil libjpeg62-turbo-dev libpng-dev)

install_missing_packages() {
  local missing=()
  for p in "${packages[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  [ ${#missing[@]} -eq 0 ] && return 0
  if [ "${HPC_TRAIN_SKIP_APT:-0}" = 1 ] || ! command -v apt-get > /dev/null; then
    echo "run.sh: missing packages: ${missing[*]} (install them, or load the equivalent modules)" >&2
    return 0
  fi
  local sudo=""
  [ "$(id -u)" -ne 0 ] && sudo=sudo
  echo "run.sh: installing ${missing[*]}"
  $sudo apt-get update -q
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -q --no-install-recommends "${missing[@]}"
}

# A LibTorch with CUDA, where Python's torch has one (e.g. PyTorch's wheel on a GPU machine);
# else CMake finds Debian's CPU libtorch-dev. Torch_DIR / CMAKE_PREFIX_PATH set by the caller win.
torch_prefix() {
  [ -n "${Torch_DIR:-}" ] && return 0
  python3 -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1); ' 2>/dev/null \
    && python3 -c 'import torch; print(torch.utils.cmake_prefix_path)' 2>/dev/null
}

build() {
  local prefix
  prefix=$(torch_prefix || true)
  cmake -S . -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=Release \
    ${prefix:+-DCMAKE_PREFIX_PATH="$prefix${CMAKE_PREFIX_PATH:+;$CMAKE_PREFIX_PATH}"}
  cmake --build "$build_dir" -j "$(nproc)"
}

# One rank per GPU in a GPU build on a machine with GPUs, else 3 ranks sharing the CPU cores.
default_ranks() {
  local gpus=0
  if grep -q '^HPC_TRAIN_GPU_BUILD:INTERNAL=ON' "$build_dir/CMakeCache.txt" 2>/dev/null; then
    gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)
  fi
  if [ "$gpus" -gt 0 ]; then echo "$gpus"; else echo 3; fi
}

prepare_dataset() {
  [ -f data/fashion-mnist.h5 ] && return 0
  "$build_dir/hpc_train_data" convert fashion-mnist /usr/share/datasets/fashion-mnist \
    data/fashion-mnist.h5
}

# Open MPI refuses to run as root (containers, CI) unless told that it is meant.
if [ "$(id -u)" -eq 0 ]; then
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
fi

case "$mode" in
  train)
    install_missing_packages
    build
    prepare_dataset
    ranks=${HPC_TRAIN_RANKS:-$(default_ranks)}
    exec mpirun -np "$ranks" --oversubscribe "$build_dir/hpc_train" "$@"
    ;;
  test)
    install_missing_packages
    build
    cd "$build_dir" && exec ctest --output-on-failure "$@"
    ;;
  *)
    echo "usage: ./run.sh train [hpc_train options] | ./run.sh test [ctest options]" >&2
    exit 2
    ;;
esac
