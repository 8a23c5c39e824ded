#!/usr/bin/env python3
"""Check a safetensors file with a reader written apart from hpc_train's (Python's standard
library only: nothing to install).

    check_safetensors.py FILE                                   validate, list name dtype shape
    check_safetensors.py FILE --expect-model simple_cnn [--shape 1,28,28] [--classes 10]
                                                                names and shapes as PyTorch's
                                                                state_dict of that network
    check_safetensors.py FILE --compare OTHER.safetensors|.npz [--atol 1e-6 | --rtol 1e-6]
    check_safetensors.py FILE --metadata model=simple_cnn       a __metadata__ entry
    check_safetensors.py --list-expected resnet18 --shape 3,32,32 --classes 10

--shape and --classes default to the file's __metadata__ (channels, height, width, num_classes).
The expected names and shapes follow bench/reference/models.py (and src/model/models.cpp); keep them
in step. simple_cnn's and resnet18's are listed here; the model zoo's others come from PyTorch
(bench/reference/models.py's build(): torchvision), so they need torch and torchvision. Exit codes: 0 all checks pass, 1 a check failed, 2 usage, 3 not a valid safetensors
file (as hpc_train's own data errors).
"""
import argparse
import array
import ast
import json
import math
import pathlib
import struct
import sys
import zipfile

MAX_HEADER_BYTES = 100_000_000  # the reference implementation's limit
ELEMENT_BYTES = {"BOOL": 1, "U8": 1, "I8": 1, "F8_E5M2": 1, "F8_E4M3": 1, "I16": 2, "U16": 2,
                 "F16": 2, "BF16": 2, "I32": 4, "U32": 4, "F32": 4, "I64": 8, "U64": 8, "F64": 8}
# array typecodes by element size (checked at start-up: these sizes are the platform's)
INTEGER_CODES = {"BOOL": "B", "U8": "B", "I8": "b", "I16": "h", "U16": "H", "I32": "i",
                 "U32": "I", "I64": "q", "U64": "Q"}
NPY_DTYPES = {"|b1": "BOOL", "|u1": "U8", "|i1": "I8", "<i2": "I16", "<u2": "U16", "<f2": "F16",
              "<i4": "I32", "<u4": "U32", "<f4": "F32", "<i8": "I64", "<u8": "U64", "<f8": "F64"}


def is_count(value):
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


class BadFile(Exception):
    """The file is not a valid safetensors file."""


class Tensor:
    def __init__(self, name, dtype, shape, data):
        self.name, self.dtype, self.shape, self.data = name, dtype, list(shape), data

    def values(self):
        """The elements as Python numbers (floats for float dtypes)."""
        data = self.data
        if self.dtype in ("F32", "F64"):
            values = array.array("f" if self.dtype == "F32" else "d", data)
        elif self.dtype == "F16":
            return list(struct.unpack(f"<{len(data) // 2}e", data))
        elif self.dtype == "BF16":
            # bfloat16 is the upper half of a float32.
            halves = array.array("H", data)
            if sys.byteorder == "big":
                halves.byteswap()
            values = array.array("f", array.array("I", (h << 16 for h in halves)).tobytes())
            return list(values)
        elif self.dtype in INTEGER_CODES:
            values = array.array(INTEGER_CODES[self.dtype], data)
        else:
            raise BadFile(f"tensor {self.name!r}: cannot compare values of dtype {self.dtype}")
        if sys.byteorder == "big":
            values.byteswap()
        return list(values)


