// The Jordan terms kernel in bfloat16 and float16 (computed in float, rounded as torch rounds): a source of its
// own so that the build compiles it beside native_terms.cpp (the templates: native_terms.h).
#include "native_terms.h"

namespace liepos_native_terms {
LIEPOS_TERMS_ENTRY(typed_bfloat16) { terms_typed<c10::BFloat16>(x, t, off, mask, nj, tile, out, tau); }
LIEPOS_TERMS_ENTRY(typed_half) { terms_typed<c10::Half>(x, t, off, mask, nj, tile, out, tau); }
}  // namespace liepos_native_terms
