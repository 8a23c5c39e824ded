# What the bash tests share (tests/test_*.sh source it after `set -euo pipefail`):
#   source "$(dirname "${BASH_SOURCE[0]}")/support/script_test.sh"
# It makes the test's work directory afresh and enters it: $HPC_TRAIN_TEST_WORK, which CTest sets
# (hpc_train_add_script_test), or a new temporary directory when the script is run by hand. Then
# it defines fail, skip, expect_failure, expect_refused and python_with.

work=${HPC_TRAIN_TEST_WORK:-$(mktemp -d)}
rm -rf "$work"
mkdir -p "$work"
cd "$work"

# fail MESSAGE...: the test fails with MESSAGE.
fail() {
  echo "FAIL: $*" >&2
  exit 1
}

# skip MESSAGE...: the test cannot run on this machine (exit 77: the tests that may skip have
# SKIP_RETURN_CODE 77 in CTest).
skip() {
  echo "SKIP: $*"
  exit 77
}

# expect_failure CODE TEXT COMMAND...: COMMAND exits with CODE and its stderr contains TEXT. Its
# output stays in stdout.txt and stderr.txt, for the caller's further checks.
expect_failure() {
  local code=$1 text=$2 status=0
  shift 2
  "$@" >stdout.txt 2>stderr.txt || status=$?
  [[ $status == "$code" ]] || fail "$* exited with $status, expected $code: $(cat stderr.txt)"
  grep -qF -- "$text" stderr.txt || fail "$*: stderr lacks '$text': $(cat stderr.txt)"
}

# expect_refused CODE TEXT COMMAND...: expect_failure, and the converter wrote neither out.h5 nor
# a partial file (the converters' tests write to out.h5).
expect_refused() {
  expect_failure "$@"
  shift 2
  [[ ! -e out.h5 ]] || fail "$*: wrote out.h5 although it failed"
  ! ls out.h5.partial-* >/dev/null 2>&1 || fail "$*: left a partial file"
}

# python_with MODULES: prints the first python3 on the PATH that imports MODULES ("a, b"), else
# Debian's (which a python3 earlier on the PATH, pyenv or a virtual environment, may hide);
# returns 1 when neither does.
python_with() {
  local candidate
  for candidate in python3 /usr/bin/python3; do
    if "$candidate" -c "import $1" 2>/dev/null; then
      echo "$candidate"
      return 0
    fi
  done
  return 1
}
