// One Llama-family decoder layer whose linear layers are all taps.vnni w4a8 products, in one call, over float32 or
// bfloat16 rows: taps.decoder's walk for a w4a8 target or grown drafter (taps.layer says why, what was measured and
// how its arithmetic relates to the walk's). Built at first use by torch.utils.cpp_extension; registers
// torch.ops.taps_layer.w4a8_layer. The products and the attention are taps' own ops (torch.ops.taps.w4a8_linear,
// torch.ops.taps_rowwise_*.attention), called through the dispatcher; the norms, the rotary embedding, the cache
// writes and the adapters are loops here, the rest ATen.
//
// x [T, H] -> the layer's output [T, H]; the layer's keys and values for its T rows are written into keys, values
// [kv_heads, capacity, d] at slots start .. start + T - 1, and each row attends the keys its lists (prefix,
// offsets, extra: taps.rowwise) name. Activated adapters (a grown drafter's masks, float32 rows only) add
// x[-n:] A B to the last n rows of a product (`adapt`).
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

namespace {

at::Tensor w4a8(const at::Tensor& x, const at::TensorList packed, int64_t group) {
  static const auto op = c10::Dispatcher::singleton()
                             .findSchemaOrThrow("taps::w4a8_linear", "")
                             .typed<at::Tensor(const at::Tensor&, const at::Tensor&, const at::Tensor&,
                                               const at::Tensor&, int64_t)>();
  return op.call(x, packed[0], packed[1], packed[2], group);
}

using AttentionFn = at::Tensor(const at::Tensor&, double, const at::Tensor&, const at::Tensor&, const at::Tensor&,
                               const at::Tensor&, const at::Tensor&);
using Attention = c10::TypedOperatorHandle<AttentionFn>;

// the row-wise kernel's op by its qualified name, looked up once per name (not once a layer)
const Attention& attention_op(c10::string_view name) {
  static std::mutex lock;
  static std::unordered_map<std::string, Attention> ops;
  std::lock_guard<std::mutex> guard(lock);
  const std::string key(name);
  auto found = ops.find(key);
  if (found == ops.end())
    found = ops.emplace(key, c10::Dispatcher::singleton().findSchemaOrThrow(key.c_str(), "").typed<AttentionFn>())
                .first;
  return found->second;
}

inline float load(float v) { return v; }
inline float load(at::BFloat16 v) { return static_cast<float>(v); }
template <typename T>
inline T store(float v) { return static_cast<T>(v); }  // bfloat16: round to nearest even, as .to() does

// transformers' RMSNorm: x / sqrt(mean(x^2) + eps) in float32, rounded to the rows' dtype, times the weight (in
// the rows' dtype), row by row
template <typename T>
at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps) {
  const int64_t rows = x.size(0), H = x.size(1);
  at::Tensor out = at::empty_like(x);
  const T* xp = x.data_ptr<T>();
  const T* w = weight.data_ptr<T>();
  T* op = out.data_ptr<T>();
  for (int64_t t = 0; t < rows; ++t) {
    const T* row = xp + t * H;
    float sum = 0.0f;
    for (int64_t h = 0; h < H; ++h) sum += load(row[h]) * load(row[h]);
    const float inv = 1.0f / std::sqrt(sum / static_cast<float>(H) + static_cast<float>(eps));
    for (int64_t h = 0; h < H; ++h) op[t * H + h] = store<T>(load(w[h]) * load(store<T>(load(row[h]) * inv)));
  }
  return out;
}

// rows [T, heads * d] (a strided slice of a product) rotated by cos, sin [T, d] into out (row t, head h at
// out + t * row_stride + h * head_stride): x * cos + rotate_half(x) * sin, rotate_half(x) = (-x2, x1), in float32
template <typename T>
void rotate(const at::Tensor& rows, int64_t heads, int64_t d, const at::Tensor& cos, const at::Tensor& sin, T* out,
            int64_t row_stride, int64_t head_stride) {
  const int64_t n = rows.size(0), in_stride = rows.stride(0), half = d / 2;
  const T* x = rows.data_ptr<T>();
  const T* c = cos.data_ptr<T>();
  const T* s = sin.data_ptr<T>();
  for (int64_t t = 0; t < n; ++t)
    for (int64_t h = 0; h < heads; ++h) {
      const T* xi = x + t * in_stride + h * d;
      T* o = out + t * row_stride + h * head_stride;
      const T* ct = c + t * d;
      const T* st = s + t * d;
      for (int64_t i = 0; i < half; ++i) o[i] = store<T>(load(xi[i]) * load(ct[i]) - load(xi[i + half]) * load(st[i]));
      for (int64_t i = half; i < d; ++i) o[i] = store<T>(load(xi[i]) * load(ct[i]) + load(xi[i - half]) * load(st[i]));
    }
}

