#!/usr/bin/env python3
"""An independent reader of hpc_train's monitor files, for tests/test_tensorboard_run.sh.

It shares no code with src/monitor/tensorboard_events.cpp: the TFRecord framing and its masked
CRC-32C are checked here with a CRC written from the definition, and the Event and Summary
messages are parsed by the protobuf library (Debian's python3-protobuf) from a descriptor built
here from the field numbers of tensorflow/core/util/event.proto and
tensorflow/core/framework/summary.proto.

    read_tfevents.py events RUN_DIR TB_DIR [HOST]     events match RUN_DIR/metrics.jsonl; the
                                                      files are named after HOST, rank 0's
                                                      (default: this machine)
    read_tfevents.py csv RUN_DIR CSV_DIR              CSV files match RUN_DIR/metrics.jsonl
Exit 0 when everything matches; an AssertionError names what does not.

A run directory that resumed runs wrote into (Note [Resume record] in
include/hpc_train/monitor/run_report.h) has one event file per run: each resumed run's starts
with a SessionLog START at the resume record's step in samples seen, plus one (Note [Resume in
TensorBoard]). The events are merged as TensorBoard's loader merges them (a START drops the
earlier events at its step or later) and compared with metrics.jsonl's history, in which a
resume record drops the earlier records past its step.
"""
import glob
import json
import math
import os
import re
import socket
import struct
import sys


def crc32c(data: bytes) -> int:
    # Bitwise, from the definition: reflected Castagnoli polynomial 0x82F63B78.
    crc = 0xFFFFFFFF
    for byte in data:
        crc ^= byte
        for _ in range(8):
            crc = (crc >> 1) ^ (0x82F63B78 if crc & 1 else 0)
    return crc ^ 0xFFFFFFFF


def masked(crc: int) -> int:
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


assert crc32c(b"123456789") == 0xE3069283  # the customary check value
assert crc32c(bytes(32)) == 0x8A9136AA  # RFC 3720 B.4


def message_classes():
    # Imported here, so that the CSV check runs where python3-protobuf is missing.
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
    F = descriptor_pb2.FieldDescriptorProto
    file = descriptor_pb2.FileDescriptorProto(name="hpc_train_test_event.proto",
                                              package="tensorflow", syntax="proto3")
    summary = file.message_type.add(name="Summary")
    value = summary.nested_type.add(name="Value")
    value.field.add(name="tag", number=1, type=F.TYPE_STRING, label=F.LABEL_OPTIONAL)
    # In summary.proto's `oneof value`: present when set, 0.0 included (a proto3 field outside a
    # oneof would drop a 0.0 when serialised again).
    value.oneof_decl.add(name="value")
    value.field.add(name="simple_value", number=2, type=F.TYPE_FLOAT, label=F.LABEL_OPTIONAL,
                    oneof_index=0)
    summary.field.add(name="value", number=1, type=F.TYPE_MESSAGE, label=F.LABEL_REPEATED,
                      type_name=".tensorflow.Summary.Value")
    event = file.message_type.add(name="Event")
    event.field.add(name="wall_time", number=1, type=F.TYPE_DOUBLE, label=F.LABEL_OPTIONAL)
    event.field.add(name="step", number=2, type=F.TYPE_INT64, label=F.LABEL_OPTIONAL)
    event.field.add(name="file_version", number=3, type=F.TYPE_STRING, label=F.LABEL_OPTIONAL)
    event.field.add(name="summary", number=5, type=F.TYPE_MESSAGE, label=F.LABEL_OPTIONAL,
                    type_name=".tensorflow.Summary")
    session_log = file.message_type.add(name="SessionLog")
    status = session_log.enum_type.add(name="SessionStatus")
    for name, value in (("STATUS_UNSPECIFIED", 0), ("START", 1), ("STOP", 2), ("CHECKPOINT", 3)):
        status.value.add(name=name, number=value)
    session_log.field.add(name="status", number=1, type=F.TYPE_ENUM, label=F.LABEL_OPTIONAL,
                          type_name=".tensorflow.SessionLog.SessionStatus")
    session_log.field.add(name="checkpoint_path", number=2, type=F.TYPE_STRING,
                          label=F.LABEL_OPTIONAL)
    session_log.field.add(name="msg", number=3, type=F.TYPE_STRING, label=F.LABEL_OPTIONAL)
    event.field.add(name="session_log", number=7, type=F.TYPE_MESSAGE, label=F.LABEL_OPTIONAL,
                    type_name=".tensorflow.SessionLog")
    pool = descriptor_pool.DescriptorPool()
    pool.Add(file)
    event_descriptor = pool.FindMessageTypeByName("tensorflow.Event")
    if hasattr(message_factory, "GetMessageClass"):  # protobuf >= 4.22
        return message_factory.GetMessageClass(event_descriptor)
    return message_factory.MessageFactory(pool).GetPrototype(event_descriptor)


