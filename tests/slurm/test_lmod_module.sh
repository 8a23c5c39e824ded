#!/usr/bin/env bash
# The modulefiles under the real Lmod: install the build into a prefix, then
#  - Lmod's syntax checks pass on modules/ (Lua and Tcl modulefiles) and on the installed copies;
#  - `module load hpc_train` from the repository's Lua and Tcl modulefiles (HPC_TRAIN_PREFIX = the
#    prefix) and from the installed Lua and Tcl copies (prefix and the build's MPI/HDF5/CUDA
#    directories filled in) puts the installed hpc_train first on PATH, sets HPC_TRAIN_ROOT,
#    adds only directories that exist (not PREFIX/lib, which the install does not make), and
#    `hpc_train --version` runs; the installed copies put the recorded directories
#    (HPC_TRAIN_MODULE_BIN_DIRS, HPC_TRAIN_MODULE_LIB_DIRS) first, in their order; `module show`
#    lists conflict("hpc_train"); `module unload` takes it all away again;
#  - modulefiles written with recorded directories of which one does not exist add the others only;
#  - a site `openmpi` module is loaded by the repository's modulefiles, not by the installed ones
#    (they bring the MPI the build used).
# Exit 77 (skipped) where Lmod is not installed.
# shellcheck disable=SC2030,SC2031  # each module check runs in a subshell of its own, on purpose
set -euo pipefail

build_dir=${HPC_TRAIN_BUILD_DIR:?set HPC_TRAIN_BUILD_DIR to the build directory}
source_dir=${HPC_TRAIN_SOURCE_DIR:?}
cmake=${HPC_TRAIN_CMAKE:-cmake}
# The directories the build recorded for the installed modulefiles, colon-separated.
recorded_bin_dirs=${HPC_TRAIN_MODULE_BIN_DIRS?}
recorded_lib_dirs=${HPC_TRAIN_MODULE_LIB_DIRS?}
source "$(dirname "${BASH_SOURCE[0]}")/../support/script_test.sh"  # $work, fail, skip

