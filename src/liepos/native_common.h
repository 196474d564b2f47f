// Shared by the native CPU kernels' sources (native_kernels.cpp, native_terms.cpp): loads and stores in the work
// type, the rows of a (B, H, S, D) tensor in tiles of positions split over torch's intra-op threads, the
// checks every op makes. Each source includes it into its own anonymous namespace.
#pragma once

#include <ATen/Parallel.h>
#include <ATen/Functions.h>
#include <ATen/core/Tensor.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#if defined(__AVX__) && defined(__FMA__)
#include <immintrin.h>
#endif
#if defined(__linux__)
#include <sys/mman.h>
#include <unistd.h>
#endif
#include <limits>
#include <type_traits>
#include <utility>
#include <vector>
#if defined(__x86_64__) || defined(_M_X64)
#include <xmmintrin.h>
#endif

namespace {

constexpr int64_t kMaxWidth = 4096;  // the widest row taken
constexpr int64_t kGrainElems = 32768;  // at least this many elements of x per task

// loads and stores: half precision as float, rounded to nearest even (NaN -> quiet NaN), as torch does
inline float ld(c10::BFloat16 v) {
  uint32_t u = static_cast<uint32_t>(v.x) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
inline void st(c10::BFloat16& out, float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  out.x = (u & 0x7fffffffu) > 0x7f800000u ? uint16_t(0x7fc0) : uint16_t((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}
#if defined(__FLT16_MAX__)
inline float ld(c10::Half v) {
  _Float16 h;
  std::memcpy(&h, &v.x, 2);
  return static_cast<float>(h);
}
inline void st(c10::Half& out, float f) {
  _Float16 h = static_cast<_Float16>(f);
  std::memcpy(&out.x, &h, 2);
}
#else
inline float ld(c10::Half v) { return static_cast<float>(v); }
inline void st(c10::Half& out, float f) { out = c10::Half(f); }
#endif
inline float ld(float v) { return v; }
inline void st(float& out, float f) { out = f; }
inline double ld(double v) { return v; }
inline void st(double& out, double f) { out = f; }

// bfloat16 rows sixteen at a time where the CPU converts float to bfloat16 itself (AVX512-BF16): the conversion
// instruction rounds to nearest even as st does, but reads a subnormal float as 0 and keeps a NaN's sign and payload,
// so the lanes holding either are rounded by st's formula instead (torch's bits, NaN as 0x7fc0). Elsewhere (and for
// the other dtypes) the kernels' plain loops, which the compiler vectorises with that formula in every lane.
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__) && defined(__AVX512BF16__)
#define LIEPOS_BF16_LANES 1
inline __mmask16 lanes(int64_t n) { return n >= 16 ? __mmask16(0xffff) : __mmask16((1u << n) - 1u); }
inline __m512 ld16(const c10::BFloat16* p, __mmask16 m) {  // exact: a bfloat16 is the top half of its float
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, p)), 16));
}
inline __m256i round16(__m512 y) {  // the bits st writes, lane by lane
  const __m512i u = _mm512_castps_si512(y);
  const __m512i mag = _mm512_and_si512(u, _mm512_set1_epi32(0x7fffffff));
  const __mmask16 nan = _mm512_cmpgt_epu32_mask(mag, _mm512_set1_epi32(0x7f800000));
  const __mmask16 sub = _mm512_cmplt_epu32_mask(mag, _mm512_set1_epi32(0x00800000)) &
                        _mm512_cmpneq_epi32_mask(mag, _mm512_setzero_si512());
  __m256i r;
  const __m256bh h = _mm512_cvtneps_pbh(y);
  std::memcpy(&r, &h, sizeof(r));
  if (sub) {  // u + 0x7fff + ((u >> 16) & 1), its top half
    const __m512i odd = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
    const __m512i up = _mm512_add_epi32(_mm512_add_epi32(u, _mm512_set1_epi32(0x7fff)), odd);
    r = _mm256_mask_mov_epi16(r, sub, _mm512_cvtepi32_epi16(_mm512_srli_epi32(up, 16)));
  }
  return _mm256_mask_mov_epi16(r, nan, _mm256_set1_epi16(0x7fc0));
}
// y rounded to bfloat16 and stored in the lanes of m; CLEAR: +0 where the stored magnitude bits are below `bits`
template <bool CLEAR> inline void st16(c10::BFloat16* p, __m512 y, __mmask16 m, uint16_t bits) {
  __m256i r = round16(y);
  if constexpr (CLEAR) {
    const __m256i mag = _mm256_and_si256(r, _mm256_set1_epi16(0x7fff));
    r = _mm256_maskz_mov_epi16(_mm256_cmpge_epu16_mask(mag, _mm256_set1_epi16(static_cast<short>(bits))), r);
  }
  _mm256_mask_storeu_epi16(p, m, r);
}
#endif

template <typename X> struct Work { using type = float; using mask = int32_t; };
template <> struct Work<double> { using type = double; using mask = int64_t; };

