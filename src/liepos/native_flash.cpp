// The causal attention of a fading encoding in one native kernel: liepos_native::recentred_flash, built with
// native_kernels.cpp into one library (liepos._kernels) and called by liepos.recentred_kernel.
//
//   recentred_flash(qe, ke, v, corr, partner, block) -> (out, lse)
//
// qe (B, H, T, D) and ke (B, Hk, T, D) are q and k encoded at the middle of their block of `block` rows,
// F(t − o_i) q and G(s − o_j) k with o_i = i·block + block/2, so that every factor lies within the diagonal
// budget. The score of query t of block i and key s of block j ≤ i is
//
//   c·qᵀ A(t − s) k = c·(F(t − o_i) q)ᵀ A((i − j)·block) (G(s − o_j) k),
//
// and the kernel forms it as ((i − j)·block)'s correction of the query rows (in registers, per pair of query
// block and key block) times the encoded keys: corr (Hc, nblocks, 2, D), float32, holds for every lag m·block
// the correction y_d = a_d x_d + b_d x_partner(d) (a rotation plane, a damped one, or a decay dim with b = 0)
// times c·log2(e), so the kernel's logits are in base 2. Hc is H or 1 (one correction for every head); the
// heads of k and v are H / Hk query heads each. A key block's keys s ≤ t (the block's own, causally) enter one
// online softmax per query row; out (B, H, T, Dv) is in q's dtype, lse (B, H, T) float32 its log-sum-exp.
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
constexpr int64_t kCols = 64;  // the packed column blocks of keys (and of values' width) one GEMM call takes
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
  int64_t B, H, Hk, T, D, Dv, block, nb, ksub, vsub, kpack, vpack, rows2;
};

// keys transposed (D × kCols per column block) and values (rows2 × kCols per column block) of every key block,
// zero past the block's end (and past Dv), VNNI-packed for bfloat16
template <typename X>
void pack(const at::Tensor& ke, const at::Tensor& v, const Shape& z, X* kp, X* vp) {
  const bool vnni = std::is_same<X, c10::BFloat16>::value;
  const X* kb = ke.const_data_ptr<X>();
  const X* vb = v.const_data_ptr<X>();
  const int64_t k0 = ke.stride(0), k1 = ke.stride(1), k2 = ke.stride(2), v0 = v.stride(0), v1 = v.stride(1),
                v2 = v.stride(2);
  at::parallel_for(0, z.B * z.Hk * z.nb, 1, [&](int64_t lo, int64_t hi) {
    std::vector<X> tk(z.D * kCols), tv(z.rows2 * kCols);
    for (int64_t idx = lo; idx < hi; idx++) {
      const int64_t j = idx % z.nb, hk = idx / z.nb % z.Hk, b = idx / z.nb / z.Hk;
      const int64_t s0 = j * z.block, nk = std::min(z.block, z.T - s0), nk2 = (nk + 1) / 2 * 2;
      const X* kr = kb + b * k0 + hk * k1 + s0 * k2;
      const X* vr = vb + b * v0 + hk * v1 + s0 * v2;
      for (int64_t u = 0; u < z.ksub; u++) {
        X* dst = kp + idx * z.kpack + u * z.D * kCols;
        X* t = vnni ? tk.data() : dst;
        for (int64_t d = 0; d < z.D; d++)
          for (int64_t c = 0; c < kCols; c++) {
            const int64_t s = u * kCols + c;
            t[d * kCols + c] = s < nk ? kr[s * k2 + d] : X(0);
          }
        if (vnni) at::native::cpublas::pack(z.D, kCols, kCols, kCols, ke.scalar_type(), ke.scalar_type(), t, dst);
      }
      for (int64_t w = 0; w < z.vsub; w++) {
        X* dst = vp + idx * z.vpack + w * z.rows2 * kCols;
        X* t = vnni ? tv.data() : dst;
        for (int64_t s = 0; s < nk2; s++)
          for (int64_t c = 0; c < kCols; c++) {
            const int64_t e = w * kCols + c;
            t[s * kCols + c] = (s < nk && e < z.Dv) ? vr[s * v2 + e] : X(0);
          }
        if (vnni) at::native::cpublas::pack(nk2, kCols, kCols, kCols, v.scalar_type(), v.scalar_type(), t, dst);
      }
    }
  });
}

