// Paged attention for the CPU, float32, straight out of the paged K/V cache with no
// gathered copy: decodes (one query token per sequence, below) and, over a float32 cache,
// prefill chunks (paged_prefill_attention: every chunk of a step in one call, about twice
// SDPA's speed per chunk; see "Prefill chunks"). For decodes the cache
// may also be bfloat16 (kv_cache_dtype="bfloat16": half the bytes a step reads); its rows
// widen exactly to float32 as they are read, and write_kv rounds new rows to nearest even.
//
// The torch path (kernels/torch_paged.py) gathers every decode's blocks into a
// contiguous [D, L, kvh, hd] copy per layer and calls SDPA on it; at 64 sequences that
// gather and SDPA's per-(sequence, head) setup cost about as much as all the step's
// GEMMs but the largest (bench/RESULTS.md, "batch-64 profile"). Here every (sequence,
// kv head) pair is one task: the G = heads / kv_heads query heads that share the kv
// head are scored against each key row as it is read from its block, then softmaxed,
// then the value rows are accumulated with the weights (attend_group; a head_dim
// and G without a grouped instance take one task per query head). A step's caches come
// from memory, not from cache: a sequence's first kv head's task prefetches, a block
// ahead, the whole token rows (every kv head's K, then V) into L2, where the sequence's
// other kv heads' tasks, next on the same thread, find them. In the engine this took
// the decode attention of a float32 16-sequence step from ~11.8 to ~9.9 ms and of a bf16
// 64-sequence step from ~41 to ~30 ms (bench/RESULTS.md, session 23). Semantics are
// kernels/reference.py's paged_attention_ref for q_len == 1; the summation order
// differs (as SDPA's does), so results agree to float32 rounding.
//
// Built at first use by kernels/cpu_build.py (torch.utils.cpp_extension, -O3
// -march=native). attend_group is written once over the build's vectors: 16 floats with
// AVX-512F, 8 with AVX2 (there, with 16 registers, SmolLM2's head_dim 64 takes a task per
// query head: 8 accumulators); head_dims that are no whole number of vectors, and CPUs
// with neither, take a portable scalar loop. On a 2-core AMD EPYC (AVX2; session 24) the
// vectors took a 16-sequence, 260-token decode's 30 layers from 42.8 ms (the scalar loop)
// to 10.7 ms (192 MB of float32 K/V: 18 GB/s).

#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "cpu_bf16.h"

