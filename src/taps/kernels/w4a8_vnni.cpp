// int4 (and int8) weights x int8 activation rows on AVX-512 VNNI: taps.vnni (its docstring says why and what
// was measured). Built at first use by torch.utils.cpp_extension; registers torch.ops.taps.w4a8_linear and
// torch.ops.taps.w8a8_linear (int8 weights, at the end of this file).
//
// Layouts (weight, scales and mins made by taps.vnni.pack):
//   x        [M, K] float32 or bfloat16, each row rounded here to int8 codes by its own scale x_scale
//   weight   [N/32, K/8, 128] uint8: for 32 output channels and 8 inputs k..k+7, two 64-byte halves (channels
//            0-15 and 16-31 of the block); byte 4j+i of a half holds channel j's code of input k+i in its low
//            nibble and of input k+4+i in its high nibble, codes 0..15
//   scales, mins [N/32, K/group, 32] float16: w = min + code * scale
// out[m, n] = x_scale[m] * sum over groups g, in order, of (float(sum_k x[m,k] * code[n,k]) * scale[n,g]
//             + float(sum_k x[m,k]) * min[n,g]), each int32 sum exact (|.| <= group * 127 * 15), each group
// two fused multiply-adds into the row's float32 total (the minimum's first).
// A row's result is the same float operations whatever M is or which rows share its tile: rows stay independent.
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <type_traits>
#include <vector>
#include <torch/library.h>

namespace {

constexpr int kBlock = 32;  // output channels per packed block: two zmm of int32 lanes
constexpr int kAhead = 8192;  // bytes of weights prefetched ahead of the ones being multiplied

// sum += u8 x s8 products, in place: GCC 12 copies the accumulator of _mm512_dpbusd_epi32 to a new
// register and back on every call
inline void dpbusd(__m512i& sum, __m512i u8, __m512i s8) { asm("vpdpbusd %2, %1, %0" : "+v"(sum) : "v"(u8), "v"(s8)); }

// rows m0..m0+R-1 (R <= 8) times one block of 32 output channels -> their float32 totals, before the row's
// scale. Two int32 sums a row (the block's halves), each a named variable: GCC 12 kept arrays of them on
// the stack. Eight rows a pass read the block's weights once for a tree of up to 7 nodes and unpack each
// 64 bytes of them for 32 products.
// 16 float16 values -> float32 (exact)
inline __m512 half16(const at::Half* p) { return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))); }

