// The micro-kernels of each CPU instruction set (GEMM with its blocking in float32, float64 and
// bfloat16 with float32 sums, the FMA peak loops, the depthwise convolution row, dot products,
// e^x and the functions made of it) (not installed).
//
// This header holds declarations only: it is included by gemm_kernel_{generic,avx2,avx512}.cpp,
// which are compiled with different -m flags, and any inline function or template shared with the
// rest of the library could end up linked as its AVX-512 copy into the generic path.
#pragma once

#include <cstdint>

namespace tvc::cpu {

// The activations of a convolution's epilogue, in the order of tvc's EpilogueActivation.
enum class RowActivation { none, relu, relu6, silu, hardswish };
constexpr int kRowActivations = 5;

// One MR x NR tile of C (row stride c_rs, column stride c_cs; only the top-left m x n part,
// m <= MR, n <= NR, is written):
//   C = Ap @ Bp + beta * C, with beta == 0 ignoring C's old contents (NaN included),
// where Ap is an A micro-panel of MR full rows (element [k][i] at a[k * a_ks + i]): packed
// (a_ks = MR, 64-byte aligned, zero-padded to MR rows) or A itself when its columns are
// contiguous, and Bp a B micro-panel of NR full columns (element [k][j] at b[k * b_rs + j]):
// packed (b_rs = NR, zero-padded) or B itself when its rows are contiguous. Each element's sum
// runs over k in order. Each kernel has a second form for an A read in place along its rows
// (contiguous), MR full rows: element [k][i] at a[i * a_ks + k], a_ks then A's row stride.
// The 7-row kernels (GemmRowsKernelF32) and AVX-512's 12-row kernel, while they run, also fetch
// kc cache lines from `ahead` on into L2 (one per step of k) for a later call: a prefetch, which
// never faults (B's panel itself where nothing is due). The others ignore `ahead`.
using GemmMicroKernelF32 = void (*)(int64_t kc, const float* a, int64_t a_ks, const float* b, int64_t b_rs, float beta,
                                    float* c, int64_t c_rs, int64_t c_cs, int64_t m, int64_t n, const float* ahead);
// The same kernel that also packs its B panel as it reads it, for the first row panel of a block
// (gemm_blocked): B is read in place (b_rs its row stride, NR full columns, m == MR) and each step
// of k's NR values are also stored at b_packed[k * NR ..] (the panel as GemmMicroKernelF32's
// packed Bp, for the next row panels), while the same rows of a panel further on are fetched into
// L2. The sums are those of GemmMicroKernelF32 bit for bit.
using GemmMicroKernelPackF32 = void (*)(int64_t kc, const float* a, int64_t a_ks, const float* b, int64_t b_rs,
                                        float beta, float* c, int64_t c_rs, int64_t c_cs, int64_t m, int64_t n,
                                        float* b_packed);
// What a micro-kernel's epilogue form applies to its tile's rows (pointers at the tile's first
// row, and column of the residual): row i's
//   c[i][j] = act(sum * scale[i] + shift[i] + residual[i * r_rs + j])
// with EpilogueRowF32's arithmetic, a null pointer leaving its step out (shift alone: sum +
// shift[i]); act is the kernel's.
struct GemmRowEpilogue {
  const float *scale, *shift, *residual;
  int64_t r_rs;
};
// GemmMicroKernelF32's form for a whole MR x NR tile of a product's last K block into a C of
// contiguous columns (beta 0 or 1: the earlier blocks' sums in C), each row through the epilogue in
// registers before its one store (no pass over C after it): the sums bit for bit as
// GemmMicroKernelF32's, the epilogue's as EpilogueRowF32's.
using GemmMicroKernelEpilogueF32 = void (*)(int64_t kc, const float* a, int64_t a_ks, const float* b, int64_t b_rs,
                                            float beta, float* c, int64_t c_rs, const GemmRowEpilogue& e);
using GemmMicroKernelF64 = void (*)(int64_t kc, const double* a, int64_t a_ks, const double* b, int64_t b_rs,
                                    double beta, double* c, int64_t c_rs, int64_t c_cs, int64_t m, int64_t n,
                                    const double* ahead);

// The bfloat16 micro-kernel: C = Ap @ Bp + beta * C as above, in float32, over kp pairs of k.
// Each 32-bit element holds the bfloat16 bits of two consecutive k (the even one in the low
// half; a zero pair past K's end): Ap's pair [p][i] at a[p * a_ks + i] (A's row i, packed: a_ks
// = MR; the rows form: at a[i * a_ks + p]), Bp's pair [p][j] at b[p * b_rs + j] (B's column j).
// Each pair adds its odd then its even product to the sum (AVX512_BF16's vdpbf16ps; products are
// exact in float32), pairs in order; `ahead` ignored.
using GemmMicroKernelBF16 = void (*)(int64_t kp, const uint32_t* a, int64_t a_ks, const uint32_t* b, int64_t b_rs,
                                     float beta, float* c, int64_t c_rs, int64_t c_cs, int64_t m, int64_t n,
                                     const uint32_t* ahead);

// A micro-kernel and the cache blocking that suits it: the A micro-panel (kc x mr) stays in L1,
// the packed B block (kc x nc) in L2, the packed A block (mc x kc) in L3.
// The last columns of C go to narrow[v - 1] (narrow_a_rows[v - 1] for micro_a_rows), the same
// kernel over the tile's first v vectors of `lanes` columns (v < nr / lanes), when they fit in v
// vectors and that form is there (a 14x14 map's 196 columns are 6 tiles of 32 and one of 4: 12
// columns computed and dropped instead of 28). Every element gets the same arithmetic from either.
// The last rows of C likewise go to short_rows[0] (4 rows) or short_rows[1] (8 rows) when they fit
// and that form is there: the same kernel with fewer rows, A packed (a 64 -> ResNet's 1x1 layer's
// last 4 rows cost a third of a 12-row tile rather than a whole one).
// micro_pack_b and micro_a_rows_pack_b are micro's and micro_a_rows' packing forms (null where the
// instruction set has none).
struct GemmKernelF32 {
  int64_t mr, nr, kc, mc, nc;
  GemmMicroKernelF32 micro, micro_a_rows;
  int64_t lanes;
  GemmMicroKernelF32 narrow[3], narrow_a_rows[3];
  GemmMicroKernelF32 short_rows[2];
  GemmMicroKernelPackF32 micro_pack_b = nullptr, micro_a_rows_pack_b = nullptr;
  // micro's and micro_a_rows' epilogue forms, one per RowActivation (null where none).
  GemmMicroKernelEpilogueF32 micro_epilogue[kRowActivations] = {}, micro_a_rows_epilogue[kRowActivations] = {};
};
// The 7-row kernel's form for a convolution's input read in place through offsets (an implicit
// im2col): the A micro-panel's element [k][i] is a[k_offsets[k] + i * step] (a: the tile's first
// position in a zero-padded input; k_offsets: where each k's tap and channel sit from there;
// step: the stride between the tile's positions), otherwise as GemmMicroKernelF32 (`ahead`
// included).
using GemmMicroKernelOffsetsF32 = void (*)(int64_t kc, const float* a, const int64_t* k_offsets, int64_t step,
                                           const float* b, int64_t b_rs, float beta, float* c, int64_t c_rs,
                                           int64_t c_cs, int64_t m, int64_t n, const float* ahead);
// Two 7-row tiles of a GemmMicroKernelOffsetsF32 at once, one after the other in C (14 rows from
// c): the first tile's positions from a0, the second's from a1, both through the same k_offsets
// and step; its C tile's columns n <= the form's vectors of lanes. Twice the rows a loaded B vector
// serves, for panels of few output channels (one or two vectors); each element's arithmetic as in
// the one-tile form.
using GemmMicroKernelOffsetsPairF32 = void (*)(int64_t kc, const float* a0, const float* a1, const int64_t* k_offsets,
                                               int64_t step, const float* b, int64_t b_rs, float beta, float* c,
                                               int64_t c_rs, int64_t c_cs, int64_t n, const float* ahead);
// A float32 micro-kernel whose tiles have MR = 7 rows, for a C whose rows are a convolution's
// output positions (7x7, 14x14, 28x28 and 56x56 maps are whole multiples of 7) and whose columns
// are its output channels, with its A-through-offsets form (micro_offsets, and narrow_offsets
// for the last columns as narrow; pair_offsets[v - 1] two tiles at once for panels of v vectors,
// v = 1, 2). All null (mr 0) where the instruction set has none.
// micro_14 and micro_14_a_rows are micro's and micro_a_rows' forms for two tiles at once (14 rows,
// the second 7 under the first) over half a panel's columns (nr / 2, B read from the nr-wide panel,
// b_rs = nr; A packed in 14-row panels, or read in place as micro and micro_a_rows read it): a loaded
// B vector serves twice the rows, so a tile streams half the B from L2 per multiply-add. Each
// element's arithmetic as in micro. Null where the instruction set has none. Measured on Sapphire
// Rapids, 2 threads, against 7 x 64 tiles: ViT-B/16's linear layers at 197 rows 4-6% faster
// (ViT-B/16 and Swin-T at batch 1 4-6%), ResNet-50's 1x1 convolutions at 14x14 and 7x7 4-9%; a
// convolution's taps through offsets (pair_offsets over half panels) not faster, not taken.
// last_rows[m - 1] is micro's form with m = 1..6 rows, for a last (packed) tile of fewer than 7
// rows (ViT-B/16's 197 tokens: 14 pairs of tiles and one row, which a whole tile made at half a
// pair's time) and for the rows past 7 of a last pair short of 14; each element's arithmetic as
// in micro.
struct GemmRowsKernelF32 : GemmKernelF32 {
  GemmMicroKernelOffsetsF32 micro_offsets, narrow_offsets[3];
  GemmMicroKernelOffsetsPairF32 pair_offsets[2];
  GemmMicroKernelF32 micro_14 = nullptr, micro_14_a_rows = nullptr;
  GemmMicroKernelF32 last_rows[6] = {};
};
struct GemmKernelF64 {
  int64_t mr, nr, kc, mc, nc;
  GemmMicroKernelF64 micro, micro_a_rows;
};
struct GemmKernelBF16 {
  int64_t mr, nr, kc, mc, nc;  // kc counts values of k (an even number), not pairs
  GemmMicroKernelBF16 micro, micro_a_rows;
};
// The instruction set's fp32 peak loop: `chains` independent vector accumulators of `lanes`
// floats, each updated acc = acc * x + y per iteration (one FMA where the ISA has them), all in
// registers: 2 * lanes * chains floating-point operations per iteration. Returns a value made
// from the results, so the loop cannot be optimised away. The bfloat16 peak loop is the same
// with vdpbf16ps (lanes = the bfloat16 products per instruction) where the ISA has it, else the
// fp32 loop (the bfloat16 GEMM then runs on FMAs).
struct FmaPeakLoop {
  int64_t lanes, chains;
  float (*run)(int64_t iterations);
};
// One output row of a float32 depthwise convolution, every tap inside the input:
//   y[ow] = bias + w[0] * rows[0][ow * stride] + ... + w[taps-1] * rows[taps-1][ow * stride]
// for ow in [0, n), summed in tap order; rows[t] points at tap t's input for ow = 0 (its rows
// contiguous), stride is 1 or 2. Each rows[t] must be readable for kDepthwiseRowSlack floats past
// rows[t][(n - 1) * stride]: the last vector is computed whole.
constexpr int64_t kDepthwiseRowSlack = 32;
using DepthwiseRowF32 = void (*)(int64_t n, int64_t taps, const float* const* rows, const float* w, int64_t stride,
                                 float bias, float* y);
// One output row of a float32 convolution of an input with few channels (a network's stem), all
// its output channels at once: for o in [0, oc) and j in [0, n),
//   y[o * y_os + j] = w[0 * oc + o] * rows[0][j] + ... + w[(taps - 1) * oc + o] * rows[taps - 1][j]
// summed from zero in tap order, each tap's product and sum as the instruction set's gemm
// micro-kernel does them (one fused multiply-add where it has them: the im2col + gemm path's
// bits), rows[t] where tap t reads this row's inputs (contiguous: a
// stride-2 convolution's come de-interleaved), w tap-major. n is a multiple of the instruction
// set's vector, oc of kConvRowsChannels.
constexpr int64_t kConvRowsChannels = 8;
using ConvRowsF32 = void (*)(int64_t n, int64_t taps, const float* const* rows, const float* w, int64_t oc, float* y,
                             int64_t y_os);
// One output row of a float32 depthwise convolution over a block of kDepthwiseBlock channels, the
// input held position-major (channel c of position p at x[p * step' + c], any position stride):
//   s[ow][c] = bias[c] + w[0][c] * x[offsets[0] + ow * step + c] + ...
//              + w[taps-1][c] * x[offsets[taps-1] + ow * step + c]
//   y[ow * y_step + c] = act(s[ow][c] * scale[c] + shift[c])   (scale and shift null: act(s))
// for ow in [0, n), summed in tap order; offsets, step and y_step count floats (multiples of the
// block), w is (taps, kDepthwiseBlock), bias, scale and shift (kDepthwiseBlock); the epilogue's
// arithmetic is EpilogueRowF32's.
constexpr int64_t kDepthwiseBlock = 16;
using DepthwiseChannelsF32 = void (*)(int64_t n, int64_t taps, const float* x, const int64_t* offsets, int64_t step,
                                      const float* w, const float* bias, const float* scale, const float* shift,
                                      RowActivation act, float* y, int64_t y_step);
// The same row where the taps of each window row are consecutive input columns (stride 1, no
// dilation), the row's columns at either end included: tap (i, j) of output ow reads input
// column ow + j - pad of window row i, at x + row_offsets[i] + (ow + j - pad) * step, and is left
// out where that column is outside [0, width); w is (rows * kw, kDepthwiseBlock); otherwise as
// DepthwiseChannelsF32 (the taps in order), for ow in [0, n). Each window row's weights stay in
// registers while its input columns are read once for all the outputs of a group that use them.
// Returns false, having done nothing, for a window width it does not have.
using DepthwiseChannelRowsF32 = bool (*)(int64_t n, int64_t rows, int64_t kw, int64_t pad, int64_t width,
                                         const float* x, const int64_t* row_offsets, int64_t step, const float* w,
                                         const float* bias, const float* scale, const float* shift, RowActivation act,
                                         float* y, int64_t y_step);
// Whole channel planes of a float32 depthwise convolution of stride 1 whose output map is its
// input's (H x W, "same" padding), each plane dense (P = H * W positions, rows of W) and read in
// place, in vectors of the instruction set's 16 lanes of consecutive positions q. Plane i (of
// `planes`) reads x + i * x_stride, writes y + i * y_stride, has weights w + i * taps and
//   y[q] = act((start[i] + w[0] * x[q + offsets[0]] + ... + w[taps-1] * x[q + offsets[taps-1]])
//              * scale[i] + shift[i])   (start null: 0; scale null: act(the sum); shift null: 0)
// summed in tap order from start, where the lanes of vector v whose tap t falls outside the map
// (bit l of masks[t * vectors + v] clear, for position 16 v + l; vectors = ceil(P / 16)) add
// w[t] * 0, as a zero-padded input's would, and read nothing; the epilogue's arithmetic is
// EpilogueRowF32's. AVX-512 only.
struct DepthwisePlanes {
  int64_t planes, P, taps;
  const float* x;
  int64_t x_stride;
  const int64_t* offsets;  // (taps)
  const uint16_t* masks;   // (taps, vectors)
  const float *w, *start, *scale, *shift;
  RowActivation act;
  float* y;
  int64_t y_stride;
};
using DepthwisePlanesF32 = void (*)(const DepthwisePlanes& d);
// Whole channel planes of a float32 depthwise convolution of stride 2 (no dilation), each plane
// dense (H x W in, Ho x Wo out) and read in place, kw <= kDepthwiseStride2MaxWidth: output rows in
// vectors of the instruction set's 16 lanes of consecutive columns, each tap's inputs every other
// column of its input row, picked from the row's window of 48 columns (rows of at most 8 outputs:
// two to a vector, each tap's inputs the even lanes of two loads). Plane i reads x + i * x_stride, writes y + i *
// y_stride, has weights w + i * kh * kw and
//   y[oh][ow] = act((start[i] + sum over taps (r, c) in order of w[r * kw + c] * x[2 oh + r - ph][2 ow + c - pw])
//                   * scale[i] + shift[i])   (start null: 0; scale null: act(the sum); shift null: 0)
// where a tap outside the map adds w * 0, as a zero-padded input's would, and reads nothing; the
// epilogue's arithmetic is EpilogueRowF32's. AVX-512 only.
constexpr int64_t kDepthwiseStride2MaxWidth = 8;
struct DepthwiseStride2Planes {
  int64_t planes, H, W, Ho, Wo, kh, kw, ph, pw;
  const float* x;
  int64_t x_stride;
  const float *w, *start, *scale, *shift;
  RowActivation act;
  float* y;
  int64_t y_stride;
};
using DepthwiseStride2PlanesF32 = void (*)(const DepthwiseStride2Planes& d);
// out[r] = the dot product of n floats, row r of a (a + r * a_rs) and b (both contiguous), for
// r < rows, each summed in a fixed order whatever rows is.
using DotRowsF32 = void (*)(int64_t n, const float* a, int64_t a_rs, int64_t rows, const float* b, float* out);
// A transposing copy, as the GEMM packs a transposed B (a linear layer's weight, x @ W^T) or a
// row-major A (a convolution's weights):
//   dst[k * dst_ld + j] = src[j * src_ld + k] for j < cols, k < k_n.
// With cols below the vector width it may also write zeros after each row's cols values, up to
// the width, into the row's padding or the next row's start (before that row is written).
using PackTransposedF32 = void (*)(int64_t k_n, int64_t cols, const float* src, int64_t src_ld, float* dst,
                                   int64_t dst_ld);
// Every other float, as a stride-2 convolution's im2col reads its input rows:
//   dst[i] = src[2 * i] for i < n,
// reading src[0 .. 2n - 2] only.
using EvenCopyF32 = void (*)(int64_t n, const float* src, float* dst);
// A block copied with stores that bypass the caches (non-temporal, AVX2 and AVX-512; each row's
// first floats up to a vector-aligned address and its last partial vector stored as usual; the
// generic kernel copies as usual), then a store fence, so that other threads see every value:
//   dst[i * dst_rs + j] = src[i * src_rs + j] for i < rows, j < n.
// For outputs too large to stay in cache: writing them this way costs no read of the old lines.
using StreamRowsF32 = void (*)(int64_t rows, int64_t n, const float* src, int64_t src_rs, float* dst, int64_t dst_rs);
// A max pool's running maximum (its window's rows column by column, then its columns), the NaN rule
// of PyTorch's scan (a greater value or a NaN replaces):
//   dst[i] = src[i * stride] > dst[i] || src[i * stride] is NaN ? src[i * stride] : dst[i]
// for i < n, reading src[0 .. (n - 1) * stride] only; vectorised for strides 1 and 2.
using MaxIntoF32 = void (*)(int64_t n, const float* src, int64_t stride, float* dst);
// Winograd F(4x4, 3x3) (Lavin and Gray's transforms): a 3x3 correlation computed per 4x4 output
// tile as A^T [(G g G^T) . (B^T d B)] A from its 6x6 input tile d, element (k, l) of the 6x6
// products being xi = 6k + l (k along rows).
// Input: rows[j] (j < 6) are the 6 input rows of a row of tiles, each readable for
// 4 * (tiles rounded up to 16) + 8 floats, tile t's columns 4t .. 4t+5;
//   v[xi * v_stride + t] = (B^T d_t B)[xi] for t < tiles.
using WinogradInputF32 = void (*)(int64_t tiles, const float* const* rows, float* v, int64_t v_stride);
// Output: from m[xi * m_stride + t] (readable for tiles rounded up to 16), rows[a] (a < 4), each
// writable for 4 * (tiles rounded up to 16) floats, get (A^T m_t A)[a][b] at rows[a][4t + b].
using WinogradOutputF32 = void (*)(int64_t tiles, const float* m, int64_t m_stride, float* const* rows);
// Weights: w holds `pairs` 3x3 kernels (9 contiguous floats each, row-major);
//   u[xi * u_stride + q] = (G g_q G^T)[xi] for q < pairs.
using WinogradWeightF32 = void (*)(int64_t pairs, const float* w, float* u, int64_t u_stride);
struct WinogradF43 {
  WinogradInputF32 input;
  WinogradOutputF32 output;
  WinogradWeightF32 weight;
};
// y[i] = f(x[i]) for n contiguous floats (x and y may be the same array): e^x within 2 ulp (inf
// above 88.72284, 0 below -103.97208, NaN kept), sigmoid 1 / (1 + e^-x), silu x * sigmoid(x),
// both within 3 ulp or 1e-40 (silu's tail is x times a sigmoid in the denormal range), gelu
// x * Phi(x) (erf form) within 8 ulp or 1e-40.
using UnaryF32 = void (*)(int64_t n, const float* x, float* y);
// The softmax of each of `rows` rows of n >= 1 floats, row r at x + r * n and y + r * n (y may be
// x): with m the row's largest value, y = e^(x - m) (UnaryF32's e^x) over their sum, summed in
// double in 8 lanes (element i into lane i % 8, in order; then ((0 + 1) + (2 + 3)) + ((4 + 5) +
// (6 + 7))) and rounded to float once, each quotient rounded once: given the instruction set's
// e^x, the sums and quotients are the same on every instruction set (e^x itself differs in its
// last bits between them). A NaN in a row makes every output of the row NaN.
using SoftmaxRowsF32 = void (*)(int64_t rows, int64_t n, const float* x, float* y);
// One attention item of few keys, S <= kShortRowVectors * lanes (Swin's 49 on AVX-512):
//   out (L, Dv) = softmax(q (L, D) @ k (S, D)^T + bias (L, S) + mask (L, S)) @ v (S, Dv)
// in one pass of rows kept in registers, each step the arithmetic of the unfused ones: each score
// a chain of FMAs over d from 0 (gemm's micro-kernel over a K block), the bias then the mask added
// (each sum rounded; either may be null), SoftmaxRowsF32's softmax, each output a chain of FMAs
// over s from 0. Strides in elements, any for q, k, bias and mask; v's and out's columns
// contiguous. scratch: (D + kShortRowVectors) * round_up(S, lanes) floats.
constexpr int64_t kShortRowVectors = 4;
struct AttentionItemF32 {
  int64_t L, S, D, Dv;
  const float* q;
  int64_t q_rs, q_cs;
  const float* k;
  int64_t k_rs, k_cs;
  const float* v;
  int64_t v_rs;
  const float* bias;
  int64_t bias_rs, bias_cs;
  const float* mask;
  int64_t mask_rs, mask_cs;
  float* out;
  int64_t out_rs;
  float* scratch;
};
using AttentionShortF32 = void (*)(const AttentionItemF32& item);
// gelu's (erf form) backward over n contiguous floats (dx may be dy or x):
//   dx[i] = dy[i] * (Phi(x[i]) + x[i] * phi(x[i])), phi(x) = e^(-x^2 / 2) / sqrt(2 pi),
// Phi as in UnaryF32's gelu.
using GeluBackwardF32 = void (*)(int64_t n, const float* dy, const float* x, float* dx);
// A convolution's epilogue over n contiguous floats (y may be x):
//   y[k] = act(x[k] * scale + shift + residual[k])
// where a null scale, shift (one value each) or residual (n contiguous values) leaves its step
// out, and act keeps NaN: relu x < 0 ? 0 : x, relu6 that clamped to 6, silu as UnaryF32's,
// hardswish x * clamp(x + 3, 0, 6) / 6.
using EpilogueRowF32 = void (*)(int64_t n, const float* x, float* y, const float* scale, const float* shift,
                                const float* residual, RowActivation act);
// The same over `rows` positions of n channels each (channels-last; row strides x_rs, y_rs, r_rs),
// scale and shift holding n values each (or null):
//   y[i * y_rs + k] = act(x[i * x_rs + k] * scale[k] + shift[k] + residual[i * r_rs + k]),
// each element's arithmetic that of EpilogueRowF32 with its channel's scale and shift (y may be x).
using EpilogueChannelsF32 = void (*)(int64_t rows, int64_t n, const float* x, int64_t x_rs, float* y, int64_t y_rs,
                                     const float* scale, const float* shift, const float* residual, int64_t r_rs,
                                     RowActivation act);
// Layer norm of one row of n contiguous floats (n >= 1): its mean and rstd = 1 / sqrt(var + eps),
// var biased (both summed in float, two passes), and
//   y[k] = (x[k] - mean) * rstd * w[k] + b[k].
using LayerNormRowF32 = void (*)(int64_t n, const float* x, const float* w, const float* b, float eps, float* y,
                                 float* mean, float* rstd);
// Its backward for one row: with xhat = (x - mean) * rstd and g = dy * w,
//   dx[k] = rstd * (g[k] - sum(g) / n - xhat[k] * sum(g * xhat) / n),
// and, where not null, sum_dy_xhat[k] += dy[k] * xhat[k] and sum_dy[k] += dy[k] (the weight's
// and the bias's gradients, gathered over rows).
using LayerNormBackwardRowF32 = void (*)(int64_t n, const float* dy, const float* x, float mean, float rstd,
                                         const float* w, float* dx, float* sum_dy_xhat, float* sum_dy);
// Batch norm's per-channel passes over one channel's values: rows (the samples) of n floats
// each, row r at r * rs. Each row's sum runs in double, term i into lane i % 8, the lanes
// combined as ((0 + 1) + (2 + 3)) + ((4 + 5) + (6 + 7)) (loops.h's sum_in_lanes), and the rows'
// sums are added in order: the same bits on every instruction set.
//   sum = Σ x;  squares = Σ (x - m)^2;  grad_sums: s_dy = Σ dy, s_dy_xc = Σ dy (x - m);
// and the input's gradient, each operation rounded to float (no FMA) in this order:
//   dx = a * dy + b * (x - m) + d.
// With relu_y (not null, laid out as x), dy is first ReLU's gradient at relu_y:
// dy * (relu_y >= the smallest positive float ? 1 : 0), as relu's backward computes it.
struct BatchNormRowsF32 {
  double (*sum)(int64_t rows, int64_t n, int64_t rs, const float* x);
  double (*squares)(int64_t rows, int64_t n, int64_t rs, const float* x, double m);
  void (*grad_sums)(int64_t rows, int64_t n, int64_t rs, const float* dy, const float* relu_y, const float* x, double m,
                    double* s_dy, double* s_dy_xc);
  void (*grad)(int64_t rows, int64_t n, int64_t rs, const float* dy, const float* relu_y, const float* x, float a,
               float b, float d, float m, float* dx);
};
// Column sums over rows of n contiguous floats, row r at x + r * rs, added in double into
// sums[0..n) row after row (each column's sum in the rows' order: the same bits on every
// instruction set and as a scalar loop): sums[k] += x[r * rs + k] for r = 0, 1, ..., rows - 1.
using ColumnSumsF32 = void (*)(int64_t rows, int64_t n, int64_t rs, const float* x, double* sums);
struct GemmKernels {
  GemmKernelF32 f32;
  GemmRowsKernelF32 f32_rows7;
  GemmKernelF64 f64;
  GemmKernelBF16 bf16;
  FmaPeakLoop peak, bf16_peak;
  DepthwiseRowF32 depthwise_row;
  DepthwiseChannelsF32 depthwise_channels;
  DepthwiseChannelRowsF32 depthwise_channel_rows;      // null where the instruction set has none
  DepthwisePlanesF32 depthwise_planes;                 // null where the instruction set has none
  DepthwiseStride2PlanesF32 depthwise_stride2_planes;  // the same
  ConvRowsF32 conv_rows;
  DotRowsF32 dot_rows;
  UnaryF32 exp, sigmoid, silu, gelu;
  SoftmaxRowsF32 softmax;
  AttentionShortF32 attention_short;  // null where the instruction set has none
  GeluBackwardF32 gelu_backward;
  EpilogueRowF32 epilogue;
  EpilogueChannelsF32 epilogue_channels;
  LayerNormRowF32 layer_norm;
  LayerNormBackwardRowF32 layer_norm_backward;
  BatchNormRowsF32 batch_norm;
  ColumnSumsF32 column_sums;
  PackTransposedF32 pack_transposed;
  EvenCopyF32 even_copy;
  StreamRowsF32 stream_rows;
  MaxIntoF32 max_into;
  WinogradF43 winograd;
};

extern const GemmKernels gemm_kernels_generic;  // gemm_kernel_generic.cpp, baseline x86-64
extern const GemmKernels gemm_kernels_avx2;     // gemm_kernel_avx2.cpp, -mavx2 -mfma
extern const GemmKernels gemm_kernels_avx512;   // gemm_kernel_avx512.cpp, -mavx512f/bw/vl/dq
// AVX512_BF16's (gemm_kernel_avx512_bf16.cpp, also -mavx512bf16): with the rest of AVX-512's.
extern const GemmKernelBF16 gemm_bf16_avx512_native;
extern const FmaPeakLoop bf16_peak_avx512_native;

}  // namespace tvc::cpu
