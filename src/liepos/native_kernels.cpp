// The native CPU kernels of liepos._kernels, registered as torch.library ops (namespace liepos_native) and
// built once per machine by torch.utils.cpp_extension. Rows run in parallel on torch's own intra-op pool
// (at::parallel_for); the library links no OpenMP runtime of its own.
//
//   terms(x, t, offsets, masks, tile, out):  out[d] = sum_j [masks[j][d]] t[j][d] * x[d + offsets[j]]
//   halves(x, c, s, tile, out):              out[k] = c x[k] - s x[k+P],  out[k+P] = s x[k] + c x[k+P]
//   scale(x, t, tile, out, tau):             out[d] = t[d] x[d]
//   planes(x, t, conj, tile, out, tau):      out[2i] = re x[2i] - im x[2i+1],  out[2i+1] = im x[2i] + re x[2i+1]
//                                            (re, im) = (t[2i], ±t[2i+1]), - when conj: interleaved rotation planes;
//                                            both then clear: a rounded output below tau in magnitude is +0
//   clear(x, tau, out):                      out[i] = 0 where |x[i]| < tau, else x[i] (its bits); out contiguous
//   clear_(x, tau):                          clear in place (x's rows of unit stride, any other strides)
//   absmax(x) -> max_i |x[i]| as a 0-d float64 tensor (NaN when x holds a NaN)
//   absrange(x) -> (absmax, the smallest |x[i]| > 0, inf when none) as a float64 tensor of 2
//   norms(x) -> ||x[b, h, s, :]|| of every row, (B, H, S) in the work type
//   denormals(flush) -> prev, restore_denormals(prev): flush-to-zero on torch's intra-op threads, and back
//   merge(O, L, o, Li, first):               per row, L' = log(e^L + e^Li), O' = O + e^(Li - L') (o - O)
//
// and their in-place forms terms_ / halves_ (out is x). x is (B, H, S, D) with any strides but the last, the
// tables are in the work type (float, or double for double x) with stride 0 on broadcast axes. The terms' tables
// are zero where a term does not exist (masks[j][d] = 0): the masks keep a non-finite x out of a column that does
// not read it. bfloat16 and float16 are computed in float in registers and rounded as torch rounds (to nearest
// even).
//
// terms and terms_ are in native_terms.cpp (compiled beside this file); both include native_common.h.
#include "native_common.h"

