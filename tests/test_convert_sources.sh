#!/usr/bin/env bash
# hpc_train_data convert npz and convert cifar10-python against files that numpy and Python's
# pickle wrote (tests/support/source_datasets.py): the HDF5 file holds what was written (images
# as N,C,H,W, labels, classes, mean/std), the cifar10-python output equals the cifar10 binary
# converter's for the same images, and every refused input ends with exit 3 and a message
# naming the file and the member or what is wrong.
set -euo pipefail

tool=${HPC_TRAIN_DATA:?set HPC_TRAIN_DATA to the hpc_train_data executable}
python=${HPC_TRAIN_NUMPY_PYTHON:-python3}
sources=${HPC_TRAIN_SOURCE_DIR:?set HPC_TRAIN_SOURCE_DIR to the source tree}/tests/support/source_datasets.py
source "$(dirname "${BASH_SOURCE[0]}")/support/script_test.sh"

"$python" -c "import numpy, h5py" ||
  fail "$python lacks numpy or h5py (apt-get install python3-numpy python3-h5py)"

# --- npz: savez and savez_compressed, N,H,W,C / N,C,H,W / N,H,W, labels of several dtypes
for layout in nhwc nchw 3d; do
  for compressed in "" --compressed; do
    for dtype in int64 uint8 int16 uint32; do
      "$python" "$sources" npz in.npz "$layout" $compressed --label-dtype "$dtype"
      tool_layout=$([[ $layout == nchw ]] && echo nchw || echo nhwc)
      "$tool" convert npz in.npz out.h5 --layout "$tool_layout" >/dev/null
      "$python" "$sources" check-npz in.npz "$layout" out.h5 >/dev/null ||
        fail "npz $layout $compressed $dtype: the HDF5 file differs from the arrays"
      rm -f out.h5
    done
  done
done
echo "npz: 24 files (3 layouts, stored and deflated, 4 label dtypes) converted as written"

# --num-classes and --max-train
"$python" "$sources" npz in.npz nhwc
"$tool" convert npz in.npz out.h5 --num-classes 12 --max-train 5 | grep -qF "5 train, 12 test samples, 3x5x4, 12 classes" ||
  fail "--num-classes 12 --max-train 5"
rm -f out.h5
expect_refused 3 "is outside [0, 3)" "$tool" convert npz in.npz out.h5 --num-classes 3
expect_refused 2 "--layout and --num-classes belong to convert npz" \
  "$tool" convert cifar10 . out.h5 --layout nchw
expect_refused 2 "unknown image layout 'nwhc'" "$tool" convert npz in.npz out.h5 --layout nwhc

# --- npz refusals: each names the file and the member
while IFS='|' read -r case text; do
  "$python" "$sources" bad-npz "$case" bad.npz
  expect_refused 3 "$text" "$tool" convert npz bad.npz out.h5
done <<'CASES'
not-zip|bad.npz: not a zip archive
missing-array|bad.npz: no array x_test (zip member x_test.npy)
float-images|bad.npz: x_train.npy: dtype '<f4', expected uint8 images
float-labels|bad.npz: y_test.npy: dtype '<f8', expected integer labels
wrong-rank|bad.npz: x_train.npy: shape (40, 60) has 2 dimensions
label-rank|bad.npz: y_train.npy: shape (40, 1), expected 1-D labels
n-mismatch|bad.npz: y_train.npy has 39 labels but bad.npz: x_train.npy has 40 images
negative-label|bad.npz: y_test.npy: label[3] = -2 is negative
shape-mismatch|bad.npz: x_test.npy: images are 3x4x4 but bad.npz: x_train.npy has 3x5x4
big-endian|bad.npz: y_train.npy: dtype '>i4' is big-endian
fortran|bad.npz: x_train.npy: fortran_order is True
truncated|bad.npz: not a zip archive
truncated-member|bad.npz: x_train.npy: truncated: 2390 data bytes
crc|bad.npz: zip entry "x_train.npy": CRC-32 mismatch
truncated-deflate|bad.npz: zip entry "x_train.npy": the deflate stream ends early
absurd-shape|bad.npz: x_train.npy: shape (4611686018427387904x4x4x3) of |u1 is over 2^63 bytes
absurd-member|bad.npz: zip entry "x_train.npy": claims 4294967280 bytes from
CASES
echo "npz: 17 refusals, exit 3"

# --- cifar10-python: Python 2 cPickle's protocol 2, Python 3's 2, 4 and 5, from the same images
# as a cifar-10-batches-bin, converted by both converters
for protocol in py2 2 4 5; do
  rm -rf "cifar_$protocol"
  "$python" "$sources" cifar "cifar_$protocol" "$protocol" --per-batch 50
  "$tool" convert cifar10-python "cifar_$protocol" python.h5 | grep -qF "250 train, 50 test" ||
    fail "cifar10-python protocol $protocol"
  "$tool" convert cifar10 "cifar_$protocol" binary.h5 >/dev/null
  "$python" "$sources" same-h5 python.h5 binary.h5 >/dev/null ||
    fail "cifar10-python (protocol $protocol) and cifar10 binary differ"
  rm -f python.h5 binary.h5
done
# The folder itself, not its parent
"$tool" convert cifar10-python cifar_4/cifar-10-batches-py python.h5 >/dev/null
rm -f python.h5
echo "cifar10-python: protocols py2, 2, 4, 5 equal the binary converter's output"

# --- cifar10-python refusals
while IFS='|' read -r case text; do
  rm -rf bad_cifar
  "$python" "$sources" bad-pickle "$case" bad_cifar
  expect_refused 3 "$text" "$tool" convert cifar10-python bad_cifar out.h5
done <<'CASES'
global|cifar-10-batches-py/data_batch_2: pickle global posix.system is not one this reader allows
opcode|cifar-10-batches-py/data_batch_3: pickle opcode 0x47 ('G') is not one this reader handles
truncated|cifar-10-batches-py/test_batch: truncated pickle
float-data|cifar-10-batches-py/data_batch_1: 'data' has dtype 'f4', expected uint8
no-labels|cifar-10-batches-py/data_batch_4: no 'labels' in its dict
n-mismatch|cifar-10-batches-py/data_batch_5: 'data' has 8 images but 'labels' has 7 labels
label-range|cifar-10-batches-py/test_batch: label[7] = 10 is outside [0, 10)
CASES
rm -rf bad_cifar && "$python" "$sources" cifar bad_cifar 4 --per-batch 2 && rm bad_cifar/cifar-10-batches-py/batches.meta
expect_refused 3 "batches.meta: no such file" "$tool" convert cifar10-python bad_cifar out.h5
echo "cifar10-python: 8 refusals, exit 3"
echo "PASS"
