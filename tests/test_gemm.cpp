// The CPU GEMM (kernels/cpu/gemm.cpp) and bmm/matmul on top of it, against a naive float64
// reference, on every instruction-set path of the machine: all shapes M,N,K in 1..17, large odd
// shapes that cross the cache blocks (MC, KC, NC), transposed and strided operands, beta 0 / 1 /
// other; and results that do not change with the thread count.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "../kernels/cpu/gemm.h"
#include "../kernels/cpu/loops.h"
#include "tvc/autograd.h"
#include "tvc/ops.h"

using namespace tvc;

namespace {

// ||got - want||2 / ||want||2.
double rel_error(const std::vector<double>& got, const std::vector<double>& want) {
  double d = 0, n = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    d += (got[i] - want[i]) * (got[i] - want[i]);
    n += want[i] * want[i];
  }
  return std::sqrt(d) / std::sqrt(n);
}

template <typename T>
double tolerance() {
  return sizeof(T) == 4 ? 1e-6 : 1e-14;
}

// Runs f once on each instruction-set path of this machine, then restores the best one.
template <typename F>
void for_each_isa(F&& f) {
  for (Isa isa : available_isas()) {
    set_isa(isa);
    SCOPED_TRACE(std::string("isa ") + isa_name(isa));
    f();
  }
  set_isa(available_isas().back());
}

// How an operand of r x c elements is laid out in its buffer.
enum class Layout { RowMajor, ColMajor, Strided };
const char* layout_name(Layout l) { return l == Layout::RowMajor ? "row" : l == Layout::ColMajor ? "col" : "strided"; }

// A matrix of r x c elements in a buffer of the given layout (Strided: row stride 2c+3, column
// stride 2, so neither is 1), filled with values in [-1, 1]; the gaps hold NaN.
template <typename T>
struct Matrix {
  int64_t r, c, rs, cs;
  std::vector<T> buf;
  Matrix(int64_t rows, int64_t cols, Layout l, std::mt19937& gen)
      : r(rows),
        c(cols),
        rs(l == Layout::RowMajor   ? cols
           : l == Layout::ColMajor ? 1
                                   : 2 * cols + 3),
        cs(l == Layout::RowMajor   ? 1
           : l == Layout::ColMajor ? rows
                                   : 2) {
    buf.assign(static_cast<size_t>((r - 1) * rs + (c - 1) * cs + 1), T(NAN));
    std::uniform_real_distribution<double> dist(-1, 1);
    for (int64_t i = 0; i < r; ++i)
      for (int64_t j = 0; j < c; ++j) at(i, j) = static_cast<T>(dist(gen));
  }
  T& at(int64_t i, int64_t j) { return buf[i * rs + j * cs]; }
  std::vector<double> values() {
    std::vector<double> v;
    for (int64_t i = 0; i < r; ++i)
      for (int64_t j = 0; j < c; ++j) v.push_back(at(i, j));
    return v;
  }
};

struct Case {
  int64_t M, N, K;
  Layout la, lb, lc;
  double beta;
};

std::string describe(const Case& c) {
  return "M=" + std::to_string(c.M) + " N=" + std::to_string(c.N) + " K=" + std::to_string(c.K) + " A " +
         layout_name(c.la) + " B " + layout_name(c.lb) + " C " + layout_name(c.lc) + " beta " + std::to_string(c.beta);
}

// The float64 reference of C = A @ B + beta * C.
template <typename T, typename C>
std::vector<double> reference(const Case& cs, Matrix<T>& a, Matrix<T>& b, Matrix<C>& c) {
  std::vector<double> want(static_cast<size_t>(cs.M * cs.N));
  for (int64_t i = 0; i < cs.M; ++i)
    for (int64_t j = 0; j < cs.N; ++j) {
      double s = 0;
      for (int64_t k = 0; k < cs.K; ++k) s += double(a.at(i, k)) * double(b.at(k, j));
      want[i * cs.N + j] = cs.beta == 0 ? s : s + cs.beta * double(c.at(i, j));
    }
  return want;
}

// cpu::gemm on each case and each instruction-set path against the float64 reference.
template <typename T>
void check_cases(const std::vector<Case>& cases) {
  uint32_t seed = 0;
  for (const Case& cs : cases) {
    std::mt19937 gen(++seed);
    Matrix<T> a(cs.M, cs.K, cs.la, gen), b(cs.K, cs.N, cs.lb, gen), c(cs.M, cs.N, cs.lc, gen);
    if (cs.beta == 0)  // beta 0 must ignore C's old contents, NaN included
      for (int64_t i = 0; i < cs.M; ++i)
        for (int64_t j = 0; j < cs.N; ++j) c.at(i, j) = T(NAN);
    const std::vector<double> want = reference(cs, a, b, c);
    for_each_isa([&] {
      Matrix<T> out = c;
      cpu::gemm<T>(cs.M, cs.N, cs.K, a.buf.data(), a.rs, a.cs, b.buf.data(), b.rs, b.cs, out.buf.data(), out.rs, out.cs,
                   static_cast<T>(cs.beta));
      ASSERT_LT(rel_error(out.values(), want), tolerance<T>()) << describe(cs);
    });
  }
}

// cpu::gemm's bfloat16 form (float32 sums into a float32 C) on each case and path against the
// float64 sums of the same bfloat16 values; where the CPU has AVX512_BF16, its instruction gives
// the same bits as the portable pair step of AVX-512 (both add each pair's odd then even product).
void check_cases_bf16(const std::vector<Case>& cases) {
  uint32_t seed = 0;
  for (const Case& cs : cases) {
    std::mt19937 gen(++seed);
    Matrix<BFloat16> a(cs.M, cs.K, cs.la, gen), b(cs.K, cs.N, cs.lb, gen);
    Matrix<float> c(cs.M, cs.N, cs.lc, gen);
    if (cs.beta == 0)
      for (int64_t i = 0; i < cs.M; ++i)
        for (int64_t j = 0; j < cs.N; ++j) c.at(i, j) = NAN;
    const std::vector<double> want = reference(cs, a, b, c);
    std::map<Isa, std::vector<double>> results;
    for_each_isa([&] {
      Matrix<float> out = c;
      cpu::gemm(cs.M, cs.N, cs.K, a.buf.data(), a.rs, a.cs, b.buf.data(), b.rs, b.cs, out.buf.data(), out.rs, out.cs,
                static_cast<float>(cs.beta));
      ASSERT_LT(rel_error(out.values(), want), tolerance<float>()) << describe(cs);
      results[active_isa()] = out.values();
    });
    if (results.count(Isa::avx512_bf16)) {
      ASSERT_EQ(results[Isa::avx512_bf16], results[Isa::avx512]) << describe(cs);
    }
  }
}

constexpr Layout kLayouts[] = {Layout::RowMajor, Layout::ColMajor, Layout::Strided};
constexpr double kBetas[] = {0.0, 1.0, -0.7};

// Every M, N, K in 1..17, cycling through the layouts of A, B, C and the betas.
std::vector<Case> small_cases() {
  std::vector<Case> cases;
  int i = 0;
  for (int64_t M = 1; M <= 17; ++M)
    for (int64_t N = 1; N <= 17; ++N)
      for (int64_t K = 1; K <= 17; ++K, ++i)
        cases.push_back({M, N, K, kLayouts[i % 3], kLayouts[(i / 3) % 3], kLayouts[(i / 9) % 3], kBetas[(i / 27) % 3]});
  return cases;
}

// Shapes larger than the blocks (KC 192..384, NC 256..384, MC 1536) with odd remainders; for
// each, every pair of layouts of A and B, C's layout and beta in turn.
std::vector<Case> large_cases() {
  const int64_t shapes[][3] = {{257, 129, 300}, {19, 801, 400},  {1601, 19, 45},
                               {13, 33, 2049},  {1, 1000, 1280}, {8, 77, 517},  // few rows: the dot-product path
                               {300, 1, 700},    // one column: the dot products too, rows split over threads
                               {40, 49, 2048}};  // row-major A's rows 4 KiB apart (or more): packed, not in place
  std::vector<Case> cases;
  int i = 0;
  for (const auto& s : shapes)
    for (Layout la : kLayouts)
      for (Layout lb : kLayouts) {
        cases.push_back({s[0], s[1], s[2], la, lb, kLayouts[i % 3], kBetas[(i / 3) % 3]});
        ++i;
      }
  return cases;
}

}  // namespace

TEST(Gemm, AllSmallShapesFloat) { check_cases<float>(small_cases()); }
TEST(Gemm, AllSmallShapesDouble) { check_cases<double>(small_cases()); }
TEST(Gemm, LargeOddShapesFloat) { check_cases<float>(large_cases()); }
TEST(Gemm, LargeOddShapesDouble) { check_cases<double>(large_cases()); }
TEST(Gemm, AllSmallShapesBFloat16) { check_cases_bf16(small_cases()); }
TEST(Gemm, LargeOddShapesBFloat16) { check_cases_bf16(large_cases()); }

// K == 0 leaves beta * C (zeros for beta 0).
TEST(Gemm, EmptyInnerDimScalesC) {
  std::vector<float> c = {1, 2, 3, 4};
  cpu::gemm<float>(2, 2, 0, nullptr, 0, 1, nullptr, 2, 1, c.data(), 2, 1, 0.5f);
  EXPECT_EQ(c, (std::vector<float>{0.5f, 1, 1.5f, 2}));
  c = {NAN, 2, 3, 4};
  cpu::gemm<float>(2, 2, 0, nullptr, 0, 1, nullptr, 2, 1, c.data(), 2, 1, 0.f);
  EXPECT_EQ(c, (std::vector<float>{0, 0, 0, 0}));
}

