// Row access and reductions shared by the row-wise kernels (softmax and its backward, the norms,
// cross-entropy: a reduction along the last axis, then a pass that writes the row): a thread's
// slot of V elements of a row read or written in as few accesses as its alignment allows, sums
// or maxima across the lanes of a group or the threads of a block, and online (max, sum of
// exponentials) pairs. Needs common/types.cuh.
//
// Every reduction adds or compares in a fixed order (shuffle butterflies, then one value per
// warp through shared memory), so a kernel built on them gives the same bits on every run.

#define ROWS_NEG_INF __int_as_float(0xff800000u)
constexpr unsigned FULL_MASK = 0xffffffffu;

// e^(v - m). The difference is taken first: v * log2(e) - m * log2(e) overflows for |v| near
// float32's maximum.
__device__ __forceinline__ float exp_diff(float v, float m) {
    return exp2f((v - m) * 1.4426950408889634f);
}

template <int BYTES> struct RawOf;
template <> struct RawOf<2> { using type = unsigned short; };
template <> struct RawOf<4> { using type = unsigned int; };
template <> struct RawOf<8> { using type = uint2; };
template <> struct RawOf<16> { using type = uint4; };

// v[0..V) = p[0..V) as float32, in accesses of at most 16 bytes (p aligned to V elements, or
// to 16 bytes where V elements are more).
template <int V, typename T>
__device__ __forceinline__ void load_full(const T* p, float* v) {
    constexpr int PER = V * sizeof(T) <= 16 ? V : 16 / sizeof(T);
    if constexpr (PER == 1) {
#pragma unroll
        for (int k = 0; k < V; ++k) v[k] = to_f32(p[k]);
    } else {
        using R = typename RawOf<PER * sizeof(T)>::type;
#pragma unroll
        for (int q = 0; q < V / PER; ++q) {
            const R raw = *reinterpret_cast<const R*>(p + q * PER);
            const T* e = reinterpret_cast<const T*>(&raw);
#pragma unroll
            for (int k = 0; k < PER; ++k) v[q * PER + k] = to_f32(e[k]);
        }
    }
}

// The slot of V elements of a row starting at e0 (a multiple of V): whole accesses when it lies
// inside the row, else element by element, `pad` past the end (n).
template <int V, typename T, typename I>
__device__ __forceinline__ void load_slot(const T* row, I e0, I n, float* v, float pad) {
    if (e0 + V <= n) {
        load_full<V>(row + e0, v);
    } else {
#pragma unroll
        for (int k = 0; k < V; ++k) v[k] = e0 + k < n ? to_f32(row[e0 + k]) : pad;
    }
}

// Stores the slot (at most 16 bytes: V elements of T); the part past the end (n) is not written.
template <int V, typename T, typename I>
__device__ __forceinline__ void store_slot(T* row, I e0, I n, const float* v) {
    if (e0 + V <= n) {
        if constexpr (V == 1) {
            store(row + e0, v[0]);
        } else {
            float w[V];
#pragma unroll
            for (int k = 0; k < V; ++k) w[k] = v[k];
            store_vec(row + e0, w);
        }
    } else {
#pragma unroll
        for (int k = 0; k < V; ++k)
            if (e0 + k < n) store(row + e0 + k, v[k]);
    }
}

// Butterfly over groups of W lanes (W a power of two <= 32): every lane of a group ends with
// the same bits (each step adds or compares the same two values, in either order).
template <int W>
__device__ __forceinline__ float group_max(float v) {
#pragma unroll
    for (int o = W / 2; o > 0; o /= 2) v = fmaxf(v, __shfl_xor_sync(FULL_MASK, v, o));
    return v;
}
template <int W>
__device__ __forceinline__ float group_sum(float v) {
#pragma unroll
    for (int o = W / 2; o > 0; o /= 2) v += __shfl_xor_sync(FULL_MASK, v, o);
    return v;
}

// The largest of unsigned values over groups of W lanes (W a power of two <= 32); for the bits of
// |v| (absolute_bits) the largest magnitude with NaN above infinity, which fmaxf would drop.
template <int W>
__device__ __forceinline__ unsigned group_umax(unsigned v) {
#pragma unroll
    for (int o = W / 2; o > 0; o /= 2) v = max(v, __shfl_xor_sync(FULL_MASK, v, o));
    return v;
}
__device__ __forceinline__ unsigned absolute_bits(float v) {
    return __float_as_uint(v) & 0x7fffffffu;
}

