// Row access and reductions shared by the row-wise kernels (a reduction along the last axis,
// then a pass that writes the row): a thread's slot of V elements of a row read or written in
// as few accesses as its alignment allows, and sums or maxima across the lanes of a group or
// the threads of a block. Needs common/types.cuh.
constexpr unsigned FULL_MASK = 0xffffffffu;

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