// The same product on 1 and 2 threads gives the same bits, on every path, for a square
// product, one split along N (few rows, B read in place, as in convolutions) and one with K
// across blocks.
TEST(Gemm, BitIdenticalForAnyThreadCount) {
  const int64_t shapes[][3] = {{515, 517, 300}, {64, 3136, 576}, {300, 200, 1000}, {4, 1000, 1280}};
  const Layout b_layouts[] = {Layout::ColMajor, Layout::RowMajor, Layout::Strided, Layout::ColMajor};
  int threads = get_num_threads();
  for_each_isa([&] {
    for (int t = 0; t < 4; ++t) {
      int64_t M = shapes[t][0], N = shapes[t][1], K = shapes[t][2];
      std::mt19937 gen(7);
      Matrix<float> a(M, K, Layout::RowMajor, gen), b(K, N, b_layouts[t], gen);
      std::vector<float> c1(M * N), c2(M * N);
      set_num_threads(1);
      apply_num_threads();  // the kernel is called directly, not through an op that applies it
      cpu::gemm<float>(M, N, K, a.buf.data(), a.rs, a.cs, b.buf.data(), b.rs, b.cs, c1.data(), N, 1, 0.f);
      set_num_threads(2);
      apply_num_threads();
      cpu::gemm<float>(M, N, K, a.buf.data(), a.rs, a.cs, b.buf.data(), b.rs, b.cs, c2.data(), N, 1, 0.f);
      EXPECT_EQ(c1, c2) << "M=" << M << " N=" << N << " K=" << K;
    }
  });
  set_num_threads(threads);
}

// Products of few rows (x @ W^T, a linear layer's batch) and of one column (a matrix-vector
// product) are dot products, several rows at a time against each column (one row: several columns
// at a time against it): every element gets the bits of cpu::dot of its row of A and column of B, for each row count up
// to the dot products' limit and past a group's, K around the vector widths (whole groups of 4 vectors, single vectors,
// a scalar tail), beta 0 and 1, on every instruction set.
TEST(Gemm, DotProductRowsGiveTheBitsOfOneDotEach) {
  for_each_isa([&] {
    for (const int64_t K : {16, 40, 67, 300})
      for (const auto& [M, N] : {std::pair<int64_t, int64_t>{1, 37}, {3, 37}, {4, 37}, {5, 37}, {8, 37}, {70, 1}})
        for (const float beta : {0.f, 1.f}) {
          std::mt19937 gen(static_cast<uint32_t>(K * 100 + M));
          Matrix<float> a(M, K, Layout::RowMajor, gen), b(K, N, Layout::ColMajor, gen), c(M, N, Layout::RowMajor, gen);
          std::vector<float> got = c.buf;
          cpu::gemm<float>(M, N, K, a.buf.data(), a.rs, a.cs, b.buf.data(), b.rs, b.cs, got.data(), N, 1, beta);
          for (int64_t i = 0; i < M; ++i)
            for (int64_t j = 0; j < N; ++j) {
              const float s = cpu::dot(K, a.buf.data() + i * a.rs, b.buf.data() + j * b.cs);
              const float want = beta == 0.f ? s : s + beta * c.buf[i * N + j];
              ASSERT_EQ(got[i * N + j], want)
                  << "M=" << M << " N=" << N << " K=" << K << " beta " << beta << " at " << i << ", " << j;
            }
        }
  });
}

// gemm_b_panels (B packed whole beforehand into panels) gives the bits of gemm on the same
// operands, on every path of this machine, with 1 and 2 threads in turn (each case with one, each
// beta with both: every case with both made this test a third of the unit suite's time under the
// sanitizers), for gemm's own tiles and the
// 7-row tiles where the instruction set has them (AVX-512; a linear layer's rows as 7-row tiles,
// the last columns in narrower tiles, tiles two at a time over half panels where the kernel has
// that form): M whole sevens and fourteens and not (a last tile of 7 rows; of 8 and 11, a whole
// tile and a short form; of each of 1 to 6 rows: the 7-row kernel's short forms), N with each
// narrow tail (1 to 3 vectors) and past a panel (a second half panel of 4 columns), K across KC
// blocks, A read in place down its columns, along its rows and packed from a strided matrix, beta
// 0 and 1 (shapes large enough for gemm's blocked path). Paths without the 7-row kernel say so (the
// linear layers then take gemm's tiles).
TEST(Gemm, PackedBPanelsGiveTheBitsOfGemm) {
  const int64_t shapes[][3] = {{49, 512, 4608}, {196, 40, 300}, {14, 100, 33},  {50, 17, 800}, {7, 64, 11},
                               {147, 177, 9},   {197, 96, 768}, {300, 70, 530}, {16, 70, 300}, {45, 64, 40},
                               {32, 130, 530},  {61, 33, 100},  {25, 70, 300}};
  const int threads = get_num_threads();
  int checked_rows_of_7 = 0, cases = 0;
  for_each_isa([&] {
    if (!cpu::has_rows_of_7_kernel()) {
      EXPECT_TRUE(active_isa() == Isa::generic || active_isa() == Isa::avx2);
    }
    for (cpu::GemmTile tile : {cpu::GemmTile::standard, cpu::GemmTile::rows_of_7}) {
      if (tile == cpu::GemmTile::rows_of_7 && !cpu::has_rows_of_7_kernel()) continue;
      for (const auto& s : shapes) {
        const int64_t M = s[0], N = s[1], K = s[2];
        for (Layout la : {Layout::ColMajor, Layout::RowMajor, Layout::Strided})
          for (Layout lb : {Layout::ColMajor, Layout::RowMajor})
            for (float beta : {0.f, 1.f}) {
              // (gemm takes dot products there, as a linear layer of up to 8 rows does)
              if (la == Layout::RowMajor && lb == Layout::ColMajor && M <= 8) continue;
              const int t = 1 + (cases / 2 + cases) % 2;  // 1 2 2 1 ...: (beta, t) takes every pair
              ++cases;
              set_num_threads(t);
              apply_num_threads();  // the kernel is called directly, not through an op that applies it
              std::mt19937 gen(static_cast<uint32_t>(M * N + K));
              Matrix<float> a(M, K, la, gen), b(K, N, lb, gen), c(M, N, Layout::RowMajor, gen);
              std::vector<float> panels(static_cast<size_t>(cpu::packed_b_floats(tile, K, N)), NAN);
              cpu::pack_b_panels(tile, K, N, b.buf.data(), b.rs, b.cs, panels.data());
              Matrix<float> want = c, got = c;
              cpu::gemm<float>(M, N, K, a.buf.data(), a.rs, a.cs, b.buf.data(), b.rs, b.cs, want.buf.data(), want.rs,
                               want.cs, beta);
              cpu::gemm_b_panels(tile, M, N, K, a.buf.data(), a.rs, a.cs, panels.data(), got.buf.data(), got.rs, got.cs,
                                 beta);
              ASSERT_EQ(got.values(), want.values())
                  << "M=" << M << " N=" << N << " K=" << K << " A " << layout_name(la) << " B " << layout_name(lb)
                  << " beta " << beta << " threads " << t << " " << isa_name(active_isa())
                  << (tile == cpu::GemmTile::rows_of_7 ? " 7-row tiles" : " gemm's tiles");
              checked_rows_of_7 += tile == cpu::GemmTile::rows_of_7;
            }
      }
    }
  });
  set_num_threads(threads);
  if (cpu::has_rows_of_7_kernel()) {
    EXPECT_GT(checked_rows_of_7, 0);
  }
}

