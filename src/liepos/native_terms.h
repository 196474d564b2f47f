// The Jordan terms kernel's templates (liepos_native::terms), shared by native_terms.cpp (float, double, the
// dispatch and the registration) and native_terms_half.cpp (bfloat16, float16): two sources the build compiles
// side by side, their instantiations being most of the library's build time.
#pragma once
#include "native_common.h"

namespace {

constexpr int64_t kRowwiseAboveBytes = 16 << 20;  // the terms in place row at a time above this size of x

// ------------------------------------------------------------------------------------------------ terms
// A row of x is copied into a scratch row of its task first (zero-padded on both sides once per task), so out may
// be x (in place) and no read leaves the row. Each column is accumulated in the work type by fused multiply-adds, one rounding per term.
//
// The tables are zero where a term does not exist (the op's contract), so a row of finite x takes every term
// without a test: adding 0 * x leaves the sum as it is. A row holding an inf or a NaN takes the masks (a masked
// lane keeps the sum), so a non-finite value never reaches a column whose terms do not read it (0 * inf = NaN).
//
// Compile-time structure where it is common: the offsets of the Jordan blocks of size 2 and 3 (query: 0, -1, -2;
// key: 0, 1, 2), alone or beside interleaved rotation planes (±1), as constants (O); the widths 64 and 128 (DC);
// the tables' term stride equal to the width (the tables of one position contiguous, as liepos builds them). Then
// every read of a row is at a constant displacement and the loops have constant trip counts. Other offsets take
// the term count (2-4) as a constant, or nothing.
template <int64_t... V> struct Offsets {
  static constexpr int64_t J = sizeof...(V);  // the offsets V as constants
  static constexpr int64_t v[J > 0 ? J : 1] = {V...};
};
template <int64_t N> struct Terms {  // N terms at run-time offsets (N = 0: the count at run time too)
  static constexpr int64_t J = -N;
  static constexpr int64_t v[1] = {0};
};


// a row of x into the scratch row xpad, in the work type; returns the largest |x| of the row as an integer, at
// least Bits::inf when the row holds an inf or a NaN
template <typename X, typename W, int64_t DC>
inline __attribute__((always_inline)) typename Bits<W>::type copy_row(const X* xr, int64_t dn, W* __restrict__ xpad) {
  using U = typename Bits<W>::type;
  const int64_t D = DC > 0 ? DC : dn;
  U big = 0;
  for (int64_t d = 0; d < D; d++) {
    const W v = ld(xr[d]);
    U u;
    std::memcpy(&u, &v, sizeof(W));
    big = std::max<U>(big, u & Bits<W>::abs);
    xpad[d] = v;
  }
  return big;
}

template <typename X, typename W, typename M, typename O, int64_t DC, bool TD>
inline __attribute__((always_inline)) void sum_row(const W* __restrict__ xpad, typename Bits<W>::type big, X* yr,
                                                   const W* __restrict__ tr, int64_t tj, const int64_t* __restrict__ o,
                                                   const M* __restrict__ mask, int64_t nj, int64_t dn,
                                                   const Cut<X, W>& cut, bool clear) {
  constexpr bool known = O::J > 0;  // the offsets are constants
  const int64_t n = known ? O::J : (O::J < 0 ? -O::J : nj), D = DC > 0 ? DC : dn, ts = TD ? D : tj;
  if (big < Bits<W>::inf) {
#pragma GCC unroll 4
    for (int64_t d = 0; d < D; d++) {
      W acc = 0;
#pragma GCC unroll 16
      for (int64_t j = 0; j < n; j++) acc += tr[j * ts + d] * xpad[d + (known ? O::v[j] : o[j])];
      st(yr[d], acc);
    }
    if (clear)  // the row just stored, still in L1: a loop of its own keeps the sums' loop as it was
      for (int64_t d = 0; d < D; d++) clear_stored(yr[d], cut);
    return;
  }
  for (int64_t d = 0; d < D; d++) {
    W acc = 0;
#pragma GCC unroll 16
    for (int64_t j = 0; j < n; j++) {
      W v = acc + tr[j * ts + d] * xpad[d + (known ? O::v[j] : o[j])];
      acc = mask[j * D + d] ? v : acc;
    }
    st(yr[d], acc);
  }
  if (clear)
    for (int64_t d = 0; d < D; d++) clear_stored(yr[d], cut);
}

// The rows of items [lo, hi). Out of place they are software-pipelined over two scratch rows: the next row is copied
// (and checked) before the current one is summed, so the sums read a copy whose stores have left the store buffer (a
// read at a column offset that straddles two pending stores stalls). In place on an x larger than the L3 a row is
// copied, summed and stored back before the next is read, so its lines are still in L1 when they are written: there
// the pipelined loop, whose store of a row trails the read of the next, was the slower one (the performance guide
// gives the figures); L3-resident, it is the faster one in place too.
template <typename X, typename W, typename M, typename O, int64_t DC, bool TD, bool INPLACE>
__attribute__((noinline)) void terms_chunk(const X* xp, X* yp, const W* tp, int64_t tj, const int64_t* off,
                                           const M* mask, int64_t nj, int64_t D, int64_t pl, int64_t pr, const Rows g,
                                           int64_t lo, int64_t hi, const Cut<X, W> cut) {
  const bool clear = cut.tau > 0;
  using U = typename Bits<W>::type;
  // each scratch row's first column 64-byte aligned (its copy's stores split no cache line), after pl zeros at
  // least; the padding stays zero: rows write [0, D)
  constexpr int64_t line = 64 / sizeof(W);
  const int64_t left = (pl + line - 1) / line * line, span = (left + D + pr + 1 + line - 1) / line * line;
  std::vector<W> buf(2 * span + line, W(0));
  const auto at = reinterpret_cast<uintptr_t>(buf.data());
  W* rows[2] = {reinterpret_cast<W*>((at + 63) / 64 * 64) + left, reinterpret_cast<W*>((at + 63) / 64 * 64) + left + span};
  int64_t o[4];  // up to four offsets as a local array, not read through a pointer
  const int64_t* op = off;
  if (nj <= 4) {
    for (int64_t j = 0; j < nj; j++) o[j] = off[j];
    op = o;
  }
  if constexpr (INPLACE) {
    FOR_ROWS(g, lo, hi, xo, yo, to) {
      const U big = copy_row<X, W, DC>(xp + xo, D, rows[0]);
      sum_row<X, W, M, O, DC, TD>(rows[0], big, yp + yo, tp + to, tj, op, mask, nj, D, cut, clear);
    }
    return;
  }
  int64_t cur = 0, pending_y = -1, pending_t = 0;
  U pending_big = 0;
  FOR_ROWS(g, lo, hi, xo, yo, to) {
    const U big = copy_row<X, W, DC>(xp + xo, D, rows[cur ^ 1]);
    if (pending_y >= 0)
      sum_row<X, W, M, O, DC, TD>(rows[cur], pending_big, yp + pending_y, tp + pending_t, tj, op, mask, nj, D, cut,
                                  clear);
    cur ^= 1;
    pending_y = yo, pending_t = to, pending_big = big;
  }
  if (pending_y >= 0)
    sum_row<X, W, M, O, DC, TD>(rows[cur], pending_big, yp + pending_y, tp + pending_t, tj, op, mask, nj, D, cut,
                                clear);
}

template <typename X, typename O, int64_t DC>
void terms_rows(const at::Tensor& x, const at::Tensor& t, const int64_t* off, const uint8_t* mask, int64_t nj,
                int64_t tile, at::Tensor& out, double tau) {
  using W = typename Work<X>::type;
  using M = typename Work<X>::mask;  // the masks as integers of the work type's width: a select needs no widening
  const int64_t D = x.size(3);
  const std::vector<M> wide(mask, mask + nj * D);
  int64_t pl = 0, pr = 0;
  for (int64_t j = 0; j < nj; j++) {
    pl = std::max(pl, -off[j]);
    pr = std::max(pr, off[j]);
  }
  TORCH_CHECK(pl <= kMaxWidth && pr <= kMaxWidth, "liepos_native::terms: offsets beyond ", kMaxWidth);
  const X* xp = x.const_data_ptr<X>();
  X* yp = out.mutable_data_ptr<X>();
  const W* tp = t.const_data_ptr<W>();
  const int64_t tj = t.stride(3);
  const Cut<X, W> cut = make_cut<X, W>(tau);  // tau = 0: nothing cleared
  // in place on an x larger than the L3 (kRowwiseAboveBytes), row at a time; otherwise pipelined (terms_chunk)
  const bool inplace = static_cast<const void*>(xp) == static_cast<const void*>(yp) &&
                       x.numel() * static_cast<int64_t>(x.element_size()) > kRowwiseAboveBytes;
  tiled_rows(x, out, t, tile, [&](const Rows& g, int64_t lo, int64_t hi) {
    const bool td = O::J > 0 && DC > 0 && tj == D;
    if (inplace) {
      if (td)
        terms_chunk<X, W, M, O, DC, true, true>(xp, yp, tp, tj, off, wide.data(), nj, D, pl, pr, g, lo, hi, cut);
      else
        terms_chunk<X, W, M, O, DC, false, true>(xp, yp, tp, tj, off, wide.data(), nj, D, pl, pr, g, lo, hi, cut);
    } else if (td) {
      terms_chunk<X, W, M, O, DC, true, false>(xp, yp, tp, tj, off, wide.data(), nj, D, pl, pr, g, lo, hi, cut);
    } else {
      terms_chunk<X, W, M, O, DC, false, false>(xp, yp, tp, tj, off, wide.data(), nj, D, pl, pr, g, lo, hi, cut);
    }
  });
}

template <typename X, typename O>
void terms_width(const at::Tensor& x, const at::Tensor& t, const int64_t* off, const uint8_t* mask, int64_t nj,
                 int64_t tile, at::Tensor& out, double tau) {
  switch (x.size(3)) {  // the common head widths with a constant trip count
    case 64: return terms_rows<X, O, 64>(x, t, off, mask, nj, tile, out, tau);
    case 128: return terms_rows<X, O, 128>(x, t, off, mask, nj, tile, out, tau);
    default: return terms_rows<X, O, 0>(x, t, off, mask, nj, tile, out, tau);
  }
}

template <typename O> bool same(const int64_t* off, int64_t nj) {
  if (nj != O::J) return false;
  for (int64_t j = 0; j < nj; j++)
    if (off[j] != O::v[j]) return false;
  return true;
}

template <typename X>
void terms_typed(const at::Tensor& x, const at::Tensor& t, const int64_t* off, const uint8_t* mask, int64_t nj,
                 int64_t tile, at::Tensor& out, double tau) {
  // Jordan blocks of size 2 and 3 (query, key), alone or beside interleaved rotation planes
  if (same<Offsets<0, -1>>(off, nj)) return terms_width<X, Offsets<0, -1>>(x, t, off, mask, nj, tile, out, tau);
  if (same<Offsets<0, 1>>(off, nj)) return terms_width<X, Offsets<0, 1>>(x, t, off, mask, nj, tile, out, tau);
  if (same<Offsets<0, -1, -2>>(off, nj))
    return terms_width<X, Offsets<0, -1, -2>>(x, t, off, mask, nj, tile, out, tau);
  if (same<Offsets<0, 1, 2>>(off, nj)) return terms_width<X, Offsets<0, 1, 2>>(x, t, off, mask, nj, tile, out, tau);
  if (same<Offsets<0, -1, 1>>(off, nj)) return terms_width<X, Offsets<0, -1, 1>>(x, t, off, mask, nj, tile, out, tau);
  if (same<Offsets<0, -1, 1, -2>>(off, nj))
    return terms_width<X, Offsets<0, -1, 1, -2>>(x, t, off, mask, nj, tile, out, tau);
  if (same<Offsets<0, -1, 1, 2>>(off, nj))
    return terms_width<X, Offsets<0, -1, 1, 2>>(x, t, off, mask, nj, tile, out, tau);
  switch (nj) {  // other offsets: the common term counts with a constant trip count
    case 2: return terms_width<X, Terms<2>>(x, t, off, mask, nj, tile, out, tau);
    case 3: return terms_width<X, Terms<3>>(x, t, off, mask, nj, tile, out, tau);
    case 4: return terms_width<X, Terms<4>>(x, t, off, mask, nj, tile, out, tau);
    default: return terms_rows<X, Terms<0>, 0>(x, t, off, mask, nj, tile, out, tau);
  }
}

}  // namespace

namespace liepos_native_terms {  // each dtype's entry, defined in the source that instantiates it
#define LIEPOS_TERMS_ENTRY(NAME)                                                                            \
  void NAME(const at::Tensor& x, const at::Tensor& t, const int64_t* off, const uint8_t* mask, int64_t nj,  \
            int64_t tile, at::Tensor& out, double tau)
LIEPOS_TERMS_ENTRY(typed_float);
LIEPOS_TERMS_ENTRY(typed_double);
LIEPOS_TERMS_ENTRY(typed_bfloat16);
LIEPOS_TERMS_ENTRY(typed_half);
}  // namespace liepos_native_terms
