# Sourced by the job tests (test_slurm_*.sh): what every one of them needs before sbatch.
# Skips (exit 77) where Slurm is not installed; joins the test cluster of the `slurm` fixture;
# makes an empty work directory the current one; clears what would change the allocation
# (oversubscription from the test environment, variables of an enclosing Slurm job).
# Defines fail(), and slice_dataset TRAIN TEST (a Fashion-MNIST slice in slice.h5).

fail() {
  echo "FAIL: $*" >&2
  exit 1
}

work=${HPC_TRAIN_TEST_WORK:?}
if ! command -v sbatch > /dev/null; then
  echo "Slurm is not installed (apt-get install slurm-wlm munge): skipped"
  exit 77
fi
slurm_dir=${HPC_TRAIN_SLURM_DIR:?set HPC_TRAIN_SLURM_DIR to the test cluster directory}
[ -f "$slurm_dir/env.sh" ] || fail "no test cluster in $slurm_dir (the slurm_start test sets it up)"
# shellcheck source=/dev/null
source "$slurm_dir/env.sh"
rm -rf "$work" && mkdir -p "$work" && cd "$work"

# The job must fit in what Slurm allocates (3 tasks on a node that declares 4 CPUs): no
# oversubscription from the test environment. Nothing from an enclosing Slurm job either.
# sbatch exports the caller's environment (--export=ALL): the parameters, and, as root, Open
# MPI's permission to run as root.
unset OMPI_MCA_rmaps_base_oversubscribe
while read -r name; do [ "$name" = SLURM_CONF ] || unset "$name"; done < <(compgen -e SLURM_)

slice_dataset() {
  local source_dir=${HPC_TRAIN_FASHION_MNIST_DIR:-/usr/share/datasets/fashion-mnist}
  [ -f "$source_dir/train-images-idx3-ubyte.gz" ] ||
    fail "Fashion-MNIST is missing: apt-get install dataset-fashion-mnist"
  "$HPC_TRAIN_DATA" convert fashion-mnist "$source_dir" slice.h5 --max-train "$1" --max-test "$2"
}
