// {{ spec.kernel_name }}
// Fused attention forward (FlashAttention-2's design) on the tensor cores, sm_80+: for each
// query row i of a sequence, o_i = sum_j p_ij v_j / sum_j p_ij with p_ij = exp(s_ij - m_i),
// s_ij = (q_i . k_j) * scale (softcap * tanh(s_ij / softcap) with SOFTCAP), over the keys j
// the masks allow; lse_i = m_i + log(sum_j p_ij) (natural log) with WRITE_LSE. Softmax in
// float32 in the exp2 domain (log2(e) folded into the scale). A row that allows no key gets
// o = 0 and lse = -inf.
//
// Masks, per sequence of lengths (S_q, S_k) and off = S_k - S_q (bottom-right aligned): key j
// is allowed for row i iff 0 <= j < S_k and, with a left bound, j >= i + off - left, with a
// right bound, j <= i + off + right (CAUSAL: right = 0; WINDOW: window_left / window_right,
// -1 = unbounded). Each row's allowed keys are one interval [lo_i, hi_i); a block visits only
// the key blocks that meet the union of its rows' intervals, and masks element by element only
// in the blocks that some row's interval does not cover whole.
//
// Block (blockIdx.x, h, b) = BM query rows of head h of sequence b (VARLEN: rows
// cu_seqlens_q[b] .. of the packed arrays; a block past its sequence exits), GQA: kv head
// h / (H / H_kv). WARPS warps, each MW = BM / (16 WARPS) m16 tiles (16 MW consecutive rows).
// Per key block of BN keys:
//   S = Q K^T   mma.sync m16n8k16, A = Q fragments (kept in registers when Q_IN_REGS, else
//               ldmatrix from shared memory at each k-step: D = 256 cannot hold both Q and the
//               O accumulators), B = K rows by ldmatrix (K is n-major: no transpose)
//   online softmax on the S accumulators: row max over the quad (lanes 4g..4g+3 hold one row),
//               O and the row sum rescaled by exp2(m_old - m_new), P = exp2(S - m_new)
//   O += P V    A = P packed to 16-bit pairs in registers (an S accumulator tile's layout is
//               half of an A fragment's), B = V rows by ldmatrix.trans (V is k-major)
// K and V tiles stream through STAGES shared buffers by cp.async (each tile its own commit
// group, so the V wait comes after S and the softmax); Q has its own tile, reused at the end to
// stage O for 16-byte coalesced stores. Shared rows are D * 2 bytes of 16-byte chunks whose
// index is XORed with (row & 7): the 8 rows an ldmatrix phase reads hit 8 distinct bank groups.
//
// Alignment is the caller's: q, k, v, o 16-byte aligned, every seq and head stride (and batch
// stride, dense) a multiple of 8 elements, unit stride along D. Rows past a length are
// zero-filled by cp.async's src-size (no NaN from stale shared memory reaches P V).
{% include "common/types.cuh" %}
{% include "common/activations.cuh" %}
{% include "common/sm80/cp_async.cuh" %}
{% include "common/sm80/ldmatrix.cuh" %}
{% include "common/sm80/mma.cuh" %}

using T = {{ spec.dtype.ctype }};                        // q, k, v, o
constexpr int D = {{ spec.head_dim }};                     // head dimension
constexpr int BM = {{ spec.config.block_m }};              // query rows per block
constexpr int BN = {{ spec.config.block_n }};              // keys per block step
constexpr int WARPS = {{ spec.config.warps }};
constexpr int STAGES = {{ spec.config.stages }};           // K/V buffers
constexpr int MIN_BLOCKS = {{ spec.config.min_blocks }};   // launch bounds: blocks per SM
constexpr bool CAUSAL = {{ "true" if spec.causal else "false" }};
constexpr bool WINDOW = {{ "true" if spec.window else "false" }};
constexpr bool SOFTCAP = {{ "true" if spec.softcap else "false" }};
constexpr bool VARLEN = {{ "true" if spec.varlen else "false" }};
// each row's sequences kept apart by their bounds (masks.cuh's RowMasks; dense, S_q == S_k)
constexpr bool SEGMENTS = {{ "true" if spec.segments else "false" }};
constexpr bool WRITE_LSE = {{ "true" if spec.write_lse else "false" }};
constexpr bool Q_IN_REGS = {{ "true" if spec.q_in_registers else "false" }};

