#!/usr/bin/env python3
"""Image trees for test_convert_imagefolder.sh (PIL and h5py), and the checks of the converted
files against PIL's own decode and resize.

  image_folder.py make ROOT split|tree      a tree of JPEG and PNG files (RGB, L, RGBA, P, LA,
                                            CMYK, 1-bit; sizes from 7x5 to 97x64)
  image_folder.py check OUT.h5 ROOT HxW     split layout: order, labels, classes and pixels
  image_folder.py check-tree OUT.h5 ROOT HxW FRACTION
                                            tree layout: every image once, in its class; the
                                            test share of each class; pixels
  image_folder.py same A.h5 B.h5            the same datasets and attributes
  image_folder.py same-but-source A.h5 B.h5 the same but for the source attribute
  image_folder.py differ-split A.h5 B.h5    the same images, split differently

The resize rule is the converter's (image_folder.h): scale to the smallest size that covers HxW
(sides rounded half up), PIL's BILINEAR, then the centre crop (offsets rounded down).
"""
import os
import sys

import h5py
import numpy as np
from PIL import Image

CLASSES = ["cat", "dog", "zebra_finch"]  # sorted: labels 0, 1, 2
# The tolerance of a decoded, resized image against PIL's: the converter does PIL's fixed-point
# bilinear, so the pixels are expected equal; libjpeg-turbo builds may differ by a level or so in
# the IDCT, which this bound allows.
MAX_MEAN_ABS_DIFF = 1.0
MAX_ABS_DIFF = 8


