#!/usr/bin/env python3
"""Source files of `hpc_train_data convert npz` and `convert cifar10-python`, written with numpy and
Python's pickle (what users have), and the checks of what the converter wrote (h5py).

  source_datasets.py npz FILE.npz LAYOUT [--compressed] [--label-dtype D] [--seed S]
      x_train, y_train, x_test, y_test; LAYOUT nhwc (N,H,W,C), nchw (N,C,H,W) or 3d (N,H,W)
  source_datasets.py check-npz FILE.npz LAYOUT OUT.h5
      OUT.h5 holds FILE.npz's images as N,C,H,W, its labels, classes 0..max, mean/std
  source_datasets.py cifar DIR PROTOCOL [--per-batch N]
      DIR/cifar-10-batches-py (pickles: PROTOCOL 2, 4, 5, or py2 = Python 2 cPickle's opcodes)
      and DIR/cifar-10-batches-bin from the same images
  source_datasets.py same-h5 A.h5 B.h5
      every dataset and attribute equal, but the source attribute
  source_datasets.py bad-npz CASE FILE.npz      one refused .npz (CASES)
  source_datasets.py bad-pickle CASE DIR        a cifar-10-batches-py with one refused pickle
  source_datasets.py fuzz-seeds DIR             seeds of fuzz/corpus/npz and cifar10_python
  source_datasets.py padded-idx SRC_DIR FILE.npz --train N --test N --side S
      the first N images of an IDX dataset (Fashion-MNIST's files in SRC_DIR, raw or .gz),
      zero-padded to SxS (N,H,W), for models that need more than 28x28 (vgg: 32x32)
"""
import argparse
import io
import os
import pickle
import struct
import sys
import zipfile

import numpy as np

CIFAR10_CLASSES = ["airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship",
                   "truck"]


def fail(message):
    print("FAIL: " + message, file=sys.stderr)
    sys.exit(1)


def npz_arrays(layout, label_dtype="int64", seed=1, n_train=40, n_test=12, c=3, h=5, w=4):
    rng = np.random.default_rng(seed)
    shape = {"nhwc": (h, w, c), "nchw": (c, h, w), "3d": (h, w)}[layout]
    arrays = {
        "x_train": rng.integers(0, 256, (n_train,) + shape, dtype=np.uint8),
        "y_train": rng.integers(0, 7, n_train).astype(label_dtype),
        "x_test": rng.integers(0, 256, (n_test,) + shape, dtype=np.uint8),
        "y_test": rng.integers(0, 7, n_test).astype(label_dtype),
    }
    arrays["y_train"][0] = 6  # the largest label: 7 classes
    return arrays


def write_npz(path, arrays, compressed):
    (np.savez_compressed if compressed else np.savez)(path, **arrays)


def nchw(x, layout):
    return {"nhwc": lambda: x.transpose(0, 3, 1, 2), "nchw": lambda: x,
            "3d": lambda: x[:, None]}[layout]()


def check_npz(path, layout, out):
    import h5py
    with np.load(path) as npz, h5py.File(out, "r") as h5:
        images = {split: nchw(npz["x_" + split], layout) for split in ("train", "test")}
        for split in ("train", "test"):
            if not np.array_equal(h5[split + "/images"][()], images[split]):
                fail(f"{out}: /{split}/images differ from {path}'s x_{split}")
            if not np.array_equal(h5[split + "/labels"][()], npz["y_" + split].astype(np.int64)):
                fail(f"{out}: /{split}/labels differ from {path}'s y_{split}")
        classes = int(max(npz["y_train"].max(), npz["y_test"].max())) + 1
        check_attributes(h5, out, classes, [str(k) for k in range(classes)], images["train"])
    print(f"{out}: equal to {path} ({layout})")


def check_attributes(h5, out, classes, names, train_images):
    if int(h5.attrs["num_classes"]) != classes:
        fail(f"{out}: num_classes {h5.attrs['num_classes']}, expected {classes}")
    got_names = [n.decode() if isinstance(n, bytes) else n for n in h5.attrs["class_names"]]
    if got_names != names:
        fail(f"{out}: class_names {got_names}, expected {names}")
    scaled = train_images.astype(np.float64) / 255.0
    mean = scaled.mean(axis=(0, 2, 3))
    std = scaled.std(axis=(0, 2, 3))
    if not (np.allclose(h5.attrs["mean"], mean, rtol=1e-5, atol=1e-6) and
            np.allclose(h5.attrs["std"], std, rtol=1e-5, atol=1e-6)):
        fail(f"{out}: mean/std {h5.attrs['mean']} {h5.attrs['std']}, expected {mean} {std}")


