#!/usr/bin/env python3
"""Summarise cuDNN's API log (CUDNN_LOGLEVEL_DBG=3 CUDNN_LOGDEST_DBG=FILE), thread by thread.

    bench/cudnn_log_summary.py FILE[.gz]

For each thread: its calls and when they ran (seconds from the first call), the most frequent
functions, how many heuristics queries, execution plans and operation graphs it finalized and how
many plans it executed, and its longest waits between two of its calls. The log gives each call's
start only, so a wait is the call before it plus whatever ran outside cuDNN until the next one.
"""
import collections
import datetime
import gzip
import re
import sys


def read_calls(path):
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt", errors="replace") as log:
        text = log.read()
    calls = []  # (start in s since the epoch, function, thread, the call's whole entry)
    for entry in re.split(r"\n(?=I! CuDNN)", text):
        function = re.search(r"function (\w+)\(\)", entry)
        start = re.search(r"Time: (\S+)", entry)
        thread = re.search(r"Thread=(\d+)", entry)
        if function and start and thread:
            calls.append((datetime.datetime.fromisoformat(start.group(1)).timestamp(),
                          function.group(1), thread.group(1), entry))
    return calls


def main():
    calls = read_calls(sys.argv[1])
    if not calls:
        sys.exit(f"{sys.argv[1]}: no cuDNN API calls found")
    first = calls[0][0]
    print(f"{len(calls)} calls over {calls[-1][0] - first:.3f} s")
    by_thread = collections.defaultdict(list)
    for call in calls:
        by_thread[call[2]].append(call)
    for thread, mine in by_thread.items():
        def finalized(descriptor):
            return sum(1 for c in mine if c[1] == "cudnnBackendFinalize" and descriptor in c[3])
        functions = collections.Counter(c[1] for c in mine).most_common(3)
        print(f"thread {thread}: {len(mine)} calls, {mine[0][0] - first:.3f}-{mine[-1][0] - first:.3f} s; "
              + ", ".join(f"{name} {count}" for name, count in functions))
        print(f"  finalized: heuristics {finalized('ENGINEHEUR_DESCRIPTOR')}, "
              f"plans {finalized('EXECUTION_PLAN_DESCRIPTOR')}, "
              f"operation graphs {finalized('OPERATIONGRAPH_DESCRIPTOR')}; "
              f"executed {sum(1 for c in mine if c[1] == 'cudnnBackendExecute')}")
        waits = sorted(((mine[i + 1][0] - mine[i][0], i) for i in range(len(mine) - 1)), reverse=True)
        for wait, i in waits[:5]:
            print(f"  {1e3 * wait:8.1f} ms after {mine[i][1]} at {mine[i][0] - first:.3f} s")


if __name__ == "__main__":
    main()
