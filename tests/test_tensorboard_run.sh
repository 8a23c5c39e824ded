#!/usr/bin/env bash
# A real short run's monitor files, read back by an independent reader
# (tests/support/read_tfevents.py: its own CRC-32C, protobuf messages from a descriptor): the
# TensorBoard events and the CSV monitor's files hold the tags of Note [Monitor tags] at the
# steps (samples seen) and values of metrics.jsonl. Then a ds_config.json with tensorboard and
# csv_monitor blocks (output_path, job_name) and a wandb block: wandb is a warning naming it, the
# run goes on, and the files are where the blocks say.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/support/script_test.sh"
reader="$HPC_TRAIN_SOURCE_DIR/tests/support/read_tfevents.py"
python=$(python_with google.protobuf) ||
  skip "no Python with google.protobuf (apt-get install python3-protobuf)"
source_dir=${HPC_TRAIN_FASHION_MNIST_DIR:-/usr/share/datasets/fashion-mnist}
"$HPC_TRAIN_DATA" convert fashion-mnist "$source_dir" small.h5 --max-train 600 --max-test 200 > /dev/null

# 2 ranks x micro-batch 16: 19 steps an epoch, 2 epochs, a log line every 5 steps.
timeout 250 "$MPIEXEC" -np 2 --oversubscribe "$HPC_TRAIN" --dataset small.h5 --epochs 2 \
  --micro-batch 16 --log-every 5 --run-dir run --csv-monitor on | tee train.out
grep -q "TensorBoard events: run/tensorboard/events.out.tfevents." train.out
"$python" "$reader" events run run/tensorboard
"$python" "$reader" csv run run/csv_monitor

# DeepSpeed's blocks.
cat > ds.json <<'JSON'
{"train_micro_batch_size_per_gpu": 16, "gradient_accumulation_steps": "auto",
 "tensorboard": {"enabled": true, "output_path": "monitors", "job_name": "tb_job"},
 "csv_monitor": {"enabled": true, "output_path": "monitors", "job_name": "csv_job"},
 "wandb": {"enabled": true, "project": "hpc"}}
JSON
timeout 250 "$MPIEXEC" -np 2 --oversubscribe "$HPC_TRAIN" --dataset small.h5 --epochs 1 \
  --max-steps 6 --log-every 3 --run-dir run-ds --deepspeed-config ds.json > ds.out 2> ds.err
cat ds.err
grep -q "'wandb' is not implemented by hpc_train and is ignored" ds.err
grep -q "'gradient_accumulation_steps' is \"auto\": --grad-accum 1" ds.err
[ ! -e run-ds/tensorboard ] || { echo "run-ds/tensorboard written although output_path says monitors"; exit 1; }
"$python" "$reader" events run-ds monitors/tb_job
"$python" "$reader" csv run-ds monitors/csv_job

# --tensorboard off writes none.
timeout 250 "$MPIEXEC" -np 1 "$HPC_TRAIN" --dataset small.h5 --epochs 1 --max-steps 2 \
  --run-dir run-off --tensorboard off > off.out
[ ! -e run-off/tensorboard ] || { echo "--tensorboard off wrote run-off/tensorboard"; exit 1; }
# A folder that cannot be made stops the job before training: exit 2, naming the options.
set +e
timeout 250 "$MPIEXEC" -np 2 --oversubscribe "$HPC_TRAIN" --dataset small.h5 --epochs 1 \
  --max-steps 2 --run-dir run-bad --tensorboard-output-path small.h5 > bad.out 2> bad.err
rc=$?
set -e
grep -q -- "--tensorboard-output-path/--tensorboard-job-name small.h5/tensorboard: cannot create" bad.err \
  && [ "$rc" -eq 2 ] || { echo "uncreatable TensorBoard folder: exit $rc"; cat bad.err; exit 1; }
[ ! -e run-bad/metrics.jsonl ] || { echo "run-bad trained although its TensorBoard folder failed"; exit 1; }
echo "tensorboard run passed"