class Python2Pickler(pickle._Pickler):
    """Python 2 cPickle's protocol 2: a str (Python 2's bytes) is a (SHORT_)BINSTRING."""
    dispatch = pickle._Pickler.dispatch.copy()

    def save_binstring(self, obj):
        if isinstance(obj, str):
            obj = obj.encode("latin1")
        if len(obj) < 256:
            self.write(pickle.SHORT_BINSTRING + bytes([len(obj)]) + obj)
        else:
            self.write(pickle.BINSTRING + struct.pack("<i", len(obj)) + obj)
        self.memoize(obj)

    dispatch[bytes] = save_binstring
    dispatch[str] = save_binstring


def dump(obj, protocol):
    if protocol == "py2":
        out = io.BytesIO()
        Python2Pickler(out, protocol=2).dump(obj)
        return out.getvalue()
    return pickle.dumps(obj, protocol=int(protocol))


def cifar_batches(per_batch, seed=3):
    rng = np.random.default_rng(seed)
    batches = {}
    for name in [f"data_batch_{b}" for b in range(1, 6)] + ["test_batch"]:
        batches[name] = (rng.integers(0, 256, (per_batch, 3072), dtype=np.uint8),
                         [int(v) for v in rng.integers(0, 10, per_batch)])
    return batches


def cifar_pickle(name, data, labels, protocol):
    return dump({b"batch_label": name.encode(), b"labels": labels, b"data": data,
                 b"filenames": [f"img_{i}.png".encode() for i in range(len(labels))]}, protocol)


def meta_pickle(protocol, names=CIFAR10_CLASSES):
    return dump({b"num_cases_per_batch": 10000, b"label_names": [n.encode() for n in names],
                 b"num_vis": 3072}, protocol)


def write_cifar(root, protocol, per_batch):
    py_dir = os.path.join(root, "cifar-10-batches-py")
    bin_dir = os.path.join(root, "cifar-10-batches-bin")
    os.makedirs(py_dir, exist_ok=True)
    os.makedirs(bin_dir, exist_ok=True)
    for name, (data, labels) in cifar_batches(per_batch).items():
        with open(os.path.join(py_dir, name), "wb") as f:
            f.write(cifar_pickle(name, data, labels, protocol))
        records = np.concatenate([np.array(labels, np.uint8)[:, None], data], axis=1)
        with open(os.path.join(bin_dir, name + ".bin"), "wb") as f:
            f.write(records.tobytes())
    with open(os.path.join(py_dir, "batches.meta"), "wb") as f:
        f.write(meta_pickle(protocol))


def same_h5(a, b):
    import h5py
    with h5py.File(a, "r") as fa, h5py.File(b, "r") as fb:
        names = set()
        fa.visit(names.add)
        other = set()
        fb.visit(other.add)
        if names != other:
            fail(f"{a} has {sorted(names)}, {b} has {sorted(other)}")
        for name in names:
            if isinstance(fa[name], h5py.Dataset) and not np.array_equal(fa[name][()], fb[name][()]):
                fail(f"{name} differs between {a} and {b}")
        keys = set(fa.attrs) - {"source"}
        if keys != set(fb.attrs) - {"source"}:
            fail(f"the attributes differ: {sorted(fa.attrs)} / {sorted(fb.attrs)}")
        for key in keys:
            if not np.array_equal(np.asarray(fa.attrs[key]), np.asarray(fb.attrs[key])):
                fail(f"attribute {key} differs: {fa.attrs[key]} / {fb.attrs[key]}")
        print(f"{a} and {b}: {len(names)} objects and {len(keys)} attributes equal")


def replace_member(path, member, data, compress=zipfile.ZIP_STORED):
    """Rewrites `member` of the zip at `path` with `data` (bytes)."""
    with zipfile.ZipFile(path) as z:
        members = {n: z.read(n) for n in z.namelist()}
    members[member] = data
    with zipfile.ZipFile(path, "w", compress) as z:
        for name, content in members.items():
            z.writestr(name, content)


def npy_bytes(array):
    out = io.BytesIO()
    np.save(out, array)
    return out.getvalue()


