// The declaration is all this module offers; libFuzzer (linked by -sanitize=fuzzer) defines the function.
