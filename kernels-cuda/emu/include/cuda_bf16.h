// See cuda_fp16.h in this directory (host emulation).
#pragma once
#include "cuda_fp16.h"