constexpr int THREADS = WARPS * 32;
constexpr int MW = BM / (16 * WARPS);        // m16 tiles per warp
constexpr int ROW_BYTES = D * 2;             // one shared row (16-bit elements)
constexpr int CPR = ROW_BYTES / 16;          // 16-byte chunks per row
constexpr int Q_BYTES = BM * ROW_BYTES;
constexpr int KV_BYTES = BN * ROW_BYTES;     // one K or V tile
constexpr int STAGE_BYTES = 2 * KV_BYTES;    // K tile, then V tile
constexpr int NT = BN / 8;                   // n8 tiles of S (per m16 tile)
constexpr int DT = D / 8;                    // n8 tiles of O
constexpr int DK = D / 16;                   // k-steps of S = Q K^T
constexpr int NK = BN / 16;                  // k-steps of O += P V
constexpr double LOG2E = 1.4426950408889634;

static_assert(sizeof(T) == 2, "16-bit inputs");
static_assert(BM == 16 * MW * WARPS && MW >= 1, "whole m16 tiles per warp");
static_assert(BN % 16 == 0 && D % 16 == 0 && CPR % 8 == 0, "whole k-steps, 128-byte rows");
static_assert(STAGES >= 2, "double buffering at least");

{% include "attention/tiles.cuh" %}

