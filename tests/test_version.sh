#!/usr/bin/env bash
# hpc_train --version: the build report (build_info.h). Each library's version as the binary
# reports it is checked against what CMake found at configure time (passed in by the test's
# environment) and the commit against git, so a wrong or missing item fails. A short run then
# carries the same report in its log header and in summary.json's "build".
set -euo pipefail

hpc_train=${HPC_TRAIN:?set HPC_TRAIN to the hpc_train executable}
source_dir=${HPC_TRAIN_SOURCE_DIR:?set HPC_TRAIN_SOURCE_DIR to the source tree}
source "$(dirname "${BASH_SOURCE[0]}")/support/script_test.sh"

"$hpc_train" --version >version.txt
cat version.txt
# value LABEL: the text after "  LABEL" padded to the report's column.
value() { sed -n "s/^  $1  *//p" version.txt; }

head -n 1 version.txt | grep -qE '^hpc_train [0-9]+\.[0-9]+\.[0-9]+ \(commit [^)]+\)$' ||
  fail "first line: $(head -n 1 version.txt)"
commit=$(head -n 1 version.txt | sed 's/.*(commit \(.*\))$/\1/')
if head=$(git -C "$source_dir" rev-parse --short=12 HEAD 2>/dev/null); then
  [[ $commit == "$head" || $commit == "$head+changes" ]] || fail "commit $commit, git says $head"
else
  [[ $commit == unknown ]] || fail "commit $commit outside git"
fi

[[ $(value LibTorch) == "${EXPECT_TORCH_VERSION:?}"* ]] ||
  fail "LibTorch '$(value LibTorch)', CMake found ${EXPECT_TORCH_VERSION}"
[[ $(value Boost) == "${EXPECT_BOOST_VERSION:?}" ]] ||
  fail "Boost '$(value Boost)', CMake found ${EXPECT_BOOST_VERSION}"
hdf5_kind=serial
[[ ${EXPECT_HDF5_PARALLEL:-} =~ ^(1|ON|TRUE|YES)$ ]] && hdf5_kind=parallel
[[ $(value HDF5) == "${EXPECT_HDF5_VERSION:?} ($hdf5_kind)" ]] ||
  fail "HDF5 '$(value HDF5)', CMake found ${EXPECT_HDF5_VERSION} ($hdf5_kind)"
# The MPI library's version as its launcher says it ("mpirun (Open MPI) 4.1.4").
mpi_version=$("${MPIEXEC:?}" --version 2>&1 | grep -oE '[0-9]+\.[0-9]+(\.[0-9]+)?' | head -n 1)
[[ $(value MPI) == *"$mpi_version"*"(MPI "* ]] ||
  fail "MPI '$(value MPI)', $MPIEXEC --version says $mpi_version"
[[ $(value 'build type') == "${EXPECT_BUILD_TYPE:?}" ]] || fail "build type '$(value 'build type')'"
[[ $(value compiler) =~ ^(gcc|clang)\ [0-9] ]] || fail "compiler '$(value compiler)'"
for label in 'CUDA runtime' 'CUDA driver' cuDNN NCCL 'CUDA architectures'; do
  [[ -n $(value "$label") ]] || fail "no $label line"
done
if [[ ${EXPECT_GPU_BUILD:-OFF} == ON ]]; then
  [[ $(value NCCL) =~ ^[0-9]+\.[0-9]+\.[0-9]+$ ]] || fail "NCCL '$(value NCCL)'"
  [[ $(value 'CUDA runtime') =~ ^[0-9]+\.[0-9]+$ ]] || fail "CUDA runtime '$(value 'CUDA runtime')'"
else
  [[ $(value NCCL) == "none (CPU build)" ]] || fail "NCCL '$(value NCCL)' in a CPU build"
fi

# The same report in a run's log header and summary.json.
fashion_mnist=${HPC_TRAIN_FASHION_MNIST_DIR:-/usr/share/datasets/fashion-mnist}
"${HPC_TRAIN_DATA:?}" convert fashion-mnist "$fashion_mnist" slice.h5 --max-train 256 --max-test 64
timeout 120 "$MPIEXEC" -np 1 "$hpc_train" --dataset slice.h5 --max-steps 2 --epochs 1 \
  --run-dir run >train.out 2>&1 || { cat train.out; fail "the run failed"; }
grep -qF "$(sed -n 2p version.txt)" train.out || fail "the log header lacks '$(sed -n 2p version.txt)'"
python3 - "$commit" "$(value LibTorch)" "$(value HDF5)" <<'PY'
import json, sys
build = json.load(open("run/summary.json"))["build"]
print("summary.json build:", build)
commit, libtorch, hdf5 = sys.argv[1:]
assert build["commit"] == commit and build["libtorch"] == libtorch and build["hdf5"] == hdf5, build
for key in ("hpc_train", "cuda_runtime", "cuda_driver", "cudnn", "nccl", "cuda_architectures",
            "mpi", "boost", "compiler", "build_type"):
    assert build.get(key), key
PY
echo "version passed"
