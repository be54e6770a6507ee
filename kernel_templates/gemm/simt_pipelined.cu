{% set cfg = spec.config %}
// {{ spec.kernel_name }}
{% if spec.split_k %}
// Split-K partial products: slice blockIdx.z of K, raw float32 sums written to a workspace;
// the epilogue runs once, after the reduction (gemm/splitk_reduce.cu).
{% else %}
// Y = act(alpha * A @ B{% if spec.epilogue.has_c %} + beta * C{% endif %}{% if spec.epilogue.bias.value != "nobias" %} + bias{% endif %}), float32 on the CUDA cores, fused epilogue.
{% endif %}
// A {{ "row" if spec.layout_a.value == "r" else "column" }}-major ({{ "16-byte" if spec.vec_a else "4-byte" }} copies), B {{ "row" if spec.layout_b.value == "r" else "column" }}-major ({{ "16-byte" if spec.vec_b else "4-byte" }} copies); {{ cfg.stages }}-stage cp.async pipeline.
{% import "common/epilogue_constants.cuh" as ep %}
{% include "common/types.cuh" %}
{% include "common/activations.cuh" %}
{{ ep.constants(spec) }}
{% include "common/epilogue.cuh" %}
{% include "common/sm80/cp_async.cuh" %}

constexpr int BM = {{ cfg.bm }};
constexpr int BN = {{ cfg.bn }};
constexpr int BK = {{ cfg.bk }};
constexpr int WM = {{ cfg.wm }};           // warp tile
constexpr int WN = {{ cfg.wn }};
constexpr int STAGES = {{ cfg.stages }};
constexpr int LANES_N = {{ cfg.lanes_n }};  // lanes of a warp along N
constexpr int LANES_M = 32 / LANES_N;
constexpr int WARPS_N = BN / WN;
constexpr int THREADS = (BM / WM) * WARPS_N * 32;
constexpr int TM = WM / LANES_M;           // thread tile, in 4 x 4 sub-tiles strided across
constexpr int TN = WN / LANES_N;           // the warp tile (conflict-free 16-byte smem reads)
// Shared tiles are k-major (As[k][m], Bs[k][n]); rows are padded by 4 floats so that transposing
// 4-byte copies hit 32 distinct banks and rows stay 16-byte aligned.
constexpr int AS_LD = BM + 4;
constexpr int BS_LD = BN + 4;
constexpr int STAGE_FLOATS = BK * AS_LD + BK * BS_LD;
static_assert(TM % 4 == 0 && TN % 4 == 0, "thread tile must be made of 4 x 4 sub-tiles");
static_assert(BK % 8 == 0, "BK must be a multiple of 8");

constexpr bool A_ROW = {{ "true" if spec.layout_a.value == "r" else "false" }};   // A row-major, else column-major
constexpr bool B_ROW = {{ "true" if spec.layout_b.value == "r" else "false" }};
#define A_AT(m, k) A[A_ROW ? (long long)(m) * lda + (k) : (long long)(k) * lda + (m)]
constexpr bool A_VEC = !A_ROW && {{ "true" if spec.vec_a else "false" }};   // 16-byte copies of A along m
constexpr bool B_VEC = B_ROW && {{ "true" if spec.vec_b else "false" }};    // ... of B along n
constexpr bool SPLIT_K = {{ "true" if spec.split_k else "false" }};   // raw partial sums of a slice of K
#define B_AT(k, n) B[B_ROW ? (long long)(k) * ldb + (n) : (long long)(n) * ldb + (k)]