namespace {


// ------------------------------------------------------------------------------------------------ halves
// iteration k reads and writes only k and k + P, so the loop has no carried dependence even when out is x.
// stream: a fresh float32 output whose rows are 32-byte aligned is written by non-temporal stores (whole cache lines
// straight to memory, no read of the line first: a third of the traffic of an out-of-place pass); the same values,
// the same fused multiply-adds per output as the plain loop (c x0 - s x1 as fma(c, x0, -(s x1)))
template <typename X, typename W, int64_t PC>
__attribute__((noinline)) void halves_chunk(const X* xp, X* yp, const W* __restrict__ cp, const W* __restrict__ sp,
                                            int64_t pn, const Rows g, int64_t lo, int64_t hi, bool stream) {
  const int64_t P = PC > 0 ? PC : pn;
#if defined(__AVX__) && defined(__FMA__)
  if constexpr (std::is_same_v<X, float> && PC > 0 && PC % 8 == 0) {
    if (stream) {
      FOR_ROWS(g, lo, hi, xo, yo, to) {
        const float* xr = xp + xo;
        float* yr = yp + yo;
        for (int64_t k = 0; k < P; k += 8) {
          const __m256 x0 = _mm256_loadu_ps(xr + k), x1 = _mm256_loadu_ps(xr + k + P);
          const __m256 c = _mm256_loadu_ps(cp + to + k), s = _mm256_loadu_ps(sp + to + k);
          _mm256_stream_ps(yr + k, _mm256_fmsub_ps(c, x0, _mm256_mul_ps(s, x1)));
          _mm256_stream_ps(yr + k + P, _mm256_fmadd_ps(s, x0, _mm256_mul_ps(c, x1)));
        }
      }
      _mm_sfence();  // the streamed lines visible before the task ends
      return;
    }
  }
#endif
#if defined(LIEPOS_BF16_LANES)
  if constexpr (std::is_same_v<X, c10::BFloat16>) {  // the plain loop's fused multiply-adds, 16 lanes at a time
    FOR_ROWS(g, lo, hi, xo, yo, to) {
      for (int64_t k = 0; k < P; k += 16) {
        const __mmask16 m = lanes(P - k);
        const __m512 x0 = ld16(xp + xo + k, m), x1 = ld16(xp + xo + k + P, m);
        const __m512 c = _mm512_maskz_loadu_ps(m, cp + to + k), s = _mm512_maskz_loadu_ps(m, sp + to + k);
        st16<false>(yp + yo + k, _mm512_fmsub_ps(c, x0, _mm512_mul_ps(s, x1)), m, 0);
        st16<false>(yp + yo + k + P, _mm512_fmadd_ps(s, x0, _mm512_mul_ps(c, x1)), m, 0);
      }
    }
    return;
  }
#endif
  (void)stream;
  FOR_ROWS(g, lo, hi, xo, yo, to) {
    const X* xr = xp + xo;
    X* yr = yp + yo;
    const W* __restrict__ cr = cp + to;
    const W* __restrict__ sr = sp + to;
#pragma GCC ivdep
    for (int64_t k = 0; k < P; k++) {  // explicit fused multiply-adds: the streamed loop's rounding, whatever contracts
      W x0 = ld(xr[k]), x1 = ld(xr[k + P]);
      st(yr[k], std::fma(cr[k], x0, -(sr[k] * x1)));
      st(yr[k + P], std::fma(sr[k], x0, cr[k] * x1));
    }
  }
}

// whether the pages holding the first and the last byte of [p, p + n) are mapped already (Linux: mincore). A fresh
// page costs a fault whose handler zeroes it into the cache, where writing through is cheaper than streaming past it
bool mapped(const void* p, size_t n) {
#if defined(__linux__)
  const uintptr_t page = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
  for (const uintptr_t a : {reinterpret_cast<uintptr_t>(p), reinterpret_cast<uintptr_t>(p) + n - 1}) {
    unsigned char v = 0;
    if (mincore(reinterpret_cast<void*>(a & ~(page - 1)), 1, &v) != 0 || !(v & 1)) return false;
  }
  return true;
#else
  (void)p;
  (void)n;
  return false;
#endif
}

// whether halves can stream into out: float32, AVX with FMA, a constant width of whole vectors, out not x, out
// contiguous from a 32-byte aligned base (its rows, 2P = 32, 64 or 128 floats, all aligned), its pages mapped
bool streams(const at::Tensor& x, const at::Tensor& out) {
#if defined(__AVX__) && defined(__FMA__)
  const int64_t P = x.size(3) / 2;
  if (x.scalar_type() != at::kFloat || !(P == 16 || P == 32 || P == 64) || out.data_ptr() == x.data_ptr() ||
      reinterpret_cast<uintptr_t>(out.data_ptr()) % 32 != 0 || !out.is_contiguous())
    return false;
  return mapped(out.data_ptr(), out.numel() * sizeof(float));
#else
  (void)x;
  (void)out;
  return false;
#endif
}

template <typename X, int64_t PC>
void halves_rows(const at::Tensor& x, const at::Tensor& c, const at::Tensor& sn, int64_t tile, at::Tensor& out,
                 bool stream) {
  using W = typename Work<X>::type;
  const int64_t P = x.size(3) / 2;
  const X* xp = x.const_data_ptr<X>();
  X* yp = out.mutable_data_ptr<X>();
  const W* cp = c.const_data_ptr<W>();
  const W* sp = sn.const_data_ptr<W>();
  tiled_rows(x, out, c, tile, [&](const Rows& g, int64_t lo, int64_t hi) {
    halves_chunk<X, W, PC>(xp, yp, cp, sp, P, g, lo, hi, stream);
  });
}

template <typename X>
void halves_typed(const at::Tensor& x, const at::Tensor& c, const at::Tensor& sn, int64_t tile, at::Tensor& out,
                  bool stream) {
  switch (x.size(3) / 2) {  // the common widths with a constant trip count
    case 16: return halves_rows<X, 16>(x, c, sn, tile, out, stream);
    case 32: return halves_rows<X, 32>(x, c, sn, tile, out, stream);
    case 64: return halves_rows<X, 64>(x, c, sn, tile, out, stream);
    default: return halves_rows<X, 0>(x, c, sn, tile, out, stream);
  }
}

void halves_impl(const at::Tensor& x, const at::Tensor& c, const at::Tensor& sn, int64_t tile, at::Tensor& out,
                 bool stream = false) {
  check_rows(x, out, x.size(3));
  const auto work = x.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
  const int64_t P = x.size(3) / 2;
  for (const at::Tensor* t : {&c, &sn}) {
    TORCH_CHECK(t->dim() == 4 && t->size(0) == x.size(0) && t->size(1) == x.size(1) && t->size(2) == x.size(2) &&
                    t->size(3) == P && x.size(3) == 2 * P && t->stride(3) == 1 && t->scalar_type() == work,
                "liepos_native::halves: tables ", t->sizes(), " of ", t->scalar_type(), " do not match x ", x.sizes(),
                " (want (B, H, S, D / 2) of ", work, ", last axis contiguous, D even)");
  }
  for (int64_t i = 0; i < 3; i++)
    TORCH_CHECK(stride_or_zero(c, i) == stride_or_zero(sn, i), "liepos_native::halves: c and s must share strides");
  stream = stream && streams(x, out);
  switch (x.scalar_type()) {
    case at::kFloat: return halves_typed<float>(x, c, sn, tile, out, stream);
    case at::kDouble: return halves_typed<double>(x, c, sn, tile, out, stream);
    case at::kBFloat16: return halves_typed<c10::BFloat16>(x, c, sn, tile, out, stream);
    case at::kHalf: return halves_typed<c10::Half>(x, c, sn, tile, out, stream);
    default: TORCH_CHECK(false, "liepos_native::halves: unsupported dtype ", x.scalar_type());
  }
}

void halves_out(const at::Tensor& x, const at::Tensor& c, const at::Tensor& sn, int64_t tile, at::Tensor out,
                bool stream) {
  halves_impl(x, c, sn, tile, out, stream);
}

bool halves_streams(const at::Tensor& x, const at::Tensor& out) { return streams(x, out); }

void halves_inplace(at::Tensor x, const at::Tensor& c, const at::Tensor& sn, int64_t tile) {
  halves_impl(x, c, sn, tile, x);
}

// ------------------------------------------------------------------------------------------------ scale, planes
// scale: out[d] = t[d] x[d]; planes: the interleaved rotation planes, t[2i], t[2i+1] the real and imaginary parts
// of plane i's complex factor (a complex table viewed as real; conj: its conjugate, im negated), out[2i] =
// re x[2i] - im x[2i+1], out[2i+1] = im x[2i] + re x[2i+1]. Iteration d (or plane i) reads and writes only its
// own columns: out may be x. Each output is then cleared as clear_ would clear it: its value rounded to X below
// tau in magnitude is stored as +0 (tau = 0 clears nothing; NaN is kept), in the same pass.
// CLEAR: a compiled loop of its own (in bfloat16 the comparison costs a third of the pass; tau = 0 does not pay it)
template <typename X, typename W, int64_t DC, bool PAIRS, bool CONJ, bool CLEAR>
__attribute__((noinline)) void mul_chunk(const X* xp, X* yp, const W* __restrict__ tp, int64_t dn, const Rows g,
                                         int64_t lo, int64_t hi, const Cut<X, W> cut) {
  const int64_t D = DC > 0 ? DC : dn;
#if defined(LIEPOS_BF16_LANES)
  if constexpr (std::is_same_v<X, c10::BFloat16>) {  // the same products and fused multiply-adds, 16 lanes at a time
    FOR_ROWS(g, lo, hi, xo, yo, to) {
      for (int64_t d = 0; d < D; d += 16) {
        const __mmask16 m = lanes(D - d);
        const __m512 x = ld16(xp + xo + d, m), t = _mm512_maskz_loadu_ps(m, tp + to + d);
        __m512 y;
        if constexpr (PAIRS) {  // lanes (2i, 2i + 1): x = (x0, x1), t = (re, im); swapped: (x1, x0)
          const __m512 sw = _mm512_permute_ps(x, 0xb1), re = _mm512_moveldup_ps(t);
          __m512 im = _mm512_movehdup_ps(t);
          if constexpr (CONJ) im = _mm512_castsi512_ps(_mm512_xor_si512(_mm512_castps_si512(im),
                                                                        _mm512_set1_epi32(int(0x80000000u))));
          // even lane fma(re, x0, -(im x1)), odd lane fma(im, x0, re x1): the plain loop's roundings
          const __m512 even = _mm512_fmsub_ps(re, x, _mm512_mul_ps(im, sw));
          const __m512 odd = _mm512_fmadd_ps(im, sw, _mm512_mul_ps(re, x));
          y = _mm512_mask_blend_ps(__mmask16(0xaaaa), even, odd);
        } else {
          y = _mm512_mul_ps(t, x);
        }
        st16<CLEAR>(yp + yo + d, y, m, cut.bits);
      }
    }
    return;
  }
#endif
  FOR_ROWS(g, lo, hi, xo, yo, to) {
    const X* xr = xp + xo;
    X* yr = yp + yo;
    const W* __restrict__ tr = tp + to;
    if constexpr (PAIRS) {
#pragma GCC ivdep
      for (int64_t i = 0; i < D / 2; i++) {
        const W x0 = ld(xr[2 * i]), x1 = ld(xr[2 * i + 1]), re = tr[2 * i], im = CONJ ? -tr[2 * i + 1] : tr[2 * i + 1];
        // explicit fused multiply-adds: the same rounding in both loops whatever the compiler contracts
        st_clear<CLEAR>(yr[2 * i], std::fma(re, x0, -(im * x1)), cut);
        st_clear<CLEAR>(yr[2 * i + 1], std::fma(im, x0, re * x1), cut);
      }
    } else {
#pragma GCC ivdep
      for (int64_t d = 0; d < D; d++) st_clear<CLEAR>(yr[d], tr[d] * ld(xr[d]), cut);
    }
  }
}

template <typename X, int64_t DC, bool PAIRS, bool CONJ>
void mul_rows(const at::Tensor& x, const at::Tensor& t, int64_t tile, at::Tensor& out, double tau) {
  using W = typename Work<X>::type;
  const Cut<X, W> cut = make_cut<X, W>(tau);
  const X* xp = x.const_data_ptr<X>();
  X* yp = out.mutable_data_ptr<X>();
  const W* tp = t.const_data_ptr<W>();
  const int64_t D = x.size(3);
  tiled_rows(x, out, t, tile, [&](const Rows& g, int64_t lo, int64_t hi) {
    if (tau > 0) {
      mul_chunk<X, W, DC, PAIRS, CONJ, true>(xp, yp, tp, D, g, lo, hi, cut);
    } else {
      mul_chunk<X, W, DC, PAIRS, CONJ, false>(xp, yp, tp, D, g, lo, hi, cut);
    }
  });
}

template <typename X, bool PAIRS, bool CONJ>
void mul_width(const at::Tensor& x, const at::Tensor& t, int64_t tile, at::Tensor& out, double tau) {
  switch (x.size(3)) {  // the common widths with a constant trip count
    case 32: return mul_rows<X, 32, PAIRS, CONJ>(x, t, tile, out, tau);
    case 64: return mul_rows<X, 64, PAIRS, CONJ>(x, t, tile, out, tau);
    case 128: return mul_rows<X, 128, PAIRS, CONJ>(x, t, tile, out, tau);
    default: return mul_rows<X, 0, PAIRS, CONJ>(x, t, tile, out, tau);
  }
}

template <typename X>
void mul_typed(const at::Tensor& x, const at::Tensor& t, bool pairs, bool conj, int64_t tile, at::Tensor& out,
               double tau) {
  if (!pairs) return mul_width<X, false, false>(x, t, tile, out, tau);
  return conj ? mul_width<X, true, true>(x, t, tile, out, tau) : mul_width<X, true, false>(x, t, tile, out, tau);
}

void mul_impl(const at::Tensor& x, const at::Tensor& t, bool pairs, bool conj, int64_t tile, at::Tensor& out,
              double tau) {
  check_rows(x, out, x.size(3));
  TORCH_CHECK(tau >= 0, "liepos_native::", pairs ? "planes" : "scale", ": tau must be at least 0, got ", tau);
  const auto work = x.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
  TORCH_CHECK(t.dim() == 4 && t.sizes() == x.sizes() && t.stride(3) == 1 && t.scalar_type() == work &&
                  (!pairs || x.size(3) % 2 == 0),
              "liepos_native::", pairs ? "planes" : "scale", ": table ", t.sizes(), " of ", t.scalar_type(),
              " does not match x ", x.sizes(), " (want x's shape in ", work, ", last axis contiguous",
              pairs ? ", an even width)" : ")");
  switch (x.scalar_type()) {
    case at::kFloat: return mul_typed<float>(x, t, pairs, conj, tile, out, tau);
    case at::kDouble: return mul_typed<double>(x, t, pairs, conj, tile, out, tau);
    case at::kBFloat16: return mul_typed<c10::BFloat16>(x, t, pairs, conj, tile, out, tau);
    case at::kHalf: return mul_typed<c10::Half>(x, t, pairs, conj, tile, out, tau);
    default: TORCH_CHECK(false, "liepos_native::", pairs ? "planes" : "scale", ": unsupported dtype ", x.scalar_type());
  }
}

void scale_out(const at::Tensor& x, const at::Tensor& t, int64_t tile, at::Tensor out, double tau) {
  mul_impl(x, t, false, false, tile, out, tau);
}
void planes_out(const at::Tensor& x, const at::Tensor& t, bool conj, int64_t tile, at::Tensor out, double tau) {
  mul_impl(x, t, true, conj, tile, out, tau);
}

// ------------------------------------------------------------------------------------------------ clear, absmax
// x is (B, H, S, D) with unit-stride rows and any other strides (stride 0 on a broadcast axis); out of clear is
// contiguous. An entry below tau in magnitude becomes +0, every other entry (NaN included: |NaN| < tau is false)
// keeps its bits, as x.masked_fill(x.abs() < tau, 0) gives them; absmax is max |x| (NaN when x holds a NaN, as
// x.abs().amax() gives it). Half precision is compared in float.
struct Flat {
  int64_t H, S, D, xb, xh, xs;
  int64_t row(int64_t r) const { return r / (H * S) * xb + r / S % H * xh + r % S * xs; }
  // rows [lo, hi) as runs of adjacent rows (each row D elements on from the last): fn(first row's offset, first
  // row, rows in the run), the index arithmetic once per run, not per row (three integer divisions a row cost
  // more than a 64-wide row's loop); a contiguous x is one run
  template <typename Fn>
  void runs(int64_t lo, int64_t hi, const Fn& fn) const {
    const bool rows = xs == D || S == 1, heads = rows && (xh == S * D || H == 1), all = heads && (xb == H * S * D);
    for (int64_t r = lo; r < hi;) {
      const int64_t n = std::min(hi - r, all ? hi - r : heads ? H * S - r % (H * S) : rows ? S - r % S : 1);
      fn(row(r), r, n);
      r += n;
    }
  }
};

Flat flat(const at::Tensor& x, const char* op) {
  TORCH_CHECK(x.dim() == 4 && (x.stride(3) == 1 || x.size(3) == 1) && x.device().is_cpu(), "liepos_native::", op,
              ": x must be a 4-D CPU tensor with unit-stride rows, got ", x.sizes(), " strides ", x.strides());
  return Flat{x.size(1), x.size(2), x.size(3), x.stride(0), x.stride(1), x.stride(2)};
}

int64_t row_grain(int64_t D) { return std::max<int64_t>(1, kGrainElems / std::max<int64_t>(1, D)); }

template <typename X, typename W>
void clear_typed(const at::Tensor& x, double tau, at::Tensor& out) {
  const Flat f = flat(x, "clear");
  const X* xp = x.const_data_ptr<X>();
  X* yp = out.mutable_data_ptr<X>();
  const W t = static_cast<W>(tau);  // compared in the work type, as torch compares a float tensor with a number
  const int64_t rows = x.numel() / std::max<int64_t>(1, f.D);
  at::parallel_for(0, rows, row_grain(f.D), [&](int64_t lo, int64_t hi) {
    f.runs(lo, hi, [&](int64_t at, int64_t r, int64_t n) {
      const X* xr = xp + at;
      X* yr = yp + r * f.D;
      for (int64_t d = 0; d < n * f.D; d++) {
        const X v = xr[d];
        const W a = ld(v);
        yr[d] = (a < t && -a < t) ? X(0) : v;
      }
    });
  });
}

void clear_out(const at::Tensor& x, double tau, at::Tensor out) {
  TORCH_CHECK(out.is_contiguous() && out.sizes() == x.sizes() && out.scalar_type() == x.scalar_type() &&
                  out.device().is_cpu(),
              "liepos_native::clear: out must be a contiguous CPU tensor of x's shape and dtype, got ", out.sizes(), " ",
              out.scalar_type(), " for x ", x.sizes(), " ", x.scalar_type());
  TORCH_CHECK(tau >= 0, "liepos_native::clear: tau must be at least 0, got ", tau);
  if (x.numel() == 0) return;
  switch (x.scalar_type()) {
    case at::kFloat: return clear_typed<float, float>(x, tau, out);
    case at::kDouble: return clear_typed<double, double>(x, tau, out);
    case at::kBFloat16: return clear_typed<c10::BFloat16, float>(x, tau, out);
    case at::kHalf: return clear_typed<c10::Half, float>(x, tau, out);
    default: TORCH_CHECK(false, "liepos_native::clear: unsupported dtype ", x.scalar_type());
  }
}

// clear_ in place: x with unit-stride rows and any other strides (no two rows overlapping: the caller's contract)
template <typename X, typename W>
void clear_inplace_typed(at::Tensor& x, double tau) {
  const Flat f = flat(x, "clear_");
  X* xp = x.mutable_data_ptr<X>();
  const W t = static_cast<W>(tau);
  const int64_t rows = x.numel() / std::max<int64_t>(1, f.D);
  at::parallel_for(0, rows, row_grain(f.D), [&](int64_t lo, int64_t hi) {
    f.runs(lo, hi, [&](int64_t at, int64_t, int64_t n) {
      X* xr = xp + at;
      for (int64_t d = 0; d < n * f.D; d++) {
        const W a = ld(xr[d]);
        if (a < t && -a < t) xr[d] = X(0);
      }
    });
  });
}

void clear_inplace(at::Tensor x, double tau) {
  TORCH_CHECK(tau >= 0, "liepos_native::clear_: tau must be at least 0, got ", tau);
  if (x.numel() == 0) return;
  switch (x.scalar_type()) {
    case at::kFloat: return clear_inplace_typed<float, float>(x, tau);
    case at::kDouble: return clear_inplace_typed<double, double>(x, tau);
    case at::kBFloat16: return clear_inplace_typed<c10::BFloat16, float>(x, tau);
    case at::kHalf: return clear_inplace_typed<c10::Half, float>(x, tau);
    default: TORCH_CHECK(false, "liepos_native::clear_: unsupported dtype ", x.scalar_type());
  }
}

// the largest |x| by its bit pattern (Bits: the sign bit cleared, ordered as the magnitudes are, above `inf`
// exactly for a NaN): one vectorised integer max
template <typename X>
double absmax_typed(const at::Tensor& x) {
  using B = Bits<X>;
  using U = typename B::type;
  static_assert(sizeof(U) == sizeof(X), "Bits: one unsigned integer per value");
  const Flat f = flat(x, "absmax");
  const X* xp = x.const_data_ptr<X>();
  const U big = at::parallel_reduce(
      0, x.numel() / std::max<int64_t>(1, f.D), row_grain(f.D), U(0),
      [&](int64_t lo, int64_t hi, U acc) {
        f.runs(lo, hi, [&](int64_t at, int64_t, int64_t n) {
          const U* xr = reinterpret_cast<const U*>(xp + at);
          U big = acc;
          for (int64_t d = 0; d < n * f.D; d++) big = std::max<U>(big, xr[d] & B::abs);
          acc = big;
        });
        return acc;
      },
      [](U a, U b) { return std::max(a, b); });
  if (big > B::inf) return std::numeric_limits<double>::quiet_NaN();
  X v;
  std::memcpy(&v, &big, sizeof(X));
  return static_cast<double>(ld(v));
}

// the reductions' dispatch on x's dtype: f(X{}) for X = float, double, BFloat16 or Half
template <typename F>
auto by_dtype(const at::Tensor& x, const char* op, const F& f) {
  switch (x.scalar_type()) {
    case at::kFloat: return f(float{});
    case at::kDouble: return f(double{});
    case at::kBFloat16: return f(c10::BFloat16{});
    case at::kHalf: return f(c10::Half{});
    default: TORCH_CHECK(false, "liepos_native::", op, ": unsupported dtype ", x.scalar_type());
  }
}

at::Tensor absmax(const at::Tensor& x) {
  const double m =
      x.numel() > 0 ? by_dtype(x, "absmax", [&](auto tag) { return absmax_typed<decltype(tag)>(x); }) : 0.0;
  return at::scalar_tensor(m, at::TensorOptions().dtype(at::kDouble));
}

// absrange: max |x| as absmax gives it, and the smallest magnitude of a nonzero entry (inf when there is none; a NaN
// is no magnitude), as one vectorised integer max and min over x's bits
template <typename X>
std::pair<double, double> absrange_typed(const at::Tensor& x) {
  using B = Bits<X>;
  using U = typename B::type;
  const Flat f = flat(x, "absrange");
  const X* xp = x.const_data_ptr<X>();
  using R = std::pair<U, U>;  // (largest magnitude bits, smallest nonzero magnitude bits)
  const R r = at::parallel_reduce(
      0, x.numel() / std::max<int64_t>(1, f.D), row_grain(f.D), R(U(0), std::numeric_limits<U>::max()),
      [&](int64_t lo, int64_t hi, R acc) {
        f.runs(lo, hi, [&](int64_t at, int64_t, int64_t n) {
          const U* xr = reinterpret_cast<const U*>(xp + at);
          U big = acc.first, below = acc.second;  // below: the smallest nonzero magnitude minus one
          for (int64_t d = 0; d < n * f.D; d++) {
            const U m = xr[d] & B::abs;
            big = std::max<U>(big, m);
            below = std::min<U>(below, U(m - 1));  // 0 wraps to the largest U: no magnitude (branch-free, vectorised)
          }
          acc = R(big, below);
        });
        return acc;
      },
      [](R a, R b) { return R(std::max(a.first, b.first), std::min(a.second, b.second)); });
  const auto value = [](U bits) {
    X v;
    std::memcpy(&v, &bits, sizeof(X));
    return static_cast<double>(ld(v));
  };
  const double big = r.first > B::inf ? std::numeric_limits<double>::quiet_NaN() : value(r.first);
  const double small = r.second >= B::inf ? std::numeric_limits<double>::infinity() : value(U(r.second + 1));
  return {big, small};
}

at::Tensor absrange(const at::Tensor& x) {
  const std::pair<double, double> m =
      x.numel() > 0 ? by_dtype(x, "absrange", [&](auto tag) { return absrange_typed<decltype(tag)>(x); })
                    : std::pair<double, double>{0.0, std::numeric_limits<double>::infinity()};
  at::Tensor out = at::empty({2}, at::TensorOptions().dtype(at::kDouble));
  out.mutable_data_ptr<double>()[0] = m.first;
  out.mutable_data_ptr<double>()[1] = m.second;
  return out;
}

// norms: ||x[r, :]|| of every row as float (double for double x), the squares summed in the work type in eight
// interleaved partial sums: one pass, half precision read as stored (no float copy of x)
template <typename X>
void norms_typed(const at::Tensor& x, at::Tensor& out) {
  using W = typename Work<X>::type;
  const Flat f = flat(x, "norms");
  const X* xp = x.const_data_ptr<X>();
  W* op = out.mutable_data_ptr<W>();
  const int64_t rows = x.numel() / std::max<int64_t>(1, f.D);
  at::parallel_for(0, rows, row_grain(f.D), [&](int64_t lo, int64_t hi) {
    f.runs(lo, hi, [&](int64_t at, int64_t r0, int64_t n) {
      for (int64_t i = 0; i < n; i++) {
        const X* xr = xp + at + i * f.D;
        W acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};  // eight partial sums: one vector of lanes, not one serial chain
        int64_t d = 0;
        for (; d + 8 <= f.D; d += 8)
          for (int j = 0; j < 8; j++) acc[j] += ld(xr[d + j]) * ld(xr[d + j]);
        for (; d < f.D; d++) acc[0] += ld(xr[d]) * ld(xr[d]);
        op[r0 + i] = std::sqrt(((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7])));
      }
    });
  });
}

