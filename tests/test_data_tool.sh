#!/usr/bin/env bash
# The hpc_train_data command line: converts a small IDX set and CIFAR-10 set generated here,
# inspects the result, and checks that bad inputs end with the documented exit code (2 usage,
# 3 data) and a message that names the problem.
set -euo pipefail

tool=${HPC_TRAIN_DATA:?set HPC_TRAIN_DATA to the hpc_train_data executable}
source "$(dirname "${BASH_SOURCE[0]}")/support/script_test.sh"

# bytes B...: the given byte values, raw.
bytes() {
  local format
  printf -v format '\\x%02x' "$@"  # the format repeats for every argument
  printf "$format"
}
u32() { bytes $(($1 >> 24 & 255)) $(($1 >> 16 & 255)) $(($1 >> 8 & 255)) $(($1 & 255)); }

# idx_images FILE N H W: pixel i of sample s is (37 s + 11 i) mod 256.
idx_images() {
  local file=$1 n=$2 h=$3 w=$4 s i
  {
    bytes 0 0 8 3
    u32 "$n"; u32 "$h"; u32 "$w"
    for ((s = 0; s < n; s++)); do
      local pixels=()
      for ((i = 0; i < h * w; i++)); do pixels+=($(((37 * s + 11 * i) % 256))); done
      bytes "${pixels[@]}"
    done
  } >"$file"
}

# idx_labels FILE N: label of sample s is (3 s + 1) mod 10.
idx_labels() {
  local file=$1 n=$2 s labels=()
  for ((s = 0; s < n; s++)); do labels+=($(((3 * s + 1) % 10))); done
  { bytes 0 0 8 1; u32 "$n"; bytes "${labels[@]}"; } >"$file"
}

# expect_tool_error CODE TEXT COMMAND...: expect_failure, and the message has
# hpc_train_data's prefix.
expect_tool_error() {
  expect_failure "$@"
  shift 2
  grep -qF "hpc_train_data: error: " stderr.txt || fail "$*: no 'hpc_train_data: error:' prefix"
}

# --- help and version
"$tool" --help | grep -qF "hpc_train_data convert fashion-mnist|mnist|cifar10" || fail "--help"
"$tool" --version | grep -qE "^hpc_train_data [0-9]+\.[0-9]+" || fail "--version"

# --- a valid IDX set: train gzipped, test raw
mkdir idx
idx_images idx/train-images-idx3-ubyte 12 4 5
idx_labels idx/train-labels-idx1-ubyte 12
gzip idx/train-images-idx3-ubyte idx/train-labels-idx1-ubyte
idx_images idx/t10k-images-idx3-ubyte 3 4 5
idx_labels idx/t10k-labels-idx1-ubyte 3

line=$("$tool" convert fashion-mnist idx out.h5)
[[ $line == "wrote out.h5: 12 train, 3 test samples, 1x4x5, 10 classes" ]] || fail "convert: $line"
"$tool" inspect out.h5 >inspect.txt
for text in "train:           12 samples" "test:            3 samples" "1x4x5 (C x H x W)" \
  "0 T-shirt/top" "9 Ankle boot" "fashion-mnist IDX files in idx" "format version:  1"; do
  grep -qF "$text" inspect.txt || fail "inspect lacks '$text': $(cat inspect.txt)"
done

line=$("$tool" convert mnist idx small.h5 --max-train 5 --max-test 0)
[[ $line == "wrote small.h5: 5 train, 0 test samples, 1x4x5, 10 classes" ]] || fail "max: $line"
"$tool" inspect small.h5 | grep -qF "classes:         10: 0 0, 1 1, 2 2" || fail "mnist names"

# --- usage errors: exit 2
expect_tool_error 2 "unknown dataset format 'foo'" "$tool" convert foo idx x.h5
expect_tool_error 2 "convert takes FORMAT SRC_DIR OUT.h5" "$tool" convert mnist idx
expect_tool_error 2 "--max-train must be >= 0" "$tool" convert mnist idx x.h5 --max-train -1
expect_tool_error 2 "unknown command 'frob'" "$tool" frob
expect_tool_error 2 "no command given" "$tool"
expect_tool_error 2 "inspect takes one FILE.h5" "$tool" inspect a.h5 b.h5
expect_tool_error 2 "unrecognised option '--bogus'" "$tool" inspect out.h5 --bogus

# --- data errors: exit 3, nothing written
mkdir bad
cp idx/* bad/
bad_convert() { expect_tool_error 3 "$1" "$tool" convert mnist bad bad.h5; }

expect_tool_error 3 "missing.h5: no such file" "$tool" inspect missing.h5
expect_tool_error 3 "idx: is a directory" "$tool" inspect idx
expect_tool_error 3 "inspect.txt: not an HDF5 file" "$tool" inspect inspect.txt

idx_images bad/t10k-labels-idx1-ubyte 3 4 5
bad_convert "t10k-labels-idx1-ubyte: wrong magic number 0x00000803, expected 0x00000801"
idx_labels bad/t10k-labels-idx1-ubyte 3

head -c -4 idx/t10k-images-idx3-ubyte >bad/t10k-images-idx3-ubyte
bad_convert "t10k-images-idx3-ubyte: truncated: 56 data bytes, the header says 60"
: >bad/t10k-images-idx3-ubyte
bad_convert "t10k-images-idx3-ubyte: empty file"
cp idx/t10k-images-idx3-ubyte bad/

{ bytes 0 0 8 1; u32 3; bytes 1 12 2; } >bad/t10k-labels-idx1-ubyte
bad_convert "t10k-labels-idx1-ubyte: label[1] = 12 is outside [0, 10)"
idx_labels bad/t10k-labels-idx1-ubyte 2
bad_convert "has 3 images but"
rm bad/t10k-labels-idx1-ubyte
bad_convert "t10k-labels-idx1-ubyte: no such file (nor"
[[ ! -e bad.h5 ]] || fail "a failed conversion left bad.h5"
compgen -G "bad.h5.partial-*" >/dev/null && fail "a failed conversion left a temporary file"
expect_tool_error 3 "no such directory" "$tool" convert mnist idx no/such/dir/x.h5

# --- CIFAR-10 binary: 5 train batches of 1 record, a test batch of 2; each image one value,
# 64 + its label, so that the train images' std is not 0 (the writer refuses that)
mkdir -p cifar/cifar-10-batches-bin
record() { bytes "$1"; head -c 3072 /dev/zero | tr '\0' "\\$(printf '%03o' $((64 + $1)))"; }
for b in 1 2 3 4 5; do record "$b" >"cifar/cifar-10-batches-bin/data_batch_$b.bin"; done
{ record 0; record 9; } >cifar/cifar-10-batches-bin/test_batch.bin
line=$("$tool" convert cifar10 cifar cifar.h5)
[[ $line == "wrote cifar.h5: 5 train, 2 test samples, 3x32x32, 10 classes" ]] || fail "cifar: $line"
"$tool" inspect cifar.h5 | grep -qF "0 airplane, 1 automobile" || fail "cifar names"
head -c 3000 /dev/zero >cifar/cifar-10-batches-bin/data_batch_2.bin
expect_tool_error 3 "data_batch_2.bin: 3000 bytes is not a whole number of 3073-byte" \
  "$tool" convert cifar10 cifar cifar2.h5

echo "test_data_tool: all checks passed"