namespace {

using namespace kvscope_bf16;

// Calls fn(slot, position, ahead) for the L token slots of one sequence, block by block
// (slot = block * bs + offset, in units of one token row); ahead is the slot a block
// later, -1 past the context (what a kernel may prefetch).
template <typename Fn>
inline void for_each_slot(const int32_t* table, int64_t L, int64_t bs, Fn&& fn) {
  for (int64_t b = 0, p = 0; p < L; ++b) {
    const int64_t base = static_cast<int64_t>(table[b]) * bs;
    const int64_t next = (b + 1) * bs < L ? static_cast<int64_t>(table[b + 1]) * bs : -1;
    for (int64_t off = 0; off < bs && p < L; ++off, ++p) fn(base + off, p, next < 0 || p + bs >= L ? -1 : next + off);
  }
}

// A grouped kernel (attend_group below, where the CPU has AVX-512 or AVX2).
template <typename TC>
using GroupFn = void (*)(const float*, const TC*, const TC*, int64_t, const int32_t*, int64_t, int64_t, float, float*,
                         float*, const TC*, const TC*);

#ifdef KVSCOPE_VEC
constexpr int W = Vec::W;

// Into L2, the whole token row (every kv head's K or V) of ``slot``: its later kv heads'
// tasks, which run next on this thread, find it there.
template <typename TC>
inline void prefetch_row(const TC* cache, int64_t slot, int64_t row_stride) {
  const char* r = reinterpret_cast<const char*>(cache + slot * row_stride);
  for (int64_t b = 0; b < row_stride * static_cast<int64_t>(sizeof(TC)); b += 64) _mm_prefetch(r + b, _MM_HINT_T1);
}

template <int NV, int G, typename TC>
void attend_group(const float* q, const TC* kc, const TC* vc, int64_t row_stride, const int32_t* table,
                  int64_t L, int64_t bs, float scale, float* scores, float* out, const TC* kc0, const TC* vc0) {
  using V = typename Vec::T;
  V qv[G][NV];
  for (int g = 0; g < G; ++g)
    for (int i = 0; i < NV; ++i) qv[g][i] = Vec::load(q + g * W * NV + W * i);
  float mx[G];
  for (int g = 0; g < G; ++g) mx[g] = -std::numeric_limits<float>::infinity();
  for_each_slot(table, L, bs, [&](int64_t slot, int64_t p, int64_t ahead) {
    if (kc0 && ahead >= 0) prefetch_row(kc0, ahead, row_stride);
    const TC* k = kc + slot * row_stride;
    V kv[NV];
    for (int i = 0; i < NV; ++i) kv[i] = Vec::load(k + W * i);
    for (int g = 0; g < G; ++g) {
      V a = Vec::mul(qv[g][0], kv[0]);
      V b = NV > 1 ? Vec::mul(qv[g][1], kv[1]) : Vec::zero();
      for (int i = 2; i < NV; i += 2) {
        a = Vec::fma(qv[g][i], kv[i], a);
        if (i + 1 < NV) b = Vec::fma(qv[g][i + 1], kv[i + 1], b);
      }
      const float sc = Vec::sum(Vec::add(a, b)) * scale;
      scores[g * L + p] = sc;
      mx[g] = std::max(mx[g], sc);
    }
  });
  float inv[G];
  for (int g = 0; g < G; ++g) {
    float* sg = scores + g * L;
    const V mxv = Vec::set1(mx[g]);
    V sumv = Vec::zero();
    int64_t p = 0;
    for (; p + W <= L; p += W) {
      V e = Vec::exp(Vec::sub(Vec::load(sg + p), mxv));
      Vec::store(sg + p, e);
      sumv = Vec::add(sumv, e);
    }
    if (p < L) {
      V e = Vec::exp(Vec::sub(Vec::load_first(sg + p, L - p), mxv));
      Vec::store_first(sg + p, L - p, e);
      sumv = Vec::add(sumv, Vec::keep_first(e, L - p));
    }
    inv[g] = 1.f / Vec::sum(sumv);
  }
  V acc[G][NV];
  for (int g = 0; g < G; ++g)
    for (int i = 0; i < NV; ++i) acc[g][i] = Vec::zero();
  for_each_slot(table, L, bs, [&](int64_t slot, int64_t p, int64_t ahead) {
    if (vc0 && ahead >= 0) prefetch_row(vc0, ahead, row_stride);
    const TC* v = vc + slot * row_stride;
    V vv[NV];
    for (int i = 0; i < NV; ++i) vv[i] = Vec::load(v + W * i);
    for (int g = 0; g < G; ++g) {
      const V w = Vec::set1(scores[g * L + p]);
      for (int i = 0; i < NV; ++i) acc[g][i] = Vec::fma(w, vv[i], acc[g][i]);
    }
  });
  for (int g = 0; g < G; ++g) {
    const V invv = Vec::set1(inv[g]);
    for (int i = 0; i < NV; ++i) Vec::store(out + g * W * NV + W * i, Vec::mul(acc[g][i], invv));
  }
}

// attend_group for this (head_dim, G), if there is one: NV = head_dim / W vectors up to 8
// and G up to 4 with G * NV <= Vec::kAccumulators, so they stay in registers; null
// otherwise (G = 1 exists for every such head_dim).
template <int NV, typename TC>
GroupFn<TC> group_kernel_nv(int64_t G) {
  constexpr int A = Vec::kAccumulators;
  switch (G) {
    case 1: return attend_group<NV, 1, TC>;
    case 2: if constexpr (2 * NV <= A) return attend_group<NV, 2, TC>; else return nullptr;
    case 3: if constexpr (3 * NV <= A) return attend_group<NV, 3, TC>; else return nullptr;
    case 4: if constexpr (4 * NV <= A) return attend_group<NV, 4, TC>; else return nullptr;
    default: return nullptr;
  }
}
template <typename TC>
GroupFn<TC> group_kernel(int64_t hd, int64_t G) {
  switch (hd / W * (hd % W == 0)) {  // head_dim in vectors (0: not a whole number of them)
    case 1: return group_kernel_nv<1, TC>(G);
    case 2: return group_kernel_nv<2, TC>(G);
    case 4: return group_kernel_nv<4, TC>(G);
    case 8: return group_kernel_nv<8, TC>(G);
    default: return nullptr;
  }
}
// ---- Prefill chunks: q_len query rows of one sequence, causal over its context ----
// Query row i of a chunk of q_len rows over a context of L tokens sits at position
// L - q_len + i and sees keys 0 .. L - q_len + i (the rows before it are a cached prefix or
// earlier chunks). A task is kPrefillRows query rows of one chunk with the G query heads of
// one kv head: M = rows * G query vectors. Scores are GEMM-shaped: the kv head's keys are
// transposed once per chunk (kt[d][p], shared by all its tasks), so kScoreRows query
// vectors times kKeyVecs vectors of keys are kept in registers and each step over head_dim
// is a broadcast of a query element and an FMA, with no horizontal sums; scores past a row's
// last key are never computed (whole key blocks) or are zeroed. Then each vector's softmax,
// then the value rows, read from their blocks, accumulated kPvRows vectors at a time.
constexpr int kKeyVecs = 2;
constexpr int64_t kKeyBlock = kKeyVecs * W;                    // keys a score pass takes: 32 or 16
constexpr int kScoreRows = Vec::kAccumulators / kKeyVecs;      // query vectors it holds: 8 or 4
constexpr int64_t kPrefillRows = 16;                           // query rows a task

inline int64_t key_span(int64_t L) { return (L + kKeyBlock - 1) / kKeyBlock * kKeyBlock; }

// kt[d * lp + p] = K[p][d] of one kv head (kc: its first element) for p < L, zeros up to lp
void transpose_keys(const float* kc, int64_t row_stride, const int32_t* table, int64_t L, int64_t bs, int64_t hd,
                    int64_t lp, float* kt) {
  for_each_slot(table, L, bs, [&](int64_t slot, int64_t p, int64_t) {
    const float* k = kc + slot * row_stride;
    for (int64_t d = 0; d < hd; ++d) kt[d * lp + p] = k[d];
  });
  for (int64_t d = 0; d < hd; ++d) std::fill(kt + d * lp + L, kt + (d + 1) * lp, 0.f);
}

// Rows [r0, r1) of a chunk whose row 0 sits at position p0, G heads each: q / out point at
// the chunk's row 0, this kv head's first query head (q_row / o_row between rows); kt its
// transposed keys (lp per head_dim element), vc its values (token rows row_stride apart).
// s: scratch of (r1 - r0) * G * lp floats.
template <int NV>
void prefill_task(const float* q, int64_t q_row, int64_t G, int64_t r0, int64_t r1, int64_t p0, const float* kt,
                  int64_t lp, const float* vc, int64_t row_stride, const int32_t* table, int64_t bs, float scale,
                  float* s, float* out, int64_t o_row) {
  using V = typename Vec::T;
  constexpr int hd = NV * W;
  constexpr int kPvRows = Vec::kAccumulators / NV > 0 ? Vec::kAccumulators / NV : 1;
  const int64_t M = (r1 - r0) * G;
  auto q_of = [&](int64_t m) { return q + (r0 + m / G) * q_row + (m % G) * hd; };
  auto seen = [&](int64_t m) { return p0 + r0 + m / G + 1; };  // keys vector m attends to
  const int64_t n_all = seen(M - 1);
  for (int64_t m0 = 0; m0 < M; m0 += kScoreRows) {
    const int64_t mr = std::min<int64_t>(kScoreRows, M - m0);
    const float* qp[kScoreRows];
    for (int i = 0; i < kScoreRows; ++i) qp[i] = q_of(m0 + std::min<int64_t>(i, mr - 1));
    const int64_t n = seen(m0 + mr - 1);
    for (int64_t kb = 0; kb < n; kb += kKeyBlock) {
      V acc[kScoreRows][kKeyVecs];
      for (int i = 0; i < kScoreRows; ++i)
        for (int j = 0; j < kKeyVecs; ++j) acc[i][j] = Vec::zero();
      for (int d = 0; d < hd; ++d) {
        V kv[kKeyVecs];
        for (int j = 0; j < kKeyVecs; ++j) kv[j] = Vec::load(kt + d * lp + kb + j * W);
        for (int i = 0; i < kScoreRows; ++i) {
          const V b = Vec::set1(qp[i][d]);
          for (int j = 0; j < kKeyVecs; ++j) acc[i][j] = Vec::fma(b, kv[j], acc[i][j]);
        }
      }
      const V sc = Vec::set1(scale);
      for (int i = 0; i < kScoreRows && i < mr; ++i)
        for (int j = 0; j < kKeyVecs; ++j) Vec::store(s + (m0 + i) * lp + kb + j * W, Vec::mul(acc[i][j], sc));
    }
  }
  std::vector<float> inv(static_cast<size_t>(M));
  for (int64_t m = 0; m < M; ++m) {
    float* sm = s + m * lp;
    const int64_t n = seen(m);
    V mxv = Vec::set1(-std::numeric_limits<float>::infinity());
    int64_t p = 0;
    for (; p + W <= n; p += W) mxv = Vec::max(mxv, Vec::load(sm + p));
    float mx = Vec::reduce_max(mxv);
    for (; p < n; ++p) mx = std::max(mx, sm[p]);
    mxv = Vec::set1(mx);
    V sumv = Vec::zero();
    p = 0;
    for (; p + W <= n; p += W) {
      const V e = Vec::exp(Vec::sub(Vec::load(sm + p), mxv));
      Vec::store(sm + p, e);
      sumv = Vec::add(sumv, e);
    }
    if (p < n) {
      const V e = Vec::exp(Vec::sub(Vec::load_first(sm + p, n - p), mxv));
      Vec::store_first(sm + p, n - p, e);
      sumv = Vec::add(sumv, Vec::keep_first(e, n - p));
    }
    std::fill(sm + n, sm + n_all, 0.f);  // keys that a later vector of its pass sees
    inv[m] = 1.f / Vec::sum(sumv);
  }
  for (int64_t m0 = 0; m0 < M; m0 += kPvRows) {
    const int64_t mr = std::min<int64_t>(kPvRows, M - m0);
    const float* sp[kPvRows];
    for (int i = 0; i < kPvRows; ++i) sp[i] = s + (m0 + std::min<int64_t>(i, mr - 1)) * lp;
    V acc[kPvRows][NV];
    for (int i = 0; i < kPvRows; ++i)
      for (int j = 0; j < NV; ++j) acc[i][j] = Vec::zero();
    const int64_t n = seen(m0 + mr - 1);
    // one flat loop over the keys (a loop per block made GCC store acc every key)
    const int32_t* blk = table;
    const float* v = vc + static_cast<int64_t>(*blk) * bs * row_stride;
    for (int64_t p = 0, off = 0; p < n; ++p, ++off, v += row_stride) {
      if (off == bs) {
        v = vc + static_cast<int64_t>(*++blk) * bs * row_stride;
        off = 0;
      }
      V vv[NV];
      for (int j = 0; j < NV; ++j) vv[j] = Vec::load(v + j * W);
      for (int i = 0; i < kPvRows; ++i) {
        const V w = Vec::set1(sp[i][p]);
        for (int j = 0; j < NV; ++j) acc[i][j] = Vec::fma(w, vv[j], acc[i][j]);
      }
    }
    for (int i = 0; i < kPvRows; ++i) {  // constant bounds with a test: acc[i] stays in registers
      if (i >= mr) break;
      const int64_t m = m0 + i;
      float* o = out + (r0 + m / G) * o_row + (m % G) * hd;
      const V iv = Vec::set1(inv[m]);
      for (int j = 0; j < NV; ++j) Vec::store(o + j * W, Vec::mul(acc[i][j], iv));
    }
  }
}

using PrefillFn = decltype(&prefill_task<1>);
PrefillFn prefill_kernel(int64_t hd) {
  switch (hd / W * (hd % W == 0)) {
    case 1: return prefill_task<1>;
    case 2: return prefill_task<2>;
    case 4: return prefill_task<4>;
    case 8: return prefill_task<8>;
    default: return nullptr;
  }
}
#endif

// The same for any head_dim and CPU, in plain loops.
template <typename TC>
void attend_head_scalar(const float* q, const TC* kc, const TC* vc, int64_t row_stride,
                        const int32_t* table, int64_t L, int64_t bs, int64_t hd, float scale,
                        float* scores, float* out) {
  float mx = -std::numeric_limits<float>::infinity();
  for_each_slot(table, L, bs, [&](int64_t slot, int64_t p, int64_t) {
    const TC* k = kc + slot * row_stride;
    float total = 0.f;
    for (int64_t i = 0; i < hd; ++i) total += q[i] * widen(k[i]);
    scores[p] = total * scale;
    mx = std::max(mx, scores[p]);
  });
  float sum = 0.f;
  for (int64_t p = 0; p < L; ++p) sum += (scores[p] = std::exp(scores[p] - mx));
  const float inv = 1.f / sum;
  std::fill(out, out + hd, 0.f);
  for_each_slot(table, L, bs, [&](int64_t slot, int64_t p, int64_t) {
    const TC* v = vc + slot * row_stride;
    for (int64_t i = 0; i < hd; ++i) out[i] += scores[p] * widen(v[i]);
  });
  for (int64_t i = 0; i < hd; ++i) out[i] *= inv;
}

}  // namespace