at::Tensor norms(const at::Tensor& x) {
  (void)flat(x, "norms");
  const auto work = x.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
  at::Tensor out = at::empty({x.size(0), x.size(1), x.size(2)}, x.options().dtype(work));
  if (x.numel() == 0) return out.zero_();
  by_dtype(x, "norms", [&](auto tag) { norms_typed<decltype(tag)>(x, out); });
  return out;
}

// ------------------------------------------------------------------------------------------------ merge
// One tile's output o and log-sum-exp Li merged into the running (O, L) of the rows it holds, row by row:
// L' = log(e^L + e^Li), O' = O + w (o - O) with w = e^(Li - L') = 1 / (1 + e^(L - Li)); a row the tile gives no
// weight (Li = -inf) is left as it is, NaN propagates. first: the rows' first tile, O = o and L = Li. O and o are
// (N0, N1, N2, N3, D) with unit-stride rows and any other strides, L and Li (N0, N1, N2, N3); O and L in the work
// type (float, double), o in the work type or half precision (read as float).
template <typename X, typename W>
void merge_typed(at::Tensor& O, at::Tensor& L, const at::Tensor& o, const at::Tensor& Li, bool first) {
  const int64_t n1 = O.size(1), n2 = O.size(2), n3 = O.size(3), D = O.size(4);
  const int64_t rows = O.size(0) * n1 * n2 * n3;
  W* Op = O.mutable_data_ptr<W>();
  W* Lp = L.mutable_data_ptr<W>();
  const X* op = o.const_data_ptr<X>();
  const W* lp = Li.const_data_ptr<W>();
  struct Strides {
    int64_t s0, s1, s2, s3;
  };
  const auto strides = [](const at::Tensor& t) { return Strides{t.stride(0), t.stride(1), t.stride(2), t.stride(3)}; };
  const Strides sO = strides(O), so = strides(o), sL = strides(L), sl = strides(Li);
  constexpr W kNegInf = -std::numeric_limits<W>::infinity();
  at::parallel_for(0, rows, row_grain(D), [&](int64_t lo, int64_t hi) {
    // a task's rows as runs along the last row axis (n3): the index arithmetic once per run, then strides
    for (int64_t r = lo; r < hi;) {
      const int64_t run = r / n3, i3 = r % n3, n = std::min(hi - r, n3 - i3);
      const int64_t i0 = run / (n1 * n2), i1 = run / n2 % n1, i2 = run % n2;
      const auto at = [&](const Strides& t) { return i0 * t.s0 + i1 * t.s1 + i2 * t.s2 + i3 * t.s3; };
      W* Or = Op + at(sO);
      const X* orow = op + at(so);
      W* lr = Lp + at(sL);
      const W* lir = lp + at(sl);
      for (int64_t j = 0; j < n; j++, Or += sO.s3, orow += so.s3, lr += sL.s3, lir += sl.s3) {
        W* __restrict__ Ow = Or;
        const X* __restrict__ ow = orow;
        const W li = *lir;
        if (first) {
          for (int64_t d = 0; d < D; d++) Ow[d] = ld(ow[d]);
          *lr = li;
          continue;
        }
        if (li == kNegInf) continue;
        // one exponential: e = e^(-|L - Li|), w = e^(Li - L') = 1 / (1 + e^(L - Li)) (L < Li) or e / (1 + e),
        // L' = max(L, Li) + log1p(e); L = -inf gives w = 1, L' = Li; a NaN propagates to w, L' and the row
        const W l = *lr, gap = l - li;
        const W e = std::exp(-std::abs(gap));
        const W w = (gap > W(0) ? e : W(1)) / (W(1) + e);
        *lr = std::max(l, li) + std::log1p(e);
#pragma GCC ivdep
        for (int64_t d = 0; d < D; d++) Ow[d] += w * (ld(ow[d]) - Ow[d]);
      }
      r += n;
    }
  });
}

