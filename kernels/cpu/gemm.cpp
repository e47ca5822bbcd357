// CPU GEMM, and the bmm, linear and attention kernels. Shape legend: A (M,K), B (K,N), C (M,N), batch B.
//
// BLIS-style blocking (Goto's algorithm), with the loops ordered for a row-major C whose rows
// are the vector direction of the micro-kernel (the roles of BLIS's A and B are swapped):
//   for ic over M by MC:
//     for pc over K by KC:              pack A[ic:+MC, pc:+KC] into MR-row micro-panels (L3)
//       for jc over N by NC:            pack B[pc:+KC, jc:+NC] into NR-column panels (L2)
//         for ir over MC by MR:         one A micro-panel (KC x MR) stays in L1
//           for jr over NC by NR:       micro-kernel: C tile (MR x NR) (+)= Ap @ Bp
// Packing copies through the operands' strides, so transposed or strided A and B need no copy
// beforehand; partial tiles are zero-padded in the packs and written back through a row
// buffer. With few rows of C (as in convolutions) B is read in place when its rows are
// contiguous and a K block of them spans little memory. The 7-row kernels (a convolution's
// positions as C's rows, B a weight packed once) also fetch the next B block into L2 while they
// run. A column-major C is computed as C^T = B^T @ A^T.
//
// Threads split C into a grid of rectangles aligned to MR x NR tiles; each thread runs the
// blocked algorithm on its rectangle with its own packing buffers. K is never split and the KC
// blocking starts at k = 0 whatever the rectangle, so every element of C gets the same sums in
// the same order for any thread count. The micro-kernels (one per instruction set, in
// gemm_kernel_<isa>.cpp) are chosen by register_gemm_kernels for the active instruction set.
#include "gemm.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <type_traits>
#include <vector>

#include "cpu_kernels.h"
#include "gemm_kernels.h"
#include "loops.h"
#include "weight_form.h"

