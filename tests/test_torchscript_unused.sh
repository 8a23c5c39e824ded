#!/usr/bin/env bash
# A TorchScript module with a parameter that no gradient reaches (Note [Unused parameters] in
# src/model/scripted_model.cpp), modules scripted here by Debian's python3-torch:
#   1. one whose forward never calls a layer is refused before training, at 1 and at 3 ranks:
#      exit 3 within the run's timeout (no hang), a message that names the file and both of the
#      layer's parameters; no step is logged. Before the check, such a run trained to the end
#      with exit 0;
#   2. the check runs in training mode: a parameter used only in eval mode is refused, one used
#      only in training mode trains (at 3 ranks).
# That the check's forward leaves the buffers as they were is test_torchscript's to see (a
# BatchNorm's num_batches_tracked is the step count).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/support/script_test.sh"
idx=${HPC_TRAIN_FASHION_MNIST_DIR:-/usr/share/datasets/fashion-mnist}
python=$(python_with torch) || fail "no python3 with torch: apt-get install python3-torch"

"$HPC_TRAIN_DATA" convert fashion-mnist "$idx" tiny.h5 --max-train 48 --max-test 16 >/dev/null

# torch.jit.script reads the classes' source, so they are a file of their own.
cat >modules.py <<'EOF'
import torch
from torch import nn


class Unused(nn.Module):
    """A classifier with a layer that forward never calls."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(28 * 28, 10)
        self.head = nn.Linear(10, 10)  # unused

    def forward(self, images):
        return self.fc(torch.flatten(images, 1))


class TrainingOnly(nn.Module):
    """A scale applied in training mode only."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(28 * 28, 10)
        self.scale = nn.Parameter(torch.ones(1))

    def forward(self, images):
        logits = self.fc(torch.flatten(images, 1))
        if self.training:
            logits = logits * self.scale
        return logits


class EvalOnly(TrainingOnly):
    """The scale applied in eval mode only: no gradient reaches it in training."""

    def forward(self, images):
        logits = self.fc(torch.flatten(images, 1))
        if not self.training:
            logits = logits * self.scale
        return logits


for name, module in [("unused", Unused()), ("training_only", TrainingOnly()),
                     ("eval_only", EvalOnly())]:
    torch.manual_seed(0)
    torch.jit.script(module).save(name + ".pt")
EOF
"$python" modules.py

# run NP NAME OUT [options...]: hpc_train at NP ranks on tiny.h5 with the module NAME.pt, its
# stdout and stderr in OUT.out and OUT.err, within 120 s; prints its exit status.
run() {
  local np=$1 name=$2 out=$3 status=0
  shift 3
  timeout 120 "$MPIEXEC" -np "$np" --oversubscribe "$HPC_TRAIN" --dataset tiny.h5 \
    --model "$name.pt" --run-dir "$out" --epochs 1 --micro-batch 8 --log-every 1 \
    --checkpoint-epochs off --progress lines "$@" >"$out.out" 2>"$out.err" || status=$?
  echo "$status"
}

# refused NP NAME PARAMETERS: the run stops before training with exit 3 and a message naming
# NAME.pt and PARAMETERS.
refused() {
  local np=$1 name=$2 parameters=$3 out="refused-$2-np$1" status
  status=$(run "$np" "$name" "$out")
  [[ $status != 124 ]] || fail "$name.pt at $np ranks: still running after 120 s (hung?)"
  [[ $status == 3 ]] || fail "$name.pt at $np ranks: exit $status, expected 3: $(cat "$out.err")"
  local text="$name.pt: no gradient reaches $parameters: the logits of a forward in training mode"
  grep -qF -- "$text" "$out.err" ||
    fail "$name.pt at $np ranks: no message with '$text': $(cat "$out.err")"
  grep -qF "register_buffer" "$out.err" || fail "$name.pt: the message says not what to do"
  ! grep -qF "Step [" "$out.out" || fail "$name.pt at $np ranks: trained: $(cat "$out.out")"
  echo "refused at $np rank(s): $(grep -F -- "$text" "$out.err" | head -1 | cut -c1-160)..."
}

echo "== 1. a layer that forward never calls"
refused 1 unused "parameters head.weight, head.bias"
refused 3 unused "parameters head.weight, head.bias"

echo "== 2. the check runs in training mode"
refused 1 eval_only "parameter scale"
status=$(run 3 training_only training_only --max-steps 2)
[[ $status == 0 ]] || fail "training_only.pt at 3 ranks: exit $status: $(cat training_only.err)"
echo "training_only.pt trained at 3 ranks"

echo "test_torchscript_unused: all checks passed"