lmod_init=""
for f in ${LMOD_PKG:+"$LMOD_PKG/init/bash"} /usr/share/lmod/lmod/init/bash \
         /usr/share/lmod/*/init/bash /opt/apps/lmod/lmod/init/bash; do
  [ -f "$f" ] && { lmod_init=$f; break; }
done
if [ -z "$lmod_init" ]; then
  skip "Lmod is not installed (apt-get install lmod)"
fi

prefix=$work/prefix
"$cmake" --install "$build_dir" --prefix "$prefix" > install.log ||
  { cat install.log; fail "cmake --install $build_dir failed"; }
installed_modulefile=$prefix/share/modulefiles/hpc_train/0.1.0.lua
for f in "$prefix/bin/hpc_train" "$prefix/bin/hpc_train_data" "$installed_modulefile" \
         "$prefix/share/modulefiles/hpc_train/0.1.0"; do
  [ -e "$f" ] || fail "cmake --install did not install $f"
done
grep -qF "\"$prefix\"" "$installed_modulefile" || fail "the installed modulefile lacks the prefix"
[ ! -e "$prefix/lib" ] || fail "$prefix/lib exists: the checks below assume it does not"

# A Tcl modulefile alone in a tree (beside 0.1.0.lua, Lmod would take the Lua one): the
# repository's and the installed one.
tcl_tree=$work/tcl-modulefiles
installed_tcl_tree=$work/installed-tcl-modulefiles
mkdir -p "$tcl_tree/hpc_train" "$installed_tcl_tree/hpc_train"
cp "$source_dir/modules/hpc_train/0.1.0" "$tcl_tree/hpc_train/0.1.0"
cp "$prefix/share/modulefiles/hpc_train/0.1.0" "$installed_tcl_tree/hpc_train/0.1.0"
for f in "$tcl_tree/hpc_train/0.1.0" "$installed_tcl_tree/hpc_train/0.1.0"; do
  head -n 1 "$f" | grep -q '^#%Module' || fail "$f: no #%Module line"
done

# Modulefiles written with recorded directories of which the middle one does not exist.
fake_tree=$work/fake-recorded-modulefiles
fake=$work/fake-mpi
mkdir -p "$fake/bin" "$fake/lib" "$fake/lib64"
"$cmake" "-DMODULES_DIR=$source_dir/modules/hpc_train" -DVERSION=0.1.0 "-DPREFIX=$prefix" \
  "-DBIN_DIRS=$fake/bin;$fake/missing-bin" "-DLIB_DIRS=$fake/lib;$fake/missing-lib;$fake/lib64" \
  "-DOUTPUT_DIR=$fake_tree/hpc_train" -P "$source_dir/cmake/HpcTrainWriteModulefiles.cmake" \
  > write.log || { cat write.log; fail "HpcTrainWriteModulefiles.cmake failed"; }
fake_tcl_tree=$work/fake-recorded-tcl-modulefiles
mkdir -p "$fake_tcl_tree/hpc_train"
mv "$fake_tree/hpc_train/0.1.0" "$fake_tcl_tree/hpc_train/0.1.0"

# Lmod, from scratch: no module state from the caller's shell.
unset MODULEPATH LOADEDMODULES _LMOD_REF_COUNT_MODULEPATH HPC_TRAIN_ROOT HPC_TRAIN_PREFIX
while read -r name; do unset "$name"; done < <(compgen -e _ModuleTable)
export LMOD_IGNORE_CACHE=1 LMOD_REDIRECT=no
set +u  # Lmod's shell functions use unset variables
# shellcheck source=/dev/null
source "$lmod_init"
set -u
command -v module > /dev/null || fail "no module command after sourcing $lmod_init"
echo "Lmod: $(module --version 2>&1 | grep -o 'Version [0-9.]*' | head -n 1) from $lmod_init"

# Lmod's syntax checks: check_module_tree_syntax walks every modulefile of a tree (and reports
# "There were N possible errors found!" with exit 1), --checkSyntax evaluates one.
check_tree=${LMOD_DIR:-}/check_module_tree_syntax
for tree in "$source_dir/modules" "$prefix/share/modulefiles" "$tcl_tree" "$installed_tcl_tree" \
            "$fake_tree" "$fake_tcl_tree"; do
  if [ -x "$check_tree" ]; then
    "$check_tree" "$tree" > check.out 2>&1 || { cat check.out; fail "syntax errors in $tree"; }
    grep -q 'No errors found' check.out || { cat check.out; fail "syntax check of $tree"; }
  fi
  (
    export MODULEPATH=$tree HPC_TRAIN_PREFIX=$prefix
    module --checkSyntax load hpc_train
  ) || fail "module --checkSyntax load hpc_train failed in $tree"
  echo "syntax check passed: $tree"
done
[ -x "$check_tree" ] || echo "note: $check_tree not found; --checkSyntax only"

# added_entries BEFORE AFTER: the entries of the colon-separated AFTER that BEFORE lacks, in
# order, colon-separated.
added_entries() {
  local IFS=: entry added=()
  for entry in $2; do
    [[ ":$1:" == *":$entry:"* ]] || added+=("$entry")
  done
  echo "${added[*]}"
}

# check_module TREE FILE PREFIX_ENV BIN_DIRS LIB_DIRS: load hpc_train from TREE (whose hpc_train
# resolves to FILE), with HPC_TRAIN_PREFIX=PREFIX_ENV (empty: unset); check the environment:
# PATH starts with PREFIX/bin:BIN_DIRS, LD_LIBRARY_PATH with LIB_DIRS (colon-separated, maybe
# empty), every directory added exists; unload, check again. Prints "HPC_TRAIN_ROOT PATH
# LD_LIBRARY_PATH" as loaded, for comparing the modulefiles.
check_module() (
  local tree=$1 file=$2 prefix_env=$3 bin_dirs=$4 lib_dirs=$5 location loaded_path entry
  local path_before=$PATH library_path_before=${LD_LIBRARY_PATH:-}
  if [ -n "$prefix_env" ]; then export HPC_TRAIN_PREFIX=$prefix_env; fi
  module use "$tree"
  module show hpc_train 2>&1 | grep -q 'conflict("hpc_train")' ||
    fail "module show hpc_train ($tree) lists no conflict(\"hpc_train\")"
  location=$(module --redirect --location show hpc_train 2>&1 | tail -n 1)
  [ "$location" = "$file" ] || fail "hpc_train in $tree resolves to '$location', not $file"
  module load hpc_train || fail "module load hpc_train from $tree"
  module -t list 2>&1 | grep -qx 'hpc_train/0.1.0' || fail "module list: $(module -t list 2>&1)"
  [ "$(command -v hpc_train)" = "$prefix/bin/hpc_train" ] ||
    fail "hpc_train on PATH is '$(command -v hpc_train)', not $prefix/bin/hpc_train"
  [ "$(command -v hpc_train_data)" = "$prefix/bin/hpc_train_data" ] || fail "hpc_train_data on PATH"
  hpc_train --version | head -n 1 | grep -q '^hpc_train 0.1.0 (commit ' ||
    fail "hpc_train --version: $(hpc_train --version)"
  [ "${HPC_TRAIN_ROOT:-}" = "$prefix" ] || fail "HPC_TRAIN_ROOT is '${HPC_TRAIN_ROOT:-}', not $prefix"
  [[ "$PATH:" == "$prefix/bin:${bin_dirs:+$bin_dirs:}"* ]] ||
    fail "PATH from $tree does not start with $prefix/bin:$bin_dirs: $PATH"
  [[ "${LD_LIBRARY_PATH:-}:" == "${lib_dirs:+$lib_dirs:}"* ]] ||
    fail "LD_LIBRARY_PATH from $tree does not start with '$lib_dirs': ${LD_LIBRARY_PATH:-}"
  local IFS=:
  for entry in $(added_entries "$path_before" "$PATH") \
               $(added_entries "$library_path_before" "${LD_LIBRARY_PATH:-}"); do
    [ -d "$entry" ] || fail "module load hpc_train ($tree) added $entry, which does not exist"
  done
  unset IFS
  # Loading it again is no conflict with itself.
  module load hpc_train || fail "module load hpc_train a second time from $tree"
  module help hpc_train 2>&1 | grep -q 'hpc_train 0.1.0: data-parallel training' || fail "module help"
  module whatis hpc_train 2>&1 | grep -q 'Version: 0.1.0' || fail "module whatis"
  loaded_path=$PATH
  echo "$HPC_TRAIN_ROOT $loaded_path ${LD_LIBRARY_PATH:-}" > "$work/loaded.env"
  module unload hpc_train || fail "module unload hpc_train"
  [ -z "${HPC_TRAIN_ROOT+x}" ] || fail "HPC_TRAIN_ROOT is still set after module unload"
  [[ ":$PATH:" != *":$prefix/bin:"* ]] || fail "$prefix/bin is still on PATH after module unload"
  # Lmod may drop duplicate entries on unload: compare the entries, not the strings.
  [ -z "$(added_entries "$path_before" "$PATH")" ] ||
    fail "module unload left $(added_entries "$path_before" "$PATH") on PATH"
  [ -z "$(added_entries "$library_path_before" "${LD_LIBRARY_PATH:-}")" ] ||
    fail "module unload left $(added_entries "$library_path_before" "${LD_LIBRARY_PATH:-}") on LD_LIBRARY_PATH"
  [ -z "$(added_entries "$PATH" "$path_before")" ] ||
    fail "module unload took $(added_entries "$PATH" "$path_before") off PATH"
  [ "$(command -v hpc_train || true)" != "$prefix/bin/hpc_train" ] || fail "hpc_train still found"
  cat "$work/loaded.env"
)

lua_env=$(check_module "$source_dir/modules" "$source_dir/modules/hpc_train/0.1.0.lua" "$prefix" "" "")
echo "repository's Lua modulefile (HPC_TRAIN_PREFIX=$prefix): passed"
tcl_env=$(check_module "$tcl_tree" "$tcl_tree/hpc_train/0.1.0" "$prefix" "" "")
echo "repository's Tcl modulefile (HPC_TRAIN_PREFIX=$prefix): passed"
[ "$lua_env" = "$tcl_env" ] || fail "the Lua and the Tcl modulefile differ: '$lua_env' vs '$tcl_env'"

installed_env=$(check_module "$prefix/share/modulefiles" "$installed_modulefile" "" \
                "$recorded_bin_dirs" "$recorded_lib_dirs")
echo "installed Lua modulefile: passed (recorded: PATH '$recorded_bin_dirs'," \
     "LD_LIBRARY_PATH '$recorded_lib_dirs')"
installed_tcl_env=$(check_module "$installed_tcl_tree" "$installed_tcl_tree/hpc_train/0.1.0" "" \
                    "$recorded_bin_dirs" "$recorded_lib_dirs")
echo "installed Tcl modulefile: passed"
[ "$installed_env" = "$installed_tcl_env" ] ||
  fail "the installed Lua and Tcl modulefiles differ: '$installed_env' vs '$installed_tcl_env'"

fake_env=$(check_module "$fake_tree" "$fake_tree/hpc_train/0.1.0.lua" "" "$fake/bin" "$fake/lib:$fake/lib64")
echo "Lua modulefile with a missing recorded directory: passed (the others added, in order)"
fake_tcl_env=$(check_module "$fake_tcl_tree" "$fake_tcl_tree/hpc_train/0.1.0" "" "$fake/bin" \
               "$fake/lib:$fake/lib64")
echo "Tcl modulefile with a missing recorded directory: passed"
[ "$fake_env" = "$fake_tcl_env" ] || fail "Lua and Tcl with recorded directories: '$fake_env' vs '$fake_tcl_env'"

# The repository's modulefiles know no build: with an `openmpi` module available (and no cuda
# or hdf5), they load openmpi along with hpc_train. The installed ones bring the MPI the build
# used instead, and leave the site's default alone.
site_tree=$work/site-modulefiles
mkdir -p "$site_tree/openmpi"
printf 'setenv("HPC_TRAIN_TEST_SITE_MPI", "1")\n' > "$site_tree/openmpi/4.1.lua"
for tree in "$source_dir/modules" "$tcl_tree" "$prefix/share/modulefiles" "$installed_tcl_tree"; do
  case $tree in
    "$source_dir/modules" | "$tcl_tree") expected="hpc_train/0.1.0 openmpi/4.1 " site_mpi=1 ;;
    *) expected="hpc_train/0.1.0 " site_mpi="" ;;
  esac
  (
    export HPC_TRAIN_PREFIX=$prefix
    module use "$site_tree"
    module use "$tree"
    module load hpc_train || fail "module load hpc_train with a site openmpi module ($tree)"
    loaded=$(module -t list 2>&1 | sort | tr '\n' ' ')
    [ "$loaded" = "$expected" ] || fail "loaded from $tree: '$loaded', not '$expected'"
    [ "${HPC_TRAIN_TEST_SITE_MPI:-}" = "$site_mpi" ] || fail "the site's openmpi module: '$site_mpi' expected"
  )
  echo "with a site openmpi module, loaded: $tree: ${expected% }"
done
echo "lmod module test passed"
