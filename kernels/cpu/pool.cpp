#include "cpu_kernels.h"

namespace tvc::cpu {

void register_pool_kernels(KernelRegistry&) {}

}  // namespace tvc::cpu