def bad_npz(case, path):
    arrays = npz_arrays("nhwc")
    if case == "not-zip":
        with open(path, "wb") as f:
            f.write(b"\x93NUMPY this is an .npy, not a zip" + bytes(100))
        return
    if case == "missing-array":
        del arrays["x_test"]
    elif case == "float-images":
        arrays["x_train"] = arrays["x_train"].astype(np.float32)
    elif case == "float-labels":
        arrays["y_test"] = arrays["y_test"].astype(np.float64)
    elif case == "wrong-rank":
        arrays["x_train"] = arrays["x_train"].reshape(len(arrays["x_train"]), -1)
    elif case == "label-rank":
        arrays["y_train"] = arrays["y_train"].reshape(-1, 1)
    elif case == "n-mismatch":
        arrays["y_train"] = arrays["y_train"][:-1]
    elif case == "negative-label":
        arrays["y_test"] = arrays["y_test"].astype(np.int16)
        arrays["y_test"][3] = -2
    elif case == "shape-mismatch":
        arrays["x_test"] = arrays["x_test"][:, :4]
    elif case == "big-endian":
        arrays["y_train"] = arrays["y_train"].astype(">i4")
    if case == "fortran":
        write_npz(path, arrays, False)
        replace_member(path, "x_train.npy", npy_bytes(np.asfortranarray(arrays["x_train"])))
        return
    if case == "truncated-member":
        write_npz(path, arrays, False)
        replace_member(path, "x_train.npy", npy_bytes(arrays["x_train"])[:-10])
        return
    if case in ("truncated", "crc", "truncated-deflate", "absurd-shape", "absurd-member"):
        write_npz(path, arrays, case == "truncated-deflate")
        with open(path, "rb") as f:
            data = bytearray(f.read())
        if case == "truncated":
            data = data[: len(data) // 2]
        elif case == "crc":
            # A pixel of x_train (stored): the CRC no longer matches.
            at = data.find(b"x_train.npy") + len("x_train.npy") + 200
            data[at] ^= 0xFF
        elif case == "truncated-deflate":
            # x_train.npy alone, deflated, its stream cut in half (zero padding after it): the
            # directory's sizes and CRC are those of the whole member.
            import zlib
            content = npy_bytes(arrays["x_train"])
            compressor = zlib.compressobj(9, zlib.DEFLATED, -15)
            stream = compressor.compress(content) + compressor.flush()
            data = patch_member_deflated("x_train.npy", stream[: len(stream) // 2], content)
        elif case == "absurd-shape":
            # A .npy header of 2^62 x 4 x 4 x 3 bytes (over 2^64): the product overflows.
            header = b"{'descr': '|u1', 'fortran_order': False, 'shape': (4611686018427387904, 4, 4, 3), }"
            header = header.ljust(127 - 10) + b"\n"
            member = b"\x93NUMPY\x01\x00" + struct.pack("<H", len(header)) + header + bytes(48)
            with open(path, "wb") as f:
                f.write(data)
            replace_member(path, "x_train.npy", member)
            return
        elif case == "absurd-member":
            # x_train.npy claims to be deflated to 4 GiB in the central directory.
            name_at = data.find(b"x_train.npy", data.find(b"PK\x01\x02"))
            central = data.rfind(b"PK\x01\x02", 0, name_at)
            struct.pack_into("<H", data, central + 10, 8)  # deflated
            struct.pack_into("<I", data, central + 24, 0xFFFFFFF0)
        with open(path, "wb") as f:
            f.write(data)
        return
    write_npz(path, arrays, False)


def patch_member_deflated(member, stream, content):
    """A zip of one member deflated into `stream` (which may be cut) whose directory sizes and CRC
    are those of `content`: the only member, enough for a refusal test."""
    import zlib
    name = member.encode()
    crc = zlib.crc32(content)
    local = struct.pack("<IHHHHHIIIHH", 0x04034B50, 20, 0, 8, 0, 0, crc, len(stream) * 2,
                        len(content), len(name), 0) + name
    central = struct.pack("<IHHHHHHIIIHHHHHII", 0x02014B50, 20, 20, 0, 8, 0, 0, crc,
                          len(stream) * 2, len(content), len(name), 0, 0, 0, 0, 0, 0) + name
    body = local + stream + bytes(len(stream))  # zero padding: the stream ends early
    end = struct.pack("<IHHHHIIH", 0x06054B50, 0, 0, 1, 1, len(central), len(body), 0)
    return bytearray(body + central + end)


BAD_PICKLES = {
    # case: (file, what it holds)
    "global": "data_batch_2",
    "opcode": "data_batch_3",
    "truncated": "test_batch",
    "float-data": "data_batch_1",
    "no-labels": "data_batch_4",
    "n-mismatch": "data_batch_5",
    "label-range": "test_batch",
}


class Evil:
    def __reduce__(self):
        return (os.system, ("echo pwned",))


def bad_pickle(case, root):
    write_cifar(root, "4", 8)
    py_dir = os.path.join(root, "cifar-10-batches-py")
    name = BAD_PICKLES[case]
    data, labels = cifar_batches(8)[name]
    if case == "global":
        blob = pickle.dumps({b"data": data, b"labels": labels, b"x": Evil()}, protocol=2)
    elif case == "opcode":
        blob = pickle.dumps({b"data": data, b"labels": labels, b"x": 1.5}, protocol=4)
    elif case == "truncated":
        blob = cifar_pickle(name, data, labels, "4")
        blob = blob[: len(blob) // 2]
    elif case == "float-data":
        blob = pickle.dumps({b"data": data.astype(np.float32), b"labels": labels}, protocol=4)
    elif case == "no-labels":
        blob = pickle.dumps({b"data": data}, protocol=4)
    elif case == "n-mismatch":
        blob = pickle.dumps({b"data": data, b"labels": labels[:-1]}, protocol=4)
    elif case == "label-range":
        blob = pickle.dumps({b"data": data, b"labels": labels[:-1] + [10]}, protocol=2)
    with open(os.path.join(py_dir, name), "wb") as f:
        f.write(blob)


def fuzz_seeds(out):
    sep = b"#FILE#"  # fuzz/fuzz_support.h, Note [Several files in one input]
    npz_dir = os.path.join(out, "npz")
    os.makedirs(npz_dir, exist_ok=True)
    for layout in ("nhwc", "nchw", "3d"):
        for compressed in (False, True):
            arrays = npz_arrays(layout, "uint8" if compressed else "int64", n_train=3, n_test=2,
                                c=2, h=2, w=3)
            path = os.path.join(npz_dir, f"{layout}_{'deflated' if compressed else 'stored'}")
            write_npz(path, arrays, compressed)
            os.replace(path + ".npz", path)
    cifar_dir = os.path.join(out, "cifar10_python")
    os.makedirs(cifar_dir, exist_ok=True)
    for protocol in ("py2", "2", "4", "5"):
        parts = [cifar_pickle(name, data, labels, protocol)
                 for name, (data, labels) in cifar_batches(1).items()]
        parts.append(meta_pickle(protocol))
        with open(os.path.join(cifar_dir, f"protocol_{protocol}"), "wb") as f:
            f.write(sep.join(parts))


def read_idx(path):
    """An IDX file (raw or .gz) as a numpy array of its dimensions."""
    import gzip
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rb") as f:
        data = f.read()
    dims = data[3]
    shape = [struct.unpack(">I", data[4 + 4 * i:8 + 4 * i])[0] for i in range(dims)]
    return np.frombuffer(data, np.uint8, offset=4 + 4 * dims).reshape(shape)


def padded_idx(src, path, n_train, n_test, side):
    def load(stem, n):
        for name in (stem, stem + ".gz"):
            if os.path.exists(os.path.join(src, name)):
                return read_idx(os.path.join(src, name))[:n]
        fail(f"{src} has no {stem}[.gz]")
    arrays = {}
    for split, prefix, n in (("train", "train", n_train), ("test", "t10k", n_test)):
        images = load(f"{prefix}-images-idx3-ubyte", n)
        before = (side - images.shape[1]) // 2
        after = side - images.shape[1] - before
        arrays["x_" + split] = np.pad(images, ((0, 0), (before, after), (before, after)))
        arrays["y_" + split] = load(f"{prefix}-labels-idx1-ubyte", n).astype(np.int64)
    np.savez(path, **arrays)


def main():
    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("npz")
    p.add_argument("path")
    p.add_argument("layout", choices=["nhwc", "nchw", "3d"])
    p.add_argument("--compressed", action="store_true")
    p.add_argument("--label-dtype", default="int64")
    p = sub.add_parser("check-npz")
    p.add_argument("path")
    p.add_argument("layout", choices=["nhwc", "nchw", "3d"])
    p.add_argument("out")
    p = sub.add_parser("cifar")
    p.add_argument("root")
    p.add_argument("protocol", choices=["py2", "2", "3", "4", "5"])
    p.add_argument("--per-batch", type=int, default=50)
    p = sub.add_parser("same-h5")
    p.add_argument("a")
    p.add_argument("b")
    p = sub.add_parser("bad-npz")
    p.add_argument("case")
    p.add_argument("path")
    p = sub.add_parser("bad-pickle")
    p.add_argument("case", choices=sorted(BAD_PICKLES))
    p.add_argument("root")
    p = sub.add_parser("fuzz-seeds")
    p.add_argument("out")
    p = sub.add_parser("padded-idx")
    p.add_argument("src")
    p.add_argument("path")
    p.add_argument("--train", type=int, required=True)
    p.add_argument("--test", type=int, required=True)
    p.add_argument("--side", type=int, required=True)
    args = parser.parse_args()
    if args.command == "npz":
        write_npz(args.path, npz_arrays(args.layout, args.label_dtype), args.compressed)
    elif args.command == "check-npz":
        check_npz(args.path, args.layout, args.out)
    elif args.command == "cifar":
        write_cifar(args.root, args.protocol, args.per_batch)
    elif args.command == "same-h5":
        same_h5(args.a, args.b)
    elif args.command == "bad-npz":
        bad_npz(args.case, args.path)
    elif args.command == "bad-pickle":
        bad_pickle(args.case, args.root)
    elif args.command == "fuzz-seeds":
        fuzz_seeds(args.out)
    elif args.command == "padded-idx":
        padded_idx(args.src, args.path, args.train, args.test, args.side)


if __name__ == "__main__":
    main()