// gemm_a_panels (A packed whole beforehand into panels of gemm's MR rows, as a convolution's kept
// weight) gives the bits of gemm on the same operands wherever gemm_takes_a_panels, on every
// instruction set, with 1 and 2 threads in turn: M whole tiles and not (a last tile of fewer
// rows than MR on AVX2's 6 and AVX-512's 12), N with a narrow tail, past gemm's in-place limit on
// A's rows (512 columns), K across KC blocks and with rows 4 KiB apart (where gemm packs A rather
// than read its rows), A row-major (a weight), column-major and strided, B both ways, beta 0 and 1;
// with a row epilogue (ReLU after a per-row scale and shift, as a convolution's folded batch norm)
// that the kernels apply to whole tiles, the same through both.
TEST(Gemm, PackedAPanelsGiveTheBitsOfGemm) {
  const int64_t shapes[][3] = {{40, 49, 1024}, {130, 49, 800}, {64, 600, 300}, {7, 100, 33},
                               {50, 17, 800},  {13, 30, 100},  {24, 96, 64}};
  const int threads = get_num_threads();
  int cases = 0;
  for_each_isa([&] {
    for (const auto& s : shapes) {
      const int64_t M = s[0], N = s[1], K = s[2];
      for (Layout la : {Layout::RowMajor, Layout::ColMajor, Layout::Strided})
        for (Layout lb : {Layout::ColMajor, Layout::RowMajor})
          for (float beta : {0.f, 1.f}) {
            std::mt19937 gen(static_cast<uint32_t>(M * N + K));
            Matrix<float> a(M, K, la, gen), b(K, N, lb, gen), c(M, N, Layout::RowMajor, gen);
            if (!cpu::gemm_takes_a_panels(M, N, K, b.rs, c.rs, c.cs)) continue;
            const int t = 1 + (cases / 2 + cases) % 2;  // 1 2 2 1 ...: (beta, t) takes every pair
            ++cases;
            set_num_threads(t);
            apply_num_threads();  // the kernel is called directly, not through an op that applies it
            std::vector<float> panels(static_cast<size_t>(cpu::packed_a_floats(M, K)), NAN);
            cpu::pack_a_panels(M, K, a.buf.data(), a.rs, a.cs, panels.data());
            const std::string where =
                cat_str("M=", M, " N=", N, " K=", K, " A ", layout_name(la), " B ", layout_name(lb), " beta ", beta,
                        " threads ", t, " ", isa_name(active_isa()));
            Matrix<float> want = c, got = c;
            cpu::gemm<float>(M, N, K, a.buf.data(), a.rs, a.cs, b.buf.data(), b.rs, b.cs, want.buf.data(), want.rs,
                             want.cs, beta);
            cpu::gemm_a_panels(M, N, K, panels.data(), b.buf.data(), b.rs, b.cs, got.buf.data(), got.rs, got.cs, beta);
            ASSERT_EQ(got.values(), want.values()) << where;
            if (beta != 0.f) continue;
            std::vector<float> scale(static_cast<size_t>(M)), shift(static_cast<size_t>(M));
            for (int64_t i = 0; i < M; ++i)
              scale[i] = 0.5f + 0.01f * static_cast<float>(i), shift[i] = 0.1f * (i % 7) - 0.3f;
            const cpu::GemmRowsEpilogue rows{{scale.data(), shift.data(), nullptr, 0}, cpu::RowActivation::relu};
            auto apply = [](const void* ctx, float* blk, int64_t rs, int64_t cs, int64_t i0, int64_t m, int64_t,
                            int64_t n) {
              const auto* r = static_cast<const cpu::GemmRowsEpilogue*>(ctx);
              for (int64_t i = 0; i < m; ++i)
                for (int64_t j = 0; j < n; ++j) {
                  float& v = blk[i * rs + j * cs];
                  v = std::max(v * r->of.scale[i0 + i] + r->of.shift[i0 + i], 0.f);
                }
            };
            const cpu::GemmEpilogue<float> epilogue{apply, &rows, &rows};
            Matrix<float> want_e = c, got_e = c;
            cpu::gemm<float>(M, N, K, a.buf.data(), a.rs, a.cs, b.buf.data(), b.rs, b.cs, want_e.buf.data(), want_e.rs,
                             want_e.cs, 0.f, &epilogue);
            cpu::gemm_a_panels(M, N, K, panels.data(), b.buf.data(), b.rs, b.cs, got_e.buf.data(), got_e.rs, got_e.cs,
                               0.f, &epilogue);
            ASSERT_EQ(got_e.values(), want_e.values()) << where << " with the row epilogue";
          }
    }
  });
  set_num_threads(threads);
  EXPECT_GT(cases, 0);
}

// gemm_rows_of_7_offsets (a convolution's zero-padded input read in place through per-k offsets)
// gives the bits of gemm_b_panels on the explicit matrix those offsets describe, with 1, 2 and 3
// threads (3 split panels' tiles between threads unevenly): stride 1 and 2, N with each narrow
// tail and past a panel, K across KC blocks (a 3x3 window over 10 to 150 channels), several
// samples, panels of one and two vectors (their tiles two at a time, an odd one alone); its
// epilogue sees every 7-row tile once. Also over a range of tiles (two calls, the
// second's epilogue told its tiles' rows), and without offsets (a pointwise convolution's
// channels at a stride, the 7 positions of a tile contiguous).
TEST(Gemm, RowsOf7OffsetsGiveTheBitsOfTheExplicitColumns) {
  struct Shape4 {
    int64_t samples, channels, map, stride, N;
  };
  const Shape4 shapes[] = {{1, 150, 14, 1, 40}, {2, 10, 7, 1, 100}, {1, 64, 15, 2, 17},
                           {3, 20, 14, 2, 64},  {1, 30, 7, 1, 9},   {1, 50, 14, 1, 32}};
  const int threads = get_num_threads();
  int checked = 0;
  for_each_isa([&] {
    if (!cpu::has_rows_of_7_kernel()) return;
    for (const Shape4& s : shapes) {
      const int64_t Hp = s.map + 2, plane = Hp * Hp, K = s.channels * 9, Wo = (s.map - 1) / s.stride + 1;
      const int64_t tiles = s.samples * Wo * Wo / 7, M = 7 * tiles, N = s.N;
      std::mt19937 gen(static_cast<uint32_t>(K + N));
      std::uniform_real_distribution<float> dist(-1.f, 1.f);
      std::vector<float> padded(static_cast<size_t>(s.samples * s.channels * plane));
      for (float& v : padded) v = dist(gen);
      std::vector<int64_t> offsets(K), starts(tiles);
      for (int64_t c = 0, k = 0; c < s.channels; ++c)
        for (int64_t i = 0; i < 3; ++i)
          for (int64_t j = 0; j < 3; ++j, ++k) offsets[k] = c * plane + i * Hp + j;
      for (int64_t t = 0; t < tiles; ++t) {
        const int64_t n = t * 7 / (Wo * Wo), p = t * 7 % (Wo * Wo);
        starts[t] = n * s.channels * plane + p / Wo * s.stride * Hp + p % Wo * s.stride;
      }
      std::vector<float> a(static_cast<size_t>(M * K));
      for (int64_t r = 0; r < M; ++r)
        for (int64_t k = 0; k < K; ++k) a[r * K + k] = padded[starts[r / 7] + r % 7 * s.stride + offsets[k]];
      Matrix<float> b(K, N, Layout::RowMajor, gen);
      std::vector<float> panels(static_cast<size_t>(cpu::packed_b_floats(cpu::GemmTile::rows_of_7, K, N)), NAN);
      cpu::pack_b_panels(cpu::GemmTile::rows_of_7, K, N, b.buf.data(), b.rs, b.cs, panels.data());
      for (int t : {1, 2, 3}) {
        set_num_threads(t);
        apply_num_threads();  // the kernel is called directly, not through an op that applies it
        std::vector<float> want(static_cast<size_t>(M * N), NAN), got(static_cast<size_t>(M * N), NAN);
        cpu::gemm_b_panels(cpu::GemmTile::rows_of_7, M, N, K, a.data(), K, 1, panels.data(), want.data(), N, 1, 0.f);
        std::vector<int> seen(static_cast<size_t>(M * N), 0);
        struct Seen {
          std::vector<int>* seen;
          int64_t ld;
        } ctx{&seen, N};
        const cpu::GemmEpilogue<float> count{
            [](const void* p, float*, int64_t, int64_t, int64_t i0, int64_t m, int64_t j0, int64_t n) {
              const auto& c = *static_cast<const Seen*>(p);
              for (int64_t i = i0; i < i0 + m; ++i)
                for (int64_t j = j0; j < j0 + n; ++j) ++(*c.seen)[i * c.ld + j];
            },
            &ctx};
        const cpu::RowsOf7Input in{padded.data(), starts.data(), offsets.data(), 0, s.stride};
        cpu::gemm_rows_of_7_offsets(0, tiles, in, N, K, panels.data(), got.data(), N, 1, &count);
        ASSERT_EQ(got, want) << "channels " << s.channels << " map " << s.map << " stride " << s.stride << " N " << N
                             << " threads " << t;
        EXPECT_EQ(std::count(seen.begin(), seen.end(), 1), M * N) << "N " << N << " threads " << t;
        std::fill(got.begin(), got.end(), NAN);
        std::fill(seen.begin(), seen.end(), 0);
        const int64_t half = tiles / 2 + 1;
        cpu::gemm_rows_of_7_offsets(half, tiles, in, N, K, panels.data(), got.data(), N, 1, &count);
        EXPECT_TRUE(std::isnan(got[0]));  // the first call's tiles: not written by the second
        cpu::gemm_rows_of_7_offsets(0, half, in, N, K, panels.data(), got.data(), N, 1, &count);
        ASSERT_EQ(got, want) << "in two ranges, channels " << s.channels << " N " << N << " threads " << t;
        EXPECT_EQ(std::count(seen.begin(), seen.end(), 1), M * N) << "in two ranges, N " << N << " threads " << t;
        ++checked;
      }
    }
  });
  set_num_threads(threads);
  if (cpu::has_rows_of_7_kernel()) {
    EXPECT_GT(checked, 0);
  }
}

// Without offsets: A's element [7 t + i][k] at a[tile_starts[t] + i + k * k_stride] (a pointwise
// convolution's NCHW input, several samples, channel stride k_stride), as the explicit matrix
// gives it through gemm_b_panels, with 1 and 2 threads, K across KC blocks, N with a narrow tail
// (16 and 48: tiles one at a time; 16 + 32: the last two at a time over a half panel);
// 7 tiles a sample, so tiles of consecutive positions go two at a time and one a sample alone.
TEST(Gemm, RowsOf7WithoutOffsetsGiveTheBitsOfTheExplicitColumns) {
  const int64_t samples = 2, P = 49, tiles = samples * P / 7, M = 7 * tiles;
  const int threads = get_num_threads();
  int checked = 0;
  for_each_isa([&] {
    if (!cpu::has_rows_of_7_kernel()) return;
    for (const int64_t K : {24, 400})
      for (const int64_t N : {16, 80, 96, 112}) {
        std::mt19937 gen(static_cast<uint32_t>(K + N));
        std::uniform_real_distribution<float> dist(-1.f, 1.f);
        std::vector<float> x(static_cast<size_t>(samples * K * P));
        for (float& v : x) v = dist(gen);
        std::vector<int64_t> starts(tiles);
        for (int64_t t = 0; t < tiles; ++t) starts[t] = t * 7 / P * K * P + t * 7 % P;
        std::vector<float> a(static_cast<size_t>(M * K));
        for (int64_t r = 0; r < M; ++r)
          for (int64_t k = 0; k < K; ++k) a[r * K + k] = x[starts[r / 7] + r % 7 + k * P];
        Matrix<float> b(K, N, Layout::RowMajor, gen);
        std::vector<float> panels(static_cast<size_t>(cpu::packed_b_floats(cpu::GemmTile::rows_of_7, K, N)), NAN);
        cpu::pack_b_panels(cpu::GemmTile::rows_of_7, K, N, b.buf.data(), b.rs, b.cs, panels.data());
        for (int t : {1, 2}) {
          set_num_threads(t);
          apply_num_threads();  // the kernel is called directly, not through an op that applies it
          std::vector<float> want(static_cast<size_t>(M * N), NAN), got(static_cast<size_t>(M * N), NAN);
          cpu::gemm_b_panels(cpu::GemmTile::rows_of_7, M, N, K, a.data(), K, 1, panels.data(), want.data(), N, 1, 0.f);
          cpu::gemm_rows_of_7_offsets(0, tiles, {x.data(), starts.data(), nullptr, P, 1}, N, K, panels.data(),
                                      got.data(), N, 1);
          ASSERT_EQ(got, want) << "K " << K << " N " << N << " threads " << t;
          ++checked;
        }
      }
  });
  set_num_threads(threads);
  if (cpu::has_rows_of_7_kernel()) {
    EXPECT_GT(checked, 0);
  }
}

