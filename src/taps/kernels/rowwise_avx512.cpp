// Row-wise attention on AVX-512: taps.rowwise (its docstring says why and what was measured). Built at first
// use by torch.utils.cpp_extension; registers torch.ops.taps_rowwise.attention.
//
//   query    [H, Q, D] float32 or bfloat16 (one batch row of transformers' layout), scaled here by `scale`;
//            head h reads key/value head h / (H / Hkv)
//   key, value [Hkv, K, D] float32 or bfloat16
//   prefix   [Q] int64: row i's keys are 0 .. prefix[i] - 1, then extra[offsets[i] .. offsets[i + 1] - 1]
//   offsets  [Q + 1] int64, extra [n] int64 (key indices, in the order the row reads them)
// out [Q, H, D] in the query's dtype: softmax(q_h . k_j over the row's keys j) weighting v_j, per row and head,
// in float32 until the last rounding.
//
// Invariant: a row's result depends only on its query and on the sequence of keys and values it reads,
// never on where they sit (prefix or extra), on the other rows of the call or on the thread: every
// reduction runs in the order of the row's key list (dot products in a fixed order over D; scores 16 at a
// time from the list's start; values accumulated key by key). So a tree's row (context as a prefix, its
// ancestors as extras) is the bits of the same position decoded alone (all keys a prefix).
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <vector>
#include <torch/library.h>

namespace {

constexpr int kGroups = 8;  // the most query heads per key/value head (taps.rowwise.GROUPS)

inline __m512 load(const float* p, __mmask16 m) { return _mm512_maskz_loadu_ps(m, p); }
inline __m512 load(const at::BFloat16* p, __mmask16 m) {  // bfloat16 -> float32: the bits shifted up, exact
  const __m512i wide = _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, p));
  return _mm512_castsi512_ps(_mm512_slli_epi32(wide, 16));
}

// e^x for x <= 0, 16 lanes: x = n ln2 + r with |r| <= ln2 / 2, e^r by its degree-6 Taylor polynomial (relative
// error < 2e-7 there), times 2^n by vscalefps (0 below e^-104, as float32's own underflow)
inline __m512 exp_neg(__m512 x) {
  x = _mm512_max_ps(x, _mm512_set1_ps(-104.0f));
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504f)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693145752f), x);  // ln2 in two parts: r exact to float32
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(1.42860677e-6f), r);
  __m512 p = _mm512_set1_ps(1.0f / 720);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 120));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 24));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 6));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
  return _mm512_scalef_ps(p, n);
}

inline __mmask16 lanes(int64_t n) { return n >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << n) - 1); }

// One row's G heads (those of one key/value head) over its keys: keys[j] is the row's j-th key index. G is a
// template argument so that the heads' accumulators stay in registers: each key's (and value's) 16 floats are
// loaded and converted once for all G heads.
template <int G, typename T>
void row_heads(const float* q, const T* key, const T* value, const int64_t* keys, int64_t L, int64_t D, float* scores,
               float* out) {
  const int64_t chunks = (D + 15) / 16;
  for (int64_t j = 0; j < L; ++j) {  // scores [G, L]: q_h . k_j, over D in order
    const T* k = key + keys[j] * D;
    __m512 dot[G];
    for (int h = 0; h < G; ++h) dot[h] = _mm512_setzero_ps();
    for (int64_t c = 0; c < chunks; ++c) {
      const __mmask16 m = lanes(D - c * 16);
      const __m512 kc = load(k + c * 16, m);
      for (int h = 0; h < G; ++h) dot[h] = _mm512_fmadd_ps(load(q + h * D + c * 16, m), kc, dot[h]);
    }
    for (int h = 0; h < G; ++h) scores[h * L + j] = _mm512_reduce_add_ps(dot[h]);
  }
  float inverse[G];
  for (int h = 0; h < G; ++h) {  // scores -> weights e^(s - max) in place, 16 at a time from the list's start
    float* s = scores + h * L;
    __m512 peak = _mm512_set1_ps(-INFINITY);
    for (int64_t j = 0; j < L; j += 16) peak = _mm512_mask_max_ps(peak, lanes(L - j), peak, _mm512_maskz_loadu_ps(lanes(L - j), s + j));
    const __m512 top = _mm512_set1_ps(_mm512_reduce_max_ps(peak));
    __m512 total = _mm512_setzero_ps();
    for (int64_t j = 0; j < L; j += 16) {
      const __mmask16 m = lanes(L - j);
      const __m512 e = _mm512_maskz_mov_ps(m, exp_neg(_mm512_sub_ps(_mm512_maskz_loadu_ps(m, s + j), top)));
      _mm512_mask_storeu_ps(s + j, m, e);
      total = _mm512_add_ps(total, e);
    }
    inverse[h] = 1.0f / _mm512_reduce_add_ps(total);
  }
  // out_h = sum_j w_hj v_j / sum_j w_hj, key by key, over blocks of C chunks of D (G x C accumulators)
  constexpr int C = G <= 4 ? 4 : 2;
  for (int64_t c0 = 0; c0 < chunks; c0 += C) {
    __m512 acc[G][C];
    for (int h = 0; h < G; ++h)
      for (int c = 0; c < C; ++c) acc[h][c] = _mm512_setzero_ps();
    for (int64_t j = 0; j < L; ++j) {
      const T* v = value + keys[j] * D;
      __m512 vc[C];
      for (int c = 0; c < C; ++c) vc[c] = c0 + c < chunks ? load(v + (c0 + c) * 16, lanes(D - (c0 + c) * 16)) : _mm512_setzero_ps();
      for (int h = 0; h < G; ++h) {
        const __m512 w = _mm512_set1_ps(scores[h * L + j]);
        for (int c = 0; c < C; ++c) acc[h][c] = _mm512_fmadd_ps(w, vc[c], acc[h][c]);
      }
    }
    for (int h = 0; h < G; ++h)
      for (int c = 0; c < C && c0 + c < chunks; ++c)
        _mm512_mask_storeu_ps(out + h * D + (c0 + c) * 16, lanes(D - (c0 + c) * 16), _mm512_mul_ps(acc[h][c], _mm512_set1_ps(inverse[h])));
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
  TORCH_CHECK(key.dim() == 3 && key.is_contiguous() && value.is_contiguous() && key.sizes() == value.sizes() &&
                  key.scalar_type() == value.scalar_type() && key.size(2) == query.size(2) &&
                  (key.scalar_type() == at::kFloat || key.scalar_type() == at::kBFloat16),
              "key, value: contiguous float32 or bfloat16 [Hkv, K, D], alike");
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
        row_heads(G, q.data(), static_cast<const at::BFloat16*>(key_p) + g * K * D,
                  static_cast<const at::BFloat16*>(value_p) + g * K * D, keys.data(), L, D, scores.data(), o.data());
      else
        row_heads(G, q.data(), static_cast<const float*>(key_p) + g * K * D, static_cast<const float*>(value_p) + g * K * D,
                  keys.data(), L, D, scores.data(), o.data());
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

TORCH_LIBRARY(taps_rowwise, m) {
  m.def("attention(Tensor query, float scale, Tensor key, Tensor value, Tensor prefix, Tensor offsets, Tensor extra) -> Tensor");
}

TORCH_LIBRARY_IMPL(taps_rowwise, CPU, m) { m.impl("attention", &attention); }
