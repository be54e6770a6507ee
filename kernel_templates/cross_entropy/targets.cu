// {{ spec.kernel_name }}
// The class indices of a cross-entropy call ({{ spec.target_dtype }}), read once by one block: ws[0] = the rows whose
// index is not ignore_index (the mean's denominator), ws[1] = the first row whose index is outside
// [0, n) and not ignore_index (-1: none), ws[2] = that index. Integer sums and minima: exact.

using TT = {{ "int" if spec.target_dtype == "int32" else "long long" }};
constexpr int THREADS = {{ spec.threads }};
constexpr unsigned FULL = 0xffffffffu;

extern "C" __global__ void __launch_bounds__(THREADS)
{{ spec.kernel_name }}({{ spec.param_list() }})
{
    __shared__ long long counts[32], firsts[32];
    long long count = 0, first = rows;   // rows: no bad row yet
    for (long long r = threadIdx.x; r < rows; r += THREADS) {
        const long long t = static_cast<long long>(targets[r * ts]);
        if (t != ignore_index) {
            ++count;
            if ((t < 0 || t >= n) && first == rows) first = r;   // r grows: the thread's first
        }
    }
#pragma unroll
    for (int o = 16; o > 0; o /= 2) {
        count += __shfl_xor_sync(FULL, count, o);
        const long long f = __shfl_xor_sync(FULL, first, o);
        first = f < first ? f : first;
    }
    if ((threadIdx.x & 31) == 0) {
        counts[threadIdx.x >> 5] = count;
        firsts[threadIdx.x >> 5] = first;
    }
    __syncthreads();
    if (threadIdx.x < 32) {
        count = threadIdx.x < THREADS / 32 ? counts[threadIdx.x] : 0;
        first = threadIdx.x < THREADS / 32 ? firsts[threadIdx.x] : rows;
#pragma unroll
        for (int o = 16; o > 0; o /= 2) {
            count += __shfl_xor_sync(FULL, count, o);
            const long long f = __shfl_xor_sync(FULL, first, o);
            first = f < first ? f : first;
        }
        if (threadIdx.x == 0) {
            ws[0] = count;
            ws[1] = first < rows ? first : -1;
            ws[2] = first < rows ? static_cast<long long>(targets[first * ts]) : 0;
        }
    }
}
