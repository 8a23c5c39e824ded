"""Writes a CIFAR-shaped (3x32x32, 10 classes) dataset in hpc_train's HDF5 layout with random
pixels, for throughput benchmarks where the real CIFAR-10 archive is not at hand.
    python3 make_synthetic_cifar.py OUT.h5 [TRAIN_SAMPLES]"""
import sys

import h5py
import numpy as np

out, n = sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 50000
rng = np.random.default_rng(0)
with h5py.File(out, "w") as f:
    for split, count in (("train", n), ("test", 10000)):
        g = f.create_group(split)
        g.create_dataset("images", data=rng.integers(0, 256, (count, 3, 32, 32), dtype=np.uint8),
                         chunks=(16, 3, 32, 32))
        g.create_dataset("labels", data=rng.integers(0, 10, count, dtype=np.int64))
    f.attrs["num_classes"] = np.int64(10)
    f.attrs["class_names"] = np.array([f"class{i}" for i in range(10)], dtype=h5py.string_dtype())
    for key, value in (("channels", 3), ("height", 32), ("width", 32), ("format_version", 1)):
        f.attrs[key] = np.int64(value)
    f.attrs["mean"] = np.full(3, 0.5, dtype=np.float32)
    f.attrs["std"] = np.full(3, 0.29, dtype=np.float32)
    f.attrs["source"] = "synthetic random pixels (bench/make_synthetic_cifar.py)"
