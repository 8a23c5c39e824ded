#!/usr/bin/env python3
"""hpc_train_report RUN_DIR: a picture of a run (docs/monitoring.md, "ETA and a picture of it").

Reads RUN_DIR/metrics.jsonl (the "train" record of each log interval, the "epoch" record of
each epoch, the "resume" record of each restart from a checkpoint: src/monitor/run_report.cpp)
and, when there, summary.json and config.ini; writes
RUN_DIR/report.png (the panels), RUN_DIR/report.html (the picture, embedded, with the summary's
figures and the configuration) and RUN_DIR/report.json (what each panel plotted: its points and
last values, for scripts and tests). Works on a run still going (the files so far).

hpc_train_report EVAL_DIR, for the --out directory of `hpc_train evaluate` (it holds
evaluation.json and no metrics.jsonl), writes EVAL_DIR/confusion_matrix.png instead: the
confusion matrix as a heat map, each row (a label) normalised to its class's samples, with the
counts written in the cells where there are at most 30 classes.

Exit codes as hpc_train's (include/hpc_train/error.h): 2 for a bad argument (no such run
directory), 3 for bad data (metrics.jsonl missing, corrupt or without a train record; a corrupt
summary.json), 1 where matplotlib is missing (Debian: python3-matplotlib).
"""
import base64
import html
import json
import math
import os
import sys
import tempfile

CONFIG_ERROR = 2
DATA_ERROR = 3
# The picture's size: 12 x 15 inches at 80 dots per inch.
FIGURE_INCHES = (12, 15)
DPI = 80
# The step's phases, as the train records name them (StepBreakdown), bottom to top.
PHASES = [("data_wait_ms", "data wait"), ("forward_ms", "forward"), ("backward_ms", "backward"),
          ("comm_wait_ms", "comm wait"), ("optimizer_ms", "optimizer")]


class ReportError(Exception):
    def __init__(self, code, message):
        super().__init__(message)
        self.code = code


