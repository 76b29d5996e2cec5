// The one CUDA translation unit: muon's CUDA compute backend (nvcc -O2 -fmad=false -c).
#define MUON_CUDA_IMPLEMENTATION
#include "muon.h"
#include "muon_cuda.h"
