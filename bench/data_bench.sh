#!/usr/bin/env bash
# The streaming data path on a dataset larger than memory (CPU machine, no GPU needed): a
# synthetic ImageNet-shaped dataset (3x224x224 uint8, random pixels, written a chunk at a time by
# write_synthetic_dataset) of 1.5x the machine's RAM, trained on by 3 ranks for a fixed number of
# steps with the cheapest model there is (write_pooled_linear_model: the channel means through one
# linear layer), so that reading samples sets the pace. Per rank:
#   samples/s and MB/s delivered, bytes read from storage per byte delivered (the kernel's
#   read_bytes of the rank's process; target <= 1.1: a cold sample costs its pages), and the
#   delivered MB/s (all ranks) as a fraction of the disk's sequential read bandwidth, measured
#   in the same run with dd iflag=direct over 2 GiB of the file.
# The page cache must not make the numbers lie: the file is larger than memory, the caches are
# dropped before each measurement (as root; otherwise the script says so), and the libraries are
# loaded once before each run so that their pages are not counted. The two runs read the same
# samples (same seed): on a virtual disk that the host caches, the second one may be served
# faster from below the guest, so compare their bytes read; their rates only in both orders.
#   bench/data_bench.sh BUILD_DIR [BASELINE_BUILD_DIR]
# BASELINE_BUILD_DIR: a build (its hpc_train) of the version to compare with; both are run on the
# same file. SIZE_GB (default 1.5 x RAM) sets the dataset's size, STEPS (300) and MICRO_BATCH (32)
# the run, WORK_DIR (bench-data-work) where the file goes, KEEP=1 keeps it afterwards.
# READER_THREADS="1 4 8" runs BUILD_DIR's hpc_train once per count of --reader-threads (rows
# this-r1, this-r4, ...; Note [Reads in flight]); unset, once with its default. Then the reads
# alone, without training, per count (rows reads-r1, ...; below).
# Then the read-once store (--data-store memory) against the file on a dataset that fits in
# memory: data_store_bench.sh (DATA_STORE=0 leaves it out).
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
build=$(cd "$1" && pwd)
baseline=${2:+$(cd "$2" && pwd)}
work=${WORK_DIR:-bench-data-work}
steps=${STEPS:-300}; micro_batch=${MICRO_BATCH:-32}; ranks=3
sample_bytes=$((3 * 224 * 224))
ram_bytes=$(free -b | awk '/^Mem:/ {print $2}')
size_bytes=$(python3 -c "import sys; print(int(float(sys.argv[1]) * 1e9) if sys.argv[1] else $ram_bytes * 3 // 2)" "${SIZE_GB:-}")
samples=$((size_bytes / sample_bytes))
mkdir -p "$work" && cd "$work"
free_bytes=$(df -B1 --output=avail . | tail -1)
[ "$free_bytes" -gt $((size_bytes + (1 << 30))) ] || {
  echo "data_bench.sh: $size_bytes bytes do not fit in $(pwd) ($free_bytes free)" >&2; exit 1; }
cleanup() { [ "${KEEP:-0}" = 1 ] || rm -f "$(pwd)/imagenet_shaped.h5"; }
trap cleanup EXIT

drop_caches() {  # the page cache emptied, where this user may
  sync
  if [ -w /proc/sys/vm/drop_caches ]; then echo 3 > /proc/sys/vm/drop_caches; return 0; fi
  echo "note: cannot drop the page cache (not root): only the file's size keeps it cold"
}

echo "dataset: $samples samples of 3x224x224 ($((size_bytes / 1000000000)) GB; RAM $((ram_bytes / 1000000000)) GB)"
[ -f imagenet_shaped.h5 ] || { time "$build/write_synthetic_dataset" imagenet_shaped.h5 "$samples"; }
"$build/write_pooled_linear_model" pooled_linear.pt 3 10

drop_caches
disk_mb_s=$(dd if=imagenet_shaped.h5 of=/dev/null bs=16M count=128 skip=$((samples * sample_bytes / 2 / (16 << 20))) \
            iflag=direct 2>&1 | python3 -c "import re, sys; m = re.search(r'(\d+) bytes .* copied, ([0-9.]+) s', sys.stdin.read()); print('%.0f' % (int(m[1]) / float(m[2]) / 1e6))")
echo "disk sequential read (dd iflag=direct, 2 GiB from the file's middle): $disk_mb_s MB/s"

