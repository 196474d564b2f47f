// The native CPU kernels of liepos._kernels, registered as torch.library ops (namespace liepos_native) and
// built once per machine by torch.utils.cpp_extension. Rows run in parallel on torch's own intra-op pool
// (at::parallel_for); the library links no OpenMP runtime of its own.
//
//   terms(x, t, offsets, masks, tile, out):  out[d] = sum_j [masks[j][d]] t[j][d] * x[d + offsets[j]]
//   halves(x, c, s, tile, out):              out[k] = c x[k] - s x[k+P],  out[k+P] = s x[k] + c x[k+P]
//
// and their in-place forms terms_ / halves_ (out is x). x is (B, H, S, D) with any strides but the last, the
// tables are in the work type (float, or double for double x) with stride 0 on broadcast axes. bfloat16 and
// float16 are computed in float in registers and rounded as torch rounds (to nearest even).
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>
#include <torch/library.h>

#include <cstdint>
#include <cstring>
#include <vector>

namespace {

constexpr int64_t kMaxWidth = 4096;  // a row is kept on the stack
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

template <typename X> struct Work { using type = float; };
template <> struct Work<double> { using type = double; };

int64_t stride_or_zero(const at::Tensor& t, int64_t i) { return t.size(i) > 1 ? t.stride(i) : 0; }

// rows in tiles of `tile` positions, every head of a tile before the next: a table row shared by the heads is
// read from memory once and from L1/L2 by the others (tile = S: head after head). body(b, h, s) per row.
template <typename F>
void tiled_rows(int64_t B, int64_t H, int64_t S, int64_t D, int64_t tile, const F& body) {
  tile = std::max<int64_t>(1, std::min(tile, std::max<int64_t>(S, 1)));
  const int64_t tiles = (S + tile - 1) / tile;
  const int64_t items = B * tiles * H;
  const int64_t grain = std::max<int64_t>(1, kGrainElems / std::max<int64_t>(1, tile * D));
  at::parallel_for(0, items, grain, [&](int64_t lo, int64_t hi) {
    for (int64_t i = lo; i < hi; i++) {
      const int64_t h = i % H, s0 = (i / H) % tiles * tile, b = i / (H * tiles);
      const int64_t s1 = std::min(S, s0 + tile);
      for (int64_t s = s0; s < s1; s++) body(b, h, s);
    }
  });
}

void check_rows(const at::Tensor& x, const at::Tensor& out, int64_t width) {
  TORCH_CHECK(x.dim() == 4 && out.sizes() == x.sizes(), "liepos_native: x and out must be 4-D of one shape, got ",
              x.sizes(), " and ", out.sizes());
  TORCH_CHECK(out.scalar_type() == x.scalar_type(), "liepos_native: out must be of x's dtype ", x.scalar_type(),
              ", got ", out.scalar_type());
  TORCH_CHECK(x.stride(3) == 1 && out.stride(3) == 1, "liepos_native: the last axis of x and out must be contiguous");
  TORCH_CHECK(width <= kMaxWidth, "liepos_native: width ", width, " above ", kMaxWidth);
  TORCH_CHECK(x.device().is_cpu() && out.device().is_cpu(), "liepos_native: CPU tensors only");
}

// ------------------------------------------------------------------------------------------------ terms
// x is copied into a zero-padded row first, so out may be x (in place) and no read leaves the row; each column
// is accumulated in the work type by fused multiply-adds (one rounding per term; a masked lane keeps the sum)
// one row, a function of its own so that its pointers are restrict-qualified parameters (GCC honours restrict on
// parameters) and every constant a value in a register: the column loop vectorises as with compile-time constants
template <typename X, typename W, int64_t J>
__attribute__((noinline)) void terms_row(const X* __restrict__ xr, X* __restrict__ yr, const W* __restrict__ tr,
                                         int64_t tj, const int64_t* __restrict__ off, const uint8_t* __restrict__ mask,
                                         int64_t nj, int64_t D, int64_t pl, int64_t pr) {
  const int64_t n = J > 0 ? J : nj;
  W row[3 * kMaxWidth];
  W* __restrict__ xpad = row + pl;
  int64_t o[J > 0 ? J : 1];
  if (J > 0)
    for (int64_t j = 0; j < n; j++) o[j] = off[j];
  for (int64_t d = -pl; d < 0; d++) xpad[d] = 0;
  for (int64_t d = 0; d <= pr; d++) xpad[D + d] = 0;
  for (int64_t d = 0; d < D; d++) xpad[d] = ld(xr[d]);
  for (int64_t d = 0; d < D; d++) {
    W acc = 0;
#pragma GCC unroll 16
    for (int64_t j = 0; j < n; j++) {
      W v = acc + tr[j * tj + d] * xpad[d + (J > 0 ? o[j] : off[j])];
      acc = mask[j * D + d] ? v : acc;
    }
    st(yr[d], acc);
  }
}

template <typename X, int64_t J>
void terms_rows(const at::Tensor& x, const at::Tensor& t, const int64_t* off, const uint8_t* mask, int64_t nj,
                int64_t tile, at::Tensor& out) {
  using W = typename Work<X>::type;
  const int64_t B = x.size(0), H = x.size(1), S = x.size(2), D = x.size(3);
  int64_t pl = 0, pr = 0;
  for (int64_t j = 0; j < nj; j++) {
    pl = std::max(pl, -off[j]);
    pr = std::max(pr, off[j]);
  }
  TORCH_CHECK(pl + D + pr + 1 <= 3 * kMaxWidth, "liepos_native: offsets reach too far");
  const X* xp = x.const_data_ptr<X>();
  X* yp = out.mutable_data_ptr<X>();
  const W* tp = t.const_data_ptr<W>();
  const int64_t xb = stride_or_zero(x, 0), xh = stride_or_zero(x, 1), xs = stride_or_zero(x, 2);
  const int64_t yb = stride_or_zero(out, 0), yh = stride_or_zero(out, 1), ys = stride_or_zero(out, 2);
  const int64_t tb = stride_or_zero(t, 0), th = stride_or_zero(t, 1), ts = stride_or_zero(t, 2), tj = t.stride(3);
  tiled_rows(B, H, S, D, tile, [&](int64_t b, int64_t h, int64_t s) {
    terms_row<X, W, J>(xp + b * xb + h * xh + s * xs, yp + b * yb + h * yh + s * ys, tp + b * tb + h * th + s * ts,
                       tj, off, mask, nj, D, pl, pr);
  });
}

template <typename X>
void terms_typed(const at::Tensor& x, const at::Tensor& t, const int64_t* off, const uint8_t* mask, int64_t nj,
                 int64_t tile, at::Tensor& out) {
  switch (nj) {  // the common term counts with a constant trip count
    case 2: return terms_rows<X, 2>(x, t, off, mask, nj, tile, out);
    case 3: return terms_rows<X, 3>(x, t, off, mask, nj, tile, out);
    case 4: return terms_rows<X, 4>(x, t, off, mask, nj, tile, out);
    default: return terms_rows<X, 0>(x, t, off, mask, nj, tile, out);
  }
}

void terms_impl(const at::Tensor& x, const at::Tensor& t, at::IntArrayRef offsets, const at::Tensor& masks,
                int64_t tile, at::Tensor& out) {
  check_rows(x, out, x.size(3));
  const int64_t J = static_cast<int64_t>(offsets.size()), D = x.size(3);
  const auto work = x.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
  TORCH_CHECK(t.dim() == 5 && t.size(0) == x.size(0) && t.size(1) == x.size(1) && t.size(2) == x.size(2) &&
                  t.size(3) == J && t.size(4) == D && t.stride(4) == 1 && t.scalar_type() == work,
              "liepos_native::terms: tables ", t.sizes(), " of ", t.scalar_type(), " do not match x ", x.sizes(),
              " and ", J, " offsets (want (B, H, S, J, D) of ", work, ", last axis contiguous)");
  TORCH_CHECK(masks.scalar_type() == at::kByte && masks.is_contiguous() && masks.dim() == 2 && masks.size(0) == J &&
                  masks.size(1) == D,
              "liepos_native::terms: masks must be a contiguous uint8 (", J, ", ", D, ") tensor, got ", masks.sizes());
  const int64_t* off = offsets.data();
  const uint8_t* mask = masks.const_data_ptr<uint8_t>();
  switch (x.scalar_type()) {
    case at::kFloat: return terms_typed<float>(x, t, off, mask, J, tile, out);
    case at::kDouble: return terms_typed<double>(x, t, off, mask, J, tile, out);
    case at::kBFloat16: return terms_typed<c10::BFloat16>(x, t, off, mask, J, tile, out);
    case at::kHalf: return terms_typed<c10::Half>(x, t, off, mask, J, tile, out);
    default: TORCH_CHECK(false, "liepos_native::terms: unsupported dtype ", x.scalar_type());
  }
}

void terms_out(const at::Tensor& x, const at::Tensor& t, at::IntArrayRef offsets, const at::Tensor& masks,
               int64_t tile, at::Tensor out) {
  terms_impl(x, t, offsets, masks, tile, out);
}

void terms_inplace(at::Tensor x, const at::Tensor& t, at::IntArrayRef offsets, const at::Tensor& masks,
                   int64_t tile) {
  terms_impl(x, t, offsets, masks, tile, x);
}

// ------------------------------------------------------------------------------------------------ halves
// iteration k reads and writes only k and k + P, so the loop has no carried dependence even when out is x
template <typename X, typename W, int64_t PC>
__attribute__((noinline)) void halves_row(const X* xr, X* yr, const W* __restrict__ cr, const W* __restrict__ sr,
                                          int64_t pn) {
  const int64_t P = PC > 0 ? PC : pn;
#pragma GCC ivdep
  for (int64_t k = 0; k < P; k++) {
    W x0 = ld(xr[k]), x1 = ld(xr[k + P]);
    st(yr[k], cr[k] * x0 - sr[k] * x1);
    st(yr[k + P], sr[k] * x0 + cr[k] * x1);
  }
}

template <typename X, int64_t PC>
void halves_rows(const at::Tensor& x, const at::Tensor& c, const at::Tensor& sn, int64_t tile, at::Tensor& out) {
  using W = typename Work<X>::type;
  const int64_t B = x.size(0), H = x.size(1), S = x.size(2), P = x.size(3) / 2;
  const X* xp = x.const_data_ptr<X>();
  X* yp = out.mutable_data_ptr<X>();
  const W* cp = c.const_data_ptr<W>();
  const W* sp = sn.const_data_ptr<W>();
  const int64_t xb = stride_or_zero(x, 0), xh = stride_or_zero(x, 1), xs = stride_or_zero(x, 2);
  const int64_t yb = stride_or_zero(out, 0), yh = stride_or_zero(out, 1), ys = stride_or_zero(out, 2);
  const int64_t tb = stride_or_zero(c, 0), th = stride_or_zero(c, 1), ts = stride_or_zero(c, 2);
  tiled_rows(B, H, S, 2 * P, tile, [&](int64_t b, int64_t h, int64_t s) {
    const int64_t to = b * tb + h * th + s * ts;
    halves_row<X, W, PC>(xp + b * xb + h * xh + s * xs, yp + b * yb + h * yh + s * ys, cp + to, sp + to, P);
  });
}

template <typename X>
void halves_typed(const at::Tensor& x, const at::Tensor& c, const at::Tensor& sn, int64_t tile, at::Tensor& out) {
  switch (x.size(3) / 2) {  // the common widths with a constant trip count
    case 16: return halves_rows<X, 16>(x, c, sn, tile, out);
    case 32: return halves_rows<X, 32>(x, c, sn, tile, out);
    case 64: return halves_rows<X, 64>(x, c, sn, tile, out);
    default: return halves_rows<X, 0>(x, c, sn, tile, out);
  }
}

void halves_impl(const at::Tensor& x, const at::Tensor& c, const at::Tensor& sn, int64_t tile, at::Tensor& out) {
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
  switch (x.scalar_type()) {
    case at::kFloat: return halves_typed<float>(x, c, sn, tile, out);
    case at::kDouble: return halves_typed<double>(x, c, sn, tile, out);
    case at::kBFloat16: return halves_typed<c10::BFloat16>(x, c, sn, tile, out);
    case at::kHalf: return halves_typed<c10::Half>(x, c, sn, tile, out);
    default: TORCH_CHECK(false, "liepos_native::halves: unsupported dtype ", x.scalar_type());
  }
}

void halves_out(const at::Tensor& x, const at::Tensor& c, const at::Tensor& sn, int64_t tile, at::Tensor out) {
  halves_impl(x, c, sn, tile, out);
}

void halves_inplace(at::Tensor x, const at::Tensor& c, const at::Tensor& sn, int64_t tile) {
  halves_impl(x, c, sn, tile, x);
}

}  // namespace

TORCH_LIBRARY(liepos_native, m) {
  m.def("terms(Tensor x, Tensor t, int[] offsets, Tensor masks, int tile, Tensor(a!) out) -> ()");
  m.def("terms_(Tensor(a!) x, Tensor t, int[] offsets, Tensor masks, int tile) -> ()");
  m.def("halves(Tensor x, Tensor c, Tensor s, int tile, Tensor(a!) out) -> ()");
  m.def("halves_(Tensor(a!) x, Tensor c, Tensor s, int tile) -> ()");
}

TORCH_LIBRARY_IMPL(liepos_native, CPU, m) {
  m.impl("terms", &terms_out);
  m.impl("terms_", &terms_inplace);
  m.impl("halves", &halves_out);
  m.impl("halves_", &halves_inplace);
}
