// The one list of tvc's ops.
//
// Each entry is X(name, kind):
//   KERNEL    - a primitive with kernels per device (kernels/cpu, kernels/cuda) registered
//               under this name, forward and autograd rule in engine/src;
//   COMPOSED  - built from other ops in engine/src, so autograd and every backend come free;
//   BACKWARD  - a kernel used only by the backward rule of a KERNEL op; it is tested through
//               that op's gradcheck and has no row of its own in the op test table.
// The op test table (tests/op_table*.cpp) must hold a row for every KERNEL and COMPOSED op;
// a test checks that.
#pragma once

#include <cstdint>
#include <string_view>

#define TVC_OP_LIST(X)                      \
  /* memory */                              \
  X(copy, KERNEL)                           \
  X(fill, KERNEL)                           \
  X(uniform, KERNEL)                        \
  X(normal, KERNEL)                         \
  X(randint, KERNEL)                        \
  X(bernoulli, COMPOSED)                    \
  X(arange, KERNEL)                         \
  X(linspace, COMPOSED)                     \
  /* views */                               \
  X(view, COMPOSED)                         \
  X(reshape, COMPOSED)                      \
  X(permute, COMPOSED)                      \
  X(transpose, COMPOSED)                    \
  X(slice, COMPOSED)                        \
  X(narrow, COMPOSED)                       \
  X(select, COMPOSED)                       \
  X(expand, COMPOSED)                       \
  X(unsqueeze, COMPOSED)                    \
  X(squeeze, COMPOSED)                      \
  X(flatten, COMPOSED)                      \
  X(contiguous, COMPOSED)                   \
  X(to_dtype, COMPOSED)                     \
  /* elementwise unary */                   \
  X(neg, KERNEL)                            \
  X(abs, KERNEL)                            \
  X(sign, KERNEL)                           \
  X(exp, KERNEL)                            \
  X(log, KERNEL)                            \
  X(sqrt, KERNEL)                           \
  X(rsqrt, KERNEL)                          \
  X(erf, KERNEL)                            \
  X(relu, KERNEL)                           \
  X(relu6, COMPOSED)                        \
  X(leaky_relu, KERNEL)                     \
  X(gelu, KERNEL)                           \
  X(silu, KERNEL)                           \
  X(sigmoid, KERNEL)                        \
  X(hardsigmoid, KERNEL)                    \
  X(hardswish, KERNEL)                      \
  X(tanh, KERNEL)                           \
  X(softplus, KERNEL)                       \
  X(mish, COMPOSED)                         \
  X(clamp, KERNEL)                          \
  X(clamp_backward, BACKWARD)               \
  X(gelu_backward, BACKWARD)                \
  X(pow_scalar, KERNEL)                     \
  /* elementwise binary, broadcasting */    \
  X(add, KERNEL)                            \
  X(sub, KERNEL)                            \
  X(mul, KERNEL)                            \
  X(div, KERNEL)                            \
  X(pow, KERNEL)                            \
  X(maximum, KERNEL)                        \
  X(minimum, KERNEL)                        \
  X(eq, KERNEL)                             \
  X(ne, KERNEL)                             \
  X(lt, KERNEL)                             \
  X(le, KERNEL)                             \
  X(gt, KERNEL)                             \
  X(ge, KERNEL)                             \
  X(where, KERNEL)                          \
  X(lerp, KERNEL)                           \
  X(sgd_momentum, KERNEL)                   \
  X(masked_fill, COMPOSED)                  \
  /* reductions */                          \
  X(sum, KERNEL)                            \
  X(mean, COMPOSED)                         \
  X(var, COMPOSED)                          \
  X(std, COMPOSED)                          \
  X(amax, KERNEL)                           \
  X(amin, KERNEL)                           \
  X(max, COMPOSED)                          \
  X(min, COMPOSED)                          \
  X(argmax, KERNEL)                         \
  X(argmin, KERNEL)                         \
  X(topk, KERNEL)                           \
  /* linear algebra */                      \
  X(bmm, KERNEL)                            \
  X(matmul, COMPOSED)                       \
  X(attention, KERNEL)                      \
  X(attention_backward, BACKWARD)           \
  X(linear, KERNEL)                         \
  X(linear_gelu_linear, KERNEL)             \
  /* convolution and pooling, N,C,H,W */    \
  X(conv2d, KERNEL)                         \
  X(conv2d_backward_input, BACKWARD)        \
  X(conv2d_backward_weight, BACKWARD)       \
  X(conv2d_epilogue, KERNEL)                \
  X(inverted_residual, KERNEL)              \
  X(conv2d_epilogue_max_pool2d, KERNEL)     \
  X(conv1d, COMPOSED)                       \
  X(max_pool2d, KERNEL)                     \
  X(max_pool2d_backward, BACKWARD)          \
  X(avg_pool2d, KERNEL)                     \
  X(avg_pool2d_backward, BACKWARD)          \
  X(adaptive_avg_pool2d, KERNEL)            \
  X(adaptive_avg_pool2d_backward, BACKWARD) \
  X(adaptive_max_pool2d, KERNEL)            \
  X(adaptive_max_pool2d_backward, BACKWARD) \
  /* normalisation */                       \
  X(batch_norm, COMPOSED)                   \
  X(channel_affine, KERNEL)                 \
  X(batch_norm_stats, KERNEL)               \
  X(batch_norm_backward, BACKWARD)          \
  X(layer_norm, KERNEL)                     \
  X(layer_norm_backward, BACKWARD)          \
  X(group_norm, COMPOSED)                   \
  X(softmax, KERNEL)                        \
  X(log_softmax, COMPOSED)                  \
  X(dropout, COMPOSED)                      \
  /* shape and indexing */                  \
  X(cat, COMPOSED)                          \
  X(stack, COMPOSED)                        \
  X(split, COMPOSED)                        \
  X(chunk, COMPOSED)                        \
  X(index_select, KERNEL)                   \
  X(index_add, BACKWARD)                    \
  X(gather, KERNEL)                         \
  X(scatter_add, BACKWARD)                  \
  X(pad, COMPOSED)                          \
  X(roll, COMPOSED)                         \
  X(interpolate, COMPOSED)                  \
  /* losses */                              \
  X(cross_entropy, COMPOSED)                \
  X(nll_loss, COMPOSED)                     \
  X(mse_loss, COMPOSED)                     \
  X(binary_cross_entropy_with_logits, COMPOSED)

namespace tvc {

enum class OpKind : uint8_t { KERNEL, COMPOSED, BACKWARD };

enum class Op : uint16_t {
#define TVC_OP_ENUM(name, kind) name,
  TVC_OP_LIST(TVC_OP_ENUM)
#undef TVC_OP_ENUM
      Count
};
inline constexpr int kNumOps = static_cast<int>(Op::Count);

// A hash (FNV-1a) of the op names in order. A backend built as a library of its own passes the
// one it was compiled with to add_backend, which refuses a backend built against another op list:
// a stale object file whose Op numbers name other ops (nvcc's objects are not rebuilt when this
// header changes).
#define TVC_OP_NAME(name, kind) #name ","
inline constexpr uint64_t kOpListHash = [] {
  uint64_t h = 1469598103934665603ull;
  for (char c : std::string_view(TVC_OP_LIST(TVC_OP_NAME))) h = (h ^ static_cast<unsigned char>(c)) * 1099511628211ull;
  return h;
}();
#undef TVC_OP_NAME

const char* op_name(Op op);
OpKind op_kind(Op op);

}  // namespace tvc