def read_safetensors(path):
    """(tensors in data order, metadata dict); raises BadFile naming what is wrong."""
    with open(path, "rb") as file:
        content = file.read()
    if len(content) < 8:
        raise BadFile(f"{len(content)} bytes, too short for a safetensors file")
    (header_bytes,) = struct.unpack("<Q", content[:8])
    if header_bytes > MAX_HEADER_BYTES:
        raise BadFile(f"header length {header_bytes} is over the format's limit")
    if 8 + header_bytes > len(content):
        raise BadFile(f"header length {header_bytes} runs past the end of the file "
                      f"({len(content)} bytes)")

    def no_duplicates(pairs):
        # json keeps the last of two equal keys silently; two tensors of one name are an error.
        seen = set()
        for key, _ in pairs:
            if key in seen:
                raise BadFile(f"the header names {key!r} twice")
            seen.add(key)
        return dict(pairs)

    try:
        header = json.loads(content[8:8 + header_bytes].decode("utf-8"),
                            object_pairs_hook=no_duplicates)
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise BadFile(f"the header is not valid JSON: {error}") from None
    if not isinstance(header, dict):
        raise BadFile("the header is not a JSON object")

    metadata = header.pop("__metadata__", {})
    if not isinstance(metadata, dict) or not all(isinstance(v, str) for v in metadata.values()):
        raise BadFile(f"__metadata__ must map strings to strings: {metadata!r}")

    data = content[8 + header_bytes:]
    entries = []
    for name, info in header.items():
        if not isinstance(info, dict) or not {"dtype", "shape", "data_offsets"} <= info.keys():
            raise BadFile(f"tensor {name!r}: needs dtype, shape and data_offsets: {info!r}")
        dtype, shape, offsets = info["dtype"], info["shape"], info["data_offsets"]
        if dtype not in ELEMENT_BYTES:
            raise BadFile(f"tensor {name!r}: unknown dtype {dtype!r}")
        if not isinstance(shape, list) or not all(is_count(d) for d in shape):
            raise BadFile(f"tensor {name!r}: bad shape {shape!r}")
        if (not isinstance(offsets, list) or len(offsets) != 2
                or not all(is_count(o) for o in offsets)):
            raise BadFile(f"tensor {name!r}: bad data_offsets {offsets!r}")
        begin, end = offsets
        if end - begin != math.prod(shape) * ELEMENT_BYTES[dtype]:
            raise BadFile(f"tensor {name!r}: {dtype} {shape} does not fill data_offsets {offsets}")
        entries.append((begin, end, name, dtype, shape))

    entries.sort()
    covered = 0
    tensors = []
    for begin, end, name, dtype, shape in entries:
        if begin != covered:
            raise BadFile(f"tensor {name!r}: data_offsets [{begin}, {end}] "
                          f"do not start at {covered}")
        covered = end
        tensors.append(Tensor(name, dtype, shape, data[begin:end]))
    if covered != len(data):
        raise BadFile(f"the tensors cover {covered} data bytes, the file has {len(data)}")
    return tensors, metadata


def read_npy(name, content):
    if content[:6] != b"\x93NUMPY":
        raise BadFile(f"{name}: not an .npy array")
    length_bytes = 2 if content[6] == 1 else 4
    (length,) = struct.unpack("<H" if length_bytes == 2 else "<I", content[8:8 + length_bytes])
    start = 8 + length_bytes
    header = ast.literal_eval(content[start:start + length].decode("latin1"))
    if header["descr"] not in NPY_DTYPES or header["fortran_order"]:
        raise BadFile(f"{name}: dtype {header['descr']} / Fortran order is not supported here")
    return NPY_DTYPES[header["descr"]], list(header["shape"]), content[start + length:]


def read_npz(path):
    tensors = []
    with zipfile.ZipFile(path) as archive:
        for member in archive.namelist():
            dtype, shape, data = read_npy(member, archive.read(member))
            name = member[:-4] if member.endswith(".npy") else member
            tensors.append(Tensor(name, dtype, shape, data))
    return tensors