namespace tvc::cpu {
namespace {

// The active instruction set's kernels, set by register_gemm_kernels.
std::atomic<const GemmKernels*> g_kernels{nullptr};

const GemmKernels& active_kernels() {
  const GemmKernels* k = g_kernels.load(std::memory_order_acquire);
  if (!k) {
    kernel_registry();  // fills the registry, which registers the kernels of the default ISA
    k = g_kernels.load(std::memory_order_acquire);
  }
  return *k;
}

template <typename T>
struct KernelFor;
template <>
struct KernelFor<float> {
  static const GemmKernelF32& get(const GemmKernels& k) { return k.f32; }
};
template <>
struct KernelFor<double> {
  static const GemmKernelF64& get(const GemmKernels& k) { return k.f64; }
};
template <>
struct KernelFor<BFloat16> {
  static const GemmKernelBF16& get(const GemmKernels& k) { return k.bf16; }
};

// How the packs hold each input type: one value per element, or for bfloat16 a pair of
// consecutive k per 32-bit element (GemmMicroKernelBF16).
template <typename T>
struct Packing {
  using type = T;
  static constexpr int64_t k_per_element = 1;
};
template <>
struct Packing<BFloat16> {
  using type = uint32_t;
  static constexpr int64_t k_per_element = 2;
};

uint32_t bf16_pair(BFloat16 even, BFloat16 odd) {
  return static_cast<uint32_t>(even.bits) | static_cast<uint32_t>(odd.bits) << 16;
}

// Where finished blocks of C go: the caller's epilogue (or nowhere), told in the caller's
// orientation when this computation runs on C^T.
template <typename T>
struct BlockSink {
  const GemmEpilogue<T>* epilogue = nullptr;
  bool transposed = false;
  void operator()(T* c, int64_t c_rs, int64_t c_cs, int64_t i0, int64_t m, int64_t j0, int64_t n) const {
    if (!epilogue) return;
    if (transposed)
      epilogue->fn(epilogue->ctx, c, c_cs, c_rs, j0, n, i0, m);
    else
      epilogue->fn(epilogue->ctx, c, c_rs, c_cs, i0, m, j0, n);
  }
};

// dst[r * dst_ld ..] = src[r * src_ld ..], `bytes` bytes a row, for r < rows: for the row sizes
// of the micro-kernels' panels a copy whose size is known when compiled (a few vector moves)
// rather than a call of memcpy per row. Measured on Zen 3, 2 threads: the products of a training
// step's weight gradients (A = dY^T, its columns contiguous: six floats a step of k) 768 x 768 x
// 1576 0.90-0.93x the time, 768 x 3072 x 1576 0.90-0.98x; with A and B row-major the same.
template <int64_t Bytes, typename T>
void copy_rows(int64_t rows, const T* src, int64_t src_ld, T* dst, int64_t dst_ld) {
  for (int64_t r = 0; r < rows; ++r) __builtin_memcpy(dst + r * dst_ld, src + r * src_ld, Bytes);
}
template <typename T>
void copy_rows(int64_t bytes, int64_t rows, const T* src, int64_t src_ld, T* dst, int64_t dst_ld) {
  switch (bytes) {
    case 24:  // AVX2's 6-row panels of float
      return copy_rows<24>(rows, src, src_ld, dst, dst_ld);
    case 32:
      return copy_rows<32>(rows, src, src_ld, dst, dst_ld);
    case 48:
      return copy_rows<48>(rows, src, src_ld, dst, dst_ld);
    case 64:
      return copy_rows<64>(rows, src, src_ld, dst, dst_ld);
    case 128:
      return copy_rows<128>(rows, src, src_ld, dst, dst_ld);
    default:
      for (int64_t r = 0; r < rows; ++r) std::memcpy(dst + r * dst_ld, src + r * src_ld, bytes);
  }
}

// Packs A[0:mc, 0:kc] (strides rs, cs) into ceil(mc/mr) micro-panels of kc x mr (element [k][i]
// at panel[k * mr + i]), zero-padding the rows past mc.
template <typename T>
void pack_a(int64_t mc, int64_t kc, int64_t mr, const T* A, int64_t rs, int64_t cs, T* dst) {
  for (int64_t i0 = 0; i0 < mc; i0 += mr, dst += kc * mr) {
    int64_t rows = std::min(mr, mc - i0);
    if (rows < mr) std::fill(dst, dst + kc * mr, T(0));
    if (rs == 1) {
      copy_rows(rows * static_cast<int64_t>(sizeof(T)), kc, A + i0, cs, dst, mr);
    } else if (std::is_same_v<T, float> && cs == 1) {  // row-major A (a convolution's weights)
      active_kernels().pack_transposed(kc, rows, reinterpret_cast<const float*>(A + i0 * rs), rs,
                                       reinterpret_cast<float*>(dst), mr);
    } else {
      // A transpose: in chunks of 16 columns so the rows' cache lines are read once.
      for (int64_t k0 = 0; k0 < kc; k0 += 16) {
        int64_t k1 = std::min(kc, k0 + 16);
        for (int64_t i = 0; i < rows; ++i) {
          const T* src = A + (i0 + i) * rs;
          for (int64_t k = k0; k < k1; ++k) dst[k * mr + i] = src[k * cs];
        }
      }
    }
  }
}

// Packs B[0:kc, 0:nc] (strides rs, cs) into ceil(nc/nr) micro-panels of kc x nr (element [k][j]
// at panel[k * nr + j]), zero-padding the columns past nc.
// B's rows contiguous (cs == 1) are read one at a time from end to end across the panels: a B not
// in cache (a convolution's input) streams, where panel by panel every step of k was a miss in a
// new row (measured on Sapphire Rapids, 2 threads, 1x1 convolutions of inputs out of cache).
template <typename T>
void pack_b(int64_t kc, int64_t nc, int64_t nr, const T* B, int64_t rs, int64_t cs, T* dst) {
  if (cs == 1) {
    const int64_t last = (nc - 1) / nr * nr;  // the last panel's first column
    if (nc - last < nr) std::fill(dst + last * kc, dst + (last + nr) * kc, T(0));
    const int64_t bytes = nr * static_cast<int64_t>(sizeof(T));
    for (int64_t k = 0; k < kc; ++k) {  // row k of each full panel, then of the last one
      copy_rows(bytes, nc / nr, B + k * rs, nr, dst + k * nr, kc * nr);
      if (last + nr > nc) std::memcpy(dst + last * kc + k * nr, B + last + k * rs, (nc - last) * sizeof(T));
    }
    return;
  }
  for (int64_t j0 = 0; j0 < nc; j0 += nr, dst += kc * nr) {
    int64_t cols = std::min(nr, nc - j0);
    if (cols < nr) std::fill(dst, dst + kc * nr, T(0));
    if (std::is_same_v<T, float> && rs == 1) {  // a linear layer's weight
      active_kernels().pack_transposed(kc, cols, reinterpret_cast<const float*>(B + j0 * cs), cs,
                                       reinterpret_cast<float*>(dst), nr);
    } else {
      for (int64_t j = 0; j < cols; ++j) {
        const T* src = B + (j0 + j) * cs;
        for (int64_t k = 0; k < kc; ++k) dst[k * nr + j] = src[k * rs];
      }
    }
  }
}

// The bfloat16 packs: as above over pairs of k (element [p][i] of an A panel at panel[p * mr + i],
// [p][j] of a B panel at panel[p * nr + j], kp = ceil(kc / 2) pairs), an odd kc's last pair and
// the rows or columns past the edge zero.
void pack_a(int64_t mc, int64_t kc, int64_t mr, const BFloat16* A, int64_t rs, int64_t cs, uint32_t* dst) {
  const int64_t kp = (kc + 1) / 2, full = kc / 2;
  for (int64_t i0 = 0; i0 < mc; i0 += mr, dst += kp * mr) {
    int64_t rows = std::min(mr, mc - i0);
    if (rows < mr) std::fill(dst, dst + kp * mr, 0u);
    for (int64_t i = 0; i < rows; ++i) {
      const BFloat16* src = A + (i0 + i) * rs;
      for (int64_t p = 0; p < full; ++p) dst[p * mr + i] = bf16_pair(src[2 * p * cs], src[(2 * p + 1) * cs]);
      if (kc % 2) dst[full * mr + i] = bf16_pair(src[(kc - 1) * cs], BFloat16());
    }
  }
}

void pack_b(int64_t kc, int64_t nc, int64_t nr, const BFloat16* B, int64_t rs, int64_t cs, uint32_t* dst) {
  const int64_t kp = (kc + 1) / 2, full = kc / 2;
  for (int64_t j0 = 0; j0 < nc; j0 += nr, dst += kp * nr) {
    int64_t cols = std::min(nr, nc - j0);
    if (cols < nr) std::fill(dst, dst + kp * nr, 0u);
    const BFloat16* b = B + j0 * cs;
    if (cs == 1) {  // two rows of B interleaved
      for (int64_t p = 0; p < kp; ++p) {
        const BFloat16* even = b + 2 * p * rs;
        uint32_t* d = dst + p * nr;
        if (2 * p + 1 < kc)
          for (int64_t j = 0; j < cols; ++j) d[j] = bf16_pair(even[j], even[rs + j]);
        else
          for (int64_t j = 0; j < cols; ++j) d[j] = bf16_pair(even[j], BFloat16());
      }
    } else if (rs == 1 && cs % 2 == 0 && reinterpret_cast<uintptr_t>(b) % 4 == 0) {
      // A linear layer's weight: each column's pairs are 32-bit words in place, transposed by the
      // float32 kernel (which only moves bits).
      active_kernels().pack_transposed(full, cols, reinterpret_cast<const float*>(b), cs / 2,
                                       reinterpret_cast<float*>(dst), nr);
      if (kc % 2)
        for (int64_t j = 0; j < cols; ++j) dst[full * nr + j] = bf16_pair(b[j * cs + kc - 1], BFloat16());
    } else {
      for (int64_t j = 0; j < cols; ++j)
        for (int64_t p = 0; p < kp; ++p)
          dst[p * nr + j] =
              bf16_pair(b[j * cs + 2 * p * rs], 2 * p + 1 < kc ? b[j * cs + (2 * p + 1) * rs] : BFloat16());
    }
  }
}

// Up to this many rows of C, B is read in place where it can be (see gemm_blocked); measured
// on Zen 4: 3-8% faster at 64 and 128 rows, mixed at 256, slower beyond.
constexpr int64_t kBInPlaceRows = 128;
// Unless a K block of B's rows spans more than this many bytes (each step of k a new row, and
// across that span a new page for every few rows): a B not in this core's cache (a layer's input
// written by the layer before, by both threads, or one that has left the cache) then costs a miss
// per row and step that no prefetcher follows, where packing reads each row from end to end.
// Measured on Sapphire Rapids, 2 threads, 1x1 convolutions with inputs not in cache (16 taken in
// turn): packing 0.65-0.8x the time in place at batch 8 from 28x28 (32 -> 16, 144 -> 32, 192 -> 32,
// 256 -> 128; 0.1-1.6 MB a block) and at 14x14 (96 -> 64, 192 -> 64; 75-150 KB), at batch 1
// 0.7-0.95x from 450 KB a block (144 -> 32 at 28x28) up, slower below 150 KB (14x14: 1.1-1.2x, 32
// -> 16 at 28x28: 1.5x); in MobileNet v2 at batch 8 its 28x28 and 14x14 projections 0.72-0.9x.
constexpr int64_t kBInPlaceBlockBytes = int64_t{128} << 10;
// Up to this many columns of C, A is read in place where it can be (see gemm_blocked): along
// its columns (measured on Zen 4), or along its rows (a convolution's weights; measured on
// Sapphire Rapids: 25-28% faster at 49 columns, 7-15% at 196 and 392, mixed at 784, slower at
// 3136).
constexpr int64_t kAInPlaceColumns = 256;
constexpr int64_t kARowsInPlaceColumns = 512;
// Except when A's rows lie a multiple of this many bytes apart: a micro-panel's MR rows then map
// to one set of the 8-way L1 data cache (4 KiB per way), and reading them in place misses on
// every step of k (the 1x1 convolutions of 1024 and 2048 channels; packed, measured on Zen 4:
// 1024 -> 256 at 14x14 0.79 -> 0.63 ms at batch 1, 6.9 -> 5.7 ms at batch 8; 2048 -> 512 at
// 7x7 the same at batch 1, 7.0 -> 5.6 ms at batch 8). Other strides up to 2 KiB apart (six rows
// to a set) measured slower packed.
constexpr int64_t kAliasingRowBytes = 4096;
// The first row panel of a block packs B's panels as it reads them (GemmMicroKernelPackF32) instead
// of a packing pass before it, for a C of up to kFusedPackRows rows (few uses of each B value to
// pay for a pass of its own) whose B is in cache (the caller says so: a convolution's input of at
// most a few MB) or has at most kFusedPackAnyDepth rows in a K block. Measured on Sapphire Rapids,
// 2 threads, MobileNet v2's pointwise projections: at batch 1 (inputs in cache) 32 -> 16 at
// 112x112 0.14 -> 0.08 ms, 96 -> 24 and 144 -> 24 (+ residual) at 56x56 0.10 -> 0.086 and 0.148
// -> 0.118 ms, 144/192 -> 32 at 28x28 10-17% faster; at batch 8 (inputs from memory) 32 -> 16
// 1.3 -> 0.75 ms, but 96 -> 24 0.75 -> 0.9 ms (the strided reads of B cost more than a pass
// along its rows there), and 256 -> 64 at 56x56 1.7x slower from memory.
constexpr int64_t kFusedPackRows = 48;
constexpr int64_t kFusedPackAnyDepth = 32;
// The floats of a cache line: each step of k of a micro-kernel fetches one line ahead.
constexpr int64_t kFloatsPerLine = 16;

// The micro-kernel for the last n columns of a tile: a narrow form of micro when kn has one that
// covers n (GemmKernelF32::narrow), else micro itself. For the last m rows of a packed panel, a
// short form where one covers them (GemmKernelF32::short_rows, full width; the 7-row kernel's
// last_rows). The last partial tile is always packed, whatever form A's whole tiles are read in.
template <typename Kernel, typename Micro>
Micro narrow_kernel(const Kernel& kn, Micro micro, int64_t m, int64_t n) {
  if constexpr (std::is_same_v<GemmKernelF32, Kernel>) {
    if (micro == kn.micro && m <= 8 && m < kn.mr) {
      const Micro short_rows = kn.short_rows[m <= 4 ? 0 : 1];
      if (short_rows) return short_rows;
    }
  }
  if constexpr (std::is_same_v<GemmRowsKernelF32, Kernel>) {
    if (micro == kn.micro && m < kn.mr && kn.last_rows[m - 1]) return kn.last_rows[m - 1];
  }
  if constexpr (std::is_base_of_v<GemmKernelF32, Kernel>) {
    const int64_t vectors = (n + kn.lanes - 1) / kn.lanes;
    if (vectors < kn.nr / kn.lanes) {
      const Micro narrow = micro == kn.micro          ? kn.narrow[vectors - 1]
                           : micro == kn.micro_a_rows ? kn.narrow_a_rows[vectors - 1]
                                                      : nullptr;
      if (narrow) return narrow;
    }
  }
  return micro;
}

// The rows of C a kernel's tiles take: 14 for a 7-row kernel with its two-tile form (two tiles
// at once where a panel has more than 7 rows), else its MR.
template <typename Kernel>
int64_t tile_rows(const Kernel& kn) {
  if constexpr (std::is_same_v<Kernel, GemmRowsKernelF32>)
    if (kn.micro_14) return 2 * kn.mr;
  return kn.mr;
}

// Where the call-th of a K block's `calls` 7-row micro-kernel calls on a panel fetches from (one
// line per step of k, kc lines): the calls spread their fetches of the next block's panel (`floats`
// long, from `next`) evenly, each window starting an equal step after the one before and all
// inside that panel, rather than the first few calls fetching all of it (kc lines each) and the
// rest the blocks after it. Measured on Sapphire Rapids, 2 threads, ViT-B/16's linear layers with
// their weights from memory: 3.5-8% faster (ViT-B/16 at batch 1 4%, Swin-T 1.5-3%).
const float* spread_ahead(const float* next, int64_t floats, int64_t calls, int64_t call, int64_t kc) {
  const int64_t lines = floats / kFloatsPerLine, step = (lines + calls - 1) / calls;
  return next + std::max<int64_t>(0, std::min(call * step, lines - kc)) * kFloatsPerLine;
}

// How gemm_blocked reads B: through its strides, packing each block (or reading its rows in place
// where they are contiguous and few rows of C use them), the same with the caller's word that B is
// in the cores' caches (gemm's b_in_cache), or as full-depth NR-column panels packed beforehand
// (pack_b_panels; the 7-row kernel's B always).
enum class BRead { strides, strides_in_cache, panels };

// One thread's share: the blocked algorithm of the file comment on C[0:M, 0:N], which is the
// block at (i_off, j_off) of the whole C; each MR-row panel of a C block goes to sink once its
// last K block is done (still in L1).
// T is the inputs' type, Acc the type of C and of the sums (float for bfloat16 inputs, packed in
// pairs of k: KC is even, so every K block starts a pair).
template <typename T, typename Acc, typename Kernel>
void gemm_blocked(const Kernel& kn, int64_t M, int64_t N, int64_t K, const T* A, int64_t a_rs, int64_t a_cs, const T* B,
                  int64_t b_rs, int64_t b_cs, Acc* C, int64_t c_rs, int64_t c_cs, Acc beta, const BlockSink<Acc>& sink,
                  int64_t i_off, int64_t j_off, BRead b_read, bool a_panels) {
  using P = typename Packing<T>::type;
  constexpr int64_t per = Packing<T>::k_per_element;
  const int64_t mr = tile_rows(kn), nr = kn.nr;
  const int64_t MC = std::min((M + mr - 1) / mr * mr, kn.mc / mr * mr);
  const int64_t NC = std::min((N + nr - 1) / nr * nr, kn.nc);
  const int64_t KC = std::min(K, kn.kc);
  P* ap = thread_scratch<P, 2>(MC * ((KC + per - 1) / per));
  P* bp = thread_scratch<P, 3>((KC + per - 1) / per * NC);
  // With few rows each element of B is used too few times to pay for packing it: when B's rows
  // are contiguous its full NR-column panels are read in place, and only a partial one is packed.
  // The same for A with few columns: its full MR-row panels in place, read down its columns when
  // they are contiguous, else along its rows when those are (for bfloat16, when each pair of k is
  // a 32-bit word of the row: K and the row stride even, A 4-byte aligned).
  // B packed whole beforehand (b_read panels) is read as it is; the 7-row kernel's A is read in place;
  // A packed whole beforehand (a_panels: gemm_a_panels' panels, each K block of all rows after
  // the one before, a_rs apart; i_off the thread's first row) is read as it is.
  constexpr bool rows_kernel = std::is_same_v<Kernel, GemmRowsKernelF32>;
  const bool b_panels = b_read == BRead::panels;
  const bool b_in_place = std::is_same_v<T, P> && !b_panels && b_cs == 1 && M <= kBInPlaceRows &&
                          KC * b_rs * static_cast<int64_t>(sizeof(T)) <= kBInPlaceBlockBytes;
  const bool a_in_place = std::is_same_v<T, P> && !a_panels && a_rs == 1 && (N <= kAInPlaceColumns || rows_kernel);
  const bool pairs_are_words =
      per == 1 || (K % per == 0 && a_rs % per == 0 && reinterpret_cast<uintptr_t>(A) % alignof(P) == 0);
  const bool a_rows_in_place = !a_panels && !a_in_place && a_cs == 1 && N <= kARowsInPlaceColumns && pairs_are_words &&
                               a_rs * static_cast<int64_t>(sizeof(T)) % kAliasingRowBytes != 0;
  // Whole tiles of the last K block may apply the caller's row epilogue in their kernel
  // (GemmRowsEpilogue).
  const GemmRowsEpilogue* rows_epilogue = nullptr;
  GemmMicroKernelEpilogueF32 tile_epilogue = nullptr, tile_epilogue_a_rows = nullptr;
  if constexpr (std::is_same_v<Kernel, GemmKernelF32>) {
    if (sink.epilogue && sink.epilogue->rows && !sink.transposed && beta == Acc(0) && c_cs == 1) {
      const int act = static_cast<int>(sink.epilogue->rows->act);
      tile_epilogue = kn.micro_epilogue[act];
      tile_epilogue_a_rows = kn.micro_a_rows_epilogue[act];
      if (tile_epilogue && tile_epilogue_a_rows) rows_epilogue = sink.epilogue->rows;
    }
  }
  for (int64_t ic = 0; ic < M; ic += MC) {
    int64_t mc = std::min(MC, M - ic);
    for (int64_t pc = 0; pc < K; pc += KC) {
      int64_t kc = std::min(KC, K - pc), kp = (kc + per - 1) / per;  // kp: packed elements per row
      Acc b = pc == 0 ? beta : Acc(1);
      const T* a_block = A + ic * a_rs + pc * a_cs;
      const int64_t a_direct = a_in_place || a_rows_in_place ? mc / mr * mr : 0;  // rows read from A itself
      if (!a_panels && a_direct < mc) pack_a(mc - a_direct, kc, mr, a_block + a_direct * a_rs, a_rs, a_cs, ap);
      for (int64_t jc = 0; jc < N; jc += NC) {
        int64_t nc = std::min(NC, N - jc);
        const T* b_block = B + pc * b_rs + jc * b_cs;
        // The 7-row kernel's B block comes from memory on its first tile rows and from L2 on the
        // others: each tile row fetches its share of the next block's panel into L2 meanwhile
        // (spread_ahead), so few tile rows, as a batch-1 convolution's or linear layer's, do not
        // stall on the weights' first reading.
        // Other kernels get their panel itself (nothing new, where they fetch at all).
        const bool next_in_row = jc + NC < N;
        const int64_t next_pc = next_in_row ? pc : pc + KC < K ? pc + KC : 0, next_jc = next_in_row ? jc + NC : 0;
        const int64_t next_panel_floats = std::min(KC, K - next_pc) * nr;
        int64_t in_place = b_in_place ? nc / nr * nr : 0;  // columns read from B itself
        int64_t fused = 0;                                 // columns packed by the first row panel's micro-kernel
        if constexpr (std::is_same_v<Kernel, GemmKernelF32>)
          if (!b_in_place && !b_panels && b_cs == 1 && M <= kFusedPackRows &&
              (b_read == BRead::strides_in_cache || kc <= kFusedPackAnyDepth) && mc >= mr && kn.micro_pack_b)
            fused = nc / nr * nr;
        if (!b_panels && in_place + fused < nc)
          pack_b(kc, nc - in_place - fused, nr, b_block + in_place + fused, b_rs, b_cs, bp + fused * kp);
        for (int64_t ir = 0; ir < mc; ir += mr) {
          auto micro = kn.micro;
          const P* a_panel =
              a_panels ? reinterpret_cast<const P*>(A + pc * a_rs + (i_off + ic + ir) * kc) : ap + (ir - a_direct) * kp;
          int64_t a_ks = mr;
          if (ir < a_direct && a_in_place) {
            a_panel = reinterpret_cast<const P*>(a_block + ir);
            a_ks = a_cs;
          } else if (ir < a_direct) {
            micro = kn.micro_a_rows;
            a_panel = reinterpret_cast<const P*>(a_block + ir * a_rs);
            a_ks = a_rs / per;
          }
          Acc* c_row = C + (ic + ir) * c_rs + jc * c_cs;
          int64_t m = std::min(mr, mc - ir);
          // A row of whole tiles (not packing B) applies the row epilogue in its kernels, the
          // partial last tile passing to sink alone; any other row passes to sink whole.
          const bool tiles_epilogue = rows_epilogue && pc + kc == K && m == mr && !(ir == 0 && fused > 0);
          for (int64_t jr = 0; jr < nc; jr += nr) {
            bool direct = jr < in_place;
            const int64_t n = std::min(nr, nc - jr);
            const P* b_panel = b_panels ? reinterpret_cast<const P*>(B) + (jc + jr) / nr * K * nr + pc * nr
                               : direct ? reinterpret_cast<const P*>(b_block) + jr
                                        : bp + (jr - in_place) * kp;
            const P* ahead = b_panel;
            if constexpr (rows_kernel) {
              const P* next_panel = next_jc + jr < N ? B + (next_jc + jr) / nr * K * nr + next_pc * nr : nullptr;
              // The i-th call (in 7-row tiles) on this panel of the block fetches its share of the next.
              auto ahead_of = [&](int64_t call) {
                return next_panel ? spread_ahead(next_panel, next_panel_floats, (mc + kn.mr - 1) / kn.mr, call, kc)
                                  : b_panel;
              };
              if (kn.micro_14 && m > kn.mr && m < 2 * kn.mr && micro == kn.micro && kn.last_rows[0]) {
                // A last pair short of 14 rows (ViT-B/16's 1576 tokens at batch 8 end in 8): its
                // first tile whole, the rest in a short form, rather than 14 rows made.
                narrow_kernel(kn, micro, kn.mr, n)(kp, a_panel, a_ks, b_panel, nr, b, c_row + jr * c_cs, c_rs, c_cs,
                                                   kn.mr, n, ahead_of(ir / kn.mr));
                kn.last_rows[m - kn.mr - 1](kp, a_panel + kn.mr, a_ks, b_panel, nr, b, c_row + kn.mr * c_rs + jr * c_cs,
                                            c_rs, c_cs, m - kn.mr, n, ahead_of(ir / kn.mr + 1));
                continue;
              }
              if (kn.micro_14 && m > kn.mr) {  // two tiles at once, in two halves of the panel
                const auto micro_14 = micro == kn.micro ? kn.micro_14 : kn.micro_14_a_rows;
                for (int64_t h = 0; h < n; h += nr / 2)
                  micro_14(kp, a_panel, a_ks, b_panel + h, nr, b, c_row + (jr + h) * c_cs, c_rs, c_cs, m,
                           std::min(nr / 2, n - h), ahead_of(ir / kn.mr + h / (nr / 2)));
                continue;
              }
              ahead = ahead_of(ir / kn.mr);
            }
            const bool packs = ir == 0 && jr < fused;  // (fused: 0 but for GemmKernelF32)
            if constexpr (std::is_same_v<Kernel, GemmKernelF32>) {
              if (tiles_epilogue && n == nr) {
                const GemmRowEpilogue& r = rows_epilogue->of;
                const int64_t i = i_off + ic + ir, j = j_off + jc + jr;
                const GemmRowEpilogue e{r.scale ? r.scale + i : nullptr, r.shift ? r.shift + i : nullptr,
                                        r.residual ? r.residual + i * r.r_rs + j : nullptr, r.r_rs};
                (micro == kn.micro_a_rows ? tile_epilogue_a_rows : tile_epilogue)(
                    kp, a_panel, a_ks, b_panel, direct ? b_rs : nr, b, c_row + jr, c_rs, e);
                continue;
              }
              if (packs)
                (micro == kn.micro_a_rows ? kn.micro_a_rows_pack_b : kn.micro_pack_b)(
                    kp, a_panel, a_ks, b_block + jr, b_rs, b, c_row + jr * c_cs, c_rs, c_cs, m, n, bp + jr * kp);
            }
            if (!packs)
              narrow_kernel(kn, micro, m, n)(kp, a_panel, a_ks, b_panel, direct ? b_rs : nr, b, c_row + jr * c_cs, c_rs,
                                             c_cs, m, n, ahead);
            if (tiles_epilogue) sink(c_row + jr * c_cs, c_rs, c_cs, i_off + ic + ir, m, j_off + jc + jr, n);
          }
          if (pc + kc == K && !tiles_epilogue) sink(c_row, c_rs, c_cs, i_off + ic + ir, m, j_off + jc, nc);
        }
      }
    }
  }
}

// C = beta * C (the K == 0 case).
template <typename T>
void scale_c(int64_t M, int64_t N, T* C, int64_t c_rs, int64_t c_cs, T beta, const BlockSink<T>& sink) {
  for (int64_t i = 0; i < M; ++i)
    for (int64_t j = 0; j < N; ++j) {
      T& c = C[i * c_rs + j * c_cs];
      c = beta == T(0) ? T(0) : beta * c;
    }
  sink(C, c_rs, c_cs, 0, M, 0, N);
}

// Small products: plain dot products, cheaper than packing. Each element sums over k in order.
template <typename T, typename Acc>
void gemm_small(int64_t M, int64_t N, int64_t K, const T* A, int64_t a_rs, int64_t a_cs, const T* B, int64_t b_rs,
                int64_t b_cs, Acc* C, int64_t c_rs, int64_t c_cs, Acc beta, const BlockSink<Acc>& sink) {
  for (int64_t i = 0; i < M; ++i)
    for (int64_t j = 0; j < N; ++j) {
      Acc s = 0;
      for (int64_t k = 0; k < K; ++k) s += Acc(A[i * a_rs + k * a_cs]) * Acc(B[k * b_rs + j * b_cs]);
      Acc& c = C[i * c_rs + j * c_cs];
      c = beta == Acc(0) ? s : s + beta * c;
    }
  sink(C, c_rs, c_cs, 0, M, 0, N);
}

// Up to this many multiply-adds the small path is used (it wins for these sizes).
constexpr int64_t kSmallGemm = 8 * 8 * 8;
// Each thread gets at least this many multiply-adds.
constexpr int64_t kGemmWorkPerThread = int64_t{1} << 18;

}  // namespace

GemmGrid gemm_thread_grid(int64_t threads, int64_t mtiles, int64_t ntiles, int64_t mr, int64_t nr) {
  GemmGrid best{1, threads};
  double best_cost = -1;
  for (int64_t tm = 1; tm <= threads; ++tm) {
    if (threads % tm != 0) continue;
    int64_t tn = threads / tm;
    double rows = static_cast<double>((mtiles + tm - 1) / tm * mr);
    double cols = static_cast<double>((ntiles + tn - 1) / tn * nr);
    double cost = rows * cols + 16.0 * (rows + cols);  // per unit of K
    if (best_cost < 0 || cost < best_cost) best = {tm, tn}, best_cost = cost;
  }
  return best;
}

namespace {

// Few rows of C (a linear layer's batch) times a B whose columns are contiguous (x @ W^T with W
// row-major), or one column of C (a matrix-vector product, as a squeeze-excitation block's 1x1
// convolutions of a pooled map) with A's rows contiguous: each element is one dot product of an
// A row and a B column, both read in place, since packing costs more than so few products per
// element. Columns (rows, for one column) are split over threads and every dot product runs in a
// fixed order, so results do not depend on the threads. The kernel takes several rows of A at once
// against each column (DotRowsF32), loading the column's vectors once for them: measured on Zen 4,
// 2 threads, 8 x 960 -> 1280 (MobileNet v3's classifier at batch 8) 0.24-0.27 -> 0.17 ms, 4 x 1280
// -> 1000 0.14 -> 0.078 ms (AVX2 0.9x); 8 x 2048 -> 1000 the same (its 8 MB weight from memory).
constexpr int64_t kDotRows = 8;

void gemm_dots(int64_t M, int64_t N, int64_t K, const float* A, int64_t a_rs, const float* B, int64_t b_cs, float* C,
               int64_t c_rs, int64_t c_cs, float beta, const BlockSink<float>& sink) {
  const DotRowsF32 dot_rows = active_kernels().dot_rows;
  // Rows [i0, i1) of C's column j, in chunks whose sums the kernel makes together (each of B's
  // vectors loaded once for several rows of A).
  auto column_rows = [&](int64_t j, int64_t i0, int64_t i1) {
    constexpr int64_t kChunk = 64;
    float sums[kChunk];
    for (int64_t r0 = i0; r0 < i1; r0 += kChunk) {
      const int64_t rows = std::min(kChunk, i1 - r0);
      dot_rows(K, A + r0 * a_rs, a_rs, rows, B + j * b_cs, sums);
      for (int64_t r = 0; r < rows; ++r) {
        float& c = C[(r0 + r) * c_rs + j * c_cs];
        c = beta == 0.f ? sums[r] : sums[r] + beta * c;
      }
    }
  };
  if (N == 1) {
    parallel_for(M, K, [&](int64_t i0, int64_t i1) {
      column_rows(0, i0, i1);
      sink(C + i0 * c_rs, c_rs, c_cs, i0, i1 - i0, 0, 1);
    });
    return;
  }
  if (M == 1) {
    // One row of A (a matrix-vector product: a linear layer at batch 1): several of B's columns
    // against it at once, each read as its own stream (the kernel's rows), A's vectors loaded once
    // for them. Each product is that of A's row against one column (the multiplications commute,
    // the sums run in the same order): the same bits. Measured on Sapphire Rapids, 2 threads, in
    // the networks at batch 1 (alternating): MobileNet v3's classifier 960 -> 1280 -> 1000
    // 0.131-0.149 -> 0.107-0.119 ms a layer, ResNet-50's 2048 -> 1000 0.36 -> 0.29 ms; alone, with
    // 16 weights taken in turn, 0.100-0.117 -> 0.093-0.098 ms (960 -> 1280).
    parallel_for(N, K, [&](int64_t j0, int64_t j1) {
      constexpr int64_t kChunk = 64;
      float sums[kChunk];
      for (int64_t c0 = j0; c0 < j1; c0 += kChunk) {
        const int64_t cols = std::min(kChunk, j1 - c0);
        dot_rows(K, B + c0 * b_cs, b_cs, cols, A, sums);
        for (int64_t c = 0; c < cols; ++c) {
          float& out = C[(c0 + c) * c_cs];
          out = beta == 0.f ? sums[c] : sums[c] + beta * out;
        }
      }
      sink(C + j0 * c_cs, c_rs, c_cs, 0, 1, j0, j1 - j0);
    });
    return;
  }
  parallel_for(N, M * K, [&](int64_t j0, int64_t j1) {
    for (int64_t j = j0; j < j1; ++j) column_rows(j, 0, M);
    sink(C + j0 * c_cs, c_rs, c_cs, 0, M, j0, j1 - j0);
  });
}

template <typename T, typename Acc, typename Kernel>
void gemm_packed(const Kernel& kn, int64_t M, int64_t N, int64_t K, const T* A, int64_t a_rs, int64_t a_cs, const T* B,
                 int64_t b_rs, int64_t b_cs, Acc* C, int64_t c_rs, int64_t c_cs, Acc beta, const BlockSink<Acc>& sink,
                 BRead b_read, bool a_panels = false) {
  const int64_t mr = tile_rows(kn);
  int64_t mtiles = (M + mr - 1) / mr, ntiles = (N + kn.nr - 1) / kn.nr;
  int64_t threads = 1;
#ifdef _OPENMP
  if (!omp_in_parallel())
    threads = std::clamp<int64_t>(M * N * K / kGemmWorkPerThread, 1,
                                  std::min<int64_t>(omp_get_max_threads(), mtiles * ntiles));
#endif
  auto run = [&](int64_t t, int64_t team) {
    GemmGrid g = gemm_thread_grid(team, mtiles, ntiles, mr, kn.nr);
    int64_t ti = t / g.tn, tj = t % g.tn;
    int64_t m0 = std::min(M, mtiles * ti / g.tm * mr);
    int64_t m1 = std::min(M, mtiles * (ti + 1) / g.tm * mr);
    int64_t n0 = std::min(N, ntiles * tj / g.tn * kn.nr);
    int64_t n1 = std::min(N, ntiles * (tj + 1) / g.tn * kn.nr);
    if (m0 < m1 && n0 < n1)
      gemm_blocked(kn, m1 - m0, n1 - n0, K, a_panels ? A : A + m0 * a_rs, a_rs, a_cs,
                   b_read == BRead::panels ? B + n0 / kn.nr * K * kn.nr : B + n0 * b_cs, b_rs, b_cs,
                   C + m0 * c_rs + n0 * c_cs, c_rs, c_cs, beta, sink, m0, n0, b_read, a_panels);
  };
  if (threads == 1) return run(0, 1);
#ifdef _OPENMP
  RegionErrors errors;
#pragma omp parallel num_threads(static_cast <int>(threads))
  errors.run([&] { run(omp_get_thread_num(), omp_get_num_threads()); });
  errors.rethrow();
#endif
}

// gemm_any's forms other than the blocked one: a column-major C (computed transposed), products
// of at most kSmallGemm multiply-adds (gemm_small), float32 dot products (gemm_dots).
bool column_major(int64_t c_rs, int64_t c_cs) { return c_rs == 1 && c_cs != 1; }
bool is_small(int64_t M, int64_t N, int64_t K) { return M * N * K <= kSmallGemm; }
bool takes_dots(int64_t M, int64_t N, int64_t a_cs, int64_t b_rs) {
  return (M <= kDotRows || N == 1) && a_cs == 1 && b_rs == 1;
}

template <typename T, typename Acc>
void gemm_any(int64_t M, int64_t N, int64_t K, const T* A, int64_t a_rs, int64_t a_cs, const T* B, int64_t b_rs,
              int64_t b_cs, Acc* C, int64_t c_rs, int64_t c_cs, Acc beta, const BlockSink<Acc>& sink,
              bool b_in_cache = false) {
  if (M <= 0 || N <= 0) return;
  if (K <= 0) return scale_c(M, N, C, c_rs, c_cs, beta, sink);
  // A column-major C is computed as C^T = B^T @ A^T, so the micro-kernel writes along rows.
  if (column_major(c_rs, c_cs))
    return gemm_any(N, M, K, B, b_cs, b_rs, A, a_cs, a_rs, C, c_cs, c_rs, beta,
                    BlockSink<Acc>{sink.epilogue, !sink.transposed});
  if (is_small(M, N, K)) return gemm_small(M, N, K, A, a_rs, a_cs, B, b_rs, b_cs, C, c_rs, c_cs, beta, sink);
  if constexpr (std::is_same_v<T, float>)
    if (takes_dots(M, N, a_cs, b_rs)) return gemm_dots(M, N, K, A, a_rs, B, b_cs, C, c_rs, c_cs, beta, sink);
  gemm_packed(KernelFor<T>::get(active_kernels()), M, N, K, A, a_rs, a_cs, B, b_rs, b_cs, C, c_rs, c_cs, beta, sink,
              b_in_cache ? BRead::strides_in_cache : BRead::strides);
}

// The NR of tile's float32 kernel.
int64_t panel_columns(GemmTile tile) {
  const GemmKernels& k = active_kernels();
  return tile == GemmTile::rows_of_7 ? k.f32_rows7.nr : k.f32.nr;
}

}  // namespace

template <typename T>
void gemm(int64_t M, int64_t N, int64_t K, const T* A, int64_t a_rs, int64_t a_cs, const T* B, int64_t b_rs,
          int64_t b_cs, T* C, int64_t c_rs, int64_t c_cs, T beta, const GemmEpilogue<T>* epilogue, bool b_in_cache) {
  gemm_any(M, N, K, A, a_rs, a_cs, B, b_rs, b_cs, C, c_rs, c_cs, beta, BlockSink<T>{epilogue, false}, b_in_cache);
}
bool has_rows_of_7_kernel() { return active_kernels().f32_rows7.mr != 0; }
int64_t gemm_tile_columns() { return active_kernels().f32.nr; }
int64_t gemm_tile_rows() { return active_kernels().f32.mr; }
int64_t gemm_k_block() { return active_kernels().f32.kc; }
int64_t rows_of_7_tile_columns() { return active_kernels().f32_rows7.nr; }
int64_t packed_b_floats(GemmTile tile, int64_t K, int64_t N) {
  const int64_t nr = panel_columns(tile);
  return (N + nr - 1) / nr * nr * K;
}
void pack_b_panels(GemmTile tile, int64_t K, int64_t N, const float* B, int64_t b_rs, int64_t b_cs, float* panels) {
  const int64_t nr = panel_columns(tile);
  parallel_for((N + nr - 1) / nr, K * nr, [&](int64_t q0, int64_t q1) {
    const int64_t j0 = q0 * nr, j1 = std::min(N, q1 * nr);
    pack_b(K, j1 - j0, nr, B + j0 * b_cs, b_rs, b_cs, panels + j0 * K);
  });
}
void gemm_b_panels(GemmTile tile, int64_t M, int64_t N, int64_t K, const float* A, int64_t a_rs, int64_t a_cs,
                   const float* b_panels, float* C, int64_t c_rs, int64_t c_cs, float beta,
                   const GemmEpilogue<float>* epilogue) {
  if (M <= 0 || N <= 0) return;
  const BlockSink<float> sink{epilogue, false};
  if (K <= 0) return scale_c(M, N, C, c_rs, c_cs, beta, sink);
  const GemmKernels& k = active_kernels();
  if (tile == GemmTile::rows_of_7)
    return gemm_packed(k.f32_rows7, M, N, K, A, a_rs, a_cs, b_panels, 0, 0, C, c_rs, c_cs, beta, sink, BRead::panels);
  gemm_packed(k.f32, M, N, K, A, a_rs, a_cs, b_panels, 0, 0, C, c_rs, c_cs, beta, sink, BRead::panels);
}
int64_t packed_a_floats(int64_t M, int64_t K) {
  const int64_t mr = gemm_tile_rows();
  return (M + mr - 1) / mr * mr * K;
}
void pack_a_panels(int64_t M, int64_t K, const float* A, int64_t a_rs, int64_t a_cs, float* a_panels) {
  const int64_t mr = gemm_tile_rows(), KC = gemm_k_block(), padded = (M + mr - 1) / mr * mr;
  parallel_for(padded / mr, K * mr, [&](int64_t q0, int64_t q1) {
    const int64_t i0 = q0 * mr, i1 = std::min(M, q1 * mr);
    for (int64_t pc = 0; pc < K; pc += KC) {
      const int64_t kc = std::min(KC, K - pc);
      pack_a(i1 - i0, kc, mr, A + i0 * a_rs + pc * a_cs, a_rs, a_cs, a_panels + pc * padded + i0 * kc);
    }
  });
}
bool gemm_takes_a_panels(int64_t M, int64_t N, int64_t K, int64_t b_rs, int64_t c_rs, int64_t c_cs) {
  return !column_major(c_rs, c_cs) && !is_small(M, N, K) && !takes_dots(M, N, 1, b_rs);
}
void gemm_a_panels(int64_t M, int64_t N, int64_t K, const float* a_panels, const float* B, int64_t b_rs, int64_t b_cs,
                   float* C, int64_t c_rs, int64_t c_cs, float beta, const GemmEpilogue<float>* epilogue,
                   bool b_in_cache) {
  if (M <= 0 || N <= 0) return;
  const BlockSink<float> sink{epilogue, false};
  if (K <= 0) return scale_c(M, N, C, c_rs, c_cs, beta, sink);
  const int64_t mr = gemm_tile_rows();  // a K block of the panels: every row, padded to whole tiles
  gemm_packed(active_kernels().f32, M, N, K, a_panels, (M + mr - 1) / mr * mr, 1, B, b_rs, b_cs, C, c_rs, c_cs, beta,
              sink, b_in_cache ? BRead::strides_in_cache : BRead::strides, true);
}
void gemm_rows_of_7_offsets(int64_t first_tile, int64_t last_tile, const RowsOf7Input& in, int64_t N, int64_t K,
                            const float* b_panels, float* C, int64_t c_rs, int64_t c_cs,
                            const GemmEpilogue<float>* epilogue) {
  const GemmRowsKernelF32& kn = active_kernels().f32_rows7;
  const int64_t panels = (N + kn.nr - 1) / kn.nr, KC = std::min(K, kn.kc), tiles = last_tile - first_tile;
  const BlockSink<float> sink{epilogue, false};
  // Tiles by column panel, panel by panel: a thread's consecutive tiles share their B panel, and
  // they run through it one K block at a time (each tile's blocks in order, each summed from zero,
  // as gemm's), so the block is read from memory once and from L2 by the other tiles. Meanwhile
  // the tiles fetch the thread's next block into L2, each its share (spread_ahead): with few tiles
  // a panel, as at batch 1, the weights' first reading from memory would otherwise stall the
  // micro-kernel.
  parallel_for(panels * tiles, kn.mr * kn.nr * K, [&](int64_t q0, int64_t q1) {
    for (int64_t panel = q0 / tiles; panel * tiles < q1; ++panel) {
      const int64_t t0 = first_tile + std::max(q0 - panel * tiles, int64_t{0}),
                    t1 = first_tile + std::min(q1 - panel * tiles, tiles);
      const int64_t j0 = panel * kn.nr, n = std::min(kn.nr, N - j0), vectors = (n + kn.lanes - 1) / kn.lanes;
      const bool narrow = vectors < kn.nr / kn.lanes;
      const GemmMicroKernelOffsetsF32 micro = narrow ? kn.narrow_offsets[vectors - 1] : kn.micro_offsets;
      const GemmMicroKernelF32 micro_columns = narrow ? kn.narrow[vectors - 1] : kn.micro;
      // Panels of one or two vectors take their tiles two at a time (through offsets).
      const GemmMicroKernelOffsetsPairF32 pair = vectors <= 2 && in.k_offsets ? kn.pair_offsets[vectors - 1] : nullptr;
      const float* b = b_panels + j0 * K;
      for (int64_t pc = 0; pc < K; pc += KC) {
        const int64_t kc = std::min(KC, K - pc);
        // The next block: this panel's next K block, else the next panel's first (after the last
        // panel whatever memory follows: a prefetch never faults).
        const float* next = pc + KC < K ? b + (pc + KC) * kn.nr : b + K * kn.nr;
        const int64_t next_floats = (pc + KC < K ? std::min(KC, K - pc - KC) : std::min(KC, K)) * kn.nr;
        for (int64_t t = t0; t < t1; ++t) {
          float* c = C + t * kn.mr * c_rs + j0 * c_cs;
          auto ahead_of = [&](int64_t call) { return spread_ahead(next, next_floats, t1 - t0, call, kc); };
          const float* ahead = ahead_of(t - t0);
          if (!in.k_offsets && kn.micro_14 && (n % (kn.nr / 2) == 0 || n % (kn.nr / 2) > kn.lanes) && t + 1 < t1 &&
              in.tile_starts[t + 1] == in.tile_starts[t] + kn.mr) {
            // Two tiles of consecutive positions at once, half a panel at a time, where each half
            // has more than one vector of columns (else the tiles one at a time, on narrow kernels).
            for (int64_t h = 0; h < n; h += kn.nr / 2)
              kn.micro_14(kc, in.a + in.tile_starts[t] + pc * in.k_stride, in.k_stride, b + pc * kn.nr + h, kn.nr,
                          pc == 0 ? 0.f : 1.f, c + h * c_cs, c_rs, c_cs, 2 * kn.mr, std::min(kn.nr / 2, n - h),
                          ahead_of(t - t0 + h / (kn.nr / 2)));
            ++t;  // the second tile
          } else if (pair && t + 1 < t1) {
            pair(kc, in.a + in.tile_starts[t], in.a + in.tile_starts[t + 1], in.k_offsets + pc, in.step, b + pc * kn.nr,
                 kn.nr, pc == 0 ? 0.f : 1.f, c, c_rs, c_cs, n, ahead);
            ++t;  // the pair's second tile
          } else if (in.k_offsets)
            micro(kc, in.a + in.tile_starts[t], in.k_offsets + pc, in.step, b + pc * kn.nr, kn.nr, pc == 0 ? 0.f : 1.f,
                  c, c_rs, c_cs, kn.mr, n, ahead);
          else
            micro_columns(kc, in.a + in.tile_starts[t] + pc * in.k_stride, in.k_stride, b + pc * kn.nr, kn.nr,
                          pc == 0 ? 0.f : 1.f, c, c_rs, c_cs, kn.mr, n, ahead);
        }
      }
      for (int64_t t = t0; t < t1; ++t) sink(C + t * kn.mr * c_rs + j0 * c_cs, c_rs, c_cs, t * kn.mr, kn.mr, j0, n);
    }
  });
}
void gemm(int64_t M, int64_t N, int64_t K, const BFloat16* A, int64_t a_rs, int64_t a_cs, const BFloat16* B,
          int64_t b_rs, int64_t b_cs, float* C, int64_t c_rs, int64_t c_cs, float beta,
          const GemmEpilogue<float>* epilogue) {
  gemm_any(M, N, K, A, a_rs, a_cs, B, b_rs, b_cs, C, c_rs, c_cs, beta, BlockSink<float>{epilogue, false});
}
void depthwise_row(int64_t n, int64_t taps, const float* const* rows, const float* w, int64_t stride, float bias,
                   float* y) {
  active_kernels().depthwise_row(n, taps, rows, w, stride, bias, y);
}

void depthwise_channels(int64_t n, int64_t taps, const float* x, const int64_t* offsets, int64_t step, const float* w,
                        const float* bias, const float* scale, const float* shift, RowActivation act, float* y,
                        int64_t y_step) {
  active_kernels().depthwise_channels(n, taps, x, offsets, step, w, bias, scale, shift, act, y, y_step);
}

bool depthwise_channel_rows(int64_t n, int64_t rows, int64_t kw, int64_t pad, int64_t width, const float* x,
                            const int64_t* row_offsets, int64_t step, const float* w, const float* bias,
                            const float* scale, const float* shift, RowActivation act, float* y, int64_t y_step) {
  const DepthwiseChannelRowsF32 kernel = active_kernels().depthwise_channel_rows;
  return kernel && kernel(n, rows, kw, pad, width, x, row_offsets, step, w, bias, scale, shift, act, y, y_step);
}
bool has_depthwise_planes_kernel() { return active_kernels().depthwise_planes != nullptr; }

void depthwise_planes(const DepthwisePlanes& d) { active_kernels().depthwise_planes(d); }

void depthwise_stride2_planes(const DepthwiseStride2Planes& d) { active_kernels().depthwise_stride2_planes(d); }

void transpose_copy(int64_t k_n, int64_t cols, const float* src, int64_t src_ld, float* dst, int64_t dst_ld) {
  active_kernels().pack_transposed(k_n, cols, src, src_ld, dst, dst_ld);
}

void conv_rows(int64_t n, int64_t taps, const float* const* rows, const float* w, int64_t oc, float* y, int64_t y_os) {
  active_kernels().conv_rows(n, taps, rows, w, oc, y, y_os);
}

int64_t conv_rows_lanes() { return active_kernels().f32.lanes; }

void even_copy(int64_t n, const float* src, float* dst) { active_kernels().even_copy(n, src, dst); }
void stream_rows(int64_t rows, int64_t n, const float* src, int64_t src_rs, float* dst, int64_t dst_rs) {
  active_kernels().stream_rows(rows, n, src, src_rs, dst, dst_rs);
}

void max_into(int64_t n, const float* src, int64_t stride, float* dst) {
  active_kernels().max_into(n, src, stride, dst);
}

float dot(int64_t n, const float* a, const float* b) {
  float sum;
  active_kernels().dot_rows(n, a, 0, 1, b, &sum);
  return sum;
}

void epilogue_row(int64_t n, const float* x, float* y, const float* scale, const float* shift, const float* residual,
                  RowActivation act) {
  active_kernels().epilogue(n, x, y, scale, shift, residual, act);
}

void epilogue_channels(int64_t rows, int64_t n, const float* x, int64_t x_rs, float* y, int64_t y_rs,
                       const float* scale, const float* shift, const float* residual, int64_t r_rs, RowActivation act) {
  active_kernels().epilogue_channels(rows, n, x, x_rs, y, y_rs, scale, shift, residual, r_rs, act);
}

void layer_norm_row(int64_t n, const float* x, const float* w, const float* b, float eps, float* y, float* mean,
                    float* rstd) {
  active_kernels().layer_norm(n, x, w, b, eps, y, mean, rstd);
}

void layer_norm_backward_row(int64_t n, const float* dy, const float* x, float mean, float rstd, const float* w,
                             float* dx, float* sum_dy_xhat, float* sum_dy) {
  active_kernels().layer_norm_backward(n, dy, x, mean, rstd, w, dx, sum_dy_xhat, sum_dy);
}

const BatchNormRowsF32& batch_norm_rows() { return active_kernels().batch_norm; }

void column_sums(int64_t rows, int64_t n, int64_t rs, const float* x, double* sums) {
  active_kernels().column_sums(rows, n, rs, x, sums);
}

void gelu_backward(int64_t n, const float* dy, const float* x, float* dx) {
  active_kernels().gelu_backward(n, dy, x, dx);
}

const WinogradF43& winograd_f43() { return active_kernels().winograd; }

void vector_function(VectorFunction f, int64_t n, const float* x, float* y) {
  const GemmKernels& k = active_kernels();
  const UnaryF32 kernels[] = {k.exp, k.sigmoid, k.silu, k.gelu};  // in VectorFunction's order
  kernels[static_cast<int>(f)](n, x, y);
}

void softmax_rows(int64_t rows, int64_t n, const float* x, float* y) { active_kernels().softmax(rows, n, x, y); }
int64_t attention_short_keys() {
  const GemmKernels& k = active_kernels();
  return k.attention_short ? kShortRowVectors * k.f32.lanes : 0;
}

template void gemm<float>(int64_t, int64_t, int64_t, const float*, int64_t, int64_t, const float*, int64_t, int64_t,
                          float*, int64_t, int64_t, float, const GemmEpilogue<float>*, bool);
template void gemm<double>(int64_t, int64_t, int64_t, const double*, int64_t, int64_t, const double*, int64_t, int64_t,
                           double*, int64_t, int64_t, double, const GemmEpilogue<double>*, bool);

namespace {

// Runs one(i) for the products i in [0, batch): batches of small products are split over
// threads (each product then runs on one thread); large ones run one after another, each using
// the threads.
template <typename F>
void for_products(int64_t batch, int64_t work, F&& one) {
  if (batch > 1 && work < 2 * kGemmWorkPerThread) {
    parallel_for(batch, work, [&](int64_t b0, int64_t b1) {
      for (int64_t i = b0; i < b1; ++i) one(i);
    });
  } else {
    for (int64_t i = 0; i < batch; ++i) one(i);
  }
}

// Where a bfloat16 product's float32 blocks go (GemmEpilogue): rounded into out (strides rs, cs).
struct Bf16Output {
  BFloat16* out;
  int64_t rs, cs;
};
void round_into_bf16(const void* ctx, float* c, int64_t c_rs, int64_t c_cs, int64_t i0, int64_t m, int64_t j0,
                     int64_t n) {
  const auto& o = *static_cast<const Bf16Output*>(ctx);
  for (int64_t i = 0; i < m; ++i) {
    BFloat16* dst = o.out + (i0 + i) * o.rs + j0 * o.cs;
    const float* src = c + i * c_rs;
    for (int64_t j = 0; j < n; ++j) dst[j * o.cs] = BFloat16(src[j * c_cs]);
  }
}

// in = (a (B,M,K), b (B,K,N)) -> out (B,M,N). bfloat16 products are summed in float32 (gemm's
// bfloat16 form) and rounded once, or stored as they are into a float32 out; float16 is computed
// in float32 after a conversion.
void bmm_kernel(const KernelArgs& args) {
  const Tensor& a = args.in[0];
  const Tensor& b = args.in[1];
  const Tensor& out = args.out[0];
  int64_t batch = a.shape()[0], M = a.shape()[1], K = a.shape()[2], N = b.shape()[2];
  auto run = [&]<typename T>(const Tensor& ta, const Tensor& tb, const Tensor& tc) {
    const T* pa = static_cast<const T*>(ta.raw_data());
    const T* pb = static_cast<const T*>(tb.raw_data());
    T* pc = static_cast<T*>(tc.raw_data());
    for_products(batch, M * N * K, [&](int64_t i) {
      gemm<T>(M, N, K, pa + i * ta.strides()[0], ta.strides()[1], ta.strides()[2], pb + i * tb.strides()[0],
              tb.strides()[1], tb.strides()[2], pc + i * tc.strides()[0], tc.strides()[1], tc.strides()[2], T(0));
    });
  };
  switch (a.dtype()) {
    case DType::Float32:
      return run.template operator()<float>(a, b, out);
    case DType::Float64:
      return run.template operator()<double>(a, b, out);
    case DType::BFloat16: {
      const auto* pa = static_cast<const BFloat16*>(a.raw_data());
      const auto* pb = static_cast<const BFloat16*>(b.raw_data());
      const bool float_out = out.dtype() == DType::Float32;  // a float32 input's bfloat16 GEMM (linear)
      for_products(batch, M * N * K, [&](int64_t i) {
        const BFloat16* ai = pa + i * a.strides()[0];
        const BFloat16* bi = pb + i * b.strides()[0];
        if (float_out) {
          gemm(M, N, K, ai, a.strides()[1], a.strides()[2], bi, b.strides()[1], b.strides()[2],
               static_cast<float*>(out.raw_data()) + i * out.strides()[0], out.strides()[1], out.strides()[2], 0.f);
          return;
        }
        float* sums = thread_scratch<float, 5>(M * N);
        const Bf16Output o{static_cast<BFloat16*>(out.raw_data()) + i * out.strides()[0], out.strides()[1],
                           out.strides()[2]};
        const GemmEpilogue<float> round{round_into_bf16, &o};
        gemm(M, N, K, ai, a.strides()[1], a.strides()[2], bi, b.strides()[1], b.strides()[2], sums, N, 1, 0.f, &round);
      });
      return;
    }
    case DType::Float16: {
      Tensor a32 = a.to(DType::Float32), b32 = b.to(DType::Float32);
      Tensor c32 = empty(out.shape());
      run.template operator()<float>(a32, b32, c32);
      Tensor(out).copy_(c32);
      return;
    }
    default:
      unsupported_dtype(Op::bmm, a.dtype(), Device::CPU);
  }
}

// Attention's scores are made and used in blocks of rows of at most this many (L, S) elements,
// each block on one thread: a whole (L, S) for ViT's 197 tokens and Swin's 49 (a 197 x 197 block
// is 152 KiB in float32, kept in L2 between its two products).
constexpr int64_t kAttentionScores = int64_t{1} << 16;

// Attention's operands (kernel.h): q (..., L, D), k (..., S, D), v (..., S, Dv), bias and mask
// (..., L, S) or null, from a kernel's inputs from `first` on.
struct AttentionOperands {
  const Tensor &q, &k, &v;
  const Tensor *bias, *mask;
  int64_t rank, L, D, S, Dv, batch;
};
AttentionOperands attention_operands(const KernelArgs& args, size_t first) {
  const AttentionParams& p = args.p<AttentionParams>();
  const Tensor &q = args.in[first], &k = args.in[first + 1], &v = args.in[first + 2];
  const int64_t rank = q.dim(), L = q.shape()[rank - 2], D = q.shape()[rank - 1];
  return {q,
          k,
          v,
          p.bias ? &args.in[first + 3] : nullptr,
          p.mask ? &args.in[first + 3 + p.bias] : nullptr,
          rank,
          L,
          D,
          k.shape()[rank - 2],
          v.shape()[rank - 1],
          q.numel() / (L * D)};
}

// The offset of batch element b in t: its index over the batch dims (all but the last two),
// through t's strides.
int64_t batch_offset(const Tensor& t, int64_t b) {
  int64_t offset = 0;
  for (int64_t d = t.dim() - 3; d >= 0; --d) {
    offset += b % t.shape()[d] * t.strides()[d];
    b /= t.shape()[d];
  }
  return offset;
}

// Rows [r0, r0 + m) of batch element b's attention weights into p (m, S) contiguous:
// softmax(q k^T + bias + mask), the scores summed as bmm's, the additions in that order, each row
// as the softmax kernel's.
template <typename T>
void attention_weights(const AttentionOperands& a, int64_t b, int64_t r0, int64_t m, T* p) {
  const int64_t rank = a.rank, S = a.S;
  gemm<T>(m, S, a.D, a.q.data_ptr<T>() + batch_offset(a.q, b) + r0 * a.q.strides()[rank - 2], a.q.strides()[rank - 2],
          a.q.strides()[rank - 1], a.k.data_ptr<T>() + batch_offset(a.k, b), a.k.strides()[rank - 1],
          a.k.strides()[rank - 2], p, S, 1, T(0));
  for (const Tensor* t : {a.bias, a.mask}) {
    if (!t) continue;
    const T* src = t->data_ptr<T>() + batch_offset(*t, b) + r0 * t->strides()[rank - 2];
    const int64_t rs = t->strides()[rank - 2], cs = t->strides()[rank - 1];
    for (int64_t i = 0; i < m; ++i) {
      T* row = p + i * S;
      const T* from = src + i * rs;
      if (cs == 1)
        for (int64_t j = 0; j < S; ++j) row[j] += from[j];
      else
        for (int64_t j = 0; j < S; ++j) row[j] += from[j * cs];
    }
  }
  softmax_rows(m, S, p, p);
}

// in = (q, k, v, [bias], [mask]) -> out (kernel.h, AttentionParams).
void attention_kernel(const KernelArgs& args) {
  const DenormalsAsZero no_denormals;  // the masked pairs' weights (kernel.h)
  const AttentionOperands a = attention_operands(args, 0);
  const Tensor &q = a.q, &k = a.k, &v = a.v;
  const Tensor *bias = a.bias, *mask = a.mask;
  const Tensor& out = args.out[0];
  const int64_t rank = a.rank, L = a.L, D = a.D, S = a.S, Dv = a.Dv;
  const int64_t batch = a.batch, rows = std::min(L, std::max<int64_t>(1, kAttentionScores / S)),
                blocks = (L + rows - 1) / rows;
  auto run = [&]<typename T>() {
    // Few keys (float32): each block in one pass of the instruction set's kernel, whose sums are
    // those of the steps below wherever gemm makes each of its products as one K block of a
    // micro-kernel (more than kDotRows rows and more than kSmallGemm products, K within kc).
    const GemmKernels& kernels = active_kernels();
    const int64_t lanes = kernels.f32.lanes, padded_keys = (S + lanes - 1) / lanes * lanes;
    const bool short_rows = std::is_same_v<T, float> && S <= attention_short_keys() && Dv > 1 &&
                            std::max(D, S) <= kernels.f32.kc && v.strides()[rank - 1] == 1 &&
                            out.strides()[rank - 1] == 1;
    auto passes_short = [&](int64_t m) {
      return short_rows && m > kDotRows && S > 1 && m * S * std::min(D, Dv) > kSmallGemm;
    };
    note_kernel_path(passes_short(rows) ? "few keys, rows in registers" : "gemm, softmax, gemm");
    // Asks the rows of q, k and v that block `it` reads (k and v only where its batch element is
    // not b's) into L2, while the block before it runs: one pass takes too little time for the
    // hardware's prefetchers to find Swin's windows in memory (512 windows of 3 heads, a batch of
    // 8's first stage, 2 threads: 7.08 -> 6.20 ms).
    auto fetch_item = [&](int64_t it, int64_t b) {
      const int64_t b1 = it / blocks, r1 = it % blocks * rows;
      auto fetch = [&](const Tensor& t, const T* row, int64_t n, int64_t width) {
        constexpr int64_t line = kFloatsPerLine * sizeof(float) / sizeof(T);
        for (int64_t i = 0; i < n; ++i, row += t.strides()[rank - 2])
          for (int64_t j = 0; j < width; j += line) __builtin_prefetch(row + j, 0, 2);
      };
      fetch(q, q.data_ptr<T>() + batch_offset(q, b1) + r1 * q.strides()[rank - 2], std::min(rows, L - r1), D);
      if (b1 == b) return;
      fetch(k, k.data_ptr<T>() + batch_offset(k, b1), S, D);
      fetch(v, v.data_ptr<T>() + batch_offset(v, b1), S, Dv);
    };
    parallel_for(batch * blocks, rows * S * (D + Dv), [&](int64_t first, int64_t last) {
      T* scores = thread_scratch<T, 14>(std::max(rows * S, (D + kShortRowVectors) * padded_keys));
      for (int64_t it = first; it < last; ++it) {
        const int64_t b = it / blocks, r0 = it % blocks * rows, m = std::min(rows, L - r0);
        const T* qb = q.data_ptr<T>() + batch_offset(q, b) + r0 * q.strides()[rank - 2];
        if constexpr (std::is_same_v<T, float>) {
          if (passes_short(m)) {
            if (it + 1 < last) fetch_item(it + 1, b);
            // Row r0 of bias or mask in batch element b, and its strides.
            auto term = [&](const Tensor* t) {
              return t ? t->data_ptr<float>() + batch_offset(*t, b) + r0 * t->strides()[rank - 2] : nullptr;
            };
            auto stride = [&](const Tensor* t, int64_t d) { return t ? t->strides()[d] : 0; };
            kernels.attention_short({.L = m,
                                     .S = S,
                                     .D = D,
                                     .Dv = Dv,
                                     .q = qb,
                                     .q_rs = q.strides()[rank - 2],
                                     .q_cs = q.strides()[rank - 1],
                                     .k = k.data_ptr<float>() + batch_offset(k, b),
                                     .k_rs = k.strides()[rank - 2],
                                     .k_cs = k.strides()[rank - 1],
                                     .v = v.data_ptr<float>() + batch_offset(v, b),
                                     .v_rs = v.strides()[rank - 2],
                                     .bias = term(bias),
                                     .bias_rs = stride(bias, rank - 2),
                                     .bias_cs = stride(bias, rank - 1),
                                     .mask = term(mask),
                                     .mask_rs = stride(mask, rank - 2),
                                     .mask_cs = stride(mask, rank - 1),
                                     .out = out.data_ptr<float>() + batch_offset(out, b) + r0 * out.strides()[rank - 2],
                                     .out_rs = out.strides()[rank - 2],
                                     .scratch = scores});
            continue;
          }
        }
        attention_weights(a, b, r0, m, scores);
        gemm<T>(m, Dv, S, scores, S, 1, v.data_ptr<T>() + batch_offset(v, b), v.strides()[rank - 2],
                v.strides()[rank - 1], out.data_ptr<T>() + batch_offset(out, b) + r0 * out.strides()[rank - 2],
                out.strides()[rank - 2], out.strides()[rank - 1], T(0));
      }
    });
  };
  if (q.dtype() == DType::Float32) return run.template operator()<float>();
  if (q.dtype() == DType::Float64) return run.template operator()<double>();
  unsupported_dtype(Op::attention, q.dtype(), Device::CPU);
}

// The (rows, cols) matrix at src (strides rs, cs) as a dense row-major one: src itself where it is
// one, else copied into dst.
template <typename T>
const T* dense_matrix(const T* src, int64_t rows, int64_t cols, int64_t rs, int64_t cs, T* dst) {
  if (cs == 1 && (rs == cols || rows == 1)) return src;
  for (int64_t i = 0; i < rows; ++i)
    if (cs == 1)
      std::copy_n(src + i * rs, cols, dst + i * cols);
    else
      for (int64_t j = 0; j < cols; ++j) dst[i * cols + j] = src[i * rs + j * cs];
  return dst;
}

// in = (dout, q, k, v, [bias], [mask]) -> out = (dq, dk, dv[, ds]) (kernel.h, AttentionParams).
// Each batch element on one thread: its q, k, v and dout as dense matrices (copied into the
// thread's scratch where they are not: products of Swin's 49 x 32 windows read strided operands
// at 1.2x the time), then in blocks of rows as the forward's: the block's weights P made again
// (attention_weights), dP = dout v^T, dS = P * (dP - rowsum(dP * P)) (each row's sum as the sum
// kernel's), dq's rows = dS k, and dk += dS^T q, dv += P^T dout over the blocks in order. The
// products are those the composed ops make of dense copies (matmul), the same bits where the
// weights of a row fit one block and there are more than kDotRows rows (with fewer, gemm's
// dot-product form reads k^T and v^T in place, where the ops copied them: other roundings).
void attention_backward_kernel(const KernelArgs& args) {
  const DenormalsAsZero no_denormals;  // the masked pairs' weights, as in the forward
  const Tensor& dout = args.in[0];
  const AttentionOperands a = attention_operands(args, 1);
  const Tensor &q = a.q, &k = a.k, &v = a.v, &dq = args.out[0], &dk = args.out[1], &dv = args.out[2];
  const Tensor* ds = args.out.size() > 3 ? &args.out[3] : nullptr;
  const int64_t rank = a.rank, L = a.L, D = a.D, S = a.S, Dv = a.Dv;
  const int64_t rows = std::min(L, std::max<int64_t>(1, kAttentionScores / S));
  auto rs = [&](const Tensor& t) { return t.strides()[rank - 2]; };
  auto cs = [&](const Tensor& t) { return t.strides()[rank - 1]; };
  const int64_t ds_rs = ds ? rs(*ds) : 0, ds_cs = ds ? cs(*ds) : 0;
  auto run = [&]<typename T>() {
    // Batch element b's matrix of t, (n, cols), dense (at t itself or at dst).
    auto operand = [&](const Tensor& t, int64_t b, int64_t n, int64_t cols, T* dst) {
      return dense_matrix(t.data_ptr<T>() + batch_offset(t, b), n, cols, rs(t), cs(t), dst);
    };
    parallel_for(a.batch, L * S * (2 * D + 2 * Dv), [&](int64_t first, int64_t last) {
      T* p = thread_scratch<T, 14>(2 * rows * S + (L + S) * (D + Dv));
      T *dp = p + rows * S, *copies = dp + rows * S;
      for (int64_t b = first; b < last; ++b) {
        const T* qb = operand(q, b, L, D, copies);
        const T* kb = operand(k, b, S, D, copies + L * D);
        const T* vb = operand(v, b, S, Dv, copies + (L + S) * D);
        const T* gb = operand(dout, b, L, Dv, copies + (L + S) * D + S * Dv);
        T *dqb = dq.data_ptr<T>() + batch_offset(dq, b), *dkb = dk.data_ptr<T>() + batch_offset(dk, b),
          *dvb = dv.data_ptr<T>() + batch_offset(dv, b);
        for (int64_t r0 = 0; r0 < L; r0 += rows) {
          const int64_t m = std::min(rows, L - r0);
          const T accumulate = r0 == 0 ? T(0) : T(1);
          attention_weights(a, b, r0, m, p);
          gemm<T>(m, S, Dv, gb + r0 * Dv, Dv, 1, vb, 1, Dv, dp, S, 1, T(0));
          for (int64_t i = 0; i < m; ++i) {
            T* dpi = dp + i * S;
            const T* pi = p + i * S;
            // The products rounded and summed as the ops mul and sum do.
            const T dot = static_cast<T>(sum_in_four<double>(S, [&](int64_t j) { return double(T(dpi[j] * pi[j])); }));
            for (int64_t j = 0; j < S; ++j) dpi[j] = pi[j] * (dpi[j] - dot);
          }
          if (ds) {
            T* dsb = ds->data_ptr<T>() + batch_offset(*ds, b) + r0 * ds_rs;
            for (int64_t i = 0; i < m; ++i)
              for (int64_t j = 0; j < S; ++j) dsb[i * ds_rs + j * ds_cs] = dp[i * S + j];
          }
          gemm<T>(m, D, S, dp, S, 1, kb, D, 1, dqb + r0 * rs(dq), rs(dq), cs(dq), T(0));
          gemm<T>(S, D, m, dp, 1, S, qb + r0 * D, D, 1, dkb, rs(dk), cs(dk), accumulate);
          gemm<T>(S, Dv, m, p, 1, S, gb + r0 * Dv, Dv, 1, dvb, rs(dv), cs(dv), accumulate);
        }
      }
    });
  };
  if (q.dtype() == DType::Float32) return run.template operator()<float>();
  if (q.dtype() == DType::Float64) return run.template operator()<double>();
  unsupported_dtype(Op::attention_backward, q.dtype(), Device::CPU);
}

// What a linear layer's epilogue applies: the bias (N) where there is one, then the GELU where
// gelu is set.
template <typename T>
struct LinearEpilogue {
  const T* bias;
  bool gelu;
};

// A linear layer's epilogue on each row of a finished block of its product (GemmEpilogue; C's
// columns contiguous).
template <typename T>
void linear_epilogue(const void* ctx, T* c, int64_t c_rs, int64_t, int64_t, int64_t m, int64_t j0, int64_t n) {
  const auto& e = *static_cast<const LinearEpilogue<T>*>(ctx);
  const T* b = e.bias ? e.bias + j0 : nullptr;
  for (int64_t i = 0; i < m; ++i) {
    T* row = c + i * c_rs;
    if constexpr (std::is_same_v<T, float>) {
      if (b) epilogue_row(n, row, row, nullptr, nullptr, b, RowActivation::none);
      if (e.gelu) vector_function(VectorFunction::gelu, n, row, row);
    } else {
      for (int64_t j = 0; j < n; ++j) {
        const T v = b ? row[j] + b[j] : row[j];
        row[j] = e.gelu ? v * T(0.5) * (T(1) + std::erf(v * T(0.7071067811865476))) : v;
      }
    }
  }
}

// A float32 linear layer whose weight cannot change while the result is used (weight_form.h)
// reads the weight packed once into panels (gemm_b_panels) and kept with its storage, where gemm
// packs it on every call (x @ W^T reads W^T down its columns): ViT's, Swin's and ConvNeXt's layers
// at batch 1 pack 2.4-9.4 MB of weights per call for 49-197 rows. For a contiguous weight, more
// than kDotRows rows and one column (else gemm's dot products): where the instruction set has the
// 7-row kernel (AVX-512) up to kKeptLinearRows rows on the 7-row tiles, more on gemm's own tiles;
// elsewhere every size on gemm's own tiles. The sums are gemm's bit for bit. Measured on Zen 4, 2
// threads, against gemm (alternating): the 7-row tiles 0.68-0.82x the time at 49 rows (768 <->
// 3072), 0.84-0.95x at 196-197 rows but 1.02-1.04x for 3072 -> 768 there, 1.06x at 1000 rows;
// gemm's tiles on the kept panels 0.94-0.99x from 392 to 25088 rows (the layers of ViT-B/16,
// Swin-T and ConvNeXt-T at batch 8), where gemm's packing of W^T took ~6% of 1568 x 384 -> 1536.
// On Zen 3 (AVX2 only), 2 threads, gemm's 6 x 16 tiles on the kept panels: 0.86-0.95x at 49 rows,
// 0.94-1.0x at 196-197, 0.97-1.0x at 784 and 3136 (Swin-T's layers; six weights streamed in turn);
// swin_t b1 0.91-0.94x, convnext_tiny b1 0.96x, vit_b_16 b1 0.97x, batch 8 within the noise. (On
// Zen 4 with AVX2 forced they had measured 0.97-1.05x.)
constexpr int64_t kKeptLinearRows = 256;

// A linear layer's weight packed for gemm_b_panels (panels null where the layer takes gemm), held by
// hold while it is read.
struct KeptLinearWeight {
  const float* panels = nullptr;
  GemmTile tile = GemmTile::standard;
  std::shared_ptr<const void> hold;
};

// The kept panels of w for a call of M rows where may_keep (the op's keep_weight_forms) and w's
// storage keeps derived data.
KeptLinearWeight kept_linear_weight(int64_t M, int64_t N, int64_t K, const Tensor& w, bool may_keep) {
  KeptLinearWeight kept;
  if (M <= kDotRows || N <= 1 || N * K * M <= kSmallGemm || !w.is_contiguous() || !keeps_weight_forms(w, may_keep))
    return kept;
  // A weight keeps one panel form (each a copy of the weight: ViT-L/16's 1.2 GB): calls of up to
  // kKeptLinearRows rows read gemm's panels where those are kept, and larger ones take gemm
  // (packing per call, as before gemm's panels were kept) where the 7-row panels are.
  const WeightForm standard = standard_panels_form(gemm_tile_columns());
  const bool standard_kept = has_weight_form(w, standard, N, K);
  if (M > kKeptLinearRows && !standard_kept && has_weight_form(w, WeightForm::rows_of_7_panels, N, K)) return kept;
  kept.tile =
      has_rows_of_7_kernel() && M <= kKeptLinearRows && !standard_kept ? GemmTile::rows_of_7 : GemmTile::standard;
  const WeightForm form = kept.tile == GemmTile::rows_of_7 ? WeightForm::rows_of_7_panels : standard;
  kept.panels = weight_form<13>(
      w, true, form, N, K, packed_b_floats(kept.tile, K, N),
      [&](const float* w32, float* dst) { pack_b_panels(kept.tile, K, N, w32, 1, K, dst); }, kept.hold);
  return kept;
}

// out (M,N), rows out_rs apart, = x (M,K) @ w (N,K)^T (+ bias where not null), then the GELU
// where gelu is set: through the weight's kept panels where it has them (kept_linear_weight), else
// gemm.
template <typename T>
void linear_rows(int64_t M, int64_t N, int64_t K, const T* x, int64_t x_rs, int64_t x_cs, const Tensor& w,
                 const KeptLinearWeight& kept, const T* bias, bool gelu, T* out, int64_t out_rs) {
  const LinearEpilogue<T> e{bias, gelu};
  const GemmEpilogue<T> both{linear_epilogue<T>, &e};
  const GemmEpilogue<T>* epilogue = bias || gelu ? &both : nullptr;
  if constexpr (std::is_same_v<T, float>)
    if (kept.panels)
      return gemm_b_panels(kept.tile, M, N, K, x, x_rs, x_cs, kept.panels, out, out_rs, 1, 0.f, epilogue);
  gemm<T>(M, N, K, x, x_rs, x_cs, w.data_ptr<T>(), w.strides()[1], w.strides()[0], out, out_rs, 1, T(0), epilogue);
}

// in = (x (M,K), weight (N,K)[, bias (N)]) -> out (M,N) (kernel.h).
void linear_kernel(const KernelArgs& args) {
  const Tensor& x = args.in[0];
  const Tensor& w = args.in[1];
  const int64_t M = x.shape()[0], K = x.shape()[1], N = w.shape()[0];
  auto run = [&]<typename T>() {
    const LinearParams& p = args.p<LinearParams>();
    const KeptLinearWeight kept =
        std::is_same_v<T, float> ? kept_linear_weight(M, N, K, w, p.keep_weight_forms) : KeptLinearWeight{};
    note_kernel_path(!kept.panels                       ? "gemm"
                     : kept.tile == GemmTile::rows_of_7 ? "kept weight, 7-row tiles"
                                                        : "kept weight, gemm tiles");
    const T* bias = args.in.size() > 2 ? args.in[2].data_ptr<T>() : nullptr;
    linear_rows<T>(M, N, K, x.data_ptr<T>(), x.strides()[0], x.strides()[1], w, kept, bias, p.gelu,
                   args.out[0].data_ptr<T>(), N);
  };
  if (x.dtype() == DType::Float32) return run.template operator()<float>();
  if (x.dtype() == DType::Float64) return run.template operator()<double>();
  unsupported_dtype(Op::linear, x.dtype(), Device::CPU);
}

// An MLP's two linear layers with the GELU between (linear_gelu_linear_kernel) run over bands of
// rows, each band on one thread with its hidden rows (band x H) in the thread's scratch, where
// that moves fewer bytes than the hidden matrix's trip to memory and back: each band reads both
// weights (2 C H floats, kept, from L2 or L3) where the two layers one after the other write and
// read the band's hidden rows (2 rows H floats), so bands pay where C <= the rows of a band, and
// where the hidden matrix would not stay in the caches anyway (more than kMlpCachedHiddenBytes a
// thread). About kMlpBandRows rows a band (at most kKeptLinearRows, the kept weights' path), as
// many bands on each thread, their first rows on the 7-row kernel's two-tile boundaries (14).
// Measured on Zen 4, 2 threads, against the two linear calls (alternating): Swin-T's and
// ConvNeXt-T's stage-1 MLPs (96 -> 384 -> 96) 0.88-0.89x the time at batch 8 (25088 rows),
// 0.88-0.95x at batch 1; stage 2 (192 -> 768 -> 192) 0.93x at batch 8, 0.97x at batch 1; bands of
// 98, 140 and 252 rows were no better, 768 -> 3072 -> 768 over 1576 rows (ViT-B/16 at batch 8,
// C > band rows) 1.07x in bands. On Zen 3 (AVX2, gemm's tiles on the kept panels), against the two
// linear calls on gemm's own packing: 96 -> 384 -> 96 0.95x at 25088 rows and 0.96x at 3136, 192 ->
// 768 -> 192 0.93x at 6272 rows but 1.02x at 784 (0.97-1.0x in two linear calls on the kept panels).
constexpr int64_t kMlpBandRows = 196;
constexpr int64_t kMlpCachedHiddenBytes = int64_t{1} << 20;

// in = (x (M,C), w1 (H,C), b1 (H), w2 (O,H), b2 (O)) -> out (M,O) (kernel.h). The op runs it only
// where no input requires grad, so the weights' panels may be kept.
void linear_gelu_linear_kernel(const KernelArgs& args) {
  const Tensor& x = args.in[0];
  const Tensor &w1 = args.in[1], &w2 = args.in[3];
  const int64_t M = x.shape()[0], C = x.shape()[1], H = w1.shape()[0], O = w2.shape()[0];
  const int64_t x_rs = x.strides()[0], x_cs = x.strides()[1];
  auto run = [&]<typename T>() {
    const T *b1 = args.in[2].data_ptr<T>(), *b2 = args.in[4].data_ptr<T>();
    T* out = args.out[0].data_ptr<T>();
    if constexpr (std::is_same_v<T, float>) {
      // Band b: rows [start(b), start(b + 1)), starts on 14-row boundaries.
      const int64_t threads = available_threads();
      const int64_t bands = threads * ((M + threads * kMlpBandRows - 1) / (threads * kMlpBandRows));
      auto start = [&](int64_t b) { return b == bands ? M : M * b / bands / 14 * 14; };
      const int64_t most_rows = (M + bands - 1) / bands + 14;
      // (More than kDotRows rows: the two calls' own path, whose sums bands must give.)
      KeptLinearWeight kept1, kept2;
      if (M > kDotRows && C * bands <= M && M * H * int64_t{sizeof(float)} > threads * kMlpCachedHiddenBytes)
        kept1 = kept_linear_weight(most_rows, H, C, w1, true);
      if (kept1.panels) kept2 = kept_linear_weight(most_rows, O, H, w2, true);
      if (kept2.panels) {
        note_kernel_path("MLP, bands of rows");
        parallel_for(bands, M / bands * H * (C + O), [&](int64_t first, int64_t last) {
          float* hidden = thread_scratch<float, 20>(most_rows * H);
          for (int64_t band = first; band < last; ++band) {
            const int64_t r0 = start(band), m = start(band + 1) - r0;
            linear_rows<float>(m, H, C, x.data_ptr<float>() + r0 * x_rs, x_rs, x_cs, w1, kept1, b1, true, hidden, H);
            linear_rows<float>(m, O, H, hidden, H, 1, w2, kept2, b2, false, out + r0 * O, O);
          }
        });
        return;
      }
    }
    // The two layers one after the other, the hidden matrix in this thread's scratch.
    note_kernel_path("MLP, layer by layer");
    T* hidden = thread_scratch<T, 20>(M * H);
    const KeptLinearWeight kept1 =
        std::is_same_v<T, float> ? kept_linear_weight(M, H, C, w1, true) : KeptLinearWeight{};
    const KeptLinearWeight kept2 =
        std::is_same_v<T, float> ? kept_linear_weight(M, O, H, w2, true) : KeptLinearWeight{};
    linear_rows<T>(M, H, C, x.data_ptr<T>(), x_rs, x_cs, w1, kept1, b1, true, hidden, H);
    linear_rows<T>(M, O, H, hidden, H, 1, w2, kept2, b2, false, out, O);
  };
  if (x.dtype() == DType::Float32) return run.template operator()<float>();
  if (x.dtype() == DType::Float64) return run.template operator()<double>();
  unsupported_dtype(Op::linear_gelu_linear, x.dtype(), Device::CPU);
}

}  // namespace

void register_gemm_kernels(KernelRegistry& r, Isa isa) {
  const GemmKernels* k = &gemm_kernels_generic;
#if defined(__x86_64__)
  if (isa == Isa::avx2) k = &gemm_kernels_avx2;
  if (isa == Isa::avx512) k = &gemm_kernels_avx512;
  if (isa == Isa::avx512_bf16) {
    static const GemmKernels avx512_bf16 = [] {
      GemmKernels with_native = gemm_kernels_avx512;
      with_native.bf16 = gemm_bf16_avx512_native;
      with_native.bf16_peak = bf16_peak_avx512_native;
      return with_native;
    }();
    k = &avx512_bf16;
  }
#endif
  g_kernels.store(k, std::memory_order_release);
  r.set(Op::bmm, Device::CPU, bmm_kernel);
  r.set(Op::linear, Device::CPU, linear_kernel);
  r.set(Op::linear_gelu_linear, Device::CPU, linear_gelu_linear_kernel);
  r.set(Op::attention, Device::CPU, attention_kernel);
  r.set(Op::attention_backward, Device::CPU, attention_backward_kernel);
}

}  // namespace tvc::cpu

