// {{ spec.kernel_name }}
// Fused attention backward (FlashAttention-2's arithmetic) on the tensor cores, sm_80+, one of
// three kernels (KIND), run in this order on the forward's inputs q, k, v, its output o and
// lse, and do, the gradient of o:
//   DOT  delta_i = sum_d do_id o_id (float32, laid out as lse); with dq_accum (the Hopper
//        one-kernel backward's float32 dQ: masks.cuh's dq_accum_row, tiles of dq_pad rows)
//        its rows zeroed
//   DQ   dq_i = scale sum_j ds_ij k_j, a block per query rows (its key blocks in a loop)
//   DKV  dk_j = scale sum_i ds_ij q_i and dv_j = sum_i p_ij do_i, a block per keys of a kv
//        head (the query blocks of every query head of its group in a loop: the GQA sum in
//        registers)
// with p_ij = exp(s_ij - lse_i) (the forward's probabilities, recomputed from its scores
// s_ij = (q_i . k_j) scale, or softcap tanh((q_i . k_j) scale / softcap) with SOFTCAP),
// dp_ij = do_i . v_j and ds_ij = p_ij (dp_ij - delta_i) (times 1 - tanh^2 with SOFTCAP: the
// gradient of the raw scaled score). No atomics, no float32 scratch: each output element is
// summed by one thread in a fixed order, so every run gives the same bits (deterministic).
// DQOUT, after bwd_sm90.cu's DKVQ: dq_i = scale dq_accum_i in dq's type and strides.
// The price: DQ and DKV each compute the scores and dp (7 matrix products where atomics take 5).
//
// Masks, lengths and layouts are the forward's (fwd_sm80.cu, tiles.cuh's Masks): a query that
// sees no key (lse -inf) has p = 0 and zero gradients. Rows past a length are zero-filled in
// shared memory and their lse taken as +inf, so they add nothing.
//
// DQ: block (blockIdx.x, h, b) = BM query rows, WARPS warps of 16 rows. Per key block of BN
// keys (K and V double-buffered by cp.async, one commit group per stage):
//   S = Q K^T (A = Q rows, B = K rows), P = exp2(S log2e - lse log2e)
//   dP = dO V^T (A = dO rows, B = V rows), dS = P (dP - delta)
//   dQ += dS K  (A = dS packed to 16 bits in registers, B = K rows by ldmatrix.trans)
// DKV: block (blockIdx.x = key block * DSPLIT + split, kv head, b) = BN keys, WARPS warps of 16
// keys, output columns [split DO, (split + 1) DO) of dk and dv (DSPLIT > 1 when D = 256: the
// accumulators of a whole row would not fit; each split recomputes S and dP). Per query block
// of BM queries (Q, dO, lse and delta double-buffered):
//   S^T = K Q^T (A = K rows, B = Q rows), P^T, dP^T = V dO^T, dS^T = P^T (dP^T - delta)
//   dV += P^T dO, dK += dS^T Q  (A = P^T / dS^T packed in registers, B = dO / Q rows .trans)
// Computing the transposes directly keeps every product's A operand in registers.
{% include "common/types.cuh" %}
{% include "common/activations.cuh" %}
{% include "common/sm80/cp_async.cuh" %}
{% include "common/sm80/ldmatrix.cuh" %}
{% include "common/sm80/mma.cuh" %}

using T = {{ spec.dtype.ctype }};                        // q, k, v, o, do and the gradients
constexpr int DOT = 0, DQ = 1, DKV = 2, DQOUT = 3;
constexpr int KIND = {{ {"dot": 0, "dq": 1, "dkv": 2, "dqout": 3}[spec.kind] }};
constexpr int D = {{ spec.head_dim }};                     // head dimension
constexpr int BM = {{ spec.config.block_m }};              // query rows per block or step
constexpr int BN = {{ spec.config.block_n }};              // keys per step or block
constexpr int WARPS = {{ spec.config.warps }};
constexpr int STAGES = {{ spec.config.stages }};
constexpr int DSPLIT = {{ spec.config.dsplit }};           // DKV: column splits of dk, dv
constexpr bool CAUSAL = {{ "true" if spec.causal else "false" }};
constexpr bool WINDOW = {{ "true" if spec.window else "false" }};
constexpr bool SOFTCAP = {{ "true" if spec.softcap else "false" }};
constexpr bool VARLEN = {{ "true" if spec.varlen else "false" }};
// each row's sequences kept apart by their bounds (masks.cuh's RowMasks; dense, S_q == S_k;
// the dq and dkv kernels)
constexpr bool SEGMENTS = {{ "true" if spec.segments else "false" }};

