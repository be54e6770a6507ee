// {{ spec.kernel_name }}
// dBias from the float32 partial sums of the dZ pass (gemm/dz.cu): {% if spec.total %}the total of all of them,
// by one block (a strided sum per thread, then a tree in shared memory){% else %}out[j] = the sum of column j
// of a rows x cols array, one thread per column, rows added in order{% endif %}; the result rounded once to
// {{ spec.out_dtype.numpy_name }}. The order of additions is fixed: the same inputs give the same bits.
{% include "common/types.cuh" %}

extern "C" __global__ void __launch_bounds__(256)
{{ spec.kernel_name }}(const float* __restrict__ partial, long long rows, long long cols,
                       {{ spec.out_dtype.ctype }}* __restrict__ out)
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
    const long long j = static_cast<long long>(blockIdx.x) * 256 + threadIdx.x;
    if (j >= cols) return;
    float s = 0.0f;
    for (long long i = 0; i < rows; ++i) s += partial[i * cols + j];
    store(out + j, s);
{% endif %}
}