void check_caches(const at::Tensor& key_cache, const at::Tensor& value_cache) {
  const auto dt = key_cache.scalar_type();
  TORCH_CHECK(key_cache.dim() == 4 && (dt == at::kFloat || dt == at::kBFloat16) && key_cache.is_contiguous() &&
                  value_cache.sizes() == key_cache.sizes() && value_cache.scalar_type() == dt &&
                  value_cache.is_contiguous() && key_cache.device().is_cpu() && value_cache.device().is_cpu(),
              "key_cache and value_cache must be contiguous CPU float32 or bfloat16 (both the same) "
              "[num_blocks, block_size, kv_heads, head_dim]");
}

// query [T, heads, head_dim] and out shaped like it: float32 CPU, each row's heads contiguous
// (any row stride: the model's q is a view of the fused QKV output).
void check_rows(const at::Tensor& query, const at::Tensor& out) {
  TORCH_CHECK(query.dim() == 3 && query.scalar_type() == at::kFloat && query.stride(2) == 1 &&
                  query.stride(1) == query.size(2) && query.device().is_cpu(),
              "query must be float32 CPU [T, heads, head_dim] with contiguous heads (any row stride)");
  TORCH_CHECK(out.sizes() == query.sizes() && out.scalar_type() == at::kFloat && out.stride(2) == 1 &&
                  out.stride(1) == out.size(2) && out.device().is_cpu(),
              "out must be float32 shaped like query, with contiguous heads");
}

