// {{ spec.kernel_name }}
// Y = act(alpha * A @ B{{ " + beta * C" if spec.epilogue.has_c }}{{ " + bias" if spec.epilogue.bias.value != "nobias" }}) on Hopper's warpgroup tensor cores (sm_90a): {{ "tf32" if spec.dtype.value == "f32" else spec.dtype.numpy_name }} wgmma.m64n{{ spec.config.bn }}k{{ spec.wgmma_k }} from shared memory, float32 accumulators, fused epilogue.
// Tiles of A ({{ "K" if spec.layout_a.value == "r" else "M" }}-major) and B ({{ "K" if spec.layout_b.value == "c" else "N" }}-major) arrive by TMA (128-byte swizzle) into a {{ spec.config.stages }}-stage ring of mbarrier-guarded buffers; one producer warpgroup issues the copies, {{ spec.config.consumers }} consumer warpgroups run wgmma and the epilogue {{ "on alternate tiles (one's epilogue overlaps the other's main loop)" if spec.config.pingpong else "on %d-row slices of each tile" % spec.config.wg_m }}; the grid is persistent over the output tiles.
//
// The template's Jinja is the preamble below (the variant's constants and types from the
// spec: its own and the shared epilogue's, and the register list of its wgmma instruction)
// and the kernel's signature; the rest is C++ that picks the variant's code with
// `if constexpr` on those constants.
{% import "common/epilogue_constants.cuh" as ep %}
{% import "common/wgmma_instr.cuh" as wgmma_instr %}
{% include "common/types.cuh" %}
{% include "common/activations.cuh" %}
{% include "common/sm90/mbarrier.cuh" %}
{% include "common/sm90/tma.cuh" %}
{% include "common/sm90/wgmma.cuh" %}
{% include "common/sm90/warpgroup.cuh" %}
{% include "common/sm90/scheduler.cuh" %}
{% include "common/sm80/cp_async.cuh" %}
{% include "gemm/sm90_gemm.cuh" %}

{{ ep.constants(spec) }}
{% include "common/epilogue.cuh" %}

// The variant (gemm/sm90_gemm.cuh and common/epilogue.cuh have the stand-ins of the
// parameters it may lack; a constant that only the code of other variants reads is never
// referenced).
#pragma nv_diag_suppress 177
constexpr int BM = {{ spec.config.bm }};
constexpr int BN = {{ spec.config.bn }};
constexpr int ES = {{ spec.dtype.itemsize }};                  // bytes of an input element
constexpr int STAGES = {{ spec.config.stages }};
constexpr bool PINGPONG = {{ "true" if spec.config.pingpong else "false" }};   // alternate whole tiles
constexpr bool A_KCONT = {{ "true" if spec.layout_a.value == "r" else "false" }};   // A K-major (row-major), else M-major
constexpr bool B_KCONT = {{ "true" if spec.layout_b.value == "c" else "false" }};   // B K-major (column-major), else N-major
constexpr bool PROMOTE = {{ "true" if spec.promote else "false" }};    // float32 sums of chunks of K
constexpr bool SPLIT_K = {{ "true" if spec.split_k else "false" }};    // work units are slices of K of a tile
constexpr bool STORE16 = {{ "true" if spec.store16 else "false" }};    // the epilogue stages its results in shared memory
constexpr bool TMA_STORE = {{ "true" if spec.tma_store else "false" }};  // Y, Z leave by TMA stores
constexpr bool C_TMA = {{ "true" if spec.c_tma else "false" }};      // C arrives by TMA through the ring
constexpr bool SCALE_TILE = {{ "true" if spec.scale_tile else "false" }};   // a tile's scales staged in shared memory
constexpr bool SCALE_ROWS = {{ "true" if spec.scale_rows else "false" }};   // ... A's per row
constexpr bool SCALE_COLS = {{ "true" if spec.scale_cols else "false" }};   // ... B's per column
#pragma nv_diag_default 177

constexpr int BK = 128 / ES;                  // one 128-byte swizzle row of K per tile row
constexpr int KSTEP = 32 / ES;                // k of one wgmma: 16 (16-bit), 8 (tf32), 32 (8-bit)
constexpr int CONSUMERS = PINGPONG ? 2 : BM / 64;   // consumer warpgroups
constexpr int WG_M = PINGPONG ? BM : 64;      // rows of a tile one consumer computes
constexpr int MI = WG_M / 64;                 // wgmma (m64) per k-step and consumer
constexpr int N_ACC = BN / 2;                 // accumulators of a wgmma per thread
constexpr int THREADS = (CONSUMERS + 1) * 128;
constexpr int A_STAGE = BM * BK * ES;         // bytes
constexpr int B_STAGE = BN * BK * ES;
constexpr unsigned TX_BYTES = A_STAGE + B_STAGE;
static_assert(PINGPONG ? BM == WG_M : BM == WG_M * CONSUMERS, "rows per consumer");
// Registers a thread (setmaxnreg) of the producer warpgroup and of each consumer one.
constexpr int PRODUCER_REGS = CONSUMERS <= 2 ? 40 : 32;
constexpr int CONSUMER_REGS = CONSUMERS <= 2 ? 232 : 160;

// The bias of a tile's columns or rows (COL_BIAS, ROW_BIAS) and the scales of its rows (A's)
// and columns (B's) (SCALE_TILE): the consumers that share the tile load them into registers
// when the tile starts (the loads' latency hides under the main loop) and put them in shared
// memory for the epilogue.
constexpr bool BIAS_TILE = COL_BIAS || ROW_BIAS;
constexpr int GROUP = PINGPONG ? 128 : 128 * CONSUMERS;   // threads that share a tile
constexpr int BIAS_N = COL_BIAS ? BN : BM;
constexpr int BIAS_PER = (BIAS_N + GROUP - 1) / GROUP;    // values per thread
constexpr int SA_PER = (BM + GROUP - 1) / GROUP;          // row scales per thread
constexpr int SB_PER = (BN + GROUP - 1) / GROUP;          // column scales per thread

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