// The float32 GEMM of A's first M rows and B's first N columns (C row-major) gives bit for bit the
// top-left M x N corner of `full` (the GEMM of them all).
void expect_corner_of(const Matrix<float>& full, const Matrix<float>& a, const Matrix<float>& b, int64_t M, int64_t N,
                      int64_t K, std::mt19937& gen, const std::string& where) {
  Matrix<float> part(M, N, Layout::RowMajor, gen);
  cpu::gemm<float>(M, N, K, a.buf.data(), a.rs, a.cs, b.buf.data(), b.rs, b.cs, part.buf.data(), part.rs, part.cs, 0.f);
  for (int64_t i = 0; i < M; ++i)
    for (int64_t j = 0; j < N; ++j)
      ASSERT_EQ(part.buf[i * part.rs + j], full.buf[i * full.rs + j]) << where << " at (" << i << ", " << j << ")";
}

// The last columns of C in a narrow tile (one vector wide) get the bits of the full-width tile:
// C's first N columns from a GEMM of N columns (its last tile narrow) equal those of a GEMM of a
// whole number of tiles, A packed or read in place, B packed or in place, on every instruction set.
TEST(Gemm, NarrowLastTilesGiveTheBitsOfFullTiles) {
  for_each_isa([&] {
    const int64_t nr = cpu::gemm_tile_columns(), wide = 4 * nr;
    for (const int64_t M : {50, 300})
      for (const int64_t K : {40, 700})
        for (Layout la : {Layout::RowMajor, Layout::ColMajor})
          for (Layout lb : {Layout::RowMajor, Layout::ColMajor}) {
            std::mt19937 gen(static_cast<uint32_t>(M + K));
            Matrix<float> a(M, K, la, gen), b(K, wide, lb, gen), full(M, wide, Layout::RowMajor, gen);
            cpu::gemm<float>(M, wide, K, a.buf.data(), a.rs, a.cs, b.buf.data(), b.rs, b.cs, full.buf.data(), full.rs,
                             full.cs, 0.f);
            for (const int64_t N : {3 * nr + 1, 3 * nr + nr / 2, 3 * nr + nr / 2 + 1})
              expect_corner_of(full, a, b, M, N, K, gen,
                               cat_str("M=", M, " N=", N, " K=", K, " A ", layout_name(la), " B ", layout_name(lb)));
          }
  });
}

// The last rows of C in a short tile (4 or 8 rows, where the instruction set has those forms) get
// the bits of a whole tile: C's first M rows from a GEMM of M rows equal those of a GEMM of 48
// (whole tiles on every instruction set), for every remainder, A row- or column-major, B either,
// K in one block and in two, on every instruction set.
TEST(Gemm, ShortLastTilesGiveTheBitsOfFullTiles) {
  for_each_isa([&] {
    constexpr int64_t full_rows = 48, N = 70;
    for (const int64_t K : {40, 700})
      for (Layout la : {Layout::RowMajor, Layout::ColMajor})
        for (Layout lb : {Layout::RowMajor, Layout::ColMajor}) {
          std::mt19937 gen(static_cast<uint32_t>(K));
          Matrix<float> a(full_rows, K, la, gen), b(K, N, lb, gen), full(full_rows, N, Layout::RowMajor, gen);
          cpu::gemm<float>(full_rows, N, K, a.buf.data(), a.rs, a.cs, b.buf.data(), b.rs, b.cs, full.buf.data(),
                           full.rs, full.cs, 0.f);
          for (int64_t M = 13; M <= 44; ++M)
            expect_corner_of(full, a, b, M, N, K, gen,
                             cat_str("M=", M, " K=", K, " A ", layout_name(la), " B ", layout_name(lb)));
        }
  });
}

// B read in place by each block's first row panel, whose micro-kernel packs it as it reads it (gemm
// told B is in cache, or K blocks of at most 32 rows), gives the bits of B packed in a pass of its
// own (the same B column-major, which is always packed apart): C of 12 to 48 rows (the rows that
// path takes), A row- or column-major, K in one block and in two, N across column blocks with a
// partial last panel, 1 and 2 threads, every instruction set.
TEST(Gemm, BPackedByTheFirstRowPanelGivesTheBitsOfBPackedApart) {
  const int threads = get_num_threads();
  constexpr int64_t N = 1500;  // rows of B too far apart for B in place (kBInPlaceBlockBytes)
  for_each_isa([&] {
    for (const int t : {1, 2}) {
      set_num_threads(t);
      apply_num_threads();  // the kernel is called directly, not through an op that applies it
      for (const int64_t M : {12, 20, 48})
        for (const int64_t K : {24, 200, 500})
          for (Layout la : {Layout::RowMajor, Layout::ColMajor}) {
            std::mt19937 gen(static_cast<uint32_t>(M * K));
            Matrix<float> a(M, K, la, gen), b(K, N, Layout::RowMajor, gen), b_columns(K, N, Layout::ColMajor, gen);
            for (int64_t k = 0; k < K; ++k)
              for (int64_t j = 0; j < N; ++j) b_columns.at(k, j) = b.at(k, j);
            std::vector<float> want(static_cast<size_t>(M * N), NAN);
            cpu::gemm<float>(M, N, K, a.buf.data(), a.rs, a.cs, b_columns.buf.data(), b_columns.rs, b_columns.cs,
                             want.data(), N, 1, 0.f);
            for (const bool b_in_cache : {true, false}) {
              std::vector<float> got(static_cast<size_t>(M * N), NAN);
              cpu::gemm<float>(M, N, K, a.buf.data(), a.rs, a.cs, b.buf.data(), b.rs, b.cs, got.data(), N, 1, 0.f,
                               nullptr, b_in_cache);
              ASSERT_EQ(got, want) << "M=" << M << " K=" << K << " A " << layout_name(la) << " threads " << t
                                   << " b_in_cache " << b_in_cache;
            }
          }
    }
  });
  set_num_threads(threads);
}

namespace {

// A row epilogue applied by a GemmEpilogue's fn (epilogue_row, the instruction set's EpilogueRowF32)
// to the blocks it gets, counting their elements.
struct RowsByFn {
  cpu::GemmRowsEpilogue rows;
  int64_t elements = 0;
};
void rows_by_fn(const void* ctx, float* c, int64_t c_rs, int64_t, int64_t i0, int64_t m, int64_t j0, int64_t n) {
  auto& r = *static_cast<RowsByFn*>(const_cast<void*>(ctx));
  const cpu::GemmRowEpilogue& e = r.rows.of;
  for (int64_t i = i0; i < i0 + m; ++i)
    cpu::epilogue_row(n, c + (i - i0) * c_rs, c + (i - i0) * c_rs, e.scale ? e.scale + i : nullptr,
                      e.shift ? e.shift + i : nullptr, e.residual ? e.residual + i * e.r_rs + j0 : nullptr, r.rows.act);
#pragma omp atomic
  r.elements += m * n;
}

}  // namespace

// A float32 GEMM given a row epilogue (GemmEpilogue::rows) gives the bits of the same epilogue done
// by its fn on every block: each activation, scale and shift or shift alone, with a residual and
// without, C of whole and partial tiles (M 50, N 100), A row- or column-major (read in place along
// its rows, or packed), B read in place or packed, K in one block and in two, 1 and 2 threads, every
// instruction set; and where
// the instruction set's kernels apply it (AVX-512 and AVX2), fn gets fewer elements than C has.
TEST(Gemm, RowEpilogueInTheKernelsGivesTheBitsOfTheEpilogueOnBlocks) {
  const int threads = get_num_threads();
  constexpr int64_t M = 50, N = 100;
  std::mt19937 gen(11);
  std::vector<float> scale(M), shift(M), residual(M * (N + 7));
  std::uniform_real_distribution<float> dist(-2, 2);
  for (float& v : scale) v = dist(gen);
  for (float& v : shift) v = dist(gen);
  for (float& v : residual) v = dist(gen);
  for_each_isa([&] {
    for (const int t : {1, 2}) {
      set_num_threads(t);
      apply_num_threads();  // the kernel is called directly, not through an op that applies it
      for (const int64_t K : {40, 500})
        for (Layout la : {Layout::RowMajor, Layout::ColMajor})
          for (Layout lb : {Layout::RowMajor, Layout::ColMajor})
            for (int act = 0; act < cpu::kRowActivations; ++act)
              for (const bool with_scale : {true, false})
                for (const bool with_residual : {true, false}) {
                  Matrix<float> a(M, K, la, gen), b(K, N, lb, gen);
                  const cpu::GemmRowsEpilogue rows{{with_scale ? scale.data() : nullptr, shift.data(),
                                                    with_residual ? residual.data() : nullptr, N + 7},
                                                   static_cast<cpu::RowActivation>(act)};
                  std::vector<float> want(M * N, NAN), got(M * N, NAN);
                  RowsByFn plain{rows}, fused{rows};
                  const cpu::GemmEpilogue<float> by_fn{rows_by_fn, &plain}, in_kernels{rows_by_fn, &fused, &rows};
                  cpu::gemm<float>(M, N, K, a.buf.data(), a.rs, a.cs, b.buf.data(), b.rs, b.cs, want.data(), N, 1, 0.f,
                                   &by_fn);
                  cpu::gemm<float>(M, N, K, a.buf.data(), a.rs, a.cs, b.buf.data(), b.rs, b.cs, got.data(), N, 1, 0.f,
                                   &in_kernels);
                  const std::string where =
                      cat_str("K=", K, " A ", layout_name(la), " B ", layout_name(lb), " act ", act, " scale ",
                              with_scale, " residual ", with_residual, " threads ", t);
                  ASSERT_EQ(got, want) << where;
                  EXPECT_EQ(plain.elements, M * N) << where;
                  if (std::string(isa_name(active_isa())) != "generic") {
                    EXPECT_LT(fused.elements, M * N) << where;
                  } else {
                    EXPECT_EQ(fused.elements, M * N) << where;
                  }
                }
    }
  });
  set_num_threads(threads);
}

