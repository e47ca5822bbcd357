// The CPU GEMM used by bmm and the convolutions (not installed).
#pragma once

#include <cstdint>

#include "gemm_kernels.h"
#include "tvc/internal/kernel.h"

namespace tvc::cpu {

// Work on finished parts of C, done while they are still in cache: fn(ctx, c, c_rs, c_cs, i0, m,
// j0, n) gets the block C[i0:i0+m, j0:j0+n] (c points at its element (i0, j0); strides as the
// caller gave C's) once its sums are complete, every element exactly once, possibly from several
// threads at once (on disjoint blocks).
// A float32 GEMM's micro-kernels may apply rows (when set) to whole tiles themselves, in registers
// before their one store, instead of passing the blocks to fn: then fn gets only the blocks they did
// not do. C (the whole product) gets `of` (GemmRowEpilogue, its pointers at C's row 0 and column
// 0) and act; it must equal what fn does.
struct GemmRowsEpilogue {
  GemmRowEpilogue of;
  RowActivation act;
};
template <typename T>
struct GemmEpilogue {
  void (*fn)(const void* ctx, T* c, int64_t c_rs, int64_t c_cs, int64_t i0, int64_t m, int64_t j0, int64_t n);
  const void* ctx;
  const GemmRowsEpilogue* rows = nullptr;
};

// C = A @ B + beta * C, with A (M,K), B (K,N), C (M,N) given by element strides
// (row stride rs, column stride cs) so transposed operands need no copy, as in BLIS.
// beta = 0 ignores C's old contents (NaN included). Deterministic for any thread count. With an
// epilogue, each finished block of C is passed to it. b_in_cache: the caller's word that B is in
// the cores' caches (a convolution's input of at most a few MB, just written by the layer before),
// which lets the kernels read it in place as they pack it; the results are the same either way.
template <typename T>
void gemm(int64_t M, int64_t N, int64_t K, const T* A, int64_t a_rs, int64_t a_cs, const T* B, int64_t b_rs,
          int64_t b_cs, T* C, int64_t c_rs, int64_t c_cs, T beta, const GemmEpilogue<T>* epilogue = nullptr,
          bool b_in_cache = false);

// The thread grid tm x tn (tm * tn = threads) over a C of mtiles x ntiles tiles of mr x nr that
// minimises the largest share: compute in tiles plus the packing (or reading) of A's rows and B's
// columns that a thread does for its rectangle.
struct GemmGrid {
  int64_t tm, tn;
};
GemmGrid gemm_thread_grid(int64_t threads, int64_t mtiles, int64_t ntiles, int64_t mr, int64_t nr);

// The float32 GEMM with B packed beforehand (a weight, packed once) into full-depth panels of NR
// columns for one micro-kernel family (GemmTile): element (k, j) of B at
// b_panels[j / NR * K * NR + k * NR + j % NR], the columns past N zero; pack_b_panels makes them,
// packed_b_floats(tile, K, N) floats. rows_of_7: the instruction set's 7-row micro-kernel
// (GemmRowsKernelF32: C's rows in sevens, two tiles at a time over half panels where it has that
// form, its last columns in narrower tiles), for a C whose rows are a linear layer's rows or a
// convolution's output positions and its columns output channels; only where
// has_rows_of_7_kernel() (AVX-512). standard: gemm's own micro-kernel, which then reads the panels
// where it would pack B's blocks. A is read in place or packed. Every element gets the same sums
// in the same order as from gemm's blocked path (each over k in order, in blocks of the same KC),
// so the two agree bit for bit where gemm takes that path: products of more than 8 * 8 * 8
// multiply-adds, more than 8 rows and more than one column, C not column-major.
enum class GemmTile { standard, rows_of_7 };
bool has_rows_of_7_kernel();
int64_t gemm_tile_columns();       // the columns of gemm's float32 tiles (NR) on the active instruction set
int64_t gemm_tile_rows();          // their rows (MR)
int64_t gemm_k_block();            // the depth of its float32 K blocks (KC)
int64_t rows_of_7_tile_columns();  // the 7-row tiles' columns (NR)
int64_t packed_b_floats(GemmTile tile, int64_t K, int64_t N);
void pack_b_panels(GemmTile tile, int64_t K, int64_t N, const float* B, int64_t b_rs, int64_t b_cs, float* b_panels);
void gemm_b_panels(GemmTile tile, int64_t M, int64_t N, int64_t K, const float* A, int64_t a_rs, int64_t a_cs,
                   const float* b_panels, float* C, int64_t c_rs, int64_t c_cs, float beta,
                   const GemmEpilogue<float>* epilogue = nullptr);

// The float32 GEMM with A packed beforehand (a convolution's weight, packed once) as gemm packs
// each block of A for its own micro-kernel, all blocks: K in blocks of KC = gemm_k_block() values
// (the last one shorter), each block k0 of depth kc at a_panels + k0 * Mp (Mp: M rounded up to
// whole tiles of MR = gemm_tile_rows() rows), in it panels of MR rows one after the other, element
// (i, k) at [i / MR * kc * MR + (k - k0) * MR + i % MR], the rows past M zero: one stream per
// block. pack_a_panels makes them, packed_a_floats(M, K) floats. B, C, the epilogue and b_in_cache as
// gemm's. Only where gemm_takes_a_panels (gemm takes its blocked path there: C not column-major,
// more than 8 * 8 * 8 multiply-adds, not its dot-product form); every element then gets gemm's
// sums bit for bit (the same micro-kernels over the same K blocks), without A's packing per call.
int64_t packed_a_floats(int64_t M, int64_t K);
void pack_a_panels(int64_t M, int64_t K, const float* A, int64_t a_rs, int64_t a_cs, float* a_panels);
bool gemm_takes_a_panels(int64_t M, int64_t N, int64_t K, int64_t b_rs, int64_t c_rs, int64_t c_cs);
void gemm_a_panels(int64_t M, int64_t N, int64_t K, const float* a_panels, const float* B, int64_t b_rs, int64_t b_cs,
                   float* C, int64_t c_rs, int64_t c_cs, float beta, const GemmEpilogue<float>* epilogue = nullptr,
                   bool b_in_cache = false);

// Where gemm_rows_of_7_offsets reads A, in place (a convolution's input, zero-padded where its
// windows have taps, as its own im2col): every 7-row tile is 7 positions at a step from one start,
//   A[7 t + i][k] = a[tile_starts[t] + i * step + k_offsets[k]]   (i < 7),
// or, without k_offsets (step 1), a[tile_starts[t] + i + k * k_stride]: a pointwise convolution's
// input channels, read as gemm_b_panels reads the columns of an A with contiguous columns.
struct RowsOf7Input {
  const float* a;
  const int64_t* tile_starts;  // per tile
  const int64_t* k_offsets;    // per k, or null
  int64_t k_stride, step;
};
// gemm_b_panels(GemmTile::rows_of_7, ...) over an A read through `in`: the tiles [first_tile, last_tile) of
// C (7 * tiles, N) = A (7 * tiles, K) @ B, beta 0, every element of A they read readable, B packed
// by pack_b_panels(GemmTile::rows_of_7, ...). Each element of C gets the sums gemm_b_panels gives it for the same A (in
// K blocks of the same size, in order), the epilogue on each finished 7-row tile. Only where
// has_rows_of_7_kernel().
void gemm_rows_of_7_offsets(int64_t first_tile, int64_t last_tile, const RowsOf7Input& in, int64_t N, int64_t K,
                            const float* b_panels, float* C, int64_t c_rs, int64_t c_cs,
                            const GemmEpilogue<float>* epilogue = nullptr);

// The same for bfloat16 A and B with float32 sums into a float32 C (bfloat16 products are exact
// in float32; the micro-kernel adds them in pairs of k, see gemm_kernels.h GemmMicroKernelBF16).
void gemm(int64_t M, int64_t N, int64_t K, const BFloat16* A, int64_t a_rs, int64_t a_cs, const BFloat16* B,
          int64_t b_rs, int64_t b_cs, float* C, int64_t c_rs, int64_t c_cs, float beta,
          const GemmEpilogue<float>* epilogue = nullptr);

// One row of a float32 depthwise convolution with the active instruction set's kernel:
//   y[ow] = bias + sum over taps t in order of w[t] * rows[t][ow * stride], ow in [0, n),
// every tap inside the input, rows contiguous, stride 1 or 2 (gemm_kernels.h, DepthwiseRowF32).
void depthwise_row(int64_t n, int64_t taps, const float* const* rows, const float* w, int64_t stride, float bias,
                   float* y);

// One output row of a float32 convolution of an input with few channels, every output channel,
// with the active instruction set's kernel (gemm_kernels.h, ConvRowsF32); n a multiple of
// conv_rows_lanes(), oc of kConvRowsChannels.
void conv_rows(int64_t n, int64_t taps, const float* const* rows, const float* w, int64_t oc, float* y, int64_t y_os);
int64_t conv_rows_lanes();  // the instruction set's vector, in floats

// One output row of a float32 depthwise convolution over a block of kDepthwiseBlock channels held
// position-major, through a per-channel epilogue into y (positions y_step floats apart), with the
// active instruction set's kernel (gemm_kernels.h, DepthwiseChannelsF32).
void depthwise_channels(int64_t n, int64_t taps, const float* x, const int64_t* offsets, int64_t step, const float* w,
                        const float* bias, const float* scale, const float* shift, RowActivation act, float* y,
                        int64_t y_step);
// Its form for windows whose rows are consecutive columns, a whole output row
// (DepthwiseChannelRowsF32): false, nothing done, where the active instruction set has none or
// not for windows kw wide.
bool depthwise_channel_rows(int64_t n, int64_t rows, int64_t kw, int64_t pad, int64_t width, const float* x,
                            const int64_t* row_offsets, int64_t step, const float* w, const float* bias,
                            const float* scale, const float* shift, RowActivation act, float* y, int64_t y_step);

// Channel planes of a stride-1 "same" depthwise convolution read in place with the active
// instruction set's kernel (gemm_kernels.h, DepthwisePlanesF32), where it has one
// (has_depthwise_planes_kernel: AVX-512), in vectors of kDepthwisePlaneLanes positions.
bool has_depthwise_planes_kernel();
constexpr int64_t kDepthwisePlaneLanes = 16;
void depthwise_planes(const DepthwisePlanes& d);
// The same for stride 2 (gemm_kernels.h, DepthwiseStride2PlanesF32), where the instruction set has
// it (has_depthwise_planes_kernel).
void depthwise_stride2_planes(const DepthwiseStride2Planes& d);

// A transposing copy with the active instruction set's kernel (gemm_kernels.h, PackTransposedF32):
//   dst[k * dst_ld + j] = src[j * src_ld + k] for j < cols, k < k_n
// (with cols below the vector width it may write zeros after each row's values, as documented
// there).
void transpose_copy(int64_t k_n, int64_t cols, const float* src, int64_t src_ld, float* dst, int64_t dst_ld);

// dst[i] = src[2 * i] for i < n, reading src[0 .. 2n - 2] only, with the active instruction set's
// kernel (gemm_kernels.h, EvenCopyF32).
void even_copy(int64_t n, const float* src, float* dst);

// dst[i * dst_rs + j] = src[i * src_rs + j] for i < rows, j < n, stored past the caches where the
// instruction set can (gemm_kernels.h, StreamRowsF32), visible to every thread on return.
void stream_rows(int64_t rows, int64_t n, const float* src, int64_t src_rs, float* dst, int64_t dst_rs);

// A max pool's running maximum with the active instruction set's kernel (gemm_kernels.h,
// MaxIntoF32): dst[i] = src[i * stride] where that is greater or a NaN, for i < n.
void max_into(int64_t n, const float* src, int64_t stride, float* dst);

// The active instruction set's Winograd F(4x4, 3x3) transforms (gemm_kernels.h, WinogradF43).
const WinogradF43& winograd_f43();

// The dot product of n contiguous floats a and b with the active instruction set's kernel, summed
// in a fixed order (gemm_kernels.h, DotRowsF32, one row).
float dot(int64_t n, const float* a, const float* b);

// A convolution's epilogue over n contiguous floats with the active instruction set's kernel
// (gemm_kernels.h, EpilogueRowF32): y[k] = act(x[k] * scale + shift + residual[k]), each of
// scale, shift, residual left out when null; y may be x.
void epilogue_row(int64_t n, const float* x, float* y, const float* scale, const float* shift, const float* residual,
                  RowActivation act);
// The same over rows positions of n channels each, channels-last (gemm_kernels.h, EpilogueChannelsF32):
//   y[i * y_rs + k] = act(x[i * x_rs + k] * scale[k] + shift[k] + residual[i * r_rs + k]),
// scale and shift n values each (or null).
void epilogue_channels(int64_t rows, int64_t n, const float* x, int64_t x_rs, float* y, int64_t y_rs,
                       const float* scale, const float* shift, const float* residual, int64_t r_rs, RowActivation act);

// Layer norm of one row of n contiguous floats, and its backward, with the active instruction
// set's kernels (gemm_kernels.h, LayerNormRowF32 and LayerNormBackwardRowF32).
void layer_norm_row(int64_t n, const float* x, const float* w, const float* b, float eps, float* y, float* mean,
                    float* rstd);
void layer_norm_backward_row(int64_t n, const float* dy, const float* x, float mean, float rstd, const float* w,
                             float* dx, float* sum_dy_xhat, float* sum_dy);

// Batch norm's per-channel row passes of the active instruction set (gemm_kernels.h,
// BatchNormRowsF32).
const BatchNormRowsF32& batch_norm_rows();

// sums[k] += x[r * rs + k] in double for rows r in order and k < n, with the active instruction
// set's kernel (gemm_kernels.h, ColumnSumsF32).
void column_sums(int64_t rows, int64_t n, int64_t rs, const float* x, double* sums);

// y[i] = f(x[i]) for n contiguous floats (x and y may be the same array) with the active
// instruction set's kernel (gemm_kernels.h, UnaryF32): e^x, sigmoid, silu, gelu (erf form).
enum class VectorFunction { exp, sigmoid, silu, gelu };
void vector_function(VectorFunction f, int64_t n, const float* x, float* y);

// The softmax of each of `rows` rows of n >= 1 values, row r at x + r * n and y + r * n (y may be
// x), as the softmax kernel computes rows: float32 with the active instruction set's kernel
// (gemm_kernels.h, SoftmaxRowsF32: the vector e^x, the sum in double), float64 element by element;
// a NaN in a row makes every output of the row NaN.
void softmax_rows(int64_t rows, int64_t n, const float* x, float* y);
void softmax_rows(int64_t rows, int64_t n, const double* x, double* y);

// The most keys (S) the attention kernel's one-pass form for few keys takes on the active
// instruction set (gemm_kernels.h, AttentionShortF32), 0 where it has none.
int64_t attention_short_keys();

// gelu's (erf form) backward over n contiguous floats with the active instruction set's kernel
// (gemm_kernels.h, GeluBackwardF32): dx[i] = dy[i] * (Phi(x[i]) + x[i] * phi(x[i])).
void gelu_backward(int64_t n, const float* dy, const float* x, float* dx);

}  // namespace tvc::cpu
