#include "cpu_kernels.h"

namespace tvc::cpu {

void register_conv_kernels(KernelRegistry&) {}

}  // namespace tvc::cpu