template <int R>
void block_rows(const int8_t* x, int64_t K, const int32_t* xsum, int64_t G, const uint8_t* w, const at::Half* scales,
                const at::Half* mins, int64_t group, float (*total)[kBlock]) {
  const __m512i nibble = _mm512_set1_epi8(0x0F);
  for (int r = 0; r < R; ++r)
    for (int j = 0; j < kBlock; ++j) total[r][j] = 0.0f;
  for (int64_t g = 0; g < G; ++g) {
    __m512i a0, b0, a1, b1, a2, b2, a3, b3, a4, b4, a5, b5, a6, b6, a7, b7;
    a0 = b0 = a1 = b1 = a2 = b2 = a3 = b3 = a4 = b4 = a5 = b5 = a6 = b6 = a7 = b7 = _mm512_setzero_si512();
    const uint8_t* wg = w + g * (group / 8) * 128;
    const int8_t* xg = x + g * group;
    for (int64_t o = 0; o < group / 8; ++o) {
      // 8 KB ahead (the thread's next blocks follow in memory): hardware prefetch alone left the product
      // of 8 rows waiting on memory, 32 -> 20 ms for the 1.5B's products (taps.vnni)
      _mm_prefetch(reinterpret_cast<const char*>(wg + o * 128 + kAhead), _MM_HINT_T0);
      _mm_prefetch(reinterpret_cast<const char*>(wg + o * 128 + kAhead + 64), _MM_HINT_T0);
      const __m512i v0 = _mm512_loadu_si512(wg + o * 128), v1 = _mm512_loadu_si512(wg + o * 128 + 64);
      const __m512i lo0 = _mm512_and_si512(v0, nibble), hi0 = _mm512_and_si512(_mm512_srli_epi16(v0, 4), nibble);
      const __m512i lo1 = _mm512_and_si512(v1, nibble), hi1 = _mm512_and_si512(_mm512_srli_epi16(v1, 4), nibble);
      // row r's inputs k..k+3 against the low nibbles, k+4..k+7 against the high ones
#define TAPS_ROW(r, a, b)                                                                        \
  if constexpr (R > r) {                                                                         \
    int32_t first, second;                                                                       \
    __builtin_memcpy(&first, xg + r * K + o * 8, 4);                                             \
    __builtin_memcpy(&second, xg + r * K + o * 8 + 4, 4);                                        \
    const __m512i x0 = _mm512_set1_epi32(first), x1 = _mm512_set1_epi32(second);                 \
    dpbusd(a, lo0, x0);                                                                          \
    dpbusd(b, lo1, x0);                                                                          \
    dpbusd(a, hi0, x1);                                                                          \
    dpbusd(b, hi1, x1);                                                                          \
  }
      TAPS_ROW(0, a0, b0) TAPS_ROW(1, a1, b1) TAPS_ROW(2, a2, b2) TAPS_ROW(3, a3, b3)
      TAPS_ROW(4, a4, b4) TAPS_ROW(5, a5, b5) TAPS_ROW(6, a6, b6) TAPS_ROW(7, a7, b7)
#undef TAPS_ROW
    }
    const __m512 m0 = half16(mins + g * kBlock), m1 = half16(mins + g * kBlock + 16);
    const __m512 s0 = half16(scales + g * kBlock), s1 = half16(scales + g * kBlock + 16);
    // the minimum times the row's sum of codes over the group, then the codes' sum times the scale
#define TAPS_TOTAL(r, a, b)                                                                                    \
  if constexpr (R > r) {                                                                                       \
    const __m512 xs = _mm512_set1_ps(static_cast<float>(xsum[r * G + g]));                                     \
    const __m512 t0 = _mm512_fmadd_ps(xs, m0, _mm512_loadu_ps(total[r]));                                     \
    const __m512 t1 = _mm512_fmadd_ps(xs, m1, _mm512_loadu_ps(total[r] + 16));                                \
    _mm512_storeu_ps(total[r], _mm512_fmadd_ps(_mm512_cvtepi32_ps(a), s0, t0));                               \
    _mm512_storeu_ps(total[r] + 16, _mm512_fmadd_ps(_mm512_cvtepi32_ps(b), s1, t1));                          \
  }
    TAPS_TOTAL(0, a0, b0) TAPS_TOTAL(1, a1, b1) TAPS_TOTAL(2, a2, b2) TAPS_TOTAL(3, a3, b3)
    TAPS_TOTAL(4, a4, b4) TAPS_TOTAL(5, a5, b5) TAPS_TOTAL(6, a6, b6) TAPS_TOTAL(7, a7, b7)
#undef TAPS_TOTAL
  }
}

inline __m512 load16(const float* x) { return _mm512_loadu_ps(x); }
inline __m512 load16(const at::BFloat16* x) {  // bfloat16 -> float32: the same bits shifted up, exact
  const __m512i wide = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(x)));
  return _mm512_castsi512_ps(_mm512_slli_epi32(wide, 16));
}

