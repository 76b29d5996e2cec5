/* The one translation unit with muon_nccl.h's implementation: plain C over the CUDA runtime and
   NCCL host APIs (no nvcc). Link with -lnccl -lcudart, or, in the tests, with the stand-ins. */
#define MUON_NCCL_IMPLEMENTATION
#include "muon_nccl.h"
