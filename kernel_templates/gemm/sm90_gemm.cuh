// Plain C++ helpers of the Hopper GEMM (gemm/wgmma.cu) that do not depend on its variant: the
// tensor-map parameters only some variants have.

// Stand-ins for the TMA maps of Y and Z (TMA stores) and of C (C through the ring). Where the
// kernel has one, its parameter of that name hides the stand-in; else the kernel's set-up,
// which names them all in every variant, finds these, and the variant never reads them.
#pragma nv_diag_suppress 177   // (a stand-in the kernel's own hides is never referenced)
constexpr decltype(nullptr) tma_y = nullptr, tma_z = nullptr, tma_c = nullptr;
#pragma nv_diag_default 177

// The generic address of a tensor map parameter (__grid_constant__: the TMA reads it where
// the kernel's parameters are), or null for a stand-in.
__device__ __forceinline__ const TensorMap* map_address(const TensorMap& map) { return &map; }
__device__ __forceinline__ const TensorMap* map_address(decltype(nullptr)) { return nullptr; }
