// The order of a persistent grid's tiles (sm_90 kernels that loop over output tiles).

// Where tile `tile` of the persistent order starts (m0, n0: its first row and column) for
// tiles of TILE_M x TILE_N. Tiles run down groups of GROUP_M tile rows, then across: the tiles
// in flight at once (one per SM) share a few row blocks of A and column blocks of B, which
// stay in L2 while they are used, instead of sweeping all of A per column.
template <int TILE_M, int TILE_N, int GROUP_M = 16>
__device__ __forceinline__ void tile_origin(int tile, int tiles_m, int tiles_n, int& m0,
                                            int& n0) {
    const int per_group = GROUP_M * tiles_n;
    const int first = tile / per_group * GROUP_M;
    const int rows = min(tiles_m - first, GROUP_M);
    const int in_group = tile % per_group;
    m0 = (first + in_group % rows) * TILE_M;
    n0 = in_group / rows * TILE_N;
}
