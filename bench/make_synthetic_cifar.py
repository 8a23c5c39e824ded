"""Writes a CIFAR-shaped (3x32x32, 10 classes) dataset in hpc_train's HDF5 layout with random
pixels, for throughput benchmarks where the real CIFAR-10 archive is not at hand; or, with SIDE
224, ImageNet-sized images (still 10 classes: the step's cost is the network's, not the head's).
    python3 make_synthetic_cifar.py OUT.h5 [TRAIN_SAMPLES] [SIDE] [TEST_SAMPLES]"""
import sys

import h5py
import numpy as np

out, n = sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 50000
side = int(sys.argv[3]) if len(sys.argv) > 3 else 32
test_n = int(sys.argv[4]) if len(sys.argv) > 4 else 10000
rng = np.random.default_rng(0)
with h5py.File(out, "w") as f:
    for split, count in (("train", n), ("test", test_n)):
        g = f.create_group(split)
        g.create_dataset("images", data=rng.integers(0, 256, (count, 3, side, side), dtype=np.uint8),
                         chunks=(16, 3, side, side))
        g.create_dataset("labels", data=rng.integers(0, 10, count, dtype=np.int64))
    f.attrs["num_classes"] = np.int64(10)
    f.attrs["class_names"] = np.array([f"class{i}" for i in range(10)], dtype=h5py.string_dtype())
    for key, value in (("channels", 3), ("height", side), ("width", side), ("format_version", 1)):
        f.attrs[key] = np.int64(value)
    f.attrs["mean"] = np.full(3, 0.5, dtype=np.float32)
    f.attrs["std"] = np.full(3, 0.29, dtype=np.float32)
    f.attrs["source"] = "synthetic random pixels (bench/make_synthetic_cifar.py)"