namespace tvc {

namespace {

// The rate of `loop` on `threads` threads (see measure_fp32_peak_gflops); what names the caller.
double measure_peak_gflops(const cpu::FmaPeakLoop& loop, int threads, double seconds, const char* what) {
  TVC_CHECK(threads >= 0 && seconds > 0, what, ": threads must be >= 0 and seconds > 0, got ", threads, " and ",
            seconds);
  const int team = threads > 0 ? threads : omp_get_max_threads();  // get_num_threads() of this thread
  const double flop_per_iteration = 2.0 * static_cast<double>(loop.lanes * loop.chains);
  // Iterations for about seconds / 5 per run at 50 GFLOP/s a thread (a short first guess, then
  // scaled to the rate the first run shows).
  int64_t iterations = std::max<int64_t>(1000, static_cast<int64_t>(seconds / 5 * 50e9 / flop_per_iteration));
  double best = 0;
  volatile float sink = 0;
  for (int run = 0; run < 6; ++run) {
    const auto start = std::chrono::steady_clock::now();
    float sum = 0;
#pragma omp parallel num_threads(team) reduction(+ : sum)
    sum += loop.run(iterations);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    sink = sink + sum;
    const double gflops = team * flop_per_iteration * static_cast<double>(iterations) / s / 1e9;
    if (run == 0)  // a calibration run: size the others to seconds / 5 each
      iterations = std::max<int64_t>(1000, static_cast<int64_t>(static_cast<double>(iterations) * seconds / 5 / s));
    else
      best = std::max(best, gflops);
  }
  return best;
}

}  // namespace

double measure_fp32_peak_gflops(int threads, double seconds) {
  return measure_peak_gflops(cpu::active_kernels().peak, threads, seconds, "measure_fp32_peak_gflops");
}

double measure_bf16_peak_gflops(int threads, double seconds) {
  return measure_peak_gflops(cpu::active_kernels().bf16_peak, threads, seconds, "measure_bf16_peak_gflops");
}

}  // namespace tvc
