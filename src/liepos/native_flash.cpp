// The causal attention of a fading encoding in one native kernel: liepos_native::recentred_flash, built with
// native_kernels.cpp into one library (liepos._kernels) and called by liepos.recentred_kernel.
//
//   recentred_flash(qe, ke, v, corr, partner, block, qd=None, kd=None, kx=None) -> (out, lse)
//
// qe (B, H, T, D) and ke (B, Hk, T, D) are q and k encoded at an origin of their block of `block` rows,
// F(t − o_i) q and G(s − p_j) k, so that every factor lies within the diagonal budget. The score of query t of
// block i and key s of block j ≤ i is
//
//   c·qᵀ A(t − s) k = c·(F(t − o_i) q)ᵀ A(o_i − p_j) (G(s − p_j) k),
//
// and the kernel forms it as the lag's correction of the query rows (in registers, per pair of query block and
// key block) times the encoded keys: corr (Hc, nblocks, P, D), float32, holds for every m = i − j the correction
// y_d = Σ_p a_pd x_{partner_p(d)} of A(o_i − p_j) (partner_0(d) = d; partner (P − 1, D) int64 the others: a
// rotation plane's other dim, the rest of a Jordan chain, or d itself with a = 0) times c·log2(e), so the
// kernel's logits are in base 2. Either both origins are the blocks' middles (a fading encoding: every factor
// within e^{±λ·block/2}, the lag m·block), or, with qd and kd (an encoding of Jordan blocks), queries sit at their
// block's start and keys at their block's end (every factor a forward lag, so the binomial terms of the three
// share their sign and round like A(t − s) itself; the lag (m − 1)·block) and the diagonal block (m = 0) reads qd
// and kd instead, encoded at its middle (corr[:, 0] the identity). With kx (float32; a diagonal budget shorter than
// half a block) the diagonal block is two halves, qd and kd encoded at each half's middle, the queries (qe) at the
// start of their half and corr (Hc, 2·nblocks, P, D) two tables a lag, the second half's block/2 longer; the second
// half's queries meet the first half's keys with both at the halves' boundary (qe, and kx: the keys encoded at
// their half's end). Hc is H or 1 (one correction for every head);
// the heads of k and v are H / Hk query heads each. A key block's keys s ≤ t (the block's own, causally) enter
// one online softmax per query row; out (B, H, T, Dv) is in q's dtype, lse (B, H, T) float32 its log-sum-exp.
//
// bfloat16 and float32 run the products as oneDNN's batch-reduce GEMM (at::native::cpublas::brgemm: AMX or
// AVX-512 where the CPU has them), bfloat16 on VNNI-packed keys and values. The threads' subnormal numbers are
// flushed for the kernel's duration (their own control register, put back after): a correction's fade may
// underflow, and every product it leaves is then below any softmax's resolution (the Python side's bound).
#include <ATen/Parallel.h>
#include <ATen/Functions.h>
#include <ATen/core/Tensor.h>
#include <ATen/native/CPUBlas.h>
#include <c10/util/BFloat16.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <optional>
#include <tuple>
#include <type_traits>
#include <vector>
#if defined(__x86_64__) || defined(_M_X64)
#include <xmmintrin.h>
#endif

#if defined(__AVX512F__) && defined(__GNUC__) && !defined(__clang__)
// the library's flags prefer 256-bit vectors (the apply kernels' measure); this kernel's 16-lane softmax and
// corrections ran 15-20 % faster in 512-bit registers on a Xeon with AMX
#pragma GCC target("prefer-vector-width=512")
#endif

