#!/usr/bin/env bash
# The reliability suite (docs/RELIABILITY.md): kill -9 rounds for every persistent engine, simulated power cuts,
# mutated frames over live connections, load with watchers, and libFuzzer on the wire codec and the wal engine's
# records; the full mode runs them longer and adds the integration suite under AddressSanitizer and the
# in-process suites under ThreadSanitizer.
#
#   scripts/reliability.sh --quick [--write]   # what CI runs (scripts/test.sh): a few minutes, the debug build
#   scripts/reliability.sh --full [--write]    # 20 rounds per engine, 100,000 frames, 1,000 connections for
#                                              # 60 s, 10 minutes per fuzz target, sanitizers: over an hour
#
# Every step prints its figures as a JSON line; the table at the end is made from them, and --write puts it in
# docs/RELIABILITY.md between its markers. Exits 1 when any step fails (after running the others).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

mode=quick
write=no
for argument in "$@"; do
    case "$argument" in
        --quick) mode=quick ;;
        --full) mode=full ;;
        --write) write=yes ;;
        *) echo "usage: $0 [--quick|--full] [--write]" >&2; exit 64 ;;
    esac
done
source scripts/setup.sh

if [ "$mode" = quick ]; then
    configuration=debug rounds=3 frames=10000 fuzz_connections=20 load_connections=200 load_seconds=10
    fuzz_seconds=30
else
    configuration=release rounds=20 frames=100000 fuzz_connections=50 load_connections=1000 load_seconds=60
    fuzz_seconds=600
fi

swift build -c "$configuration" >&2
bin="$(swift build -c "$configuration" --show-bin-path)"
tool="$bin/storebroker-reliability"
work="$(mktemp -d /tmp/sb-reliability.XXXXXX)"
trap 'rm -rf "$work"' EXIT
results="$work/results.jsonl"
: >"$results"
failed=()

# step NAME COMMAND...: runs a step that prints one JSON line of figures.
step() {
    local name="$1"
    shift
    echo "reliability: $name" >&2
    local started=$SECONDS
    if "$@" >"$work/step.json"; then
        cat "$work/step.json" >>"$results"
    else
        failed+=("$name")
        if [ -s "$work/step.json" ]; then cat "$work/step.json" >>"$results"; fi
        echo "reliability: $name FAILED" >&2
    fi
    echo "reliability: $name took $((SECONDS - started)) s" >&2
}

step "self-test" "$tool" self-test
for engine in sqlite disk wal c-example; do
    step "crash $engine" "$tool" crash --engine "$engine" --rounds "$rounds"
done
# A simulated power cut (the checker's power-loss property: the engine's child runs with the power-cut library
# preloaded, and what no sync made durable is lost, or torn): the engines and options that promise to lose
# nothing acknowledged, and sqlite's default, which promises to open undamaged.
power_cut() { # ENGINE [KEY=VALUE]: prints its JSON line
    local engine="$1" option="${2:-}" status=0
    local arguments=("$bin/libstorebroker-engine-$engine.so" --only power-loss --rounds "$rounds")
    if [ -n "$option" ]; then arguments+=(--option "$option"); fi
    "$bin/storebroker-engine-check" "${arguments[@]}" >"$work/power-cut.log" 2>&1 || status=$?
    if [ "$status" -ne 0 ]; then grep -E "FAIL|claim" "$work/power-cut.log" >&2 || cat "$work/power-cut.log" >&2; fi
    printf '{"scenario":"power-cut","engine":"%s","options":"%s","rounds":%s,"passed":%s}\n' \
        "$engine" "$option" "$rounds" "$([ "$status" -eq 0 ] && echo true || echo false)"
}
step "power cut wal FULL" power_cut wal synchronous=FULL
step "power cut wal NORMAL" power_cut wal
step "power cut sqlite FULL" power_cut sqlite synchronous=FULL
step "power cut sqlite NORMAL" power_cut sqlite
step "live fuzz" "$tool" live-fuzz --frames "$frames" --connections "$fuzz_connections" \
    --vectors docs/protocol-vectors.json
step "load" "$tool" load --connections "$load_connections" --seconds "$load_seconds" --watchers 16

