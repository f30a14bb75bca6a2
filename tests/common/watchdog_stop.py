#!/usr/bin/env python3
"""A rank that stops is named first by the watchdog (issue 22).

    watchdog_stop.py --rank K -- MPIEXEC ... watchdog_hang --mode loop --timeout T

starts the job (every rank prints "rank R pid P" and then trains forever), lets it run for a
moment, stops rank K with SIGSTOP (as a rank stuck in the kernel, under a debugger, or on a dead
node looks to its peers: it answers nothing, not even its watchdog thread), and checks that the
job ends with exit code 3 within the deadline and that the watchdog report's first line names
rank K as the rank that does not run. The other ranks wait in different collectives and
send/recv, some for rank K directly and some through a chain; the report must also say so.

Whatever happens, every rank it saw is continued (SIGCONT) and killed at the end, so a failed
run leaves no stopped process behind.
"""
import argparse
import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time


def reader(stream, lines, sink):
    for line in stream:
        sink.append(line)
        lines.put(line)
    lines.put(None)


def expand(ranks):
    """'0-2,5' -> {0, 1, 2, 5} (the report's rank lists)"""
    out = set()
    for part in ranks.split(","):
        lo, _, hi = part.partition("-")
        out |= set(range(int(lo), int(hi or lo) + 1))
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rank", type=int, required=True, help="the rank to stop")
    ap.add_argument("--ranks", type=int, default=4, help="ranks the job starts")
    ap.add_argument("--deadline", type=float, default=40, help="seconds the whole job may take")
    ap.add_argument("command", nargs=argparse.REMAINDER)
    args = ap.parse_args()
    command = args.command[1:] if args.command[:1] == ["--"] else args.command

    start = time.monotonic()
    # Its own session: on any failure the launcher and everything it started can be killed.
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    out, err = [], []
    lines = queue.Queue()
    threads = [threading.Thread(target=reader, args=(proc.stdout, lines, out), daemon=True),
               threading.Thread(target=reader, args=(proc.stderr, queue.Queue(), err), daemon=True)]
    for t in threads:
        t.start()
    pids = {}
    failure = None
    try:
        while len(pids) < args.ranks:
            try:
                line = lines.get(timeout=max(0.1, args.deadline - (time.monotonic() - start)))
            except queue.Empty:
                line = None
            if line is None:
                failure = f"the job did not start its {args.ranks} ranks (got pids of {sorted(pids)})"
                break
            m = re.match(r"rank (\d+) pid (\d+)", line)
            if m:
                pids[int(m.group(1))] = int(m.group(2))
        if failure is None:
            time.sleep(1.0)  # every rank is in its loop: collectives, sends, compute
            os.kill(pids[args.rank], signal.SIGSTOP)
            stopped_at = time.monotonic()
            try:
                code = proc.wait(timeout=max(1, args.deadline - (time.monotonic() - start)))
            except subprocess.TimeoutExpired:
                code = None
                failure = f"the job did not end within {args.deadline} s of its start"
    finally:
        for pid in pids.values():  # never leave a stopped rank behind
            for sig in (signal.SIGCONT, signal.SIGKILL):
                try:
                    os.kill(pid, sig)
                except ProcessLookupError:
                    pass
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        for t in threads:
            t.join(timeout=5)
    text = "".join(err) + "".join(out)
    print(text)
    if failure:
        sys.exit(f"FAIL: {failure}")
    print(f"exit code {code}, {time.monotonic() - stopped_at:.1f} s after SIGSTOP of rank "
          f"{args.rank} (pid {pids[args.rank]})")
    report = [l for l in text.splitlines() if "watchdog:" in l]
    if code != 3:
        sys.exit(f"FAIL: want exit code 3 (watchdog timeout), got {code}")
    if not report:
        sys.exit("FAIL: no watchdog report")
    want = f"[scalelab] watchdog: rank {args.rank} does not run: no heartbeat from it"
    if not report[0].startswith(want):
        sys.exit(f"FAIL: the report's first line should name rank {args.rank}, the stopped one:\n"
                 f"  want: {want} ...\n  got:  {report[0]}")
    # the chain: at least one rank is shown waiting for the stopped one
    waited_for = set()
    for m in re.finditer(r"waits? for ranks? ([0-9,-]+) in ", text):
        waited_for |= expand(m.group(1))
    if args.rank not in waited_for:
        sys.exit(f"FAIL: no rank is shown waiting for rank {args.rank}")
    print("ok")


if __name__ == "__main__":
    main()
