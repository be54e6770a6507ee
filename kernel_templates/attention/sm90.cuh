// What the Hopper attention kernels include and share: the common types and activations, the
// mma.sync packing, the sm90 primitives (mbarrier, TMA, wgmma, warpgroups), the masks, and
// the TMA load of a tile.
{% include "common/types.cuh" %}
{% include "common/activations.cuh" %}
{% include "common/sm80/mma.cuh" %}
{% include "common/sm90/mbarrier.cuh" %}
{% include "common/sm90/tma.cuh" %}
{% include "common/sm90/wgmma.cuh" %}
{% include "common/sm90/warpgroup.cuh" %}
{% include "attention/masks.cuh" %}

// A tile of R rows of one head into `dst`, its CHUNKS 64-column chunks one TMA box each (R x 128
// bytes apart, the 128-byte swizzle), completing on `bar`: row `row` of head `head` of
// sequence `b` by a 4-D map, or (PACKED) row `row` of the packed rows by a 3-D map.
template <int R, int CHUNKS, bool PACKED>
__device__ __forceinline__ void load_tile(unsigned dst, const TensorMap* map, int row, int head,
                                          int b, unsigned bar) {
#pragma unroll
    for (int c = 0; c < CHUNKS; ++c) {
        if constexpr (PACKED) tma_load_3d(dst + c * R * 128, map, 64 * c, row, head, bar);
        else tma_load_4d(dst + c * R * 128, map, 64 * c, row, head, b, bar);
    }
}
