{% import "common/wgmma_instr.cuh" as wgmma_instr %}
// {{ spec.kernel_name }}
// Fused attention backward on Hopper (sm_90a): the arithmetic of bwd_sm80.cu (delta from its
// "dot" kernel) with TMA loads, wgmma products and warp specialization, as fwd_sm90.cu, in
// two forms: DQ then DKV (no atomics: the same bits on every run), or DKVQ alone. KIND:
//   DQ   block (blockIdx.x, h, b) = 128 query rows (two consumer warpgroups of 64); per key
//        block of BN keys: S = Q K^T and dP = dO V^T (wgmma, both operands from shared
//        memory), P = exp2(S log2e - lse log2e), dS = P (dP - delta) (1 - tanh^2 with
//        SOFTCAP), dQ += dS K (dS from registers, K read N-major); dq = scale dQ.
//   DKV  block (blockIdx.x = key block * DSPLIT + split, kv head, b) = 128 keys (two consumer
//        warpgroups of 64); per (query head of the group, query block of BM rows): S^T = K
//        Q^T, dP^T = V dO^T, P^T, dS^T; dV += P^T dO, dK += dS^T Q (the transposes from
//        registers, dO and Q read N-major) over this split's DO columns; dk = scale dK.
//   DKVQ DKV (DSPLIT 1) that also makes dQ, FlashAttention-3's one-kernel backward: 5
//        products a step where DQ and DKV take 7. Each step's dS^T goes to shared memory
//        (stmatrix.trans: rows the step's queries, the block's 128 keys contiguous, two
//        buffers), then dQ^T = K^T dS^T by wgmma with both operands from shared memory (K^T
//        read M-major), each warpgroup 64 of D's rows (D 128) or half the step's queries
//        (D 64). The float32 tile goes to shared memory (two buffers) as it lies in dq_accum
//        (masks.cuh's dq_accum_row, dq_accum_col: the step's rows one contiguous block),
//        and a writer warp of the producer warpgroup adds it there by one bulk reduction
//        (cp.reduce.async.bulk .add.f32, as FlashAttention-3), so that the consumers meet
//        once a step (on dS^T), not twice; the "dot" kernel zeroed dq_accum, the "dqout" one
//        scales and converts it. Not deterministic.
// The producer warpgroup streams the tiles by TMA (4-D tensor maps over (D, seq, heads,
// batch), 3-D packed), each 64-column chunk a box with the 128-byte swizzle.
{% include "attention/sm90.cuh" %}

using T = {{ spec.dtype.ctype }};
constexpr int DQ = 1, DKVQ = 3;                            // (DKV: 2)
constexpr int KIND = {{ {"dq": 1, "dkv": 2, "dkvq": 3}[spec.kind] }};
constexpr bool KV = KIND != DQ;                            // a block of keys: dK, dV
constexpr int D = {{ spec.head_dim }};
constexpr int STEP = {{ spec.step }};                      // DQ: keys a step; DKV: queries
constexpr int DSPLIT = {{ spec.dsplit }};
constexpr int DO = D / DSPLIT;                             // DKV: output columns of a block
constexpr bool CAUSAL = {{ "true" if spec.causal else "false" }};
constexpr bool WINDOW = {{ "true" if spec.window else "false" }};
constexpr bool SOFTCAP = {{ "true" if spec.softcap else "false" }};
constexpr bool VARLEN = {{ "true" if spec.varlen else "false" }};
// each row's sequences kept apart by their bounds (masks.cuh's RowMasks; dense, S_q == S_k)
constexpr bool SEGMENTS = {{ "true" if spec.segments else "false" }};
// DKVQ: a step's dQ^T product issued at the start of the next step, under its S and dP
// products and its softmax (the tensor cores otherwise idle while both consumers make P and
// dS), its tile stored once that step's dV and dK products are issued; the columns' lse and
// delta then read from shared memory where used (their registers go to the dQ^T tile)
constexpr bool DEFER_DQ = {{ "true" if spec.defer_dq else "false" }};

constexpr int THREADS = 384, STAGES = {{ spec.stages }};
constexpr int PRODUCER_REGS = 40, CONSUMER_REGS = 232;
constexpr int ROWS = 128;                     // the block's own rows (DQ) or keys (DKV)
constexpr int DC = D / 64;
constexpr int OWN_CHUNK = ROWS * 128, STEP_CHUNK = STEP * 128;   // bytes of a 64-column chunk
constexpr int OWN_BYTES = DC * OWN_CHUNK, STEP_BYTES = DC * STEP_CHUNK;
constexpr double LOG2E = 1.4426950408889634;