# Faults and hostile peers that have tests of their own (docs/RELIABILITY.md, sections 3 and 5): the suite runs
# those tests rather than a second copy of them.
named_tests() { # NAME REGEX: runs the tests REGEX selects; prints a JSON line with their count
    local name="$1" filter="$2" status=0
    swift build --build-tests >&2
    swift test --skip-build --filter "$filter" >"$work/tests.log" 2>&1 || status=$?
    local count
    count="$(sed -nE 's/.*Test run with ([0-9]+) tests?.*/\1/p' "$work/tests.log" | tail -1)"
    local failures
    failures="$(grep -cE "^✘ Test " "$work/tests.log" || true)"
    printf '{"scenario":"tests","name":"%s","tests":%s,"failures":%s,"passed":%s}\n' \
        "$name" "${count:-0}" "$failures" "$([ "$status" -eq 0 ] && echo true || echo false)"
    if [ "$status" -ne 0 ]; then grep -E "^✘" "$work/tests.log" | head -20 >&2; fi
    [ "$status" -eq 0 ]
}
step "faults" named_tests faults \
    "FullDisk|anEngineThatSegfaults|killDashNine|aFailedCommitChangesNothingInMemory|failedChainsLeaveNoTrace|brokenStoresDoNotHideTheOthers|aBadOptionValueFailsOpen|theDaemonSurvivesTheBusGoingAway|withNoBusAtStart|clientThatDisconnectsMidRequest|truncatedFrameThenDisconnect|closedConnectionsLeaveNothingBehind|lostEngineFilesAreABrokenStore"
step "hostile peers" named_tests "hostile peers" \
    "Peers|aPeerOfAnotherUserIsRefused|invalidNamesAndIdsAreRefusedPerRequest|reservedLookingNamesSurviveARestart|aPlantedSecretIsNever|aKeyFileWithTheWrongMode|aWorldWritableFileIsRefused|aFileOwnedByAnotherUserIsRefused|directoriesAboveAnEngineAreChecked|aLinkSwappedDuringTheLoad|BadInput"

