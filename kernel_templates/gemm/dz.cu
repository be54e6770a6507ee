// {{ spec.kernel_name }}
// The backward's elementwise pass: dZ = gY * act'({{ "Y" if spec.from_y else "Z" }}) for {{ spec.act.value }}{{ " (dZ = gY: Z is not read)" if not spec.reads_src }}, computed once in float32 and
// stored {% if spec.write_dz %}as dZ ({{ spec.dz_dtype.numpy_name }}){% endif %}{% if spec.write_dc %}{{ ", " if spec.write_dz }}as dC = beta * dZ ({{ spec.dc_dtype.numpy_name }}){% endif %}{% if spec.bias.value != "nobias" %}, with the {{ {"colbias": "column", "rowbias": "row", "scalarbias": "total"}[spec.bias.value] }} sums of dZ
// (dBias) reduced in the same pass: each block writes float32 partial sums that a second,
// small reduction adds up in a fixed order{% endif %}.
// Blocks of 32 x 8 threads cover `rows` rows x {{ 32 * spec.cols }} columns; each thread {{ spec.cols }} adjacent columns of
// every eighth row{% if spec.vec %}, read and written as 16-byte vectors (unit column strides, rows and pointers
// 16-byte aligned, N a multiple of 8){% endif %}. Every matrix takes (row stride, column stride) in elements.
{% if spec.glu %}
// A gated linear unit's backward: gY has N / 2 columns, each a (gate, linear) pair of Z's
// adjacent columns 2j, 2j + 1: dZ[2j] = gY[j] * Z[2j + 1] * act'(Z[2j]), dZ[2j + 1] =
// gY[j] * act(Z[2j]). A thread's columns are whole pairs.
{% endif %}
{% include "common/types.cuh" %}
{% include "common/activations.cuh" %}

constexpr Act ACT = Act::{{ spec.act.value }};
constexpr bool FROM_Y = {{ "true" if spec.from_y else "false" }};   // act' from the output Y
constexpr bool FAST_ACT = {{ "true" if spec.fast_act else "false" }};
{% if spec.glu %}
{% include "common/rows.cuh" %}
{% endif %}

constexpr int COLS = {{ spec.cols }}, TILE_N = 32 * COLS;
{% if spec.vec %}

__device__ __forceinline__ void store8(float* p, const float (&v)[8]) {
    *reinterpret_cast<float4*>(p) = make_float4(v[0], v[1], v[2], v[3]);
    *reinterpret_cast<float4*>(p + 4) = make_float4(v[4], v[5], v[6], v[7]);
}
template <typename T>
__device__ __forceinline__ void store8(T* p, const float (&v)[8]) { store_vec(p, v); }
{% endif %}

