// {{ spec.kernel_name }}
// dBias from float32 partial sums (of the dZ pass, gemm/dz.cu, or of a gated GEMM's epilogue): {% if spec.total %}the total of all of them,
// by one block (a strided sum per thread, then a tree in shared memory){% else %}out[y][j] = the sum of column j
// of rows [y chunk, (y + 1) chunk) of a rows x cols array, for y = blockIdx.y: blocks of 32 columns x 8 row
// groups, each group adding every eighth row in order, then the 8 group sums in order{% endif %}; each result
// rounded once to {{ spec.out_dtype.numpy_name }}. The order of additions is fixed: the same inputs give the same bits.
{% include "common/types.cuh" %}

extern "C" __global__ void __launch_bounds__(256)
{{ spec.kernel_name }}({{ spec.param_list() }})
{
{% if spec.total %}
    __shared__ float sums[256];
    const long long count = rows * cols;
    float s = 0.0f;
    for (long long i = threadIdx.x; i < count; i += 256) s += partial[i];
    sums[threadIdx.x] = s;
    __syncthreads();
#pragma unroll
    for (int half = 128; half > 0; half >>= 1) {
        if (threadIdx.x < half) sums[threadIdx.x] += sums[threadIdx.x + half];
        __syncthreads();
    }
    if (threadIdx.x == 0) store(out, sums[0]);
{% else %}
    __shared__ float sums[8][33];
    const int tx = threadIdx.x % 32, ty = threadIdx.x / 32;
    const long long j = static_cast<long long>(blockIdx.x) * 32 + tx;
    const long long r0 = static_cast<long long>(blockIdx.y) * chunk;
    const long long r1 = min(rows, r0 + chunk);
    float s = 0.0f;
    if (j < cols) {
#pragma unroll 4
        for (long long i = r0 + ty; i < r1; i += 8) s += partial[i * cols + j];
    }
    sums[ty][tx] = s;
    __syncthreads();
    if (ty == 0 && j < cols) {
        float t = sums[0][tx];
#pragma unroll
        for (int g = 1; g < 8; ++g) t += sums[g][tx];
        store(out + blockIdx.y * cols + j, t);
    }
{% endif %}
}
