import EngineConformance
import EngineLoader
import Foundation
import TestSupport

// storebroker-engine-check PATH.so [--option KEY=VALUE ...] [--only PROPERTY ...] [--rounds N] [--list]
//
// Runs the engine conformance suite (docs/ENGINE-ABI.md "Checking an engine") against any engine file and prints
// one line per property: ok, FAIL with what was seen, or skip with why. Exit status: 0 when every property
// holds, 1 when one fails, 2 when the engine cannot be loaded, 64 for a usage error. Each property runs in a
// child process of its own (`--property-child`), so that an engine that crashes or hangs fails that property
// and never takes the checker down. Hand-parsed (no ArgumentParser) so that the children start fast.

let usage = """
    usage: storebroker-engine-check PATH.so [--option KEY=VALUE ...] [--only PROPERTY ...] [--rounds N] [--big-apply N]
                                    [--timeout SECONDS]
           storebroker-engine-check --list
    Checks a storebroker storage engine against the engine ABI's contract, property by property.

    """

func fail(_ message: String, _ status: Int32) -> Never {
    FileHandle.standardError.write(Data("storebroker-engine-check: \(message)\n".utf8))
    exit(status)
}

var arguments = Array(CommandLine.arguments.dropFirst())
if arguments.first == "--crash-child" {
    exit(Conformance.crashChild(Array(arguments.dropFirst())))
}
if arguments.contains("--list") {
    for property in Conformance.properties { print("\(property.name): \(property.claim)") }
    exit(0)
}
if arguments.isEmpty || arguments.contains("--help") || arguments.contains("-h") {
    print(usage, terminator: "")
    exit(arguments.isEmpty ? 64 : 0)
}

var path: String?
var options: [String: String] = [:]
var only: [String] = []
var rounds = 4
var bigApply = 50_000
/// How long one property may take before its engine counts as hung.
var timeout = 600.0
/// Set in the child that runs one property for the parent.
var childProperty: String?
while !arguments.isEmpty {
    let argument = arguments.removeFirst()
    func value() -> String {
        guard !arguments.isEmpty else { fail("\(argument) needs a value\n\(usage)", 64) }
        return arguments.removeFirst()
    }
    switch argument {
    case "--option":
        let pair = value()
        guard let equals = pair.firstIndex(of: "="), equals != pair.startIndex else {
            fail("--option takes KEY=VALUE, got \(pair.debugDescription)", 64)
        }
        options[String(pair[..<equals])] = String(pair[pair.index(after: equals)...])
    case "--only":
        let name = value()
        guard Conformance.properties.contains(where: { $0.name == name }) else {
            fail("no property \(name.debugDescription); --list shows them", 64)
        }
        only.append(name)
    case "--rounds":
        guard let n = Int(value()), n >= 1 else { fail("--rounds takes a whole number of at least 1", 64) }
        rounds = n
    case "--timeout":
        guard let seconds = Double(value()), seconds > 0 else { fail("--timeout takes a number of seconds above 0", 64) }
        timeout = seconds
    case "--property-child":
        childProperty = value()
    case "--big-apply":
        guard let n = Int(value()), n >= 1 else { fail("--big-apply takes a whole number of at least 1", 64) }
        bigApply = n
    default:
        guard !argument.hasPrefix("-"), path == nil else { fail("unexpected argument \(argument.debugDescription)\n\(usage)", 64) }
        path = argument
    }
}
guard let path else { fail("no engine file given\n\(usage)", 64) }

let absolute = path.hasPrefix("/") ? path : FileManager.default.currentDirectoryPath + "/" + path
let engine: LoadedEngine
do {
    // Held to the name storebrokerd loads it by, its file's: what the checker passes, the daemon loads.
    let fileName = String(absolute.split(separator: "/").last ?? "")
    guard let name = EngineSearchPath.engineName(inFileName: fileName) else {
        fail(
            "cannot load \(path): storebrokerd finds an engine NAME as libstorebroker-engine-NAME.so, and would never "
                + "load this file", 2)
    }
    engine = try EngineLoader(searchPath: EngineSearchPath(directories: [])).load(path: absolute, expectedName: name)
} catch {
    fail("cannot load \(path): \(error.description)", 2)
}
guard let checker = EngineSearchPath.currentExecutablePath() else { fail("cannot find my own executable", 2) }

