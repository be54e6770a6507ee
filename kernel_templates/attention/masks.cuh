// What every attention kernel shares (any architecture; no dependency): the infinities, a
// sequence's place and lengths, its masks, and the log-sum-exp of a row and its place.

__device__ __forceinline__ float neg_inf() { return __int_as_float(0xff800000u); }
__device__ __forceinline__ float pos_inf() { return __int_as_float(0x7f800000u); }

// Sequence b: its first rows in the packed arrays (PACKED: cu_seqlens; else 0) and its
// lengths (PACKED: from cu_seqlens; else S_q and S_k).
template <bool PACKED>
struct Sequence {
    long long q_row0 = 0, k_row0 = 0;
    int len_q, len_k;
    __device__ __forceinline__ Sequence(int b, long long S_q, long long S_k, const int* cu_q,
                                        const int* cu_k)
        : len_q(static_cast<int>(S_q)), len_k(static_cast<int>(S_k)) {
        if constexpr (PACKED) {
            q_row0 = cu_q[b];
            k_row0 = cu_k[b];
            len_q = cu_q[b + 1] - cu_q[b];
            len_k = cu_k[b + 1] - cu_k[b];
        }
    }
};

// The masks of one sequence of len_q queries and len_k keys, bottom-right aligned (off = len_k
// - len_q): key j is allowed for query i iff lo(i) <= j < hi(i), lo(i) = i + off - left
// (without a left bound: 0), hi(i) = i + off + right + 1 (without a right bound: len_k),
// clamped to [0, len_k]; equivalently query i is allowed for key j < len_k iff
// row_lo(j) <= i < row_hi(j), row_lo(j) = j - off - right, row_hi(j) = j - off + left + 1,
// clamped to [0, len_q] (64-bit before the clamps). CAUSAL: right = 0.
struct Masks {
    int len_q, len_k;
    long long off, left, right;
    bool has_left, has_right;

    __device__ __forceinline__ Masks(int len_q_, int len_k_, bool causal, bool window,
                                     long long window_left, long long window_right)
        : len_q(len_q_), len_k(len_k_), off(static_cast<long long>(len_k_) - len_q_) {
        has_left = window && window_left >= 0;
        has_right = causal || (window && window_right >= 0);
        left = has_left ? window_left : 0;
        right = causal ? 0 : (has_right ? window_right : 0);
    }
    __device__ __forceinline__ int lo(long long i) const {
        return has_left ? static_cast<int>(min(max(i + off - left, 0ll), (long long)len_k)) : 0;
    }
    __device__ __forceinline__ int hi(long long i) const {
        return has_right ? static_cast<int>(min(max(i + off + right + 1, 0ll), (long long)len_k))
                         : len_k;
    }
    __device__ __forceinline__ int row_lo(long long j) const {
        if (j >= len_k) return len_q;   // no query sees a key past the sequence
        return has_right ? static_cast<int>(min(max(j - off - right, 0ll), (long long)len_q)) : 0;
    }
    __device__ __forceinline__ int row_hi(long long j) const {
        if (j >= len_k) return 0;
        return has_left ? static_cast<int>(min(max(j - off + left + 1, 0ll), (long long)len_q))
                        : len_q;
    }
};

// Masks that also keep each row of a dense batch's sequences apart (SEGMENTS: several
// sequences a row, S_q == S_k, the same tokens as queries and keys): bounds[2 t] and
// bounds[2 t + 1] are the first token and one past the last of token t's sequence in its row;
// query i sees key j only if both are in one sequence, start(i) <= j < end(i), and Masks
// allows it. The bounds do not decrease along the row, so lo, hi, row_lo and row_hi still
// do not (what the kernels' block bounds need). Without SEGMENTS: Masks.
template <bool SEGMENTS>
struct RowMasks : Masks {
    const int* bounds;   // this row's (start, end) pairs (SEGMENTS)

    __device__ __forceinline__ RowMasks(int len_q_, int len_k_, bool causal, bool window,
                                        long long window_left, long long window_right,
                                        const int* row_bounds)
        : Masks(len_q_, len_k_, causal, window, window_left, window_right),
          bounds(row_bounds) {}
    __device__ __forceinline__ int lo(long long i) const {
        const int v = Masks::lo(i);
        if constexpr (SEGMENTS) if (i >= 0 && i < len_q) return max(v, bounds[2 * i]);
        return v;
    }
    __device__ __forceinline__ int hi(long long i) const {
        const int v = Masks::hi(i);
        if constexpr (SEGMENTS) if (i >= 0 && i < len_q) return min(v, bounds[2 * i + 1]);
        return v;
    }
    __device__ __forceinline__ int row_lo(long long j) const {
        const int v = Masks::row_lo(j);
        if constexpr (SEGMENTS) if (j >= 0 && j < len_k) return max(v, bounds[2 * j]);
        return v;
    }
    __device__ __forceinline__ int row_hi(long long j) const {
        const int v = Masks::row_hi(j);
        if constexpr (SEGMENTS) if (j >= 0 && j < len_k) return min(v, bounds[2 * j + 1]);
        return v;
    }
};

// The natural-log log-sum-exp of a row from its running maximum (raw scores; sl: their factor
// to log2 units) and its sum of exp2's (over the whole row): -inf for a row that saw no key.
__device__ __forceinline__ float row_lse(float row_max, float sl, float l) {
    return l > 0.0f ? (row_max * sl + log2f(l)) * 0.6931471805599453f : neg_inf();
}

// Where row i of query head h of sequence b is in lse (and the backward's delta): (B, H, S_q)
// contiguous, or (H, total_q) with packed sequences (q_row0: the sequence's first packed row;
// total_q = cu_seqlens_q[B]).
template <bool PACKED>
__device__ __forceinline__ long long lse_index(long long b, long long h, long long i,
                                               long long q_row0, const int* cu_seqlens_q,
                                               long long B, long long H, long long S_q) {
    if constexpr (PACKED) return h * static_cast<long long>(cu_seqlens_q[B]) + q_row0 + i;
    else return (b * H + h) * S_q + i;
}

// Where row i of query head h of sequence b is in dq_accum, the one-kernel backward's float32
// dq (rows of D): in tiles of `pad` rows, each sequence's first on a tile, so that a tile of
// a sequence is one contiguous block: (B, H, S_q rounded up to pad, D) contiguous, or packed
// (H, total_q + B pad, D), sequence b from row cu_seqlens_q[b] + b pad.
template <bool PACKED>
__device__ __forceinline__ long long dq_accum_row(long long b, long long h, long long i,
                                                  const int* cu_seqlens_q, long long B,
                                                  long long H, long long S_q, long long pad) {
    if constexpr (PACKED)
        return h * (static_cast<long long>(cu_seqlens_q[B]) + B * pad) + cu_seqlens_q[b] +
               b * pad + i;
    else return (b * H + h) * ((S_q + pad - 1) / pad * pad) + i;
}
// The position of column d in a row i of dq_accum: its 16-byte groups permuted by i % 8 (the
// kernel's stores to its shared tile then meet no bank twice).
__device__ __forceinline__ int dq_accum_col(int i, int d) {
    return (((d >> 2) ^ (i & 7)) << 2) | (d & 3);
}