void merge(at::Tensor O, at::Tensor L, const at::Tensor& o, const at::Tensor& Li, bool first) {
  TORCH_CHECK(O.dim() == 5 && o.sizes() == O.sizes() && L.dim() == 4 && Li.sizes() == L.sizes() &&
                  L.sizes() == O.sizes().slice(0, 4) && O.stride(4) == 1 && o.stride(4) == 1,
              "liepos_native::merge: O and o must be (N0, N1, N2, N3, D) with unit-stride rows, L and Li (N0, N1, N2, "
              "N3), got O ", O.sizes(), " o ", o.sizes(), " L ", L.sizes(), " Li ", Li.sizes());
  TORCH_CHECK(L.scalar_type() == O.scalar_type() && Li.scalar_type() == O.scalar_type() &&
                  (O.scalar_type() == at::kFloat || O.scalar_type() == at::kDouble),
              "liepos_native::merge: O, L and Li must share a work type (float or double), got ", O.scalar_type(), ", ",
              L.scalar_type(), ", ", Li.scalar_type());
  TORCH_CHECK(O.device().is_cpu() && o.device().is_cpu() && L.device().is_cpu() && Li.device().is_cpu(),
              "liepos_native::merge: CPU tensors only");
  if (O.numel() == 0) return;
  if (O.scalar_type() == at::kDouble) {
    TORCH_CHECK(o.scalar_type() == at::kDouble, "liepos_native::merge: o must be double for a double O, got ",
                o.scalar_type());
    return merge_typed<double, double>(O, L, o, Li, first);
  }
  switch (o.scalar_type()) {
    case at::kFloat: return merge_typed<float, float>(O, L, o, Li, first);
    case at::kBFloat16: return merge_typed<c10::BFloat16, float>(O, L, o, Li, first);
    case at::kHalf: return merge_typed<c10::Half, float>(O, L, o, Li, first);
    default: TORCH_CHECK(false, "liepos_native::merge: unsupported dtype of o ", o.scalar_type());
  }
}