static_assert(sizeof(T) == 2, "16-bit inputs");
static_assert(D % 64 == 0 && DO % 64 == 0 && STEP % 16 == 0 && STEP <= 256, "wgmma shapes");
// DKVQ: dQ^T's 64-row blocks (1 or 2), each warpgroup's queries of a step, dS^T's buffers
constexpr int QM = D / 64, NQ = QM == 2 ? STEP : STEP / 2;
constexpr int DS_CHUNK = STEP * 128, DS_BYTES = (ROWS / 64) * DS_CHUNK;
constexpr int DQ_BYTES = STEP * D * 4;                    // the float32 dQ tile's
constexpr int DS_ALL = KIND == DKVQ ? 2 * DS_BYTES + 2 * DQ_BYTES : 0;
// DKVQ's named barriers (0: __syncthreads, 1: both consumers' dS^T stored): a dq tile buffer
// stored by both consumers (TILE_FULL + buffer), read by the writer warp (TILE_FREE + buffer)
constexpr int TILE_FULL = 3, TILE_FREE = 5;
static_assert(KIND != DKVQ || (DSPLIT == 1 && QM <= 2 && NQ % 16 == 0), "DKVQ: D 64 or 128");

{{ wgmma_instr.ss("wgmma_s", spec.step, spec.dtype.value) }}

