// {{ spec.kernel_name }}
// The {{ "mean" if spec.mean else "sum" }} of a cross-entropy call's row losses, by one block: each thread adds every
// THREADS-th loss in float64, then a fixed tree adds the threads' sums (the same bits on every run){% if spec.mean %};
// divided by ws[0], the rows that are not ignored (0: NaN, as PyTorch's mean of nothing){% endif %}.

constexpr int THREADS = {{ spec.threads }};
constexpr bool MEAN = {{ "true" if spec.mean else "false" }};
constexpr unsigned FULL = 0xffffffffu;

extern "C" __global__ void __launch_bounds__(THREADS)
{{ spec.kernel_name }}({{ spec.param_list() }})
{
    __shared__ double parts[32];
    double s = 0.0;
    for (long long r = threadIdx.x; r < rows; r += THREADS) s += static_cast<double>(losses[r]);
#pragma unroll
    for (int o = 16; o > 0; o /= 2) s += __shfl_xor_sync(FULL, s, o);
    if ((threadIdx.x & 31) == 0) parts[threadIdx.x >> 5] = s;
    __syncthreads();
    if (threadIdx.x < 32) {
        s = threadIdx.x < THREADS / 32 ? parts[threadIdx.x] : 0.0;
#pragma unroll
        for (int o = 16; o > 0; o /= 2) s += __shfl_xor_sync(FULL, s, o);
        if (threadIdx.x == 0) {
            if constexpr (MEAN) s /= static_cast<double>(ws[0]);
            out[0] = static_cast<float>(s);
        }
    }
}
