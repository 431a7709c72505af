#!/usr/bin/env python3
"""The reliability suite's table (docs/RELIABILITY.md) from the JSON lines its steps print.

    python3 scripts/reliability_table.py RESULTS.jsonl quick|full yes|no

Prints the table; with `yes`, also puts it in docs/RELIABILITY.md between its markers. Standard library only.
"""
import datetime
import json
import os
import platform
import sys

results_path, mode, write = sys.argv[1], sys.argv[2], sys.argv[3] == "yes"
steps = [json.loads(line) for line in open(results_path) if line.strip()]


def mib(value):
    return f"{value:.0f} MiB"


def violations(step):
    found = step.get("violations") or {}
    return "none" if not found else "; ".join(f"{name}: {count}" for name, count in sorted(found.items()))


rows = []
for step in steps:
    kind = step.get("scenario")
    result = "pass" if step.get("passed") else "**FAIL**"
    if kind == "self-test":
        rows.append(("checks against damaged stores", "14 stores damaged on purpose (lost, reordered, changed, "
                     "half batch, half chain, gap, new epoch, invented item) and 3 intact ones",
                     f"{step['failures']} not caught", result))
    elif kind == "crash":
        chains = (f"{step['acknowledged_chains']:,} chains ({step['acknowledged_chain_items']:,} items)"
                  if step["chains_supported"] else "chains refused by the engine")
        rows.append((f"kill -9, {step['engine']}",
                     f"{step['rounds']} rounds, killed {step['kill_after_s_min']:.2f}–{step['kill_after_s_max']:.2f} s "
                     f"into each; acknowledged: {step['acknowledged_single_writes']:,} single writes, "
                     f"{step['acknowledged_batches']:,} batches ({step['acknowledged_batch_items']:,} items), {chains}; "
                     f"{step['unacknowledged_writes_found_whole']} writes in flight at a kill found whole; "
                     f"restart to first answer ≤ {step['restart_to_first_answer_s_max']:.2f} s",
                     f"violations: {violations(step)}", result))
    elif kind == "power-cut":
        options = f" ({step['options']})" if step["options"] else ""
        rows.append((f"power cut, {step['engine']}{options}",
                     f"{step['rounds']} rounds of the checker's power-loss property: every unsynced write lost, or "
                     f"torn in 512-byte sectors", "opened undamaged within its promise" if step["passed"]
                     else "see the checker's message", result))
    elif kind == "live-fuzz":
        rows.append(("mutated frames over live connections",
                     f"{step['frames']:,} frames over {step['connections']:,} connections "
                     f"({step['closed_by_daemon']:,} closed by the daemon after a protocol error; "
                     f"{step.get('large_frames_cut', 0):,} clients gone in the middle of an 8 MiB frame) in "
                     f"{step['seconds']:.0f} s; a client pinging meanwhile: {step['pings_ok']:,} answered",
                     f"failed pings {step['pings_failed']}; descriptors {step['descriptors_before']} → "
                     f"{step['descriptors_after']}; resident {mib(step['resident_mib_before'])} → peak "
                     f"{mib(step['resident_mib_peak'])} → {mib(step['resident_mib_after'])}; "
                     f"violations: {violations(step)}", result))
    elif kind == "load":
        rows.append((f"load, {step['engine']}",
                     f"{step['connections']:,} connections with mixed requests and {step['watchers']} watchers for "
                     f"{step['seconds']:.0f} s: {step['requests']:,} requests ({step['requests_per_second']:,.0f}/s), "
                     f"{step['acknowledged_commits']:,} acknowledged commits, {step['events_per_watcher']:,} events "
                     f"per watcher",
                     f"errors {step['errors']}; descriptors {step['descriptors_before']} → "
                     f"{step['descriptors_after']}; resident {mib(step['resident_mib_before'])} → peak "
                     f"{mib(step['resident_mib_peak'])} → {mib(step['resident_mib_after'])}; "
                     f"violations: {violations(step)}", result))
    elif kind == "tests":
        rows.append((step["name"], f"{step['tests']} tests of the suite (listed in the sections above)",
                     f"{step['failures']} failed", result))
    elif kind == "libfuzzer":
        rows.append((f"libFuzzer {step['target']}", f"{step['seconds']} s, {step['runs']:,} inputs",
                     "no finding" if step["passed"] else "a finding (kept in .build-fuzz/findings)", result))
    elif kind == "sanitizer":
        rows.append((f"{step['sanitizer']} sanitizer", f"{step['tests']}: {step['summary']}",
                     f"{step['findings']} reports", result))

command = "./scripts/reliability.sh --" + mode
machine = f"{os.cpu_count()} cores, {platform.system()} {platform.release()}"
lines = [f"Command: `{command}`. Date: {datetime.date.today().isoformat()}. Machine: {machine}.", "",
         "| check | what ran | what it found | result |", "|---|---|---|---|"]
lines += [f"| {a} | {b} | {c} | {d} |" for a, b, c, d in rows]
table = "\n".join(lines)
print(table)

if write:
    path = "docs/RELIABILITY.md"
    text = open(path).read()
    begin, end = f"<!-- reliability-{mode}:begin", f"<!-- reliability-{mode}:end -->"
    start = text.index(begin)
    start = text.index("\n", start) + 1
    stop = text.index(end)
    open(path, "w").write(text[:start] + table + "\n" + text[stop:])
    print(f"wrote {path}", file=sys.stderr)
