#include "compare.h"

#include <cmath>
#include <limits>

namespace tvc::test {

double relative_error(const Tensor& a, const Tensor& b) {
  if (a.shape() != b.shape()) return std::numeric_limits<double>::infinity();
  std::vector<double> va = a.to_vector(), vb = b.to_vector();
  double diff = 0, ref = 0;
  for (size_t i = 0; i < va.size(); ++i) {
    if (std::isnan(va[i]) && std::isnan(vb[i])) continue;
    if (std::isinf(vb[i]) && va[i] == vb[i]) continue;
    double d = va[i] - vb[i];
    diff += d * d;
    ref += vb[i] * vb[i];
  }
  if (std::isnan(diff)) return std::numeric_limits<double>::infinity();
  return ref > 0 ? std::sqrt(diff / ref) : std::sqrt(diff);
}

}  // namespace tvc::test
