// int4 weights x int8 activation rows on AVX-512 VNNI: taps.weightonly.VnniW4A8 (its docstring says why
// and what was measured). Built at first use by torch.utils.cpp_extension; registers torch.ops.taps.w4a8_linear.
//
// Layouts (made by VnniW4A8.__init__):
//   x        [M, K] int8, each row rounded by its own scale x_scale [M] float32
//   weight   [N/32, K/8, 128] uint8: for 32 output channels and 8 inputs k..k+7, two 64-byte halves (channels
//            0-15 and 16-31 of the block); byte 4j+i of a half holds channel j's code of input k+i in its low
//            nibble and of input k+4+i in its high nibble, codes 0..15
//   scales   [N/32, K/group, 32] float32, zeros [N/32, K/group, 32] int32: w = (code - zero) * scale
// out[m, n] = x_scale[m] * sum over groups g, in order, of float(sum_k x[m,k] * (code[n,k] - zero[n,g])) * scale[n,g],
// the sum over a group exact in int32 (|.| <= 128 * 127 * 15), the sum over groups one fused multiply-add per group.
// A row's result is the same float operations whatever M is or which rows share its tile: rows stay independent.
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <immintrin.h>
#include <torch/library.h>

namespace {

constexpr int kBlock = 32;  // output channels per packed block: two zmm of int32 lanes

// rows m0..m0+R-1 times one block of 32 output channels
template <int R>
void block_rows(const int8_t* x, int64_t K, const int32_t* xsum, int64_t G, const float* xscale, const uint8_t* w,
                const float* scales, const int32_t* zeros, int64_t group, float* out, int64_t N) {
  const __m512i nibble = _mm512_set1_epi8(0x0F);
  __m512 total[R][2];
  for (int r = 0; r < R; ++r) total[r][0] = total[r][1] = _mm512_setzero_ps();
  for (int64_t g = 0; g < G; ++g) {
    __m512i sum[R][2];
    for (int r = 0; r < R; ++r) sum[r][0] = sum[r][1] = _mm512_setzero_si512();
    const uint8_t* wg = w + g * (group / 8) * 128;
    const int8_t* xg = x + g * group;
    for (int64_t o = 0; o < group / 8; ++o) {
      const __m512i v0 = _mm512_loadu_si512(wg + o * 128), v1 = _mm512_loadu_si512(wg + o * 128 + 64);
      const __m512i lo0 = _mm512_and_si512(v0, nibble), hi0 = _mm512_and_si512(_mm512_srli_epi16(v0, 4), nibble);
      const __m512i lo1 = _mm512_and_si512(v1, nibble), hi1 = _mm512_and_si512(_mm512_srli_epi16(v1, 4), nibble);
      for (int r = 0; r < R; ++r) {
        int32_t first, second;  // inputs k..k+3 and k+4..k+7 of row r
        __builtin_memcpy(&first, xg + r * K + o * 8, 4);
        __builtin_memcpy(&second, xg + r * K + o * 8 + 4, 4);
        const __m512i a0 = _mm512_set1_epi32(first), a1 = _mm512_set1_epi32(second);
        sum[r][0] = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(sum[r][0], lo0, a0), hi0, a1);
        sum[r][1] = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(sum[r][1], lo1, a0), hi1, a1);
      }
    }
    const __m512i z0 = _mm512_loadu_si512(zeros + g * kBlock), z1 = _mm512_loadu_si512(zeros + g * kBlock + 16);
    const __m512 s0 = _mm512_loadu_ps(scales + g * kBlock), s1 = _mm512_loadu_ps(scales + g * kBlock + 16);
    for (int r = 0; r < R; ++r) {
      const __m512i xs = _mm512_set1_epi32(xsum[r * G + g]);  // sum of row r's codes over the group
      const __m512i d0 = _mm512_sub_epi32(sum[r][0], _mm512_mullo_epi32(z0, xs));
      const __m512i d1 = _mm512_sub_epi32(sum[r][1], _mm512_mullo_epi32(z1, xs));
      total[r][0] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(d0), s0, total[r][0]);
      total[r][1] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(d1), s1, total[r][1]);
    }
  }
  for (int r = 0; r < R; ++r) {
    const __m512 xs = _mm512_set1_ps(xscale[r]);
    _mm512_storeu_ps(out + r * N, _mm512_mul_ps(total[r][0], xs));
    _mm512_storeu_ps(out + r * N + 16, _mm512_mul_ps(total[r][1], xs));
  }
}