// Sequence ``i``'s first blocks covering ``len`` tokens are blocks of a cache of NB.
void check_blocks(const int32_t* table, int64_t i, int64_t len, int64_t bs, int64_t NB) {
  for (int64_t b = 0; b < (len + bs - 1) / bs; ++b)
    TORCH_CHECK(table[b] >= 0 && table[b] < NB, "block_tables[", i, ", ", b, "] is not a block of the cache");
}

// The decodes' (sequence, head) tasks over a cache of TC (float or bf16).
template <typename TC>
void decode_loop(const at::Tensor& query, const TC* kc, const TC* vc, const int64_t* row, const int32_t* tables,
                 const int32_t* lens, int64_t positions, int64_t D, int64_t max_blocks, int64_t bs, int64_t kvh,
                 double scale, at::Tensor& out) {
  const int64_t H = query.size(1), hd = query.size(2), G = H / kvh;
  const float* q = query.data_ptr<float>();
  float* o = out.data_ptr<float>();
  const float sc = static_cast<float>(scale);
  const int64_t row_stride = kvh * hd;  // between token slots of one block
  const int64_t q_row = query.stride(0), o_row = out.stride(0);
  // One task per (sequence, kv head): its G query heads together (heads h*G..h*G+G-1
  // share kv head h), or one task per query head where no kernel takes G heads at once
  // (g = 1). A sequence's tasks run one after another on one thread when the split allows,
  // so its first task's prefetch of the token rows serves the others.
  // At least kMinTaskPositions (head, position) pairs a task (~25 us of work): a batch-1
  // decode's few heads stay on the calling thread instead of paying for an OpenMP region
  // (whose barrier waits out a partner thread that another process has descheduled).
  constexpr int64_t kMinTaskPositions = 1 << 13;
  GroupFn<TC> fn = nullptr;
  int64_t g = G;
#ifdef KVSCOPE_VEC
  fn = group_kernel<TC>(hd, G);
  if (fn == nullptr && (fn = group_kernel<TC>(hd, 1)) != nullptr) g = 1;
#endif
  if (fn == nullptr) g = 1;  // the scalar loop, a head a task
  const int64_t per_seq = H / g;
  const int64_t grain = std::max<int64_t>(1, kMinTaskPositions * D / std::max<int64_t>(1, positions * g));
  at::parallel_for(0, D * per_seq, grain, [&](int64_t t0, int64_t t1) {
    std::vector<float> scores;
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t d = t / per_seq, h0 = (t % per_seq) * g, L = lens[d];
      scores.resize(static_cast<size_t>(g * L));
      const float* qh = q + row[d] * q_row + h0 * hd;
      float* oh = o + row[d] * o_row + h0 * hd;
      const TC* kh = kc + (h0 / G) * hd;  // these heads' kv head in every token row
      const TC* vh = vc + (h0 / G) * hd;
      const int32_t* table = tables + d * max_blocks;
      if (fn != nullptr) {
        const bool first = h0 == 0;  // prefetches every kv head's rows for the tasks after it
        fn(qh, kh, vh, row_stride, table, L, bs, sc, scores.data(), oh, first ? kc : nullptr, first ? vc : nullptr);
      } else {
        attend_head_scalar(qh, kh, vh, row_stride, table, L, bs, hd, sc, scores.data(), oh);
      }
    }
  });
}