def expected_state_dict(model, channels, height, width, classes):
    """[(name, shape, "float" or "I64")] in the order of PyTorch's state_dict() of the network
    in bench/reference/models.py."""
    entries = []

    def conv(prefix, cin, cout, kernel, bias):
        entries.append((f"{prefix}.weight", [cout, cin, kernel, kernel], "float"))
        if bias:
            entries.append((f"{prefix}.bias", [cout], "float"))

    def linear(prefix, fin, fout):
        entries.append((f"{prefix}.weight", [fout, fin], "float"))
        entries.append((f"{prefix}.bias", [fout], "float"))

    def batch_norm(prefix, features):
        for field in ("weight", "bias", "running_mean", "running_var"):
            entries.append((f"{prefix}.{field}", [features], "float"))
        entries.append((f"{prefix}.num_batches_tracked", [], "I64"))

    if model == "simple_cnn":
        if height < 4 or width < 4:
            raise ValueError(f"simple_cnn needs images of at least 4x4 pixels, "
                             f"not {height}x{width}")
        conv("conv1", channels, 32, 3, True)
        conv("conv2", 32, 64, 3, True)
        linear("fc1", 64 * (height // 4) * (width // 4), 512)
        linear("fc2", 512, classes)
    elif model == "resnet18":
        conv("conv1", channels, 64, 3, False)
        batch_norm("bn1", 64)
        in_channels = 64
        for layer, width_out in enumerate((64, 128, 256, 512), start=1):
            for block in (0, 1):
                stride = 2 if layer > 1 and block == 0 else 1
                block_in = in_channels if block == 0 else width_out
                prefix = f"layer{layer}.{block}"
                conv(f"{prefix}.conv1", block_in, width_out, 3, False)
                batch_norm(f"{prefix}.bn1", width_out)
                conv(f"{prefix}.conv2", width_out, width_out, 3, False)
                batch_norm(f"{prefix}.bn2", width_out)
                if stride != 1 or block_in != width_out:
                    conv(f"{prefix}.downsample.0", block_in, width_out, 1, False)
                    batch_norm(f"{prefix}.downsample.1", width_out)
            in_channels = width_out
        linear("fc", 512, classes)
    else:
        return pytorch_state_dict(model, channels, height, width, classes)
    return entries


def pytorch_state_dict(model, channels, height, width, classes):
    """expected_state_dict for the model zoo's other networks: the state_dict of
    bench/reference/models.py's build() (torchvision's networks), which needs torch and
    torchvision."""
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "bench" / "reference"))
    try:
        import torch
        import models
    except ImportError as error:
        raise ValueError(f"the names and shapes of {model!r} come from PyTorch ({error}); "
                         "install python3-torch python3-torchvision") from None
    state = models.build(model, channels, height, width, classes).state_dict()
    return [(name, list(tensor.shape), "I64" if tensor.dtype == torch.int64 else "float")
            for name, tensor in state.items()]


def model_dimensions(args, metadata):
    """(channels, height, width, classes) from the options, else from the file's metadata."""
    try:
        if args.shape:
            channels, height, width = (int(v) for v in args.shape.split(","))
        else:
            channels, height, width = (int(metadata[k]) for k in ("channels", "height", "width"))
        classes = args.classes if args.classes is not None else int(metadata["num_classes"])
    except (KeyError, ValueError):
        print("give --shape C,H,W and --classes K (the file's __metadata__ does not say them)",
              file=sys.stderr)
        sys.exit(2)
    return channels, height, width, classes


def check_model(tensors, metadata, args, problems):
    dimensions = model_dimensions(args, metadata)
    for key, value in zip(("model", "channels", "height", "width", "num_classes"),
                          (args.expect_model, *dimensions)):
        if key in metadata and metadata[key] != str(value):
            problems.append(f"__metadata__ {key} is {metadata[key]!r}, expected {str(value)!r}")
    expected = expected_state_dict(args.expect_model, *dimensions)
    by_name = {t.name: t for t in tensors}
    for name, shape, kind in expected:
        tensor = by_name.pop(name, None)
        dtype = args.float_dtype if kind == "float" else kind
        if tensor is None:
            problems.append(f"missing {name} ({dtype} {shape})")
        elif tensor.shape != shape or tensor.dtype != dtype:
            problems.append(f"{name}: {tensor.dtype} {tensor.shape}, expected {dtype} {shape}")
    for name in by_name:
        problems.append(f"unexpected {name} (not in {args.expect_model}'s state_dict)")


def relative_difference(tensors, others):
    """||a - b|| / ||b|| over every float element of both files (the norm of the whole state)."""
    theirs = {t.name: t for t in others}
    squared_difference = squared_norm = 0.0
    for a in tensors:
        b = theirs.get(a.name)
        if b is None or a.dtype not in ("F32", "F64", "F16", "BF16"):
            continue
        for x, y in zip(a.values(), b.values()):
            squared_difference += (x - y) ** 2
            squared_norm += y * y
    return math.sqrt(squared_difference / squared_norm) if squared_norm > 0 else 0.0