// out's last n rows += x's last n rows A B (an activated adapter): A [in, r] float32 (empty: none); member m of a
// shared product reads columns spans[m][0] .. + spans[m][1] of x A and adds their product with its B [r_m, out_m]
// to out's columns spans[m][2] .. + spans[m][3]; B is stored from b + spans[m][4] in blocks of OUT_BLOCK columns,
// [out_m / OUT_BLOCK, r_m, OUT_BLOCK], the last padded with zeros (taps.layer.FusedLayer._adapter). Loops, not
// ATen's products: at 1-8 rows and rank 16 a product's call cost more than its arithmetic (taps.layer). Both
// passes run on every thread and read A and B once for all n rows: x A by chunks of IN_CHUNK inputs, the chunks'
// sums added in chunk order (the same bits whatever the number of threads); then each block of each row takes
// its r terms in rank order, held in registers, so out is read and written once.
constexpr int64_t IN_CHUNK = 128;
constexpr int64_t OUT_BLOCK = 64;  // 4 zmm of float32

void adapt(at::Tensor& out, const at::Tensor& x, const at::Tensor& a, const at::Tensor& spans, const at::Tensor& b,
           int64_t n) {
  if (n == 0 || a.numel() == 0) return;
  const int64_t first = x.size(0) - n, in = x.size(1), R = a.size(1), N = out.size(1);
  const float* A = a.data_ptr<float>();
  const float* X = x.data_ptr<float>() + first * in;
  const int64_t chunks = (in + IN_CHUNK - 1) / IN_CHUNK;
  std::vector<float> parts(chunks * n * R, 0.0f);  // [chunks, n, R]: each chunk's share of x A
  at::parallel_for(0, chunks, 1, [&](int64_t c0, int64_t c1) {
    for (int64_t c = c0; c < c1; ++c) {
      float* part = parts.data() + c * n * R;
      for (int64_t i = c * IN_CHUNK; i < std::min(in, (c + 1) * IN_CHUNK); ++i) {
        const float* Ai = A + i * R;
        for (int64_t t = 0; t < n; ++t) {
          const float xi = X[t * in + i];
          float* row = part + t * R;
          for (int64_t r = 0; r < R; ++r) row[r] += xi * Ai[r];
        }
      }
    }
  });
  std::vector<float> xa(parts.begin(), parts.begin() + n * R);  // [n, R]
  for (int64_t c = 1; c < chunks; ++c)
    for (int64_t k = 0; k < n * R; ++k) xa[k] += parts[c * n * R + k];

  const int64_t* span = spans.data_ptr<int64_t>();
  const float* B = b.data_ptr<float>();
  float* O = out.data_ptr<float>() + first * N;
  std::vector<int64_t> starts{0};  // member m's column blocks are blocks starts[m] .. starts[m + 1] - 1
  for (int64_t m = 0; m < spans.size(0); ++m)
    starts.push_back(starts.back() + (span[5 * m + 3] + OUT_BLOCK - 1) / OUT_BLOCK);
  at::parallel_for(0, starts.back(), 1, [&](int64_t k0, int64_t k1) {
    int64_t m = 0;
    for (int64_t k = k0; k < k1; ++k) {
      while (k >= starts[m + 1]) ++m;
      const int64_t* s = span + 5 * m;
      const int64_t j0 = (k - starts[m]) * OUT_BLOCK, width = std::min(OUT_BLOCK, s[3] - j0);
      const float* Bj = B + s[4] + j0 * s[1];  // [r_m, OUT_BLOCK]
      for (int64_t t = 0; t < n; ++t) {
        float* o = O + t * N + s[2] + j0;
        const float* c = xa.data() + t * R + s[0];
        if (width == OUT_BLOCK) {
          float acc[OUT_BLOCK];
          for (int64_t j = 0; j < OUT_BLOCK; ++j) acc[j] = o[j];
          for (int64_t r = 0; r < s[1]; ++r)
            for (int64_t j = 0; j < OUT_BLOCK; ++j) acc[j] += c[r] * Bj[r * OUT_BLOCK + j];
          for (int64_t j = 0; j < OUT_BLOCK; ++j) o[j] = acc[j];
        } else {
          for (int64_t r = 0; r < s[1]; ++r)
            for (int64_t j = 0; j < width; ++j) o[j] += c[r] * Bj[r * OUT_BLOCK + j];
        }
      }
    }
  });
}

