#!/usr/bin/env bash
# hpc_train_data inspect on damaged dataset files (issue 36): whatever is damaged, inspect ends
# with exit 1 to 3 and a message that names the file, within seconds; never with a signal (exit
# 128 + N), never hanging (the timeout's 124). A small file written here by convert (40 samples
# of 1x4x5: nine tenths of its bytes are HDF5's structures, not samples) is damaged in fixed
# places, found by what they hold, so that HDF5 versions that lay the file out otherwise are
# damaged alike:
#   1. truncated at lengths from 0 to one byte short;
#   2. the superblock: its signature, versions and sizes of addresses and lengths;
#   3. the signatures of B-tree nodes (TREE), local heaps (HEAP), symbol table nodes (SNOD) and
#      the global heap (GCOL, the class names);
#   4. the size of every 64-bit integer datatype (the labels' and the integer attributes') made
#      gigabytes: before the labels' datatype was checked, inspect allocated and cleared a
#      conversion buffer of that size per label, for minutes (or until the kernel killed it);
#   5. single bit flips at 120 places drawn with a fixed seed, and every bit of the 8 bytes
#      around the name of the root group's attribute num_classes. A flip may leave the file
#      readable (unused bytes, a label changed into another class): then inspect may succeed;
#      when it fails, the message names the file. Before, an HDF5 call that failed said what
#      failed but not in which file.
set -euo pipefail

tool=${HPC_TRAIN_DATA:?set HPC_TRAIN_DATA to the hpc_train_data executable}
source "$(dirname "${BASH_SOURCE[0]}")/support/script_test.sh"

# bytes B...: the given byte values, raw.
bytes() {
  local format
  printf -v format '\\x%02x' "$@"
  printf "$format"
}
u32() { bytes $(($1 >> 24 & 255)) $(($1 >> 16 & 255)) $(($1 >> 8 & 255)) $(($1 & 255)); }
# idx_split PREFIX N: N images of 4x5 pixels (pixel i of sample s is (37 s + 11 i) mod 256) and
# their labels ((3 s + 1) mod 10), as PREFIX-images-idx3-ubyte and PREFIX-labels-idx1-ubyte.
idx_split() {
  local prefix=$1 n=$2 s i pixels labels=()
  {
    bytes 0 0 8 3; u32 "$n"; u32 4; u32 5
    for ((s = 0; s < n; s++)); do
      pixels=()
      for ((i = 0; i < 20; i++)); do pixels+=($(((37 * s + 11 * i) % 256))); done
      bytes "${pixels[@]}"
    done
  } >"idx/$prefix-images-idx3-ubyte"
  for ((s = 0; s < n; s++)); do labels+=($(((3 * s + 1) % 10))); done
  { bytes 0 0 8 1; u32 "$n"; bytes "${labels[@]}"; } >"idx/$prefix-labels-idx1-ubyte"
}

mkdir idx
idx_split train 40
idx_split t10k 3
"$tool" convert fashion-mnist idx good.h5 >/dev/null
"$tool" inspect good.h5 >/dev/null || fail "the undamaged file does not inspect"
size=$(stat -c %s good.h5)

