#include "muon.h"
#define MUON_GLOO_IMPLEMENTATION
#include "muon_gloo.h"