def picture(width, height, seed):
    """Smooth gradients plus noise: resizing it averages different values."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width]
    base = np.stack([(x * 255 // max(1, width - 1)), (y * 255 // max(1, height - 1)),
                     ((x + y) * 7) % 256], axis=-1)
    noise = rng.integers(-30, 31, size=base.shape)
    return np.clip(base + noise, 0, 255).astype(np.uint8)


def save(path, index, seed):
    """One of several kinds of file, chosen by `index`."""
    sizes = [(40, 30), (30, 40), (97, 64), (16, 16), (7, 5), (64, 97), (33, 33), (50, 21)]
    width, height = sizes[index % len(sizes)]
    rgb = Image.fromarray(picture(width, height, seed), "RGB")
    kind = index % 8
    if kind == 0:
        rgb.save(path + ".jpg", quality=90)
    elif kind == 1:
        rgb.convert("L").save(path + ".jpeg", quality=85)
    elif kind == 2:
        rgb.save(path + ".png")
    elif kind == 3:
        rgba = rgb.copy()
        rgba.putalpha(Image.fromarray(picture(width, height, seed + 1)[:, :, 0]))
        rgba.save(path + ".png")
    elif kind == 4:
        rgb.convert("P", palette=Image.ADAPTIVE, colors=16).save(path + ".png")
    elif kind == 5:
        rgb.convert("LA").save(path + ".PNG")
    elif kind == 6:
        rgb.convert("CMYK").save(path + ".jpg", quality=95)
    else:
        rgb.convert("1").save(path + ".png")


def make(root, layout):
    counts = {"cat": 9, "dog": 7, "zebra_finch": 8}
    index = 0
    for split in (["train", "val"] if layout == "split" else [""]):
        for name in CLASSES:
            folder = os.path.join(root, split, name)
            os.makedirs(folder, exist_ok=True)
            n = counts[name] if split != "val" else 3
            for i in range(n):
                # One image a class in a subfolder: found recursively.
                where = os.path.join(folder, "nested") if i == 1 else folder
                os.makedirs(where, exist_ok=True)
                save(os.path.join(where, f"img_{i:02d}"), index, seed=index)
                index += 1
            # Not images: ignored.
            with open(os.path.join(folder, "notes.txt"), "w") as f:
                f.write("not an image\n")
            os.makedirs(os.path.join(folder, ".hidden"), exist_ok=True)
            save(os.path.join(folder, ".hidden", "ignored"), 0, seed=99)


def image_files(folder):
    paths = []
    for base, dirs, files in os.walk(folder, followlinks=True):
        dirs[:] = [d for d in dirs if not d.startswith(".")]
        for f in files:
            if not f.startswith(".") and os.path.splitext(f)[1].lower() in (".jpg", ".jpeg", ".png"):
                paths.append(os.path.join(base, f))
    # The converter sorts whole path strings bytewise.
    return sorted(paths, key=lambda p: p.encode())


def expected_pixels(path, height, width):
    image = Image.open(path).convert("RGB")
    w, h = image.size
    if width * h >= height * w:
        sw, sh = width, max(height, (2 * h * width + w) // (2 * w))
    else:
        sw, sh = max(width, (2 * w * height + h) // (2 * h)), height
    resized = image.resize((sw, sh), Image.BILINEAR)
    left, top = (sw - width) // 2, (sh - height) // 2
    cropped = resized.crop((left, top, left + width, top + height))
    return np.asarray(cropped, dtype=np.uint8).transpose(2, 0, 1)


def compare(images, paths, height, width, stats):
    for stored, path in zip(images, paths):
        diff = np.abs(stored.astype(int) - expected_pixels(path, height, width).astype(int))
        stats["images"] += 1
        stats["max"] = max(stats["max"], int(diff.max()))
        stats["worst_mean"] = max(stats["worst_mean"], float(diff.mean()))
        stats["sum"] += float(diff.mean())
        if diff.mean() >= MAX_MEAN_ABS_DIFF or diff.max() > MAX_ABS_DIFF:
            sys.exit(f"{path}: mean abs diff {diff.mean():.3f}, max {diff.max()} against PIL")


def report(stats):
    print(f"pixels: {stats['images']} images against PIL: mean abs diff "
          f"{stats['sum'] / stats['images']:.4f} (worst image {stats['worst_mean']:.4f}, "
          f"bound {MAX_MEAN_ABS_DIFF}), max abs diff {stats['max']} (bound {MAX_ABS_DIFF})")



def check(out, root, size):
    height, width = map(int, size.split("x"))
    stats = {"images": 0, "max": 0, "worst_mean": 0.0, "sum": 0.0}
    with h5py.File(out, "r") as f:
        names = [n.decode() if isinstance(n, bytes) else n for n in f.attrs["class_names"]]
        assert names == CLASSES, names
        assert int(f.attrs["num_classes"]) == 3 and int(f.attrs["channels"]) == 3
        assert (int(f.attrs["height"]), int(f.attrs["width"])) == (height, width)
        for split, folder in (("train", "train"), ("test", "val")):
            paths, labels = [], []
            for label, name in enumerate(CLASSES):
                found = image_files(os.path.join(root, folder, name))
                paths += found
                labels += [label] * len(found)
            stored_labels = f[split + "/labels"][:]
            assert stored_labels.tolist() == labels, (split, stored_labels.tolist(), labels)
            images = f[split + "/images"][:]
            assert images.shape == (len(paths), 3, height, width), images.shape
            compare(images, paths, height, width, stats)
    print(f"labels: classes {names}, labels by sorted folder name")
    report(stats)


def check_tree(out, root, size, fraction):
    height, width = map(int, size.split("x"))
    fraction = float(fraction)
    stats = {"images": 0, "max": 0, "worst_mean": 0.0, "sum": 0.0}
    with h5py.File(out, "r") as f:
        by_split = {s: (f[s + "/images"][:], f[s + "/labels"][:]) for s in ("train", "test")}
    for label, name in enumerate(CLASSES):
        paths = image_files(os.path.join(root, name))
        expected = {p: expected_pixels(p, height, width) for p in paths}
        counts = {}
        for split, (images, labels) in by_split.items():
            mine = images[labels == label]
            counts[split] = len(mine)
            for image in mine:  # each stored image is one of the class's files
                diffs = {p: np.abs(image.astype(int) - e.astype(int)).mean()
                         for p, e in expected.items()}
                best = min(diffs, key=diffs.get)
                compare([image], [best], height, width, stats)
                del expected[best]
        assert not expected, f"{name}: not stored: {sorted(expected)}"
        want_test = min(len(paths) - 1, int(np.floor(fraction * len(paths) + 0.5)))
        assert counts["test"] == want_test, (name, counts, want_test)
    print("tree: every image once, in its class; test share per class as rounded")
    report(stats)


def datasets(path):
    with h5py.File(path, "r") as f:
        data = {k: f[k][:] for k in ("train/images", "train/labels", "test/images", "test/labels")}
        attrs = {k: (v.tolist() if hasattr(v, "tolist") else v) for k, v in f.attrs.items()}
    return data, attrs


def same(a, b, except_source=False):
    (da, aa), (db, ab) = datasets(a), datasets(b)
    for k in da:
        assert np.array_equal(da[k], db[k]), f"{k} differs between {a} and {b}"
    assert aa.keys() == ab.keys(), (aa.keys(), ab.keys())
    for k in aa:
        if not (except_source and k == "source"):
            assert str(aa[k]) == str(ab[k]), (k, aa[k], ab[k])
    print(f"same: {a} and {b} hold equal datasets and attributes "
          f"({len(da['train/labels'])} train, {len(da['test/labels'])} test)")


def differ_split(a, b):
    (da, _), (db, _) = datasets(a), datasets(b)
    assert len(da["test/labels"]) == len(db["test/labels"])
    assert not np.array_equal(da["test/images"], db["test/images"]), "the same split"
    print(f"differ-split: {a} and {b} split differently")


if __name__ == "__main__":
    command, args = sys.argv[1], sys.argv[2:]
    {"make": make, "check": check, "check-tree": check_tree, "same": same,
     "same-but-source": lambda a, b: same(a, b, except_source=True),
     "differ-split": differ_split}[command](*args)
