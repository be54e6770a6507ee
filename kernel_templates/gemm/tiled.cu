// {{ spec.kernel_name }}
// Y = act(alpha * A @ B{% if spec.epilogue.has_c %} + beta * C{% endif %}{% if spec.epilogue.bias.value != "nobias" %} + bias{% endif %}), {{ spec.dtype.numpy_name }} inputs, float32 arithmetic on the CUDA cores.
// A is {{ "row" if spec.layout_a.value == "r" else "column" }}-major, B is {{ "row" if spec.layout_b.value == "r" else "column" }}-major; Y{% if spec.epilogue.save_z %} and Z are{% else %} is{% endif %} row-major.
{% import "common/epilogue.cuh" as ep %}
{% include "common/types.cuh" %}
{% include "common/activations.cuh" %}

constexpr int BM = {{ spec.tile.bm }};
constexpr int BN = {{ spec.tile.bn }};
constexpr int BK = {{ spec.tile.bk }};
constexpr int TM = {{ spec.tile.tm }};
constexpr int TN = {{ spec.tile.tn }};
constexpr int THREADS_N = BN / TN;
constexpr int THREADS_M = BM / TM;
constexpr int THREADS = THREADS_M * THREADS_N;
// Rows of the shared tiles are padded by 4 floats: a warp that fills a k-major tile then hits
// 32 distinct banks, and rows stay 16-byte aligned.
constexpr int PAD = 4;
{% if spec.epilogue.glu %}
// A gated linear unit's columns come in (gate, linear) pairs: a thread owns pairs of adjacent
// columns, 2 (tx + p * THREADS_N) and the one after, for p < TN / 2.
#define COL(j) (2 * (tx + ((j) / 2) * THREADS_N) + (j) % 2)
{% else %}
#define COL(j) (tx + (j) * THREADS_N)
{% endif %}

{{ ep.accessors(spec) }}
// (THREADS, 1): without a minimum of blocks, ptxas aimed at more of them and spilled a few
// bytes in some variants (64x64 tiles with a C term) to get there.
extern "C" __global__ void __launch_bounds__(THREADS, 1)
{{ spec.kernel_name }}({{ spec.param_list() }})
{
    {{ ep.scalars() | indent(4) }}
    __shared__ float As[BK][BM + PAD];   // As[k][m]
    __shared__ float Bs[BK][BN + PAD];   // Bs[k][n]

    const int tid = threadIdx.x;
    const int tx = tid % THREADS_N;      // this thread owns columns COL(j)
    const int ty = tid / THREADS_N;      // and rows ty + i * THREADS_M of the block tile
    const int m0 = blockIdx.x * BM;
    const int n0 = blockIdx.y * BN;

    float acc[TM][TN];
#pragma unroll
    for (int i = 0; i < TM; ++i)
#pragma unroll
        for (int j = 0; j < TN; ++j)
            acc[i][j] = 0.0f;

    // Counted in tiles: k0 += BK would wrap past 2^31 - 1 after the last tile of a K near it.
    const int k_tiles = ceil_div(K, BK);
    for (int kt = 0; kt < k_tiles; ++kt) {
        const int k0 = kt * BK;
        // Load the A and B tiles; consecutive threads walk the operand's contiguous dimension.
        // fixed trip counts (fully unrolled; a loop from tid left ptxas a stack slot)
#pragma unroll
        for (int r = 0; r < (BM * BK + THREADS - 1) / THREADS; ++r) {
            const int idx = tid + r * THREADS;
            if ((BM * BK) % THREADS != 0 && idx >= BM * BK) break;
{% if spec.layout_a.value == "r" %}
            const int kk = idx % BK, mm = idx / BK;
{% else %}
            const int mm = idx % BM, kk = idx / BM;
{% endif %}
            const int m = m0 + mm, k = k0 + kk;
            As[kk][mm] = (m < M && k < K) ? to_f32(A_AT(m, k)) : 0.0f;
        }
#pragma unroll
        for (int r = 0; r < (BK * BN + THREADS - 1) / THREADS; ++r) {
            const int idx = tid + r * THREADS;
            if ((BK * BN) % THREADS != 0 && idx >= BK * BN) break;
{% if spec.layout_b.value == "r" %}
            const int nn = idx % BN, kk = idx / BN;
{% else %}
            const int kk = idx % BK, nn = idx / BK;
{% endif %}
            const int n = n0 + nn, k = k0 + kk;
            Bs[kk][nn] = (n < N && k < K) ? to_f32(B_AT(k, n)) : 0.0f;
        }
        __syncthreads();

#pragma unroll
        for (int kk = 0; kk < BK; ++kk) {
            float a[TM], b[TN];
#pragma unroll
            for (int i = 0; i < TM; ++i) a[i] = As[kk][ty + i * THREADS_M];
#pragma unroll
            for (int j = 0; j < TN; ++j) b[j] = Bs[kk][COL(j)];
#pragma unroll
            for (int i = 0; i < TM; ++i)
#pragma unroll
                for (int j = 0; j < TN; ++j)
                    acc[i][j] = fmaf(a[i], b[j], acc[i][j]);
        }
        __syncthreads();
    }

    // Fused epilogue, in registers; Y (and Z) are written once.
{% if spec.epilogue.bias.value == "scalarbias" %}
    const float bias_value = to_f32(bias[0]);
{% endif %}
#pragma unroll
    for (int i = 0; i < TM; ++i) {
        const int m = m0 + ty + i * THREADS_M;
        if (m >= M) continue;
{% if spec.epilogue.bias.value == "rowbias" %}
        const float row_bias = to_f32(bias[(long long)m * bias_stride]);
{% endif %}
{% if spec.epilogue.glu %}
#pragma unroll
        for (int j = 0; j < TN; j += 2) {
            const int nb = n0 + COL(j);
            if (nb >= N) continue;
            {{ ep.finish(spec, 2, "acc[i][j + c]", "to_f32(bias[(long long)n * bias_stride])", "false") | indent(12) }}
        }
{% elif spec.epilogue.glu_grad %}
#pragma unroll
        for (int j = 0; j < TN; ++j) {
            const int nb = n0 + COL(j);
            if (nb >= N) continue;
            {{ ep.finish(spec, 1, "acc[i][j]", "0.0f", "false") | indent(12) }}
        }
{% else %}
#pragma unroll
        for (int j = 0; j < TN; ++j) {
            const int n = n0 + COL(j);
            if (n >= N) continue;
            {{ ep.compute_z(spec, "z", "acc[i][j]", "m", "n", "to_f32(bias[(long long)n * bias_stride])", "row_bias") | indent(12) }}
{% if spec.epilogue.save_z %}
            store(&Z[(long long)m * ldz + n], z);
{% endif %}
            store(&Y[(long long)m * ldy + n], act_{{ spec.epilogue.act.value }}(z, leaky_slope));
        }
{% endif %}
    }
}
