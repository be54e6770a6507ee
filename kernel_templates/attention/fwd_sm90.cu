{% import "common/wgmma_instr.cuh" as wgmma_instr %}
// {{ spec.kernel_name }}
// Fused attention forward on Hopper (sm_90a): the arithmetic of fwd_sm80.cu (FlashAttention's
// online softmax in float32 in the exp2 domain, the same masks, lse, a row that sees no key
// gives 0 and -inf) with TMA loads, wgmma products and warp specialization.
//
// Block (blockIdx.x, h, b) = BM = 128 query rows of head h of sequence b; three warpgroups:
//   producer (warpgroup 0, its registers given up by setmaxnreg): one thread loads Q once and
//     streams K and V tiles of BN keys through STAGES buffers by TMA (4-D tensor maps over
//     (D, seq, heads, batch), or 3-D over (D, rows, heads) with VARLEN: any strides), each
//     64-column chunk of a tile one box with the 128-byte swizzle; K and V complete on their
//     own barriers (S can start before V has landed); a stage is reused once both consumers
//     have released it (`empty`).
//   consumers (warpgroups 1 and 2): rows 64 (warpgroup - 1) .. of the block. Per key block:
//     S = Q K^T    wgmma m64nBNk16, A = Q and B = K from shared memory (both K-major),
//                  D / 16 steps
//     online softmax on S's accumulators (a thread holds rows g and g + 8 of its warp's 16,
//                  the quad shares a row: the layout of mma.sync's accumulators)
//     O += P V     wgmma m64nDk16, A = P packed to 16 bits in registers (an accumulator tile
//                  is half an A fragment), B = V from shared memory (N-major: D along a row),
//                  BN / 16 steps
// The output: rows below the sequence's length stored from registers, a quad's 4-byte pairs
// 16 contiguous bytes.
{% include "attention/sm90.cuh" %}

using T = {{ spec.dtype.ctype }};                        // q, k, v, o
constexpr int D = {{ spec.head_dim }};
constexpr int BM = 128;                                    // query rows per block
constexpr int BN = {{ spec.block_n }};                     // keys per step
constexpr int STAGES = {{ spec.stages }};
constexpr bool CAUSAL = {{ "true" if spec.causal else "false" }};
constexpr bool WINDOW = {{ "true" if spec.window else "false" }};
constexpr bool SOFTCAP = {{ "true" if spec.softcap else "false" }};
constexpr bool VARLEN = {{ "true" if spec.varlen else "false" }};
// each row's sequences kept apart by their bounds (masks.cuh's RowMasks; dense, S_q == S_k)
constexpr bool SEGMENTS = {{ "true" if spec.segments else "false" }};
constexpr bool WRITE_LSE = {{ "true" if spec.write_lse else "false" }};
// OVERLAP: a consumer issues block i's S = Q K^T before block i - 1's O += P V, and does block
// i's softmax while that product runs (FlashAttention-3's intra-warpgroup overlap; P of block
// i - 1 kept in registers as A fragments). PINGPONG: the two consumers take turns issuing
// their products (named barriers 1 and 2), so that one's softmax runs under the other's.
constexpr bool OVERLAP = {{ "true" if spec.overlap else "false" }};
constexpr bool PINGPONG = {{ "true" if spec.pingpong else "false" }};
// PERSISTENT: a block per multiprocessor takes tiles (query block, head, sequence) in turn,
// the last query blocks (the most keys) first; the producer loads the next tile's Q and first
// K, V while the consumers finish a tile and store it. (With PINGPONG each tile begins with
// consumer 0's turn and ends with every turn taken: the barriers carry nothing across tiles.)
constexpr bool PERSISTENT = {{ "true" if spec.persistent else "false" }};
static_assert(OVERLAP || !PINGPONG, "ping-pong takes the overlapped loop");

