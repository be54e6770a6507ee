// What the attention kernels of sm_80+ share: shared-memory tiles of D 16-bit elements a row
// (swizzled 16-byte chunks), their cp.async loads, the ldmatrix chunk offsets of a lane, and
// the masks of a sequence (masks.cuh). Needs, before it: T (the 16-bit type), D, ROW_BYTES
// (D * 2), CPR (ROW_BYTES / 16) and THREADS.

// Byte offset of 16-byte chunk `chunk` of row `row` in a tile of ROW_BYTES-byte rows: the
// chunk index XORed with (row & 7), so the 8 rows an ldmatrix phase reads hit 8 distinct bank
// groups.
__device__ __forceinline__ int swz(int row, int chunk) {
    return row * ROW_BYTES + ((chunk ^ (row & 7)) << 4);
}

// Rows [0, ROWS) of a tile from global rows src + r * ld (unit stride along D); rows >= valid
// are zero-filled (src-size 0: nothing is read, src itself stays a valid address).
template <int ROWS>
__device__ __forceinline__ void load_tile(char* S, const T* src, long long ld, int valid,
                                          int tid) {
    constexpr int CHUNKS = ROWS * CPR;
#pragma unroll
    for (int i = 0; i < (CHUNKS + THREADS - 1) / THREADS; ++i) {
        const int u = tid + i * THREADS;
        if (CHUNKS % THREADS == 0 || u < CHUNKS) {
            const int row = u / CPR, c = u % CPR;
            const bool ok = row < valid;
            cp_async_16(S + swz(row, c), ok ? src + row * ld + c * 8 : src, ok ? 16 : 0);
        }
    }
}

// Every ldmatrix here reads rows whose (row & 7) is the lane's x = lane & 7 (its reads start at
// multiples of 8 rows) and chunk 2c + cl (cl = 0 or 1 by lane). Then swz(row, 2c + cl) =
// row * ROW_BYTES + 128 (c / 4) + 16 ((2 (c % 4)) ^ cl ^ x): four offsets a lane, computed
// once; the rest is compile-time once the loops unroll. The three patterns, for a tile whose
// rows start at `base` (ldmatrix.x4: lanes 8i..8i+7 give matrix i's rows):
//   A operand, rows m x k (k along the row):  rows +8 if i & 1, chunk +1 if i & 2 -> a[i]
//     lane row (lane & 15), cl = lane >> 4                        (Lanes::a)
//   B operand, rows n x k (k along the row):  rows +8 if i & 2, chunk +1 if i & 1 -> b of
//     n8 tiles 2p (regs 0, 1) and 2p + 1 (regs 2, 3)
//     lane row ((lane >> 4) << 3) + x, cl = (lane >> 3) & 1       (Lanes::b)
//   B operand, rows k x n (n along the row), .trans: rows +8 if i & 1, chunk +1 if i & 2
//     lane row (((lane >> 3) & 1) << 3) + x, cl = lane >> 4       (Lanes::bt)
struct Chunks {
    int off[4];
    __device__ __forceinline__ explicit Chunks(int y) {   // y = cl ^ x
#pragma unroll
        for (int q = 0; q < 4; ++q) off[q] = ((2 * q) ^ y) << 4;
    }
};

// A lane's byte offsets into a tile (add the tile's 32-bit shared address): entry c of each
// array serves chunk pairs c, c + 4, ... (add 128 bytes per 4 pairs, 16 ROW_BYTES per 16 rows).
struct Lanes {
    int a[4], b[4], bt[4];
    __device__ __forceinline__ explicit Lanes(int lane) {
        const int x = lane & 7;
        const Chunks ca((lane >> 4) ^ x), cb(((lane >> 3) & 1) ^ x);
        const int row_a = (lane & 15) * ROW_BYTES;
        const int row_b = (((lane >> 4) << 3) + x) * ROW_BYTES;
        const int row_bt = ((((lane >> 3) & 1) << 3) + x) * ROW_BYTES;
#pragma unroll
        for (int c = 0; c < 4; ++c) {
            a[c] = row_a + ca.off[c];
            b[c] = row_b + cb.off[c];
            bt[c] = row_bt + ca.off[c];
        }
    }
};

{% include "attention/masks.cuh" %}
