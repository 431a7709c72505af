// libFuzzer's entry for a program with its own `main` (SwiftPM links an executable target's `main` to
// MODULE_main): it parses libFuzzer's flags from argv and calls `callback` with each input.
#include <stddef.h>
#include <stdint.h>

int LLVMFuzzerRunDriver(int *argc, char ***argv, int (*callback)(const uint8_t *data, size_t size));