# offsets PATTERN: the byte offsets in good.h5 where PATTERN (a grep -P regex of bytes) starts.
offsets() { LC_ALL=C grep -obUaP "$1" good.h5 | cut -d: -f1; }
# good_bytes[OFFSET]: the value of good.h5's byte at OFFSET.
read -ra good_bytes <<<"$(od -An -tu1 -v good.h5 | tr -s ' \n' ' ')"
((${#good_bytes[@]} == size)) || fail "read ${#good_bytes[@]} of good.h5's $size bytes"
# put FILE OFFSET VALUE...: FILE's bytes from OFFSET on set to VALUE... (in place).
put() {
  local file=$1 offset=$2
  shift 2
  bytes "$@" | dd of="$file" bs=1 seek="$offset" conv=notrunc status=none
}

cases=0 refused=0 readable=0
# check NAME WHAT [may-succeed]: inspect NAME.h5 (good.h5 damaged as WHAT says). It must fail
# (unless may-succeed) with exit 1 to 3 and an error that names NAME.h5, within 30 s and 1 GiB
# of address space (inspect needs a few MB: a damaged file of 18 kB must not take the machine's
# memory, where a job's memory limit would have the kernel kill it).
check() {
  local name=$1 what=$2 may_succeed=${3:-} status=0
  cases=$((cases + 1))
  (ulimit -v 1048576 && exec timeout 30 "$tool" inspect "$name.h5") >out.txt 2>err.txt ||
    status=$?
  ((status != 124)) || fail "$what: inspect still ran after 30 s"
  ((status < 124)) || fail "$what: inspect died of signal $((status - 128)): $(cat err.txt)"
  if ((status == 0)); then
    [[ -n $may_succeed ]] || fail "$what: inspect succeeded on a damaged file: $(cat out.txt)"
    readable=$((readable + 1))
  else
    ((status <= 3)) || fail "$what: exit $status, expected 1 to 3: $(cat err.txt)"
    grep -qF "hpc_train_data: error: $name.h5: " err.txt ||
      fail "$what: the error does not name $name.h5: $(cat err.txt)"
    refused=$((refused + 1))
  fi
  rm -f "$name.h5"
}
# flip OFFSET MASK WHAT [may-succeed]: good.h5 with its byte at OFFSET xor MASK, checked.
flip() {
  cp good.h5 flipped.h5
  put flipped.h5 "$1" $((good_bytes[$1] ^ $2))
  check flipped "$3" "${4:-}"
}

echo "== 1. truncated"
for length in 0 1 8 47 96 $((size / 4)) $((size / 2)) $((size - 100)) $((size - 1)); do
  head -c "$length" good.h5 >truncated.h5
  check truncated "truncated to $length of $size bytes"
done

echo "== 2. the superblock"
# Version 0 (the converters write the oldest format): the signature (0-7), the versions of the
# superblock, free space, root symbol table and shared headers (8-12), sizes of addresses (13)
# and lengths (14).
for offset in 0 3 7 8 9 10 12 13 14; do
  flip "$offset" 255 "superblock byte $offset"
done

echo "== 3. signatures"
for signature in TREE HEAP SNOD GCOL; do
  found=$(offsets "$signature")
  [[ -n $found ]] || fail "good.h5 holds no $signature (a layout this test does not know)"
  for offset in $found; do flip "$offset" 1 "$signature at $offset"; done
done

echo "== 4. 64-bit integer datatypes of gigabytes an element"
# A datatype message of a little-endian signed 64-bit integer (version 1, class 0, signed; size
# 8; offset 0, precision 64): its size's highest byte (at +7) becomes 255.
found=$(offsets '\x10\x08\x00\x00\x08\x00\x00\x00\x00\x00\x40\x00')
(($(wc -w <<<"$found") >= 2)) || fail "good.h5 holds too few int64 datatypes: '$found'"
labels_refused=""
for offset in $found; do
  cp good.h5 wide.h5
  put wide.h5 $((offset + 7)) 255
  check wide "int64 datatype at $offset made 4 GB an element"
  labels_refused+=$(grep -oE "/(train|test)/labels has dtype" err.txt || true)
done
for split in train test; do
  [[ $labels_refused == *"/$split/labels has dtype"* ]] ||
    fail "no damaged file was refused for its /$split/labels dtype: $labels_refused"
done

echo "== 5. single bit flips"
seed=36
for ((i = 0; i < 120; i++)); do
  seed=$(((seed * 1103515245 + 12345) % 2147483648))
  offset=$((seed % size)) bit=$((seed / size % 8))
  flip "$offset" $((1 << bit)) "bit $bit of byte $offset" may-succeed
done
# The root group's attributes: the bytes before and after the name "num_classes".
names=$(offsets 'num_classes')
[[ -n $names ]] || fail "good.h5 holds no attribute num_classes"
at=$(head -1 <<<"$names")
for ((offset = at - 4; offset < at + 4; offset++)); do
  for bit in 0 1 2 3 4 5 6 7; do
    flip "$offset" $((1 << bit)) "bit $bit of byte $offset (num_classes)" may-succeed
  done
done

echo "test_inspect_damaged: $cases damaged files, $refused refused with the file named," \
  "$readable still readable; no signal, no hang"