def read_records(path):
    data = open(path, "rb").read()
    at, records = 0, []
    while at < len(data):
        assert at + 12 <= len(data), f"{path}: a cut header at byte {at}"
        header = data[at:at + 8]
        (length,) = struct.unpack("<Q", header)
        (length_crc,) = struct.unpack("<I", data[at + 8:at + 12])
        assert length_crc == masked(crc32c(header)), f"{path}: bad length CRC at byte {at}"
        body = data[at + 12:at + 12 + length]
        assert len(body) == length, f"{path}: a cut record at byte {at}"
        (data_crc,) = struct.unpack("<I", data[at + 12 + length:at + 16 + length])
        assert data_crc == masked(crc32c(body)), f"{path}: bad data CRC at byte {at}"
        records.append(body)
        at += 16 + length
    return records


def float32(x):
    return struct.unpack("<f", struct.pack("<f", x))[0]


START = 1  # SessionLog.START


def read_metrics(run_dir):
    return [json.loads(line) for line in open(os.path.join(run_dir, "metrics.jsonl"))]


def global_batch_of(records):
    """The samples an optimizer step takes, the same in every train record."""
    train = [r for r in records if r["kind"] == "train"]
    assert train, "metrics.jsonl has no train record"
    global_batch = train[0]["samples"] // train[0]["step"]
    for r in train:
        # DeepSpeed's x axis: samples seen = steps x the global batch.
        assert r["samples"] > 0 and r["samples"] == r["step"] * global_batch, r
    return global_batch


def expected_scalars(run_dir):
    """(tag, step) -> value, from metrics.jsonl, with the names of Note [Monitor tags]; a
    resume record drops the earlier values past its step."""
    records = read_metrics(run_dir)
    expected = {}
    train = [r for r in records if r["kind"] == "train"]
    epochs = [r for r in records if r["kind"] == "epoch"]
    assert train and epochs, f"metrics.jsonl has {len(train)} train and {len(epochs)} epoch records"
    global_batch = global_batch_of(records)
    names = {"loss": "train_loss", "lr": "lr", "samples_per_s": "samples_per_s",
             "ms_per_step": "ms_per_step", "data_wait_ms": "elapsed_time_ms_data_wait",
             "forward_ms": "elapsed_time_ms_forward", "backward_ms": "elapsed_time_ms_backward",
             "comm_wait_ms": "elapsed_time_ms_comm_wait", "optimizer_ms": "elapsed_time_ms_step",
             "comm_bytes_per_step": "comm_bytes_per_step", "busbw_gb_s": "busbw_gb_s"}
    phases = {"forward_ms", "backward_ms", "comm_wait_ms", "optimizer_ms", "comm_bytes_per_step",
              "busbw_gb_s"}
    config = open(os.path.join(run_dir, "config.ini")).read()
    fp16 = re.search(r"^precision = fp16$", config, re.M) is not None
    for r in records:
        if r["kind"] == "resume":
            last = r["step"] * global_batch
            expected = {key: value for key, value in expected.items() if key[1] <= last}
        elif r["kind"] == "epoch":
            assert r["samples"] == r["steps"] * global_batch, r
            expected[("Train/Samples/epoch_train_loss", r["samples"])] = r["train_loss"]
            expected[("Test/Samples/test_loss", r["samples"])] = r["test_loss"]
            expected[("Test/Samples/test_accuracy", r["samples"])] = r["test_accuracy"]
            # Note [Top-5 accuracy]: only for a model of 5 classes or more.
            if r["test_top5_accuracy"] is not None:
                expected[("Test/Samples/test_top5_accuracy", r["samples"])] = r["test_top5_accuracy"]
        if r["kind"] != "train":
            continue
        for key, name in names.items():
            # The host-timed phases only from intervals with eager steps (not CUDA-graph replays).
            if key in phases and r["phase_timed_steps"] == 0:
                continue
            expected[("Train/Samples/" + name, r["samples"])] = r[key]
        if fp16:
            expected[("Train/Samples/loss_scale", r["samples"])] = r["loss_scale"]
            expected[("Train/Samples/skipped_steps", r["samples"])] = r["skipped_steps"]
        # GPU runs: min and max over the ranks; NVML's are null when nothing was measured.
        for key, value in r.items():
            if key.startswith("gpu_") and value is not None:
                expected[("Train/Samples/" + key, r["samples"])] = value
    return expected