// Row m of x [M, K] (float32 or bfloat16) rounded to int8 by its own scale, as taps.weightonly._round_rows:
// scale = max(max |x|, 1e-12) / 127 in float32, codes = x / scale (a true division) rounded half to even;
// and its codes' sum per group. K is a multiple of 16 (of the group).
template <typename T>
void round_row(const T* x, int64_t K, int64_t group, int8_t* codes, float* scale, int32_t* sums) {
  __m512 peak = _mm512_setzero_ps();
  for (int64_t k = 0; k < K; k += 16) peak = _mm512_max_ps(peak, _mm512_abs_ps(load16(x + k)));
  const float s = std::max(_mm512_reduce_max_ps(peak), 1e-12f) / 127.0f;
  *scale = s;
  const __m512 sv = _mm512_set1_ps(s);
  for (int64_t g = 0; g < K / group; ++g) {
    __m512i sum = _mm512_setzero_si512();
    for (int64_t k = g * group; k < (g + 1) * group; k += 16) {
      const __m512 q = _mm512_roundscale_ps(_mm512_div_ps(load16(x + k), sv), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
      const __m512i c = _mm512_cvtps_epi32(q);  // integers in -127..127
      _mm_storeu_si128(reinterpret_cast<__m128i*>(codes + k), _mm512_cvtsepi32_epi8(c));
      sum = _mm512_add_epi32(sum, c);
    }
    sums[g] = _mm512_reduce_add_epi32(sum);
  }
}

// f(std::integral_constant<int, R>) for R = rows (1..8): a pass's row count as a template argument
template <typename F>
void by_rows(int64_t rows, F f) {
  switch (rows) {
    case 8: f(std::integral_constant<int, 8>{}); break;
    case 7: f(std::integral_constant<int, 7>{}); break;
    case 6: f(std::integral_constant<int, 6>{}); break;
    case 5: f(std::integral_constant<int, 5>{}); break;
    case 4: f(std::integral_constant<int, 4>{}); break;
    case 3: f(std::integral_constant<int, 3>{}); break;
    case 2: f(std::integral_constant<int, 2>{}); break;
    default: f(std::integral_constant<int, 1>{});
  }
}

// Both products' frame: each row of x [M, K] rounded to int8 (round_row: its codes, scale and sums of codes per
// group of `group` inputs), then blocks of 32 output channels across threads, in each block every row, 8 at a
// time: `pass(R, codes, sums, block, total)` (R a by_rows constant) fills total[r][j] for the pass's R rows
// before their scales, so the block's weights come from memory once and from cache for the next rows; then
// each row's scale last and its dtype (at::BFloat16 rounds to nearest even, as tensor.to(torch.bfloat16) does).
template <typename Pass>
at::Tensor row_products(const at::Tensor& x, int64_t blocks, int64_t group, Pass pass) {
  const int64_t M = x.size(0), K = x.size(1), N = blocks * kBlock, G = K / group;
  std::vector<int8_t> codes(M * K);
  std::vector<float> row_scale(M);
  std::vector<int32_t> xsum(M * G);  // [M, G]: each row's sum of codes per group
  const bool bf16 = x.scalar_type() == at::kBFloat16;
  const at::BFloat16* xb = bf16 ? x.data_ptr<at::BFloat16>() : nullptr;
  const float* xf = bf16 ? nullptr : x.data_ptr<float>();
  at::parallel_for(0, M, std::max<int64_t>(1, 32768 / K), [&](int64_t begin, int64_t end) {
    for (int64_t m = begin; m < end; ++m) {
      if (bf16)
        round_row(xb + m * K, K, group, codes.data() + m * K, &row_scale[m], &xsum[m * G]);
      else
        round_row(xf + m * K, K, group, codes.data() + m * K, &row_scale[m], &xsum[m * G]);
    }
  });
  at::Tensor out = at::empty({M, N}, x.options());
  at::BFloat16* ob = bf16 ? out.data_ptr<at::BFloat16>() : nullptr;
  float* of = bf16 ? nullptr : out.data_ptr<float>();
  at::parallel_for(0, blocks, 1, [&](int64_t begin, int64_t end) {
    float total[8][kBlock];
    for (int64_t b = begin; b < end; ++b) {
      for (int64_t m = 0; m < M; m += 8) {
        const int64_t rows = std::min<int64_t>(8, M - m);
        by_rows(rows, [&](auto R) { pass(R, codes.data() + m * K, xsum.data() + m * G, b, total); });
        for (int64_t r = 0; r < rows; ++r) {
          const float s = row_scale[m + r];
          const int64_t first = (m + r) * N + b * kBlock;
          if (bf16)
            for (int j = 0; j < kBlock; ++j) ob[first + j] = at::BFloat16(total[r][j] * s);
          else
            for (int j = 0; j < kBlock; ++j) of[first + j] = total[r][j] * s;
        }
      }
    }
  });
  return out;
}

at::Tensor w4a8_linear(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& scales,
                       const at::Tensor& mins, int64_t group) {
  TORCH_CHECK(x.dim() == 2 && x.is_contiguous() && (x.scalar_type() == at::kFloat || x.scalar_type() == at::kBFloat16),
              "x: contiguous float32 or bfloat16 [M, K]");
  TORCH_CHECK(weight.dim() == 3 && weight.scalar_type() == at::kByte && weight.is_contiguous() &&
                  weight.size(1) * 8 == x.size(1) && weight.size(2) == 128,
              "weight: packed uint8 [N/32, K/8, 128]");
  TORCH_CHECK(group % 8 == 0 && x.size(1) % group == 0, "group must divide K and be a multiple of 8");
  const int64_t K = x.size(1), N = weight.size(0) * kBlock, G = K / group;
  TORCH_CHECK(scales.scalar_type() == at::kHalf && scales.is_contiguous() && scales.numel() == N * G,
              "scales: float16 [N/32, K/group, 32]");
  TORCH_CHECK(mins.scalar_type() == at::kHalf && mins.is_contiguous() && mins.numel() == N * G,
              "mins: float16 [N/32, K/group, 32]");
  const uint8_t* wp = weight.data_ptr<uint8_t>();
  const at::Half* sp = scales.data_ptr<at::Half>();
  const at::Half* mp = mins.data_ptr<at::Half>();
  return row_products(x, weight.size(0), group, [&](auto R, const int8_t* xm, const int32_t* sm, int64_t b,
                                                    float (*total)[kBlock]) {
    block_rows<decltype(R)::value>(xm, K, sm, G, wp + b * (K / 8) * 128, sp + b * G * kBlock, mp + b * G * kBlock,
                                   group, total);
  });
}

// int8 weights (one scale per output channel), the product of taps.weightonly.W8A8Product on this kernel:
//   weight   [N/32, K/4, 128] uint8: for 32 output channels and 4 inputs k..k+3, two 64-byte halves (channels
//            0-15 and 16-31 of the block); byte 4j+i of a half holds channel j's int8 weight of input k+i plus 128
//   scales   [N] float32
// out[m, n] = float(sum_k x[m,k] * w[n,k]) * scale[n] * x_scale[m], rounded to float32 after each multiply, as
// oneDNN's int8 inner product and W8A8Product's multiply by the row's scale do; the int32 sum is exact
// (|.| <= K * 255 * 127 before the offset's 128 * sum_k x[m,k] is taken off, so K < 66,000).
template <int R>
void block_rows8(const int8_t* x, int64_t K, const int32_t* xsum, const uint8_t* w, const float* scales,
                 float (*total)[kBlock]) {
  __m512i a0, b0, a1, b1, a2, b2, a3, b3, a4, b4, a5, b5, a6, b6, a7, b7;
  a0 = b0 = a1 = b1 = a2 = b2 = a3 = b3 = a4 = b4 = a5 = b5 = a6 = b6 = a7 = b7 = _mm512_setzero_si512();
  for (int64_t q = 0; q < K / 4; ++q) {
    _mm_prefetch(reinterpret_cast<const char*>(w + q * 128 + kAhead), _MM_HINT_T0);
    _mm_prefetch(reinterpret_cast<const char*>(w + q * 128 + kAhead + 64), _MM_HINT_T0);
    const __m512i v0 = _mm512_loadu_si512(w + q * 128), v1 = _mm512_loadu_si512(w + q * 128 + 64);
#define TAPS_ROW(r, a, b)                                                                        \
  if constexpr (R > r) {                                                                         \
    int32_t four;                                                                                \
    __builtin_memcpy(&four, x + r * K + q * 4, 4);                                               \
    const __m512i xs = _mm512_set1_epi32(four);                                                  \
    dpbusd(a, v0, xs);                                                                           \
    dpbusd(b, v1, xs);                                                                           \
  }
    TAPS_ROW(0, a0, b0) TAPS_ROW(1, a1, b1) TAPS_ROW(2, a2, b2) TAPS_ROW(3, a3, b3)
    TAPS_ROW(4, a4, b4) TAPS_ROW(5, a5, b5) TAPS_ROW(6, a6, b6) TAPS_ROW(7, a7, b7)
#undef TAPS_ROW
  }
  const __m512 s0 = _mm512_loadu_ps(scales), s1 = _mm512_loadu_ps(scales + 16);
  // the offset's products off (exact in int32), then the sum to float32 times the channel's scale
#define TAPS_TOTAL(r, a, b)                                                                                    \
  if constexpr (R > r) {                                                                                       \
    const __m512i offset = _mm512_set1_epi32(128 * xsum[r]);                                                   \
    _mm512_storeu_ps(total[r], _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_sub_epi32(a, offset)), s0));           \
    _mm512_storeu_ps(total[r] + 16, _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_sub_epi32(b, offset)), s1));      \
  }
  TAPS_TOTAL(0, a0, b0) TAPS_TOTAL(1, a1, b1) TAPS_TOTAL(2, a2, b2) TAPS_TOTAL(3, a3, b3)
  TAPS_TOTAL(4, a4, b4) TAPS_TOTAL(5, a5, b5) TAPS_TOTAL(6, a6, b6) TAPS_TOTAL(7, a7, b7)