// Online (max, sum) pairs: (m, s) stands for s * e^m. m = -inf with s = 0 is the empty pair.
// scale(m, mm) = e^(m - mm) for m <= mm, exactly 1 when they are equal (also both -inf or both
// +inf, where the difference would be NaN).
__device__ __forceinline__ float pair_scale(float m, float mm) {
    return m == mm ? 1.0f : exp_diff(m, mm);
}
// Commutative to the bit (products rounded on their own, no fused multiply-add).
__device__ __forceinline__ void pair_combine(float& m, float& s, float m2, float s2) {
    const float mm = fmaxf(m, m2);
    s = __fmul_rn(s, pair_scale(m, mm)) + __fmul_rn(s2, pair_scale(m2, mm));
    m = mm;
}
template <int W>
__device__ __forceinline__ void group_pair(float& m, float& s) {
#pragma unroll
    for (int o = W / 2; o > 0; o /= 2) {
        const float m2 = __shfl_xor_sync(FULL_MASK, m, o);
        const float s2 = __shfl_xor_sync(FULL_MASK, s, o);
        pair_combine(m, s, m2, s2);
    }
}

// s += add with compensation (Kahan; `comp` holds what the running sum lost): a thread that adds
// up millions of steps would otherwise drift by percents in float32.
__device__ __forceinline__ void kahan_add(float& s, float& comp, float add) {
    const float a = add - comp;
    const float t = s + a;
    // (once the sum is infinite or NaN, (t - s) - a is NaN: the sum goes on uncompensated,
    // as a plain one would, and an infinite sum stays infinite)
    comp = isfinite(t) ? (t - s) - a : 0.0f;
    s = t;
}

// Adds values v[0..N) to the thread's running pair (padding past the row's end is -inf, which
// adds 0). With m = -inf so far (only -inf or NaN seen), the values are taken relative to 0,
// so -inf adds 0 and NaN adds NaN. Each step's sum is added with compensation (kahan_add).
template <int N>
__device__ __forceinline__ void pair_add(float& m, float& s, float& comp, const float* v) {
    float cm = ROWS_NEG_INF;
#pragma unroll
    for (int i = 0; i < N; ++i) cm = fmaxf(cm, v[i]);
    const float mm = fmaxf(m, cm);
    const float scale = pair_scale(m, mm);
    s *= scale;
    comp *= scale;
    m = mm;
    const float ref = m == ROWS_NEG_INF ? 0.0f : m;
    float step = 0.0f;
#pragma unroll
    for (int i = 0; i < N; ++i) step += exp_diff(v[i], ref);
    kahan_add(s, comp, step);
}

// Block-wide reduction (max or sum) over T threads (a power of two): every thread gets the
// result, the same bits. `buf` holds 32 floats; two calls in a row must use different buffers
// (the second's writes could overtake the first's reads).
template <int T, bool MAX>
__device__ __forceinline__ float block_reduce(float v, float* buf) {
    v = MAX ? group_max<32>(v) : group_sum<32>(v);
    if ((threadIdx.x & 31) == 0) buf[threadIdx.x >> 5] = v;
    __syncthreads();
    const float w = buf[threadIdx.x & (T / 32 - 1)];
    return MAX ? group_max<T / 32>(w) : group_sum<T / 32>(w);
}

// Block-wide group_umax over T threads (a power of two): every thread gets the result. `buf`
// holds 32 values; two calls in a row must use different buffers.
template <int T>
__device__ __forceinline__ unsigned block_umax(unsigned v, unsigned* buf) {
    v = group_umax<32>(v);
    if ((threadIdx.x & 31) == 0) buf[threadIdx.x >> 5] = v;
    __syncthreads();
    return group_umax<T / 32>(buf[threadIdx.x & (T / 32 - 1)]);
}

// Block-wide combination of the threads' (max, sum) pairs: every thread gets the block's pair.
// `bm` and `bs` hold 32 floats each; the closing barrier lets the caller reuse them at once.
template <int T>
__device__ __forceinline__ void block_pair(float& m, float& s, float* bm, float* bs) {
    group_pair<32>(m, s);
    if ((threadIdx.x & 31) == 0) {
        bm[threadIdx.x >> 5] = m;
        bs[threadIdx.x >> 5] = s;
    }
    __syncthreads();
    m = bm[threadIdx.x & (T / 32 - 1)];
    s = bs[threadIdx.x & (T / 32 - 1)];
    group_pair<T / 32>(m, s);
    __syncthreads();   // every thread has read bm/bs
}
