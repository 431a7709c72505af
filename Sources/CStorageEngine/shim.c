// CStorageEngine is a header-only target (include/storebroker_engine.h); SwiftPM needs one source file.
#include "storebroker_engine.h"