constexpr int THREADS = WARPS * 32;
constexpr int ROW_BYTES = D * 2;             // one shared row (16-bit elements)
constexpr int CPR = ROW_BYTES / 16;          // 16-byte chunks per row
constexpr int DK = D / 16;                   // k-steps of a product over D
constexpr int DO = D / DSPLIT;               // DKV: output columns of a block
constexpr double LOG2E = 1.4426950408889634;

static_assert(sizeof(T) == 2, "16-bit inputs");
static_assert(D % 64 == 0 && DO % 64 == 0, "whole 128-byte chunk groups");
static_assert(STAGES == 2, "double buffering");
static_assert(KIND != DQ || BM == 16 * WARPS, "the dq kernel: 16 query rows a warp");
static_assert(KIND != DKV || BN == 16 * WARPS, "the dkv kernel: 16 keys a warp");

{% include "attention/tiles.cuh" %}

// Soft-capping in place: s = tanh(s cap_in), kept for the gradient's 1 - tanh^2; the score in
// log2 units is then cap_out s.
template <int N>
__device__ __forceinline__ void softcap_tanh(float (&s)[N][4], float cap_in) {
#pragma unroll
    for (int n = 0; n < N; ++n)
#pragma unroll
        for (int r = 0; r < 4; ++r) s[n][r] = tanh_approx(s[n][r] * cap_in);
}

// s = A B^T and dp = A2 B2^T over the D columns: A, A2 the warp's 16 rows at a_base, a2_base
// (shared addresses of their first row), B, B2 the N rows at b_base, b2_base. s[n][r], dp[n][r]
// = row g (+8 for r >= 2), B's row 8 n + 2t (+1 odd r).
template <int N>
__device__ __forceinline__ void two_products(float (&s)[N / 8][4], float (&dp)[N / 8][4],
                                             const Lanes& lanes, unsigned a_base,
                                             unsigned a2_base, unsigned b_base,
                                             unsigned b2_base) {
#pragma unroll
    for (int n = 0; n < N / 8; ++n)
#pragma unroll
        for (int r = 0; r < 4; ++r) s[n][r] = dp[n][r] = 0.0f;
#pragma unroll
    for (int kd = 0; kd < DK; ++kd) {
        const int ch = (kd >> 2) * 128;
        unsigned a[4], a2[4];
        ldmatrix_x4(a, a_base + lanes.a[kd & 3] + ch);
        ldmatrix_x4(a2, a2_base + lanes.a[kd & 3] + ch);
#pragma unroll
        for (int p = 0; p < N / 16; ++p) {
            unsigned bf[4], bf2[4];
            ldmatrix_x4(bf, b_base + lanes.b[kd & 3] + p * 16 * ROW_BYTES + ch);
            ldmatrix_x4(bf2, b2_base + lanes.b[kd & 3] + p * 16 * ROW_BYTES + ch);
            const unsigned b0[2] = {bf[0], bf[1]}, b1[2] = {bf[2], bf[3]};
            const unsigned c0[2] = {bf2[0], bf2[1]}, c1[2] = {bf2[2], bf2[3]};
            mma_m16n8k16<T>(s[2 * p], a, b0);
            mma_m16n8k16<T>(s[2 * p + 1], a, b1);
            mma_m16n8k16<T>(dp[2 * p], a2, c0);
            mma_m16n8k16<T>(dp[2 * p + 1], a2, c1);
        }
    }
}

// The A fragment of k-step kk (columns 16 kk..) of accumulator tiles acc, 16-bit: a[0] =
// acc[2kk][0, 1] (row g, k 2t), a[1] = acc[2kk][2, 3] (row g + 8), a[2], a[3] the same of
// tile 2kk + 1 (k 2t + 8): an accumulator tile's layout is half of an A fragment's.
template <int NT>
__device__ __forceinline__ void a_fragment(unsigned (&a)[4], const float (&acc)[NT][4], int kk) {
    a[0] = pack_f32x2<T>(acc[2 * kk][0], acc[2 * kk][1]);
    a[1] = pack_f32x2<T>(acc[2 * kk][2], acc[2 * kk][3]);
    a[2] = pack_f32x2<T>(acc[2 * kk + 1][0], acc[2 * kk + 1][1]);
    a[3] = pack_f32x2<T>(acc[2 * kk + 1][2], acc[2 * kk + 1][3]);
}

