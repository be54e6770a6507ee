{% set cfg = spec.config %}
{% set tf32 = spec.dtype.value == "f32" %}
{% set a_kcont = spec.layout_a.value == "r" %}
{% set b_kcont = spec.layout_b.value == "c" %}
// {{ spec.kernel_name }}
// Y = act(alpha * A @ B{% if spec.epilogue.has_c %} + beta * C{% endif %}{% if spec.epilogue.bias.value != "nobias" %} + bias{% endif %}) on the tensor cores: {{ "tf32 m16n8k8" if tf32 else spec.dtype.numpy_name + " m16n8k16" }} mma.sync, float32 accumulators, fused epilogue.
// A {{ "row" if a_kcont else "column" }}-major ({{ spec.copy_a }}-byte copies), B {{ "row" if spec.layout_b.value == "r" else "column" }}-major ({{ spec.copy_b }}-byte copies); {{ cfg.stages }}-stage cp.async pipeline; Y{% if spec.epilogue.save_z %}, Z{% endif %} {{ spec.epilogue.out_dtype.numpy_name }}.
{% import "common/epilogue_constants.cuh" as ep %}
{% include "common/types.cuh" %}
{% include "common/activations.cuh" %}
{{ ep.constants(spec) }}
{% include "common/epilogue.cuh" %}
{% include "common/sm80/cp_async.cuh" %}
{% include "common/sm80/ldmatrix.cuh" %}
{% include "common/sm80/mma.cuh" %}

typedef {{ spec.in_ctype }} T_IN;
constexpr int BM = {{ cfg.bm }};
constexpr int BN = {{ cfg.bn }};
constexpr int BK = {{ cfg.bk }};          // elements
constexpr int WM = {{ cfg.wm }};
constexpr int WN = {{ cfg.wn }};
constexpr int STAGES = {{ cfg.stages }};
constexpr int ES = {{ spec.dtype.itemsize }};             // bytes per element
constexpr int KSTEP = 32 / ES;          // k of one mma: 16 (16-bit) or 8 (tf32) = 32 bytes
constexpr int WARPS_N = BN / WN;
constexpr int THREADS = (BM / WM) * WARPS_N * 32;
constexpr int MI = WM / 16;             // m16 fragments per warp tile
constexpr int NI = WN / 8;              // n8 fragments per warp tile
constexpr int COPY_A = {{ spec.copy_a }};
constexpr int COPY_B = {{ spec.copy_b }};
constexpr bool TF32 = {{ "true" if tf32 else "false" }};   // tf32 inputs (float32 bits), else 16-bit
constexpr bool A_KCONT = {{ "true" if a_kcont else "false" }};   // A row-major (K-contiguous)
constexpr bool B_KCONT = {{ "true" if b_kcont else "false" }};   // B column-major (K-contiguous)
constexpr bool PROMOTE = {{ "true" if spec.promote else "false" }};   // rounded float32 sums of each product block
static_assert(NI % 2 == 0, "B fragments are read two n8 tiles at a time");
static_assert(BK % KSTEP == 0, "BK must hold whole mma k-steps");

// Shared tiles keep each operand's global orientation, so that every copy is a straight
// cp.async: a K-contiguous tile (row-major A, column-major B) has BM (BN) rows of BK * ES
// bytes; an MN-contiguous tile has BK rows of BM * ES (BN * ES) bytes. Rows are made of 16-byte
// chunks whose index is XORed with a function of the row (swizzle), so that the 8 rows an
// ldmatrix phase reads fall in 8 distinct bank groups.
constexpr int A_ROW_BYTES = A_KCONT ? BK * ES : BM * ES;
constexpr int B_ROW_BYTES = B_KCONT ? BK * ES : BN * ES;
constexpr int A_TILE_BYTES = BM * BK * ES;
constexpr int B_TILE_BYTES = BN * BK * ES;
constexpr int STAGE_BYTES = A_TILE_BYTES + B_TILE_BYTES;

