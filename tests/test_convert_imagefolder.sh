#!/usr/bin/env bash
# hpc_train_data convert imagefolder against image trees that PIL wrote
# (tests/support/image_folder.py: JPEG and PNG files of RGB, grayscale, RGBA, palette, LA, CMYK and
# 1-bit images of sizes 7x5 to 97x64):
#   - one process and 3 ranks (mpirun), each rank writing its images (parallel HDF5) or rank 0
#     gathering them (--rank-zero-writes), 3 ranks of which only rank 0 starts where the tree is
#     (it alone lists it), and 5 ranks for 4 images, write the same file;
#   - labels follow the sorted folder names; every pixel is compared with PIL's own decode and
#     resize (Image.resize BILINEAR to cover HxW, centre crop): mean abs diff < 1 level per image
#     and max abs diff <= 8 (the converter does PIL's fixed-point arithmetic, so 0 is expected);
#   - the --test-fraction split of one tree is the same for a seed at any rank count, differs for
#     another seed, and holds round(F x n) of each class;
#   - a file that does not decode ends with exit 3 naming it, nothing written; --skip-bad-images
#     skips and counts it; the tree and option refusals exit 3 or 2 before anything is written;
#   - hpc_train trains 2 steps on the converted file.
# In a build without libjpeg/libpng (HPC_TRAIN_IMAGE_DECODING=OFF) only the refusal is checked.
set -euo pipefail

tool=${HPC_TRAIN_DATA:?set HPC_TRAIN_DATA to the hpc_train_data executable}
helper=${HPC_TRAIN_SOURCE_DIR:?set HPC_TRAIN_SOURCE_DIR to the source tree}/tests/support/image_folder.py
mpiexec=${MPIEXEC:-mpirun}
source "$(dirname "${BASH_SOURCE[0]}")/support/script_test.sh"

if [[ ${HPC_TRAIN_IMAGE_DECODING:-ON} == OFF ]]; then
  mkdir -p tree/a tree/b
  expect_refused 2 "lacks libjpeg/libpng" "$tool" convert imagefolder tree out.h5 --size 8 \
    --test-fraction 0.5
  echo "PASS (a build without libjpeg/libpng: convert imagefolder exits 2 saying so)"
  exit 0
fi

python=""
for candidate in ${HPC_TRAIN_NUMPY_PYTHON:-} python3 /usr/bin/python3; do
  if "$candidate" -c "import numpy, h5py, PIL" 2>/dev/null; then python=$candidate; break; fi
done
[[ -n $python ]] || fail "no python3 with numpy, h5py and PIL (apt-get install python3-numpy python3-h5py python3-pil)"
ranks3=("$mpiexec" -np 3 --oversubscribe)

# --- train/ and val/: 1 and 3 ranks, labels, pixels against PIL
"$python" "$helper" make split split
"$tool" convert imagefolder split one.h5 --size 24x32 | tee summary.txt
grep -qF "wrote one.h5: 24 train, 9 test samples, 3x24x32, 3 classes (decoded on 1 rank)" summary.txt ||
  fail "convert imagefolder split (1 rank): $(cat summary.txt)"
"${ranks3[@]}" "$tool" convert imagefolder split three.h5 --size 24x32 | tee summary.txt
grep -qF "wrote three.h5: 24 train, 9 test samples, 3x24x32, 3 classes (decoded on 3 ranks)" summary.txt ||
  fail "convert imagefolder split (3 ranks): $(cat summary.txt)"
"$python" "$helper" same one.h5 three.h5
# Note [Image folder writes]: rank 0 gathering and writing (a serial HDF5's way) gives the same file
"${ranks3[@]}" "$tool" convert imagefolder split gathered.h5 --size 24x32 --rank-zero-writes >/dev/null
"$python" "$helper" same one.h5 gathered.h5
# Note [One listing of the tree]: rank 0 alone lists the tree, and the others open its files from
# rank 0's folder. Ranks 1 and 2 start in a folder without `split`, where a listing of their own
# would fail.
mkdir elsewhere
timeout 120 "$mpiexec" --oversubscribe -np 1 --wdir "$PWD" "$tool" convert imagefolder split \
  "$PWD/listed.h5" --size 24x32 : -np 2 --wdir "$PWD/elsewhere" "$tool" convert imagefolder split \
  "$PWD/listed.h5" --size 24x32 >summary.txt 2>&1 || fail "ranks in another folder: $(cat summary.txt)"