def check_same(tensors, others, atol, problems):
    mine = {t.name: t for t in tensors}
    theirs = {t.name: t for t in others}
    for name in sorted(mine.keys() - theirs.keys()):
        problems.append(f"{name}: only in the file")
    for name in sorted(theirs.keys() - mine.keys()):
        problems.append(f"{name}: only in the comparison file")
    for name in sorted(mine.keys() & theirs.keys()):
        a, b = mine[name], theirs[name]
        if a.shape != b.shape:
            problems.append(f"{name}: shape {a.shape} vs {b.shape}")
        elif atol is None:
            if a.dtype != b.dtype:
                problems.append(f"{name}: dtype {a.dtype} vs {b.dtype} "
                                "(give --atol to compare values)")
            elif a.data != b.data:
                index = next(i for i, (x, y) in enumerate(zip(a.values(), b.values())) if x != y)
                problems.append(f"{name}: differs first at element {index}: "
                                f"{a.values()[index]!r} vs {b.values()[index]!r}")
        else:
            worst = max((abs(x - y) for x, y in zip(a.values(), b.values())), default=0.0)
            if not worst <= atol:  # also catches NaN
                problems.append(f"{name}: largest difference {worst:g} > {atol:g}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter,
                                     epilog=__doc__.split("\n\n", 1)[1])
    parser.add_argument("file", nargs="?")
    parser.add_argument("--expect-model", metavar="NAME")
    parser.add_argument("--list-expected", metavar="NAME",
                        help="print NAME's state_dict keys and shapes")
    parser.add_argument("--shape", metavar="C,H,W")
    parser.add_argument("--classes", type=int)
    parser.add_argument("--float-dtype", default="F32", help="dtype of weights and running stats")
    parser.add_argument("--compare", metavar="OTHER", help="a .safetensors or .npz file")
    parser.add_argument("--atol", type=float, help="compare values within this; default: bytes")
    parser.add_argument("--rtol", type=float,
                        help="compare the whole state: ||file - other|| / ||other|| within this")
    parser.add_argument("--metadata", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--quiet", action="store_true", help="print only problems")
    args = parser.parse_args()

    for dtype, code in INTEGER_CODES.items():
        assert array.array(code).itemsize == ELEMENT_BYTES[dtype], "unexpected platform int sizes"

    if args.list_expected:
        dimensions = model_dimensions(args, {})
        for name, shape, kind in expected_state_dict(args.list_expected, *dimensions):
            print(name, args.float_dtype if kind == "float" else kind, shape)
        return 0
    if not args.file:
        parser.error("give a FILE (or --list-expected)")

    try:
        tensors, metadata = read_safetensors(args.file)
        others = None
        if args.compare:
            if args.compare.endswith(".npz"):
                others = read_npz(args.compare)
            else:
                others = read_safetensors(args.compare)[0]
    except (BadFile, OSError, zipfile.BadZipFile) as error:
        files = args.file + (" / " + args.compare if args.compare else "")
        print(f"{files}: {error}", file=sys.stderr)
        return 3

    if not args.quiet:
        data_bytes = sum(len(t.data) for t in tensors)
        print(f"{args.file}: {len(tensors)} tensors, {data_bytes} data bytes")
        for key, value in sorted(metadata.items()):
            print(f"metadata {key} = {value}")
        for tensor in tensors:
            print(tensor.name, tensor.dtype, tensor.shape)

    problems = []
    for item in args.metadata:
        key, _, value = item.partition("=")
        if metadata.get(key) != value:
            problems.append(f"__metadata__ {key} is {metadata.get(key)!r}, expected {value!r}")
    if args.expect_model:
        check_model(tensors, metadata, args, problems)
    if others is not None and args.rtol is not None:
        check_same(tensors, others, float("inf"), problems)  # names and shapes
        difference = relative_difference(tensors, others)
        print(f"{args.file}: relative difference {difference:.3g} (||a - b|| / ||b||)")
        if not difference <= args.rtol:
            problems.append(f"relative difference {difference:.3g} > {args.rtol:g}")
    elif others is not None:
        check_same(tensors, others, args.atol, problems)
    for problem in problems:
        print(f"{args.file}: {problem}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
