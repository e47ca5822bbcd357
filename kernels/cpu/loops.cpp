// parallel_for's OpenMP region (loops.h).
#include "loops.h"

namespace tvc::cpu {

void parallel_chunks(int64_t n, int64_t work_per_item, void (*chunk)(void* context, int64_t begin, int64_t end),
                     void* context) {
#ifdef _OPENMP
  const int threads = omp_get_max_threads();
  if (threads > 1 && n > 1 && n * work_per_item > kParallelGrain && !omp_in_parallel()) {
    const int64_t chunks = std::min<int64_t>(threads, n);
    RegionErrors errors;
#pragma omp parallel for schedule(static) num_threads(static_cast <int>(chunks))
    for (int64_t c = 0; c < chunks; ++c) {
      const int64_t begin = n * c / chunks, end = n * (c + 1) / chunks;
      errors.run([&] { chunk(context, begin, end); });
    }
    errors.rethrow();
    return;
  }
#endif
  chunk(context, 0, n);
}

}  // namespace tvc::cpu
