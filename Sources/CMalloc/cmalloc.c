// CMalloc has only inline functions (include/cmalloc.h); a C target needs one source file.
#include "cmalloc.h"