# One rank's process: hpc_train as a child, then its read_bytes (getrusage's blocks in of the
# reaped child, 512 bytes each) into reads.<rank>.
cat > rank_reads.py <<'PY'
import os, resource, subprocess, sys
code = subprocess.call(sys.argv[1:])
with open("reads.%s" % os.environ.get("OMPI_COMM_WORLD_RANK", "0"), "w") as out:
    out.write("%d\n" % (resource.getrusage(resource.RUSAGE_CHILDREN).ru_inblock * 512))
sys.exit(code)
PY

run() {  # NAME HPC_TRAIN [OPTION...]: one measured run, its table rows
  local name=$1 hpc_train=$2
  shift 2
  rm -rf "run-$name" reads.*
  drop_caches
  "$hpc_train" --version > /dev/null  # the libraries' pages in memory before the measurement
  mpirun --oversubscribe -np $ranks python3 rank_reads.py "$hpc_train" --dataset imagenet_shaped.h5 \
    --model pooled_linear.pt --augment off --epochs 1 --max-steps "$steps" --micro-batch "$micro_batch" \
    --log-every 100 --run-dir "run-$name" "$@" > "run-$name.log" 2>&1 ||
    { echo "hpc_train failed ($name):"; tail -5 "run-$name.log"; return 1; }
  python3 - "$name" "$steps" "$micro_batch" "$sample_bytes" "$disk_mb_s" "$ranks" <<'PY'
import json, sys
name, steps, micro_batch, sample_bytes, disk_mb_s, ranks = sys.argv[1], *map(float, sys.argv[2:])
summary = json.load(open("run-%s/summary.json" % name))
delivered_bytes = steps * micro_batch * sample_bytes  # per rank
rank_samples_per_s = summary["samples_per_s"] / ranks  # the slowest rank sets every rank's pace
rank_mb_s = rank_samples_per_s * sample_bytes / 1e6
for rank in range(int(ranks)):
    read_bytes = int(open("reads.%d" % rank).read())
    print("%-9s %4d %10.1f %8.1f %14.3f %14.3f" % (name, rank, rank_samples_per_s, rank_mb_s,
          read_bytes / delivered_bytes, rank_mb_s * ranks / disk_mb_s))
PY
}

echo
echo "$ranks ranks, $steps steps of $micro_batch samples each; read/delivered: storage bytes per"
echo "sample byte; delivered/disk: all ranks' MB/s over the disk's sequential MB/s"
printf "%-9s %4s %10s %8s %14s %14s\n" build rank samples/s MB/s read/delivered delivered/disk
[ -z "$baseline" ] || run baseline "$baseline/hpc_train"
if [ -z "${READER_THREADS:-}" ]; then
  run this "$build/hpc_train"
else
  for threads in $READER_THREADS; do run "this-r$threads" "$build/hpc_train" --reader-threads "$threads"; done
fi

# The reads alone (read_samples_bench: the trainer's loader, no model; on 2 cores hpc_train is
# bound by the CPU before the disk), per count of READER_THREADS (default 1 and 8; 1 reads one
# after another as before Note [Reads in flight]), each run on another epoch's samples so that a
# run does not read what the one before it pulled through the host's cache.
echo
echo "reads alone: $steps batches of $micro_batch a rank through the loader, no training"
printf "%-9s %4s %10s %8s %14s %14s\n" build rank samples/s MB/s read/delivered delivered/disk
epoch=1
for threads in ${READER_THREADS:-1 8}; do
  drop_caches
  mpirun --oversubscribe -np $ranks "$build/read_samples_bench" imagenet_shaped.h5 "$threads" \
    "$steps" "$micro_batch" "$epoch" > "reads-r$threads.log" 2>&1 ||
    { echo "read_samples_bench failed (r$threads):"; tail -5 "reads-r$threads.log"; exit 1; }
  python3 - "reads-r$threads" "$ranks" "$disk_mb_s" <<'PY'
import re, sys
name, ranks, disk_mb_s = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
rows = sorted(re.findall(r"rank (\d+) samples/s ([0-9.]+) MB/s ([0-9.]+) storage_read_bytes (-?\d+) "
                         r"delivered_bytes (\d+)", open(name + ".log").read()), key=lambda row: int(row[0]))
for rank, samples_per_s, mb_s, read_bytes, delivered_bytes in rows:
    print("%-9s %4d %10.1f %8.1f %14.3f %14.3f" % (name, int(rank), float(samples_per_s), float(mb_s),
          int(read_bytes) / int(delivered_bytes), float(mb_s) * ranks / disk_mb_s))
PY
  epoch=$((epoch + 1))
done

if [ "${DATA_STORE:-1}" = 1 ]; then
  echo
  "$here/data_store_bench.sh" "$build"
fi
