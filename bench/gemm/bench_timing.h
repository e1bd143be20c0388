// Timing helpers shared by the GEMM benchmarks: median of CUDA-event-timed launches after warm-ups.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <functional>
#include <vector>

#include "tests/kernels/gemm_testing.cuh"

namespace weft::bench {

inline double median(std::vector<float> v) {
  std::sort(v.begin(), v.end());
  return v.size() % 2 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]);
}

// Times `launch(set_index)` iters times after 5 warm-ups, each between two events on `stream`;
// `before(start)` runs ahead of each timed launch, once its start event is recorded (e.g. to start
// work on another stream that waits for that event). Median milliseconds.
template <class F, class G>
double time_ms(int iters, int sets, cudaStream_t stream, F&& launch, G&& before) {
  cudaEvent_t t0, t1;
  WEFT_CUDA_OK(cudaEventCreate(&t0));
  WEFT_CUDA_OK(cudaEventCreate(&t1));
  for (int i = 0; i < 5; ++i) launch(i % sets);
  WEFT_CUDA_OK(cudaDeviceSynchronize());
  std::vector<float> ms(static_cast<size_t>(iters), 0.f);
  for (int i = 0; i < iters; ++i) {
    WEFT_CUDA_OK(cudaEventRecord(t0, stream));
    before(t0);
    launch(i % sets);
    WEFT_CUDA_OK(cudaEventRecord(t1, stream));
    WEFT_CUDA_OK(cudaDeviceSynchronize());
    WEFT_CUDA_OK(cudaEventElapsedTime(&ms[size_t(i)], t0, t1));
  }
  WEFT_CUDA_OK(cudaEventDestroy(t0));
  WEFT_CUDA_OK(cudaEventDestroy(t1));
  return median(ms);
}

// Times every candidate `iters` times, interleaved: round i runs candidate (i + j) mod n for j in
// [0, n), each between two events on `stream` after 5 warm-up rounds. Under its power cap the GPU
// changes clock in discrete steps every few dozen launches; timed one after the other, candidates
// would land on different steps. `candidates[c](start)` enqueues run c; `start` is the event
// recorded just before it (for work on another stream that should start with it). Medians in ms.
inline std::vector<double> time_interleaved(int iters, cudaStream_t stream,
                                            const std::vector<std::function<void(cudaEvent_t)>>& candidates) {
  const size_t n = candidates.size();
  std::vector<cudaEvent_t> ev(2 * n * size_t(iters));
  for (auto& e : ev) WEFT_CUDA_OK(cudaEventCreate(&e));
  cudaEvent_t warm;
  WEFT_CUDA_OK(cudaEventCreate(&warm));
  for (int i = 0; i < 5; ++i)
    for (const auto& c : candidates) {
      WEFT_CUDA_OK(cudaEventRecord(warm, stream));
      c(warm);
    }
  WEFT_CUDA_OK(cudaDeviceSynchronize());
  for (int i = 0; i < iters; ++i)
    for (size_t j = 0; j < n; ++j) {
      const size_t c = (size_t(i) + j) % n;
      cudaEvent_t* e = &ev[(c * size_t(iters) + size_t(i)) * 2];
      WEFT_CUDA_OK(cudaEventRecord(e[0], stream));
      candidates[c](e[0]);
      WEFT_CUDA_OK(cudaEventRecord(e[1], stream));
      WEFT_CUDA_OK(cudaDeviceSynchronize());  // the next run starts with nothing else in flight
    }
  std::vector<double> out(n);
  std::vector<float> t(static_cast<size_t>(iters));
  for (size_t c = 0; c < n; ++c) {
    for (int i = 0; i < iters; ++i) {
      const cudaEvent_t* e = &ev[(c * size_t(iters) + size_t(i)) * 2];
      WEFT_CUDA_OK(cudaEventElapsedTime(&t[size_t(i)], e[0], e[1]));
    }
    out[c] = median(t);
  }
  for (auto& e : ev) cudaEventDestroy(e);
  cudaEventDestroy(warm);
  return out;
}

template <class F>
double time_ms(int iters, int sets, F&& launch) {
  return time_ms(iters, sets, nullptr, launch, [](cudaEvent_t) {});
}

}  // namespace weft::bench