namespace {

constexpr int64_t kLanes = 16;
constexpr int64_t kCols = 64;  // the packed column blocks of keys (of a smaller block: the block) and of values' width
constexpr int64_t kKeysPerRow = 512;  // key blocks joined into one softmax update of a row, at most this many keys

typedef float v16 __attribute__((vector_size(64)));
typedef uint32_t u16v __attribute__((vector_size(64)));
typedef int32_t i16v __attribute__((vector_size(64)));
typedef uint16_t h16v __attribute__((vector_size(32)));

inline v16 splat(float f) { return v16{} + f; }
inline v16 load16(const float* p) {
  v16 v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
inline float load1(float v) { return v; }
inline float load1(c10::BFloat16 v) { return static_cast<float>(v); }
inline void store16(float* out, v16 e) { std::memcpy(out, &e, sizeof e); }
// rounded to nearest even as torch rounds, a NaN to the quiet NaN
inline void store16(c10::BFloat16* out, v16 e) {
  u16v u;
  std::memcpy(&u, &e, sizeof u);
  const u16v nan = (u & 0x7fffffffu) > 0x7f800000u;
  u = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
  u = nan ? u16v{} + 0x7fc0u : u;
  const h16v h = __builtin_convertvector(u, h16v);
  std::memcpy(out, &h, sizeof h);
}
inline void store1(float& out, float f) { out = f; }
inline void store1(c10::BFloat16& out, float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  out.x = (u & 0x7fffffffu) > 0x7f800000u ? uint16_t(0x7fc0) : uint16_t((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

inline float lanes_max(v16 a, float m) {
  for (int l = 0; l < kLanes; l++) m = a[l] > m ? a[l] : m;
  return m;
}
inline float lanes_sum(v16 a) {
  float s = 0.0f;
  for (int l = 0; l < kLanes; l++) s += a[l];
  return s;
}

// 2^y for y ≤ 0, exactly 0 below −126 (no subnormal result): y = n + f with n the nearest integer and a degree-5
// polynomial in f ∈ [−½, ½] (relative error 1.1e-7), in kLanes lanes
inline v16 exp2_lanes(v16 y) {
  const v16 lo = splat(-126.0f);
  const v16 yc = y < lo ? lo : y;
  const v16 n = (yc + 12582912.0f) - 12582912.0f;  // round to nearest: 1.5·2^23
  const v16 f = yc - n;
  v16 p = splat(0.0013400432163865122f);
  p = p * f + 0.009676037097880133f;
  p = p * f + 0.055503272142140625f;
  p = p * f + 0.24022107355829797f;
  p = p * f + 0.693147206710618f;
  p = p * f + 1.0000000754953497f;
  const i16v e = (__builtin_convertvector(n, i16v) + 127) << 23;
  v16 s;
  std::memcpy(&s, &e, sizeof s);
  const v16 r = p * s;
  return y < lo ? splat(0.0f) : r;
}

struct Shape {
  int64_t B, H, Hk, T, D, Dv, block, nb, ksub, vsub, kpack, vpack, rows2, kc;
};

// fn(idx, rows, nk, scratch) for every key block idx = (b·Hk + hk)·nb + j of x (B, Hk, T, ·) on torch's pool: rows
// its first row, nk its rows, scratch a thread's buffer of `scratch` entries
template <typename X, typename F>
void each_key_block(const at::Tensor& x, const Shape& z, int64_t scratch, F fn) {
  const X* base = x.const_data_ptr<X>();
  const int64_t x0 = x.stride(0), x1 = x.stride(1), x2 = x.stride(2);
  at::parallel_for(0, z.B * z.Hk * z.nb, 1, [&](int64_t lo, int64_t hi) {
    std::vector<X> t(scratch);
    for (int64_t idx = lo; idx < hi; idx++) {
      const int64_t j = idx % z.nb, hk = idx / z.nb % z.Hk, b = idx / z.nb / z.Hk;
      fn(idx, base + b * x0 + hk * x1 + j * z.block * x2, std::min(z.block, z.T - j * z.block), t.data());
    }
  });
}

// keys transposed (D × kc per column block: 64 keys, or a smaller block's own) of every key block, zero past the
// block's end, VNNI-packed for bfloat16
template <typename X>
void pack_keys(const at::Tensor& ke, const Shape& z, X* kp) {
  const bool vnni = std::is_same<X, c10::BFloat16>::value;
  const int64_t k2 = ke.stride(2);
  each_key_block<X>(ke, z, vnni ? z.D * z.kc : 0, [&](int64_t idx, const X* kr, int64_t nk, X* tmp) {
    for (int64_t u = 0; u < z.ksub; u++) {
      X* dst = kp + idx * z.kpack + u * z.D * z.kc;
      X* t = vnni ? tmp : dst;
      for (int64_t d = 0; d < z.D; d++)
        for (int64_t c = 0; c < z.kc; c++) {
          const int64_t s = u * z.kc + c;
          t[d * z.kc + c] = s < nk ? kr[s * k2 + d] : X(0);
        }
      if (vnni) at::native::cpublas::pack(z.D, z.kc, z.kc, z.kc, ke.scalar_type(), ke.scalar_type(), t, dst);
    }
  });
}

// values (rows2 × kCols per column block) of every key block, zero past the block's end and past Dv, VNNI-packed
// for bfloat16
template <typename X>
void pack_values(const at::Tensor& v, const Shape& z, X* vp) {
  const bool vnni = std::is_same<X, c10::BFloat16>::value;
  const int64_t v2 = v.stride(2);
  each_key_block<X>(v, z, vnni ? z.rows2 * kCols : 0, [&](int64_t idx, const X* vr, int64_t nk, X* tmp) {
    const int64_t nk2 = (nk + 1) / 2 * 2;
    for (int64_t w = 0; w < z.vsub; w++) {
      X* dst = vp + idx * z.vpack + w * z.rows2 * kCols;
      X* t = vnni ? tmp : dst;
      for (int64_t s = 0; s < nk2; s++)
        for (int64_t c = 0; c < kCols; c++) {
          const int64_t e = w * kCols + c;
          t[s * kCols + c] = (s < nk && e < z.Dv) ? vr[s * v2 + e] : X(0);
        }
      if (vnni) at::native::cpublas::pack(nk2, kCols, kCols, kCols, v.scalar_type(), v.scalar_type(), t, dst);
    }
  });
}

template <typename X>
void attend(const at::Tensor& qe, const at::Tensor* qd, const at::Tensor& corr, const at::Tensor& partner,
            const Shape& z, const X* kp, const X* kdp, const X* kxp, const X* vp, at::Tensor& out, at::Tensor& lse) {
  const bool vnni = std::is_same<X, c10::BFloat16>::value;
  const int64_t D = z.D, Dv = z.Dv, blk = z.block, nb = z.nb, P = corr.size(2);
  // with kx: each block's rows in two halves, each with its own corrections (corr (Hc, nb·2, P, D)); else one
  const int64_t halves = kxp ? 2 : 1, half = blk / halves;
  const int64_t per = std::max<int64_t>(1, kKeysPerRow / blk);  // key blocks per softmax update
  const int64_t lds = z.ksub * z.kc, ldw = per * lds, ldo = z.vsub * kCols, Hc = corr.size(0);
  const X* qb = qe.const_data_ptr<X>();
  const X* qdb = qd ? qd->const_data_ptr<X>() : nullptr;
  const float* cb = corr.const_data_ptr<float>();
  const int64_t* pp = partner.const_data_ptr<int64_t>();  // (P − 1, D): each dim's other terms
  X* ob = out.mutable_data_ptr<X>();
  float* lb = lse.mutable_data_ptr<float>();
  const float neg = -std::numeric_limits<float>::infinity();
  const int64_t q0 = qe.stride(0), q1 = qe.stride(1), q2 = qe.stride(2), o0 = out.stride(0), o1 = out.stride(1),
                o2 = out.stride(2);
  const int64_t d0 = qd ? qd->stride(0) : 0, d1 = qd ? qd->stride(1) : 0, d2 = qd ? qd->stride(2) : 0;
  at::parallel_for(0, z.B * z.H * nb, 1, [&](int64_t lo, int64_t hi) {
#if defined(__x86_64__) || defined(_M_X64)
    const unsigned csr = _mm_getcsr();
    _mm_setcsr(csr | 0x8040u);  // flush-to-zero and denormals-are-zero on this thread, for this task
#endif
    // Q[p·blk·D + r·D + d]: row r's entry at dim d's p-th term (p = 0: d itself), of qe's rows and of qd's
    std::vector<float> Q(P * blk * D), Qd(qdb ? blk * D : 0), S(blk * ldw), O(blk * ldo), m(blk), l(blk);
    std::vector<X> A(blk * D), Ax(kxp ? blk * D : 0), P_(blk * ldw);
    auto load = [&](const X* rows, int64_t stride, float* dst, int64_t nr, int64_t terms) {
      for (int64_t r = 0; r < nr; r++)
        for (int64_t d = 0; d < D; d++) dst[r * D + d] = load1(rows[r * stride + d]);
      for (int64_t p = 1; p < terms; p++)
        for (int64_t r = 0; r < nr; r++)
          for (int64_t d = 0; d < D; d++) dst[p * blk * D + r * D + d] = dst[r * D + pp[(p - 1) * D + d]];
    };
    // rows r0 … r1 − 1 of src corrected by the lag's A (a row of the second half by the half's own table, ca + P·D),
    // its first `terms` terms (1 on the diagonal block, whose lag is 0: A(0) = I), into dst's rows from 0; their
    // largest magnitude
    auto correct = [&](const float* src, const float* ca, int64_t r0, int64_t r1, X* dst, int64_t terms) {
      v16 big = splat(0.0f);
      for (int64_t r = r0; r < r1; r++) {
        const float* cr = ca + (r >= half ? P * D : 0);
        for (int64_t d = 0; d < D; d += kLanes) {
          v16 y = load16(cr + d) * load16(src + r * D + d);
          for (int64_t p = 1; p < terms; p++) y += load16(cr + p * D + d) * load16(src + p * blk * D + r * D + d);
          const v16 ay = y < 0.0f ? -y : y;
          big = ay > big ? ay : big;
          store16(dst + (r - r0) * D + d, y);
        }
      }
      return lanes_max(big, 0.0f);
    };
    for (int64_t idx = lo; idx < hi; idx++) {
      const int64_t i = idx % nb, h = idx / nb % z.H, b = idx / nb / z.H, hk = h / (z.H / z.Hk);
      const int64_t t0 = i * blk, nr = std::min(blk, z.T - t0);
      const float* ch = cb + (Hc == 1 ? 0 : h) * nb * halves * P * D;
      load(qb + b * q0 + h * q1 + t0 * q2, q2, Q.data(), nr, P);
      if (qdb) load(qdb + b * d0 + h * d1 + t0 * d2, d2, Qd.data(), nr, 1);  // the diagonal block's: lag 0
      std::fill(O.begin(), O.begin() + nr * ldo, 0.0f);
      std::fill(m.begin(), m.begin() + nr, neg);
      std::fill(l.begin(), l.begin() + nr, 0.0f);
      for (int64_t jhi = i; jhi >= 0; jhi -= per) {
        const int64_t jlo = std::max<int64_t>(0, jhi - per + 1), width = (jhi - jlo + 1) * lds;
        for (int64_t j = jlo; j <= jhi; j++) {  // the logits of key block j: S[:, col …]
          const int64_t col = (j - jlo) * lds, nk = std::min(blk, z.T - j * blk), kidx = (b * z.Hk + hk) * nb + j;
          const float* ca = ch + (i - j) * halves * P * D;
          if (correct(j == i && qdb ? Qd.data() : Q.data(), ca, 0, nr, A.data(), j == i ? 1 : P) > 0.0f) {
            for (int64_t u = 0; u * z.kc < nk; u++)
              at::native::cpublas::brgemm(nr, z.kc, D, D, z.kc, ldw, false, A.data(),
                                          (j == i && kdp ? kdp : kp) + kidx * z.kpack + u * D * z.kc,
                                          S.data() + col + u * z.kc, vnni);
          } else {  // every correction underflowed: the logits are exactly 0
            for (int64_t r = 0; r < nr; r++) std::fill(S.data() + r * ldw + col, S.data() + r * ldw + col + lds, 0.0f);
          }
          if (j == i && kxp && nr > half) {  // the second half's queries and the first half's keys, at their boundary
            correct(Q.data(), ca, half, nr, Ax.data(), 1);
            at::native::cpublas::brgemm(nr - half, half, D, D, z.kc, ldw, false, Ax.data(), kxp + kidx * z.kpack,
                                        S.data() + half * ldw + col, vnni);
          }
          for (int64_t r = 0; r < nr; r++) {  // keys past the block's end, and on the diagonal keys after the query
            const int64_t seen = j == i ? r + 1 : nk;
            std::fill(S.data() + r * ldw + col + seen, S.data() + r * ldw + col + lds, neg);
          }
        }
        for (int64_t r = 0; r < nr; r++) {  // the online softmax of the row over these key blocks
          float* s = S.data() + r * ldw;
          v16 mx = splat(m[r]);
          for (int64_t c = 0; c < width; c += kLanes) {
            const v16 y = load16(s + c);
            mx = y > mx ? y : mx;
          }
          const float top = lanes_max(mx, m[r]);
          const float alpha = std::exp2(m[r] - top);  // m[r] = −inf the first time: 0
          X* p = P_.data() + r * ldw;
          v16 sum = splat(0.0f);
          for (int64_t c = 0; c < width; c += kLanes) {
            const v16 e = exp2_lanes(load16(s + c) - top);
            sum += e;
            store16(p + c, e);
          }
          l[r] = l[r] * alpha + lanes_sum(sum);
          m[r] = top;
          if (alpha != 1.0f)
            for (int64_t e = 0; e < Dv; e++) O[r * ldo + e] *= alpha;
        }
        for (int64_t j = jlo; j <= jhi; j++) {
          const int64_t nk = std::min(blk, z.T - j * blk), nk2 = (nk + 1) / 2 * 2;
          const int64_t kidx = (b * z.Hk + hk) * nb + j;
          for (int64_t w = 0; w < z.vsub; w++)
            at::native::cpublas::brgemm(nr, kCols, nk2, ldw, kCols, ldo, true, P_.data() + (j - jlo) * lds,
                                        vp + kidx * z.vpack + w * z.rows2 * kCols, O.data() + w * kCols, vnni);
        }
      }
      X* orow = ob + b * o0 + h * o1 + t0 * o2;
      float* lrow = lb + (b * z.H + h) * z.T + t0;
      for (int64_t r = 0; r < nr; r++) {
        const float inv = 1.0f / l[r];
        int64_t e = 0;
        for (; e + kLanes <= Dv; e += kLanes) store16(orow + r * o2 + e, load16(O.data() + r * ldo + e) * inv);
        for (; e < Dv; e++) store1(orow[r * o2 + e], O[r * ldo + e] * inv);
        lrow[r] = (m[r] + std::log2(l[r])) * 0.6931471805599453f;
      }
    }
    if (vnni) at::native::cpublas::brgemm_release(vnni);
#if defined(__x86_64__) || defined(_M_X64)
    _mm_setcsr(csr);
#endif
  });
}

// P terms per dim at most: a real Jordan block of size n couples a dim to n − 1 others, a complex one of size n (a
// rotation plane of Jordan chains) to 2n − 1
constexpr int64_t kMaxTerms = 8;

std::tuple<at::Tensor, at::Tensor> recentred_flash(const at::Tensor& qe, const at::Tensor& ke, const at::Tensor& v,
                                                   const at::Tensor& corr, const at::Tensor& partner, int64_t block,
                                                   const std::optional<at::Tensor>& qd,
                                                   const std::optional<at::Tensor>& kd,
                                                   const std::optional<at::Tensor>& kx) {
  const auto dt = qe.scalar_type();
  TORCH_CHECK(dt == at::kFloat || dt == at::kBFloat16, "liepos_native::recentred_flash: float32 or bfloat16, got ", dt);
  TORCH_CHECK(qe.dim() == 4 && ke.dim() == 4 && v.dim() == 4 && ke.scalar_type() == dt && v.scalar_type() == dt,
              "liepos_native::recentred_flash: qe, ke, v must be (B, H, T, D) of one dtype");
  TORCH_CHECK(qe.stride(3) == 1 && ke.stride(3) == 1 && v.stride(3) == 1,
              "liepos_native::recentred_flash: the last axis of qe, ke and v must be contiguous");
  TORCH_CHECK(qd.has_value() == kd.has_value(), "liepos_native::recentred_flash: qd and kd come together or not at all");
  if (qd.has_value()) {
    TORCH_CHECK(qd->sizes() == qe.sizes() && kd->sizes() == ke.sizes() && qd->scalar_type() == dt &&
                    kd->scalar_type() == dt && qd->stride(3) == 1 && kd->stride(3) == 1,
                "liepos_native::recentred_flash: qd and kd must be shaped as qe and ke, of their dtype, the last axis "
                "contiguous; got qd ", qd->sizes(), ", kd ", kd->sizes());
  }
  if (kx.has_value()) {
    TORCH_CHECK(qd.has_value() && kx->sizes() == ke.sizes() && kx->scalar_type() == dt && kx->stride(3) == 1 &&
                    dt == at::kFloat && block % 4 == 0 && block <= 2 * kCols,
                "liepos_native::recentred_flash: kx (blocks in halves) needs qd and kd, float32, the shape of ke with "
                "its last axis contiguous, and a block that is a multiple of 4 of at most ", 2 * kCols, "; got kx ",
                kx->sizes(), " of ", kx->scalar_type(), ", block ", block);
  }
  const int64_t B = qe.size(0), H = qe.size(1), T = qe.size(2), D = qe.size(3), Hk = ke.size(1), Dv = v.size(3);
  TORCH_CHECK(ke.size(0) == B && v.size(0) == B && ke.size(2) == T && v.size(2) == T && ke.size(3) == D &&
                  v.size(1) == Hk && Hk >= 1 && H % Hk == 0,
              "liepos_native::recentred_flash: shapes qe ", qe.sizes(), ", ke ", ke.sizes(), ", v ", v.sizes(),
              " do not match (keys and values of T rows and H / Hk query heads each)");
  TORCH_CHECK(block >= 2 && block % 2 == 0 && (block >= kCols || block % kLanes == 0) && D % kLanes == 0 &&
                  D <= 512 && Dv >= 1 && Dv <= 512,
              "liepos_native::recentred_flash: block ", block, " must be even (below ", kCols, " a multiple of ",
              kLanes, "), D ", D, " a multiple of 16, D and Dv ", Dv, " at most 512");
  const int64_t nb = (T + block - 1) / block, halves = kx.has_value() ? 2 : 1;
  TORCH_CHECK(corr.scalar_type() == at::kFloat && corr.is_contiguous() && corr.dim() == 4 &&
                  (corr.size(0) == H || corr.size(0) == 1) && corr.size(1) == nb * halves && corr.size(2) >= 1 &&
                  corr.size(2) <= kMaxTerms && corr.size(3) == D,
              "liepos_native::recentred_flash: corr must be contiguous float32 (H or 1, ", nb * halves, ", P, ", D,
              ") with 1 ≤ P ≤ ", kMaxTerms, ", got ", corr.sizes());
  const int64_t P = corr.size(2);
  TORCH_CHECK(partner.scalar_type() == at::kLong && partner.is_contiguous() && partner.dim() == 2 &&
                  partner.size(0) == P - 1 && partner.size(1) == D &&
                  (partner.numel() == 0 || (partner.min().item<int64_t>() >= 0 && partner.max().item<int64_t>() < D)),
              "liepos_native::recentred_flash: partner must be a contiguous int64 (P − 1, D) = (", P - 1, ", ", D,
              ") of dims, got ", partner.sizes());
  const bool vnni = dt == at::kBFloat16;
  TORCH_CHECK(!vnni || at::native::cpublas::could_pack(dt),
              "liepos_native::recentred_flash: bfloat16 needs oneDNN's packed GEMM (AMX), which this CPU lacks");
  auto out = at::empty({B, H, T, Dv}, qe.options());
  auto lse = at::empty({B, H, T}, qe.options().dtype(at::kFloat));
  if (T == 0 || B == 0 || H == 0) return {out, lse};
  const int64_t kc = std::min(kCols, block);  // keys per packed column block
  Shape z{B, H, Hk, T, D, Dv, block, nb, (block + kc - 1) / kc, (Dv + kCols - 1) / kCols, 0, 0, block, kc};
  z.kpack = z.ksub * D * kc;
  z.vpack = z.vsub * z.rows2 * kCols;
  auto kp = at::empty({B * Hk * nb * z.kpack}, qe.options());
  auto kdp = at::empty({kd.has_value() ? B * Hk * nb * z.kpack : 0}, qe.options());
  auto kxp = at::empty({kx.has_value() ? B * Hk * nb * z.kpack : 0}, qe.options());
  auto vpk = at::empty({B * Hk * nb * z.vpack}, qe.options());
  const at::Tensor* qdp = qd.has_value() ? &*qd : nullptr;
  auto run = [&](auto zero) {
    using X = decltype(zero);
    pack_keys<X>(ke, z, kp.mutable_data_ptr<X>());
    if (kd.has_value()) pack_keys<X>(*kd, z, kdp.mutable_data_ptr<X>());
    if (kx.has_value()) pack_keys<X>(*kx, z, kxp.mutable_data_ptr<X>());
    pack_values<X>(v, z, vpk.mutable_data_ptr<X>());
    attend<X>(qe, qdp, corr, partner, z, kp.const_data_ptr<X>(), kd.has_value() ? kdp.const_data_ptr<X>() : nullptr,
              kx.has_value() ? kxp.const_data_ptr<X>() : nullptr, vpk.const_data_ptr<X>(), out, lse);
  };
  if (vnni) run(c10::BFloat16(0.0f));
  else run(0.0f);
  return {out, lse};
}

bool packs_bfloat16() { return at::native::cpublas::could_pack(at::kBFloat16); }

}  // namespace

TORCH_LIBRARY_FRAGMENT(liepos_native, m) {
  m.def(
      "recentred_flash(Tensor qe, Tensor ke, Tensor v, Tensor corr, Tensor partner, int block, Tensor? qd=None, "
      "Tensor? kd=None, Tensor? kx=None) -> (Tensor, Tensor)");
  m.def("packs_bfloat16() -> bool");
}

TORCH_LIBRARY_IMPL(liepos_native, CPU, m) { m.impl("recentred_flash", &recentred_flash); }

TORCH_LIBRARY_IMPL(liepos_native, CompositeExplicitAutograd, m) { m.impl("packs_bfloat16", &packs_bfloat16); }