// acc += a B for one k-step: B the 16 rows at b_row (k along the rows, n along each row: read
// by ldmatrix.trans), n8 tiles of acc = chunks of those rows from the first.
template <int DT>
__device__ __forceinline__ void product_trans(float (&acc)[DT][4], const unsigned (&a)[4],
                                              const Lanes& lanes, unsigned b_row) {
#pragma unroll
    for (int p = 0; p < DT / 2; ++p) {
        unsigned bf[4];
        ldmatrix_x4_trans(bf, b_row + lanes.bt[p & 3] + (p >> 2) * 128);
        const unsigned b0[2] = {bf[0], bf[1]}, b1[2] = {bf[2], bf[3]};
        mma_m16n8k16<T>(acc[2 * p], a, b0);
        mma_m16n8k16<T>(acc[2 * p + 1], a, b1);
    }
}

// The warp's 16 rows (wr0 + g, + 8) of accumulators acc (columns 8 dt + 2t, +1) times sc, as
// 16-bit values in a tile (chunk dt of each row), then copied to 16-byte stores of the first
// CHUNKS chunks of rows wr0.. to dst + row * ld, those below `valid` (a warp writes and reads
// only its own rows: no barrier between).
template <int DT>
__device__ __forceinline__ void stage_rows(char* tile, const float (&acc)[DT][4], float sc,
                                           int wr0, int g, int t) {
#pragma unroll
    for (int hh = 0; hh < 2; ++hh) {
        const int r = wr0 + g + 8 * hh;
#pragma unroll
        for (int dt = 0; dt < DT; ++dt)
            *reinterpret_cast<unsigned*>(tile + swz(r, dt) + 4 * t) =
                pack_f32x2<T>(acc[dt][2 * hh] * sc, acc[dt][2 * hh + 1] * sc);
    }
}

template <int CHUNKS>
__device__ __forceinline__ void store_rows(T* dst, long long ld, const char* tile, int wr0,
                                           int lane, int valid) {
#pragma unroll
    for (int i = 0; i < 16 * CHUNKS / 32; ++i) {
        const int u = lane + 32 * i;
        const int r = wr0 + u / CHUNKS, c = u % CHUNKS;
        if (r < valid)
            *reinterpret_cast<uint4*>(dst + r * ld + c * 8) =
                *reinterpret_cast<const uint4*>(tile + swz(r, c));
    }
}