__device__ __forceinline__ void load_tiles(float* __restrict__ As, float* __restrict__ Bs,
                                           const float* __restrict__ A, long long lda,
                                           const float* __restrict__ B, long long ldb,
                                           int M, int N, int K, int m0, int n0, int k0, int tid)
{
    if constexpr (A_VEC) {
        // A: 16-byte copies along m (column-major, aligned).
        constexpr int A_UNITS = BM * BK / 4;
#pragma unroll
        for (int i = 0; i < (A_UNITS + THREADS - 1) / THREADS; ++i) {
            const int u = tid + i * THREADS;
            if (A_UNITS % THREADS == 0 || u < A_UNITS) {
                const int kk = u / (BM / 4), mm = (u % (BM / 4)) * 4;
                const int m = m0 + mm, k = k0 + kk;
                const int valid = k < K ? min(max(M - m, 0), 4) : 0;
                cp_async_16(&As[kk * AS_LD + mm], valid ? &A_AT(m, k) : A, valid * 4);
            }
        }
    } else {
        // A: 4-byte copies, transposed into k-major shared memory (row-major A: 8 k per row,
        // 32 bytes).
        constexpr int A_UNITS = BM * BK;
#pragma unroll
        for (int i = 0; i < (A_UNITS + THREADS - 1) / THREADS; ++i) {
            const int u = tid + i * THREADS;
            if (A_UNITS % THREADS == 0 || u < A_UNITS) {
                const int kk = A_ROW ? u % 8 + 8 * (u / (8 * BM)) : u / BM;
                const int mm = A_ROW ? (u / 8) % BM : u % BM;
                const int m = m0 + mm, k = k0 + kk;
                const bool valid = m < M && k < K;
                cp_async_4(&As[kk * AS_LD + mm], valid ? &A_AT(m, k) : A, valid ? 4 : 0);
            }
        }
    }
    if constexpr (B_VEC) {
        // B: 16-byte copies along n (row-major, aligned).
        constexpr int B_UNITS = BN * BK / 4;
#pragma unroll
        for (int i = 0; i < (B_UNITS + THREADS - 1) / THREADS; ++i) {
            const int u = tid + i * THREADS;
            if (B_UNITS % THREADS == 0 || u < B_UNITS) {
                const int kk = u / (BN / 4), nn = (u % (BN / 4)) * 4;
                const int n = n0 + nn, k = k0 + kk;
                const int valid = k < K ? min(max(N - n, 0), 4) : 0;
                cp_async_16(&Bs[kk * BS_LD + nn], valid ? &B_AT(k, n) : B, valid * 4);
            }
        }
    } else {
        // B: 4-byte copies (column-major B: 8 k per column).
        constexpr int B_UNITS = BN * BK;
#pragma unroll
        for (int i = 0; i < (B_UNITS + THREADS - 1) / THREADS; ++i) {
            const int u = tid + i * THREADS;
            if (B_UNITS % THREADS == 0 || u < B_UNITS) {
                const int kk = B_ROW ? u / BN : u % 8 + 8 * (u / (8 * BN));
                const int nn = B_ROW ? u % BN : (u / 8) % BN;
                const int n = n0 + nn, k = k0 + kk;
                const bool valid = n < N && k < K;
                cp_async_4(&Bs[kk * BS_LD + nn], valid ? &B_AT(k, n) : B, valid ? 4 : 0);
            }
        }
    }
}