extern "C" __global__ void __launch_bounds__(THREADS, MIN_BLOCKS)
{{ spec.kernel_name }}({{ spec.param_list() }})
{
    extern __shared__ __align__(128) char smem[];
    char* Qs = smem;                          // BM rows; O's staging at the end
    char* KVs = smem + Q_BYTES;               // STAGES x (K tile, V tile)

    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int g = lane >> 2, t = lane & 3;    // the mma's row group and column pair
    const int b = blockIdx.z, h = blockIdx.y;
    const int m0 = blockIdx.x * BM;
    const int wr0 = warp * 16 * MW;           // the warp's first row in the block

    // ldmatrix.x4 row addresses (lanes 8i..8i+7 give matrix i's 8 rows), x = lane & 7:
    //   Q (A, rows m x d): matrix i = rows +8 if i & 1, d chunk +1 if i & 2 -> a[i]
    //   K (B of S, rows = keys n x d): matrix i = keys +8 if i & 2, d chunk +1 if i & 1
    //   V (B of O, rows = keys k x d, .trans): matrix i = keys +8 if i & 1, d chunk +1 if i & 2
    const int x = lane & 7;
    const unsigned q_lane = smem_u32(Qs) + (wr0 + (lane & 15)) * ROW_BYTES;
    const unsigned kv_smem = smem_u32(KVs);
    const int k_lane = (((lane >> 4) << 3) + x) * ROW_BYTES;
    const int v_lane = KV_BYTES + ((((lane >> 3) & 1) << 3) + x) * ROW_BYTES;
    const Chunks qv_chunks((lane >> 4) ^ x);          // Q's and V's: cl = lane / 16
    const Chunks k_chunks(((lane >> 3) & 1) ^ x);     // K's: cl = (lane / 8) & 1
    unsigned q_addr[4];
#pragma unroll
    for (int c = 0; c < 4; ++c) q_addr[c] = q_lane + qv_chunks.off[c];

    // This sequence: its first row in the (packed) arrays and its lengths.
    const Sequence<VARLEN> seq(b, S_q, S_k, cu_seqlens_q, cu_seqlens_k);
    const long long q_row0 = seq.q_row0, k_row0 = seq.k_row0;
    const int len_q = seq.len_q, len_k = seq.len_k;
    if (m0 >= len_q) return;                  // the whole block: no barrier is skipped
    const long long hk = h / (H / H_kv);
    const T* qp = q + (VARLEN ? 0 : b * qb) + (q_row0 + m0) * qs + h * qh;
    const T* kp = k + (VARLEN ? 0 : b * kb) + k_row0 * ks + hk * kh;
    const T* vp = v + (VARLEN ? 0 : b * vb) + k_row0 * vs + hk * vh;
    T* op = o + (VARLEN ? 0 : b * ob) + (q_row0 + m0) * os + h * oh;

    // Allowed keys of row i: [lo(i), hi(i)) (masks.cuh's Masks; with SEGMENTS, RowMasks).
    const RowMasks<SEGMENTS> mask(len_q, len_k, CAUSAL, WINDOW, window_left, window_right,
                                  {{ spec.row_bounds("b") }});
    auto lo_of = [&](long long i) -> int { return mask.lo(i); };
    auto hi_of = [&](long long i) -> int { return mask.hi(i); };
    // The block's key blocks: from the first row's lo to the last (real) row's hi. Every row
    // covers [lo(last row), hi(first row)) whole (lo, hi grow with i).
    const int m_last = min(m0 + BM, len_q) - 1;
    const int k_begin = lo_of(m0), k_end = hi_of(m_last);
    const int full_lo = lo_of(m_last), full_hi = hi_of(m0);
    const int n_first = k_begin / BN;
    const int n_blocks = k_end > k_begin ? ceil_div(k_end, BN) - n_first : 0;

    // This lane's rows: m16 tile mi, half hh (row g + 8 hh): their key intervals.
    int lo[MW][2], hi[MW][2];
#pragma unroll
    for (int mi = 0; mi < MW; ++mi)
#pragma unroll
        for (int hh = 0; hh < 2; ++hh) {
            const int i = m0 + wr0 + mi * 16 + g + 8 * hh;
            lo[mi][hh] = lo_of(i);
            hi[mi][hh] = hi_of(i);
        }

    // Scores in log2 units are S * SL (SL = scale log2(e)); with SOFTCAP the scores are
    // replaced by cap_out tanh(S cap_in), already in log2 units (SL = 1).
    const float SL = SOFTCAP ? 1.0f : static_cast<float>(scale * LOG2E);
    const float cap_in = SOFTCAP ? static_cast<float>(scale / softcap) : 0.0f;
    const float cap_out = SOFTCAP ? static_cast<float>(softcap * LOG2E) : 0.0f;

    // Prologue. Commit groups, in order: (Q, K_0), V_0, K_1, V_1, ..., K_{STAGES-2},
    // V_{STAGES-2}; iteration `it` then adds K, V of block it + STAGES - 1 (empty groups past
    // the last block keep the count uniform). So at iteration it, 2 STAGES - 3 groups follow
    // K_it, and after its own two, 2 STAGES - 2 follow V_it.
    load_tile<BM>(Qs, qp, qs, len_q - m0, tid);
#pragma unroll
    for (int s = 0; s < STAGES - 1; ++s) {
        const long long n0 = static_cast<long long>(n_first + s) * BN;
        char* st = KVs + s * STAGE_BYTES;
        if (s < n_blocks) load_tile<BN>(st, kp + n0 * ks, ks, len_k - static_cast<int>(n0), tid);
        cp_async_commit();
        if (s < n_blocks)
            load_tile<BN>(st + KV_BYTES, vp + n0 * vs, vs, len_k - static_cast<int>(n0), tid);
        cp_async_commit();
    }

    unsigned qf[Q_IN_REGS ? MW : 1][Q_IN_REGS ? DK : 1][4];
    if constexpr (Q_IN_REGS) {
        cp_async_wait<2 * STAGES - 3>();
        __syncthreads();                      // Q has landed (group 0)
#pragma unroll
        for (int mi = 0; mi < MW; ++mi)
#pragma unroll
            for (int kd = 0; kd < DK; ++kd)
                ldmatrix_x4(qf[mi][kd], q_addr[kd & 3] + mi * 16 * ROW_BYTES + (kd >> 2) * 128);
    }

    // O accumulators: o[mi][dt][r] = row g (+8 for r >= 2), column dt * 8 + 2t (+1 odd r).
    float acc[MW][DT][4];
    float row_max[MW][2], row_sum[MW][2];     // raw-score max (-inf: none yet); the lane's sum
#pragma unroll
    for (int mi = 0; mi < MW; ++mi) {
#pragma unroll
        for (int dt = 0; dt < DT; ++dt)
#pragma unroll
            for (int r = 0; r < 4; ++r) acc[mi][dt][r] = 0.0f;
#pragma unroll
        for (int hh = 0; hh < 2; ++hh) {
            row_max[mi][hh] = neg_inf();
            row_sum[mi][hh] = 0.0f;
        }
    }

#pragma unroll 1
    for (int it = 0; it < n_blocks; ++it) {
        const int n0 = (n_first + it) * BN;
        cp_async_wait<2 * STAGES - 3>();
        __syncthreads();   // K_it has landed; every warp is done with block it - 1's buffer
        {
            const int nx = it + STAGES - 1;
            const long long nn = static_cast<long long>(n_first + nx) * BN;
            char* st = KVs + (nx % STAGES) * STAGE_BYTES;
            if (nx < n_blocks)
                load_tile<BN>(st, kp + nn * ks, ks, len_k - static_cast<int>(nn), tid);
            cp_async_commit();
            if (nx < n_blocks)
                load_tile<BN>(st + KV_BYTES, vp + nn * vs, vs, len_k - static_cast<int>(nn), tid);
            cp_async_commit();
        }
        // this stage's K and V addresses of the lane, by chunk pair (c % 4)
        const unsigned stage = kv_smem + (it % STAGES) * STAGE_BYTES;
        unsigned k_addr[4], v_addr[4];
#pragma unroll
        for (int c = 0; c < 4; ++c) {
            k_addr[c] = stage + k_lane + k_chunks.off[c];
            v_addr[c] = stage + v_lane + qv_chunks.off[c];
        }

        // S = Q K^T. s[mi][nt][r] = row g (+8 for r >= 2), key n0 + nt * 8 + 2t (+1 odd r).
        float s[MW][NT][4];
#pragma unroll
        for (int mi = 0; mi < MW; ++mi)
#pragma unroll
            for (int nt = 0; nt < NT; ++nt)
#pragma unroll
                for (int r = 0; r < 4; ++r) s[mi][nt][r] = 0.0f;
#pragma unroll
        for (int kd = 0; kd < DK; ++kd) {
            unsigned qa[MW][4];
#pragma unroll
            for (int mi = 0; mi < MW; ++mi) {
                if constexpr (Q_IN_REGS) {
#pragma unroll
                    for (int r = 0; r < 4; ++r) qa[mi][r] = qf[mi][kd][r];
                } else {
                    ldmatrix_x4(qa[mi], q_addr[kd & 3] + mi * 16 * ROW_BYTES + (kd >> 2) * 128);
                }
            }
#pragma unroll
            for (int p = 0; p < NT / 2; ++p) {
                // K rows (keys) p*16.. as B of n8 tiles 2p, 2p+1. ldmatrix.x4 matrix i = lanes
                // 8i..: keys +8 if i & 2, d chunk +1 if i & 1; a lane gets (key g, d 2t, 2t+1)
                // = B's (n g, k 2t) -> kf[0], kf[1] = b[0], b[1] of tile 2p; kf[2..3] of 2p+1.
                unsigned kf[4];
                ldmatrix_x4(kf, k_addr[kd & 3] + p * 16 * ROW_BYTES + (kd >> 2) * 128);
                const unsigned b0[2] = {kf[0], kf[1]}, b1[2] = {kf[2], kf[3]};
#pragma unroll
                for (int mi = 0; mi < MW; ++mi) {
                    mma_m16n8k16<T>(s[mi][2 * p], qa[mi], b0);
                    mma_m16n8k16<T>(s[mi][2 * p + 1], qa[mi], b1);
                }
            }
        }

        if constexpr (SOFTCAP) {
#pragma unroll
            for (int mi = 0; mi < MW; ++mi)
#pragma unroll
                for (int nt = 0; nt < NT; ++nt)
#pragma unroll
                    for (int r = 0; r < 4; ++r)
                        s[mi][nt][r] = cap_out * tanh_approx(s[mi][nt][r] * cap_in);
        }

        // Mask, in the blocks that some row does not allow whole (block-uniform branch).
        if (n0 < full_lo || n0 + BN > full_hi) {
#pragma unroll
            for (int mi = 0; mi < MW; ++mi)
#pragma unroll
                for (int nt = 0; nt < NT; ++nt)
#pragma unroll
                    for (int r = 0; r < 4; ++r) {
                        const int j = n0 + nt * 8 + 2 * t + (r & 1);
                        const int hh = r >> 1;
                        if (j < lo[mi][hh] || j >= hi[mi][hh]) s[mi][nt][r] = neg_inf();
                    }
        }

        // Online softmax, per row (mi, hh): the quad's max, the rescale of what came before,
        // P = exp2(S SL - m SL) in place of S (one FFMA and one ex2 per element).
#pragma unroll
        for (int mi = 0; mi < MW; ++mi)
#pragma unroll
            for (int hh = 0; hh < 2; ++hh) {
                float mx = row_max[mi][hh];
#pragma unroll
                for (int nt = 0; nt < NT; ++nt)
                    mx = fmaxf(mx, fmaxf(s[mi][nt][2 * hh], s[mi][nt][2 * hh + 1]));
                mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
                mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
                // no allowed key yet: subtract 0, not -inf (-inf - -inf is NaN); P stays 0
                const float base = mx == neg_inf() ? 0.0f : mx * SL;
                const float corr = exp2_approx(row_max[mi][hh] * SL - base);   // 0 from -inf
                row_max[mi][hh] = mx;
                float sum = 0.0f;
#pragma unroll
                for (int nt = 0; nt < NT; ++nt)
#pragma unroll
                    for (int c = 0; c < 2; ++c) {
                        const float pv = exp2_approx(fmaf(s[mi][nt][2 * hh + c], SL, -base));
                        s[mi][nt][2 * hh + c] = pv;
                        sum += pv;
                    }
                row_sum[mi][hh] = row_sum[mi][hh] * corr + sum;   // the lane's columns only
#pragma unroll
                for (int dt = 0; dt < DT; ++dt) {
                    acc[mi][dt][2 * hh] *= corr;
                    acc[mi][dt][2 * hh + 1] *= corr;
                }
            }

        cp_async_wait<2 * STAGES - 2>();
        __syncthreads();   // V_it has landed

        // O += P V. k-step kk = keys kk*16..: A = (tile 2kk | tile 2kk+1) of S packed: a[0] =
        // s[2kk][0,1] (row g, k 2t), a[1] = s[2kk][2,3] (row g+8), a[2] = s[2kk+1][0,1]
        // (row g, k 2t+8), a[3] = s[2kk+1][2,3].
#pragma unroll
        for (int kk = 0; kk < NK; ++kk) {
            unsigned pa[MW][4];
#pragma unroll
            for (int mi = 0; mi < MW; ++mi) {
                pa[mi][0] = pack_f32x2<T>(s[mi][2 * kk][0], s[mi][2 * kk][1]);
                pa[mi][1] = pack_f32x2<T>(s[mi][2 * kk][2], s[mi][2 * kk][3]);
                pa[mi][2] = pack_f32x2<T>(s[mi][2 * kk + 1][0], s[mi][2 * kk + 1][1]);
                pa[mi][3] = pack_f32x2<T>(s[mi][2 * kk + 1][2], s[mi][2 * kk + 1][3]);
            }
#pragma unroll
            for (int p = 0; p < DT / 2; ++p) {
                // V rows (keys) kk*16.., d chunks 2p, 2p+1 as B of O tiles 2p, 2p+1.
                // ldmatrix.x4.trans matrix i = lanes 8i..: keys +8 if i & 1, d chunk +1 if
                // i & 2; transposed, a lane gets (keys 2t, 2t+1, d g) = B's (k 2t, n g):
                // vf[0], vf[1] = b[0], b[1] of tile 2p; vf[2], vf[3] of tile 2p + 1.
                unsigned vf[4];
                ldmatrix_x4_trans(vf, v_addr[p & 3] + kk * 16 * ROW_BYTES + (p >> 2) * 128);
                const unsigned b0[2] = {vf[0], vf[1]}, b1[2] = {vf[2], vf[3]};
#pragma unroll
                for (int mi = 0; mi < MW; ++mi) {
                    mma_m16n8k16<T>(acc[mi][2 * p], pa[mi], b0);
                    mma_m16n8k16<T>(acc[mi][2 * p + 1], pa[mi], b1);
                }
            }
        }
    }

    // Epilogue: every copy done (Q's too, when no key block ran) and every warp past its last
    // ldmatrix of Q before O overwrites Q's tile.
    cp_async_wait<0>();
    __syncthreads();
#pragma unroll
    for (int mi = 0; mi < MW; ++mi)
#pragma unroll
        for (int hh = 0; hh < 2; ++hh) {
            float l = row_sum[mi][hh];
            l += __shfl_xor_sync(0xffffffffu, l, 1);
            l += __shfl_xor_sync(0xffffffffu, l, 2);
            const float inv = l > 0.0f ? 1.0f / l : 0.0f;   // no allowed key: o = 0
            const int r = wr0 + mi * 16 + g + 8 * hh;         // row in the block
            if constexpr (WRITE_LSE) {
                if (t == 0 && m0 + r < len_q)
                    lse[lse_index<VARLEN>(b, h, m0 + r, q_row0, cu_seqlens_q, B, H, S_q)] =
                        row_lse(row_max[mi][hh], SL, l);
            }
            // O's row r, columns dt*8 + 2t, +1 -> 4 bytes in chunk dt of the staging tile.
#pragma unroll
            for (int dt = 0; dt < DT; ++dt)
                *reinterpret_cast<unsigned*>(Qs + swz(r, dt) + 4 * t) =
                    pack_f32x2<T>(acc[mi][dt][2 * hh] * inv, acc[mi][dt][2 * hh + 1] * inv);
        }
    __syncwarp();      // the warp's own rows, written and read by the warp only
#pragma unroll
    for (int i = 0; i < 16 * MW * CPR / 32; ++i) {
        const int u = lane + 32 * i;
        const int r = wr0 + u / CPR, c = u % CPR;
        if (m0 + r < len_q)
            *reinterpret_cast<uint4*>(op + r * os + c * 8) =
                *reinterpret_cast<const uint4*>(Qs + swz(r, c));
    }
}
