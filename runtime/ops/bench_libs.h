// NCCL and cuBLAS, loaded when weftrun bench first calls them, so that weftrun starts without them.
//
// weftrun links no NCCL or cuBLAS library: runtime/ops/nccl_calls.cpp and cublas_calls.cpp define
// the few functions weftrun bench calls (the baselines and the validation) and forward each to the
// library, which they dlopen on the first call. Where it cannot be loaded, the call fails with the
// library's own error code and the reason is logged once; every other command never loads it.
#pragma once

namespace weft::runtime::ops {

// dlopen's handle for `soname` (loaded once, RTLD_NOW | RTLD_LOCAL), or nullptr with the reason logged
// once; `what` names the library in that message ("NCCL").
void* bench_library(const char* soname, const char* what);
// The function `name` of that library, or nullptr (logged once).
void* bench_symbol(void* library, const char* name, const char* what);

}  // namespace weft::runtime::ops
