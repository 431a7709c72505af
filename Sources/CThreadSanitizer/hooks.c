// The hooks are inline functions in include/thread_sanitizer_hooks.h; SwiftPM needs one source file.