at::Tensor w4a8_layer(const at::Tensor& x, const at::Tensor& input_norm, const at::Tensor& post_norm, double eps,
                      at::TensorList qkv, const at::Tensor& qkv_bias, at::TensorList o, at::TensorList gate_up,
                      at::TensorList down, int64_t group, at::TensorList adapters, int64_t n_adapted,
                      const at::Tensor& cos, const at::Tensor& sin, const at::Tensor& keys, const at::Tensor& values,
                      int64_t start, int64_t heads, double scaling, const at::Tensor& prefix,
                      const at::Tensor& offsets, const at::Tensor& extra, c10::string_view attention) {
  const auto dtype = x.scalar_type();
  TORCH_CHECK(x.dim() == 2 && x.is_contiguous() && (dtype == at::kFloat || dtype == at::kBFloat16),
              "x: contiguous float32 or bfloat16 [T, H]");
  for (const at::Tensor* t : {&input_norm, &post_norm, &cos, &sin, &keys, &values})
    TORCH_CHECK(t->scalar_type() == dtype && t->is_contiguous(),
                "norms, cos, sin, keys, values: contiguous, in x's dtype");
  TORCH_CHECK(adapters.size() == 12, "adapters: A, spans and B for qkv, o, gate_up, down");
  TORCH_CHECK(dtype == at::kFloat || n_adapted == 0, "adapters act on float32 rows");
  const int64_t rows = x.size(0), kv_heads = keys.size(0), d = keys.size(2), end = start + rows;
  TORCH_CHECK(end <= keys.size(1), "the cache has no room for the rows");
  TORCH_CHECK(cos.size(0) == rows && cos.size(1) == d && sin.sizes() == cos.sizes(), "cos, sin: [T, d]");
  // the layer in the rows' dtype T (float or at::BFloat16)
  auto walk = [&](auto zero) -> at::Tensor {
    using T = decltype(zero);

    // attention: q, k rotated, k and v into the cache, every row over its keys
    at::Tensor h = rms_norm<T>(x, input_norm, eps);
    at::Tensor qkv_out = w4a8(h, qkv, group);  // [T, (heads + 2 kv_heads) d]
    if (qkv_bias.numel()) qkv_out.add_(qkv_bias);
    adapt(qkv_out, h, adapters[0], adapters[1], adapters[2], n_adapted);
    const int64_t nq = heads * d, nk = kv_heads * d;
    at::Tensor q = at::empty({rows, heads, d}, x.options());
    rotate(qkv_out.narrow(1, 0, nq), heads, d, cos, sin, q.data_ptr<T>(), heads * d, d);
    const int64_t capacity = keys.size(1);
    T* kp = keys.data_ptr<T>() + start * d;
    rotate(qkv_out.narrow(1, nq, nk), kv_heads, d, cos, sin, kp, d, capacity * d);
    const T* v = qkv_out.data_ptr<T>() + nq + nk;
    T* vp = values.data_ptr<T>() + start * d;
    for (int64_t t = 0; t < rows; ++t)
      for (int64_t g = 0; g < kv_heads; ++g)
        std::copy(v + t * qkv_out.stride(0) + g * d, v + t * qkv_out.stride(0) + (g + 1) * d,
                  vp + t * d + g * capacity * d);
    at::Tensor out = attention_op(attention)
                         .call(q.transpose(0, 1), scaling, keys.narrow(1, 0, end), values.narrow(1, 0, end), prefix,
                               offsets, extra)
                         .reshape({rows, nq});  // [T, heads * d]
    at::Tensor o_out = w4a8(out, o, group);
    adapt(o_out, out, adapters[3], adapters[4], adapters[5], n_adapted);
    at::Tensor y = x + o_out;

    // the gated MLP
    at::Tensor h2 = rms_norm<T>(y, post_norm, eps);
    at::Tensor gu = w4a8(h2, gate_up, group);  // [T, 2 I]
    adapt(gu, h2, adapters[6], adapters[7], adapters[8], n_adapted);
    const int64_t I = gu.size(1) / 2;
    at::Tensor act = at::silu(gu.narrow(1, 0, I)).mul_(gu.narrow(1, I, I));  // [T, I]
    at::Tensor down_out = w4a8(act, down, group);
    adapt(down_out, act, adapters[9], adapters[10], adapters[11], n_adapted);
    return y.add_(down_out);
  };
  return dtype == at::kFloat ? walk(0.0f) : walk(at::BFloat16(0.0f));
}

}  // namespace

TORCH_LIBRARY(taps_layer, m) {
  m.def("w4a8_layer(Tensor x, Tensor input_norm, Tensor post_norm, float eps, Tensor[] qkv, Tensor qkv_bias, "
        "Tensor[] o, Tensor[] gate_up, Tensor[] down, int group, Tensor[] adapters, int n_adapted, Tensor cos, "
        "Tensor sin, Tensor keys, Tensor values, int start, int heads, float scaling, Tensor prefix, Tensor offsets, "
        "Tensor extra, str attention) -> Tensor");
}

TORCH_LIBRARY_IMPL(taps_layer, CPU, m) { m.impl("w4a8_layer", &w4a8_layer); }