// query [T, H, hd] f32; key_cache / value_cache [NB, bs, kvh, hd] f32 or bf16; rows int64 [D]
// (query row of each decode); block_tables int32 [D, max_blocks]; seq_lens int32 [D]
// (context length including the new token); out [T, H, hd] f32, rows written in place.
void paged_decode_attention(const at::Tensor& query, const at::Tensor& key_cache,
                            const at::Tensor& value_cache, const at::Tensor& rows,
                            const at::Tensor& block_tables, const at::Tensor& seq_lens, double scale,
                            at::Tensor& out) {
  check_rows(query, out);
  check_caches(key_cache, value_cache);
  TORCH_CHECK(rows.dim() == 1 && rows.scalar_type() == at::kLong, "rows must be int64 [D]");
  TORCH_CHECK(block_tables.dim() == 2 && block_tables.scalar_type() == at::kInt && block_tables.is_contiguous() &&
                  block_tables.size(0) == rows.size(0),
              "block_tables must be contiguous int32 [D, max_blocks]");
  TORCH_CHECK(seq_lens.dim() == 1 && seq_lens.scalar_type() == at::kInt && seq_lens.size(0) == rows.size(0),
              "seq_lens must be int32 [D]");
  const int64_t T = query.size(0), H = query.size(1), hd = query.size(2);
  const int64_t NB = key_cache.size(0), bs = key_cache.size(1), kvh = key_cache.size(2);
  TORCH_CHECK(key_cache.size(3) == hd, "head_dim of query and cache differ");
  TORCH_CHECK(H % kvh == 0, "heads must be a multiple of kv_heads");
  const int64_t D = rows.size(0), max_blocks = block_tables.size(1);
  const int64_t* row = rows.data_ptr<int64_t>();
  const int32_t* tables = block_tables.data_ptr<int32_t>();
  const int32_t* lens = seq_lens.data_ptr<int32_t>();
  int64_t positions = 0;  // summed over the decodes: each of their H heads reads that many K/V rows
  for (int64_t d = 0; d < D; ++d) {  // every read below stays inside the tensors
    positions += lens[d];
    TORCH_CHECK(row[d] >= 0 && row[d] < T, "rows[", d, "] = ", row[d], " is not a query row");
    TORCH_CHECK(lens[d] >= 1 && lens[d] <= max_blocks * bs, "seq_lens[", d, "] = ", lens[d],
                " does not fit its block table");
    check_blocks(tables + d * max_blocks, d, lens[d], bs, NB);
  }
  if (key_cache.scalar_type() == at::kBFloat16)
    decode_loop(query, key_cache.data_ptr<at::BFloat16>(), value_cache.data_ptr<at::BFloat16>(), row, tables, lens,
                positions, D, max_blocks, bs, kvh, scale, out);
  else
    decode_loop(query, key_cache.data_ptr<float>(), value_cache.data_ptr<float>(), row, tables, lens, positions, D,
                max_blocks, bs, kvh, scale, out);
}