"$python" "$helper" same one.h5 listed.h5
# More ranks than some splits' images: ranks with nothing to write still join
mkdir -p tiny/a tiny/b && cp split/train/cat/img_00.jpg tiny/a/ && cp split/train/dog/*.png tiny/b/
"$tool" convert imagefolder tiny tiny1.h5 --size 8 --test-fraction 0.3 >/dev/null
"$mpiexec" -np 5 --oversubscribe "$tool" convert imagefolder tiny tiny5.h5 --size 8 --test-fraction 0.3 |
  grep -qF "3 train, 1 test samples, 3x8x8, 2 classes (decoded on 5 ranks)" || fail "5 ranks, 4 images"
"$python" "$helper" same tiny1.h5 tiny5.h5
"$python" "$helper" check one.h5 split 24x32
# A square size, enlarging the 7x5 and 16x16 images
"$tool" convert imagefolder split big.h5 --size 48 >/dev/null
"$python" "$helper" check big.h5 split 48x48

# --- one tree, --test-fraction: deterministic for a seed, at any rank count
"$python" "$helper" make tree tree
"$tool" convert imagefolder tree seed7_a.h5 --size 20 --test-fraction 0.25 --seed 7 >/dev/null
"${ranks3[@]}" "$tool" convert imagefolder tree seed7_b.h5 --size 20 --test-fraction 0.25 --seed 7 \
  >/dev/null
"$tool" convert imagefolder tree seed8.h5 --size 20 --test-fraction 0.25 --seed 8 >/dev/null
"$python" "$helper" same seed7_a.h5 seed7_b.h5
"$python" "$helper" differ-split seed7_a.h5 seed8.h5
"$python" "$helper" check-tree seed7_a.h5 tree 20x20 0.25
"$tool" convert imagefolder tree none.h5 --size 20 --test-fraction 0 | grep -qF "24 train, 0 test" ||
  fail "--test-fraction 0"

# --- files that do not decode: exit 3 naming the file, or skipped and counted
cp -r split bad
head -c 400 "$(ls bad/train/dog/*.jpg | head -1)" >bad/train/dog/truncated.jpg
head -c 100 "$(ls bad/train/zebra_finch/*.png | head -1)" >bad/train/zebra_finch/truncated.png
echo "not an image" >bad/val/cat/text.png
expect_refused 3 "bad/train/dog/truncated.jpg: corrupt or unsupported JPEG: Premature end of JPEG file" \
  "$tool" convert imagefolder bad out.h5 --size 16
expect_refused 3 "bad/train/zebra_finch/truncated.png: corrupt or unsupported PNG" \
  "${ranks3[@]}" "$tool" convert imagefolder bad out.h5 --size 16
expect_refused 3 "bad/train/dog/truncated.jpg: corrupt or unsupported JPEG" \
  "${ranks3[@]}" "$tool" convert imagefolder bad out.h5 --size 16 --rank-zero-writes
grep -qF -- "--skip-bad-images skips files that do not decode" stderr.txt || fail "no hint"
"${ranks3[@]}" "$tool" convert imagefolder bad skipped.h5 --size 16 --skip-bad-images \
  >summary.txt 2>stderr.txt
grep -qF "24 train, 9 test samples, 3x16x16, 3 classes, 3 bad images skipped" summary.txt ||
  fail "--skip-bad-images: $(cat summary.txt)"
for f in bad/train/dog/truncated.jpg bad/train/zebra_finch/truncated.png bad/val/cat/text.png; do
  grep -qF "skipped $f: " stderr.txt || fail "--skip-bad-images did not report $f"
done
"$tool" convert imagefolder split plain16.h5 --size 16 >/dev/null
"$python" "$helper" same-but-source plain16.h5 skipped.h5 >/dev/null ||
  fail "--skip-bad-images: the file differs from the tree without the bad files"
"${ranks3[@]}" "$tool" convert imagefolder bad skipped_gathered.h5 --size 16 --skip-bad-images \
  --rank-zero-writes 2>/dev/null | grep -qF "3 bad images skipped" || fail "--rank-zero-writes skips"
"$python" "$helper" same skipped.h5 skipped_gathered.h5 >/dev/null || fail "skipped, gathered"
# A decompression bomb: a PNG header of 20000x20000 pixels, over the 16384x16384 limit
"$python" - <<'PY'
import os, struct, zlib
def chunk(kind, data):
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))
os.makedirs("bomb/a", exist_ok=True); os.makedirs("bomb/b", exist_ok=True)
ihdr = struct.pack(">IIBBBBB", 20000, 20000, 8, 2, 0, 0, 0)
png = b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(b"\0" * 64)) + chunk(b"IEND", b"")
for d in ("a", "b"):
    open(f"bomb/{d}/huge.png", "wb").write(png)
PY
expect_refused 3 "bomb/a/huge.png: a PNG of 20000x20000 pixels is over the limit of 268435456 pixels" \
  "$tool" convert imagefolder bomb out.h5 --size 16 --test-fraction 0.5
echo "bad images: exit 3 naming the file (1 and 3 ranks); --skip-bad-images skipped and counted 3; a 20000x20000 PNG refused"

# --- refusals of the tree and of options, before anything is written
mkdir -p empty_class/a empty_class/b && cp tree/cat/img_00.jpg empty_class/a/
expect_refused 3 "empty_class/b: no .jpg, .jpeg or .png files (an empty class)" \
  "$tool" convert imagefolder empty_class out.h5 --size 16 --test-fraction 0.5
mkdir -p no_classes && touch no_classes/readme.txt
expect_refused 3 "no_classes: no class folders" \
  "$tool" convert imagefolder no_classes out.h5 --size 16 --test-fraction 0.5
mkdir -p one_class/a && cp tree/cat/img_00.jpg one_class/a/
expect_refused 3 "one class folder ('a'); a classifier needs at least 2" \
  "$tool" convert imagefolder one_class out.h5 --size 16 --test-fraction 0.5
cp -r split mismatched && mv mismatched/val/dog mismatched/val/wolf
expect_refused 3 "class 'dog' is in mismatched/train but not in mismatched/val" \
  "${ranks3[@]}" "$tool" convert imagefolder mismatched out.h5 --size 16
mkdir -p no_val && cp -r split/train no_val/
expect_refused 3 "no_val: has train/ but no val/" "$tool" convert imagefolder no_val out.h5 --size 16
expect_refused 3 "missing: no such directory" "$tool" convert imagefolder missing out.h5 --size 16
expect_refused 3 "cannot write nowhere/out.h5: no such directory" \
  "$tool" convert imagefolder split nowhere/out.h5 --size 16
for size in 0x5 16x 4097 axb 16x16x16 ""; do
  expect_refused 2 "--size '$size': expected HxW" "$tool" convert imagefolder split out.h5 --size "$size"
done
expect_refused 2 "convert imagefolder needs --size HxW" "$tool" convert imagefolder split out.h5
expect_refused 2 "needs --test-fraction F" "$tool" convert imagefolder tree out.h5 --size 16
expect_refused 2 "has train/ and val/, which are the splits" \
  "${ranks3[@]}" "$tool" convert imagefolder split out.h5 --size 16 --test-fraction 0.2
expect_refused 2 "--test-fraction must be in [0, 1), got 1" \
  "$tool" convert imagefolder tree out.h5 --size 16 --test-fraction 1
expect_refused 2 "--seed chooses the --test-fraction split" \
  "$tool" convert imagefolder tree out.h5 --size 16 --seed 3
expect_refused 2 "belong to convert imagefolder" "$tool" convert cifar10 split out.h5 --size 16
expect_refused 2 "do not apply to convert imagefolder" \
  "$tool" convert imagefolder split out.h5 --size 16 --max-train 3
echo "refusals: 7 of the tree (exit 3), 13 of options (exit 2), nothing written"

# --- the converted file trains
timeout 300 "$mpiexec" -np 2 --oversubscribe "${HPC_TRAIN:?set HPC_TRAIN}" --dataset one.h5 \
  --epochs 1 --max-steps 2 --micro-batch 4 --log-every 1 --run-dir run >train.out 2>&1 ||
  fail "hpc_train on the converted file: $(tail -20 train.out)"
grep -qE '^Epoch \[1/1\], Step \[2/3\], Loss: [0-9.]+' train.out || fail "no step 2: $(cat train.out)"
echo "hpc_train: 2 steps on one.h5 ($(grep -oE 'test accuracy [0-9.]+%' train.out | tail -1))"
echo "PASS"
