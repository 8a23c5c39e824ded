#!/usr/bin/env bash
# hpc_train_data export: a checkpoint made by checkpoint_writer becomes a safetensors file that a
# reader written apart from hpc_train (tests/support/check_safetensors.py) finds valid, shaped as
# simple_cnn's state_dict, with the metadata of the checkpoint and, value for value, the weights
# the helper's formula gives. A missing, foreign or truncated checkpoint ends with exit code 3
# and a message naming it, and writes nothing.
set -euo pipefail

tool=${HPC_TRAIN_DATA:?set HPC_TRAIN_DATA to the hpc_train_data executable}
writer=${CHECKPOINT_WRITER:?set CHECKPOINT_WRITER to the checkpoint_writer executable}
support=${HPC_TRAIN_SOURCE_DIR:?set HPC_TRAIN_SOURCE_DIR to the source tree}/tests/support
source "$(dirname "${BASH_SOURCE[0]}")/support/script_test.sh"

"$tool" --help | grep -qF "hpc_train_data export CHECKPOINT.h5 OUT.safetensors" || fail "--help"

"$writer" make step-00000007.h5 7 1x28x28
line=$("$tool" export step-00000007.h5 weights.safetensors)
[[ $line == "wrote weights.safetensors: 8 tensors, 6520360 bytes of weights, simple_cnn for 1x28x28 images and 10 classes, step 7" ]] ||
  fail "export printed: $line"

python3 "$support/check_safetensors.py" weights.safetensors --quiet --expect-model simple_cnn \
  --shape 1,28,28 --classes 10 --metadata "format=hpc_train weights" --metadata step=7 \
  --metadata model=simple_cnn --metadata channels=1 --metadata height=28 --metadata width=28 \
  --metadata num_classes=10 || fail "check_safetensors.py refused weights.safetensors"

# The values, from checkpoint_writer's formula: element i of tensor t at step s is
# ((7 i + 131 t + 1009 s) mod 65521) / 4.
python3 - "$support" weights.safetensors 7 <<'EOF' || fail "the exported values differ"
import array, sys
sys.path.insert(0, sys.argv[1])
import check_safetensors

path, step = sys.argv[2], int(sys.argv[3])
tensors, _ = check_safetensors.read_safetensors(path)
by_name = {tensor.name: tensor for tensor in tensors}
for t, (name, shape, _) in enumerate(check_safetensors.expected_state_dict("simple_cnn", 1, 28, 28, 10)):
    count = 1
    for dimension in shape:
        count *= dimension
    expected = array.array("f", (((7 * i + 131 * t + 1009 * step) % 65521) / 4 for i in range(count)))
    if sys.byteorder == "big":
        expected.byteswap()
    if by_name[name].data != expected.tobytes():
        sys.exit(f"{path}: {name} differs from the values of step {step}")
print(f"{path}: {len(tensors)} tensors hold the values of step {step}")
EOF

# Bad checkpoints: exit 3, a message naming the file, no output file.
expect_failure 3 "missing.h5: no such file" "$tool" export missing.h5 out.safetensors
head -c 4096 /dev/urandom >garbage.h5
expect_failure 3 "garbage.h5: not an HDF5 file" "$tool" export garbage.h5 out.safetensors
head -c "$(($(stat -c %s step-00000007.h5) / 2))" step-00000007.h5 >truncated.h5
expect_failure 3 "truncated.h5: cannot open as HDF5" "$tool" export truncated.h5 out.safetensors
grep -qF "truncated file" stderr.txt || fail "the truncated file's message lacks HDF5's reason"
[[ ! -e out.safetensors ]] || fail "a failed export left out.safetensors"
expect_failure 2 "export takes CHECKPOINT.h5 OUT.safetensors" "$tool" export step-00000007.h5

echo "test_export_tool: all checks passed"