// Byte offset of chunk `chunk` of row `row` in a tile with ROW_BYTES-byte rows. SCALAR32: the
// tile is read one 32-bit word at a time, 4 rows x 8 words per warp (tf32, MN-contiguous).
template <int ROW_BYTES, bool SCALAR32>
__device__ __forceinline__ int swizzle(int row, int chunk) {
    constexpr int CPR = ROW_BYTES / 16;
    static_assert(CPR == 4 || CPR % 8 == 0, "rows of 64 bytes or of a multiple of 128 bytes");
    const int x = SCALAR32 ? (row & 3) << 1 : (CPR == 4 ? (row >> 1) & 3 : row & 7);
    return row * ROW_BYTES + ((chunk ^ x) << 4);
}
constexpr bool A_SCALAR = TF32 && !A_KCONT;
constexpr bool B_SCALAR = TF32 && !B_KCONT;

// One 16-byte chunk from global memory (`valid` bytes of it; the rest is zero-filled) in
// copies of COPY bytes, which the operand's pointer and leading dimension allow.
template <int COPY>
__device__ __forceinline__ void copy_chunk(char* dst, const T_IN* src, const T_IN* base,
                                           int valid) {
    if (COPY == 16) {
        cp_async_16(dst, valid > 0 ? src : base, max(valid, 0));
    } else {
#pragma unroll
        for (int v = 0; v < 16 / COPY; ++v) {
            const int bytes = min(max(valid - v * COPY, 0), COPY);
            const T_IN* s = bytes ? src + v * (COPY / ES) : base;
            if (COPY == 8) cp_async_8(dst + v * COPY, s, bytes);
            else cp_async_4(dst + v * COPY, s, bytes);
        }
    }
}

// One operand tile of `rows` x ROW_BYTES bytes into shared memory. KCONT: the rows run along
// M (or N) and each is K-contiguous in global memory (X[mn * ld + k]); else the rows run along
// K (X[k * ld + mn]). `mn0`, `k0`: the tile's origin; `MN`, `K`: the operand's extent.
template <bool KCONT, int ROW_BYTES, bool SCALAR32, int COPY, int TILE_BYTES>
__device__ __forceinline__ void load_operand(char* __restrict__ S, const T_IN* __restrict__ X,
                                             long long ld, int MN, int K, int mn0, int k0,
                                             int tid)
{
    constexpr int CPR = ROW_BYTES / 16, CHUNKS = TILE_BYTES / 16, EPC = 16 / ES;
#pragma unroll
    for (int i = 0; i < (CHUNKS + THREADS - 1) / THREADS; ++i) {
        const int u = tid + i * THREADS;
        if (CHUNKS % THREADS == 0 || u < CHUNKS) {
            const int row = u / CPR, c = u % CPR;
            const int mn = KCONT ? mn0 + row : mn0 + c * EPC;
            const int k = KCONT ? k0 + c * EPC : k0 + row;
            // bytes of the chunk inside the operand: elements first, then bytes (a byte count
            // of the whole remaining row overflows 32 bits when K or MN is over 2^30)
            const int valid = KCONT ? (mn < MN ? min(K - k, EPC) * ES : 0)
                                    : (k < K ? min(MN - mn, EPC) * ES : 0);
            const T_IN* src = valid > 0 ? X + (KCONT ? mn * ld + k : k * ld + mn) : X;
            copy_chunk<COPY>(S + swizzle<ROW_BYTES, SCALAR32>(row, c), src, X, min(valid, 16));
        }
    }
}

__device__ __forceinline__ void load_tiles(char* __restrict__ As, char* __restrict__ Bs,
                                           const T_IN* __restrict__ A, long long lda,
                                           const T_IN* __restrict__ B, long long ldb,
                                           int M, int N, int K, int m0, int n0, int k0, int tid)
{
    load_operand<A_KCONT, A_ROW_BYTES, A_SCALAR, COPY_A, A_TILE_BYTES>(
        As, A, lda, M, K, m0, k0, tid);
    load_operand<B_KCONT, B_ROW_BYTES, B_SCALAR, COPY_B, B_TILE_BYTES>(
        Bs, B, ldb, N, K, n0, k0, tid);
}

// 32-bit word `col` of row `row` of a SCALAR32 tile.
template <int ROW_BYTES>
__device__ __forceinline__ unsigned word_at(const char* tile, int row, int col) {
    return *reinterpret_cast<const unsigned*>(
        tile + swizzle<ROW_BYTES, true>(row, col >> 2) + (col & 3) * 4);
}