def read_metrics(path):
    """The records of metrics.jsonl. A last line without its newline is a record being written
    (a run still going) and is left out; any other line that is not a JSON object is an error."""
    if not os.path.isfile(path):
        raise ReportError(DATA_ERROR, f"{path}: missing (is this an hpc_train --run-dir?)")
    try:
        with open(path, "rb") as f:
            data = f.read()
        text = data.decode("utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise ReportError(DATA_ERROR, f"{path}: cannot be read: {e}")
    lines = text.split("\n")
    partial_last = lines.pop()  # "" when the file ends with a newline
    if partial_last:
        print(f"hpc_train_report: {path}: leaving out its unfinished last line", file=sys.stderr)
    records = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as e:
            raise ReportError(DATA_ERROR, f"{path}:{number}: not JSON ({e.msg}): {line[:80]!r}")
        if not isinstance(record, dict) or not isinstance(record.get("kind"), str):
            raise ReportError(DATA_ERROR,
                              f"{path}:{number}: not a record with a \"kind\": {line[:80]!r}")
        records.append((number, record))
    return records


def number(path, line, record, key, required=True):
    value = record.get(key)
    if value is None and not required:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ReportError(DATA_ERROR, f"{path}:{line}: \"{key}\" is {json.dumps(value)}, "
                                      f"not a finite number ({record.get('kind')} record)")
    return value


def one_history(metrics_path, records):
    """The train, epoch and resume records as one run's history (Note [Resume record] in
    include/hpc_train/monitor/run_report.h): a resume record at step S drops the earlier train
    and epoch records past S, which the resumed run trained again and logs anew; a later record
    of an epoch replaces an earlier one (an epoch that --max-steps stopped, which a resumed run
    finished). Each as (line, record)."""
    train, epochs, resumes = [], [], []
    for n, r in records:
        if r["kind"] == "resume":
            step = number(metrics_path, n, r, "step")
            train = [(m, t) for m, t in train if t["step"] <= step]
            epochs = [(m, e) for m, e in epochs if e["steps"] <= step]
            resumes.append((n, r))
        elif r["kind"] == "train":
            number(metrics_path, n, r, "step")
            train.append((n, r))
        elif r["kind"] == "epoch":
            epoch = number(metrics_path, n, r, "epoch")
            number(metrics_path, n, r, "steps")
            epochs = [(m, e) for m, e in epochs if e["epoch"] != epoch] + [(n, r)]
    return train, epochs, resumes


def extract(metrics_path, records):
    """The series of each panel."""
    train, epochs, resumes = one_history(metrics_path, records)
    if not train:
        raise ReportError(DATA_ERROR, f"{metrics_path}: no \"train\" record yet "
                                      f"({len(records)} record(s)); nothing to plot")
    s = {"step": [number(metrics_path, n, r, "step") for n, r in train]}
    for key in ("loss", "samples_per_s", "ms_per_step"):
        s[key] = [number(metrics_path, n, r, key) for n, r in train]
    s["phases"] = {}
    for key, label in PHASES:
        if any(key in r for _, r in train):
            s["phases"][key] = [number(metrics_path, n, r, key, required=False) or 0.0
                                for n, r in train]
    # What the phases leave of the step (all of it in a CUDA-graph replay, timed as one launch).
    s["other_ms"] = [max(0.0, total - sum(p[i] for p in s["phases"].values()))
                     for i, total in enumerate(s["ms_per_step"])]
    s["epoch"] = [number(metrics_path, n, r, "epoch") for n, r in epochs]
    s["epoch_step"] = [number(metrics_path, n, r, "steps") for n, r in epochs]
    s["test_loss"] = [number(metrics_path, n, r, "test_loss") for n, r in epochs]
    s["test_accuracy"] = [number(metrics_path, n, r, "test_accuracy") for n, r in epochs]
    # GPU figures: min and max over the ranks (absent in a CPU run; null when NVML measured none).
    s["gpu_run"] = any(any(k.startswith("gpu_") for k in r) for _, r in train)
    s["gpu"] = {}
    for key in ("gpu_util_pct", "gpu_mem_used_bytes", "gpu_alloc_peak_bytes", "gpu_power_w"):
        points = []
        for n, r in train:
            low = number(metrics_path, n, r, key + "_min", required=False)
            high = number(metrics_path, n, r, key + "_max", required=False)
            if low is not None and high is not None:
                points.append((number(metrics_path, n, r, "step"), low, high))
        s["gpu"][key] = points
    s["resumes"] = [{"step": number(metrics_path, n, r, "step"),
                     "checkpoint": r.get("checkpoint"),
                     "world_size": number(metrics_path, n, r, "world_size"),
                     "checkpoint_world_size": number(metrics_path, n, r, "checkpoint_world_size",
                                                     required=False),
                     "steps_redone": number(metrics_path, n, r, "steps_redone", required=False),
                     "time": r.get("time")}
                    for n, r in resumes]
    return s


def describe_resume(resume):
    """'resumed at step 6 from RUN/checkpoints/step-00000006.h5 on 2 rank(s) (saved by 3), 2
    step(s) redone'"""
    text = f"resumed at step {resume['step']} from {resume['checkpoint']} on " \
           f"{resume['world_size']} rank(s)"
    if resume["checkpoint_world_size"] is not None:
        text += f" (saved by {resume['checkpoint_world_size']})"
    if resume["steps_redone"] is not None:
        text += f", {resume['steps_redone']} step(s) redone"
    return text


def mark_resumes(ax, resumes, label=False):
    """A vertical line at each restart's step, on a panel over optimizer steps."""
    for i, resume in enumerate(resumes):
        ax.axvline(resume["step"], color="grey", linestyle="--", linewidth=1,
                   label="resumed from a checkpoint" if label and i == 0 else None)


def read_summary(run_dir):
    path = os.path.join(run_dir, "summary.json")
    if not os.path.isfile(path):
        return None
    try:
        with open(path) as f:
            summary = json.load(f)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ReportError(DATA_ERROR, f"{path}: not JSON: {e}")
    if not isinstance(summary, dict):
        raise ReportError(DATA_ERROR, f"{path}: not a JSON object")
    return summary


def flatten(summary, prefix=""):
    rows = []
    for key, value in summary.items():
        if isinstance(value, dict):
            rows += flatten(value, prefix + key + ".")
        else:
            rows.append((prefix + key, value))
    return rows


def plot(s, title, png_path):
    import matplotlib
    matplotlib.use("Agg")  # no display
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(4, 2, figsize=FIGURE_INCHES, dpi=DPI)
    fig.suptitle(title)
    plotted = {}
    steps = s["step"]

    ax = axes[0][0]
    ax.plot(steps, s["loss"], marker=".", label="train loss (log interval)")
    if s["epoch_step"]:
        ax.plot(s["epoch_step"], s["test_loss"], marker="o", label="test loss (epoch)")
    mark_resumes(ax, s["resumes"], label=True)
    ax.set_title("Loss")
    ax.set_xlabel("optimizer step")
    ax.legend()
    plotted["loss"] = {"train_points": len(steps), "test_points": len(s["test_loss"]),
                       "last_train_loss": s["loss"][-1],
                       "last_test_loss": s["test_loss"][-1] if s["test_loss"] else None}

    ax = axes[0][1]
    if s["epoch"]:
        ax.plot(s["epoch"], [100 * a for a in s["test_accuracy"]], marker="o")
        ax.set_xticks(s["epoch"])
    else:
        no_data(ax, "no epoch ended yet")
    ax.set_title("Test accuracy (%)")
    ax.set_xlabel("epoch")
    plotted["test_accuracy"] = {"points": len(s["epoch"]),
                                "last": s["test_accuracy"][-1] if s["test_accuracy"] else None}

    ax = axes[1][0]
    ax.plot(steps, s["samples_per_s"], marker=".")
    mark_resumes(ax, s["resumes"])
    ax.set_title("Throughput (samples/s, all ranks)")
    ax.set_xlabel("optimizer step")
    ax.set_ylim(bottom=0)
    plotted["samples_per_s"] = {"points": len(steps), "last": s["samples_per_s"][-1]}

    ax = axes[1][1]
    layers = [(label, s["phases"][key]) for key, label in PHASES if key in s["phases"]]
    layers.append(("other (untimed)", s["other_ms"]))
    ax.stackplot(steps, *[values for _, values in layers], labels=[l for l, _ in layers])
    mark_resumes(ax, s["resumes"])
    ax.set_title("Step time breakdown (ms per step, rank 0)")
    ax.set_xlabel("optimizer step")
    ax.legend(loc="upper right", fontsize="small")
    plotted["step_time"] = {"points": len(steps), "layers": [l for l, _ in layers],
                            "last_ms_per_step": s["ms_per_step"][-1]}

    gpu_panels = [("gpu_util_pct", "GPU utilisation (%)", 1.0, axes[2][0]),
                  ("gpu_mem_used_bytes", "GPU memory used (GB)", 1e-9, axes[2][1]),
                  ("gpu_power_w", "GPU power (W)", 1.0, axes[3][0]),
                  ("gpu_alloc_peak_bytes", "LibTorch allocator peak (GB)", 1e-9, axes[3][1])]
    for key, name, scale, ax in gpu_panels:
        points = s["gpu"][key]
        ax.set_title(name + ", min and max over ranks")
        if points:
            x = [p[0] for p in points]
            ax.fill_between(x, [p[1] * scale for p in points], [p[2] * scale for p in points],
                            alpha=0.3)
            ax.plot(x, [p[1] * scale for p in points], label="min")
            ax.plot(x, [p[2] * scale for p in points], label="max")
            mark_resumes(ax, s["resumes"])
            ax.set_xlabel("optimizer step")
            ax.legend()
            note = None
        else:
            note = "not measured" if s["gpu_run"] else "no GPU (CPU run)"
            no_data(ax, note)
        plotted[key] = {"points": len(points), "note": note,
                        "last_max": points[-1][2] if points else None}

    fig.tight_layout(rect=(0, 0, 1, 0.97))
    write_atomically(png_path, lambda f: fig.savefig(f, format="png", dpi=DPI))
    width, height = (round(v * DPI) for v in FIGURE_INCHES)
    plt.close(fig)
    return plotted, {"width": width, "height": height}


def no_data(ax, text):
    ax.text(0.5, 0.5, text, ha="center", va="center", fontsize=16, transform=ax.transAxes)
    ax.set_xticks([])
    ax.set_yticks([])


def write_atomically(path, write):
    """Into a temporary file beside `path`, then renamed: a reader never sees half a file."""
    folder = os.path.dirname(path) or "."
    fd, temporary = tempfile.mkstemp(prefix="." + os.path.basename(path) + ".", dir=folder)
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
        os.chmod(temporary, 0o644)
        os.replace(temporary, path)
    except BaseException:
        os.unlink(temporary)
        raise


def read_evaluation(path):
    try:
        with open(path) as f:
            evaluation = json.load(f)
        matrix = evaluation["confusion_matrix"]
        classes = len(matrix)
        if classes == 0 or any(len(row) != classes for row in matrix):
            raise ValueError("confusion_matrix is not square")
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise ReportError(DATA_ERROR, f"{path}: not an evaluation of hpc_train evaluate ({e})")
    return evaluation


def plot_confusion(evaluation, png_path):
    """The heat map of hpc_train evaluate's confusion matrix, rows normalised."""
    import matplotlib
    matplotlib.use("Agg")  # no display
    import matplotlib.pyplot as plt
    matrix = evaluation["confusion_matrix"]
    classes = len(matrix)
    names = evaluation.get("class_names") or [str(c) for c in range(classes)]
    shares = [[count / max(1, sum(row)) for count in row] for row in matrix]
    inches = min(20, max(6, 0.5 * classes + 3))
    fig, ax = plt.subplots(figsize=(inches, inches))
    image = ax.imshow(shares, cmap="Blues", vmin=0, vmax=1)
    fig.colorbar(image, ax=ax, fraction=0.046, pad=0.04, label="share of the label's samples")
    if classes <= 30:
        ax.set_xticks(range(classes))
        ax.set_yticks(range(classes))
        ax.set_xticklabels(names, rotation=90)
        ax.set_yticklabels(names)
        for label, row in enumerate(matrix):
            for predicted, count in enumerate(row):
                ax.text(predicted, label, str(count), ha="center", va="center", fontsize=8,
                        color="white" if shares[label][predicted] > 0.5 else "black")
    ax.set_xlabel("predicted")
    ax.set_ylabel("label")
    top5 = evaluation.get("top5_accuracy")
    ax.set_title(f"{evaluation.get('model', '?')} on the {evaluation.get('split', '?')} split of "
                 f"{os.path.basename(str(evaluation.get('dataset', '?')))}: "
                 f"{100 * evaluation['accuracy']:.2f}% top-1"
                 + (f", {100 * top5:.2f}% top-5" if top5 is not None else "")
                 + f" ({evaluation['samples']} samples)")
    fig.tight_layout()
    write_atomically(png_path, lambda f: fig.savefig(f, format="png", dpi=DPI))
    plt.close(fig)


def write_html(run_dir, png_path, summary, title, resumes):
    with open(png_path, "rb") as f:
        png_base64 = base64.b64encode(f.read()).decode("ascii")
    rows = "".join(f"<tr><td>{html.escape(k)}</td><td>{html.escape(json.dumps(v))}</td></tr>\n"
                   for k, v in flatten(summary or {}))
    config_path = os.path.join(run_dir, "config.ini")
    config = None
    if os.path.isfile(config_path):
        with open(config_path, errors="replace") as f:
            config = f.read()
    restarts = "".join(f"<p>{html.escape(r['time'] or '')} {html.escape(describe_resume(r))}</p>\n"
                       for r in resumes)
    page = (f"<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"><title>{html.escape(title)}"
            "</title>\n<style>body{font-family:sans-serif} td{padding:0 1em 0 0}"
            " img{max-width:100%}</style></head><body>\n"
            f"<h1>{html.escape(title)}</h1>\n"
            "<a href=\"report.png\"><img alt=\"report.png\" "
            f"src=\"data:image/png;base64,{png_base64}\"></a>\n"
            + restarts
            + "<h2>summary.json</h2>\n"
            + (f"<table>\n{rows}</table>\n" if summary is not None
               else "<p>No summary.json yet (the run has not ended).</p>\n")
            + "<h2>config.ini</h2>\n"
            + (f"<pre>{html.escape(config)}</pre>\n" if config is not None
               else "<p>No config.ini.</p>\n")
            + "</body></html>\n")
    write_atomically(os.path.join(run_dir, "report.html"), lambda f: f.write(page.encode()))


def python_with_matplotlib(argv):
    """A python3 earlier on the PATH (pyenv, a virtual environment) may hide Debian's, which
    has python3-matplotlib: then the script runs again under /usr/bin/python3."""
    try:
        import matplotlib  # noqa: F401
        return True
    except ImportError:
        pass
    system_python = "/usr/bin/python3"
    if (os.environ.get("HPC_TRAIN_REPORT_REEXEC") != "1" and os.path.exists(system_python)
            and os.path.realpath(sys.executable) != os.path.realpath(system_python)):
        os.environ["HPC_TRAIN_REPORT_REEXEC"] = "1"
        os.execv(system_python, [system_python, os.path.abspath(__file__)] + argv[1:])
    return False


def require_matplotlib(argv):
    if not python_with_matplotlib(argv):
        raise ReportError(1, f"{sys.executable} has no matplotlib "
                             "(Debian: apt-get install python3-matplotlib)")


def main(argv):
    if len(argv) != 2 or argv[1] in ("-h", "--help"):
        print("usage: hpc_train_report RUN_DIR\n"
              "Writes RUN_DIR/report.png, report.html and report.json from the run's\n"
              "metrics.jsonl, summary.json and config.ini; for the --out directory of\n"
              "hpc_train evaluate, confusion_matrix.png from its evaluation.json.",
              file=sys.stderr)
        return 0 if len(argv) == 2 else CONFIG_ERROR
    run_dir = argv[1]
    try:
        if not os.path.isdir(run_dir):
            raise ReportError(CONFIG_ERROR, f"RUN_DIR {run_dir}: no such directory")
        evaluation_path = os.path.join(run_dir, "evaluation.json")
        if (os.path.exists(evaluation_path)
                and not os.path.exists(os.path.join(run_dir, "metrics.jsonl"))):
            evaluation = read_evaluation(evaluation_path)
            require_matplotlib(argv)
            png_path = os.path.join(run_dir, "confusion_matrix.png")
            plot_confusion(evaluation, png_path)
            print(f"hpc_train_report: wrote {png_path}")
            return 0
        metrics_path = os.path.join(run_dir, "metrics.jsonl")
        series = extract(metrics_path, read_metrics(metrics_path))
        summary = read_summary(run_dir)
        require_matplotlib(argv)
        title = f"hpc_train run {os.path.basename(os.path.abspath(run_dir))}"
        if summary is not None:
            title += (f": {summary.get('model', '?')} on {summary.get('world_size', '?')} "
                      f"rank(s), {summary.get('epochs_completed', '?')} epoch(s)")
        png_path = os.path.join(run_dir, "report.png")
        plotted, image = plot(series, title, png_path)
        write_html(run_dir, png_path, summary, title, series["resumes"])
        report = {"metrics": metrics_path, "image": image, "panels": plotted,
                  "resumes": series["resumes"], "summary": summary is not None}
        write_atomically(os.path.join(run_dir, "report.json"),
                         lambda f: f.write((json.dumps(report, indent=1) + "\n").encode()))
    except ReportError as e:
        print(f"hpc_train_report: {e}", file=sys.stderr)
        return e.code
    for resume in series["resumes"]:
        print(f"hpc_train_report: {describe_resume(resume)}")
    print(f"hpc_train_report: wrote {png_path}, {os.path.join(run_dir, 'report.html')} "
          f"and report.json ({len(series['step'])} log intervals, {len(series['epoch'])} epochs)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
