// The kernel's kind and shape (ge2jit/ops/norm/spec.py says what each variant is).
constexpr bool LAYER = {{ "true" if spec.layer else "false" }};   // LayerNorm, else RMSNorm
constexpr int VARIANT = {{ spec.variant_code }};    // 0 warp, 1 block, 2 loop
constexpr int THREADS = {{ spec.threads }};
constexpr int VPT = {{ spec.vpt }};                 // values per thread (per row; per loop step)
constexpr int VEC = {{ spec.vec }};                 // elements per access
constexpr int LANES = {{ spec.lanes }};             // warp variant: lanes per row
constexpr int ROWS = {{ spec.rows }};               // warp variant: rows per lane group
constexpr int SLOTS = VPT / VEC;
constexpr int WARPS = THREADS / 32;

static_assert(VPT % VEC == 0, "whole vectors per thread");
static_assert(THREADS % 32 == 0 && THREADS <= 1024, "whole warps");