extern "C" __global__ void __launch_bounds__(256)
{{ spec.kernel_name }}({{ spec.param_list() }})
{
    const int M = static_cast<int>(M_), N = static_cast<int>(N_);
    const int TILE_M = static_cast<int>(rows_);   // rows per block
    const float slope = static_cast<float>(slope_);
{% if spec.write_dc %}
    const float beta = static_cast<float>(beta_);
{% endif %}
    const int tx = threadIdx.x, ty = threadIdx.y;
    const int n0 = blockIdx.x * TILE_N + tx * COLS, m0 = blockIdx.y * TILE_M;
{% if spec.bias.value == "colbias" %}
    float col_sum[COLS] = {};
{% elif spec.bias.value == "scalarbias" %}
    float total = 0.0f;
{% endif %}
    const int rows = min(TILE_M, M - m0);
#pragma unroll 2
    for (int i = ty; i < rows; i += 8) {
        const int m = m0 + i;
{% if spec.bias.value == "rowbias" %}
        float row_sum = 0.0f;
{% endif %}
{% if spec.vec %}
        if (n0 < N) {   // N is a multiple of 8: all 8 columns are there
            float d[8];
{% if spec.glu %}
            {
                float g4[4], z8[8];
                load_full<4>(&gy[m * gy_r + n0 / 2], g4);
                load_vec(&src[m * src_r + n0], z8);
#pragma unroll
                for (int j = 0; j < 4; ++j) {
                    const float gate = z8[2 * j], lin = z8[2 * j + 1];
                    d[2 * j] = g4[j] * lin * derivative<ACT, false, FAST_ACT>(gate, slope);
                    d[2 * j + 1] = g4[j] * act_{{ spec.act.value }}{{ "_fast" if spec.fast_act }}(gate, slope);
                }
            }
{% else %}
            load_vec(&gy[m * gy_r + n0], d);
{% endif %}
{% if spec.reads_src and not spec.glu %}
            float src8[8];
            load_vec(&src[m * src_r + n0], src8);
#pragma unroll
            for (int j = 0; j < 8; ++j) d[j] *= derivative<ACT, FROM_Y, FAST_ACT>(src8[j], slope);
{% endif %}
{% if spec.write_dz %}
            store8(&dz[m * dz_r + n0], d);
{% endif %}
{% if spec.write_dc %}
            float e[8];
#pragma unroll
            for (int j = 0; j < 8; ++j) e[j] = beta * d[j];
            store8(&dc[m * dc_r + n0], e);
{% endif %}
#pragma unroll
            for (int j = 0; j < 8; ++j) {
{% if spec.bias.value == "colbias" %}
                col_sum[j] += d[j];
{% elif spec.bias.value == "rowbias" %}
                row_sum += d[j];
{% elif spec.bias.value == "scalarbias" %}
                total += d[j];
{% endif %}
            }
        }
{% else %}
#pragma unroll
        for (int j = 0; j < COLS; ++j) {
            const int n = n0 + j;
            if (n < N) {
{% if spec.glu %}
                // (n0 and N are even: a pair is whole)
                const float g = to_f32(gy[m * gy_r + (n / 2) * gy_c]);
                const float gate = to_f32(src[m * src_r + (n & ~1) * src_c]);
                const float d = j % 2 == 0
                    ? g * to_f32(src[m * src_r + (n + 1) * src_c]) * derivative<ACT, false, FAST_ACT>(gate, slope)
                    : g * act_{{ spec.act.value }}{{ "_fast" if spec.fast_act }}(gate, slope);
{% elif spec.reads_src %}
                const float s = to_f32(src[m * src_r + n * src_c]);
                const float d = to_f32(gy[m * gy_r + n * gy_c]) * derivative<ACT, FROM_Y, FAST_ACT>(s, slope);
{% else %}
                const float d = to_f32(gy[m * gy_r + n * gy_c]);
{% endif %}
{% if spec.write_dz %}
                store(&dz[m * dz_r + n * dz_c], d);
{% endif %}
{% if spec.write_dc %}
                store(&dc[m * dc_r + n * dc_c], beta * d);
{% endif %}
{% if spec.bias.value == "colbias" %}
                col_sum[j] += d;
{% elif spec.bias.value == "rowbias" %}
                row_sum += d;
{% elif spec.bias.value == "scalarbias" %}
                total += d;
{% endif %}
            }
        }
{% endif %}
{% if spec.bias.value == "rowbias" %}
        // the row's sum over this block's 128 columns: across the warp (one row per warp)
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) row_sum += __shfl_xor_sync(0xffffffffu, row_sum, o);
        if (tx == 0) partial[static_cast<long long>(blockIdx.x) * M + m] = row_sum;
{% endif %}
    }
{% if spec.bias.value == "colbias" %}
    // column sums over the block's rows: the 8 rows of threads through shared memory
    __shared__ float sums[8][TILE_N];
#pragma unroll
    for (int j = 0; j < COLS; ++j) sums[ty][tx * COLS + j] = col_sum[j];
    __syncthreads();
    const int t = ty * 32 + tx;
    if (t < TILE_N && blockIdx.x * TILE_N + t < N) {
        float s = 0.0f;
#pragma unroll
        for (int r = 0; r < 8; ++r) s += sums[r][t];
        partial[static_cast<long long>(blockIdx.y) * N + blockIdx.x * TILE_N + t] = s;
    }
{% elif spec.bias.value == "scalarbias" %}
    __shared__ float sums[8];
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) total += __shfl_xor_sync(0xffffffffu, total, o);
    if (tx == 0) sums[ty] = total;
    __syncthreads();
    if (tx == 0 && ty == 0) {
        float s = 0.0f;
#pragma unroll
        for (int r = 0; r < 8; ++r) s += sums[r];
        partial[static_cast<long long>(blockIdx.y) * gridDim.x + blockIdx.x] = s;
    }
{% endif %}
}