let setup = Setup(options: options, checker: checker, rounds: rounds, bigApply: bigApply)

/// What starts the line on which a child gives its outcome's kind (the reason or message follows it): an engine
/// that prints to stdout itself cannot be taken for it.
let outcomeMarker = "storebroker-engine-check outcome: "

if let childProperty {
    // The child that runs one property.
    guard let property = Conformance.properties.first(where: { $0.name == childProperty }) else {
        fail("no property \(childProperty.debugDescription)", 64)
    }
    switch await Conformance.check(property, engine, setup: setup) {
    case .passed: print("\n\(outcomeMarker)ok")
    case .skipped(let reason): print("\n\(outcomeMarker)skip\n\(reason)")
    case .failed(let message): print("\n\(outcomeMarker)fail\n\(message)")
    }
    exit(0)
}

/// Runs `property` in a child of its own: what it found, or that the engine crashed or hung.
@MainActor func checkAlone(_ property: Property, in directory: String) async -> Outcome {
    var childArguments = [
        checker, absolute, "--property-child", property.name, "--rounds", "\(rounds)", "--big-apply", "\(bigApply)",
    ]
    for (key, value) in options.sorted(by: { $0.key < $1.key }) { childArguments += ["--option", "\(key)=\(value)"] }
    var environment = ProcessInfo.processInfo.environment
    // The parent reports a crash; Swift's backtracer, symbolicating one, sometimes never finished.
    environment["SWIFT_BACKTRACE"] = "enable=no"
    let child: ChildProcess
    do {
        child = try ChildProcess(
            childArguments, stdoutPath: directory + "/\(property.name).out",
            stderrPath: directory + "/\(property.name).err", in: directory, environment: environment)
    } catch {
        fail("cannot start \(checker) to check property \(property.name): \(error)", 2)
    }
    let started = Date()
    let status = await child.wait(atMost: timeout)
    let output = child.stdout
    if status == 0, let marker = output.range(of: "\n" + outcomeMarker, options: .backwards) {
        let rest = output[marker.upperBound...]
        let newline = rest.firstIndex(of: "\n") ?? rest.endIndex
        let detail = rest[newline...].trimmingCharacters(in: .newlines)
        switch rest[..<newline] {
        case "ok": return .passed
        case "skip": return .skipped(detail)
        case "fail": return .failed(detail)
        default: break
        }
    }
    let said = child.stderr.split(separator: "\n").suffix(3).joined(separator: " | ")
    let why = said.isEmpty ? "" : " (its last words: \(said))"
    if Date().timeIntervalSince(started) >= timeout {
        let limit = String(format: "%g", timeout)
        return .failed("no result within \(limit) s: the engine hangs, and was killed (--timeout)\(why)")
    }
    if status > 128 { return .failed("the engine crashed (signal \(status - 128))\(why)") }
    return .failed("the child process that ran it exited with status \(status)\(why)")
}

print("engine \(engine.name) \(engine.version), ABI \(engine.abiMajor).\(engine.abiMinor), \(engine.path)")
var failed = 0
let work = FileManager.default.temporaryDirectory.appendingPathComponent("sb-check-\(getpid())").path
do {
    try FileManager.default.createDirectory(atPath: work, withIntermediateDirectories: true)
} catch {
    fail("cannot create \(work) for the children's output: \(error)", 2)
}
for property in Conformance.properties where only.isEmpty || only.contains(property.name) {
    let started = Date()
    let outcome = await checkAlone(property, in: work)
    let time = String(format: "%.2f s", Date().timeIntervalSince(started))
    switch outcome {
    case .passed: print("ok    \(property.name) (\(time))")
    case .skipped(let reason): print("skip  \(property.name): \(reason)")
    case .failed(let message):
        failed += 1
        print("FAIL  \(property.name): \(message)\n      claim: \(property.claim)")
    }
}
print(failed == 0 ? "every property holds" : "\(failed) propert\(failed == 1 ? "y" : "ies") failed")
try? FileManager.default.removeItem(atPath: work)
exit(failed == 0 ? 0 : 1)
