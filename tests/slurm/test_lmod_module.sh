#!/usr/bin/env bash
# The modulefiles under the real Lmod: install the build into a prefix, then
#  - Lmod's syntax checks pass on modules/ (Lua and Tcl modulefiles) and on the installed copy;
#  - `module load hpc_train` from the repository's Lua modulefile (HPC_TRAIN_PREFIX = the
#    prefix), from the installed copy (prefix filled in) and from the Tcl modulefile puts the
#    installed hpc_train first on PATH, sets HPC_TRAIN_ROOT and LD_LIBRARY_PATH alike, and
#    `hpc_train --version` runs; `module unload` takes it all away again.
# Exit 77 (skipped) where Lmod is not installed.
# shellcheck disable=SC2030,SC2031  # each module check runs in a subshell of its own, on purpose
set -euo pipefail

fail() {
  echo "FAIL: $*" >&2
  exit 1
}

work=${HPC_TRAIN_TEST_WORK:?}
build_dir=${HPC_TRAIN_BUILD_DIR:?set HPC_TRAIN_BUILD_DIR to the build directory}
source_dir=${HPC_TRAIN_SOURCE_DIR:?}
cmake=${HPC_TRAIN_CMAKE:-cmake}
rm -rf "$work" && mkdir -p "$work" && cd "$work"

lmod_init=""
for f in ${LMOD_PKG:+"$LMOD_PKG/init/bash"} /usr/share/lmod/lmod/init/bash \
         /usr/share/lmod/*/init/bash /opt/apps/lmod/lmod/init/bash; do
  [ -f "$f" ] && { lmod_init=$f; break; }
done
if [ -z "$lmod_init" ]; then
  echo "Lmod is not installed (apt-get install lmod): skipped"
  exit 77
fi

prefix=$work/prefix
"$cmake" --install "$build_dir" --prefix "$prefix" > install.log ||
  { cat install.log; fail "cmake --install $build_dir failed"; }
installed_modulefile=$prefix/share/modulefiles/hpc_train/0.1.0.lua
for f in "$prefix/bin/hpc_train" "$prefix/bin/hpc_train_data" "$installed_modulefile"; do
  [ -e "$f" ] || fail "cmake --install did not install $f"
done
grep -qF "\"$prefix\"" "$installed_modulefile" || fail "the installed modulefile lacks the prefix"

# The Tcl modulefile, alone in a tree: beside 0.1.0.lua, Lmod would take the Lua one.
tcl_tree=$work/tcl-modulefiles
mkdir -p "$tcl_tree/hpc_train"
cp "$source_dir/modules/hpc_train/0.1.0" "$tcl_tree/hpc_train/0.1.0"
head -n 1 "$tcl_tree/hpc_train/0.1.0" | grep -q '^#%Module' || fail "Tcl modulefile: no #%Module line"

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
for tree in "$source_dir/modules" "$prefix/share/modulefiles" "$tcl_tree"; do
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

# check_module TREE FILE PREFIX_ENV: load hpc_train from TREE (whose hpc_train resolves to FILE),
# with HPC_TRAIN_PREFIX=PREFIX_ENV (empty: unset); check the environment, unload, check again.
# Prints "HPC_TRAIN_ROOT PATH LD_LIBRARY_PATH" as loaded, for comparing the modulefiles.
check_module() (
  local tree=$1 file=$2 prefix_env=$3 location loaded_path
  if [ -n "$prefix_env" ]; then export HPC_TRAIN_PREFIX=$prefix_env; fi
  module use "$tree"
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
  [[ "${LD_LIBRARY_PATH:-}:" == "$prefix/lib:"* ]] || fail "LD_LIBRARY_PATH: ${LD_LIBRARY_PATH:-}"
  module help hpc_train 2>&1 | grep -q 'hpc_train 0.1.0: data-parallel training' || fail "module help"
  module whatis hpc_train 2>&1 | grep -q 'Version: 0.1.0' || fail "module whatis"
  loaded_path=$PATH
  echo "$HPC_TRAIN_ROOT $loaded_path ${LD_LIBRARY_PATH:-}" > "$work/loaded.env"
  module unload hpc_train || fail "module unload hpc_train"
  [ -z "${HPC_TRAIN_ROOT+x}" ] || fail "HPC_TRAIN_ROOT is still set after module unload"
  [[ ":$PATH:" != *":$prefix/bin:"* ]] || fail "$prefix/bin is still on PATH after module unload"
  [[ ":${LD_LIBRARY_PATH:-}:" != *":$prefix/lib:"* ]] || fail "$prefix/lib still on LD_LIBRARY_PATH"
  [ "$(command -v hpc_train || true)" != "$prefix/bin/hpc_train" ] || fail "hpc_train still found"
  cat "$work/loaded.env"
)

lua_env=$(check_module "$source_dir/modules" "$source_dir/modules/hpc_train/0.1.0.lua" "$prefix")
echo "repository's Lua modulefile (HPC_TRAIN_PREFIX=$prefix): passed"
installed_env=$(check_module "$prefix/share/modulefiles" "$installed_modulefile" "")
echo "installed Lua modulefile: passed"
tcl_env=$(check_module "$tcl_tree" "$tcl_tree/hpc_train/0.1.0" "$prefix")
echo "Tcl modulefile (HPC_TRAIN_PREFIX=$prefix): passed"
[ "$lua_env" = "$tcl_env" ] || fail "the Lua and the Tcl modulefile differ: '$lua_env' vs '$tcl_env'"
# The installed copy differs only in MODULEPATH-independent ways: the same root and paths.
[ "$lua_env" = "$installed_env" ] || fail "repository vs installed modulefile: '$lua_env' vs '$installed_env'"

# Dependencies only where the site has them: with an `openmpi` module available (and no cuda or
# hdf5), both modulefiles load openmpi along with hpc_train.
site_tree=$work/site-modulefiles
mkdir -p "$site_tree/openmpi"
printf 'setenv("HPC_TRAIN_TEST_SITE_MPI", "1")\n' > "$site_tree/openmpi/4.1.lua"
for tree in "$source_dir/modules" "$tcl_tree"; do
  (
    export HPC_TRAIN_PREFIX=$prefix
    module use "$site_tree"
    module use "$tree"
    module load hpc_train || fail "module load hpc_train with a site openmpi module ($tree)"
    loaded=$(module -t list 2>&1 | sort | tr '\n' ' ')
    [ "$loaded" = "hpc_train/0.1.0 openmpi/4.1 " ] || fail "loaded from $tree: $loaded"
    [ "${HPC_TRAIN_TEST_SITE_MPI:-}" = 1 ] || fail "the site's openmpi module did not load"
  )
  echo "site openmpi module loaded as a dependency: $tree"
done
echo "lmod module test passed"
