// The one C++ translation unit of the examples and tests: Gloo's implementation.
#include "muon.h"
#define MUON_GLOO_IMPLEMENTATION
#include "muon_gloo.h"