// ------------------------------------------------------------------------------------------------ denormals
// The flush-to-zero and denormals-are-zero bits of the SSE control register (x86) on the calling thread and every
// thread of torch's intra-op pool: set while liepos's own flash calls run (their probabilities e^(s - L) of far,
// biased keys fall into the subnormal range, where an x86 core takes a microcode assist per operation) and put back
// after. denormals(flush) returns each thread's previous bits (index i: the i-th task of a parallel_for over the
// pool, which the restore repeats); restore_denormals(prev) puts them back. Elsewhere both do nothing (an empty
// tensor: no such control register here).
#if defined(__x86_64__) || defined(_M_X64)
constexpr unsigned kDenormalBits = 0x8040u;  // FTZ (bit 15) | DAZ (bit 6)
#endif

at::Tensor denormals(bool flush) {
#if defined(__x86_64__) || defined(_M_X64)
  const int64_t n = at::get_num_threads();
  at::Tensor prev = at::empty({n}, at::TensorOptions().dtype(at::kInt));
  int32_t* pp = prev.mutable_data_ptr<int32_t>();
  std::fill(pp, pp + n, 0);
  at::parallel_for(0, n, 1, [&](int64_t lo, int64_t hi) {
    for (int64_t i = lo; i < hi; i++) {
      const unsigned csr = _mm_getcsr();
      pp[i] = static_cast<int32_t>(csr & kDenormalBits);
      _mm_setcsr(flush ? (csr | kDenormalBits) : (csr & ~kDenormalBits));
    }
  });
  return prev;
#else
  (void)flush;
  return at::empty({0}, at::TensorOptions().dtype(at::kInt));
#endif
}

