import EngineConformance
import EngineLoader
import Foundation
import TestSupport

// storebroker-engine-check PATH.so [--option KEY=VALUE ...] [--only PROPERTY ...] [--rounds N] [--list]
//
// Runs the engine conformance suite (docs/ENGINE-ABI.md "Checking an engine") against any engine file and prints
// one line per property: ok, FAIL with what was seen, or skip with why. Exit status: 0 when every property
// holds, 1 when one fails, 2 when the engine cannot be loaded, 64 for a usage error. Hand-parsed (no
// ArgumentParser) so that the child it spawns of itself starts fast.

let usage = """
    usage: storebroker-engine-check PATH.so [--option KEY=VALUE ...] [--only PROPERTY ...] [--rounds N] [--big-apply N]
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
    case "--big-apply":
        guard let n = Int(value()), n >= 1 else { fail("--big-apply takes a whole number of at least 1", 64) }
        bigApply = n
    default:
        guard !argument.hasPrefix("-"), path == nil else { fail("unexpected argument \(argument.debugDescription)\n\(usage)", 64) }
        path = argument
    }
}
guard let path else { fail("no engine file given\n\(usage)", 64) }

let engine: LoadedEngine
do {
    let absolute = path.hasPrefix("/") ? path : FileManager.default.currentDirectoryPath + "/" + path
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

print("engine \(engine.name) \(engine.version), ABI \(engine.abiMajor).\(engine.abiMinor), \(engine.path)")
let setup = Setup(options: options, checker: checker, rounds: rounds, bigApply: bigApply)
var failed = 0
for property in Conformance.properties where only.isEmpty || only.contains(property.name) {
    let started = Date()
    let outcome = await Conformance.check(property, engine, setup: setup)
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
exit(failed == 0 ? 0 : 1)