constexpr int THREADS = 384;                  // producer + 2 consumers
constexpr int PRODUCER_REGS = 40, CONSUMER_REGS = 232;   // 128 x 40 + 256 x 232 <= 64 Ki
constexpr int DC = D / 64;                    // 64-column (128-byte) chunks of a row
constexpr int Q_CHUNK = BM * 128, KV_CHUNK = BN * 128;   // bytes of one chunk of a tile
constexpr int Q_BYTES = DC * Q_CHUNK, KV_BYTES = DC * KV_CHUNK;
constexpr int NT = BN / 8, DT = D / 8;        // n8 tiles of S and of O
constexpr double LOG2E = 1.4426950408889634;

static_assert(sizeof(T) == 2, "16-bit inputs");
static_assert(D % 64 == 0 && BN % 16 == 0 && BN <= 256 && D <= 256, "wgmma shapes");

{{ wgmma_instr.ss("wgmma_s", spec.block_n, spec.dtype.value) }}

{{ wgmma_instr.rs("wgmma_o", spec.head_dim, spec.dtype.value, 1) }}


extern "C" __global__ void __launch_bounds__(THREADS, 1)
{{ spec.kernel_name }}({{ spec.param_list() }})
{
    extern __shared__ __align__(1024) char smem[];
    const unsigned base = smem_u32(smem);
    const unsigned sQ = base, sKV = base + Q_BYTES;    // stage s: K at sKV + 2 s KV_BYTES, V after
    const unsigned bars = sKV + STAGES * 2 * KV_BYTES;
    const unsigned q_full = bars;
    auto k_full = [&](int s) { return bars + 8 + 8 * s; };
    auto v_full = [&](int s) { return bars + 8 + 8 * (STAGES + s); };
    // stage s's K and V read by every consumer warp: the overlapped loop frees K once S is
    // made and V once P V is, so the producer loads the next K while V is still read
    auto k_empty = [&](int s) { return bars + 8 + 8 * (2 * STAGES + s); };
    auto v_empty = [&](int s) { return bars + 8 + 8 * (3 * STAGES + s); };
    const unsigned q_empty = bars + 8 + 8 * 4 * STAGES;   // (PERSISTENT) Q read by every warp
    // (OVERLAP) a consumer warp's 4-byte slot for anchor_wait, after the barriers
    const unsigned anchors = bars + 8 * (2 + 4 * STAGES);
    // (WRITE_LSE) the 128 rows' maximum, kept here from the end of the key loop to the
    // epilogue: a maximum live in registers until the lse store makes ptxas allocate the
    // whole kernel's registers differently, about 10% slower at head_dim 64
    const unsigned max_stash = anchors + 4 * 8;

    const int tid = threadIdx.x;
    // The tiles: one, (blockIdx.x, y, z), or (PERSISTENT) tile blockIdx.x, then every
    // gridDim.x-th: sections of heads_group (sequence, head) pairs, heads fastest in one (a
    // grouped-query head's K and V shared in L2), then the query blocks
    const int m_blocks = PERSISTENT ? ceil_div(static_cast<int>(S_q), BM) : 1;
    const long long n_tiles = PERSISTENT ? static_cast<long long>(m_blocks) * H * B : 1;
    const long long t_first = PERSISTENT ? blockIdx.x : 0, t_step = PERSISTENT ? gridDim.x : 1;
    struct Work {
        long long q_row0, k_row0;
        int b, h, hk, m0, len_q, len_k, n_first, n_blocks, full_lo, full_hi;
    };
    auto work_of = [&](long long t) {   // tile t's rows, keys and blocks of keys
        Work w;
        int mi;
        if constexpr (PERSISTENT) {
            // the (sequence, head) pairs in sections of heads_group (the last one may be
            // smaller), a section's tiles in turn: a section's K and V fit in L2
            const long long pairs = H * B, sec_tiles = m_blocks * heads_group;
            const long long sec = t / sec_tiles, r = t - sec * sec_tiles;
            const long long in_sec = min(heads_group, pairs - sec * heads_group);
            const long long pair = sec * heads_group + r % in_sec;
            mi = static_cast<int>(r / in_sec);
            w.h = static_cast<int>(pair % H);
            w.b = static_cast<int>(pair / H);
            mi = CAUSAL ? m_blocks - 1 - mi : mi;
        } else {
            // causal: the last query blocks (the most keys) first, so that the longest blocks
            // do not start last
            mi = CAUSAL ? gridDim.x - 1 - blockIdx.x : blockIdx.x;
            w.h = blockIdx.y;
            w.b = blockIdx.z;
        }
        w.m0 = mi * BM;
        const Sequence<VARLEN> seq(w.b, S_q, S_k, cu_seqlens_q, cu_seqlens_k);
        w.q_row0 = seq.q_row0;
        w.k_row0 = seq.k_row0;
        w.len_q = seq.len_q;
        w.len_k = seq.len_k;
        w.hk = static_cast<int>(w.h / (H / H_kv));
        const RowMasks<SEGMENTS> mask(w.len_q, w.len_k, CAUSAL, WINDOW, window_left,
                                      window_right, {{ spec.row_bounds("w.b") }});
        const int m_last = min(w.m0 + BM, w.len_q) - 1;
        const int k_begin = mask.lo(w.m0), k_end = mask.hi(m_last);
        w.full_lo = mask.lo(m_last);
        w.full_hi = mask.hi(w.m0);
        w.n_first = k_begin / BN;
        w.n_blocks = k_end > k_begin ? ceil_div(k_end, BN) - w.n_first : 0;
        return w;
    };
    if constexpr (!PERSISTENT) {
        const Work w = work_of(0);
        if (w.m0 >= w.len_q) return;          // the whole block: before any barrier
    }

    if (tid == 0) {
        mbar_init(q_full, 1);
        mbar_init(q_empty, 2 * 4);
        for (int s = 0; s < STAGES; ++s) {
            mbar_init(k_full(s), 1);
            mbar_init(v_full(s), 1);
            mbar_init(k_empty(s), 2 * 4);      // each consumer warp
            mbar_init(v_empty(s), 2 * 4);
        }
        mbar_fence_init();
    }
    __syncthreads();

    const int warpgroup = tid / 128;
    if (warpgroup == 0) {
        warpgroup_registers_down<PRODUCER_REGS>();
        if (tid == 0) {
            int g = 0, n = 0;                 // blocks of keys and tiles loaded so far
            for (long long t = t_first; t < n_tiles; t += t_step) {
                const Work w = work_of(t);
                if (w.m0 >= w.len_q) continue;   // (PERSISTENT) past its sequence: skipped
                if (n > 0) mbar_wait(q_empty, (n - 1) & 1);   // the last tile's Q read
                mbar_expect_tx(q_full, Q_BYTES);
                load_tile<BM, DC, VARLEN>(sQ, &tma_q, static_cast<int>(w.q_row0) + w.m0, w.h,
                                          w.b, q_full);
                for (int it = 0; it < w.n_blocks; ++it, ++g) {
                    const int s = g % STAGES;
                    const int row = static_cast<int>(w.k_row0) + (w.n_first + it) * BN;
                    const unsigned stage = sKV + s * 2 * KV_BYTES;
                    mbar_wait(k_empty(s), ((g / STAGES) & 1) ^ 1);
                    mbar_expect_tx(k_full(s), KV_BYTES);
                    load_tile<BN, DC, VARLEN>(stage, &tma_k, row, w.hk, w.b, k_full(s));
                    mbar_wait(v_empty(s), ((g / STAGES) & 1) ^ 1);
                    mbar_expect_tx(v_full(s), KV_BYTES);
                    load_tile<BN, DC, VARLEN>(stage + KV_BYTES, &tma_v, row, w.hk, w.b,
                                              v_full(s));
                }
                ++n;
            }
        }
        return;
    }

    // A consumer thread: its warpgroup's 64 rows, its warp's 16, its rows g and g + 8.
    warpgroup_registers_up<CONSUMER_REGS>();
    // (the warpgroup by a shuffle: the compiler then knows it is the same in the warp, and
    // the descriptors made from it stay in uniform registers)
    const int wg = __shfl_sync(0xffffffffu, warpgroup - 1, 0), lane = tid & 31;
    const int warp = (tid / 32) & 3;
    const int g = lane >> 2, t = lane & 3;
    const int wrow = wg * 64 + warp * 16;     // the warp's first row in the block
    int g0 = 0, n_done = 0;                   // blocks of keys and tiles taken so far
    for (long long tile = t_first; tile < n_tiles; tile += t_step) {
    const Work w = work_of(tile);
    if (w.m0 >= w.len_q) continue;
    const int b = w.b, h = w.h, m0 = w.m0, len_q = w.len_q, n_first = w.n_first;
    const int n_blocks = w.n_blocks, full_lo = w.full_lo, full_hi = w.full_hi;
    const long long q_row0 = w.q_row0;
    const RowMasks<SEGMENTS> mask(len_q, w.len_k, CAUSAL, WINDOW, window_left, window_right,
                                  {{ spec.row_bounds("b") }});
    int lo[2], hi[2];
#pragma unroll
    for (int hh = 0; hh < 2; ++hh) {
        lo[hh] = mask.lo(m0 + wrow + g + 8 * hh);
        hi[hh] = mask.hi(m0 + wrow + g + 8 * hh);
    }
    const float SL = SOFTCAP ? 1.0f : static_cast<float>(scale * LOG2E);
    const float cap_in = SOFTCAP ? static_cast<float>(scale / softcap) : 0.0f;
    const float cap_out = SOFTCAP ? static_cast<float>(softcap * LOG2E) : 0.0f;

    // acc[4 dt + r] = O's row g (+8 for r >= 2), column 8 dt + 2t (+1 odd r); sc likewise
    // over keys
    float acc[D / 2];
#pragma unroll
    for (int i = 0; i < D / 2; ++i) acc[i] = 0.0f;
    float row_max[2] = {neg_inf(), neg_inf()}, row_sum[2] = {0.0f, 0.0f};

    mbar_wait(q_full, n_done & 1);
    auto issue_s = [&](float (&sc)[BN / 2], int it) {   // S of block it, committed
        const int s = (g0 + it) % STAGES;
        mbar_wait(k_full(s), ((g0 + it) / STAGES) & 1);
        wgmma_fence();
        const unsigned long long dq = descriptor(sQ + wg * 64 * 128, 16, 1024);
        const unsigned long long dk = descriptor(sKV + s * 2 * KV_BYTES, 16, 1024);
#pragma unroll
        for (int kd = 0; kd < D / 16; ++kd) {
            const int c = kd / 4, kk = kd % 4;
            wgmma_s(sc, descriptor_plus(dq, c * Q_CHUNK + kk * 32),
                    descriptor_plus(dk, c * KV_CHUNK + kk * 32), kd > 0);
        }
        wgmma_commit();
    };
    auto issue_pv = [&](const unsigned (&pa)[BN / 16][4], int it) {   // O += P V, committed
        const int s = (g0 + it) % STAGES;
        mbar_wait(v_full(s), ((g0 + it) / STAGES) & 1);
        wgmma_fence();
        const unsigned long long dv = descriptor(sKV + s * 2 * KV_BYTES + KV_BYTES, KV_CHUNK,
                                                 1024);
#pragma unroll
        for (int kk = 0; kk < BN / 16; ++kk)
            wgmma_o(acc, pa[kk], descriptor_plus(dv, kk * 16 * 128), 1);
        wgmma_commit();
    };
    // Block it's scores: capped, masked, then the online softmax: P (unnormalized, float32) in
    // place of S, the row maximum and sum updated; corr[hh]: the factor of what O holds
    // (applied by the caller). pack() then makes P the A fragments of O += P V.
    auto softmax = [&](float (&sc)[BN / 2], int it, float (&corr)[2]) {
        const int n0 = (n_first + it) * BN;
        if constexpr (SOFTCAP) {
#pragma unroll
            for (int i = 0; i < BN / 2; ++i) sc[i] = cap_out * tanh_approx(sc[i] * cap_in);
        }
        if (n0 < full_lo || n0 + BN > full_hi) {   // block-uniform: some row not covered whole
#pragma unroll
            for (int i = 0; i < BN / 2; ++i) {
                const int j = n0 + 8 * (i / 4) + 2 * t + (i & 1), hh = (i >> 1) & 1;
                if (j < lo[hh] || j >= hi[hh]) sc[i] = neg_inf();
            }
        }
#pragma unroll
        for (int hh = 0; hh < 2; ++hh) {
            float mx = row_max[hh];
#pragma unroll
            for (int nt = 0; nt < NT; ++nt)
                mx = fmaxf(mx, fmaxf(sc[4 * nt + 2 * hh], sc[4 * nt + 2 * hh + 1]));
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
            const float base_v = mx == neg_inf() ? 0.0f : mx * SL;
            corr[hh] = exp2_approx(row_max[hh] * SL - base_v);
            row_max[hh] = mx;
            float sum = 0.0f;
#pragma unroll
            for (int nt = 0; nt < NT; ++nt)
#pragma unroll
                for (int c = 0; c < 2; ++c) {
                    const float pv = exp2_approx(fmaf(sc[4 * nt + 2 * hh + c], SL, -base_v));
                    sc[4 * nt + 2 * hh + c] = pv;
                    sum += pv;
                }
            row_sum[hh] = row_sum[hh] * corr[hh] + sum;
        }
    };
    auto pack = [&](const float (&sc)[BN / 2], unsigned (&pa)[BN / 16][4]) {
#pragma unroll
        for (int kk = 0; kk < BN / 16; ++kk) {
            pa[kk][0] = pack_f32x2<T>(sc[8 * kk], sc[8 * kk + 1]);
            pa[kk][1] = pack_f32x2<T>(sc[8 * kk + 2], sc[8 * kk + 3]);
            pa[kk][2] = pack_f32x2<T>(sc[8 * kk + 4], sc[8 * kk + 5]);
            pa[kk][3] = pack_f32x2<T>(sc[8 * kk + 6], sc[8 * kk + 7]);
        }
    };
    // O times the rows' factors; skipped by a warp whose factors are all exactly 1 (once the
    // maxima settle, most blocks of a long row), the D / 2 products changing nothing
    auto rescale = [&](const float (&corr)[2]) {
        if (__all_sync(0xffffffffu, corr[0] == 1.0f && corr[1] == 1.0f)) return;
#pragma unroll
        for (int dt = 0; dt < DT; ++dt)
#pragma unroll
            for (int r = 0; r < 4; ++r) acc[4 * dt + r] *= corr[r >> 1];
    };
    auto release_k = [&](int it) {   // this warp is done with block it's K
        if (lane == 0) mbar_arrive(k_empty((g0 + it) % STAGES));
    };
    auto release_v = [&](int it) {   // ... and with its V
        if (lane == 0) mbar_arrive(v_empty((g0 + it) % STAGES));
    };

    float sc[BN / 2], corr[2];
    unsigned pa[BN / 16][4];
    if constexpr (!OVERLAP) {
#pragma unroll 1
        for (int it = 0; it < n_blocks; ++it) {
            issue_s(sc, it);
            wgmma_wait<0>();
            release_k(it);
            // (PERSISTENT) the tile's last read of Q: the producer may load the next tile's
            if (PERSISTENT && it == n_blocks - 1 && lane == 0) mbar_arrive(q_empty);
            softmax(sc, it, corr);
            pack(sc, pa);
            rescale(corr);
            issue_pv(pa, it);
            wgmma_wait<0>();
            release_v(it);
        }
    } else if (n_blocks > 0) {
        // block it's S is issued, O rescaled by block it - 1's factor while S runs, then
        // block it - 1's P V issued (P of it - 1 in pa); block it's softmax runs while P V does
        // (anchor_wait keeps the wait after it); once P V is done P of block it is packed into
        // pa (FlashAttention-3's order). With PINGPONG a
        // consumer issues its two products in its turn (barrier 1 + wg) and then lets the
        // other go (it skips its last arrival, which nobody waits for).
        if (PINGPONG && wg == 1) named_barrier_arrive(1, 256);   // consumer 0 goes first
        if (PINGPONG) named_barrier(1 + wg, 256);
        issue_s(sc, 0);
        if (PINGPONG && !(wg == 1 && n_blocks == 1)) named_barrier_arrive(2 - wg, 256);
        wgmma_wait<0>();
        release_k(0);
        if (PERSISTENT && n_blocks == 1 && lane == 0) mbar_arrive(q_empty);   // Q's last read
        softmax(sc, 0, corr);            // (O is 0: its factor changes nothing)
        pack(sc, pa);
#pragma unroll 1
        for (int it = 1; it < n_blocks; ++it) {
            if (PINGPONG) named_barrier(1 + wg, 256);
            issue_s(sc, it);
            rescale(corr);               // block it - 1's factor (O is not in flight)
            issue_pv(pa, it - 1);
            if (PINGPONG && !(wg == 1 && it == n_blocks - 1)) named_barrier_arrive(2 - wg, 256);
            wgmma_wait<1>();             // S of block it (P V of it - 1 may still run)
            fence_operands(sc);
            release_k(it);
            if (PERSISTENT && it == n_blocks - 1 && lane == 0) mbar_arrive(q_empty);
            softmax(sc, it, corr);
            // the row sums need every exponential: the wait stays after them (else ptxas
            // hoists it above the softmax to pack P early, and nothing overlaps P V)
            if (lane == 0) anchor_wait(anchors + 4 * (tid / 32 - 4), row_sum[0] + row_sum[1]);
            wgmma_wait<0>();             // P V of block it - 1: O holds it
            fence_operands(pa);          // P of it - 1 and O live until P V is done
            fence_operands(acc);
            release_v(it - 1);
            pack(sc, pa);
        }
        rescale(corr);
        issue_pv(pa, n_blocks - 1);
        wgmma_wait<0>();
        release_v(n_blocks - 1);
    }

    if constexpr (WRITE_LSE) {   // written and read back by the same thread
        if (t == 0) {
            float* st = reinterpret_cast<float*>(smem + (max_stash - base));
            st[wrow + g] = row_max[0];
            st[wrow + g + 8] = row_max[1];
        }
    }
    // (PERSISTENT) a tile without keys reads no Q: its buffer is free for the next tile's
    if (PERSISTENT && n_blocks == 0 && lane == 0) mbar_arrive(q_empty);

    // Epilogue: o / l, lse, stores of the rows below the length
    T* op = o + (VARLEN ? 0 : b * ob) + (q_row0 + m0) * os + h * oh;
#pragma unroll
    for (int hh = 0; hh < 2; ++hh) {
        float l = row_sum[hh];
        l += __shfl_xor_sync(0xffffffffu, l, 1);
        l += __shfl_xor_sync(0xffffffffu, l, 2);
        const float inv = l > 0.0f ? 1.0f / l : 0.0f;
        const int r = wrow + g + 8 * hh;
        if (m0 + r >= len_q) continue;
        if constexpr (WRITE_LSE) {
            if (t == 0)
                lse[lse_index<VARLEN>(b, h, m0 + r, q_row0, cu_seqlens_q, B, H, S_q)] =
                    row_lse(reinterpret_cast<const float*>(smem + (max_stash - base))[r], SL,
                            l);
        }
#pragma unroll
        for (int dt = 0; dt < DT; ++dt)
            *reinterpret_cast<unsigned*>(op + r * os + 8 * dt + 2 * t) =
                pack_f32x2<T>(acc[4 * dt + 2 * hh] * inv, acc[4 * dt + 2 * hh + 1] * inv);
    }
    g0 += n_blocks;
    ++n_done;
    }   // the tiles
}
