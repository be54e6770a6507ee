// {{ spec.kernel_name }}
// The {{ "LayerNorm" if spec.kind == "layer" else "RMSNorm" }} backward's dweight and dbias from its blocks' partial sums: out[j] = the sum over
// p < parts of part[p * n + j] (float32, row-major), rounded once to the output's type. A block
// of 32 x 32 threads takes 32 columns: thread (c, s) adds parts s, s + 32, s + 64, ... of
// column c in order, then a tree in shared memory adds the 32 sums, pairs always the same. With
// both dweight and dbias, blockIdx.y 0 makes dweight and 1 dbias. The order of additions is
// fixed: the same partial sums give the same bits.
{% include "common/types.cuh" %}

using Tw = {{ spec.weight.ctype if spec.weight else "float" }};
using Tb = {{ spec.bias.ctype if spec.bias else "float" }};
constexpr bool WEIGHT = {{ "true" if spec.weight else "false" }};
constexpr bool BIAS = {{ "true" if spec.bias else "false" }};
constexpr int COLUMNS = 32;
constexpr int GROUPS = 32;

template <typename T>
__device__ __forceinline__ void column_sums(const float* __restrict__ part, T* __restrict__ out,
                                            long long parts, long long n) {
    __shared__ float acc[GROUPS][COLUMNS + 1];
    const int c = threadIdx.x % COLUMNS, s = threadIdx.x / COLUMNS;
    const long long j = static_cast<long long>(blockIdx.x) * COLUMNS + c;
    float v = 0.0f;
    if (j < n) {
#pragma unroll 8
        for (long long q = s; q < parts; q += GROUPS) v += part[q * n + j];
    }
    acc[s][c] = v;
#pragma unroll
    for (int half = GROUPS / 2; half > 0; half /= 2) {
        __syncthreads();
        if (s < half) acc[s][c] += acc[s + half][c];
    }
    if (s == 0 && j < n) store(out + j, acc[0][c]);
}

extern "C" __global__ void __launch_bounds__(COLUMNS * GROUPS)
{{ spec.kernel_name }}({{ spec.param_list() }})
{
    if (WEIGHT && blockIdx.y == 0) {
        if constexpr (WEIGHT) column_sums(pw, dw, parts, n);
    } else {
        if constexpr (BIAS) column_sums(pb, db, parts, n);
    }
}