// (a template, so that the 16-bit call, dependent on T, is not instantiated for tf32)
template <typename T = T_IN>
__device__ __forceinline__ void mma(float (&d)[4], const unsigned (&a)[4], const unsigned (&b)[2]) {
    if constexpr (TF32) mma_m16n8k8_tf32(d, a, b);
    else mma_m16n8k16<T>(d, a, b);
}

// tf32: the fragments hold the float32 bits as they are; the tensor cores read the top 19
// (sign, exponent, 10 mantissa bits), as wgmma does from shared memory: inputs are truncated.
// Fragments of k-step `ks` of the warp tile (rows wm0.., columns wn0..), in the register layout
// of the mma's A (row) and B (col) operands.
__device__ __forceinline__ void load_fragments(unsigned (&af)[MI][4], unsigned (&bf)[NI][2],
                                               const char* As, const char* Bs, int ks,
                                               int wm0, int wn0, int lane)
{
    const int g = lane >> 2, t = lane & 3;
#pragma unroll
    for (int mi = 0; mi < MI; ++mi) {
        if constexpr (A_KCONT) {
            // 4 8x8 matrices: rows +0/+8 x k-chunks +0/+1 (one chunk is 8 halves or 4 floats).
            ldmatrix_x4(af[mi], As + swizzle<A_ROW_BYTES, false>(wm0 + mi * 16 + (lane & 15),
                                                                   ks * 2 + (lane >> 4)));
        } else if constexpr (!TF32) {
            // Transposed reads of the k-major tile: k-rows +0/+8 x m-chunks +0/+1.
            ldmatrix_x4_trans(af[mi], As + swizzle<A_ROW_BYTES, false>(
                ks * 16 + ((lane >> 4) << 3) + (lane & 7),
                (wm0 + mi * 16) / 8 + ((lane >> 3) & 1)));
        } else {
            const int m = wm0 + mi * 16 + g, k = ks * 8 + t;
            af[mi][0] = word_at<A_ROW_BYTES>(As, k, m);
            af[mi][1] = word_at<A_ROW_BYTES>(As, k, m + 8);
            af[mi][2] = word_at<A_ROW_BYTES>(As, k + 4, m);
            af[mi][3] = word_at<A_ROW_BYTES>(As, k + 4, m + 8);
        }
    }
#pragma unroll
    for (int p = 0; p < NI / 2; ++p) {
        if constexpr (B_KCONT || !TF32) {
            unsigned r[4];
            if constexpr (B_KCONT) {
                ldmatrix_x4(r, Bs + swizzle<B_ROW_BYTES, false>(
                    wn0 + p * 16 + ((lane >> 4) << 3) + (lane & 7), ks * 2 + ((lane >> 3) & 1)));
            } else {
                ldmatrix_x4_trans(r, Bs + swizzle<B_ROW_BYTES, false>(
                    ks * 16 + (((lane >> 3) & 1) << 3) + (lane & 7),
                    (wn0 + p * 16) / 8 + (lane >> 4)));
            }
            bf[2 * p][0] = r[0]; bf[2 * p][1] = r[1];
            bf[2 * p + 1][0] = r[2]; bf[2 * p + 1][1] = r[3];
        } else {
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                const int n = wn0 + (2 * p + h) * 8 + g, k = ks * 8 + t;
                bf[2 * p + h][0] = word_at<B_ROW_BYTES>(Bs, k, n);
                bf[2 * p + h][1] = word_at<B_ROW_BYTES>(Bs, k + 4, n);
            }
        }
    }
}

