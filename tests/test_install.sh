#!/usr/bin/env bash
# `cmake --install` into a fresh prefix, then the installed programs from an empty environment
# (env -i: no LD_LIBRARY_PATH, no modules), so that they run only through their RUNPATH:
#  - every library the installed hpc_train and hpc_train_data need resolves (ldd: no "not found");
#  - `hpc_train --version` prints the version and `--help` the options, both without MPI;
#    hpc_train_data converts 256 + 64 Fashion-MNIST samples and `mpirun -np 1 hpc_train` trains
#    2 steps on them (summary.json: steps 2);
#  - the job scripts, the example configs and both modulefiles (Lmod .lua and Tcl, prefix filled
#    in, `conflict hpc_train`) are installed, the job scripts byte for byte and executable alike.
set -euo pipefail

build_dir=${HPC_TRAIN_BUILD_DIR:?set HPC_TRAIN_BUILD_DIR to the build directory}
source_dir=${HPC_TRAIN_SOURCE_DIR:?}
cmake=${HPC_TRAIN_CMAKE:-cmake}
mpiexec=${MPIEXEC:?}
dataset_dir=${HPC_TRAIN_FASHION_MNIST_DIR:-/usr/share/datasets/fashion-mnist}
source "$(dirname "${BASH_SOURCE[0]}")/support/script_test.sh"  # $work, fail, skip

prefix=$work/prefix
"$cmake" --install "$build_dir" --prefix "$prefix" > install.log ||
  { cat install.log; fail "cmake --install $build_dir --prefix $prefix failed"; }

# The installed files.
version=0.1.0
modules=$prefix/share/modulefiles/hpc_train
for f in "$prefix/bin/hpc_train" "$prefix/bin/hpc_train_data" "$modules/$version.lua" \
         "$modules/$version"; do
  [ -f "$f" ] || fail "cmake --install did not install $f"
done
for program in hpc_train hpc_train_data; do
  [ -x "$prefix/bin/$program" ] || fail "$prefix/bin/$program is not executable"
done
for pair in jobscripts:share/hpc_train/jobscripts configs:share/hpc_train/configs; do
  from=$source_dir/${pair%%:*}
  to=$prefix/${pair#*:}
  count=0
  for f in "$from"/*; do
    name=$(basename "$f")
    cmp -s "$f" "$to/$name" || fail "$to/$name is missing or differs from $f"
    [ ! -x "$f" ] || [ -x "$to/$name" ] || fail "$to/$name lost its execute permission"
    count=$((count + 1))
  done
  [ "$count" -gt 0 ] || fail "nothing in $from"
  echo "installed $count files of ${pair%%:*}/ under $to"
done
grep -qF "or \"$prefix\"" "$modules/$version.lua" || fail "the Lua modulefile lacks the prefix"
grep -qF "set root {$prefix}" "$modules/$version" || fail "the Tcl modulefile lacks the prefix"
grep -qx 'conflict("hpc_train")' "$modules/$version.lua" || fail "the Lua modulefile: no conflict"
grep -qx 'conflict hpc_train' "$modules/$version" || fail "the Tcl modulefile: no conflict"
head -n 1 "$modules/$version" | grep -q '^#%Module' || fail "the Tcl modulefile: no #%Module line"

# From an empty environment: only the RUNPATH finds LibTorch, MPI, HDF5 (and CUDA, NCCL).
# The site's Open MPI settings (OMPI_MCA_*: e.g. how mpirun starts its daemons where there is no
# ssh) are configuration, not library paths: they pass.
mapfile -t mpi_settings < <(env | grep '^OMPI_MCA_' || true)
clean_env=(env -i PATH=/usr/bin:/bin HOME="$HOME" OMP_NUM_THREADS=1
           OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 "${mpi_settings[@]}")
for program in hpc_train hpc_train_data; do
  "${clean_env[@]}" ldd "$prefix/bin/$program" > "ldd_$program.txt" 2>&1 ||
    { cat "ldd_$program.txt"; fail "ldd $prefix/bin/$program"; }
  if grep -q 'not found' "ldd_$program.txt"; then
    grep 'not found' "ldd_$program.txt"
    readelf -d "$prefix/bin/$program" | grep -E 'RUNPATH|RPATH' || true
    fail "the installed $program does not find its libraries from an empty environment"
  fi
  echo "$program: $(grep -c '=>' "ldd_$program.txt") libraries resolved;" \
       "$(readelf -d "$prefix/bin/$program" | sed -n 's/.*Library \(runpath\|rpath\): /\1 /p')"
done

# --version and --help start no MPI (main.cpp): an rsh agent that does not exist, as on a node
# without ssh, makes Open MPI's singleton start fail, so MPI_Init here would fail the test.
"${clean_env[@]}" OMPI_MCA_plm_rsh_agent=/nonexistent/rsh "$prefix/bin/hpc_train" --help \
  > help.txt 2>&1 || { cat help.txt; fail "the installed hpc_train --help failed"; }
grep -qF -- "--micro-batch" help.txt || fail "the installed hpc_train --help: $(head -n 3 help.txt)"
"${clean_env[@]}" OMPI_MCA_plm_rsh_agent=/nonexistent/rsh "$prefix/bin/hpc_train" --version \
  > version.txt 2>&1 ||
  { cat version.txt; fail "the installed hpc_train --version failed"; }
head -n 1 version.txt | grep -q "^hpc_train $version (commit " ||
  fail "the installed hpc_train --version: $(head -n 1 version.txt)"
echo "installed hpc_train --version: $(head -n 1 version.txt)"

"${clean_env[@]}" "$prefix/bin/hpc_train_data" convert fashion-mnist "$dataset_dir" x.h5 \
  --max-train 256 --max-test 64 > convert.log 2>&1 ||
  { cat convert.log; fail "the installed hpc_train_data convert failed"; }
"${clean_env[@]}" "$mpiexec" -np 1 "$prefix/bin/hpc_train" --dataset x.h5 --max-steps 2 \
  --run-dir r > train.log 2>&1 || { cat train.log; fail "the installed hpc_train did not train"; }
[ -f r/summary.json ] || { cat train.log; fail "no r/summary.json"; }
steps=$(python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))["steps"])' r/summary.json)
[ "$steps" = 2 ] || fail "summary.json: steps $steps, not 2"
echo "installed hpc_train trained $steps steps from an empty environment"
echo "install test passed"