extern "C" __global__ void __launch_bounds__(THREADS, {{ cfg.min_blocks }})
{{ spec.kernel_name }}({{ spec.param_list() }})
{
    extern __shared__ __align__(16) float smem[];
    auto ep = epilogue(C, ldc, bias, bias_stride, Y, ldy, Z, ldz, M_, N_, alpha_, beta_,
                       leaky_slope_, scale_a, scale_a_stride, scale_b, scale_b_stride, scale_y,
                       amax, y_scale_);
    const int M = ep.M, N = ep.N, K = static_cast<int>(K_);

    const int tid = threadIdx.x;
    const int lane = tid % 32, warp = tid / 32;
    const int wm0 = (warp / WARPS_N) * WM, wn0 = (warp % WARPS_N) * WN;
    const int lm = lane / LANES_N, ln = lane % LANES_N;
    const int m0 = blockIdx.x * BM, n0 = blockIdx.y * BN;

    const int k_tiles = ceil_div(K, BK);
    const int kt_begin = static_cast<int>(blockIdx.z * k_tiles_per_split);
    const int kt_count = max(min(k_tiles - kt_begin, static_cast<int>(k_tiles_per_split)), 0);

    float acc[TM][TN];
#pragma unroll
    for (int i = 0; i < TM; ++i)
#pragma unroll
        for (int j = 0; j < TN; ++j)
            acc[i][j] = 0.0f;

    // Prologue: STAGES - 1 tiles in flight.
#pragma unroll
    for (int s = 0; s < STAGES - 1; ++s) {
        if (s < kt_count)
            load_tiles(smem + s * STAGE_FLOATS, smem + s * STAGE_FLOATS + BK * AS_LD, A, lda, B,
                       ldb, M, N, K, m0, n0, (kt_begin + s) * BK, tid);
        cp_async_commit();
    }

    for (int kt = 0; kt < kt_count; ++kt) {
        cp_async_wait<STAGES - 2>();
        __syncthreads();   // tile kt has landed, and every warp is done with tile kt - 1
        const int next = kt + STAGES - 1;
        if (next < kt_count) {
            float* st = smem + (next % STAGES) * STAGE_FLOATS;
            load_tiles(st, st + BK * AS_LD, A, lda, B, ldb, M, N, K, m0, n0,
                       (kt_begin + next) * BK, tid);
        }
        cp_async_commit();

        const float* As = smem + (kt % STAGES) * STAGE_FLOATS;
        const float* Bs = As + BK * AS_LD;
#pragma unroll
        for (int kk = 0; kk < BK; ++kk) {
            float a[TM], b[TN];
#pragma unroll
            for (int i4 = 0; i4 < TM / 4; ++i4) {
                const float4 v = *reinterpret_cast<const float4*>(
                    &As[kk * AS_LD + wm0 + i4 * LANES_M * 4 + lm * 4]);
                a[i4 * 4 + 0] = v.x; a[i4 * 4 + 1] = v.y; a[i4 * 4 + 2] = v.z; a[i4 * 4 + 3] = v.w;
            }
#pragma unroll
            for (int j4 = 0; j4 < TN / 4; ++j4) {
                const float4 v = *reinterpret_cast<const float4*>(
                    &Bs[kk * BS_LD + wn0 + j4 * LANES_N * 4 + ln * 4]);
                b[j4 * 4 + 0] = v.x; b[j4 * 4 + 1] = v.y; b[j4 * 4 + 2] = v.z; b[j4 * 4 + 3] = v.w;
            }
#pragma unroll
            for (int i = 0; i < TM; ++i)
#pragma unroll
                for (int j = 0; j < TN; ++j)
                    acc[i][j] = fmaf(a[i], b[j], acc[i][j]);
        }
    }
    cp_async_wait<0>();

    // Element (i, j) of the thread tile is row m0 + ROW(i), column n0 + COL(j).
#define ROW(i) (wm0 + ((i) / 4) * LANES_M * 4 + lm * 4 + (i) % 4)
#define COL(j) (wn0 + ((j) / 4) * LANES_N * 4 + ln * 4 + (j) % 4)
    if constexpr (SPLIT_K) {
        // Raw partial sums into workspace slice blockIdx.z (ld a multiple of 4, 16-byte
        // aligned; Y is float32 here).
        auto* const W = Y + static_cast<long long>(blockIdx.z) * M * ldy;
#pragma unroll
        for (int i = 0; i < TM; ++i) {
            const int m = m0 + ROW(i);
            if (m >= M) continue;
#pragma unroll
            for (int j4 = 0; j4 < TN / 4; ++j4) {
                const int n = n0 + COL(j4 * 4);
                if (n < N)
                    *reinterpret_cast<float4*>(&W[static_cast<long long>(m) * ldy + n]) =
                        make_float4(acc[i][j4 * 4], acc[i][j4 * 4 + 1], acc[i][j4 * 4 + 2],
                                    acc[i][j4 * 4 + 3]);
            }
        }
        return;
    }
    ep.load_scalar_bias();
    float col_bias[TN];
    if constexpr (COL_BIAS) {
#pragma unroll
        for (int j = 0; j < TN; ++j) {
            const int n = n0 + COL(j);
            col_bias[j] = n < N ? bias[static_cast<long long>(n) * bias_stride] : 0.0f;
        }
    }
    const bool full_tile = M - m0 >= BM && N - n0 >= BN;   // (m0 + BM can wrap near 2^31)
#pragma unroll
    for (int i = 0; i < TM; ++i) {
        const int m = m0 + ROW(i);
        if (m >= M) continue;
        const float row_bias = ROW_BIAS ? bias[static_cast<long long>(m) * bias_stride] : 0.0f;
#pragma unroll
        for (int j4 = 0; j4 < TN / 4; ++j4) {
            const int nb = n0 + COL(j4 * 4);
            if (nb >= N) continue;
            ep.finish<4>(Y, m, nb, full_tile || nb + 3 < N,
                         [&](int c) { return acc[i][j4 * 4 + c]; },
                         [&](int c, int) { return col_bias[j4 * 4 + c]; }, row_bias);
        }
    }
}