namespace {

std::string shape_str(const Shape& s) {
  std::string out = "(";
  for (size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + ")";
}

// matmul(a, b) on each instruction-set path against the float64 reference, for a (..., M, K)
// and b (..., K, N) with broadcast batch dims.
void check_matmul(const Tensor& a, const Tensor& b, double tol) {
  int64_t M = a.shape()[a.dim() - 2], K = a.shape().back(), N = b.shape().back();
  Shape batch = broadcast_shapes(Shape(a.shape().begin(), a.shape().end() - 2),
                                 Shape(b.shape().begin(), b.shape().end() - 2), "test");
  int64_t nb = 1;
  for (int64_t d : batch) nb *= d;
  Shape sa = batch, sb = batch;
  sa.insert(sa.end(), {M, K});
  sb.insert(sb.end(), {K, N});
  std::vector<double> va = a.expand(sa).contiguous().to_vector();
  std::vector<double> vb = b.expand(sb).contiguous().to_vector();
  std::vector<double> want(static_cast<size_t>(nb * M * N));
  for (int64_t p = 0; p < nb; ++p)
    for (int64_t i = 0; i < M; ++i)
      for (int64_t j = 0; j < N; ++j) {
        double s = 0;
        for (int64_t k = 0; k < K; ++k) s += va[(p * M + i) * K + k] * vb[(p * K + k) * N + j];
        want[(p * M + i) * N + j] = s;
      }
  for_each_isa([&] {
    EXPECT_LT(rel_error(matmul(a, b).to_vector(), want), tol)
        << "matmul of shapes " << shape_str(a.shape()) << " and " << shape_str(b.shape());
  });
}

// An exception thrown inside a kernel's parallel region reaches the calling thread as itself
// (one that left an OpenMP region would end the program).
TEST(ParallelFor, ExceptionsReachTheCaller) {
  const int64_t n = int64_t{1} << 20;
  try {
    cpu::parallel_for(n, 1, [&](int64_t begin, int64_t end) {
      if (begin <= n - 1 && n - 1 < end) throw Error("the last chunk fails");
    });
    FAIL() << "no exception";
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "the last chunk fails");
  }
}

}  // namespace

TEST(Gemm, BmmAndMatmul) {
  for (DType dt : {DType::Float32, DType::Float64}) {
    double tol = dt == DType::Float32 ? tolerance<float>() : tolerance<double>();
    TensorOptions o{.dtype = dt};
    // bmm with contiguous and transposed operands; many small products (split over threads).
    check_matmul(randn({3, 17, 13}, o), randn({3, 13, 15}, o), tol);
    check_matmul(randn({4, 40, 70}, o).transpose(1, 2), randn({4, 40, 33}, o), tol);
    check_matmul(randn({64, 9, 16}, o), randn({64, 16, 9}, o), tol);
    // matmul: batch broadcast, batch folded into M, a transposed large operand.
    check_matmul(randn({2, 1, 5, 7}, o), randn({3, 7, 4}, o), tol);
    check_matmul(randn({2, 3, 31, 64}, o), randn({64, 129}, o), tol);
    check_matmul(randn({200, 257}, o), randn({300, 257}, o).t(), tol);
  }
  // bfloat16: float32 sums rounded once to bfloat16 (half an ulp, 2^-9, relative), against the
  // float64 product of the same bfloat16 values; a linear layer's transposed weight with an odd
  // and an even inner dim.
  const TensorOptions bf{.dtype = DType::BFloat16};
  for (const auto& operands : {std::pair{randn({3, 17, 13}, bf), randn({3, 13, 15}, bf)},
                               {randn({4, 40, 70}, bf).transpose(1, 2), randn({4, 40, 33}, bf)},
                               {randn({2, 3, 31, 64}, bf), randn({64, 129}, bf)},
                               {randn({200, 257}, bf), randn({300, 257}, bf).t()},
                               {randn({197, 768}, bf), randn({300, 768}, bf).t()}})
    for_each_isa([&] { check_matmul(operands.first, operands.second, 3e-3); });  // no structured binding: clang 14
}

// The FMA peak loop of every instruction set measures a positive rate, and cpu_isa() names the
// active set. (What the rate is depends on the machine: no threshold.)
TEST(FmaPeak, EveryInstructionSetMeasures) {
  for (Isa isa : available_isas()) {
    set_isa(isa);
    EXPECT_EQ(cpu_isa(), isa_name(isa));
    const double one = measure_fp32_peak_gflops(1, 0.02);
    EXPECT_TRUE(std::isfinite(one) && one > 0) << isa_name(isa) << ": " << one;
  }
  set_isa(available_isas().back());
  EXPECT_EQ(cpu_has_native_bfloat16(), cpu_isa() == "avx512_bf16");
  const double bf16 = measure_bf16_peak_gflops(1, 0.02);
  EXPECT_TRUE(std::isfinite(bf16) && bf16 > 0) << bf16;
  EXPECT_THROW(measure_fp32_peak_gflops(-1), Error);
  EXPECT_THROW(measure_bf16_peak_gflops(-1), Error);
  EXPECT_THROW(measure_fp32_peak_gflops(1, 0), Error);
}

namespace {

// Distance from got to want in units in the last place of want's float32 (denormal spacing below
// the smallest normal); 0 when both are the same infinity or both NaN.
double ulps(float got, double want) {
  if (std::isnan(want)) return std::isnan(got) ? 0 : INFINITY;
  const float w = static_cast<float>(want);
  if (std::isinf(w)) return got == w ? 0 : INFINITY;
  const double spacing = std::max(std::abs(static_cast<double>(std::nextafter(w, INFINITY) - w)),
                                  static_cast<double>(std::numeric_limits<float>::denorm_min()));
  return std::abs(static_cast<double>(got) - want) / spacing;
}

// The same values, NaN where NaN, in row-major order.
bool same_values(const Tensor& a, const Tensor& b) {
  const std::vector<double> x = a.to_vector(), y = b.to_vector();
  if (a.shape() != b.shape()) return false;
  for (size_t i = 0; i < x.size(); ++i)
    if (!(x[i] == y[i] || (std::isnan(x[i]) && std::isnan(y[i])))) return false;
  return true;
}

}  // namespace

// The vector e^x, sigmoid, silu and gelu of float32 (the kernels of every instruction set, taken by
// dense float32 tensors) against float64: within 2 ulp (exp), 3 ulp (sigmoid, silu) and 8 ulp (gelu) over the whole
// range (or within 1e-40), special values kept;
// a channels-last tensor and one sliced to a non-multiple of the vector width take them too.
TEST(VectorFunctions, MatchFloat64OnEveryInstructionSet) {
  std::mt19937 gen(7);
  std::vector<float> values = {0.0f,     -0.0f,  INFINITY, -INFINITY, NAN,      88.72283935546875f,
                               88.7229f, 88.5f,  -87.0f,   -100.0f,   -103.97f, -104.0f,
                               1e-8f,    -1e-8f, 1e-30f,   20.0f,     -20.0f};
  std::uniform_real_distribution<float> wide(-110.0f, 95.0f), narrow(-12.0f, 12.0f);
  for (int i = 0; i < 200000; ++i) values.push_back(i % 2 ? wide(gen) : narrow(gen));
  const int64_t n = static_cast<int64_t>(values.size());
  const Tensor x = tensor<float>(values, Shape{n});
  struct Function {
    const char* name;
    Tensor (*op)(const Tensor&);
    double (*reference)(double);
    double max_ulps;
  };
  const Function functions[] = {
      {"exp", [](const Tensor& t) { return tvc::exp(t); }, [](double v) { return std::exp(v); }, 2},
      {"sigmoid", [](const Tensor& t) { return tvc::sigmoid(t); }, [](double v) { return 1 / (1 + std::exp(-v)); }, 3},
      {"silu", [](const Tensor& t) { return tvc::silu(t); }, [](double v) { return v / (1 + std::exp(-v)); }, 3},
      {"gelu", [](const Tensor& t) { return tvc::gelu(t); },
       [](double v) { return v * 0.5 * std::erfc(-v / std::sqrt(2.0)); }, 8},
  };
  for_each_isa([&] {
    for (const Function& f : functions) {
      const std::vector<double> got = f.op(x).to_vector();
      // Within max_ulps or 1e-40: silu's tail is x times a sigmoid in the denormal
      // range, with the denormals' precision.
      double worst = 0;
      float worst_at = 0;
      for (int64_t i = 0; i < n; ++i) {
        const double want = f.reference(values[i]);
        const double e = std::abs(got[i] - want) <= 1e-40 ? 0 : ulps(static_cast<float>(got[i]), want);
        if (e > worst) worst = e, worst_at = values[i];
      }
      EXPECT_LE(worst, f.max_ulps) << f.name << " at x = " << worst_at;
      // Channels-last and an odd length: the same values as the plain path.
      const Tensor t = x.slice(0, 0, 2 * 3 * 5 * 7).reshape({2, 3, 5, 7}).contiguous(MemoryFormat::ChannelsLast);
      EXPECT_TRUE(same_values(f.op(t), f.op(t.contiguous()))) << f.name;
      const Tensor odd = x.slice(0, 3, 3 + 37);
      EXPECT_TRUE(same_values(f.op(odd), f.op(x).slice(0, 3, 3 + 37))) << f.name;
    }
  });
}

