// Row-wise attention: taps.rowwise (its docstring says why and what was measured). Built at first use by
// torch.utils.cpp_extension, once for AVX-512 (16 lanes) and once for AVX2 with FMA (8 lanes), whichever the
// CPU runs; registers torch.ops.<TAPS_LIBRARY>.attention (taps_rowwise_avx512 or taps_rowwise_avx2).
//
//   query    [H, Q, D] float32 or bfloat16 (one batch row of transformers' layout), scaled here by `scale`;
//            head h reads key/value head h / (H / Hkv)
//   key, value [Hkv, K, D] float32 or bfloat16, each head's [K, D] contiguous (heads may lie apart: a cache slice)
//   prefix   [Q] int64: row i's keys are 0 .. prefix[i] - 1, then extra[offsets[i] .. offsets[i + 1] - 1]
//   offsets  [Q + 1] int64, extra [n] int64 (key indices, in the order the row reads them)
// out [Q, H, D] in the query's dtype: softmax(q_h . k_j over the row's keys j) weighting v_j, per row and head,
// in float32 until the last rounding.
//
// Invariant: a row's result depends only on its query and on the sequence of keys and values it reads,
// never on where they sit (prefix or extra), on the other rows of the call or on the thread: every
// reduction runs in the order of the row's key list (dot products in a fixed order over D; scores a vector
// at a time from the list's start; values accumulated key by key). So a tree's row (context as a prefix, its
// ancestors as extras) is the bits of the same position decoded alone (all keys a prefix). (The two builds
// are different bits of the same attention: one machine runs one of them.)
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>
#include <torch/library.h>