// clearing (scale, planes and terms clear their outputs in their own pass: a value rounded to X below tau in
// magnitude is stored as +0, NaN kept). The threshold as X's magnitude bits for half precision: the smallest pattern
// whose value is at least tau, so |v| < tau exactly when (bits(v) & 0x7fff) is below it (v not NaN: a NaN's bits
// lie above every finite tau's)
template <typename X> uint16_t cut_bits(float tau) {
  if (!(tau > 0)) return 0;
  const auto value = [](uint16_t b) {
    X y;
    y.x = b;
    return ld(y);
  };
  X h;
  st(h, tau);
  uint16_t t = h.x & 0x7fff;  // the nearest; then the exact boundary (at most the pattern of inf, >= every tau)
  while (value(t) < tau) t++;
  while (t > 0 && value(t - 1) >= tau) t--;
  return t;
}
template <typename X, typename W> struct Cut {  // clear's comparison, in the work type or on half bits
  W tau;
  uint16_t bits;
};
template <typename X, typename W> Cut<X, W> make_cut(double tau) {
  const W t = static_cast<W>(tau);  // compared in the work type, as clear compares
  if constexpr (std::is_same_v<X, W>) {
    return {t, 0};
  } else {
    return {t, cut_bits<X>(t)};
  }
}
// an output stored in X, cleared as clear_ clears it: +0 where its magnitude is below the cut's tau (NaN kept);
// half precision rounded once, then its magnitude bits compared
template <typename X, typename W> inline void clear_stored(X& y, const Cut<X, W>& cut) {
  if constexpr (std::is_same_v<X, W>) {
    y = std::abs(y) < cut.tau ? X(0) : y;
  } else {
    y.x = (y.x & 0x7fff) < cut.bits ? uint16_t(0) : y.x;
  }
}
template <bool CLEAR, typename X, typename W> inline void st_clear(X& out, W f, const Cut<X, W>& cut) {
  st(out, f);
  if constexpr (CLEAR) clear_stored(out, cut);
}

inline int64_t stride_or_zero(const at::Tensor& t, int64_t i) { return t.size(i) > 1 ? t.stride(i) : 0; }

// rows in tiles of `tile` positions, every head of a tile before the next: a table row shared by the heads is
// read from memory once and from L1/L2 by the others (tile = S: head after head). The items (b, tile, h) are
// split over torch's intra-op threads; each task runs its items [lo, hi) in one call of a kernel's chunk function.
struct Rows {
  int64_t H, S, tiles, tile;
  int64_t xb, xh, xs, yb, yh, ys, tb, th, ts;  // strides (0 on a broadcast axis) of x, out and the tables
};

// the rows of items [lo, hi): (x offset, out offset, table offset) of each, in order
#define FOR_ROWS(g, lo, hi, xo, yo, to)                                                                        \
  for (int64_t i_ = (lo); i_ < (hi); i_++)                                                                       \
    for (int64_t h_ = i_ % (g).H, s0_ = (i_ / (g).H) % (g).tiles * (g).tile, b_ = i_ / ((g).H * (g).tiles),       \
                 s_ = s0_, s1_ = std::min((g).S, s0_ + (g).tile);                                                \
         s_ < s1_; s_++)                                                                                         \
      if (const int64_t xo = b_ * (g).xb + h_ * (g).xh + s_ * (g).xs, yo = b_ * (g).yb + h_ * (g).yh + s_ * (g).ys, \
          to = b_ * (g).tb + h_ * (g).th + s_ * (g).ts;                                                          \
          true)

template <typename F>
void tiled_rows(const at::Tensor& x, const at::Tensor& out, const at::Tensor& table, int64_t tile, const F& chunk) {
  const int64_t B = x.size(0), H = x.size(1), S = x.size(2), D = x.size(3);
  tile = std::max<int64_t>(1, std::min(tile, std::max<int64_t>(S, 1)));
  const Rows g{H, S, (S + tile - 1) / tile, tile,
               stride_or_zero(x, 0), stride_or_zero(x, 1), stride_or_zero(x, 2),
               stride_or_zero(out, 0), stride_or_zero(out, 1), stride_or_zero(out, 2),
               stride_or_zero(table, 0), stride_or_zero(table, 1), stride_or_zero(table, 2)};
  const int64_t grain = std::max<int64_t>(1, kGrainElems / std::max<int64_t>(1, tile * D));
  at::parallel_for(0, B * g.tiles * H, grain, [&](int64_t lo, int64_t hi) { chunk(g, lo, hi); });
}

inline void check_rows(const at::Tensor& x, const at::Tensor& out, int64_t width) {
  TORCH_CHECK(x.dim() == 4 && out.sizes() == x.sizes(), "liepos_native: x and out must be 4-D of one shape, got ",
              x.sizes(), " and ", out.sizes());
  TORCH_CHECK(out.scalar_type() == x.scalar_type(), "liepos_native: out must be of x's dtype ", x.scalar_type(),
              ", got ", out.scalar_type());
  TORCH_CHECK(x.stride(3) == 1 && out.stride(3) == 1, "liepos_native: the last axis of x and out must be contiguous");
  TORCH_CHECK(width <= kMaxWidth, "liepos_native: width ", width, " above ", kMaxWidth);
  TORCH_CHECK(x.device().is_cpu() && out.device().is_cpu(), "liepos_native: CPU tensors only");
}


// |v| as an integer (the sign bit cleared): at least `inf` exactly when v is an inf or a NaN
template <typename W> struct Bits {
  using type = uint32_t;
  static constexpr uint32_t abs = 0x7fffffffu, inf = 0x7f800000u;
};
template <> struct Bits<double> {
  using type = uint64_t;
  static constexpr uint64_t abs = 0x7fffffffffffffffull, inf = 0x7ff0000000000000ull;
};
template <> struct Bits<c10::BFloat16> {  // half precision by its own bits (absmax reads x as stored)
  using type = uint16_t;
  static constexpr uint16_t abs = 0x7fff, inf = 0x7f80;
};
template <> struct Bits<c10::Half> {
  using type = uint16_t;
  static constexpr uint16_t abs = 0x7fff, inf = 0x7c00;
};

}  // namespace