// Whether paged_prefill_attention has a vector path for this head_dim (else: none at all).
bool prefill_takes(int64_t head_dim) {
#ifdef KVSCOPE_VEC
  return prefill_kernel(head_dim) != nullptr;
#else
  (void)head_dim;
  return false;  // no vectors: the caller's SDPA path
#endif
}

// P prefill chunks: query [T, H, hd] f32; key_cache / value_cache [NB, bs, kvh, hd] f32;
// q_starts int64 [P] (each chunk's first query row), q_lens int32 [P] (>= 1),
// block_tables int32 [P, max_blocks], seq_lens int32 [P] (context length, the chunk
// included); out [T, H, hd] f32, the chunks' rows written in place.
void paged_prefill_attention(const at::Tensor& query, const at::Tensor& key_cache, const at::Tensor& value_cache,
                             const at::Tensor& q_starts, const at::Tensor& q_lens, const at::Tensor& block_tables,
                             const at::Tensor& seq_lens, double scale, at::Tensor& out) {
  check_rows(query, out);
  check_caches(key_cache, value_cache);
  TORCH_CHECK(key_cache.scalar_type() == at::kFloat, "the prefill kernel takes float32 caches");
  const int64_t P = q_starts.size(0);
  TORCH_CHECK(q_starts.dim() == 1 && q_starts.scalar_type() == at::kLong && q_starts.is_contiguous(),
              "q_starts must be contiguous int64 [P]");
  for (const at::Tensor* t : {&q_lens, &seq_lens})
    TORCH_CHECK(t->dim() == 1 && t->size(0) == P && t->scalar_type() == at::kInt && t->is_contiguous(),
                "q_lens and seq_lens must be contiguous int32 [P]");
  TORCH_CHECK(block_tables.dim() == 2 && block_tables.size(0) == P && block_tables.scalar_type() == at::kInt &&
                  block_tables.is_contiguous(),
              "block_tables must be contiguous int32 [P, max_blocks]");
  const int64_t T = query.size(0), H = query.size(1), hd = query.size(2);
  const int64_t NB = key_cache.size(0), bs = key_cache.size(1), kvh = key_cache.size(2);
  TORCH_CHECK(key_cache.size(3) == hd && H % kvh == 0, "head_dim of query and cache differ, or heads % kv_heads");
  const int64_t max_blocks = block_tables.size(1);
  const int64_t* q0 = q_starts.data_ptr<int64_t>();
  const int32_t* ql = q_lens.data_ptr<int32_t>();
  const int32_t* lens = seq_lens.data_ptr<int32_t>();
  const int32_t* tables = block_tables.data_ptr<int32_t>();
  for (int64_t c = 0; c < P; ++c) {  // every read below stays inside the tensors
    TORCH_CHECK(ql[c] >= 1 && q0[c] >= 0 && q0[c] + ql[c] <= T, "chunk ", c, "'s rows are not rows of query");
    TORCH_CHECK(lens[c] >= ql[c] && lens[c] <= max_blocks * bs, "seq_lens[", c, "] = ", lens[c],
                " is shorter than its chunk or does not fit its block table");
    check_blocks(tables + c * max_blocks, c, lens[c], bs, NB);
  }
#ifdef KVSCOPE_VEC
  const PrefillFn fn = prefill_kernel(hd);
  TORCH_CHECK(fn != nullptr, "no prefill kernel for head_dim ", hd, " (prefill_takes)");
  const int64_t G = H / kvh, row_stride = kvh * hd;
  const float* kc = key_cache.data_ptr<float>();
  const float* vc = value_cache.data_ptr<float>();
  // every (chunk, kv head)'s transposed keys, one after another
  std::vector<int64_t> kt_at(P + 1, 0);
  for (int64_t c = 0; c < P; ++c) kt_at[c + 1] = kt_at[c] + kvh * hd * key_span(lens[c]);
  std::vector<float> kt(static_cast<size_t>(kt_at[P]));
  at::parallel_for(0, P * kvh, 1, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t c = t / kvh, h = t % kvh, lp = key_span(lens[c]);
      transpose_keys(kc + h * hd, row_stride, tables + c * max_blocks, lens[c], bs, hd, lp,
                     kt.data() + kt_at[c] + h * hd * lp);
    }
  });
  struct Task { int64_t c, h, r0, r1; };
  std::vector<Task> tasks;
  for (int64_t c = 0; c < P; ++c)
    for (int64_t r = 0; r < ql[c]; r += kPrefillRows)
      for (int64_t h = 0; h < kvh; ++h) tasks.push_back({c, h, r, std::min<int64_t>(ql[c], r + kPrefillRows)});
  // A chunk's later rows see more keys: the order 0, n-1, 1, n-2, ... gives each thread's
  // contiguous share of the tasks about the same work.
  const int64_t n = static_cast<int64_t>(tasks.size());
  const float* q = query.data_ptr<float>();
  float* o = out.data_ptr<float>();
  const float sc = static_cast<float>(scale);
  at::parallel_for(0, n, 1, [&](int64_t t0, int64_t t1) {
    std::vector<float> s;
    for (int64_t t = t0; t < t1; ++t) {
      const Task& k = tasks[t % 2 == 0 ? t / 2 : n - 1 - t / 2];
      const int64_t L = lens[k.c], lp = key_span(L);
      s.resize(static_cast<size_t>((k.r1 - k.r0) * G * lp));
      fn(q + q0[k.c] * query.stride(0) + k.h * G * hd, query.stride(0), G, k.r0, k.r1, L - ql[k.c],
         kt.data() + kt_at[k.c] + k.h * hd * lp, lp, vc + k.h * hd, row_stride, tables + k.c * max_blocks, bs, sc,
         s.data(), o + q0[k.c] * out.stride(0) + k.h * G * hd, out.stride(0));
    }
  });