namespace {

constexpr int kGroups = 8;  // the most query heads per key/value head (taps.rowwise.GROUPS)

// e^x for x <= 0 from e^r's degree-6 Taylor polynomial, x = n ln2 + r with |r| <= ln2 / 2 (relative error
// < 2e-7 there); `scale2` multiplies by 2^n. Written once for both vector widths.
template <typename V>
inline typename V::T exp_neg(typename V::T x) {
  x = V::max(x, V::set1(V::kLowest));
  const typename V::T n = V::round(V::mul(x, V::set1(1.44269504f)));
  typename V::T r = V::fnmadd(n, V::set1(0.693145752f), x);  // ln2 in two parts: r exact to float32
  r = V::fnmadd(n, V::set1(1.42860677e-6f), r);
  typename V::T p = V::set1(1.0f / 720);
  for (float c : {1.0f / 120, 1.0f / 24, 1.0f / 6, 0.5f, 1.0f, 1.0f}) p = V::fmadd(p, r, V::set1(c));
  return V::scale2(p, n);
}

#if defined(__AVX512F__)
struct V {  // 16 float32 lanes, AVX-512
  using T = __m512;
  using Mask = __mmask16;
  static constexpr int N = 16;
  static constexpr int kAccumulators = 16;  // of the value sums, of 32 registers
  static constexpr float kLowest = -104.0f;  // vscalefps flushes to 0 below e^-104, as float32's own underflow
  static Mask lanes(int64_t n) { return n >= N ? (Mask)0xFFFF : (Mask)((1u << n) - 1); }
  static T zero() { return _mm512_setzero_ps(); }
  static T set1(float x) { return _mm512_set1_ps(x); }
  static T load(const float* p, Mask m) { return _mm512_maskz_loadu_ps(m, p); }
  static T load(const at::BFloat16* p, Mask m) {  // bfloat16 -> float32: the bits shifted up, exact
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, p)), 16));
  }
  static void store(float* p, Mask m, T x) { _mm512_mask_storeu_ps(p, m, x); }
  static T select(Mask m, T a, T b) { return _mm512_mask_blend_ps(m, b, a); }  // a where m, else b
  static T add(T a, T b) { return _mm512_add_ps(a, b); }
  static T sub(T a, T b) { return _mm512_sub_ps(a, b); }
  static T mul(T a, T b) { return _mm512_mul_ps(a, b); }
  static T max(T a, T b) { return _mm512_max_ps(a, b); }
  static T fmadd(T a, T b, T c) { return _mm512_fmadd_ps(a, b, c); }
  static T fnmadd(T a, T b, T c) { return _mm512_fnmadd_ps(a, b, c); }
  static T round(T x) { return _mm512_roundscale_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
  static T scale2(T x, T n) { return _mm512_scalef_ps(x, n); }
  static float sum(T x) { return _mm512_reduce_add_ps(x); }
  static float top(T x) { return _mm512_reduce_max_ps(x); }
};
#else
struct V {  // 8 float32 lanes, AVX2 with FMA
  using T = __m256;
  using Mask = __m256i;  // all ones in the lanes kept
  static constexpr int N = 8;
  static constexpr int kAccumulators = 12;  // of the value sums, of 16 registers
  static constexpr float kLowest = -87.0f;  // 2^n stays a normal float32 (the weight is ~1e-38 of the largest)
  static Mask lanes(int64_t n) {
    return _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(std::min<int64_t>(n, N))), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
  }
  static T zero() { return _mm256_setzero_ps(); }
  static T set1(float x) { return _mm256_set1_ps(x); }
  static T load(const float* p, Mask m) { return _mm256_maskload_ps(p, m); }
  static T load(const at::BFloat16* p, Mask m) {  // bfloat16 -> float32: the bits shifted up, exact
    const int kept = __builtin_popcount(_mm256_movemask_ps(_mm256_castsi256_ps(m)));  // the first `kept` lanes
    uint16_t bits[N] = {};
    if (kept < N) std::memcpy(bits, p, kept * sizeof(uint16_t));
    const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(kept < N ? bits : reinterpret_cast<const uint16_t*>(p)));
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(raw), 16));
  }
  static void store(float* p, Mask m, T x) { _mm256_maskstore_ps(p, m, x); }
  static T select(Mask m, T a, T b) { return _mm256_blendv_ps(b, a, _mm256_castsi256_ps(m)); }
  static T add(T a, T b) { return _mm256_add_ps(a, b); }
  static T sub(T a, T b) { return _mm256_sub_ps(a, b); }
  static T mul(T a, T b) { return _mm256_mul_ps(a, b); }
  static T max(T a, T b) { return _mm256_max_ps(a, b); }
  static T fmadd(T a, T b, T c) { return _mm256_fmadd_ps(a, b, c); }
  static T fnmadd(T a, T b, T c) { return _mm256_fnmadd_ps(a, b, c); }
  static T round(T x) { return _mm256_round_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
  static T scale2(T x, T n) {  // x * 2^n, n an integer in -126..0: n + 127 into the exponent bits
    const __m256i bits = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(x, _mm256_castsi256_ps(bits));
  }
  static float sum(T x) {  // halves, then quarters, then pairs: a fixed order
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(x), _mm256_extractf128_ps(x, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    return _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)));
  }
  static float top(T x) {
    __m128 s = _mm_max_ps(_mm256_castps256_ps128(x), _mm256_extractf128_ps(x, 1));
    s = _mm_max_ps(s, _mm_movehl_ps(s, s));
    return _mm_cvtss_f32(_mm_max_ss(s, _mm_movehdup_ps(s)));
  }
};
#endif

