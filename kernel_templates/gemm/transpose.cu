// {{ spec.kernel_name }}
// out[c * ld_out + r] = in[r * ld_in + c] for an R x C row-major matrix: stages an operand
// whose layout the next kernel cannot read (tf32 wgmma reads K-major operands only) into a
// K-major copy. 32 x 32 tiles through shared memory (padded: no bank conflicts), both sides
// coalesced.
{% include "common/types.cuh" %}

typedef {{ spec.dtype.ctype }} T;
constexpr int TILE = 32, ROWS = 8;

extern "C" __global__ void __launch_bounds__(TILE * ROWS)
{{ spec.kernel_name }}(const T* __restrict__ in, long long ld_in, T* __restrict__ out,
                       long long ld_out, long long R, long long C)
{
    __shared__ T tile[TILE][TILE + 1];
    const long long c0 = static_cast<long long>(blockIdx.x) * TILE;
    for (long long r0 = static_cast<long long>(blockIdx.y) * TILE; r0 < R;
         r0 += static_cast<long long>(gridDim.y) * TILE) {
        for (int i = threadIdx.y; i < TILE; i += ROWS) {
            const long long r = r0 + i, c = c0 + threadIdx.x;
            if (r < R && c < C) tile[i][threadIdx.x] = in[r * ld_in + c];
        }
        __syncthreads();
        for (int i = threadIdx.y; i < TILE; i += ROWS) {
            const long long c = c0 + i, r = r0 + threadIdx.x;
            if (r < R && c < C) out[c * ld_out + r] = tile[threadIdx.x][i];
        }
        __syncthreads();
    }
}