extern "C" __global__ void __launch_bounds__(THREADS, 1)
{{ spec.kernel_name }}({{ spec.param_list() }})
{
    extern __shared__ __align__(128) char smem[];
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int g = lane >> 2, t = lane & 3;    // the mma's row group and column pair
    const int b = blockIdx.z;
    const Sequence<VARLEN> seq(b, S_q, S_k, cu_seqlens_q, cu_seqlens_k);
    // scores in log2 units: S * SL, or cap_out tanh(S cap_in) with SOFTCAP
    const float SL = SOFTCAP ? 1.0f : static_cast<float>(scale * LOG2E);
    const float cap_in = SOFTCAP ? static_cast<float>(scale / softcap) : 0.0f;
    const float cap_out = SOFTCAP ? static_cast<float>(softcap * LOG2E) : 0.0f;
    const RowMasks<SEGMENTS> mask(seq.len_q, seq.len_k, CAUSAL, WINDOW, window_left,
                                  window_right, {{ spec.row_bounds("b") }});

    if constexpr (KIND == DOT) {
        // D / 8 threads a row, 8 elements (16 bytes) each; THREADS / (D / 8) rows a block.
        constexpr int LANES = D / 8, ROWS = THREADS / LANES;
        const long long h = blockIdx.y;
        const int i = blockIdx.x * ROWS + tid / LANES, c = tid % LANES;
        float sum = 0.0f;
        if (i < seq.len_q) {   // (no early return: the whole warp shuffles below)
            const long long row = seq.q_row0 + i;
            const T* op = o + (VARLEN ? 0 : b * ob) + row * os + h * oh + c * 8;
            const T* gp = dout + (VARLEN ? 0 : b * gb) + row * gs + h * gh + c * 8;
            const uint4 ov = *reinterpret_cast<const uint4*>(op);
            const uint4 gv = *reinterpret_cast<const uint4*>(gp);
            const T* oe = reinterpret_cast<const T*>(&ov);
            const T* ge = reinterpret_cast<const T*>(&gv);
#pragma unroll
            for (int e = 0; e < 8; ++e) sum = fmaf(to_f32(oe[e]), to_f32(ge[e]), sum);
        }
#pragma unroll
        for (int w = LANES / 2; w > 0; w /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, w);
        const long long at = lse_index<VARLEN>(b, h, i, seq.q_row0, cu_seqlens_q, B, H, S_q);
        if (c == 0 && i < seq.len_q) delta[at] = sum;
        if (dq_accum != nullptr && i < seq.len_q) {   // the whole row (order irrelevant)
            float4* z = reinterpret_cast<float4*>(
                dq_accum + dq_accum_row<VARLEN>(b, h, i, cu_seqlens_q, B, H, S_q, dq_pad) * D +
                c * 8);
            z[0] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            z[1] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        }
        return;
    }
    if constexpr (KIND == DQOUT) {   // the DOT kernel's threads: 8 columns of a row each
        constexpr int LANES = D / 8, ROWS = THREADS / LANES;
        const long long h = blockIdx.y;
        const int i = blockIdx.x * ROWS + tid / LANES, c = tid % LANES;
        if (i >= seq.len_q) return;
        const float* row = dq_accum +
                           dq_accum_row<VARLEN>(b, h, i, cu_seqlens_q, B, H, S_q, dq_pad) * D;
        const float4 x = *reinterpret_cast<const float4*>(row + dq_accum_col(i, c * 8));
        const float4 y = *reinterpret_cast<const float4*>(row + dq_accum_col(i, c * 8 + 4));
        const float sc = static_cast<float>(scale);
        uint4 out;
        out.x = pack_f32x2<T>(x.x * sc, x.y * sc);
        out.y = pack_f32x2<T>(x.z * sc, x.w * sc);
        out.z = pack_f32x2<T>(y.x * sc, y.y * sc);
        out.w = pack_f32x2<T>(y.z * sc, y.w * sc);
        *reinterpret_cast<uint4*>(dq + (VARLEN ? 0 : b * dqb) + (seq.q_row0 + i) * dqs + h * dqh +
                                  c * 8) = out;
        return;
    }

    const Lanes lanes(lane);
    const unsigned smem0 = smem_u32(smem);
    const int wr0 = warp * 16;                // the warp's first row (DQ) or key (DKV)

    if constexpr (KIND == DQ) {
        constexpr int Q_BYTES = BM * ROW_BYTES, KV_BYTES = BN * ROW_BYTES;
        constexpr int STAGE_BYTES = 2 * KV_BYTES;          // K tile, then V tile
        constexpr int NT = BN / 8, NK = BN / 16, DT = D / 8;
        char* Qs = smem;                                   // Q; dQ's staging at the end
        char* dOs = smem + Q_BYTES;
        char* KVs = smem + 2 * Q_BYTES;                    // STAGES x (K, V)
        const long long h = blockIdx.y;
        const int m0 = blockIdx.x * BM;
        if (m0 >= seq.len_q) return;                       // the whole block
        const long long hk = h / (H / H_kv);
        const T* qp = q + (VARLEN ? 0 : b * qb) + (seq.q_row0 + m0) * qs + h * qh;
        const T* gp = dout + (VARLEN ? 0 : b * gb) + (seq.q_row0 + m0) * gs + h * gh;
        const T* kp = k + (VARLEN ? 0 : b * kb) + seq.k_row0 * ks + hk * kh;
        const T* vp = v + (VARLEN ? 0 : b * vb) + seq.k_row0 * vs + hk * vh;
        T* dqp = dq + (VARLEN ? 0 : b * dqb) + (seq.q_row0 + m0) * dqs + h * dqh;

        const int m_last = min(m0 + BM, seq.len_q) - 1;
        const int k_begin = mask.lo(m0), k_end = mask.hi(m_last);
        const int full_lo = mask.lo(m_last), full_hi = mask.hi(m0);
        const int n_first = k_begin / BN;
        const int n_blocks = k_end > k_begin ? ceil_div(k_end, BN) - n_first : 0;

        // this lane's two rows (g, g + 8): key intervals, lse (log2 units; +inf: sees
        // nothing or past the length) and delta
        int lo[2], hi[2];
        float lse2[2], dl[2];
#pragma unroll
        for (int hh = 0; hh < 2; ++hh) {
            const int i = m0 + wr0 + g + 8 * hh;
            lo[hh] = mask.lo(i);
            hi[hh] = mask.hi(i);
            lse2[hh] = pos_inf();
            dl[hh] = 0.0f;
            if (i < seq.len_q) {
                const long long at =
                    lse_index<VARLEN>(b, h, i, seq.q_row0, cu_seqlens_q, B, H, S_q);
                const float l = lse[at];
                lse2[hh] = l == neg_inf() ? pos_inf() : l * static_cast<float>(LOG2E);
                dl[hh] = delta[at];
            }
        }

        // prologue: (Q, dO, K_0, V_0) one group, then (K_s, V_s) for s < STAGES - 1
        load_tile<BM>(Qs, qp, qs, seq.len_q - m0, tid);
        load_tile<BM>(dOs, gp, gs, seq.len_q - m0, tid);
#pragma unroll
        for (int s = 0; s < STAGES - 1; ++s) {
            const long long n0 = static_cast<long long>(n_first + s) * BN;
            char* st = KVs + s * STAGE_BYTES;
            if (s < n_blocks) {
                load_tile<BN>(st, kp + n0 * ks, ks, seq.len_k - static_cast<int>(n0), tid);
                load_tile<BN>(st + KV_BYTES, vp + n0 * vs, vs, seq.len_k - static_cast<int>(n0),
                              tid);
            }
            cp_async_commit();
        }

        float acc[DT][4];                                  // dQ: rows g, g + 8; columns 8dt + 2t
#pragma unroll
        for (int dt = 0; dt < DT; ++dt)
#pragma unroll
            for (int r = 0; r < 4; ++r) acc[dt][r] = 0.0f;
        const unsigned q_base = smem0 + wr0 * ROW_BYTES, g_base = q_base + Q_BYTES;

#pragma unroll 1
        for (int it = 0; it < n_blocks; ++it) {
            const int n0 = (n_first + it) * BN;
            cp_async_wait<STAGES - 2>();
            __syncthreads();   // block it has landed; every warp is done with block it - 1's
            {
                const int nx = it + STAGES - 1;
                const long long nn = static_cast<long long>(n_first + nx) * BN;
                char* st = KVs + (nx % STAGES) * STAGE_BYTES;
                if (nx < n_blocks) {
                    load_tile<BN>(st, kp + nn * ks, ks, seq.len_k - static_cast<int>(nn), tid);
                    load_tile<BN>(st + KV_BYTES, vp + nn * vs, vs,
                                  seq.len_k - static_cast<int>(nn), tid);
                }
                cp_async_commit();
            }
            const unsigned k_base = smem0 + 2 * Q_BYTES + (it % STAGES) * STAGE_BYTES;
            const unsigned v_base = k_base + KV_BYTES;

            // S = Q K^T and dP = dO V^T: s[nt][r], dp[nt][r] = row g (+8 for r >= 2), key
            // n0 + 8 nt + 2t (+1 odd r)
            float s[NT][4], dp[NT][4];
            two_products<BN>(s, dp, lanes, q_base, g_base, k_base, v_base);
            if constexpr (SOFTCAP) softcap_tanh(s, cap_in);
            const bool partial = n0 < full_lo || n0 + BN > full_hi;   // block-uniform
            // P, then dS in place of S (dP consumed)
#pragma unroll
            for (int nt = 0; nt < NT; ++nt)
#pragma unroll
                for (int r = 0; r < 4; ++r) {
                    const int hh = r >> 1;
                    const float th = s[nt][r];
                    float pv = exp2_approx((SOFTCAP ? cap_out * th : th * SL) - lse2[hh]);
                    if (partial) {
                        const int j = n0 + 8 * nt + 2 * t + (r & 1);
                        if (j < lo[hh] || j >= hi[hh]) pv = 0.0f;
                    }
                    float ds = pv * (dp[nt][r] - dl[hh]);
                    if constexpr (SOFTCAP) ds *= 1.0f - th * th;
                    s[nt][r] = ds;
                }

            // dQ += dS K: k-step kk = keys 16 kk..: A from s tiles 2kk, 2kk + 1
#pragma unroll
            for (int kk = 0; kk < NK; ++kk) {
                unsigned da[4];
                a_fragment(da, s, kk);
                product_trans(acc, da, lanes, k_base + kk * 16 * ROW_BYTES);
            }
        }

        // dQ * scale through Q's tile (every warp past its last read of it) to 16-byte stores
        cp_async_wait<0>();
        __syncthreads();
        stage_rows(Qs, acc, static_cast<float>(scale), wr0, g, t);
        __syncwarp();
        store_rows<CPR>(dqp, dqs, Qs, wr0, lane, seq.len_q - m0);
        return;
    }

    if constexpr (KIND == DKV) {
        constexpr int KV_BYTES = BN * ROW_BYTES, Q_BYTES = BM * ROW_BYTES;
        constexpr int STAT_BYTES = 2 * BM * 4;             // lse (log2 units), delta
        constexpr int STAGE_BYTES = 2 * Q_BYTES + STAT_BYTES;   // Q, dO, stats
        constexpr int NTQ = BM / 8, KQ = BM / 16, DTO = DO / 8;
        char* Ks = smem;                                   // K, V; dK's, dV's staging at the end
        char* Vs = smem + KV_BYTES;
        char* Stages = smem + 2 * KV_BYTES;
        const long long hk = blockIdx.y;
        const int split = blockIdx.x % DSPLIT, n0 = (blockIdx.x / DSPLIT) * BN;
        if (n0 >= seq.len_k) return;                       // the whole block
        const int c0 = split * DO;                         // first output column
        const long long group = H / H_kv;
        const T* kp = k + (VARLEN ? 0 : b * kb) + (seq.k_row0 + n0) * ks + hk * kh;
        const T* vp = v + (VARLEN ? 0 : b * vb) + (seq.k_row0 + n0) * vs + hk * vh;
        T* dkp = dk + (VARLEN ? 0 : b * dkb) + (seq.k_row0 + n0) * dks + hk * dkh + c0;
        T* dvp = dv + (VARLEN ? 0 : b * dvb) + (seq.k_row0 + n0) * dvs + hk * dvh + c0;

        // the query rows that see a key of the block, and those that see all of them
        const int n_last = min(n0 + BN, seq.len_k) - 1;
        const int q_begin = mask.row_lo(n0), q_end = mask.row_hi(n_last);
        const int full_lo = mask.row_lo(n_last), full_hi = mask.row_hi(n0);
        const bool full_keys = n0 + BN <= seq.len_k;
        const int m_first = q_begin / BM;
        const int m_blocks = q_end > q_begin ? ceil_div(q_end, BM) - m_first : 0;
        const int steps = static_cast<int>(group) * m_blocks;   // (query head, query block)

        // this lane's two keys (g, g + 8): their query intervals
        int lo[2], hi[2];
#pragma unroll
        for (int hh = 0; hh < 2; ++hh) {
            const int j = n0 + wr0 + g + 8 * hh;
            lo[hh] = mask.row_lo(j);
            hi[hh] = mask.row_hi(j);
        }

        // Step `st`'s Q, dO (cp.async) and stats (plain loads and stores: the stage's buffer
        // is free, every warp being past the barrier that ends its use two steps before).
        auto load_step = [&](int st) {
            const long long hq = hk * group + st / m_blocks;
            const int m0 = (m_first + st % m_blocks) * BM;
            char* sb = Stages + (st % STAGES) * STAGE_BYTES;
            const long long row = seq.q_row0 + m0;
            load_tile<BM>(sb, q + (VARLEN ? 0 : b * qb) + row * qs + hq * qh, qs,
                          seq.len_q - m0, tid);
            load_tile<BM>(sb + Q_BYTES, dout + (VARLEN ? 0 : b * gb) + row * gs + hq * gh, gs,
                          seq.len_q - m0, tid);
            float* stats = reinterpret_cast<float*>(sb + 2 * Q_BYTES);
            for (int i = tid; i < BM; i += THREADS) {
                float l2 = pos_inf(), dlt = 0.0f;
                if (m0 + i < seq.len_q) {
                    const long long at = lse_index<VARLEN>(b, hq, m0 + i, seq.q_row0,
                                                           cu_seqlens_q, B, H, S_q);
                    const float l = lse[at];
                    l2 = l == neg_inf() ? pos_inf() : l * static_cast<float>(LOG2E);
                    dlt = delta[at];
                }
                stats[i] = l2;
                stats[BM + i] = dlt;
            }
        };

        // prologue: (K, V, step 0) one group, then step s for s < STAGES - 1
        load_tile<BN>(Ks, kp, ks, seq.len_k - n0, tid);
        load_tile<BN>(Vs, vp, vs, seq.len_k - n0, tid);
#pragma unroll
        for (int s = 0; s < STAGES - 1; ++s) {
            if (s < steps) load_step(s);
            cp_async_commit();
        }

        float dk_acc[DTO][4], dv_acc[DTO][4];              // rows = keys g, g + 8
#pragma unroll
        for (int dt = 0; dt < DTO; ++dt)
#pragma unroll
            for (int r = 0; r < 4; ++r) dk_acc[dt][r] = dv_acc[dt][r] = 0.0f;
        const unsigned k_base = smem0 + wr0 * ROW_BYTES, v_base = k_base + KV_BYTES;

#pragma unroll 1
        for (int st = 0; st < steps; ++st) {
            const int m0 = (m_first + st % m_blocks) * BM;
            cp_async_wait<STAGES - 2>();
            __syncthreads();   // step st has landed (its stats stored before this barrier)
            {
                const int nx = st + STAGES - 1;
                if (nx < steps) load_step(nx);
                cp_async_commit();
            }
            const unsigned q_base = smem0 + 2 * KV_BYTES + (st % STAGES) * STAGE_BYTES;
            const unsigned g_base = q_base + Q_BYTES;
            const float* stats = reinterpret_cast<const float*>(
                Stages + (st % STAGES) * STAGE_BYTES + 2 * Q_BYTES);

            // S^T = K Q^T and dP^T = V dO^T: rows = keys g (+8 for r >= 2), columns = queries
            // m0 + 8 nt + 2t (+1 odd r)
            float s[NTQ][4], dp[NTQ][4];
            two_products<BM>(s, dp, lanes, k_base, v_base, q_base, g_base);
            if constexpr (SOFTCAP) softcap_tanh(s, cap_in);
            const bool partial = !full_keys || m0 < full_lo || m0 + BM > full_hi;
            // P^T in s's place, dS^T in dp's
#pragma unroll
            for (int nt = 0; nt < NTQ; ++nt)
#pragma unroll
                for (int r = 0; r < 4; ++r) {
                    const int hh = r >> 1, ic = 8 * nt + 2 * t + (r & 1);
                    const float th = s[nt][r];
                    float pv = exp2_approx((SOFTCAP ? cap_out * th : th * SL) - stats[ic]);
                    if (partial) {
                        const int i = m0 + ic;
                        if (i < lo[hh] || i >= hi[hh]) pv = 0.0f;
                    }
                    float ds = pv * (dp[nt][r] - stats[BM + ic]);
                    if constexpr (SOFTCAP) ds *= 1.0f - th * th;
                    s[nt][r] = pv;
                    dp[nt][r] = ds;
                }

            // dV += P^T dO and dK += dS^T Q over this split's columns: k-step kk = queries
            // 16 kk..; B = dO / Q rows by ldmatrix.trans from column c0 (DO is a multiple of
            // 64: chunk pairs p + c0 / 16 keep (p & 3), 128 bytes a group of 4)
#pragma unroll
            for (int kk = 0; kk < KQ; ++kk) {
                unsigned pa[4], da[4];
                a_fragment(pa, s, kk);
                a_fragment(da, dp, kk);
                const unsigned row = kk * 16 * ROW_BYTES + split * (DO * 2);
                product_trans(dv_acc, pa, lanes, g_base + row);
                product_trans(dk_acc, da, lanes, q_base + row);
            }
        }

        // dK * scale and dV through K's and V's tiles (every warp past its last read) to
        // 16-byte stores of this split's columns
        cp_async_wait<0>();
        __syncthreads();
        stage_rows(Ks, dk_acc, static_cast<float>(scale), wr0, g, t);
        stage_rows(Vs, dv_acc, 1.0f, wr0, g, t);
        __syncwarp();
        store_rows<DO / 8>(dkp, dks, Ks, wr0, lane, seq.len_k - n0);
        store_rows<DO / 8>(dvp, dvs, Vs, wr0, lane, seq.len_k - n0);
    }
}