// Softmax rows of up to four vectors (Swin's 49 scores a row), which the kernel takes in registers
// two rows at a time, give the bits of the passes over memory that longer rows take: each row
// against itself padded with -inf to past that length (whose padding adds e^-inf = 0 to its sums),
// on every instruction set, for 1 to 5 rows of lengths around the vector widths, rows with a
// NaN, +inf, all -inf, and masked scores of -100 (outputs in the denormal range).
TEST(SoftmaxRows, ShortRowsGiveTheBitsOfTheLongRowsPath) {
  std::mt19937 gen(13);
  std::normal_distribution<float> dist(0.0f, 3.0f);
  const int64_t pad = 70;  // past 4 vectors of 16 lanes
  int checked = 0;
  for_each_isa([&] {
    for (int64_t rows : {1, 2, 3, 5})
      for (int64_t n : {1, 2, 7, 8, 9, 15, 16, 17, 31, 32, 33, 48, 49, 63, 64}) {
        std::vector<float> x(rows * n), padded(rows * (n + pad), -INFINITY);
        for (float& v : x) v = dist(gen);
        for (int64_t i = 0; i < n; i += 3) x[i] = -100.0f;                         // a masked score in row 0
        if (rows > 2) x[2 * n + n / 2] = NAN;                                      // row 2
        if (rows > 3) x[3 * n + n - 1] = INFINITY;                                 // row 3
        if (rows > 4) std::fill(x.begin() + 4 * n, x.begin() + 5 * n, -INFINITY);  // row 4
        for (int64_t r = 0; r < rows; ++r) std::copy_n(x.begin() + r * n, n, padded.begin() + r * (n + pad));
        std::vector<float> got(rows * n, 7.0f), want(rows * (n + pad), 7.0f);
        cpu::softmax_rows(rows, n, x.data(), got.data());
        cpu::softmax_rows(rows, n + pad, padded.data(), want.data());
        for (int64_t r = 0; r < rows; ++r)
          for (int64_t i = 0; i < n; ++i) {
            const float g = got[r * n + i], w = want[r * (n + pad) + i];
            ASSERT_TRUE(std::memcmp(&g, &w, sizeof(float)) == 0 || (std::isnan(g) && std::isnan(w)))
                << isa_name(active_isa()) << " rows " << rows << " n " << n << " at " << r << ", " << i << ": " << g
                << " vs " << w;
          }
        ++checked;
      }
  });
  EXPECT_GT(checked, 0);
}

// Batch norm's row passes (gemm_kernels.h, BatchNormRowsF32) of every instruction set: each sum
// the bits of sum_in_lanes (loops.h) over the same double terms, and the gradient row the bits
// of its float operations one by one (this file is compiled without FMA) and nothing written
// between rows, for one and three rows of lengths around multiples of 8 lanes and of the vector
// widths, and of a 56x56 plane.
TEST(BatchNormRows, SumInEightLanesOnEveryInstructionSet) {
  std::mt19937 gen(11);
  std::normal_distribution<float> dist(0.5f, 2.0f);
  for_each_isa([&] {
    const cpu::BatchNormRowsF32& k = cpu::batch_norm_rows();
    for (int64_t rows : {1, 3})
      for (int64_t n : {1, 2, 7, 8, 9, 15, 16, 17, 23, 24, 25, 31, 33, 49, 196, 3136}) {
        const int64_t rs = n + 5;  // rows apart, as a channel's rows of one sample after another
        std::vector<float> x(rows * rs), dy(rows * rs), dx(rows * rs, -7.0f);
        for (size_t i = 0; i < x.size(); ++i) x[i] = dist(gen), dy[i] = dist(gen);
        const double m = 0.37;
        // Σ over the rows of sum_in_lanes(f(row r's values)), rows in order.
        auto rows_sum = [&](auto f) {
          double total = 0;
          for (int64_t r = 0; r < rows; ++r)
            total += cpu::sum_in_lanes<double>(n, [&](int64_t i) { return f(r * rs + i); });
          return total;
        };
        auto value = [](float v) { return static_cast<double>(v); };
        EXPECT_EQ(k.sum(rows, n, rs, x.data()), rows_sum([&](int64_t i) { return value(x[i]); })) << n;
        EXPECT_EQ(k.squares(rows, n, rs, x.data(), m), rows_sum([&](int64_t i) {
                    const double d = value(x[i]) - m;
                    return d * d;
                  }))
            << n;
        double s_dy = 0, s_dy_xc = 0;
        k.grad_sums(rows, n, rs, dy.data(), nullptr, x.data(), m, &s_dy, &s_dy_xc);
        EXPECT_EQ(s_dy, rows_sum([&](int64_t i) { return value(dy[i]); })) << n;
        EXPECT_EQ(s_dy_xc, rows_sum([&](int64_t i) { return value(dy[i]) * (value(x[i]) - m); })) << n;
        const float a = 1.3f, b = -0.21f, d = 0.05f, mf = 0.37f;
        k.grad(rows, n, rs, dy.data(), nullptr, x.data(), a, b, d, mf, dx.data());
        for (int64_t r = 0; r < rows; ++r)
          for (int64_t i = 0; i < rs; ++i) {
            const int64_t at = r * rs + i;
            if (i < n)
              EXPECT_EQ(dx[at], a * dy[at] + b * (x[at] - mf) + d) << n << " at " << r << ", " << i;
            else
              EXPECT_EQ(dx[at], -7.0f) << n << ": wrote between rows at " << r << ", " << i;
          }
      }
  });
}

// The column sums of every instruction set (gemm_kernels.h, ColumnSumsF32): each column's sum
// added into in double row after row, the bits of that scalar loop, nothing written past the n
// columns, for row counts around the kernel's blocks of 16 and column counts around its strips of
// 8 and 16; then the sum op over the rows of a (3, 37, D) slice (two reduced dims, a column block
// of 512 and more), whose float32 columns go through the kernel: the same loop's bits, rounded.
TEST(ColumnSums, RowAfterRowInDoubleOnEveryInstructionSet) {
  std::mt19937 gen(12);
  std::normal_distribution<float> dist(0.5f, 2.0f);
  for_each_isa([&] {
    for (int64_t rows : {1, 15, 16, 17, 40})
      for (int64_t n : {1, 7, 8, 9, 15, 16, 17, 24, 31, 33, 100}) {
        const int64_t rs = n + 3;
        std::vector<float> x(rows * rs);
        for (float& v : x) v = dist(gen);
        std::vector<double> sums(n + 2, -7.0), want(n + 2, -7.0);  // -7: the sums added into
        for (int64_t r = 0; r < rows; ++r)
          for (int64_t k = 0; k < n; ++k) want[k] += static_cast<double>(x[r * rs + k]);
        cpu::column_sums(rows, n, rs, x.data(), sums.data());
        for (int64_t k = 0; k < n + 2; ++k) EXPECT_EQ(sums[k], want[k]) << rows << " x " << n << " column " << k;
      }
    for (int64_t D : {1, 9, 40, 600}) {
      const Tensor x = randn({3, 40, D + 4}).slice(1, 0, 37).slice(2, 0, D);
      const std::vector<double> v = x.contiguous().to_vector();
      std::vector<double> want(D, 0.0);
      for (int64_t r = 0; r < 3 * 37; ++r)
        for (int64_t k = 0; k < D; ++k) want[k] += v[r * D + k];
      const std::vector<double> got = sum(x, {0, 1}).to_vector();
      for (int64_t k = 0; k < D; ++k)
        EXPECT_EQ(got[k], static_cast<double>(static_cast<float>(want[k]))) << D << " column " << k;
    }
  });
}

