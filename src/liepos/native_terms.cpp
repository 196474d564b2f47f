// The native kernel of Jordan-coupled encodings as shifted terms (liepos_native::terms, terms_), a source of
// its own so that the build compiles it beside native_kernels.cpp (its instantiations take most of the time):
//
//   terms(x, t, offsets, masks, tile, out, tau):  out[d] = sum_j [masks[j][d]] t[j][d] * x[d + offsets[j]],
//                                                  then cleared: a value rounded to x's dtype below tau is +0
//   terms_(x, t, offsets, masks, tile):            the same in place (out is x), nothing cleared
//
// The schemas are defined in native_kernels.cpp (TORCH_LIBRARY); the CPU implementations registered here.
//   (bfloat16 and float16: native_terms_half.cpp)
#include "native_terms.h"

namespace liepos_native_terms {
LIEPOS_TERMS_ENTRY(typed_float) { terms_typed<float>(x, t, off, mask, nj, tile, out, tau); }
LIEPOS_TERMS_ENTRY(typed_double) { terms_typed<double>(x, t, off, mask, nj, tile, out, tau); }
}  // namespace liepos_native_terms

namespace {

void terms_impl(const at::Tensor& x, const at::Tensor& t, at::IntArrayRef offsets, const at::Tensor& masks,
                int64_t tile, at::Tensor& out, double tau) {
  check_rows(x, out, x.size(3));
  TORCH_CHECK(tau >= 0, "liepos_native::terms: tau must be at least 0, got ", tau);
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
    case at::kFloat: return liepos_native_terms::typed_float(x, t, off, mask, J, tile, out, tau);
    case at::kDouble: return liepos_native_terms::typed_double(x, t, off, mask, J, tile, out, tau);
    case at::kBFloat16: return liepos_native_terms::typed_bfloat16(x, t, off, mask, J, tile, out, tau);
    case at::kHalf: return liepos_native_terms::typed_half(x, t, off, mask, J, tile, out, tau);
    default: TORCH_CHECK(false, "liepos_native::terms: unsupported dtype ", x.scalar_type());
  }
}

void terms_out(const at::Tensor& x, const at::Tensor& t, at::IntArrayRef offsets, const at::Tensor& masks,
               int64_t tile, at::Tensor out, double tau) {
  terms_impl(x, t, offsets, masks, tile, out, tau);
}

void terms_inplace(at::Tensor x, const at::Tensor& t, at::IntArrayRef offsets, const at::Tensor& masks,
                   int64_t tile) {
  terms_impl(x, t, offsets, masks, tile, x, 0.0);
}
}  // namespace

TORCH_LIBRARY_IMPL(liepos_native, CPU, m) {
  m.impl("terms", &terms_out);
  m.impl("terms_", &terms_inplace);
}