at::Tensor w4a8_linear(const at::Tensor& x, const at::Tensor& x_scale, const at::Tensor& weight,
                       const at::Tensor& scales, const at::Tensor& zeros, int64_t group) {
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kChar && x.is_contiguous(), "x: contiguous int8 [M, K]");
  TORCH_CHECK(x_scale.scalar_type() == at::kFloat && x_scale.is_contiguous() && x_scale.numel() == x.size(0),
              "x_scale: float32 [M]");
  TORCH_CHECK(weight.dim() == 3 && weight.scalar_type() == at::kByte && weight.is_contiguous() &&
                  weight.size(1) * 8 == x.size(1) && weight.size(2) == 128,
              "weight: packed uint8 [N/32, K/8, 128]");
  TORCH_CHECK(group % 8 == 0 && x.size(1) % group == 0, "group must divide K and be a multiple of 8");
  const int64_t M = x.size(0), K = x.size(1), N = weight.size(0) * kBlock, G = K / group;
  TORCH_CHECK(scales.scalar_type() == at::kFloat && scales.is_contiguous() && scales.numel() == N * G,
              "scales: float32 [N/32, K/group, 32]");
  TORCH_CHECK(zeros.scalar_type() == at::kInt && zeros.is_contiguous() && zeros.numel() == N * G,
              "zeros: int32 [N/32, K/group, 32]");
  const int8_t* xp = x.data_ptr<int8_t>();
  std::vector<int32_t> xsum(M * G);  // [M, G]: each row's sum of codes per group, for the zero points
  for (int64_t m = 0; m < M; ++m)
    for (int64_t g = 0; g < G; ++g) {
      int32_t s = 0;
      for (int64_t k = 0; k < group; ++k) s += xp[m * K + g * group + k];
      xsum[m * G + g] = s;
    }
  at::Tensor out = at::empty({M, N}, x.options().dtype(at::kFloat));
  const float* xs = x_scale.data_ptr<float>();
  const uint8_t* wp = weight.data_ptr<uint8_t>();
  const float* sp = scales.data_ptr<float>();
  const int32_t* zp = zeros.data_ptr<int32_t>();
  float* op = out.data_ptr<float>();
  // blocks of output channels across threads; in each block every row, 4 at a time: the block's weights
  // (K * 16 bytes) come from memory once and from cache for the next rows
  at::parallel_for(0, weight.size(0), 1, [&](int64_t begin, int64_t end) {
    for (int64_t b = begin; b < end; ++b) {
      const uint8_t* wb = wp + b * (K / 8) * 128;
      const float* sb = sp + b * G * kBlock;
      const int32_t* zb = zp + b * G * kBlock;
      for (int64_t m = 0; m < M; m += 4) {
        const int8_t* xm = xp + m * K;
        const int32_t* sm = xsum.data() + m * G;
        float* om = op + m * N + b * kBlock;
        switch (std::min<int64_t>(4, M - m)) {
          case 4: block_rows<4>(xm, K, sm, G, xs + m, wb, sb, zb, group, om, N); break;
          case 3: block_rows<3>(xm, K, sm, G, xs + m, wb, sb, zb, group, om, N); break;
          case 2: block_rows<2>(xm, K, sm, G, xs + m, wb, sb, zb, group, om, N); break;
          default: block_rows<1>(xm, K, sm, G, xs + m, wb, sb, zb, group, om, N);
        }
      }
    }
  });
  return out;
}

}  // namespace

TORCH_LIBRARY(taps, m) {
  m.def("w4a8_linear(Tensor x, Tensor x_scale, Tensor weight, Tensor scales, Tensor zeros, int group) -> Tensor");
}

TORCH_LIBRARY_IMPL(taps, CPU, m) { m.impl("w4a8_linear", &w4a8_linear); }