// One row's G heads (those of one key/value head) over its keys: keys[j] is the row's j-th key index. G is a
// template argument so that the heads' accumulators stay in registers: each key's (and value's) lanes are
// loaded and converted once for all G heads.
template <int G, typename T>
void row_heads(const float* q, const T* key, const T* value, const int64_t* keys, int64_t L, int64_t D, float* scores,
               float* out) {
  constexpr int N = V::N;
  const int64_t chunks = (D + N - 1) / N;
  for (int64_t j = 0; j < L; ++j) {  // scores [G, L]: q_h . k_j, over D in order
    const T* k = key + keys[j] * D;
    V::T dot[G];
    for (int h = 0; h < G; ++h) dot[h] = V::zero();
    for (int64_t c = 0; c < chunks; ++c) {
      const V::Mask m = V::lanes(D - c * N);
      const V::T kc = V::load(k + c * N, m);
      for (int h = 0; h < G; ++h) dot[h] = V::fmadd(V::load(q + h * D + c * N, m), kc, dot[h]);
    }
    for (int h = 0; h < G; ++h) scores[h * L + j] = V::sum(dot[h]);
  }
  float inverse[G];
  for (int h = 0; h < G; ++h) {  // scores -> weights e^(s - max) in place, a vector at a time from the list's start
    float* s = scores + h * L;
    V::T peak = V::set1(-INFINITY);
    for (int64_t j = 0; j < L; j += N) {
      const V::Mask m = V::lanes(L - j);
      peak = V::max(peak, V::select(m, V::load(s + j, m), V::set1(-INFINITY)));
    }
    const V::T top = V::set1(V::top(peak));
    V::T total = V::zero();
    for (int64_t j = 0; j < L; j += N) {
      const V::Mask m = V::lanes(L - j);
      const V::T e = V::select(m, exp_neg<V>(V::sub(V::load(s + j, m), top)), V::zero());
      V::store(s + j, m, e);
      total = V::add(total, e);
    }
    inverse[h] = 1.0f / V::sum(total);
  }
  // out_h = sum_j w_hj v_j / sum_j w_hj, key by key, over blocks of C chunks of D (G x C accumulators)
  constexpr int C = std::clamp(V::kAccumulators / G, 1, 4);
  for (int64_t c0 = 0; c0 < chunks; c0 += C) {
    V::T acc[G][C];
    for (int h = 0; h < G; ++h)
      for (int c = 0; c < C; ++c) acc[h][c] = V::zero();
    for (int64_t j = 0; j < L; ++j) {
      const T* v = value + keys[j] * D;
      V::T vc[C];
      for (int c = 0; c < C; ++c) vc[c] = c0 + c < chunks ? V::load(v + (c0 + c) * N, V::lanes(D - (c0 + c) * N)) : V::zero();
      for (int h = 0; h < G; ++h) {
        const V::T w = V::set1(scores[h * L + j]);
        for (int c = 0; c < C; ++c) acc[h][c] = V::fmadd(w, vc[c], acc[h][c]);
      }
    }
    for (int h = 0; h < G; ++h)
      for (int c = 0; c < C && c0 + c < chunks; ++c)
        V::store(out + h * D + (c0 + c) * N, V::lanes(D - (c0 + c) * N), V::mul(acc[h][c], V::set1(inverse[h])));
  }
}

template <typename T>
void row_heads(int64_t G, const float* q, const T* key, const T* value, const int64_t* keys, int64_t L, int64_t D,
               float* scores, float* out) {
  switch (G) {
    case 1: return row_heads<1>(q, key, value, keys, L, D, scores, out);
    case 2: return row_heads<2>(q, key, value, keys, L, D, scores, out);
    case 3: return row_heads<3>(q, key, value, keys, L, D, scores, out);
    case 4: return row_heads<4>(q, key, value, keys, L, D, scores, out);
    case 5: return row_heads<5>(q, key, value, keys, L, D, scores, out);
    case 6: return row_heads<6>(q, key, value, keys, L, D, scores, out);
    case 7: return row_heads<7>(q, key, value, keys, L, D, scores, out);
    default: return row_heads<8>(q, key, value, keys, L, D, scores, out);
  }
}

