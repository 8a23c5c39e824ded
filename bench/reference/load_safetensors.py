"""Load weights that hpc_train exported (--export-weights, `hpc_train_data export`) into the
PyTorch definition of the same network (models.py), strictly, and optionally evaluate them on
the test split of an hpc_train HDF5 dataset.

    python3 bench/reference/load_safetensors.py WEIGHTS.safetensors [--dataset DATA.h5]

Needs torch and safetensors; h5py for --dataset. The evaluation normalises as hpc_train does
(pixels / 255, minus the file's per-channel mean, divided by its std), so its test loss and
accuracy are comparable with hpc_train's summary.json.
"""
import argparse
import sys

import torch
import torch.nn.functional as F
from safetensors import safe_open
from safetensors.torch import load_file

import models


def load(path):
    with safe_open(path, framework="pt") as weights:
        metadata = weights.metadata() or {}
    if metadata.get("format") != "hpc_train weights":
        sys.exit(f"{path}: not hpc_train weights "
                 f"(__metadata__ format is {metadata.get('format')!r})")
    shape = [int(metadata[key]) for key in ("channels", "height", "width", "num_classes")]
    model = models.build(metadata["model"], *shape)
    # strict: every key of the model's state_dict is in the file and nothing else is.
    model.load_state_dict(load_file(path), strict=True)
    return model.eval(), metadata


@torch.no_grad()
def evaluate(model, dataset_path, batch_size):
    import h5py

    with h5py.File(dataset_path, "r") as data:
        images, labels = data["test/images"], data["test/labels"]
        count = labels.shape[0]
        if count == 0:
            sys.exit(f"{dataset_path}: the test split is empty")
        mean = torch.tensor(data.attrs["mean"], dtype=torch.float32).view(1, -1, 1, 1)
        std = torch.tensor(data.attrs["std"], dtype=torch.float32).view(1, -1, 1, 1)
        loss_sum, correct = 0.0, 0
        for start in range(0, count, batch_size):
            x = torch.from_numpy(images[start:start + batch_size]).float()
            x = x.div_(255).sub_(mean).div_(std)
            y = torch.from_numpy(labels[start:start + batch_size]).long()
            logits = model(x)
            loss_sum += F.cross_entropy(logits, y, reduction="sum").item()
            correct += (logits.argmax(1) == y).sum().item()
    return loss_sum / count, correct, count


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("weights", help="a .safetensors file written by hpc_train")
    parser.add_argument("--dataset", help="an hpc_train HDF5 dataset: evaluate on its test split")
    parser.add_argument("--batch-size", type=int, default=256)
    args = parser.parse_args()

    model, metadata = load(args.weights)
    tensors = len(model.state_dict())
    print(f"{args.weights}: {metadata['model']} loaded strictly ({tensors} tensors, "
          f"{sum(p.numel() for p in model.parameters())} parameters)")
    if args.dataset:
        loss, correct, count = evaluate(model, args.dataset, args.batch_size)
        print(f"test loss {loss:.4f}, "
              f"test accuracy {100.0 * correct / count:.2f}% ({correct}/{count})")


if __name__ == "__main__":
    main()