extern "C" __global__ void __launch_bounds__(THREADS, 1)
{{ spec.kernel_name }}({{ spec.param_list() }})
{
    extern __shared__ __align__(128) char smem[];
    auto ep = epilogue(C, ldc, bias, bias_stride, Y, ldy, Z, ldz, M_, N_, alpha_, beta_,
                       leaky_slope_, scale_a, scale_a_stride, scale_b, scale_b_stride, scale_y,
                       amax, y_scale_);
    const int M = ep.M, N = ep.N, K = static_cast<int>(K_);

    const int tid = threadIdx.x;
    const int lane = tid % 32, warp = tid / 32;
    const int wm0 = (warp / WARPS_N) * WM, wn0 = (warp % WARPS_N) * WN;
    const int m0 = blockIdx.x * BM, n0 = blockIdx.y * BN;
    const int k_tiles = ceil_div(K, BK);

    float acc[MI][NI][4];
#pragma unroll
    for (int mi = 0; mi < MI; ++mi)
#pragma unroll
        for (int ni = 0; ni < NI; ++ni)
#pragma unroll
            for (int r = 0; r < 4; ++r)
                acc[mi][ni][r] = 0.0f;

#pragma unroll
    for (int s = 0; s < STAGES - 1; ++s) {
        if (s < k_tiles)
            load_tiles(smem + s * STAGE_BYTES, smem + s * STAGE_BYTES + A_TILE_BYTES, A, lda, B,
                       ldb, M, N, K, m0, n0, s * BK, tid);
        cp_async_commit();
    }

    for (int kt = 0; kt < k_tiles; ++kt) {
        cp_async_wait<STAGES - 2>();
        __syncthreads();   // tile kt has landed, and every warp is done with tile kt - 1
        const int next = kt + STAGES - 1;
        if (next < k_tiles) {
            char* st = smem + (next % STAGES) * STAGE_BYTES;
            load_tiles(st, st + A_TILE_BYTES, A, lda, B, ldb, M, N, K, m0, n0, next * BK, tid);
        }
        cp_async_commit();

        const char* As = smem + (kt % STAGES) * STAGE_BYTES;
        const char* Bs = As + A_TILE_BYTES;
#pragma unroll
        for (int ks = 0; ks < BK / KSTEP; ++ks) {
            unsigned af[MI][4], bf[NI][2];
            load_fragments(af, bf, As, Bs, ks, wm0, wn0, lane);
#pragma unroll
            for (int mi = 0; mi < MI; ++mi)
#pragma unroll
                for (int ni = 0; ni < NI; ++ni) {
                    if constexpr (PROMOTE) {
                        // Each product block into fresh registers, then a rounded float32
                        // add: the tensor cores' own accumulation truncates, which over a
                        // long K drifts past float32's rounding (3xTF32 is after float32
                        // accuracy).
                        float d[4] = {0.0f, 0.0f, 0.0f, 0.0f};
                        mma(d, af[mi], bf[ni]);
#pragma unroll
                        for (int r = 0; r < 4; ++r) acc[mi][ni][r] += d[r];
                    } else {
                        mma(acc[mi][ni], af[mi], bf[ni]);
                    }
                }
        }
    }
    cp_async_wait<0>();

    // Fused epilogue on the accumulator fragments: element r of acc[mi][ni] is row
    // wm0 + mi * 16 + g (+ 8 for r >= 2), column wn0 + ni * 8 + 2 * t (+ 1 for odd r).
    const int g = lane >> 2, t = lane & 3;
    ep.load_scalar_bias();
    float col_bias[NI][2];
    if constexpr (COL_BIAS) {
#pragma unroll
        for (int ni = 0; ni < NI; ++ni)
#pragma unroll
            for (int c = 0; c < 2; ++c) {
                const int n = n0 + wn0 + ni * 8 + 2 * t + c;
                col_bias[ni][c] =
                    n < N ? to_f32(bias[static_cast<long long>(n) * bias_stride]) : 0.0f;
            }
    }
#pragma unroll
    for (int mi = 0; mi < MI; ++mi) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const int m = m0 + wm0 + mi * 16 + g + 8 * h;
            if (m >= M) continue;
            const float row_bias =
                ROW_BIAS ? to_f32(bias[static_cast<long long>(m) * bias_stride]) : 0.0f;
#pragma unroll
            for (int ni = 0; ni < NI; ++ni) {
                const int nb = n0 + wn0 + ni * 8 + 2 * t;
                if (nb >= N) continue;
                ep.finish<2>(Y, m, nb, nb + 1 < N, [&](int c) { return acc[mi][ni][2 * h + c]; },
                             [&](int c, int) { return col_bias[ni][c]; }, row_bias);
            }
        }
    }
}