def read_events(path, Event, host):
    name = os.path.basename(path)
    match = re.fullmatch(r"events\.out\.tfevents\.(\d+)\.(.+)", name)
    # The host's name, and the pid after it when a writer of the same second had the name.
    assert match and (match.group(2) == host or match.group(2).startswith(host + ".")), name
    events = []
    for body in read_records(path):
        event = Event()
        event.ParseFromString(body)
        # Every byte understood: re-serialising gives the same length (no unknown fields).
        assert len(event.SerializeToString()) == len(body), event
        events.append(event)
    assert events[0].file_version == "brain.Event:2", events[0]
    assert abs(events[0].wall_time - int(match.group(1))) < 2, (events[0].wall_time, name)
    wall_times = [e.wall_time for e in events]
    assert wall_times == sorted(wall_times), f"{path}: wall times go back"
    return events


def check_events(run_dir, tb_dir, host):
    # TensorBoard reads a folder's files in the order of their names (their start times).
    files = sorted(glob.glob(os.path.join(tb_dir, "events.out.tfevents.*")))
    records = read_metrics(run_dir)
    resumes = [r for r in records if r["kind"] == "resume"]
    assert len(files) == 1 + len(resumes), f"{tb_dir}: event files {files}, {len(resumes)} resumes"
    Event = message_classes()
    got = {}
    count = 0
    for index, path in enumerate(files):
        events = read_events(path, Event, host)
        count += len(events)
        if index > 0:
            # Note [Resume in TensorBoard]: the resumed run's first event after the version.
            start, resume = events[1], resumes[index - 1]
            assert start.session_log.status == START, start
            step = resume["step"] * global_batch_of(records) + 1
            assert start.step == step and start.session_log.checkpoint_path == resume["checkpoint"], \
                (start, resume)
            print(f"{path}: START at step {start.step} ({start.session_log.msg})")
            # TensorBoard's purge of orphaned data: the events at the START's step or later.
            got = {key: value for key, value in got.items() if key[1] < start.step}
            events = events[1:]
        for event in events[1:]:
            assert len(event.summary.value) == 1, event
            value = event.summary.value[0]
            key = (value.tag, event.step)
            assert key not in got, f"{key} twice"
            got[key] = value.simple_value
    expected = expected_scalars(run_dir)
    missing = sorted(set(expected) - set(got))
    extra = sorted(set(got) - set(expected))
    assert not missing and not extra, f"missing {missing[:5]}, extra {extra[:5]}"
    for key, value in expected.items():
        assert got[key] == float32(value), f"{key}: {got[key]} in the events, {value} in metrics"
    tags = sorted({tag for tag, _ in got})
    print(f"{', '.join(files)}: {count} events, {len(tags)} tags, steps "
          f"{min(s for _, s in got)}..{max(s for _, s in got)}; all match metrics.jsonl")
    print("tags:", ", ".join(tags))


def check_csv(run_dir, csv_dir):
    expected = expected_scalars(run_dir)
    by_tag = {}
    for (tag, step), value in expected.items():
        by_tag.setdefault(tag, []).append((step, value))
    files = sorted(os.listdir(csv_dir))
    assert files == sorted(t.replace("/", "_") + ".csv" for t in by_tag), files
    for tag, rows in by_tag.items():
        text = open(os.path.join(csv_dir, tag.replace("/", "_") + ".csv"), newline="").read()
        lines = text.split("\r\n")
        assert lines[-1] == "", f"{tag}: rows must end in \\r\\n"
        assert lines[0] == "step," + tag.split("/")[-1], lines[0]
        got = [(int(s), float(v)) for s, v in (line.split(",") for line in lines[1:-1])]
        assert got == sorted(rows), f"{tag}: {got[:3]} != {sorted(rows)[:3]}"
        assert all(math.isfinite(v) for _, v in got)
    print(f"{csv_dir}: {len(files)} CSV files, all rows match metrics.jsonl")


if __name__ == "__main__":
    mode, run_dir, directory = sys.argv[1:4]
    if mode == "events":
        check_events(run_dir, directory, sys.argv[4] if len(sys.argv) > 4 else socket.gethostname())
    else:
        check_csv(run_dir, directory)