// gelu's gradient (the gelu_backward kernel of every instruction set, taken by dense float32
// tensors) against float64: within 2e-7 of Phi(x) + x * phi(x) (whose largest value is 1.13) over
// [-30, 30], the gradient scaled by dy; a length that is not a multiple of the vector width and a
// non-contiguous x (the scalar path) agree with the vector path.
TEST(VectorFunctions, GeluGradientMatchesFloat64OnEveryInstructionSet) {
  std::mt19937 gen(9);
  std::uniform_real_distribution<float> wide(-30.0f, 30.0f), narrow(-5.0f, 5.0f), scale(-2.0f, 2.0f);
  std::vector<float> values = {0.0f, -0.0f, 1e-8f, -1e-8f, 20.0f, -20.0f}, dy;
  for (int i = 0; i < 100000; ++i) values.push_back(i % 2 ? wide(gen) : narrow(gen));
  for (size_t i = 0; i < values.size(); ++i) dy.push_back(scale(gen));
  const int64_t n = static_cast<int64_t>(values.size());
  const Tensor x = tensor<float>(values, Shape{n}), g = tensor<float>(dy, Shape{n});
  auto gradient = [](const Tensor& at, const Tensor& dy_at) {
    Tensor leaf = at.detach().requires_grad_();
    gelu(leaf).backward(dy_at);
    return leaf.grad();
  };
  for_each_isa([&] {
    const std::vector<double> got = gradient(x, g).to_vector();
    double worst = 0;
    float worst_at = 0;
    for (int64_t i = 0; i < n; ++i) {
      const double v = values[i];
      const double want =
          dy[i] * (0.5 * std::erfc(-v / std::sqrt(2.0)) + v * std::exp(-v * v / 2) / std::sqrt(2 * M_PI));
      const double e = std::abs(got[i] - want) / std::max(1.0, std::abs(static_cast<double>(dy[i])));
      if (e > worst) worst = e, worst_at = values[i];
    }
    EXPECT_LE(worst, 2e-7) << "gelu gradient at x = " << worst_at;
    const Tensor odd = x.slice(0, 3, 3 + 37), odd_g = g.slice(0, 3, 3 + 37);
    EXPECT_TRUE(same_values(gradient(odd, odd_g), gradient(x, g).slice(0, 3, 3 + 37)));
    const Tensor strided = x.slice(0, 0, 2 * 37).reshape({37, 2}).select(1, 0);
    const Tensor strided_g = g.slice(0, 0, 2 * 37).reshape({37, 2}).select(1, 0);
    const std::vector<double> scalar = gradient(strided, strided_g).to_vector(),
                              vector = gradient(strided.contiguous(), strided_g.contiguous()).to_vector();
    for (size_t i = 0; i < scalar.size(); ++i)
      EXPECT_LE(std::abs(scalar[i] - vector[i]), 4e-7) << "strided gelu gradient at " << i;
  });
}

// A convolution's fused epilogue row (cpu::epilogue_row: scale, shift, residual, activation in one
// pass of the instruction set's kernel) against float64 on every instruction set: each
// activation with every subset of scale, shift and residual, in place and not, lengths around the
// vector widths; within the float32 roundings of the sums (2^-21 of their terms' magnitudes)
// plus 4 ulp; NaN kept.
TEST(ConvEpilogue, RowKernelMatchesFloat64OnEveryInstructionSet) {
  std::mt19937 gen(11);
  std::uniform_real_distribution<float> dist(-8.0f, 8.0f);
  const int64_t max_n = 1003;
  std::vector<float> x(max_n), r(max_n);
  for (int64_t i = 0; i < max_n; ++i) x[i] = dist(gen), r[i] = dist(gen);
  x[5] = NAN, x[6] = -0.0f, x[7] = 3.0f, x[8] = -3.0f;
  const float scale = -1.7f, shift = 0.9f;
  const cpu::RowActivation acts[] = {cpu::RowActivation::none, cpu::RowActivation::relu, cpu::RowActivation::relu6,
                                     cpu::RowActivation::silu, cpu::RowActivation::hardswish};
  auto activation = [](cpu::RowActivation a, double z) {
    switch (a) {
      case cpu::RowActivation::relu:
        return z < 0 ? 0.0 : z;
      case cpu::RowActivation::relu6:
        return z < 0 ? 0.0 : z > 6 ? 6.0 : z;
      case cpu::RowActivation::silu:
        return z / (1 + std::exp(-z));
      case cpu::RowActivation::hardswish:
        return z * std::clamp(z + 3, 0.0, 6.0) / 6;
      case cpu::RowActivation::none:
        break;
    }
    return z;
  };
  for_each_isa([&] {
    for (cpu::RowActivation act : acts)
      for (int parts = 0; parts < 8; ++parts)
        for (int64_t n : {1, 3, 7, 8, 15, 16, 17, 31, 33, 40, 1003})
          for (bool in_place : {false, true}) {
            const float* s = parts & 1 ? &scale : nullptr;
            const float* b = parts & 2 ? &shift : nullptr;
            const float* res = parts & 4 ? r.data() : nullptr;
            std::vector<float> y(x.begin(), x.begin() + n);
            cpu::epilogue_row(n, in_place ? y.data() : x.data(), y.data(), s, b, res, act);
            for (int64_t i = 0; i < n; ++i) {
              double z = x[i];
              if (s) z *= scale;
              double terms = std::abs(z);
              if (b) z += shift, terms += std::abs(shift);
              if (res) z += r[i], terms += std::abs(r[i]);
              const double want = activation(act, z);
              const std::string where = cat_str("activation ", static_cast<int>(act), " parts ", parts, " n ", n,
                                                in_place ? " in place" : "", " at ", i);
              if (std::isnan(want)) {
                EXPECT_TRUE(std::isnan(y[i])) << where;
                continue;
              }
              EXPECT_TRUE(std::abs(y[i] - want) <= std::ldexp(terms, -21) + 1e-40 || ulps(y[i], want) <= 4)
                  << where << ": " << y[i] << " against " << want;
            }
          }
  });
}

// The channels-last epilogue (cpu::epilogue_channels: per-channel scale and shift over rows of
// positions) gives each element the bits of the row kernel with that channel's scale and shift,
// on every instruction set: each activation, every subset of scale, shift and residual, channel
// counts around the vector widths, strided rows, in place and not; nothing written between rows.
TEST(ConvEpilogue, ChannelsKernelGivesTheRowKernelsBitsPerChannel) {
  std::mt19937 gen(12);
  std::uniform_real_distribution<float> dist(-8.0f, 8.0f);
  constexpr int64_t rows = 3, ld = 48;
  std::vector<float> x(rows * ld), r(rows * ld), scale(ld), shift(ld);
  for (auto* v : {&x, &r, &scale, &shift})
    for (float& e : *v) e = dist(gen);
  x[5] = NAN, x[6] = -0.0f;
  const cpu::RowActivation acts[] = {cpu::RowActivation::none, cpu::RowActivation::relu, cpu::RowActivation::relu6,
                                     cpu::RowActivation::silu, cpu::RowActivation::hardswish};
  for_each_isa([&] {
    for (cpu::RowActivation act : acts)
      for (int parts = 0; parts < 8; ++parts)
        for (int64_t n : {1, 3, 4, 7, 8, 15, 16, 17, 33, 40})
          for (bool in_place : {false, true}) {
            const float* s = parts & 1 ? scale.data() : nullptr;
            const float* b = parts & 2 ? shift.data() : nullptr;
            const float* res = parts & 4 ? r.data() : nullptr;
            const float canary = 1234.5f;
            std::vector<float> y(rows * ld, canary);
            for (int64_t i = 0; i < rows; ++i) std::copy_n(x.begin() + i * ld, n, y.begin() + i * ld);
            cpu::epilogue_channels(rows, n, in_place ? y.data() : x.data(), ld, y.data(), ld, s, b, res, ld, act);
            for (int64_t i = 0; i < rows; ++i) {
              for (int64_t k = 0; k < n; ++k) {
                float want;
                cpu::epilogue_row(1, &x[i * ld + k], &want, s ? s + k : nullptr, b ? b + k : nullptr,
                                  res ? &r[i * ld + k] : nullptr, act);
                const float got = y[i * ld + k];
                EXPECT_TRUE(std::memcmp(&got, &want, sizeof(float)) == 0)
                    << "activation " << static_cast<int>(act) << " parts " << parts << " n " << n
                    << (in_place ? " in place" : "") << " at " << i << ", " << k << ": " << got << " against " << want;
              }
              for (int64_t k = n; k < ld; ++k) EXPECT_EQ(y[i * ld + k], canary) << "n " << n << " wrote past a row";
            }
          }
  });
}

// A convolution of 3 input channels with a multiple of 8 output channels takes the few-channel
// rows (cpu::conv_rows); with 9 output channels, im2col + gemm. Both give the first 8 channels the
// same bits on every instruction set: stride 1 and 2, with and without padding, rows around the
// vector widths, an epilogue, a channels-last input, several samples.
TEST(ConvRows, FewChannelRowsGiveTheBitsOfIm2colAndGemm) {
  // 3x3 windows, and 7x7 as ResNet's stem (K = 147, more k than a 3x3's 27).
  const Tensor x = randn({2, 3, 23, 37}), scale = randn({9}), shift = randn({9});
  for (const Tensor& w : {randn({9, 3, 3, 3}), randn({9, 3, 7, 7})})
    for_each_isa([&] {
      const int64_t k = w.shape()[2];
      for (int64_t stride : {1, 2})
        for (int64_t pad : {int64_t{0}, k / 2})
          for (const Tensor& in : {x, x.contiguous(MemoryFormat::ChannelsLast)}) {
            auto conv = [&](int64_t o) {
              return conv2d_epilogue(in, w.narrow(0, 0, o), scale.narrow(0, 0, o), shift.narrow(0, 0, o), Tensor(),
                                     EpilogueActivation::ReLU6, {stride, stride}, {pad, pad});
            };
            NoGradGuard no_grad;
            const Tensor rows = conv(8), gemm = conv(9).narrow(1, 0, 8);
            EXPECT_EQ(max(abs(rows - gemm)).item<float>(), 0.f)
                << "kernel " << k << " stride " << stride << " padding " << pad;
          }
    });
}