at::Tensor attention(const at::Tensor& query, double scale, const at::Tensor& key, const at::Tensor& value,
                     const at::Tensor& prefix, const at::Tensor& offsets, const at::Tensor& extra) {
  TORCH_CHECK(query.dim() == 3 && query.stride(2) == 1 && (query.scalar_type() == at::kFloat || query.scalar_type() == at::kBFloat16),
              "query: float32 or bfloat16 [H, Q, D], its last dimension contiguous");
  // each head's keys (values) contiguous [K, D]; the heads may lie apart (a slice of a preallocated cache)
  TORCH_CHECK(key.dim() == 3 && key.sizes() == value.sizes() && key.stride(2) == 1 && key.stride(1) == key.size(2) &&
                  value.stride(2) == 1 && value.stride(1) == value.size(2) &&
                  key.scalar_type() == value.scalar_type() && key.size(2) == query.size(2) &&
                  (key.scalar_type() == at::kFloat || key.scalar_type() == at::kBFloat16),
              "key, value: float32 or bfloat16 [Hkv, K, D], alike, each head's [K, D] contiguous");
  const int64_t H = query.size(0), Q = query.size(1), D = query.size(2), Hkv = key.size(0), K = key.size(1), G = H / Hkv;
  TORCH_CHECK(H % Hkv == 0 && G >= 1 && G <= kGroups, "query heads must be 1 to 8 times the key/value heads");
  TORCH_CHECK(prefix.scalar_type() == at::kLong && offsets.scalar_type() == at::kLong && extra.scalar_type() == at::kLong &&
                  prefix.numel() == Q && offsets.numel() == Q + 1 && prefix.is_contiguous() && offsets.is_contiguous() &&
                  extra.is_contiguous(),
              "prefix [Q], offsets [Q + 1], extra: contiguous int64");
  const int64_t* pre = prefix.data_ptr<int64_t>();
  const int64_t* off = offsets.data_ptr<int64_t>();
  const int64_t* ext = extra.data_ptr<int64_t>();
  for (int64_t i = 0; i < Q; ++i)
    TORCH_CHECK(pre[i] >= 0 && pre[i] <= K && off[i] <= off[i + 1] && pre[i] + off[i + 1] - off[i] > 0, "row ", i, " reads no keys or too many");
  for (int64_t n = 0; n < extra.numel(); ++n) TORCH_CHECK(ext[n] >= 0 && ext[n] < K, "extra key index out of range");
  at::Tensor out = at::empty({Q, H, D}, query.options());
  const bool bf16 = key.scalar_type() == at::kBFloat16, query_bf16 = query.scalar_type() == at::kBFloat16;
  const float factor = static_cast<float>(scale);  // as `query.float() * scale` rounds it
  const int64_t head_stride = query.stride(0), row_stride = query.stride(1);
  const float* query_f = query_bf16 ? nullptr : query.data_ptr<float>();
  const at::BFloat16* query_b = query_bf16 ? query.data_ptr<at::BFloat16>() : nullptr;
  float* out_f = query_bf16 ? nullptr : out.data_ptr<float>();
  at::BFloat16* out_b = query_bf16 ? out.data_ptr<at::BFloat16>() : nullptr;
  const void* key_p = key.data_ptr();
  const void* value_p = value.data_ptr();
  const int64_t key_heads = key.stride(0), value_heads = value.stride(0);  // elements from one head to the next
  at::parallel_for(0, Q * Hkv, 1, [&](int64_t begin, int64_t end) {
    std::vector<int64_t> keys;
    std::vector<float> scores, q(G * D), o(G * D);
    for (int64_t task = begin; task < end; ++task) {
      const int64_t i = task / Hkv, g = task % Hkv;
      for (int64_t h = 0; h < G; ++h) {  // the row's heads, scaled float32 [G, D]
        const int64_t first = (g * G + h) * head_stride + i * row_stride;
        for (int64_t d = 0; d < D; ++d)
          q[h * D + d] = (query_bf16 ? static_cast<float>(query_b[first + d]) : query_f[first + d]) * factor;
      }
      keys.resize(pre[i]);
      for (int64_t j = 0; j < pre[i]; ++j) keys[j] = j;
      keys.insert(keys.end(), ext + off[i], ext + off[i + 1]);
      const int64_t L = keys.size();
      scores.resize(G * L);
      if (bf16)
        row_heads(G, q.data(), static_cast<const at::BFloat16*>(key_p) + g * key_heads,
                  static_cast<const at::BFloat16*>(value_p) + g * value_heads, keys.data(), L, D, scores.data(), o.data());
      else
        row_heads(G, q.data(), static_cast<const float*>(key_p) + g * key_heads,
                  static_cast<const float*>(value_p) + g * value_heads, keys.data(), L, D, scores.data(), o.data());
      const int64_t first = (i * H + g * G) * D;  // out [Q, H, D]: the row's G heads, in the query's dtype
      for (int64_t n = 0; n < G * D; ++n) {
        if (query_bf16)
          out_b[first + n] = at::BFloat16(o[n]);  // round to nearest even, as .to() does
        else
          out_f[first + n] = o[n];
      }
    }
  });
  return out;
}

}  // namespace

TORCH_LIBRARY(TAPS_LIBRARY, m) {
  m.def("attention(Tensor query, float scale, Tensor key, Tensor value, Tensor prefix, Tensor offsets, Tensor extra) -> Tensor");
}

TORCH_LIBRARY_IMPL(TAPS_LIBRARY, CPU, m) { m.impl("attention", &attention); }