// C (the gate's input, or beta's term) arrives by TMA through the ring (C_TMA): after a
// tile's k-tiles, C_SLOTS more ring positions hold its C tile in units of 64 rows x 128 bytes
// (128-byte swizzle, as the A and B tiles), the first UNITS_A of a position in its A buffer,
// the rest in its B buffer. The copies are issued as positions free up, a few k-tiles before
// the main loop ends, so the epilogue reads C from shared memory instead of waiting on global
// loads.
constexpr int C_ES = sizeof(CType);
constexpr int C_COLS = 128 / C_ES;                       // columns of a unit
constexpr int C_UNITS_N = BN / C_COLS;                   // units across a tile
constexpr int C_UNITS = BM / 64 * C_UNITS_N;
constexpr int UNITS_A = BM / 64, UNITS_SLOT = (BM + BN) / 64;   // units a ring position holds
constexpr int C_SLOTS = C_TMA ? (C_UNITS + UNITS_SLOT - 1) / UNITS_SLOT : 0;
constexpr int C_SLOTS_HELD = C_SLOTS > 0 ? C_SLOTS : 1;  // (an array of them: not empty)
static_assert(C_SLOTS <= 2 && C_SLOTS < STAGES, "C positions of the ring");
// Byte offset from the first tile buffer of unit u of a C tile whose positions are in ring
// slots slot[0..C_SLOTS).
__device__ __forceinline__ int c_unit(const int (&slot)[C_SLOTS_HELD], int u) {
    // (constant indices: a computed one would put the slots on the stack)
    const int s = C_SLOTS > 1 && u >= UNITS_SLOT ? slot[C_SLOTS_HELD - 1] : slot[0];
    const int q = u % UNITS_SLOT;
    return q < UNITS_A ? s * A_STAGE + q * 8192
                       : STAGES * A_STAGE + s * B_STAGE + (q - UNITS_A) * 8192;
}
// Byte offset of C(rr, cc) of the tile (rr, cc relative to its first row and column).
__device__ __forceinline__ int c_offset(const int (&slot)[C_SLOTS_HELD], int rr, int cc) {
    const int b = (cc % C_COLS) * C_ES;
    return c_unit(slot, (rr / 64) * C_UNITS_N + cc / C_COLS) + (rr % 64) * 128
         + ((((b >> 4) ^ (rr & 7)) << 4) | (b & 15));
}
// The N values of C at (rr, cc..) into dst (cc a multiple of N; N values are 4 to 32 bytes).
template <int N>
__device__ __forceinline__ void c_load(const char* ring, const int (&slot)[C_SLOTS_HELD], int rr,
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

// D (+)= A @ B for one k-step: 64 x BN, the accumulators in the register layout of wgmma
// (the variant's instruction: its shape, types and, for 16-bit inputs, which operands are
// transposed (M- or N-major)).
{{ wgmma_instr.ss("wgmma", spec.config.bn, spec.wgmma_type, spec.wgmma_k, spec.wgmma_transposes) }}

// The kernel: its parameters and the epilogue's scalars under the names the shared epilogue's
// formulas use, and the layout of shared memory (set up by the __global__ function), a
// consumer thread's place (set by consumer()), and, in its member functions, what the producer
// and the consumers do. YT, CT, BT: YType, CType, BiasType (a template, so that the code of
// the branches a variant discards is not instantiated: it may not compile for its types).
// (How values reach the member functions is chosen for the machine code to stay the one the
// kernel had as a single function: the layout and a consumer thread's place as members set
// once, the work units as values; the consumer's own code reads its warpgroup from a local.)
// The epilogue's parameters and scalars are those of its base, common/epilogue.cuh's
// Epilogue (of the variant's types: YT, CT, BT are those).
template <typename YT, typename CT, typename BT>
struct Gemm : Epilogue<YType, CType, BiasType> {
    // The kernel's other parameters (null or zero where a variant has not the parameter: the
    // stand-ins of sm90_gemm.cuh).
    const TensorMap* tma_a;
    const TensorMap* tma_b;
    const TensorMap* tma_y;                   // (TMA_STORE)
    const TensorMap* tma_z;                   // (TMA_STORE)
    const TensorMap* tma_c;                   // (C_TMA)
    long long k_tiles_per_split;              // (SPLIT_K)
    int K;

    // Shared memory (setup): the stages' A and B tiles, the barriers: a stage's `full` (the
    // producer's copies have landed) and `empty` (the consumers are done with it) and the
    // ping-pong consumers' turns (`order`), and the epilogue's staging blocks (`staging`),
    // the C of a tile in the ring (`ring`: the tiles' first byte), and a tile's bias and
    // scales.
    unsigned sA, sB, full, empty, order;
    YT* staging;
    const char* ring;
    float* bias_tiles;
    float* scale_tiles;

    // A consumer thread's place (consumer()): its warpgroup among the consumers, lane, warp in
    // the warpgroup, the accumulator fragment's row group and column pair, its first row in a
    // tile, and what the epilogue reads beside the accumulators.
    int wg, lane, warp, g, t, row0;
    int member;                               // index in the group that shares a tile
    float* tile_bias;                         // this consumer's tile's bias (BIAS_TILE) ...
    float* tile_scale_a;                      // ... and scales (SCALE_TILE)
    float* tile_scale_b;
    bool c_vec;                               // C's rows 16-byte aligned (a gate's loads)

    // The output tile a consumer works on (one unit).
    struct Tile {
        int m0, n0;                           // its first row and column
        int c_slot[C_SLOTS_HELD];             // the ring positions of its C (C_TMA)
        YT* Y;                                // where it goes: Y, or split K, the unit's slice
    };

    // The epilogue through shared memory (STORE16): each warp stages 16 x 64 blocks, made of
    // CHUNK columns of the accumulators (128: a gated linear unit's pairs make 64 columns of
    // Y; 32: its backward's 32 columns of dH make 64 of dZ).
    static constexpr int EPC = 16 / sizeof(YT);   // outputs per 16-byte segment
    static constexpr int CHUNK = GLU ? 128 : GLU_GRAD ? 32 : 64;
    // A gate on the staged block: a lane's segment of a row a pass.
    static constexpr int GATE_SEGS = 64 / EPC, GATE_RPP = 32 / GATE_SEGS;   // segments a row, rows a pass
    static constexpr int GATE_PASSES = 16 / GATE_RPP;
    // Its C values loaded from memory in whole 16-byte segments of rows (row-major C, not
    // through the ring; else: from shared memory, or element by element, a segment a pass
    // where used). Where a block's C values fit in 16 registers (16-bit C and Y), the warp
    // loads the next block's while it stages, gates and stores this one, so that the loads'
    // latency hides under that work. Else the first GATE_HELD passes' values are loaded
    // before the block is staged, each later one as a slot frees.
    static constexpr bool GATE_LOADS = GATE && C_ROW && !C_TMA;
    static constexpr int GATE_REGS = EPC * sizeof(CT) / 4;   // registers a pass's values
    static constexpr bool GATE_AHEAD = GATE_LOADS && GATE_PASSES * GATE_REGS <= 16;
    static constexpr int GATE_HELD = !GATE_LOADS ? 1 : GATE_REGS <= 4 ? GATE_PASSES : 2;
    // (unrolled, the 128x256 tile's column sums with C through the ring spill registers)
    static constexpr int GATE_UNROLL = BGRAD && C_TMA && BN == 256 ? 1 : GATE_PASSES;

    __device__ __forceinline__ void setup(char* smem_raw) {
        // 1024-byte aligned tiles (the 128-byte swizzle repeats every 8 rows of 128 bytes).
        const unsigned base = (smem_u32(smem_raw) + 1023u) & ~1023u;
        sA = base;
        sB = base + STAGES * A_STAGE;
        // The epilogue's staging, 4 KiB per consumer warp (1 KiB aligned, as the TMA's
        // 128-byte swizzle wants), then the bias of a tile (floats, one block per group), its
        // scales (SCALE_TILE: rows, then columns: one block per group), then the barriers.
        const unsigned sStaging = sB + STAGES * B_STAGE;
        const unsigned sBias = sStaging + CONSUMERS * 4 * 4096;
        const unsigned sScale = sBias + (PINGPONG ? 2 : 1) * (BM > BN ? BM : BN) * 4;
        full = sScale + (SCALE_TILE ? (PINGPONG ? 2 : 1) * (BM + BN) * 4 : 0);
        empty = full + 8 * STAGES;
        order = empty + 8 * STAGES;   // ping-pong turns of the two consumers
        staging = reinterpret_cast<YT*>(smem_raw + (sStaging - smem_u32(smem_raw)));
        ring = smem_raw + (base - smem_u32(smem_raw));   // C_TMA: C is read from here
        bias_tiles = reinterpret_cast<float*>(smem_raw + (sBias - smem_u32(smem_raw)));
        scale_tiles = reinterpret_cast<float*>(smem_raw + (sScale - smem_u32(smem_raw)));
    }

    // The work units: output tiles, or, split K, (slice of K, tile) pairs. Split K: work unit
    // u is K slice u / tiles of tile u % tiles; each writes its raw float32 partial products
    // to slice u / tiles of the workspace Y (splits x M x ldy), and the reduction kernel
    // (gemm/splitk_reduce.cu) sums them and applies the epilogue once.
    struct Units { int tiles_m, tiles_n, tiles, k_tiles, per_split, units; };
    __device__ __forceinline__ Units work() const {
        // (the launcher refuses problems whose tile or work-unit counts exceed 32 bits)
        const int tiles_m = ceil_div(M, BM), tiles_n = ceil_div(N, BN);
        const int tiles = tiles_m * tiles_n, k_tiles = ceil_div(K, BK);
        if constexpr (SPLIT_K) {
            const int per_split = static_cast<int>(k_tiles_per_split);
            return {tiles_m, tiles_n, tiles, k_tiles, per_split,
                    tiles * ceil_div(k_tiles, per_split)};
        } else {
            return {tiles_m, tiles_n, tiles, k_tiles, k_tiles, tiles};
        }
    }

    // The ring's barriers (one thread; the block synchronizes before they are used).
    __device__ __forceinline__ void init_barriers() {
        if (threadIdx.x == 0) {
            for (int s = 0; s < STAGES; ++s) {
                mbar_init(full + 8 * s, 1);                  // the producer's expect_tx
                mbar_init(empty + 8 * s, (PINGPONG ? 1 : CONSUMERS) * 4);  // per consumer warp
            }
            mbar_init(order, 4);
            mbar_init(order + 8, 4);
            mbar_fence_init();
        }
    }

    // One operand's k-tile into a stage: one box when K is its contiguous dimension, else one
    // 64-wide box (128 bytes of the swizzle) per 64 rows of the tile.
    template <bool KCONT, int ROWS>
    __device__ __forceinline__ static void load_operand(unsigned dst, const TensorMap* map,
                                                        int k0, int row0, unsigned bar) {
        if constexpr (KCONT) {
            tma_load(dst, map, k0, row0, bar);
        } else {
#pragma unroll
            for (int j = 0; j < ROWS / 64; ++j)
                tma_load(dst + j * (BK * 128), map, row0 + 64 * j, k0, bar);
        }
    }

    // Producer: one thread walks the same tiles as the consumers and keeps the ring full.
    __device__ __forceinline__ void producer(const Units w) {
        const auto [tiles_m, tiles_n, tiles, k_tiles, per_split, units] = w;
        warpgroup_registers_down<PRODUCER_REGS>();
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
                    load_operand<A_KCONT, BM>(sA + s * A_STAGE, tma_a, k0, m0, full + 8 * s);
                    load_operand<B_KCONT, BN>(sB + s * B_STAGE, tma_b, k0, n0, full + 8 * s);
                }
                if constexpr (C_TMA) {
                    for (int c = 0; c < C_SLOTS; ++c, ++it) {   // the tile's C, after its k-tiles
                        const int s = it % STAGES;
                        const int slot_units = min(UNITS_SLOT, C_UNITS - c * UNITS_SLOT);
                        mbar_wait(empty + 8 * s, ((it / STAGES) & 1) ^ 1);
                        mbar_expect_tx(full + 8 * s, slot_units * 8192);
                        for (int q = 0; q < slot_units; ++q) {
                            const int u = c * UNITS_SLOT + q;
                            tma_load(q < UNITS_A ? sA + s * A_STAGE + q * 8192
                                                 : sB + s * B_STAGE + (q - UNITS_A) * 8192,
                                     tma_c, n0 + (u % C_UNITS_N) * C_COLS, m0 + (u / C_UNITS_N) * 64,
                                     full + 8 * s);
                        }
                    }
                }
            }
        }
    }

    // Consumers. Cooperative: warpgroup wg + 1 computes rows WG_M wg .. of every tile.
    // Ping-pong: it computes whole tiles, every other one of this block's, in turns with the
    // other consumer: its main loop starts when the other's has finished, so that each waits on
    // ring positions at most one phase ahead of the barriers, and one's epilogue overlaps the
    // other's main loop.
    __device__ __forceinline__ void consumer(const Units w, int warpgroup) {
        const auto [tiles_m, tiles_n, tiles, k_tiles, per_split, units] = w;
        warpgroup_registers_up<CONSUMER_REGS>();
        const int wg = warpgroup - 1;   // (warpgroup 0 is the producer)
        this->wg = wg;
        lane = threadIdx.x % 32;
        warp = (threadIdx.x / 32) % 4;
        g = lane >> 2;
        t = lane & 3;
        row0 = PINGPONG ? 0 : wg * WG_M;    // this consumer's first row in a tile
        if constexpr (GATE_LOADS && STORE16) {
            // C (the gate's input) in 16-byte segments when its rows are 16-byte aligned
            c_vec = ((reinterpret_cast<unsigned long long>(C) |
                      static_cast<unsigned long long>(ldc) * sizeof(*C)) & 15) == 0;
        }
        member = PINGPONG ? threadIdx.x % 128 : threadIdx.x - 128;   // index in the group
        tile_bias = bias_tiles + (PINGPONG ? wg * BIAS_N : 0);
        tile_scale_a = scale_tiles + (PINGPONG ? wg * (BM + BN) : 0);
        tile_scale_b = tile_scale_a + BM;
        float acc[MI][N_ACC];
#pragma unroll
        for (int mi = 0; mi < MI; ++mi)
#pragma unroll
            for (int i = 0; i < N_ACC; ++i) acc[mi][i] = 0.0f;
        float total[MI][N_ACC];   // (PROMOTE: see mainloop)
        if constexpr (PROMOTE) {
#pragma unroll
            for (int mi = 0; mi < MI; ++mi)
#pragma unroll
                for (int i = 0; i < N_ACC; ++i) total[mi][i] = 0.0f;
        }
        load_scalar_bias();

        int turn = 0;
        int sbuf = 0;   // TMA_STORE: which of the warp's two staging blocks the next 16 x 64 block fills
        int split_ring = 0;   // split K: ring position of the unit's first k-tile: k-tiles of earlier units
        for (int unit = blockIdx.x, i = 0; unit < units; unit += gridDim.x, ++i) {
            int tile_index, kt0, kt_end, first;
            if constexpr (SPLIT_K) {
                tile_index = unit % tiles;
                kt0 = (unit / tiles) * per_split;
                kt_end = min(kt0 + per_split, k_tiles);
                first = split_ring;
                split_ring += kt_end - kt0;
            } else {
                tile_index = unit;
                kt0 = 0;
                kt_end = k_tiles;
                first = i * (k_tiles + C_SLOTS);
            }
            if (PINGPONG && (i & 1) != wg) continue;
            Tile tile;
            tile_origin<BM, BN>(tile_index, tiles_m, tiles_n, tile.m0, tile.n0);
            const int m0 = tile.m0, n0 = tile.n0;
            float bias_next[BIAS_PER], scale_a_next[SA_PER], scale_b_next[SB_PER];
            if constexpr (COL_BIAS)
                tile_vector_load<BIAS_N>(bias_next, bias, bias_stride, n0, N, member);
            if constexpr (ROW_BIAS)
                tile_vector_load<BIAS_N>(bias_next, bias, bias_stride, m0, M, member);
            if constexpr (SCALE_ROWS)
                tile_vector_load<BM>(scale_a_next, scale_a, scale_a_stride, m0, M, member);
            if constexpr (SCALE_COLS)
                tile_vector_load<BN>(scale_b_next, scale_b, scale_b_stride, n0, N, member);
            tile.Y = SPLIT_K ? Y + static_cast<long long>(unit / tiles) * M * ldy : Y;
            if constexpr ((GATE || GLU_GRAD) && !C_TMA) prefetch_c(m0, n0);
            if (PINGPONG && (wg == 1 || turn > 0))
                mbar_wait(order + 8 * wg, (wg == 1 ? turn : turn - 1) & 1);
            mainloop(acc, total, first, kt0, kt_end);
            if constexpr (C_TMA) {
                // This tile's C, in the ring positions after its k-tiles: wait for its copies
                // before the other ping-pong consumer starts its main loop, which would
                // otherwise wait on a later phase of these positions' barriers while they are
                // still in this one (a wait by parity cannot tell phases two apart).
#pragma unroll
                for (int c = 0; c < C_SLOTS; ++c) {
                    const int at = first + (kt_end - kt0) + c;
                    tile.c_slot[c] = at % STAGES;
                    mbar_wait(full + 8 * tile.c_slot[c], (at / STAGES) & 1);
                }
            }
            if (PINGPONG) {
                if (lane == 0) mbar_arrive(order + 8 * (1 - wg));   // the other consumer's turn
                ++turn;
            }
            if constexpr (BIAS_TILE || SCALE_TILE) {
                // The group has finished reading the previous tile's bias and scales; store
                // this tile's.
                named_barrier(PINGPONG ? 1 + wg : 1, GROUP);
                if constexpr (BIAS_TILE) tile_vector_store<BIAS_N>(tile_bias, bias_next, member);
                if constexpr (SCALE_ROWS) tile_vector_store<BM>(tile_scale_a, scale_a_next, member);
                if constexpr (SCALE_COLS) tile_vector_store<BN>(tile_scale_b, scale_b_next, member);
                named_barrier(PINGPONG ? 1 + wg : 1, GROUP);
            }

            if constexpr (STORE16) {
                epilogue_staged(acc, tile, sbuf);
            } else {
                epilogue_registers(acc, tile);
            }
            if constexpr (C_TMA) {
                __syncwarp();   // the warp has read its C: the ring positions are free again
                if (lane == 0) {
#pragma unroll
                    for (int c = 0; c < C_SLOTS; ++c) mbar_arrive(empty + 8 * tile.c_slot[c]);
                }
            }
        }
    }

    // This consumer's part of C (the gate's input, or the gated linear unit's Z: twice the
    // tile's columns) of the tile at rows m0.., columns n0.. into L2 while the main loop runs,
    // so that the epilogue's reads of it wait on L2, not on memory (the plain C epilogue
    // measured slower with it). Each contiguous run of it (a row's columns, or a column's
    // WG_M rows) by 128-byte lines, plus its last element (a run need not start on a line).
    __device__ __forceinline__ void prefetch_c(int m0, int n0) {
        constexpr int CW = GLU_GRAD ? 2 : 1;   // columns of C per column of the tile
        constexpr int RUNS = C_ROW ? WG_M : CW * BN, RUN = C_ROW ? CW * BN : WG_M;
        constexpr int PER_LINE = 128 / sizeof(*C), LINES = (RUN + PER_LINE - 1) / PER_LINE;
        for (int q = threadIdx.x % 128; q < RUNS * (LINES + 1); q += 128) {
            const int run = q / (LINES + 1), l = q % (LINES + 1);
            const int at = l == LINES ? RUN - 1 : l * PER_LINE;
            int m, n;
            if constexpr (C_ROW) {
                m = m0 + row0 + run;
                n = min(CW * n0 + at, CW * N - 1);
            } else {
                m = min(m0 + row0 + at, M - 1);
                n = CW * n0 + run;
            }
            if (m < M && n < CW * N) prefetch_l2(&c_at(m, n));
        }
    }

    // The main loop of a unit: its k-tiles kt0..kt_end, in ring positions first.., into acc.
    // PROMOTE: the tensor cores add into their accumulators with truncation (for 8-bit inputs
    // with fewer bits than float32's), which over a long K drifts well past float32's
    // rounding. So each chunk of K_CHUNK k-tiles (128 values of K) starts from fresh
    // accumulators, and its sum is added to `total` by ordinary, rounded float32 additions.
    __device__ __forceinline__ void mainloop(float (&acc)[MI][N_ACC], float (&total)[MI][N_ACC],
                                             int first, int kt0, int kt_end) {
        constexpr int K_CHUNK = 128 / BK;
        int prev = -1;
        for (int kt = kt0; kt < kt_end; ++kt) {
            const int it = first + kt - kt0;      // this k-tile's position in the ring
            const int s = it % STAGES;
            mbar_wait(full + 8 * s, (it / STAGES) & 1);
            wgmma_fence();
#pragma unroll
            for (int kk = 0; kk < BK / KSTEP; ++kk) {
                unsigned long long db;
                if constexpr (B_KCONT) {
                    db = descriptor(sB + s * B_STAGE + kk * 32, 16, 1024);
                } else {
                    db = descriptor(sB + s * B_STAGE + kk * 2048, BK * 128, 1024);
                }
#pragma unroll
                for (int mi = 0; mi < MI; ++mi) {
                    unsigned long long da;
                    if constexpr (A_KCONT) {
                        // K-major: rows of 128 bytes, 8-row groups 1024 bytes apart; k-steps
                        // of 32 bytes.
                        da = descriptor(sA + s * A_STAGE + (row0 + mi * 64) * 128 + kk * 32, 16,
                                        1024);
                    } else {
                        // M-major: 64-wide column blocks of BK rows; a k-step is 16 rows.
                        da = descriptor(
                            sA + s * A_STAGE + ((row0 + mi * 64) / 64) * (BK * 128) + kk * 2048,
                            BK * 128, 1024);
                    }
                    if constexpr (PROMOTE) {
                        wgmma(acc[mi], da, db, (kt - kt0) % K_CHUNK > 0 || kk > 0);
                    } else {
                        wgmma(acc[mi], da, db, kt > kt0 || kk > 0);
                    }
                }
            }
            wgmma_commit();
            if (prev >= 0) {
                wgmma_wait<1>();                 // the previous stage's products are done
                if (lane == 0) mbar_arrive(empty + 8 * prev);
            }
            prev = s;
            if constexpr (PROMOTE) {
                if ((kt - kt0) % K_CHUNK == K_CHUNK - 1 || kt == kt_end - 1) {
                    wgmma_wait<0>();
#pragma unroll
                    for (int mi = 0; mi < MI; ++mi)
#pragma unroll
                        for (int e = 0; e < N_ACC; ++e) total[mi][e] += acc[mi][e];
                }
            }
        }
        wgmma_wait<0>();
        if (prev >= 0 && lane == 0) mbar_arrive(empty + 8 * prev);
        if constexpr (PROMOTE) {
#pragma unroll
            for (int mi = 0; mi < MI; ++mi)
#pragma unroll
                for (int e = 0; e < N_ACC; ++e) {
                    acc[mi][e] = total[mi][e];
                    total[mi][e] = 0.0f;
                }
        }
    }

    // z of an accumulator value `acc` at (m, n) (a staged epilogue's): alpha * acc, with the
    // scales (a tile's `row_scale`, `col_scale`), beta * C (`c`, C through the ring) and the
    // bias (`col_bias`, `row_bias` of the tile's, or the scalar): the shared epilogue's
    // formula, without a gate's factor, which applies to the staged block.
    __device__ __forceinline__ float staged_z(float acc, int m, int n, float col_bias,
                                              float row_bias, CT c, float row_scale,
                                              float col_scale) {
        return z<false>(acc, m, n, col_bias, row_bias, held_if<SCALE_ROWS>(row_scale),
                        held_if<SCALE_COLS>(col_scale), held_if<C_TMA>(c));
    }

    // Fused epilogue through shared memory: each warp computes Z (or Y) for its 16 rows, 64
    // columns at a time, rounds them to the output type into a staging block (16-byte segments
    // XOR-swizzled by row: the TMA's 128-byte swizzle for 16-bit outputs, its 64-byte one for
    // 8-bit outputs, whose rows are 64 bytes), then, TMA_STORE, one lane stores the block by
    // TMA (rows and columns past M, N are skipped) while the warp fills its other block; else
    // it writes whole 16-byte segments: every row of the block goes out in full lines.
    __device__ __forceinline__ void epilogue_staged(float (&acc)[MI][N_ACC], const Tile& tile,
                                                    int& sbuf) {
        const int m0 = tile.m0, n0 = tile.n0;
        // GATE_AHEAD: the C values of this warp's next block (first: of its first block)
        alignas(16) CT cg_next[GATE_AHEAD ? GATE_PASSES : 1][EPC];
        if constexpr (GATE_AHEAD) {
            const int mw = m0 + row0 + warp * 16, nc = n0;
#pragma unroll
            for (int p = 0; p < GATE_PASSES; ++p) gate_load(p, cg_next[p], mw, nc);
        }
        // the warp's staging block (TMA_STORE: two)
        YT* const blocks = staging + (wg * 4 + warp) * ((TMA_STORE ? 2 : 1) * 16 * 64);
#pragma unroll
        for (int mi = 0; mi < MI; ++mi) {
            const int mw = m0 + row0 + mi * 64 + warp * 16;    // this warp's first row
            // SCALE_ROWS: the scales of this thread's two rows (a row past M: the last row's,
            // not stored)
            float row_scale[2] = {};
            if constexpr (SCALE_ROWS) {
                row_scale[0] = tile_scale_a[min(mw + g, M - 1) - m0];
                row_scale[1] = tile_scale_a[min(mw + g + 8, M - 1) - m0];
            }
#pragma unroll
            for (int jc = 0; jc < BN / CHUNK; ++jc) {
                const int nc = n0 + jc * CHUNK;
                if (nc >= N) break;
                // GATE_LOADS: the gate's C values for this block (rows in passes of GATE_RPP, a
                // 16-byte segment of output columns a lane): loaded ahead, or the first passes'
                // now.
                alignas(16) CT cg[GATE_HELD][EPC];
                if constexpr (GATE_AHEAD) {
#pragma unroll
                    for (int p = 0; p < GATE_HELD; ++p)
#pragma unroll
                        for (int e = 0; e < EPC; ++e) cg[p][e] = cg_next[p][e];
                    // the next block of this warp: the next 64 columns, or the next 64 rows
                    // (the loop leaves a row of blocks at the first column past N)
                    const bool next_col = jc + 1 < BN / 64 && nc + 64 < N;
                    if (next_col || mi + 1 < MI) {
                        const int mw_next = next_col ? mw : mw + 64;
                        const int nc_next = next_col ? nc + 64 : n0;
#pragma unroll
                        for (int p = 0; p < GATE_PASSES; ++p)
                            gate_load(p, cg_next[p], mw_next, nc_next);
                    }
                } else if constexpr (GATE_LOADS) {
#pragma unroll
                    for (int p = 0; p < GATE_HELD; ++p) gate_load(p, cg[p], mw, nc);
                }
                if constexpr (GLU_GRAD) {
                    glu_grad_block(acc[mi], jc, mw, nc, blocks, sbuf);
                } else if constexpr (GLU) {
                    // Y (a column from each pair), then Z's two blocks
                    stage_block<false, 0>(acc[mi], tile, jc, mw, nc, row_scale, blocks, sbuf, cg);
                    if constexpr (SAVE_Z) {
                        stage_block<true, 0>(acc[mi], tile, jc, mw, nc, row_scale, blocks, sbuf, cg);
                        stage_block<true, 1>(acc[mi], tile, jc, mw, nc, row_scale, blocks, sbuf, cg);
                    }
                } else {
                    if constexpr (SAVE_Z)
                        stage_block<true, 0>(acc[mi], tile, jc, mw, nc, row_scale, blocks, sbuf, cg);
                    stage_block<false, 0>(acc[mi], tile, jc, mw, nc, row_scale, blocks, sbuf, cg);
                }
            }
        }
    }

    // A staged row's segment s is at s ^ swz(r): rows of 64 bytes repeat the pattern every
    // 8 rows, 2 rows a step (the 64-byte swizzle), longer ones every 8 rows, a row a step.
    static __device__ __forceinline__ int swz(int r) { return EPC == 16 ? (r >> 1) & 3 : r & 7; }

    // The gate's C values of pass p of the staged block at rows mw.., columns nc.. into dst
    // (a row-major C in 16-byte loads where its rows are aligned).
    __device__ __forceinline__ void gate_load(int p, CT* dst, int mw, int nc) {
        const int r = p * GATE_RPP + lane / GATE_SEGS, seg = lane % GATE_SEGS;
        const int m = min(mw + r, M - 1), n = nc + seg * EPC;
        if constexpr (C_ROW) {
            constexpr int Q = EPC * sizeof(*C) / 16;   // 16-byte loads a segment
            if (Q * 16 == EPC * sizeof(*C) && c_vec && n + EPC <= N) {
#pragma unroll
                for (int q = 0; q < Q; ++q)
                    reinterpret_cast<uint4*>(dst)[q] = reinterpret_cast<const uint4*>(&c_at(m, n))[q];
                return;
            }
        }
#pragma unroll
        for (int e = 0; e < EPC; ++e) dst[e] = c_at(m, min(n + e, N - 1));
    }

    // One staged block of a chunk: Z's (IS_Z: its columns 64 Q.. of the chunk) or Y's (a
    // gated linear unit's: a column from each pair of the whole chunk), for the warp's 16 rows
    // from mw, the chunk's columns from nc (the jc-th of the tile); then the gate, and the
    // store.
    template <bool IS_Z, int Q>
    __device__ __forceinline__ void stage_block(const float (&acc)[N_ACC], const Tile& tile,
                                                int jc, int mw, int nc,
                                                const float (&row_scale)[2], YT* blocks,
                                                int& sbuf, CT (&cg)[GATE_HELD][EPC]) {
        constexpr bool GLU_Y = GLU && !IS_Z;
        const int m0 = tile.m0, n0 = tile.n0;
        YT* const out = IS_Z ? Z : tile.Y;
        const long long ld = IS_Z ? ldz : ldy;
        const int n_out = GLU_Y ? N / 2 : N;   // the output's columns
        const int yc = GLU_Y ? nc / 2 : nc + 64 * Q;   // the block's first column in it
        YT* const st = TMA_STORE ? blocks + sbuf * (16 * 64) : blocks;
        if constexpr (TMA_STORE) {
            if (lane == 0) bulk_wait_read<1>();   // this block's store of two rounds ago
            __syncwarp();
        }
        // groups of 8 columns of the accumulators (GLU_Y: a thread's pair, (gate, linear),
        // makes one column of Y (4 j8 + t of the block))
#pragma unroll
        for (int j8 = 0; j8 < (GLU_Y ? 16 : 8); ++j8) {
            const int nb = (GLU_Y ? nc : yc) + j8 * 8 + 2 * t;
            float col_bias[2] = {}, col_scale[2] = {};
            if constexpr (COL_BIAS) {
                const float2 cb = *reinterpret_cast<const float2*>(&tile_bias[nb - n0]);
                col_bias[0] = cb.x;
                col_bias[1] = cb.y;
            }
            if constexpr (SCALE_COLS) {
                const float2 sb = *reinterpret_cast<const float2*>(&tile_scale_b[nb - n0]);
                col_scale[0] = sb.x;
                col_scale[1] = sb.y;
            }
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                const int r = g + 8 * h;
                const int m = min(mw + r, M - 1);   // clamped: rows past M are not stored
                const float row_bias = ROW_BIAS ? tile_bias[m - m0] : 0.0f;
                float v[2];
                alignas(8) CT cv[2] = {};
                if constexpr (C_TMA && !GATE) c_load<2>(ring, tile.c_slot, mw - m0 + r, nb - n0, cv);
#pragma unroll
                for (int c = 0; c < 2; ++c) {
                    const int n = min(nb + c, N - 1);
                    const float z = staged_z(acc[4 * ((jc * CHUNK + 64 * Q) / 8 + j8) + 2 * h + c],
                                             m, n, col_bias[c], row_bias, cv[c], row_scale[h],
                                             col_scale[c]);
                    if constexpr (IS_Z || GLU_Y) {
                        v[c] = z;
                    } else {
                        v[c] = y_of(z, mw + r < M && nb + c < N);
                    }
                }
                if constexpr (GLU_Y) {
                    const int col = j8 * 4 + t;
                    store(&st[r * 64 + ((col / EPC) ^ swz(r)) * EPC + col % EPC],
                          glu_value(v[0], v[1]));
                } else {
                    const int col = j8 * 8 + 2 * t;
                    store_vec(&st[r * 64 + ((col / EPC) ^ swz(r)) * EPC + col % EPC], v);
                }
            }
        }
        if constexpr (GATE) apply_gate(st, tile, mw, nc, cg);
        if constexpr (TMA_STORE) {
            fence_proxy_async();
            __syncwarp();
            if (lane == 0) {
                // a group for every block, empty where its rows are all past M: the wait
                // above counts groups as blocks, two buffers apart
                if (mw < M) tma_store(IS_Z ? tma_z : tma_y, smem_u32(st), yc, mw);
                bulk_commit();
            }
            sbuf ^= 1;
        } else {
            constexpr int SEGS = 64 / EPC;                  // segments per staged row
            constexpr int RPP = 32 / SEGS;                  // rows per pass of the warp
            __syncwarp();
#pragma unroll 1
            for (int p = 0; p < 16 / RPP; ++p) {
                const int r = p * RPP + lane / SEGS, seg = lane % SEGS;
                const int m = mw + r, n = yc + seg * EPC;
                if (m < M && n < n_out) {
                    const YT* const src = &st[r * 64 + (seg ^ swz(r)) * EPC];
                    auto* dst = &out[static_cast<long long>(m) * ld + n];
                    if (n + EPC <= n_out) {
                        *reinterpret_cast<uint4*>(dst) = *reinterpret_cast<const uint4*>(src);
                    } else {
                        for (int e = 0; e < n_out - n; ++e) dst[e] = src[e];
                    }
                }
            }
            __syncwarp();
        }
    }

    // The gate, on the staged block `st` (rows mw.., columns nc..): Y = Z * act'(C), C read as
    // whole rows of 16-byte segments (coalesced), Z as staged (rounded once already, as a
    // framework's separate pass over a stored product would have it). `cg`: GATE_LOADS, the
    // C values of the first GATE_HELD passes, each slot loaded again for a later pass as it
    // frees. BGRAD: the block's column sums of Y as stored
    // into the bias's row mw / 16.
    __device__ __forceinline__ void apply_gate(YT* st, const Tile& tile, int mw, int nc,
                                               CT (&cg)[GATE_HELD][EPC]) {
        const int m0 = tile.m0, n0 = tile.n0;
        __syncwarp();
        float bsum[EPC] = {};   // BGRAD: this lane's rows' sums of its segment's columns
#pragma unroll GATE_UNROLL
        for (int p = 0; p < GATE_PASSES; ++p) {
            const int r = p * GATE_RPP + lane / GATE_SEGS, seg = lane % GATE_SEGS;
            // the pass's C values: through the ring, or element by element (column-major)
            alignas(16) CT cg_pass[EPC];
            if constexpr (C_TMA) {
                c_load<EPC>(ring, tile.c_slot, mw - m0 + r, nc - n0 + seg * EPC, cg_pass);
            } else if constexpr (!C_ROW) {
                gate_load(p, cg_pass, mw, nc);
            }
            const CT* const cp = GATE_LOADS ? cg[p % GATE_HELD] : cg_pass;
            if (mw + r < M && nc + seg * EPC < N) {
                YT* const s = &st[r * 64 + (seg ^ swz(r)) * EPC];
                float v[EPC];
                load_vec(s, v);
#pragma unroll
                for (int e = 0; e < EPC; ++e)
                    v[e] *= derivative<GATE_ACT, GATE_FROM_Y, FAST_ACT>(to_f32(cp[e]), leaky_slope);
                store_vec(s, v);
                if constexpr (BGRAD) {
                    load_vec(s, v);   // as stored: the GEMMs' dZ, as autograd sums it
#pragma unroll
                    for (int e = 0; e < EPC; ++e) bsum[e] += v[e];
                }
            }
            if constexpr (GATE_LOADS) {
                if (p + GATE_HELD < GATE_PASSES)
                    gate_load(p + GATE_HELD, cg[p % GATE_HELD], mw, nc);
            }
        }
        if constexpr (BGRAD) {
            // The block's 16-row column sums of Y as stored: the lanes of a segment add their
            // rows' sums, and those of the first rows write them; rows past M added nothing.
#pragma unroll
            for (int o = GATE_SEGS; o < 32; o *= 2)
#pragma unroll
                for (int e = 0; e < EPC; ++e) bsum[e] += __shfl_xor_sync(0xffffffffu, bsum[e], o);
            if (lane < GATE_SEGS && mw < M) {
                BT* const out = bias + static_cast<long long>(mw / 16) * bias_stride;   // (float)
#pragma unroll
                for (int e = 0; e < EPC; ++e)
                    if (nc + lane * EPC + e < N) out[nc + lane * EPC + e] = bsum[e];
            }
        }
    }

    // A gated linear unit's backward, a block of 64 columns of dZ (Y, 2 N columns in all):
    // 32 columns of the accumulators (dH, from column nc) and the 64 of the unit's Z (C) with
    // the same rows (from mw). The warp copies the block of Z into its staging block
    // (cp.async, whole 16-byte segments, from L2 where the prefetch put them), forms dZ there
    // in place, and stores it by TMA.
    __device__ __forceinline__ void glu_grad_block(const float (&acc)[N_ACC], int jc, int mw,
                                                   int nc, YT* blocks, int& sbuf) {
        const int NZ = 2 * N;
        const int yc = 2 * nc;   // dZ, columns 2 nc..
        YT* const st = blocks + sbuf * (16 * 64);
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
        // groups of 8 columns of the accumulators: a thread's pair makes 4 columns of dZ
        // (16 j8 + 4 t of the block) from the 4 of Z there
#pragma unroll
        for (int j8 = 0; j8 < 4; ++j8) {
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                const int r = g + 8 * h, col = j8 * 16 + 4 * t;
                YT* const s = &st[r * 64 + ((col / 8) ^ (r & 7)) * 8 + col % 8];
                float v[4];
                load_vec(s, v);
#pragma unroll
                for (int c = 0; c < 2; ++c) {
                    // (dH: the unit's backward has no C term, bias or scales)
                    const float d = staged_z(acc[4 * (jc * CHUNK / 8 + j8) + 2 * h + c], 0, 0,
                                             0.0f, 0.0f, CT{}, 1.0f, 1.0f);
                    const float gate = v[2 * c], lin = v[2 * c + 1];
                    v[2 * c] = d * lin * derivative<GLU_GRAD_ACT, false, FAST_ACT>(gate, leaky_slope);
                    v[2 * c + 1] = d * activation<GLU_GRAD_ACT, FAST_ACT>(gate, leaky_slope);
                }
                store_vec(s, v);
            }
        }
        fence_proxy_async();
        __syncwarp();
        if (lane == 0) {
            // a group for every block, empty where its rows are all past M: the wait above
            // counts groups as blocks, two buffers apart
            if (mw < M) tma_store(tma_y, smem_u32(st), yc, mw);
            bulk_commit();
        }
        sbuf ^= 1;
    }

    // Fused epilogue on the accumulators: acc[mi][4 j + 2 h + c] is row
    // row0 + 64 mi + 16 warp + g + 8 h of the tile, column 8 j + 2 t + c.
    __device__ __forceinline__ void epilogue_registers(float (&acc)[MI][N_ACC], const Tile& tile) {
        const int m0 = tile.m0, n0 = tile.n0;
        YT* const Y = tile.Y;
        float row_scale[2 * MI];   // SCALE_ROWS: this thread's rows' scales (rows past M are not stored)
        if constexpr (SCALE_ROWS) {
#pragma unroll
            for (int r = 0; r < 2 * MI; ++r)
                row_scale[r] = tile_scale_a[min(row0 + (r / 2) * 64 + warp * 16 + g + 8 * (r % 2),
                                                M - 1 - m0)];
        }
#pragma unroll
        for (int j = 0; j < BN / 8; ++j) {
            const int nb = n0 + j * 8 + 2 * t;
            if (nb >= N) continue;
            float col_bias[2] = {}, col_scale[2] = {};   // this thread's two columns'
            if constexpr (COL_BIAS) {
                const float2 cb = *reinterpret_cast<const float2*>(&tile_bias[nb - n0]);
                col_bias[0] = cb.x;
                col_bias[1] = cb.y;
            }
            if constexpr (SCALE_COLS) {
                const float2 sb = *reinterpret_cast<const float2*>(&tile_scale_b[nb - n0]);
                col_scale[0] = sb.x;
                col_scale[1] = sb.y;
            }
#pragma unroll
            for (int r = 0; r < 2 * MI; ++r) {
                const int mi = r / 2, h = r % 2;
                const int m = m0 + row0 + mi * 64 + warp * 16 + g + 8 * h;
                if (m >= M) continue;
                // (the shared epilogue's formula reads the row bias where there is one)
                [[maybe_unused]] const float row_bias = ROW_BIAS ? tile_bias[m - m0] : 0.0f;
                finish<2>(
                    Y, m, nb, nb + 1 < N, [&](int c) { return acc[mi][4 * j + 2 * h + c]; },
                    [&](int c, int) { return col_bias[c]; }, row_bias,
                    held_if<SCALE_ROWS>(row_scale[r]),
                    held_if<SCALE_COLS>([&](int c) { return col_scale[c]; }));
            }
        }
    }

    // A consumer's end: the warp's largest |Y| to the amax, and its stores' completion.
    __device__ __forceinline__ void consumer_end() {
        amax_store();
        if constexpr (TMA_STORE) {
            if (lane == 0) bulk_wait<0>();   // the stores have read shared memory and written Y
        }
    }
};

extern "C" __global__ void __launch_bounds__(THREADS, 1)
{{ spec.kernel_name }}({{ spec.param_list() }})
{
    extern __shared__ char smem_raw[];
    // The parameters and scalars (a stand-in where this variant has not the name), the layout
    // of shared memory, the ring's barriers and the work units; then the warpgroups' roles.
    Gemm<YType, CType, BiasType> gemm{
        epilogue(C, ldc, bias, bias_stride, Y, ldy, Z, ldz, M_, N_, alpha_, beta_, leaky_slope_,
                 scale_a, scale_a_stride, scale_b, scale_b_stride, scale_y, amax, y_scale_),
        map_address(tma_a), map_address(tma_b), map_address(tma_y), map_address(tma_z),
        map_address(tma_c), k_tiles_per_split, static_cast<int>(K_)};
    gemm.setup(smem_raw);
    const auto w = gemm.work();
    const int warpgroup = threadIdx.x / 128;
    gemm.init_barriers();
    __syncthreads();
    if (warpgroup == 0) {
        gemm.producer(w);
        return;
    }
    gemm.consumer(w, warpgroup);
    gemm.consumer_end();
}