void restore_denormals(const at::Tensor& prev) {
#if defined(__x86_64__) || defined(_M_X64)
  TORCH_CHECK(prev.scalar_type() == at::kInt && prev.dim() == 1 && prev.is_contiguous(),
              "liepos_native::restore_denormals: prev must be the int32 vector denormals returned");
  const int64_t n = prev.numel();
  if (n == 0) return;
  const int32_t* pp = prev.const_data_ptr<int32_t>();
  at::parallel_for(0, n, 1, [&](int64_t lo, int64_t hi) {
    for (int64_t i = lo; i < hi; i++)
      _mm_setcsr((_mm_getcsr() & ~kDenormalBits) | (static_cast<unsigned>(pp[i]) & kDenormalBits));
  });
#else
  (void)prev;
#endif
}

}  // namespace

TORCH_LIBRARY(liepos_native, m) {
  m.def("terms(Tensor x, Tensor t, int[] offsets, Tensor masks, int tile, Tensor(a!) out, float tau=0.0) -> ()");
  m.def("terms_(Tensor(a!) x, Tensor t, int[] offsets, Tensor masks, int tile) -> ()");
  m.def("halves(Tensor x, Tensor c, Tensor s, int tile, Tensor(a!) out, bool stream=False) -> ()");
  m.def("halves_streams(Tensor x, Tensor out) -> bool");
  m.def("halves_(Tensor(a!) x, Tensor c, Tensor s, int tile) -> ()");
  m.def("scale(Tensor x, Tensor t, int tile, Tensor(a!) out, float tau=0.0) -> ()");
  m.def("planes(Tensor x, Tensor t, bool conj, int tile, Tensor(a!) out, float tau=0.0) -> ()");
  m.def("clear(Tensor x, float tau, Tensor(a!) out) -> ()");
  m.def("clear_(Tensor(a!) x, float tau) -> ()");
  m.def("absmax(Tensor x) -> Tensor");
  m.def("absrange(Tensor x) -> Tensor");
  m.def("norms(Tensor x) -> Tensor");
  m.def("merge(Tensor(a!) O, Tensor(b!) L, Tensor o, Tensor Li, bool first) -> ()");
  m.def("denormals(bool flush) -> Tensor");
  m.def("restore_denormals(Tensor prev) -> ()");
}

TORCH_LIBRARY_IMPL(liepos_native, CPU, m) {  // terms and terms_: native_terms.cpp
  m.impl("halves", &halves_out);
  m.impl("halves_streams", &halves_streams);
  m.impl("halves_", &halves_inplace);
  m.impl("scale", &scale_out);
  m.impl("planes", &planes_out);
  m.impl("clear", &clear_out);
  m.impl("clear_", &clear_inplace);
  m.impl("absmax", &absmax);
  m.impl("absrange", &absrange);
  m.impl("norms", &norms);
  m.impl("merge", &merge);
}

// the control register belongs to no tensor: registered for every dispatch key
TORCH_LIBRARY_IMPL(liepos_native, CompositeExplicitAutograd, m) {
  m.impl("denormals", &denormals);
  m.impl("restore_denormals", &restore_denormals);
}
