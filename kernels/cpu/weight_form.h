// Forms of a weight that a kernel reads instead of the weight itself (packed for a micro-kernel,
// transformed for Winograd), kept with the weight's storage between calls (not installed).
#pragma once

#include <cstdint>
#include <memory>

#include "loops.h"
#include "tvc/storage.h"
#include "tvc/tensor.h"

namespace tvc::cpu {

// Which form (Storage::DerivedKey's first number). The key's other numbers are the weight's
// storage offset and two of its sizes, so views of one storage keep forms of their own. A form's
// layout must not depend on the active instruction set (set_isa can change it between calls)
// unless only sets that share it make that form (the 7-row panels: the AVX-512 sets) or the key
// tells the layouts apart (standard_panels_form).
enum class WeightForm : int64_t {
  rows_of_7_panels = 1,  // W^T (K, N) of a contiguous (N, K) weight packed for gemm_rows_of_7
  winograd = 2,          // a 3x3 convolution's weights transformed for Winograd F(4x4, 3x3)
  standard_panels = 3,   // W^T (K, N) of a contiguous (N, K) weight packed for GemmTile::standard
  a_panels = 4,          // a contiguous (M, K) weight (per group) packed as gemm_a_panels' A
  contiguous = 5,        // a contiguous copy of a weight that is not (a channels-last model's)
};

// The key of standard panels `width` columns wide (the active set's gemm_tile_columns(): 32 on
// AVX-512, 16 on AVX2, 8 on the generic set): a form of its own per width, since each lays the
// panels out by its width.
inline WeightForm standard_panels_form(int64_t width) {
  return static_cast<WeightForm>(static_cast<int64_t>(WeightForm::standard_panels) + (width << 8));
}

// The key of A panels of tiles `rows` high in K blocks `depth` deep (the active set's
// gemm_tile_rows() and gemm_k_block()): a form of its own per layout, as standard_panels_form.
inline WeightForm a_panels_form(int64_t rows, int64_t depth) {
  return static_cast<WeightForm>(static_cast<int64_t>(WeightForm::a_panels) + (rows << 8) + (depth << 16));
}

// Whether a form of w is kept between calls: the op allows it (`may_keep`: LinearParams',
// Conv2dParams' keep_weight_forms) and w's storage keeps derived data (Storage::derived).
inline bool keeps_weight_forms(const Tensor& w, bool may_keep) { return may_keep && w.storage()->keeps_derived(); }

// w's values in a contiguous tensor: w itself where it is contiguous; else a copy, kept with w's
// storage where its forms are kept (keeps_weight_forms), so that the forms made from the copy (kept
// with the copy's storage) serve the next calls too, as a contiguous weight's do (a channels-last
// model's weights were copied, and their forms made, on every call). The key tells views of one
// storage apart by their sizes and strides.
inline Tensor contiguous_weight(const Tensor& w, bool may_keep) {
  if (w.is_contiguous() || !keeps_weight_forms(w, may_keep)) return w.contiguous();
  uint64_t layout = 0;
  for (size_t d = 0; d < w.shape().size(); ++d)
    layout = (layout * 1000003 + static_cast<uint64_t>(w.shape()[d])) * 1000003 + static_cast<uint64_t>(w.stride(d));
  const Storage::DerivedKey key{static_cast<int64_t>(WeightForm::contiguous), w.storage_offset(), w.numel(),
                                static_cast<int64_t>(layout >> 1)};
  if (const std::shared_ptr<const void> kept = w.storage()->derived(key))
    return *static_cast<const Tensor*>(kept.get());
  auto copy = std::make_shared<const Tensor>(w.contiguous());
  w.storage()->set_derived(key, copy);
  return *copy;
}

// Whether w's storage keeps the form `form` of w (sizes a and b in the key) now.
inline bool has_weight_form(const Tensor& w, WeightForm form, int64_t a, int64_t b) {
  return w.storage()->derived({static_cast<int64_t>(form), w.storage_offset(), a, b}) != nullptr;
}

// The form of the float32 weight w (contiguous, sizes a and b in the key) made by
// make(w's values, destination) into `floats` floats: kept with w's storage where `may_keep` (the
// op's keep_weight_forms: LinearParams, Conv2dParams) and the storage keeps derived data
// (Storage::derived; held by `hold` for the call), else made into the calling thread's scratch
// slot Slot for this call.
template <int Slot, typename Make>
const float* weight_form(const Tensor& w, bool may_keep, WeightForm form, int64_t a, int64_t b, int64_t floats,
                         Make&& make, std::shared_ptr<const void>& hold) {
  const bool keep = keeps_weight_forms(w, may_keep);
  const Storage::DerivedKey key{static_cast<int64_t>(form), w.storage_offset(), a, b};
  if (keep && (hold = w.storage()->derived(key))) return static_cast<const float*>(hold.get());
  float* dst = keep ? new float[floats] : thread_scratch<float, Slot>(floats);
  make(w.data_ptr<float>(), dst);
  if (!keep) return dst;
  hold = std::shared_ptr<const float[]>(dst);
  w.storage()->set_derived(key, hold);
  return dst;
}

}  // namespace tvc::cpu
