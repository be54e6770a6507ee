{% set cfg = spec.config %}
{% set tf32 = spec.dtype.value == "f32" %}
{% set fp8 = spec.dtype.is_fp8 %}
{% set a_kcont = spec.layout_a.value == "r" %}
{% set b_kcont = spec.layout_b.value == "c" %}
{% set n_acc = cfg.bn // 2 %}
{% set glu = spec.epilogue.glu %}
{% set glu_grad = spec.epilogue.glu_grad %}
// {{ spec.kernel_name }}
// Y = act(alpha * A @ B{% if spec.epilogue.has_c %} + beta * C{% endif %}{% if spec.epilogue.bias.value != "nobias" %} + bias{% endif %}) on Hopper's warpgroup tensor cores (sm_90a): {{ "tf32" if tf32 else spec.dtype.numpy_name }} wgmma.m64n{{ cfg.bn }}k{{ 8 if tf32 else 32 if fp8 else 16 }} from shared memory, float32 accumulators, fused epilogue.
// Tiles of A ({{ "K" if a_kcont else "M" }}-major) and B ({{ "K" if b_kcont else "N" }}-major) arrive by TMA (128-byte swizzle) into a {{ cfg.stages }}-stage ring of mbarrier-guarded buffers; one producer warpgroup issues the copies, {{ cfg.consumers }} consumer warpgroups run wgmma and the epilogue{% if cfg.pingpong %} on alternate tiles (one's epilogue overlaps the other's main loop){% else %} on {{ cfg.wg_m }}-row slices of each tile{% endif %}; the grid is persistent over the output tiles.
{% import "common/epilogue.cuh" as ep %}
{# Loads the gate's C values of pass `p` (an expression) of the staged block at rows `mw`..,
   columns `nc`.. into `dst`. #}
{% macro gate_load(p, dst, mw="mw", nc="nc") %}
const int r = ({{ p }}) * GATE_RPP + lane / GATE_SEGS, seg = lane % GATE_SEGS;
const int m = min({{ mw }} + r, M - 1), n = {{ nc }} + seg * EPC;
{% if spec.epilogue.layout_c.value == "r" %}
constexpr int Q = EPC * sizeof(*C) / 16;   // 16-byte loads a segment
if (Q * 16 == EPC * sizeof(*C) && c_vec && n + EPC <= N) {
#pragma unroll
    for (int q = 0; q < Q; ++q)
        reinterpret_cast<uint4*>({{ dst }})[q] = reinterpret_cast<const uint4*>(&C_AT(m, n))[q];
} else
{% endif %}
{
#pragma unroll
    for (int e = 0; e < EPC; ++e) {{ dst }}[e] = C_AT(m, min(n + e, N - 1));
}
{%- endmacro %}
{% include "common/types.cuh" %}
{% include "common/activations.cuh" %}
{% include "common/sm90/mbarrier.cuh" %}
{% include "common/sm90/tma.cuh" %}
{% include "common/sm90/wgmma.cuh" %}
{% include "common/sm90/warpgroup.cuh" %}
{% include "common/sm90/scheduler.cuh" %}
{% if glu_grad and spec.store16 %}
{% include "common/sm80/cp_async.cuh" %}
{% endif %}

constexpr int BM = {{ cfg.bm }};
constexpr int BN = {{ cfg.bn }};
constexpr int ES = {{ spec.dtype.itemsize }};
constexpr int BK = 128 / ES;                  // one 128-byte swizzle row of K per tile row
constexpr int KSTEP = 32 / ES;                // k of one wgmma: 16 (16-bit), 8 (tf32), 32 (8-bit)
constexpr int STAGES = {{ cfg.stages }};
constexpr int CONSUMERS = {{ cfg.consumers }};  // consumer warpgroups
constexpr bool PINGPONG = {{ "true" if cfg.pingpong else "false" }};   // alternate whole tiles
constexpr bool TMA_STORE = {{ "true" if spec.tma_store else "false" }};  // Y, Z leave by TMA stores
constexpr int WG_M = {{ cfg.wg_m }};              // rows of a tile one consumer computes
constexpr int MI = WG_M / 64;                 // wgmma (m64) per k-step and consumer
constexpr int THREADS = (CONSUMERS + 1) * 128;
constexpr int A_STAGE = BM * BK * ES;         // bytes
constexpr int B_STAGE = BN * BK * ES;
constexpr unsigned TX_BYTES = A_STAGE + B_STAGE;
static_assert(PINGPONG ? BM == WG_M : BM == WG_M * CONSUMERS, "rows per consumer");
{% set bias_tile = spec.epilogue.bias.value in ("colbias", "rowbias") %}
{% set scale_tile = spec.scale_tile %}
{% set scale_rows = scale_tile and spec.epilogue.scale_a.value == "r" %}
{% set scale_cols = scale_tile and spec.epilogue.scale_b.value == "c" %}
{% if bias_tile or scale_tile %}
// The {{ "bias of a tile's " ~ ("columns" if spec.epilogue.bias.value == "colbias" else "rows") if bias_tile }}{{ " and the " if bias_tile and scale_tile }}{{ "scales of its rows (A's) and columns (B's)" if scale_tile }}: the consumers that share the tile load
// {{ "them" if scale_tile else "it" }} into registers when the tile starts (the loads' latency hides under the main loop) and
// put {{ "them" if scale_tile else "it" }} in shared memory for the epilogue.
constexpr int GROUP = PINGPONG ? 128 : 128 * CONSUMERS;   // threads that share a tile

// A thread's part (elements member, member + GROUP, ...) of the LEN values of a tile's vector
// from element `origin` on (`stride` apart; zero at and past `extent`), as float32.
template <int LEN, int PER, typename T>
__device__ __forceinline__ void tile_vector_load(float (&out)[PER], const T* v, long long stride,
                                                 int origin, int extent, int member) {
#pragma unroll
    for (int p = 0; p < PER; ++p) {
        const int e = member + p * GROUP;
        out[p] = e < LEN && origin + e < extent
            ? to_f32(v[static_cast<long long>(origin + e) * stride]) : 0.0f;
    }
}

// ... and into shared memory (`dst`: the tile's LEN values).
template <int LEN, int PER>
__device__ __forceinline__ void tile_vector_store(float* dst, const float (&in)[PER], int member) {
#pragma unroll
    for (int p = 0; p < PER; ++p)
        if (member + p * GROUP < LEN) dst[member + p * GROUP] = in[p];
}
{% endif %}
{% if bias_tile %}
constexpr int BIAS_N = {{ "BN" if spec.epilogue.bias.value == "colbias" else "BM" }};
constexpr int BIAS_PER = (BIAS_N + GROUP - 1) / GROUP;    // values per thread
{% endif %}
{% if scale_rows %}
constexpr int SA_PER = (BM + GROUP - 1) / GROUP;          // row scales per thread
{% endif %}
{% if scale_cols %}
constexpr int SB_PER = (BN + GROUP - 1) / GROUP;          // column scales per thread
{% endif %}

{{ ep.c_accessor(spec) }}
{% if spec.c_tma %}
// C (the gate's input, or beta's term) arrives by TMA through the ring: after a tile's k-tiles,
// C_SLOTS more ring positions hold its C tile in units of 64 rows x 128 bytes (128-byte
// swizzle, as the A and B tiles), the first UNITS_A of a position in its A buffer, the rest in
// its B buffer. The copies are issued as positions free up, a few k-tiles before the main loop
// ends, so the epilogue reads C from shared memory instead of waiting on global loads.
using CType = {{ spec.epilogue.c_dtype.ctype }};
constexpr int C_ES = sizeof(CType);
constexpr int C_COLS = 128 / C_ES;                       // columns of a unit
constexpr int C_UNITS_N = BN / C_COLS;                   // units across a tile
constexpr int C_UNITS = BM / 64 * C_UNITS_N;
constexpr int UNITS_A = BM / 64, UNITS_SLOT = (BM + BN) / 64;   // units a ring position holds
constexpr int C_SLOTS = (C_UNITS + UNITS_SLOT - 1) / UNITS_SLOT;
static_assert(C_SLOTS <= 2 && C_SLOTS < STAGES, "C positions of the ring");
// Byte offset from the first tile buffer of unit u of a C tile whose positions are in ring
// slots slot[0..C_SLOTS).
__device__ __forceinline__ int c_unit(const int (&slot)[C_SLOTS], int u) {
    // (constant indices: a computed one would put the slots on the stack)
    const int s = C_SLOTS > 1 && u >= UNITS_SLOT ? slot[C_SLOTS - 1] : slot[0];
    const int q = u % UNITS_SLOT;
    return q < UNITS_A ? s * A_STAGE + q * 8192
                       : STAGES * A_STAGE + s * B_STAGE + (q - UNITS_A) * 8192;
}
// Byte offset of C(rr, cc) of the tile (rr, cc relative to its first row and column).
__device__ __forceinline__ int c_offset(const int (&slot)[C_SLOTS], int rr, int cc) {
    const int b = (cc % C_COLS) * C_ES;
    return c_unit(slot, (rr / 64) * C_UNITS_N + cc / C_COLS) + (rr % 64) * 128
         + ((((b >> 4) ^ (rr & 7)) << 4) | (b & 15));
}
// The N values of C at (rr, cc..) into dst (cc a multiple of N; N values are 4 to 32 bytes).
template <int N>
__device__ __forceinline__ void c_load(const char* ring, const int (&slot)[C_SLOTS], int rr,
                                       int cc, CType* dst) {
    constexpr int BYTES = N * C_ES, PIECE = BYTES < 16 ? BYTES : 16;
    static_assert(BYTES % 4 == 0 && BYTES <= 32, "a segment of C");
#pragma unroll
    for (int q = 0; q < BYTES / PIECE; ++q) {
        const char* src = ring + c_offset(slot, rr, cc + q * (PIECE / C_ES));
        char* d = reinterpret_cast<char*>(dst) + q * PIECE;
        if constexpr (PIECE == 16) {
            *reinterpret_cast<uint4*>(d) = *reinterpret_cast<const uint4*>(src);
        } else if constexpr (PIECE == 8) {
            *reinterpret_cast<uint2*>(d) = *reinterpret_cast<const uint2*>(src);
        } else {
            *reinterpret_cast<unsigned*>(d) = *reinterpret_cast<const unsigned*>(src);
        }
    }
}
{% else %}
constexpr int C_SLOTS = 0;
{% endif %}

// D (+)= A @ B for one k-step: 64 x BN, the accumulators in the register layout of wgmma.
__device__ __forceinline__ void wgmma(float (&d)[{{ n_acc }}], unsigned long long da,
                                      unsigned long long db, int accumulate) {
    asm volatile(
        "{\n"
        ".reg .pred p;\n"
        "setp.ne.b32 p, %{{ n_acc + 2 }}, 0;\n"
{% if tf32 %}
        "wgmma.mma_async.sync.aligned.m64n{{ cfg.bn }}k8.f32.tf32.tf32 "
{% elif fp8 %}
        "wgmma.mma_async.sync.aligned.m64n{{ cfg.bn }}k32.f32.{{ spec.dtype.value }}.{{ spec.dtype.value }} "
{% else %}
        "wgmma.mma_async.sync.aligned.m64n{{ cfg.bn }}k16.f32.{{ spec.dtype.value }}.{{ spec.dtype.value }} "
{% endif %}
        "{ {% for i in range(n_acc) %}%{{ i }}{{ ", " if not loop.last }}{% endfor %} }, "
{% if tf32 or fp8 %}
        "%{{ n_acc }}, %{{ n_acc + 1 }}, p, 1, 1;\n"
{% else %}
        "%{{ n_acc }}, %{{ n_acc + 1 }}, p, 1, 1, {{ 0 if a_kcont else 1 }}, {{ 0 if b_kcont else 1 }};\n"
{% endif %}
        "}\n"
        : {% for i in range(n_acc) %}"+f"(d[{{ i }}]){{ ", " if not loop.last }}{% endfor %}

        : "l"(da), "l"(db), "r"(accumulate));
}

extern "C" __global__ void __launch_bounds__(THREADS, 1)
{{ spec.kernel_name }}({{ spec.param_list() }})
{
    extern __shared__ char smem_raw[];
    {{ ep.scalars(spec=spec) | indent(4) }}
    // 1024-byte aligned tiles (the 128-byte swizzle repeats every 8 rows of 128 bytes).
    const unsigned base = (smem_u32(smem_raw) + 1023u) & ~1023u;
    const unsigned sA = base, sB = base + STAGES * A_STAGE;
    // The epilogue's staging, 4 KiB per consumer warp (1 KiB aligned, as the TMA's 128-byte
    // swizzle wants), then the bias of a tile (floats, one block per group){{ ", its scales (rows, then columns: one block per group)" if scale_tile }}, then the
    // barriers.
    const unsigned sStaging = sB + STAGES * B_STAGE;
    const unsigned sBias = sStaging + CONSUMERS * 4 * 4096;
    const unsigned sScale = sBias + (PINGPONG ? 2 : 1) * (BM > BN ? BM : BN) * 4;
    const unsigned full = sScale + {{ "(PINGPONG ? 2 : 1) * (BM + BN) * 4" if scale_tile else "0" }};
    const unsigned empty = full + 8 * STAGES;
    const unsigned order = empty + 8 * STAGES;   // ping-pong turns of the two consumers
{% if spec.store16 %}
    {{ spec.epilogue.y_ctype }}* const staging =
        reinterpret_cast<{{ spec.epilogue.y_ctype }}*>(smem_raw + (sStaging - smem_u32(smem_raw)));
{% endif %}
{% if spec.c_tma %}
    const char* const ring = smem_raw + (base - smem_u32(smem_raw));   // C is read from here
{% endif %}
{% if bias_tile %}
    float* const bias_tiles = reinterpret_cast<float*>(smem_raw + (sBias - smem_u32(smem_raw)));
{% endif %}
{% if scale_tile %}
    float* const scale_tiles = reinterpret_cast<float*>(smem_raw + (sScale - smem_u32(smem_raw)));
{% endif %}

    // (the launcher refuses problems whose tile or work-unit counts exceed 32 bits)
    const int tiles_m = ceil_div(M, BM), tiles_n = ceil_div(N, BN);
    const int tiles = tiles_m * tiles_n, k_tiles = ceil_div(K, BK);
{% if spec.split_k %}
    // Split K: work unit u is K slice u / tiles of tile u % tiles; each writes its raw float32
    // partial products to slice u / tiles of the workspace Y (splits x M x ldy), and the
    // reduction kernel (gemm/splitk_reduce.cu) sums them and applies the epilogue once.
    const int per_split = static_cast<int>(k_tiles_per_split);
    const int units = tiles * ceil_div(k_tiles, per_split);
{% else %}
    const int per_split = k_tiles, units = tiles;
{% endif %}
    const int warpgroup = threadIdx.x / 128;

    if (threadIdx.x == 0) {
        for (int s = 0; s < STAGES; ++s) {
            mbar_init(full + 8 * s, 1);                  // the producer's expect_tx
            mbar_init(empty + 8 * s, (PINGPONG ? 1 : CONSUMERS) * 4);  // per consumer warp
        }
        mbar_init(order, 4);
        mbar_init(order + 8, 4);
        mbar_fence_init();
    }
    __syncthreads();

    if (warpgroup == 0) {
        // Producer: one thread walks the same tiles as the consumers and keeps the ring full.
        warpgroup_registers_down<{{ 40 if cfg.consumers <= 2 else 32 }}>();
        if (threadIdx.x == 0 && k_tiles > 0) {
            int it = 0;
            for (int unit = blockIdx.x; unit < units; unit += gridDim.x) {
                const int tile = unit % tiles, kt0 = (unit / tiles) * per_split;
                int m0, n0;
                tile_origin<BM, BN>(tile, tiles_m, tiles_n, m0, n0);
                for (int kt = kt0; kt < min(kt0 + per_split, k_tiles); ++kt, ++it) {
                    const int s = it % STAGES;
                    mbar_wait(empty + 8 * s, ((it / STAGES) & 1) ^ 1);
                    mbar_expect_tx(full + 8 * s, TX_BYTES);
                    const int k0 = kt * BK;
{% if a_kcont %}
                    tma_load(sA + s * A_STAGE, &tma_a, k0, m0, full + 8 * s);
{% else %}
#pragma unroll
                    for (int j = 0; j < BM / 64; ++j)
                        tma_load(sA + s * A_STAGE + j * (BK * 128), &tma_a, m0 + 64 * j, k0,
                                 full + 8 * s);
{% endif %}
{% if b_kcont %}
                    tma_load(sB + s * B_STAGE, &tma_b, k0, n0, full + 8 * s);
{% else %}
#pragma unroll
                    for (int j = 0; j < BN / 64; ++j)
                        tma_load(sB + s * B_STAGE + j * (BK * 128), &tma_b, n0 + 64 * j, k0,
                                 full + 8 * s);
{% endif %}
                }
{% if spec.c_tma %}
                for (int c = 0; c < C_SLOTS; ++c, ++it) {   // the tile's C, after its k-tiles
                    const int s = it % STAGES;
                    const int units = min(UNITS_SLOT, C_UNITS - c * UNITS_SLOT);
                    mbar_wait(empty + 8 * s, ((it / STAGES) & 1) ^ 1);
                    mbar_expect_tx(full + 8 * s, units * 8192);
                    for (int q = 0; q < units; ++q) {
                        const int u = c * UNITS_SLOT + q;
                        tma_load(q < UNITS_A ? sA + s * A_STAGE + q * 8192
                                             : sB + s * B_STAGE + (q - UNITS_A) * 8192,
                                 &tma_c, n0 + (u % C_UNITS_N) * C_COLS, m0 + (u / C_UNITS_N) * 64,
                                 full + 8 * s);
                    }
                }
{% endif %}
            }
        }
        return;
    }

    // Consumers. Cooperative: warpgroup wg + 1 computes rows WG_M wg .. of every tile. Ping-pong:
    // it computes whole tiles, every other one of this block's, in turns with the other
    // consumer: its main loop starts when the other's has finished, so that each waits on ring
    // positions at most one phase ahead of the barriers, and one's epilogue overlaps the other's
    // main loop.
    warpgroup_registers_up<{{ 232 if cfg.consumers <= 2 else 160 }}>();
    const int wg = warpgroup - 1;
    const int lane = threadIdx.x % 32, warp = (threadIdx.x / 32) % 4;
    const int g = lane >> 2, t = lane & 3;
    const int row0 = PINGPONG ? 0 : wg * WG_M;    // this consumer's first row in a tile
{% if spec.epilogue.gate and spec.store16 and spec.epilogue.layout_c.value == "r" and not spec.c_tma %}
    // C (the gate's input) in 16-byte segments when its rows are 16-byte aligned
    const bool c_vec = ((reinterpret_cast<unsigned long long>(C) |
                         static_cast<unsigned long long>(ldc) * sizeof(*C)) & 15) == 0;
{% endif %}
{% if bias_tile or scale_tile %}
    const int member = PINGPONG ? threadIdx.x % 128 : threadIdx.x - 128;   // index in the group
{% endif %}
{% if bias_tile %}
    float* const tile_bias = bias_tiles + (PINGPONG ? wg * BIAS_N : 0);
{% endif %}
{% if scale_tile %}
    float* const tile_scale_a = scale_tiles + (PINGPONG ? wg * (BM + BN) : 0);
    float* const tile_scale_b = tile_scale_a + BM;
{% endif %}
    float acc[MI][{{ n_acc }}];
#pragma unroll
    for (int mi = 0; mi < MI; ++mi)
#pragma unroll
        for (int i = 0; i < {{ n_acc }}; ++i) acc[mi][i] = 0.0f;
{% if spec.promote %}
    // The tensor cores add into their accumulators with truncation (for 8-bit inputs with
    // fewer bits than float32's), which over a long K drifts well past float32's rounding. So
    // each chunk of CHUNK k-tiles (128 values of K) starts from fresh accumulators, and its
    // sum is added to `total` by ordinary, rounded float32 additions.
    constexpr int CHUNK = 128 / BK;
    float total[MI][{{ n_acc }}];
#pragma unroll
    for (int mi = 0; mi < MI; ++mi)
#pragma unroll
        for (int i = 0; i < {{ n_acc }}; ++i) total[mi][i] = 0.0f;
{% endif %}
{% if spec.epilogue.bias.value == "scalarbias" %}
    const float bias_value = to_f32(bias[0]);
{% endif %}

    int turn = 0;
{% if spec.tma_store %}
    int sbuf = 0;   // which of the warp's two staging blocks the next 16 x 64 block fills
{% endif %}
{% if spec.split_k %}
    int ring = 0;   // ring position of the unit's first k-tile: k-tiles of earlier units
    {{ spec.epilogue.y_ctype }}* const Y_slices = Y;
{% endif %}
    for (int unit = blockIdx.x, i = 0; unit < units; unit += gridDim.x, ++i) {
{% if spec.split_k %}
        const int tile = unit % tiles, kt0 = (unit / tiles) * per_split;
        const int kt_end = min(kt0 + per_split, k_tiles);
        const int first = ring;
        ring += kt_end - kt0;
{% else %}
        constexpr int kt0 = 0;
        const int tile = unit, kt_end = k_tiles, first = i * (k_tiles + C_SLOTS);
{% endif %}
        if (PINGPONG && (i & 1) != wg) continue;
        int m0, n0;
        tile_origin<BM, BN>(tile, tiles_m, tiles_n, m0, n0);
{% if bias_tile %}
        float bias_next[BIAS_PER];
{% if spec.epilogue.bias.value == "colbias" %}
        tile_vector_load<BIAS_N>(bias_next, bias, bias_stride, n0, N, member);
{% else %}
        tile_vector_load<BIAS_N>(bias_next, bias, bias_stride, m0, M, member);
{% endif %}
{% endif %}
{% if scale_rows %}
        float scale_a_next[SA_PER];
        tile_vector_load<BM>(scale_a_next, scale_a, scale_a_stride, m0, M, member);
{% endif %}
{% if scale_cols %}
        float scale_b_next[SB_PER];
        tile_vector_load<BN>(scale_b_next, scale_b, scale_b_stride, n0, N, member);
{% endif %}
{% if spec.split_k %}
        {{ spec.epilogue.y_ctype }}* const Y = Y_slices + static_cast<long long>(unit / tiles) * M * ldy;
{% endif %}
{% if (spec.epilogue.gate or glu_grad) and not spec.c_tma %}
{% set cw = "2 * " if glu_grad else "" %}
        {   // This consumer's part of C (the gate's input, or the gated linear unit's Z: twice
            // the tile's columns) into L2 while the main loop runs, so that the epilogue's
            // reads of it wait on L2, not on memory (the plain C epilogue measured slower with
            // it). Each contiguous run of it (a row's columns, or a column's WG_M rows) by
            // 128-byte lines, plus its last element (a run need not start on a line).
{% if spec.epilogue.layout_c.value == "r" %}
            constexpr int RUNS = WG_M, RUN = {{ cw }}BN;
{% else %}
            constexpr int RUNS = {{ cw }}BN, RUN = WG_M;
{% endif %}
            constexpr int PER_LINE = 128 / sizeof(*C), LINES = (RUN + PER_LINE - 1) / PER_LINE;
            for (int q = threadIdx.x % 128; q < RUNS * (LINES + 1); q += 128) {
                const int run = q / (LINES + 1), l = q % (LINES + 1);
                const int at = l == LINES ? RUN - 1 : l * PER_LINE;
{% if spec.epilogue.layout_c.value == "r" %}
                const int m = m0 + row0 + run, n = min({{ cw }}n0 + at, {{ cw }}N - 1);
{% else %}
                const int m = min(m0 + row0 + at, M - 1), n = {{ cw }}n0 + run;
{% endif %}
                if (m < M && n < {{ cw }}N) prefetch_l2(&C_AT(m, n));
            }
        }
{% endif %}
        if (PINGPONG && (wg == 1 || turn > 0))
            mbar_wait(order + 8 * wg, (wg == 1 ? turn : turn - 1) & 1);
        int prev = -1;
        for (int kt = kt0; kt < kt_end; ++kt) {
            const int it = first + kt - kt0;      // this k-tile's position in the ring
            const int s = it % STAGES;
            mbar_wait(full + 8 * s, (it / STAGES) & 1);
            wgmma_fence();
#pragma unroll
            for (int kk = 0; kk < BK / KSTEP; ++kk) {
{% if b_kcont %}
                const unsigned long long db = descriptor(sB + s * B_STAGE + kk * 32, 16, 1024);
{% else %}
                const unsigned long long db =
                    descriptor(sB + s * B_STAGE + kk * 2048, BK * 128, 1024);
{% endif %}
#pragma unroll
                for (int mi = 0; mi < MI; ++mi) {
{% if a_kcont %}
                    // K-major: rows of 128 bytes, 8-row groups 1024 bytes apart; k-steps of
                    // 32 bytes.
                    const unsigned long long da = descriptor(
                        sA + s * A_STAGE + (row0 + mi * 64) * 128 + kk * 32, 16, 1024);
{% else %}
                    // M-major: 64-wide column blocks of BK rows; a k-step is 16 rows.
                    const unsigned long long da = descriptor(
                        sA + s * A_STAGE + ((row0 + mi * 64) / 64) * (BK * 128) + kk * 2048,
                        BK * 128, 1024);
{% endif %}
{% if spec.promote %}
                    wgmma(acc[mi], da, db, (kt - kt0) % CHUNK > 0 || kk > 0);
{% else %}
                    wgmma(acc[mi], da, db, kt > kt0 || kk > 0);
{% endif %}
                }
            }
            wgmma_commit();
            if (prev >= 0) {
                wgmma_wait<1>();                 // the previous stage's products are done
                if (lane == 0) mbar_arrive(empty + 8 * prev);
            }
            prev = s;
{% if spec.promote %}
            if ((kt - kt0) % CHUNK == CHUNK - 1 || kt == kt_end - 1) {
                wgmma_wait<0>();
#pragma unroll
                for (int mi = 0; mi < MI; ++mi)
#pragma unroll
                    for (int e = 0; e < {{ n_acc }}; ++e) total[mi][e] += acc[mi][e];
            }
{% endif %}
        }
        wgmma_wait<0>();
        if (prev >= 0 && lane == 0) mbar_arrive(empty + 8 * prev);
{% if spec.promote %}
#pragma unroll
        for (int mi = 0; mi < MI; ++mi)
#pragma unroll
            for (int e = 0; e < {{ n_acc }}; ++e) {
                acc[mi][e] = total[mi][e];
                total[mi][e] = 0.0f;
            }
{% endif %}
{% if spec.c_tma %}
        // This tile's C, in the ring positions after its k-tiles: wait for its copies before
        // the other ping-pong consumer starts its main loop, which would otherwise wait on a
        // later phase of these positions' barriers while they are still in this one (a wait
        // by parity cannot tell phases two apart).
        int c_slot[C_SLOTS];
#pragma unroll
        for (int c = 0; c < C_SLOTS; ++c) {
            const int at = first + (kt_end - kt0) + c;
            c_slot[c] = at % STAGES;
            mbar_wait(full + 8 * c_slot[c], (at / STAGES) & 1);
        }
{% endif %}
        if (PINGPONG) {
            if (lane == 0) mbar_arrive(order + 8 * (1 - wg));   // the other consumer's turn
            ++turn;
        }
{% if bias_tile or scale_tile %}
        // The group has finished reading the previous tile's {{ "bias" if bias_tile else "scales" }}; store this tile's.
        named_barrier(PINGPONG ? 1 + wg : 1, GROUP);
{% if bias_tile %}
        tile_vector_store<BIAS_N>(tile_bias, bias_next, member);
{% endif %}
{% if scale_rows %}
        tile_vector_store<BM>(tile_scale_a, scale_a_next, member);
{% endif %}
{% if scale_cols %}
        tile_vector_store<BN>(tile_scale_b, scale_b_next, member);
{% endif %}
        named_barrier(PINGPONG ? 1 + wg : 1, GROUP);
{% endif %}

{% if spec.store16 %}
        // Fused epilogue through shared memory: each warp computes Z (or Y) for its 16 rows,
        // 64 columns at a time, rounds them to the output type into a staging block (16-byte
        // segments XOR-swizzled by row: the TMA's 128-byte swizzle for 16-bit outputs, its
        // 64-byte one for 8-bit outputs, whose rows are 64 bytes), then
{% if spec.tma_store %}
        // one lane stores the block by TMA (rows and columns past M, N are skipped) while the
        // warp fills its other block.
{% else %}
        // writes whole 16-byte segments: every row of the block goes out in full lines.
{% endif %}
        constexpr int EPC = 16 / {{ spec.epilogue.out_dtype.itemsize }};   // outputs per 16-byte segment
        // a staged row's segment s is at s ^ swz(r): rows of 64 bytes repeat the pattern every
        // 8 rows, 2 rows a step (the 64-byte swizzle), longer ones every 8 rows, a row a step
        const auto swz = [](int r) { return EPC == 16 ? (r >> 1) & 3 : r & 7; };
{% if glu %}
        // A gated linear unit: blocks of 128 columns of the accumulators (64 pairs) make the
        // 64 columns of a staged block of Y (NY columns in all); Z takes two blocks.
        constexpr int CHUNK = 128;
        const int NY = N / 2;
{% elif glu_grad %}
        // A gated linear unit's backward: 32 columns of the accumulators (dH) and the 64 of
        // the unit's Z (C) with the same rows make a block of 64 columns of dZ (Y, NZ columns
        // in all). The warp copies the block of Z into its staging block (cp.async, whole
        // 16-byte segments, from L2 where the prefetch above put them), forms dZ there in
        // place, and stores it by TMA.
        constexpr int CHUNK = 32;
        const int NZ = 2 * N;
{% else %}
        constexpr int CHUNK = 64;   // columns of the accumulators a staged block holds
{% endif %}
{% if spec.epilogue.gate %}
        constexpr int GATE_SEGS = 64 / EPC, GATE_RPP = 32 / GATE_SEGS;   // segments a row, rows a pass
        constexpr int GATE_PASSES = 16 / GATE_RPP;
{% if spec.c_tma %}
        constexpr int GATE_HELD = 1;   // (C from shared memory, a segment a pass where used)
{% elif spec.epilogue.layout_c.value == "r" %}
        constexpr int GATE_REGS = EPC * sizeof(*C) / 4;   // registers a pass's values
        // Where a block's C values fit in 16 registers (16-bit C and Y), the warp loads the
        // next block's while it stages, gates and stores this one, so that the loads' latency
        // hides under that work. Else the first GATE_HELD passes' values are loaded before the
        // block is staged, each later one as a slot frees.
        constexpr bool GATE_AHEAD = GATE_PASSES * GATE_REGS <= 16;
        constexpr int GATE_HELD = GATE_REGS <= 4 ? GATE_PASSES : 2;
        alignas(16) {{ spec.epilogue.c_dtype.ctype }} cg_next[GATE_AHEAD ? GATE_PASSES : 1][EPC];
        if (GATE_AHEAD) {   // the first block's
            const int mw = m0 + row0 + warp * 16, nc = n0;
#pragma unroll
            for (int p = 0; p < (GATE_AHEAD ? GATE_PASSES : 0); ++p) {
                {{ gate_load("p", "cg_next[p]") | indent(16) }}
            }
        }
{% else %}
        // (column-major C: element by element, an address each, loaded where used)
        constexpr int GATE_HELD = 1;
{% endif %}
{% endif %}
{% if spec.tma_store %}
        {{ spec.epilogue.y_ctype }}* const st2 = staging + (wg * 4 + warp) * (2 * 16 * 64);
{% else %}
        constexpr int SEGS = 64 / EPC;                  // segments per staged row
        constexpr int RPP = 32 / SEGS;                  // rows per pass of the warp
        {{ spec.epilogue.y_ctype }}* const st = staging + (wg * 4 + warp) * (16 * 64);
{% endif %}
#pragma unroll
        for (int mi = 0; mi < MI; ++mi) {
            const int mw = m0 + row0 + mi * 64 + warp * 16;    // this warp's first row
{% if scale_rows %}
            // the scales of this thread's two rows (a row past M: the last row's, not stored)
            const float row_scale[2] = {tile_scale_a[min(mw + g, M - 1) - m0],
                                        tile_scale_a[min(mw + g + 8, M - 1) - m0]};
{% endif %}
#pragma unroll
            for (int jc = 0; jc < BN / CHUNK; ++jc) {
                const int nc = n0 + jc * CHUNK;
                if (nc >= N) break;
{% if spec.epilogue.gate and spec.epilogue.layout_c.value == "r" and not spec.c_tma %}
                // The gate's C values for this block (rows in passes of GATE_RPP, a 16-byte
                // segment of output columns a lane): loaded ahead, or the first passes' now.
                alignas(16) {{ spec.epilogue.c_dtype.ctype }} cg[GATE_HELD][EPC];
                if (GATE_AHEAD) {
#pragma unroll
                    for (int p = 0; p < GATE_HELD; ++p)
#pragma unroll
                        for (int e = 0; e < EPC; ++e) cg[p][e] = cg_next[GATE_AHEAD ? p : 0][e];
                    // the next block of this warp: the next 64 columns, or the next 64 rows
                    // (the loop leaves a row of blocks at the first column past N)
                    const bool next_col = jc + 1 < BN / 64 && nc + 64 < N;
                    if (next_col || mi + 1 < MI) {
                        const int mw_next = next_col ? mw : mw + 64;
                        const int nc_next = next_col ? nc + 64 : n0;
#pragma unroll
                        for (int p = 0; p < (GATE_AHEAD ? GATE_PASSES : 0); ++p) {
                            {{ gate_load("p", "cg_next[p]", "mw_next", "nc_next") | indent(28) }}
                        }
                    }
                } else {
#pragma unroll
                    for (int p = 0; p < GATE_HELD; ++p) {
                        {{ gate_load("p", "cg[p]") | indent(24) }}
                    }
                }
{% endif %}
{% if glu_grad %}
                {   // dZ, columns 2 nc..
                const int yc = 2 * nc;
                {{ spec.epilogue.y_ctype }}* const st = st2 + sbuf * (16 * 64);
                if (lane == 0) bulk_wait_read<1>();   // this block's store of two rounds ago
                __syncwarp();
#pragma unroll
                for (int p = 0; p < 4; ++p) {   // 16 rows of 8 segments: 4 a lane
                    const int r = p * 4 + lane / 8, seg = lane % 8;
                    const int m = mw + r, n = yc + seg * 8;
                    const int bytes = m < M && n < NZ ? 2 * min(8, NZ - n) : 0;
                    cp_async_16(&st[r * 64 + (seg ^ (r & 7)) * 8],
                                bytes ? &C[static_cast<long long>(m) * ldc + n] : C, bytes);
                }
                cp_async_commit();
                cp_async_wait<0>();
                __syncwarp();
                // groups of 8 columns of the accumulators: a thread's pair makes 4 columns of
                // dZ (16 j8 + 4 t of the block) from the 4 of Z there
#pragma unroll
                for (int j8 = 0; j8 < 4; ++j8) {
#pragma unroll
                    for (int h = 0; h < 2; ++h) {
                        const int r = g + 8 * h, col = j8 * 16 + 4 * t;
                        {{ spec.epilogue.y_ctype }}* const s = &st[r * 64 + ((col / 8) ^ (r & 7)) * 8 + col % 8];
                        float v[4];
                        load_vec(s, v);
#pragma unroll
                        for (int c = 0; c < 2; ++c) {
                            {{ ep.compute_z(spec, "d", "acc[mi][4 * (jc * CHUNK / 8 + j8) + 2 * h + c]", "m", "n") | indent(28) }}
                            const float gate = v[2 * c], lin = v[2 * c + 1];
                            v[2 * c] = d * lin * {{ ep.dact(glu_grad, "gate", "leaky_slope", False, spec.fast_act) }};
                            v[2 * c + 1] = d * act_{{ glu_grad.value }}{{ "_fast" if spec.fast_act else "" }}(gate, leaky_slope);
                        }
                        store_vec(s, v);
                    }
                }
                fence_proxy_async();
                __syncwarp();
                if (lane == 0) {
                    // a group for every block, empty where its rows are all past M: the wait
                    // above counts groups as blocks, two buffers apart
                    if (mw < M) tma_store(&tma_y, smem_u32(st), yc, mw);
                    bulk_commit();
                }
                sbuf ^= 1;
                }
{% else %}
{# (what, which 64 of the chunk's columns): a gated linear unit's Y from the whole chunk #}
{% if glu %}
{% set pieces = [("Y", 0)] + ([("Z", 0), ("Z", 1)] if spec.epilogue.save_z else []) %}
{% else %}
{% set pieces = ([("Z", 0)] if spec.epilogue.save_z else []) + [("Y", 0)] %}
{% endif %}
{% for what, q in pieces %}
{% set glu_y = glu and what == "Y" %}
                {   // {{ what }}{{ " (the gated linear unit's: a column from each pair)" if glu_y else "" }}, columns {{ "nc / 2" if glu_y else "nc" if q == 0 else "nc + 64" }}..
                const int yc = {{ "nc / 2" if glu_y else "nc" if q == 0 else "nc + 64" }};
{% if spec.tma_store %}
                {{ spec.epilogue.y_ctype }}* const st = st2 + sbuf * (16 * 64);
                if (lane == 0) bulk_wait_read<1>();   // this block's store of two rounds ago
                __syncwarp();
{% endif %}
                // groups of 8 columns of the accumulators{{ ": a thread's pair, (gate, linear), makes one column of Y (4 j8 + t of the block)" if glu_y }}
#pragma unroll
                for (int j8 = 0; j8 < {{ 16 if glu_y else 8 }}; ++j8) {
                    const int nb = {{ "nc" if glu_y else "yc" }} + j8 * 8 + 2 * t;
{% if spec.epilogue.bias.value == "colbias" %}
                    const float2 cb = *reinterpret_cast<const float2*>(&tile_bias[nb - n0]);
                    const float col_bias[2] = {cb.x, cb.y};
{% endif %}
{% if scale_cols %}
                    const float2 sb = *reinterpret_cast<const float2*>(&tile_scale_b[nb - n0]);
                    const float col_scale[2] = {sb.x, sb.y};
{% endif %}
#pragma unroll
                    for (int h = 0; h < 2; ++h) {
                        const int r = g + 8 * h;
                        const int m = min(mw + r, M - 1);   // clamped: rows past M are not stored
{% if spec.epilogue.bias.value == "rowbias" %}
                        const float row_bias = tile_bias[m - m0];
{% endif %}
                        float v[2];
{% if spec.c_tma and not spec.epilogue.gate %}
                        alignas(8) CType cv[2];
                        c_load<2>(ring, c_slot, mw - m0 + r, nb - n0, cv);
{% endif %}
#pragma unroll
                        for (int c = 0; c < 2; ++c) {
                            const int n = min(nb + c, N - 1);
                            {{ ep.compute_z(spec, "z", "acc[mi][4 * ((jc * CHUNK + " ~ 64 * q ~ ") / 8 + j8) + 2 * h + c]", "m", "n", "col_bias[c]", "row_bias", gate=False, c_value="cv[c]" if spec.c_tma else None, row_scale="row_scale[h]" if scale_rows else None, col_scale="col_scale[c]" if scale_cols else None) | indent(28) }}
{% if what == "Z" or glu_y %}
                            v[c] = z;
{% else %}
                            v[c] = act_{{ spec.epilogue.act.value }}{{ "_fast" if spec.fast_act else "" }}(z, leaky_slope);
                            {{ ep.y_finish(spec, "v[c]", "mw + r < M && nb + c < N") | indent(28) }}
{% endif %}
                        }
{% if glu_y %}
                        const int col = j8 * 4 + t;
                        store(&st[r * 64 + ((col / EPC) ^ swz(r)) * EPC + col % EPC],
                              {{ ep.glu_value(spec, "v[0]", "v[1]") }});
{% else %}
                        const int col = j8 * 8 + 2 * t;
                        store_vec(&st[r * 64 + ((col / EPC) ^ swz(r)) * EPC + col % EPC], v);
{% endif %}
                    }
                }
{% if spec.epilogue.gate %}
                // The gate, on the staged block: Y = Z * act'(C), C read as whole rows of
                // 16-byte segments (coalesced), Z as staged (rounded once already, as a
                // framework's separate pass over a stored product would have it).
                __syncwarp();
{% if spec.epilogue.bgrad %}
                float bsum[EPC] = {};   // this lane's rows' sums of its segment's columns
{% endif %}
{% if spec.epilogue.bgrad and spec.c_tma and cfg.bn == 256 %}
#pragma unroll 1   // (unrolled, the 128x256 tile's sums spill registers)
{% else %}
#pragma unroll
{% endif %}
                for (int p = 0; p < GATE_PASSES; ++p) {
                    const int r = p * GATE_RPP + lane / GATE_SEGS, seg = lane % GATE_SEGS;
{% if spec.c_tma %}
                    alignas(16) CType cg[1][EPC];
                    c_load<EPC>(ring, c_slot, mw - m0 + r, nc - n0 + seg * EPC, cg[0]);
{% elif spec.epilogue.layout_c.value == "c" %}
                    {{ spec.epilogue.c_dtype.ctype }} cg[1][EPC];
                    {
                        {{ gate_load("p", "cg[0]") | indent(24) }}
                    }
{% endif %}
                    if (mw + r < M && nc + seg * EPC < N) {
                        {{ spec.epilogue.y_ctype }}* const s = &st[r * 64 + (seg ^ swz(r)) * EPC];
                        float v[EPC];
                        load_vec(s, v);
#pragma unroll
                        for (int e = 0; e < EPC; ++e)
                            v[e] *= {{ ep.gate_factor(spec, "to_f32(cg[p % GATE_HELD][e])") }};
                        store_vec(s, v);
{% if spec.epilogue.bgrad %}
                        load_vec(s, v);   // as stored: the GEMMs' dZ, as autograd sums it
#pragma unroll
                        for (int e = 0; e < EPC; ++e) bsum[e] += v[e];
{% endif %}
                    }
{% if spec.epilogue.layout_c.value == "r" and not spec.c_tma %}
                    if (p + GATE_HELD < GATE_PASSES) {
                        {{ gate_load("p + GATE_HELD", "cg[p % GATE_HELD]") | indent(24) }}
                    }
{% endif %}
                }
{% if spec.epilogue.bgrad %}
                // The block's 16-row column sums of Y as stored: the lanes of a segment add
                // their rows' sums, and those of the first rows write them; rows past M added
                // nothing.
#pragma unroll
                for (int o = GATE_SEGS; o < 32; o *= 2)
#pragma unroll
                    for (int e = 0; e < EPC; ++e) bsum[e] += __shfl_xor_sync(0xffffffffu, bsum[e], o);
                if (lane < GATE_SEGS && mw < M) {
                    float* const out = bias + static_cast<long long>(mw / 16) * bias_stride;
#pragma unroll
                    for (int e = 0; e < EPC; ++e)
                        if (nc + lane * EPC + e < N) out[nc + lane * EPC + e] = bsum[e];
                }
{% endif %}
{% endif %}
{% if spec.tma_store %}
                fence_proxy_async();
                __syncwarp();
                if (lane == 0) {
                    // a group for every block, empty where its rows are all past M: the wait
                    // above counts groups as blocks, two buffers apart
                    if (mw < M) tma_store(&tma_{{ what | lower }}, smem_u32(st), yc, mw);
                    bulk_commit();
                }
                sbuf ^= 1;
{% else %}
                __syncwarp();
#pragma unroll 1
                for (int p = 0; p < 16 / RPP; ++p) {
                    const int r = p * RPP + lane / SEGS, seg = lane % SEGS;
                    const int m = mw + r, n = yc + seg * EPC;
                    if (m < M && n < {{ "NY" if glu_y else "N" }}) {
                        const {{ spec.epilogue.y_ctype }}* const src = &st[r * 64 + (seg ^ swz(r)) * EPC];
                        auto* dst = &{{ what }}[static_cast<long long>(m) * ld{{ what | lower }} + n];
                        if (n + EPC <= {{ "NY" if glu_y else "N" }}) {
                            *reinterpret_cast<uint4*>(dst) = *reinterpret_cast<const uint4*>(src);
                        } else {
                            for (int e = 0; e < {{ "NY" if glu_y else "N" }} - n; ++e) dst[e] = src[e];
                        }
                    }
                }
                __syncwarp();
{% endif %}
                }
{% endfor %}
{% endif %}
            }
        }
{% else %}
        // Fused epilogue on the accumulators: acc[mi][4 j + 2 h + c] is row
        // row0 + 64 mi + 16 warp + g + 8 h of the tile, column 8 j + 2 t + c.
{% if scale_rows %}
        float row_scale[2 * MI];   // this thread's rows' scales (rows past M are not stored)
#pragma unroll
        for (int r = 0; r < 2 * MI; ++r)
            row_scale[r] = tile_scale_a[min(row0 + (r / 2) * 64 + warp * 16 + g + 8 * (r % 2),
                                            M - 1 - m0)];
{% endif %}
#pragma unroll
        for (int j = 0; j < BN / 8; ++j) {
            const int nb = n0 + j * 8 + 2 * t;
            if (nb >= N) continue;
{% if spec.epilogue.bias.value == "colbias" %}
            const float2 cb = *reinterpret_cast<const float2*>(&tile_bias[nb - n0]);
            const float col_bias[2] = {cb.x, cb.y};   // this thread's two columns
{% endif %}
{% if scale_cols %}
            const float2 sb = *reinterpret_cast<const float2*>(&tile_scale_b[nb - n0]);
            const float col_scale[2] = {sb.x, sb.y};
{% endif %}
#pragma unroll
            for (int r = 0; r < 2 * MI; ++r) {
                const int mi = r / 2, h = r % 2;
                const int m = m0 + row0 + mi * 64 + warp * 16 + g + 8 * h;
                if (m >= M) continue;
{% if spec.epilogue.bias.value == "rowbias" %}
                const float row_bias = tile_bias[m - m0];
{% endif %}
                {{ ep.finish(spec, 2, "acc[mi][4 * j + 2 * h + c]", "col_bias[c]", "nb + 1 < N", row_scale="row_scale[r]" if scale_rows else None, col_scale="col_scale[c]" if scale_cols else None) | indent(16) }}
            }
        }
{% endif %}
{% if spec.c_tma %}
        __syncwarp();   // the warp has read its C: the ring positions are free again
        if (lane == 0) {
#pragma unroll
            for (int c = 0; c < C_SLOTS; ++c) mbar_arrive(empty + 8 * c_slot[c]);
        }
{% endif %}
    }
    {{ ep.amax_store(spec) | indent(4) }}
    if constexpr (TMA_STORE) {
        if (lane == 0) bulk_wait<0>();   // the stores have read shared memory and written Y
    }
}