// A channels-last convolution with a channels-last residual gives the bits of the NCHW one: the
// few-channel rows (3 input channels) take each block of sums into y transposed, a position's
// channels side by side, with the epilogue there (epilogue_into); the other paths (16 input
// channels: Winograd, the position rows, im2col + gemm) gather the residual's runs for the
// instruction set's epilogue (epilogue_positions). 3x3 and 7x7 windows, stride 1 and 2, 16, 24
// and 40 channels (rows that are not whole vectors), an activation, on every instruction set.
TEST(ConvRows, ChannelsLastWithResidualGivesTheBitsOfNchw) {
  for (int64_t c : {3, 16})
    for (int64_t o : {16, 24, 40})
      for (int64_t k : {3, 7}) {
        const Tensor x = randn({2, c, 19, 23}), w = randn({o, c, k, k}), scale = randn({o}), shift = randn({o});
        for_each_isa([&] {
          for (int64_t stride : {1, 2}) {
            NoGradGuard no_grad;
            const int64_t pad = k / 2;
            const Tensor residual = randn({2, o, (19 + 2 * pad - k) / stride + 1, (23 + 2 * pad - k) / stride + 1});
            auto conv = [&](const Tensor& in, const Tensor& r) {
              return conv2d_epilogue(in, w, scale, shift, r, EpilogueActivation::ReLU6, {stride, stride}, {pad, pad});
            };
            const Tensor nchw = conv(x, residual);
            const Tensor last =
                conv(x.contiguous(MemoryFormat::ChannelsLast), residual.contiguous(MemoryFormat::ChannelsLast));
            ASSERT_EQ(last.suggest_memory_format(), MemoryFormat::ChannelsLast);
            EXPECT_EQ(max(abs(last - nchw)).item<float>(), 0.f)
                << c << " -> " << o << " channels, kernel " << k << " stride " << stride;
          }
        });
      }
}

// A first layer's output of more than 16 MB goes into y past the caches (stream_rows) with the
// bits of the same convolution stored as usual (each sample alone: 11.5 MB), on every instruction
// set, with an epilogue.
TEST(ConvRows, FewChannelRowsStreamedGiveTheBitsOfStoredRows) {
  const Tensor x = randn({2, 3, 600, 600}), w = randn({8, 3, 3, 3}), scale = randn({8}), shift = randn({8});
  for_each_isa([&] {
    NoGradGuard no_grad;
    auto conv = [&](const Tensor& in) {
      return conv2d_epilogue(in, w, scale, shift, Tensor(), EpilogueActivation::ReLU6, {1, 1}, {1, 1});
    };
    const Tensor both = conv(x);  // 23 MB
    for (int64_t s = 0; s < 2; ++s)
      EXPECT_EQ(max(abs(both.narrow(0, s, 1) - conv(x.narrow(0, s, 1)))).item<float>(), 0.f) << "sample " << s;
  });
}

// Elementwise ops cut long rows into pieces when there are fewer rows than threads (a dense
// tensor is one row): every element still gets its own value, for 1 to 3 threads, on a dense
// operand pair, a broadcast scalar, and two strided rows (fewer rows than threads).
TEST(ElementwiseThreads, LongRowsCutIntoPiecesGiveEveryElementItsValue) {
  const int threads = get_num_threads();
  const int64_t n = 200003;
  const Tensor a = randn({n}), b = randn({n}), wide = randn({n, 2});
  const std::vector<double> av = a.to_vector(), bv = b.to_vector(), wv = wide.to_vector();
  for (int t = 1; t <= 3; ++t) {
    set_num_threads(t);
    const std::vector<double> sum = add(a, b).to_vector(), scaled = (a * 3.0).to_vector(),
                              column = (wide.select(1, 1) * 2.0).to_vector();
    for (int64_t i = 0; i < n; ++i) {
      ASSERT_EQ(sum[i], static_cast<float>(static_cast<float>(av[i]) + static_cast<float>(bv[i]))) << t << " " << i;
      ASSERT_EQ(scaled[i], static_cast<float>(av[i] * 3.0f)) << t << " " << i;
      ASSERT_EQ(column[i], static_cast<float>(wv[2 * i + 1] * 2.0f)) << t << " " << i;
    }
  }
  set_num_threads(threads);
}

// even_copy on every instruction set: dst[i] = src[2i] for every n up to past four vectors, src
// allocated to exactly 2n - 1 floats (a read past it is an AddressSanitizer error), dst's floats
// past n untouched.
TEST(EvenCopy, CopiesEveryOtherFloatOnEveryInstructionSet) {
  std::mt19937 gen(3);
  std::uniform_real_distribution<float> dist(-1, 1);
  for_each_isa([&] {
    for (int64_t n = 0; n <= 70; ++n) {
      std::vector<float> src(static_cast<size_t>(std::max<int64_t>(2 * n - 1, 0)));
      for (float& v : src) v = dist(gen);
      std::vector<float> dst(static_cast<size_t>(n + 1), -7.f);
      cpu::even_copy(n, src.data(), dst.data());
      for (int64_t i = 0; i < n; ++i) ASSERT_EQ(dst[i], src[2 * i]) << "n " << n << " i " << i;
      EXPECT_EQ(dst[n], -7.f) << "n " << n;
    }
  });
}

// The depthwise row kernel of each instruction set against float64: lengths around its blocks of
// 8 vectors and its last, partial block (1 to 8 vectors, the last one partial), 9 and 25 taps,
// strides 1 and 2; the sums in tap order from the bias, within their float32 roundings (2^-21
// of the terms' magnitudes); nothing written past n, and the loads past the row only into the
// documented slack.
TEST(DepthwiseRow, MatchesFloat64OnEveryInstructionSet) {
  std::mt19937 gen(12);
  std::uniform_real_distribution<float> dist(-2.0f, 2.0f);
  for_each_isa([&] {
    for (int64_t taps : {9, 25})
      for (int64_t stride : {1, 2})
        for (int64_t n : {1, 7, 8, 15, 16, 17, 73, 127, 128, 129, 130, 255, 256, 300}) {
          const int64_t span = (n - 1) * stride + 1 + taps;  // tap t reads from offset t
          std::vector<float> x(span + cpu::kDepthwiseRowSlack), w(taps);
          for (float& v : x) v = dist(gen);
          for (float& v : w) v = dist(gen);
          std::vector<const float*> rows(taps);
          for (int64_t t = 0; t < taps; ++t) rows[t] = x.data() + t;
          const float bias = 0.625f, canary = 1234.5f;
          std::vector<float> y(n + 40, canary);
          cpu::depthwise_row(n, taps, rows.data(), w.data(), stride, bias, y.data());
          for (int64_t i = 0; i < n; ++i) {
            double want = bias, terms = std::abs(bias);
            for (int64_t t = 0; t < taps; ++t) {
              want += double(w[t]) * rows[t][i * stride];
              terms += std::abs(double(w[t]) * rows[t][i * stride]);
            }
            EXPECT_LE(std::abs(y[i] - want), std::ldexp(terms, -21))
                << "taps " << taps << " stride " << stride << " n " << n << " at " << i;
          }
          for (int64_t i = n; i < n + 40; ++i) EXPECT_EQ(y[i], canary) << "n " << n << " wrote past the row at " << i;
        }
  });
}

// The channel-block depthwise kernel of each instruction set against float64: row lengths over
// its groups of positions and every smaller last group, 9 and 25 taps, steps of 1 and 2
// positions; the sums in tap order from the bias, within their float32 roundings, stored as they
// are, or through a scale, shift and ReLU6 into every other position of y (the positions of a
// channels-last output); nothing written past the row or between its positions.
TEST(DepthwiseChannels, MatchFloat64OnEveryInstructionSet) {
  constexpr int64_t L = cpu::kDepthwiseBlock;
  std::mt19937 gen(13);
  std::uniform_real_distribution<float> dist(-2.0f, 2.0f);
  for_each_isa([&] {
    for (int64_t taps : {9, 25})
      for (int64_t step : {L, 2 * L})
        for (bool epilogue : {false, true})
          for (int64_t n = 1; n <= 20; ++n) {
            std::vector<int64_t> offsets(taps);
            for (int64_t t = 0; t < taps; ++t) offsets[t] = (t * 3 % 7) * L;  // any order of positions
            std::vector<float> x((n - 1) * step + 7 * L), w(taps * L), bias(L), scale(L), shift(L);
            for (auto* v : {&x, &w, &bias, &scale, &shift})
              for (float& e : *v) e = dist(gen);
            const float canary = 1234.5f;
            const int64_t y_step = epilogue ? 2 * L : L;
            std::vector<float> y((n + 2) * y_step, canary);
            cpu::depthwise_channels(n, taps, x.data(), offsets.data(), step, w.data(), bias.data(),
                                    epilogue ? scale.data() : nullptr, epilogue ? shift.data() : nullptr,
                                    epilogue ? cpu::RowActivation::relu6 : cpu::RowActivation::none, y.data(), y_step);
            for (int64_t p = 0; p < n; ++p)
              for (int64_t c = 0; c < L; ++c) {
                double want = bias[c], terms = std::abs(bias[c]);
                for (int64_t t = 0; t < taps; ++t) {
                  const double term = double(w[t * L + c]) * x[offsets[t] + p * step + c];
                  want += term, terms += std::abs(term);
                }
                if (epilogue) {
                  want = std::clamp(want * scale[c] + shift[c], 0.0, 6.0);
                  terms = terms * std::abs(scale[c]) + std::abs(shift[c]);
                }
                EXPECT_LE(std::abs(y[p * y_step + c] - want), std::ldexp(terms, -21))
                    << "taps " << taps << " step " << step << " n " << n << " at " << p << ", " << c;
                if (epilogue) {
                  EXPECT_EQ(y[p * y_step + L + c], canary) << "n " << n << " wrote between positions";
                }
              }
            for (int64_t i = n * y_step; i < (n + 2) * y_step; ++i)
              EXPECT_EQ(y[i], canary) << "n " << n << " wrote past the row";
          }
  });
}