template <typename X>
void attend(const at::Tensor& qe, const at::Tensor& corr, const at::Tensor& partner, const Shape& z, const X* kp,
            const X* vp, at::Tensor& out, at::Tensor& lse) {
  const bool vnni = std::is_same<X, c10::BFloat16>::value;
  const int64_t D = z.D, Dv = z.Dv, blk = z.block, nb = z.nb;
  const int64_t per = std::max<int64_t>(1, kKeysPerRow / blk);  // key blocks per softmax update
  const int64_t lds = z.ksub * kCols, ldw = per * lds, ldo = z.vsub * kCols, Hc = corr.size(0);
  const X* qb = qe.const_data_ptr<X>();
  const float* cb = corr.const_data_ptr<float>();
  const int64_t* pp = partner.const_data_ptr<int64_t>();
  X* ob = out.mutable_data_ptr<X>();
  float* lb = lse.mutable_data_ptr<float>();
  const float neg = -std::numeric_limits<float>::infinity();
  const int64_t q0 = qe.stride(0), q1 = qe.stride(1), q2 = qe.stride(2), o0 = out.stride(0), o1 = out.stride(1),
                o2 = out.stride(2);
  at::parallel_for(0, z.B * z.H * nb, 1, [&](int64_t lo, int64_t hi) {
#if defined(__x86_64__) || defined(_M_X64)
    const unsigned csr = _mm_getcsr();
    _mm_setcsr(csr | 0x8040u);  // flush-to-zero and denormals-are-zero on this thread, for this task
#endif
    std::vector<float> Q(blk * D), Qp(blk * D), S(blk * ldw), O(blk * ldo), m(blk), l(blk);
    std::vector<X> A(blk * D), P(blk * ldw);
    for (int64_t idx = lo; idx < hi; idx++) {
      const int64_t i = idx % nb, h = idx / nb % z.H, b = idx / nb / z.H, hk = h / (z.H / z.Hk);
      const int64_t t0 = i * blk, nr = std::min(blk, z.T - t0);
      const float* ch = cb + (Hc == 1 ? 0 : h) * nb * 2 * D;
      const X* qr = qb + b * q0 + h * q1 + t0 * q2;
      for (int64_t r = 0; r < nr; r++)
        for (int64_t d = 0; d < D; d++) Q[r * D + d] = load1(qr[r * q2 + d]);
      for (int64_t r = 0; r < nr; r++)  // each dim's partner in its plane (itself for a decay dim)
        for (int64_t d = 0; d < D; d++) Qp[r * D + d] = Q[r * D + pp[d]];
      std::fill(O.begin(), O.begin() + nr * ldo, 0.0f);
      std::fill(m.begin(), m.begin() + nr, neg);
      std::fill(l.begin(), l.begin() + nr, 0.0f);
      for (int64_t jhi = i; jhi >= 0; jhi -= per) {
        const int64_t jlo = std::max<int64_t>(0, jhi - per + 1), width = (jhi - jlo + 1) * lds;
        for (int64_t j = jlo; j <= jhi; j++) {  // the logits of key block j: S[:, col …]
          const int64_t col = (j - jlo) * lds, nk = std::min(blk, z.T - j * blk);
          const float* ca = ch + (i - j) * 2 * D;
          const float* cq = ca + D;
          v16 big = splat(0.0f);
          for (int64_t r = 0; r < nr; r++)
            for (int64_t d = 0; d < D; d += kLanes) {  // the query rows corrected by A((i − j)·block)
              const v16 y = load16(ca + d) * load16(Q.data() + r * D + d) + load16(cq + d) * load16(Qp.data() + r * D + d);
              const v16 ay = y < 0.0f ? -y : y;
              big = ay > big ? ay : big;
              store16(A.data() + r * D + d, y);
            }
          const int64_t kidx = (b * z.Hk + hk) * nb + j;
          if (lanes_max(big, 0.0f) > 0.0f) {
            for (int64_t u = 0; u * kCols < nk; u++)
              at::native::cpublas::brgemm(nr, kCols, D, D, kCols, ldw, false, A.data(), kp + kidx * z.kpack + u * D * kCols,
                                          S.data() + col + u * kCols, vnni);
          } else {  // every correction underflowed: the logits are exactly 0
            for (int64_t r = 0; r < nr; r++) std::fill(S.data() + r * ldw + col, S.data() + r * ldw + col + lds, 0.0f);
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
          X* p = P.data() + r * ldw;
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
            at::native::cpublas::brgemm(nr, kCols, nk2, ldw, kCols, ldo, true, P.data() + (j - jlo) * lds,
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

std::tuple<at::Tensor, at::Tensor> recentred_flash(const at::Tensor& qe, const at::Tensor& ke, const at::Tensor& v,
                                                   const at::Tensor& corr, const at::Tensor& partner, int64_t block) {
  const auto dt = qe.scalar_type();
  TORCH_CHECK(dt == at::kFloat || dt == at::kBFloat16, "liepos_native::recentred_flash: float32 or bfloat16, got ", dt);
  TORCH_CHECK(qe.dim() == 4 && ke.dim() == 4 && v.dim() == 4 && ke.scalar_type() == dt && v.scalar_type() == dt,
              "liepos_native::recentred_flash: qe, ke, v must be (B, H, T, D) of one dtype");
  TORCH_CHECK(qe.stride(3) == 1 && ke.stride(3) == 1 && v.stride(3) == 1,
              "liepos_native::recentred_flash: the last axis of qe, ke and v must be contiguous");
  const int64_t B = qe.size(0), H = qe.size(1), T = qe.size(2), D = qe.size(3), Hk = ke.size(1), Dv = v.size(3);
  TORCH_CHECK(ke.size(0) == B && v.size(0) == B && ke.size(2) == T && v.size(2) == T && ke.size(3) == D &&
                  v.size(1) == Hk && Hk >= 1 && H % Hk == 0,
              "liepos_native::recentred_flash: shapes qe ", qe.sizes(), ", ke ", ke.sizes(), ", v ", v.sizes(),
              " do not match (keys and values of T rows and H / Hk query heads each)");
  TORCH_CHECK(block >= 2 && block % 2 == 0 && D % kLanes == 0 && D <= 512 && Dv >= 1 && Dv <= 512,
              "liepos_native::recentred_flash: block ", block, " must be even, D ", D, " a multiple of 16, D and Dv ",
              Dv, " at most 512");
  const int64_t nb = (T + block - 1) / block;
  TORCH_CHECK(corr.scalar_type() == at::kFloat && corr.is_contiguous() && corr.dim() == 4 &&
                  (corr.size(0) == H || corr.size(0) == 1) && corr.size(1) == nb && corr.size(2) == 2 &&
                  corr.size(3) == D,
              "liepos_native::recentred_flash: corr must be contiguous float32 (H or 1, ", nb, ", 2, ", D, "), got ",
              corr.sizes());
  TORCH_CHECK(partner.scalar_type() == at::kLong && partner.is_contiguous() && partner.dim() == 1 &&
                  partner.size(0) == D && partner.min().item<int64_t>() >= 0 && partner.max().item<int64_t>() < D,
              "liepos_native::recentred_flash: partner must be a contiguous int64 (D,) of dims");
  const bool vnni = dt == at::kBFloat16;
  TORCH_CHECK(!vnni || at::native::cpublas::could_pack(dt),
              "liepos_native::recentred_flash: bfloat16 needs oneDNN's packed GEMM (AMX), which this CPU lacks");
  auto out = at::empty({B, H, T, Dv}, qe.options());
  auto lse = at::empty({B, H, T}, qe.options().dtype(at::kFloat));
  if (T == 0 || B == 0 || H == 0) return {out, lse};
  Shape z{B, H, Hk, T, D, Dv, block, nb, (block + kCols - 1) / kCols, (Dv + kCols - 1) / kCols, 0, 0, block};
  z.kpack = z.ksub * D * kCols;
  z.vpack = z.vsub * z.rows2 * kCols;
  auto kp = at::empty({B * Hk * nb * z.kpack}, qe.options());
  auto vpk = at::empty({B * Hk * nb * z.vpack}, qe.options());
  if (vnni) {
    using X = c10::BFloat16;
    pack<X>(ke, v, z, kp.mutable_data_ptr<X>(), vpk.mutable_data_ptr<X>());
    attend<X>(qe, corr, partner, z, kp.const_data_ptr<X>(), vpk.const_data_ptr<X>(), out, lse);
  } else {
    pack<float>(ke, v, z, kp.mutable_data_ptr<float>(), vpk.mutable_data_ptr<float>());
    attend<float>(qe, corr, partner, z, kp.const_data_ptr<float>(), vpk.const_data_ptr<float>(), out, lse);
  }
  return {out, lse};
}

bool packs_bfloat16() { return at::native::cpublas::could_pack(at::kBFloat16); }

}  // namespace

TORCH_LIBRARY_FRAGMENT(liepos_native, m) {
  m.def("recentred_flash(Tensor qe, Tensor ke, Tensor v, Tensor corr, Tensor partner, int block) -> (Tensor, Tensor)");
  m.def("packs_bfloat16() -> bool");
}

TORCH_LIBRARY_IMPL(liepos_native, CPU, m) { m.impl("recentred_flash", &recentred_flash); }

TORCH_LIBRARY_IMPL(liepos_native, CompositeExplicitAutograd, m) { m.impl("packs_bfloat16", &packs_bfloat16); }
