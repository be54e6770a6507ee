// {{ spec.kernel_name }}
{% if spec.parts == 3 %}
// Prepares one float32 operand of the 3xTF32 GEMM. Each element x is split into
// hi = x rounded to tf32 and lo = (x - hi) rounded to tf32 (x - hi is exact in float32), and
// each K-major row of the result holds three segments of K values:
// {{ "(hi, hi, lo)" if spec.order == "hhl" else "(hi, lo, hi)" }}. With A's rows as (hi, hi, lo)
// and B's columns as (hi, lo, hi), one tf32 GEMM over 3K sums
// A_hi B_hi + A_hi B_lo + A_lo B_hi: about float32's accuracy from the tf32 matrix units (the
// dropped A_lo B_lo term is about 2^-22 of the product).
{% else %}
// Copies an operand into the K-major layout the next kernel reads (tf32 wgmma reads K-major
// operands only): out[c * ld_out + r] = in_[r * ld_in + c].
{% endif %}
//
// The input is an R x C row-major matrix (in_[r * ld_in + c]); the output row of element (r, c)
// is {{ "c, and its K index r (a transposing copy)" if spec.transpose else "r, and its K index c" }}.
// 32 x 32 tiles through padded shared memory, so that reads and writes are both coalesced.
{% include "common/types.cuh" %}

typedef {{ spec.ctype }} T;
constexpr int TILE = 32, ROWS = 8;
{% if spec.parts == 3 %}

__device__ __forceinline__ float round_tf32(float x)
{
    unsigned r;
    asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(r) : "f"(x));
    return __uint_as_float(r);
}

// x = hi + lo. A finite x that rounding would carry to infinity is truncated instead. An
// infinite or NaN x is (x, 0, 0): only the hi * hi product sees it, as x * y would, where
// (hi, hi, lo) with lo = 0 would add inf * 0 = NaN through the other operand's lo.
__device__ __forceinline__ void split_tf32(float x, float& s0, float& s1, float& s2)
{
    float hi = round_tf32(x);
    if (isinf(hi) && !isinf(x)) hi = __uint_as_float(__float_as_uint(x) & 0xffffe000u);
    const bool finite = isfinite(x);
    const float lo = finite ? round_tf32(x - hi) : 0.0f;
    const float hi_again = finite ? hi : 0.0f;
    s0 = hi;
{% if spec.order == "hhl" %}
    s1 = hi_again;
    s2 = lo;
{% else %}
    s1 = lo;
    s2 = hi_again;
{% endif %}
}
{% endif %}

extern "C" __global__ void __launch_bounds__(TILE * ROWS)
{{ spec.kernel_name }}({{ spec.param_list() }})
{
    __shared__ T tile[TILE][TILE + 1];
    const long long c0 = static_cast<long long>(blockIdx.x) * TILE;
    for (long long r0 = static_cast<long long>(blockIdx.y) * TILE; r0 < R;
         r0 += static_cast<long long>(gridDim.y) * TILE) {
        for (int i = threadIdx.y; i < TILE; i += ROWS) {
            const long long r = r0 + i, c = c0 + threadIdx.x;
            if (r < R && c < C) tile[i][threadIdx.x] = in_[r * ld_in + c];
        }
        __syncthreads();
        for (int i = threadIdx.y; i < TILE; i += ROWS) {
{% if spec.transpose %}
            const long long row = c0 + i, kk = r0 + threadIdx.x;
            if (kk < R && row < C) {
                const T x = tile[threadIdx.x][i];
{% else %}
            const long long row = r0 + i, kk = c0 + threadIdx.x;
            if (row < R && kk < C) {
                const T x = tile[i][threadIdx.x];
{% endif %}
                T* o = out + row * ld_out + kk;
{% if spec.parts == 3 %}
                const long long seg = {{ "R" if spec.transpose else "C" }};   // K
                float s0, s1, s2;
                split_tf32(x, s0, s1, s2);
                o[0] = s0;
                o[seg] = s1;
                o[2 * seg] = s2;
{% else %}
                o[0] = x;
{% endif %}
            }
        }
        __syncthreads();
    }
}