{{ wgmma_instr.rs("wgmma_acc", spec.head_dim // spec.dsplit, spec.dtype.value, 1) }}
// DKVQ (declared for every kind: the others' code names them under if constexpr)
{{ wgmma_instr.ss("wgmma_q", spec.step if spec.head_dim == 128 else spec.step // 2,
                  spec.dtype.value, transposes=", 1, 0") }}

// Four 8x8 16-bit matrices of mma fragments (a[j]: row lane / 4, columns 2 (lane % 4) and +1
// of matrix j) stored transposed: matrix j's column i to the 16 bytes at lane 8 j + i's addr.
__device__ __forceinline__ void stmatrix_x4_trans(unsigned addr, const unsigned (&a)[4]) {
    asm volatile("stmatrix.sync.aligned.m8n8.x4.trans.shared.b16 [%0], { %1, %2, %3, %4 };\n"
                 :: "r"(addr), "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]) : "memory");
}


// The A fragment of k-step kk of accumulator tiles (4 floats an n8 tile), 16-bit.
__device__ __forceinline__ void a_fragment(unsigned (&a)[4], const float* acc, int kk) {
    a[0] = pack_f32x2<T>(acc[8 * kk], acc[8 * kk + 1]);
    a[1] = pack_f32x2<T>(acc[8 * kk + 2], acc[8 * kk + 3]);
    a[2] = pack_f32x2<T>(acc[8 * kk + 4], acc[8 * kk + 5]);
    a[3] = pack_f32x2<T>(acc[8 * kk + 6], acc[8 * kk + 7]);
}

extern "C" __global__ void __launch_bounds__(THREADS, 1)
{{ spec.kernel_name }}({{ spec.param_list() }})
{
    extern __shared__ __align__(1024) char smem[];
    const unsigned base = smem_u32(smem);
    const unsigned sOwn = base;                        // Q, dO (DQ) or K, V (DKV): 2 tiles
    const unsigned sStep = base + 2 * OWN_BYTES;       // stage s: 2 tiles of STEP rows
    const unsigned sDS = sStep + STAGES * 2 * STEP_BYTES;   // DKVQ: dS^T, 2 buffers
    const unsigned sDQ = sDS + 2 * DS_BYTES;                 // DKVQ: dQ's float32, 2 buffers
    const unsigned bars = sDS + DS_ALL;
    const unsigned own_full = bars;
    auto full = [&](int s) { return bars + 8 + 8 * s; };
    auto empty = [&](int s) { return bars + 8 + 8 * (STAGES + s); };
    // DKV, stage s: the step's STEP query columns' lse (log2 units, +inf past the length or
    // seeing nothing), then their delta (0 past the length), written by the producer's warp
    const unsigned sCol = bars + 128;
    auto col_values = [&](int s) { return reinterpret_cast<float*>(smem + (sCol - base)) +
                                          2 * STEP * s; };

    const int tid = threadIdx.x;
    const int b = blockIdx.z;
    const Sequence<VARLEN> seq(b, S_q, S_k, cu_seqlens_q, cu_seqlens_k);
    const RowMasks<SEGMENTS> mask(seq.len_q, seq.len_k, CAUSAL, WINDOW, window_left,
                                  window_right, {{ spec.row_bounds("b") }});
    const float SL = SOFTCAP ? 1.0f : static_cast<float>(scale * LOG2E);
    const float cap_in = SOFTCAP ? static_cast<float>(scale / softcap) : 0.0f;
    const float cap_out = SOFTCAP ? static_cast<float>(softcap * LOG2E) : 0.0f;

    // This block's own rows and the steps it walks (block-uniform).
    int own0, steps, first = 0, per_head = 1, full_lo, full_hi;
    long long head;                           // DQ: the query head; DKV: the kv head
    const long long group = H / H_kv;
    if constexpr (KIND == DQ) {
        head = blockIdx.y;
        own0 = blockIdx.x * ROWS;
        if (own0 >= seq.len_q) return;
        const int last = min(own0 + ROWS, seq.len_q) - 1;
        const int k_begin = mask.lo(own0), k_end = mask.hi(last);
        full_lo = mask.lo(last);
        full_hi = mask.hi(own0);
        first = k_begin / STEP;
        steps = k_end > k_begin ? ceil_div(k_end, STEP) - first : 0;
    } else {
        head = blockIdx.y;
        own0 = (blockIdx.x / DSPLIT) * ROWS;
        if (own0 >= seq.len_k) return;
        const int last = min(own0 + ROWS, seq.len_k) - 1;
        const int q_begin = mask.row_lo(own0), q_end = mask.row_hi(last);
        full_lo = mask.row_lo(last);
        full_hi = mask.row_hi(own0);
        first = q_begin / STEP;
        per_head = q_end > q_begin ? ceil_div(q_end, STEP) - first : 0;
        steps = static_cast<int>(group) * per_head;
    }

    if (tid == 0) {
        mbar_init(own_full, 1);
        for (int s = 0; s < STAGES; ++s) {
            mbar_init(full(s), KV ? 32 : 1);   // KV: each lane that staged lse, delta
            mbar_init(empty(s), KV ? 2 * 128 : 2 * 4);   // KV: every consumer thread
        }
        mbar_fence_init();
    }
    __syncthreads();

    const int warpgroup = tid / 128;
    if (warpgroup == 0) {
        warpgroup_registers_down<PRODUCER_REGS>();
        if constexpr (KIND == DKVQ) if (tid >= 32 && tid < 64) {
            // DKVQ's writer warp: each step's dq tile, once both consumers have stored it, added
            // into dq_accum by one bulk reduction; the buffer is given back when it has been read
            // (the consumers do not wait for each other or for the reduction)
            const int lane = tid & 31;
            for (int p = 0; p < 2 && p < steps; ++p)   // both buffers free at first
                named_barrier_arrive(TILE_FREE + p, 256 + 32);
            for (int it = 0; it < steps; ++it) {
                named_barrier(TILE_FULL + (it & 1), 256 + 32);
                if (lane == 0) {   // the whole tile (rows past the length: zeros, into padding)
                    const long long hq = head * group + it / per_head;
                    const int step0 = (first + it % per_head) * STEP;
                    bulk_reduce_add_f32(dq_accum + dq_accum_row<VARLEN>(b, hq, step0,
                                                                        cu_seqlens_q, B, H, S_q,
                                                                        STEP) * D,
                                        sDQ + (it & 1) * DQ_BYTES, DQ_BYTES);
                    bulk_commit();
                    bulk_wait_read<0>();
                }
                __syncwarp();
                // (not after a buffer's last use: every arrival has its consumers' wait)
                if (it + 2 < steps) named_barrier_arrive(TILE_FREE + (it & 1), 256 + 32);
            }
            if (lane == 0) bulk_wait<0>();   // the last reductions done
            return;
        }
        if (tid < (KV ? 32 : 1)) {   // DKV: the warp stages lse and delta
            const int hk = static_cast<int>(KIND == DQ ? head / group : head);
            if (tid == 0) mbar_expect_tx(own_full, 2 * OWN_BYTES);
            if constexpr (KIND == DQ) {
                const int row = static_cast<int>(seq.q_row0) + own0;
                const int hq = static_cast<int>(head);
                load_tile<ROWS, DC, VARLEN>(sOwn, &tma_q, row, hq, b, own_full);
                load_tile<ROWS, DC, VARLEN>(sOwn + OWN_BYTES, &tma_do, row, hq, b, own_full);
            } else if (tid == 0) {
                const int row = static_cast<int>(seq.k_row0) + own0;
                load_tile<ROWS, DC, VARLEN>(sOwn, &tma_k, row, hk, b, own_full);
                load_tile<ROWS, DC, VARLEN>(sOwn + OWN_BYTES, &tma_v, row, hk, b, own_full);
            }
            for (int it = 0; it < steps; ++it) {
                const int s = it % STAGES;
                mbar_wait(empty(s), ((it / STAGES) & 1) ^ 1);
                const unsigned stage = sStep + s * 2 * STEP_BYTES;
                if constexpr (KV) {
                    const long long hq = head * group + it / per_head;
                    const int step0 = (first + it % per_head) * STEP;
                    float* cv = col_values(s);
                    for (int c = tid; c < STEP; c += 32) {
                        const int col = step0 + c;
                        const bool in = col < seq.len_q;   // len_q >= 1 where there are steps
                        const long long at = lse_index<VARLEN>(b, hq, in ? col : 0, seq.q_row0,
                                                               cu_seqlens_q, B, H, S_q);
                        const float l = lse[at];
                        cv[c] = !in || l == neg_inf() ? pos_inf() : l * static_cast<float>(LOG2E);
                        cv[STEP + c] = in ? delta[at] : 0.0f;
                    }
                    if (tid != 0) {   // each lane's own arrive releases its stores
                        mbar_arrive(full(s));
                        continue;
                    }
                }
                mbar_expect_tx(full(s), 2 * STEP_BYTES);
                if constexpr (KIND == DQ) {
                    const int row = static_cast<int>(seq.k_row0) + (first + it) * STEP;
                    load_tile<STEP, DC, VARLEN>(stage, &tma_k, row, hk, b, full(s));
                    load_tile<STEP, DC, VARLEN>(stage + STEP_BYTES, &tma_v, row, hk, b, full(s));
                } else {
                    const int hq = static_cast<int>(head * group + it / per_head);
                    const int row = static_cast<int>(seq.q_row0) + (first + it % per_head) * STEP;
                    load_tile<STEP, DC, VARLEN>(stage, &tma_q, row, hq, b, full(s));
                    load_tile<STEP, DC, VARLEN>(stage + STEP_BYTES, &tma_do, row, hq, b, full(s));
                }
            }
        }
        return;
    }

    warpgroup_registers_up<CONSUMER_REGS>();
    // (the warpgroup by a shuffle: the compiler then knows it is the same in the warp, and
    // the descriptors made from it stay in uniform registers)
    const int wg = __shfl_sync(0xffffffffu, warpgroup - 1, 0), lane = tid & 31;
    const int warp = (tid / 32) & 3;
    const int g = lane >> 2, t = lane & 3;
    const int wrow = wg * 64 + warp * 16;     // the warp's first own row (query or key)
    // the thread's two own rows: their masks' intervals
    int lo[2], hi[2];
#pragma unroll
    for (int hh = 0; hh < 2; ++hh) {
        const int r = own0 + wrow + g + 8 * hh;
        lo[hh] = KIND == DQ ? mask.lo(r) : mask.row_lo(r);
        hi[hh] = KIND == DQ ? mask.hi(r) : mask.row_hi(r);
    }
    // DQ: the rows' lse (log2 units; +inf past the length or seeing nothing) and delta
    float lse2[2] = {pos_inf(), pos_inf()}, dl[2] = {0.0f, 0.0f};
    if constexpr (KIND == DQ) {
#pragma unroll
        for (int hh = 0; hh < 2; ++hh) {
            const int i = own0 + wrow + g + 8 * hh;
            if (i < seq.len_q) {
                const long long at = lse_index<VARLEN>(b, head, i, seq.q_row0, cu_seqlens_q, B,
                                                       H, S_q);
                const float l = lse[at];
                lse2[hh] = l == neg_inf() ? pos_inf() : l * static_cast<float>(LOG2E);
                dl[hh] = delta[at];
            }
        }
    }

    constexpr int NACC = DO / 2;              // DQ: D / 2 (DSPLIT 1)
    float acc[NACC], acc2[NACC];              // DQ: dQ (acc2 unused); DKV: dK, dV
#pragma unroll
    for (int i = 0; i < NACC; ++i) acc[i] = 0.0f;
    if constexpr (KV) {
#pragma unroll
        for (int i = 0; i < NACC; ++i) acc2[i] = 0.0f;
    }
    const int split = KV ? static_cast<int>(blockIdx.x % DSPLIT) : 0;

    // DKVQ: dQ^T = K^T dS^T of step j over the block's 128 keys, once both warpgroups' dS^T
    // is stored (issued and committed, not waited for), and its float32 tile to shared memory
    // as it lies in dq_accum, for the writer warp
    constexpr int QN = NQ / 2;                 // (declared for every kind, as wgmma_q)
    const int qm0 = QM == 2 ? wg : 0, qn0 = QM == 2 ? 0 : wg * NQ;
    float dqt[QN];
    auto issue_dq = [&](int j) {
        const unsigned sds = sDS + (j & 1) * DS_BYTES + qn0 * 128;
        fence_proxy_async();
        named_barrier(1, 256);
        wgmma_fence();
        const unsigned long long dk0 = descriptor(sOwn + qm0 * OWN_CHUNK, OWN_CHUNK, 1024),
                                 ds0 = descriptor(sds, 16, 1024);
#pragma unroll
        for (int kk = 0; kk < ROWS / 16; ++kk)
            wgmma_q(dqt, descriptor_plus(dk0, kk * 2048),
                    descriptor_plus(ds0, (kk / 4) * DS_CHUNK + (kk % 4) * 32), kk > 0);
        wgmma_commit();
    };
    auto store_dq = [&](int j) {
        // once the writer warp has read what the buffer held two steps ago
        named_barrier(TILE_FREE + (j & 1), 256 + 32);
        float* tile = reinterpret_cast<float*>(smem + (sDQ - base) + (j & 1) * DQ_BYTES);
        // element i = 4 q + 2 b1 + b0 is row n = n0 + 8 q + 2 t + b0, column d = 64 m0 +
        // 16 warp + g + 8 b1: n & 7 is 2 t + b0 (n0 a multiple of 8), so each (b0, b1) has
        // one column (dq_accum_col) and its rows step by 8
        static_assert(KIND != DKVQ || NQ % 8 == 0, "n0 and the rows' steps multiples of 8");
#pragma unroll
        for (int bb = 0; bb < 4; ++bb) {
            const int b0 = bb & 1, b1 = bb >> 1;
            const int n = qn0 + 2 * t + b0, d = qm0 * 64 + warp * 16 + g + 8 * b1;
            float* p = tile + n * D + dq_accum_col(n, d);
#pragma unroll
            for (int q = 0; q < QN / 4; ++q) p[8 * q * D] = dqt[4 * q + 2 * b1 + b0];
        }
        fence_proxy_async();
        named_barrier_arrive(TILE_FULL + (j & 1), 256 + 32);   // for the writer warp
    };

    mbar_wait(own_full, 0);
#pragma unroll 1
    for (int it = 0; it < steps; ++it) {
        const int s = it % STAGES;
        const unsigned stage = sStep + s * 2 * STEP_BYTES;
        const unsigned sA = sOwn, sA2 = sOwn + OWN_BYTES;   // DQ: Q, dO; DKV: K, V
        const unsigned sB = stage, sB2 = stage + STEP_BYTES;   // DQ: K, V; DKV: Q, dO
        const int step0 = (first + (KIND == DQ ? it : it % per_head)) * STEP;
        mbar_wait(full(s), (it / STAGES) & 1);

        // S = A B^T and dP = A2 B2^T: rows the thread's own (g, g + 8), columns the step's
        float sc[STEP / 2], dp[STEP / 2];
        wgmma_fence();
        const unsigned long long da0 = descriptor(sA + wg * 64 * 128, 16, 1024),
                                 db0 = descriptor(sB, 16, 1024),
                                 da20 = descriptor(sA2 + wg * 64 * 128, 16, 1024),
                                 db20 = descriptor(sB2, 16, 1024);
#pragma unroll
        for (int kd = 0; kd < D / 16; ++kd) {
            const int c = kd / 4, kk = kd % 4;
            const int a_off = c * OWN_CHUNK + kk * 32, b_off = c * STEP_CHUNK + kk * 32;
            wgmma_s(sc, descriptor_plus(da0, a_off), descriptor_plus(db0, b_off), kd > 0);
            wgmma_s(dp, descriptor_plus(da20, a_off), descriptor_plus(db20, b_off), kd > 0);
        }
        wgmma_commit();
        if constexpr (KIND == DKVQ && DEFER_DQ) {
            if (it > 0) issue_dq(it - 1);   // under this step's S and dP, and its softmax
            else wgmma_commit();            // an empty group: every step's wait below is one
        }
        // DKV: the thread's STEP / 4 query columns' lse and delta, staged by the producer
        constexpr int NCOL = KV ? STEP / 4 : 2;
        float col_l2[NCOL], col_dl[NCOL];
        if constexpr (KV && !DEFER_DQ) {   // (deferred: read where used, for registers)
            const float2* cv = reinterpret_cast<const float2*>(col_values(s));
#pragma unroll
            for (int j = 0; j < NCOL / 2; ++j) {
                const float2 l = cv[4 * j + t], d = cv[STEP / 2 + 4 * j + t];
                col_l2[2 * j] = l.x;
                col_l2[2 * j + 1] = l.y;
                col_dl[2 * j] = d.x;
                col_dl[2 * j + 1] = d.y;
            }
        }
        if constexpr (KIND == DKVQ && DEFER_DQ) wgmma_wait<1>();   // S and dP, not dQ^T
        else wgmma_wait<0>();

        if constexpr (SOFTCAP) {
#pragma unroll
            for (int i = 0; i < STEP / 2; ++i) sc[i] = tanh_approx(sc[i] * cap_in);
        }
        const bool partial = step0 < full_lo || step0 + STEP > full_hi ||
                             (KV && own0 + ROWS > seq.len_k) ||
                             (KIND == DQ && own0 + ROWS > seq.len_q);
        // P and dS (DQ: S's layout) or P^T and dS^T (DKV): in place of sc and dp. Without a
        // soft cap, the masks only where a block-uniform branch says the step has a masked
        // element (the rest skip the compares); with one, S is needed for dS (1 - tanh^2),
        // and keeping it for a second pass would spill, so the masks go in the same pass.
        const float2* cvs = reinterpret_cast<const float2*>(col_values(s));
        auto l2_of = [&](int i) {   // the lse (log2) and delta of element i's row or column
            if constexpr (KV && DEFER_DQ) {
                const float2 l = cvs[4 * (i / 4) + t];
                return (i & 1) ? l.y : l.x;
            }
            return KV ? col_l2[2 * (i / 4) + (i & 1)] : lse2[(i >> 1) & 1];
        };
        auto dl_of = [&](int i) {
            if constexpr (KV && DEFER_DQ) {
                const float2 d = cvs[STEP / 2 + 4 * (i / 4) + t];
                return (i & 1) ? d.y : d.x;
            }
            return KV ? col_dl[2 * (i / 4) + (i & 1)] : dl[(i >> 1) & 1];
        };
        auto masked = [&](int i) {
            const int hh = (i >> 1) & 1, col = step0 + 8 * (i / 4) + 2 * t + (i & 1);
            return col < lo[hh] || col >= hi[hh];
        };
        if constexpr (SOFTCAP) {
#pragma unroll
            for (int i = 0; i < STEP / 2; ++i) {
                const float th = sc[i];
                float pv = exp2_approx(cap_out * th - l2_of(i));
                if (partial && masked(i)) pv = 0.0f;
                sc[i] = pv;
                dp[i] = pv * (dp[i] - dl_of(i)) * (1.0f - th * th);
            }
        } else {
#pragma unroll
            for (int i = 0; i < STEP / 2; ++i) sc[i] = exp2_approx(sc[i] * SL - l2_of(i));
            if (partial) {
#pragma unroll
                for (int i = 0; i < STEP / 2; ++i)
                    if (masked(i)) sc[i] = 0.0f;
            }
#pragma unroll
            for (int i = 0; i < STEP / 2; ++i) dp[i] = sc[i] * (dp[i] - dl_of(i));
        }

        // DQ: dQ += dS K; DKV: dV += P^T dO, dK += dS^T Q (this split's columns)
        wgmma_fence();
        const unsigned long long dB = descriptor(sB, STEP_CHUNK, 1024),
                                 dB2 = descriptor(sB2, STEP_CHUNK, 1024);
#pragma unroll
        for (int kk = 0; kk < STEP / 16; ++kk) {
            unsigned da[4];
            a_fragment(da, dp, kk);
            const int row = kk * 16 * 128 + split * (DO / 64) * STEP_CHUNK;
            if constexpr (KIND == DKVQ) {   // dS^T's 16 x 16 of the warp: rows (queries)
                const int j = lane >> 3, i = lane & 7;
                const int n = kk * 16 + 8 * (j >> 1) + i, key = warp * 16 + 8 * (j & 1);
                stmatrix_x4_trans(sDS + (it & 1) * DS_BYTES + wg * DS_CHUNK + n * 128 +
                                  (((key >> 3) ^ (n & 7)) << 4), da);
            }
            if constexpr (KIND == DQ) {
                wgmma_acc(acc, da, descriptor_plus(dB, row), 1);
            } else {
                unsigned pa[4];
                a_fragment(pa, sc, kk);
                wgmma_acc(acc2, pa, descriptor_plus(dB2, row), 1);
                wgmma_acc(acc, da, descriptor_plus(dB, row), 1);
            }
        }
        wgmma_commit();
        if constexpr (KIND == DKVQ && DEFER_DQ) {
            wgmma_wait<1>();                  // the last step's dQ^T (dV and dK's pending)
            if (it > 0) store_dq(it - 1);
        } else if constexpr (KIND == DKVQ) {
            issue_dq(it);
            wgmma_wait<1>();                  // dV and dK's: the stage is free
            mbar_arrive(empty(s));            // every thread: its reads of lse and delta
            wgmma_wait<0>();
            store_dq(it);
            continue;
        }
        wgmma_wait<0>();
        if constexpr (KV) {   // each thread releases its own reads of the staged lse, delta
            mbar_arrive(empty(s));
        } else {
            __syncwarp();                     // the lanes' reads of the stage before lane 0's
            if (lane == 0) mbar_arrive(empty(s));
        }
    }
    if constexpr (KIND == DKVQ && DEFER_DQ) {   // the last step's dQ^T
        if (steps > 0) {
            issue_dq(steps - 1);
            wgmma_wait<0>();
            store_dq(steps - 1);
        }
    }

    // Epilogue: the thread's rows (g, g + 8 of its warp) below the length, 4-byte pairs
    const float sc_out = static_cast<float>(scale);
#pragma unroll
    for (int hh = 0; hh < 2; ++hh) {
        const int r = own0 + wrow + g + 8 * hh;
        if constexpr (KIND == DQ) {
            if (r >= seq.len_q) continue;
            T* dst = dq + (VARLEN ? 0 : b * dqb) + (seq.q_row0 + r) * dqs + head * dqh;
#pragma unroll
            for (int dt = 0; dt < DO / 8; ++dt)
                *reinterpret_cast<unsigned*>(dst + 8 * dt + 2 * t) = pack_f32x2<T>(
                    acc[4 * dt + 2 * hh] * sc_out, acc[4 * dt + 2 * hh + 1] * sc_out);
        } else {
            if (r >= seq.len_k) continue;
            const long long c0 = static_cast<long long>(split) * DO;
            T* dkr = dk + (VARLEN ? 0 : b * dkb) + (seq.k_row0 + r) * dks + head * dkh + c0;
            T* dvr = dv + (VARLEN ? 0 : b * dvb) + (seq.k_row0 + r) * dvs + head * dvh + c0;
#pragma unroll
            for (int dt = 0; dt < DO / 8; ++dt) {
                *reinterpret_cast<unsigned*>(dkr + 8 * dt + 2 * t) = pack_f32x2<T>(
                    acc[4 * dt + 2 * hh] * sc_out, acc[4 * dt + 2 * hh + 1] * sc_out);
                *reinterpret_cast<unsigned*>(dvr + 8 * dt + 2 * t) = pack_f32x2<T>(
                    acc2[4 * dt + 2 * hh], acc2[4 * dt + 2 * hh + 1]);
            }
        }
    }
}
