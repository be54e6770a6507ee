// {{ spec.kernel_name }}
// Y = act(alpha * A @ B{% if spec.epilogue.has_c %} + beta * C{% endif %}{% if spec.epilogue.bias.value != "nobias" %} + bias{% endif %}), {{ spec.dtype.numpy_name }} inputs, float32 arithmetic on the CUDA cores.
// A is {{ "row" if spec.layout_a.value == "r" else "column" }}-major, B is {{ "row" if spec.layout_b.value == "r" else "column" }}-major; Y{% if spec.epilogue.save_z %} and Z are{% else %} is{% endif %} row-major.
{% import "common/epilogue_constants.cuh" as ep %}
{% include "common/types.cuh" %}
{% include "common/activations.cuh" %}
{{ ep.constants(spec) }}
{% include "common/epilogue.cuh" %}

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
// A thread owns columns tx + j THREADS_N, j < TN; a gated linear unit's (GLU) columns come in
// (gate, linear) pairs: a thread owns pairs of adjacent columns, 2 (tx + p * THREADS_N) and
// the one after, for p < TN / 2.
#define COL(j) (GLU ? 2 * (tx + ((j) / 2) * THREADS_N) + (j) % 2 : tx + (j) * THREADS_N)

constexpr bool A_ROW = {{ "true" if spec.layout_a.value == "r" else "false" }};   // A row-major, else column-major
constexpr bool B_ROW = {{ "true" if spec.layout_b.value == "r" else "false" }};
#define A_AT(m, k) A[A_ROW ? (long long)(m) * lda + (k) : (long long)(k) * lda + (m)]
#define B_AT(k, n) B[B_ROW ? (long long)(k) * ldb + (n) : (long long)(n) * ldb + (k)]
// (THREADS, 1): without a minimum of blocks, ptxas aimed at more of them and spilled a few
// bytes in some variants (64x64 tiles with a C term) to get there.
extern "C" __global__ void __launch_bounds__(THREADS, 1)
{{ spec.kernel_name }}({{ spec.param_list() }})
{
    auto ep = epilogue(C, ldc, bias, bias_stride, Y, ldy, Z, ldz, M_, N_, alpha_, beta_,
                       leaky_slope_, scale_a, scale_a_stride, scale_b, scale_b_stride, scale_y,
                       amax, y_scale_);
    const int M = ep.M, N = ep.N, K = static_cast<int>(K_);
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
            const int kk = A_ROW ? idx % BK : idx / BM, mm = A_ROW ? idx / BK : idx % BM;
            const int m = m0 + mm, k = k0 + kk;
            As[kk][mm] = (m < M && k < K) ? to_f32(A_AT(m, k)) : 0.0f;
        }
#pragma unroll
        for (int r = 0; r < (BK * BN + THREADS - 1) / THREADS; ++r) {
            const int idx = tid + r * THREADS;
            if ((BK * BN) % THREADS != 0 && idx >= BK * BN) break;
            const int nn = B_ROW ? idx % BN : idx / BK, kk = B_ROW ? idx / BN : idx % BK;
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
    ep.load_scalar_bias();
#pragma unroll
    for (int i = 0; i < TM; ++i) {
        const int m = m0 + ty + i * THREADS_M;
        if (m >= M) continue;
        const float row_bias = ROW_BIAS ? to_f32(bias[(long long)m * bias_stride]) : 0.0f;
        // (the column's bias, of the column n)
        const auto col_bias = [&](int, int n) {
            return COL_BIAS ? to_f32(bias[(long long)n * bias_stride]) : 0.0f;
        };
        if constexpr (GLU) {
#pragma unroll
            for (int j = 0; j < TN; j += 2) {
                const int nb = n0 + COL(j);
                if (nb >= N) continue;
                ep.finish<2>(Y, m, nb, false, [&](int c) { return acc[i][j + c]; }, col_bias,
                             row_bias);
            }
        } else if constexpr (GLU_GRAD) {
#pragma unroll
            for (int j = 0; j < TN; ++j) {
                const int nb = n0 + COL(j);
                if (nb >= N) continue;
                ep.finish<1>(Y, m, nb, false, [&](int) { return acc[i][j]; },
                             [](int, int) { return 0.0f; }, row_bias);
            }
        } else {
#pragma unroll
            for (int j = 0; j < TN; ++j) {
                const int n = n0 + COL(j);
                if (n >= N) continue;
                const float z = ep.z(acc[i][j], m, n, col_bias(0, n), row_bias);
                if constexpr (SAVE_Z) store(&Z[(long long)m * ldz + n], z);
                store(&Y[(long long)m * ldy + n], activation<ACT, false>(z, ep.leaky_slope));
            }
        }
    }
}