# libFuzzer: its own package (a fuzz target has no main of its own), its own build directory.
echo "reliability: building the fuzz targets" >&2
# Built from scratch whenever the code they reach changed: an incremental build of this separate package once
# kept a fuzz module compiled against an enum's old layout (a message type had been added), and the targets
# reported leaks and hangs that a clean build does not have (41 s here).
fuzz_sources="$(cat Package.swift Fuzz/Package.swift $(find Sources/Wire Sources/StoreModel Sources/OrderedStorage Sources/WALFormat Sources/StorageEngineKit Sources/CStorageEngine Sources/ErrorShape Fuzz/Sources -type f | sort) | sha256sum)"
if [ "$(cat .build-fuzz/sources.sha256 2>/dev/null)" != "$fuzz_sources" ]; then
    rm -rf .build-fuzz/x86_64-unknown-linux-gnu .build-fuzz/debug .build-fuzz/*.yaml .build-fuzz/build.db
fi
swift build --package-path Fuzz --scratch-path .build-fuzz -Xswiftc -sanitize=fuzzer,address \
    -Xswiftc -parse-as-library 2>&1 | { grep -v "Cannot export local symbol" || true; } >&2
echo "$fuzz_sources" > .build-fuzz/sources.sha256
python3 Fuzz/seeds.py docs/protocol-vectors.json "$work/corpus"
fuzz() { # TARGET: prints its JSON line; fails on a finding
    local target="$1" log="$work/$1.log"
    mkdir -p "$work/$target-found"
    local status=0
    .build-fuzz/debug/"$target" -max_total_time="$fuzz_seconds" -rss_limit_mb=4096 -print_final_stats=1 \
        -artifact_prefix="$work/$target-found/" "$work/corpus/$target" >"$log" 2>&1 || status=$?
    local runs
    runs="$(awk '/^stat::number_of_executed_units:/ { print $2 }' "$log")"
    local found
    found="$(ls "$work/$target-found" | head -1)"
    if [ -n "$found" ]; then
        mkdir -p .build-fuzz/findings
        cp "$work/$target-found/$found" ".build-fuzz/findings/$target-$found"
        echo "reliability: $target found $found (kept in .build-fuzz/findings):" >&2
        grep -E "ERROR|Fatal error|precondition" "$log" | head -5 >&2
    fi
    local passed=true
    if [ "$status" -ne 0 ] || [ -n "$found" ]; then passed=false; fi
    printf '{"scenario":"libfuzzer","target":"%s","seconds":%s,"runs":%s,"passed":%s}\n' \
        "$target" "$fuzz_seconds" "${runs:-0}" "$passed"
    [ "$passed" = true ]
}
for target in FuzzFrames FuzzMessages FuzzServerSession FuzzWALRecords; do
    step "libFuzzer $target" fuzz "$target"
done

if [ "$mode" = full ]; then
    sanitized() { # NAME SANITIZER FILTER: the tests FILTER selects, built with SANITIZER
        local name="$1" sanitizer="$2" filter="$3" status=0
        # The executables export their symbols, so that engine plugins built with ThreadSanitizer find its
        # runtime (linked into the executable) when dlopen loads them (undefined symbol __tsan_external_write).
        swift build --build-tests --sanitize="$sanitizer" --scratch-path ".build-$sanitizer" \
            -Xlinker --export-dynamic >&2
        # Every process (the test runner, each daemon and storectl the tests start) writes its reports to a file
        # of its own under $reports: a daemon's standard error often goes to a log its test removes.
        local reports="$work/$name-reports"
        mkdir -p "$reports"
        # Leaks are not reported here (the live fuzz and load steps watch resident memory instead): the daemon
        # keeps caches and engine tables until exit, and LeakSanitizer would turn every clean stop into a failure.
        # A segmentation fault is left to the system: one test makes an engine crash on purpose.
        local options="handle_segv=0:log_path=$reports/report"
        # Swift's own crash backtracer is off: it reads other threads' stacks when a process crashes (one test
        # crashes a daemon on purpose), which AddressSanitizer reports as a dynamic-stack-buffer-overflow in
        # CrashHandlerLinux's memserver_read; the sanitizer's report is the diagnosis here.
        # A hang is a failure (timeout's status 124), not a stuck run: the suites take minutes under a sanitizer.
        # Tests that bound the daemon's resident memory skip themselves (STOREBROKER_SANITIZER): the quarantine of
        # freed memory and the shadow memory make it meaningless; the plain build's steps check memory.
        STOREBROKER_SANITIZER="$sanitizer" SWIFT_BACKTRACE=enable=no ASAN_OPTIONS="detect_leaks=0:$options" \
            TSAN_OPTIONS="suppressions=$PWD/Tests/tsan-suppressions.txt:$options" \
            timeout --kill-after=60 2700 \
            swift test --skip-build --sanitize="$sanitizer" --scratch-path ".build-$sanitizer" --filter "$filter" \
            >"$work/$name.log" 2>&1 || status=$?
        local summary
        summary="$(grep -E "Test run with [0-9]+ tests" "$work/$name.log" | tail -1 | sed 's/"/\\"/g')"
        local findings
        findings="$(cat "$reports"/* 2>/dev/null | grep -cE "^(==[0-9]+==ERROR|WARNING: ThreadSanitizer)" || true)"
        if [ "$findings" -gt 0 ]; then
            mkdir -p ".build-$sanitizer/findings"
            cp "$reports"/* ".build-$sanitizer/findings/"
            echo "reliability: $name: $findings reports (kept in .build-$sanitizer/findings):" >&2
            cat "$reports"/* | grep -E "^(==[0-9]+==ERROR|WARNING: ThreadSanitizer|SUMMARY)" | head -10 >&2
        fi
        if [ "$status" -ne 0 ]; then grep -E "✘|failed" "$work/$name.log" | head -10 >&2; fi
        printf '{"scenario":"sanitizer","sanitizer":"%s","tests":"%s","summary":"%s","findings":%s,"passed":%s}\n' \
            "$sanitizer" "$filter" "$summary" "$findings" "$([ "$status" -eq 0 ] && [ "$findings" -eq 0 ] && echo true || echo false)"
        [ "$status" -eq 0 ] && [ "$findings" -eq 0 ]
    }
    suites="IntegrationTests|BrokerCoreTests|BrokerServerTests|WireTests|ClientTests"
    step "AddressSanitizer" sanitized asan address "$suites"
    step "ThreadSanitizer" sanitized tsan thread "$suites"
fi

python3 scripts/reliability_table.py "$results" "$mode" "$write"
if ((${#failed[@]} > 0)); then
    echo "reliability: FAILED: ${failed[*]}" >&2
    exit 1
fi
echo "reliability: every step passed" >&2