#else
  TORCH_CHECK(false, "this build has no prefill kernel (prefill_takes)");
#endif
}

// The step's new K/V rows into their cache slots: key / value [T, kv_heads, head_dim] (each
// token's heads contiguous, any row stride: views of the fused QKV output), slots int64 [T],
// all valid. What two index_copy_ calls did (a plain copy, so bitwise the same), without
// their ~30 us of dispatch each per layer at 64 rows.
void write_kv(const at::Tensor& key, const at::Tensor& value, at::Tensor& key_cache, at::Tensor& value_cache,
              const at::Tensor& slots) {
  check_caches(key_cache, value_cache);
  const int64_t n_slots = key_cache.size(0) * key_cache.size(1), kvh = key_cache.size(2), hd = key_cache.size(3);
  TORCH_CHECK(slots.dim() == 1 && slots.scalar_type() == at::kLong && slots.is_contiguous() && slots.device().is_cpu(),
              "slots must be contiguous int64 [T]");
  const int64_t T = slots.size(0);
  for (const at::Tensor* t : {&key, &value})
    TORCH_CHECK(t->dim() == 3 && t->size(0) == T && t->size(1) == kvh && t->size(2) == hd &&
                    t->scalar_type() == at::kFloat && t->device().is_cpu() && t->stride(2) == 1 && t->stride(1) == hd,
                "key and value must be float32 CPU [T, kv_heads, head_dim] with contiguous heads");
  const int64_t* s = slots.data_ptr<int64_t>();
  for (int64_t t = 0; t < T; ++t)
    TORCH_CHECK(s[t] >= 0 && s[t] < n_slots, "slot ", s[t], " of token ", t, " is not a slot of the cache");
  const int64_t row = kvh * hd;
  const float* k = key.data_ptr<float>();
  const float* v = value.data_ptr<float>();
  const int64_t lk = key.stride(0), lv = value.stride(0);
  if (key_cache.scalar_type() == at::kBFloat16) {  // rounded to nearest even, as torch's .to(bfloat16)
    bf16* kc = reinterpret_cast<bf16*>(key_cache.data_ptr());
    bf16* vc = reinterpret_cast<bf16*>(value_cache.data_ptr());
    for (int64_t t = 0; t < T; ++t) {
      int64_t i = 0;
#if defined(__AVX512F__)
      for (; i + 16 <= row; i += 16) {
        store16(kc + s[t] * row + i, _mm512_loadu_ps(k + t * lk + i));
        store16(vc + s[t] * row + i, _mm512_loadu_ps(v + t * lv + i));
      }
#endif
      for (; i < row; ++i) {
        kc[s[t] * row + i] = bf16(k[t * lk + i]);
        vc[s[t] * row + i] = bf16(v[t * lv + i]);
      }
    }
    return;
  }
  float* kc = key_cache.data_ptr<float>();
  float* vc = value_cache.data_ptr<float>();
  for (int64_t t = 0; t < T; ++t) {
    std::memcpy(kc + s[t] * row, k + t * lk, sizeof(float) * row);
    std::memcpy(vc + s[t] * row, v + t * lv, sizeof(float) * row);
  }
}

// Every kernel runs without the GIL (the guard releases it once the arguments are
// converted): a server's event loop and recorder threads run while the engine
// thread is in here, as they do while it is inside any torch op.
PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("write_kv", &write_kv, "key / value [T, kv_heads, head_dim] into their slots of the paged caches",
        py::call_guard<py::gil_scoped_release>());
  m.def("paged_decode_attention", &paged_decode_attention,
        "one query token per sequence attends over its paged K/V context (float32 or bf16 cache), into out's rows",
        py::call_guard<py::gil_scoped_release>());
  m.def("prefill_takes", &prefill_takes, "whether paged_prefill_attention has a path for this head_dim");
  m.def("paged_prefill_attention", &paged_prefill_attention,
        "prefill chunks (q_len >= 1 rows each) attend causally over their paged float32 K/V contexts, into out's rows",
        py::call_guard<py::gil_scoped_release>());
}