#undef TAPS_TOTAL
}

at::Tensor w8a8_linear(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& scales) {
  TORCH_CHECK(x.dim() == 2 && x.is_contiguous() && (x.scalar_type() == at::kFloat || x.scalar_type() == at::kBFloat16),
              "x: contiguous float32 or bfloat16 [M, K]");
  TORCH_CHECK(weight.dim() == 3 && weight.scalar_type() == at::kByte && weight.is_contiguous() &&
                  weight.size(1) * 4 == x.size(1) && weight.size(2) == 128,
              "weight: packed uint8 [N/32, K/4, 128]");
  const int64_t K = x.size(1), N = weight.size(0) * kBlock;
  TORCH_CHECK(K % 16 == 0 && K < 66000, "K must be a multiple of 16 below 66,000");
  TORCH_CHECK(scales.scalar_type() == at::kFloat && scales.is_contiguous() && scales.numel() == N, "scales: float32 [N]");
  const uint8_t* wp = weight.data_ptr<uint8_t>();
  const float* sp = scales.data_ptr<float>();
  // one group of all K inputs: each row's sum of codes, for the weights' offset of 128
  return row_products(x, weight.size(0), K, [&](auto R, const int8_t* xm, const int32_t* sm, int64_t b,
                                                float (*total)[kBlock]) {
    block_rows8<decltype(R)::value>(xm, K, sm, wp + b * (K / 4) * 128, sp + b * kBlock, total);
  });
}

}  // namespace

TORCH_LIBRARY(taps, m) {
  m.def("w4a8_linear(Tensor x, Tensor weight, Tensor scales, Tensor mins, int group) -> Tensor");
  m.def("w8a8_linear(Tensor x, Tensor weight, Tensor scales) -> Tensor");
}

TORCH_LIBRARY_IMPL(taps, CPU, m) {
  m.impl("w4a8_linear", &w4a8_linear);
  m.impl("w8a8_linear", &w8a8_linear);
}
