// Component c of a float4; with c known at compile time (an unrolled loop) this is a register.
__device__ __forceinline__ float component(const float4& v, int c) {
    return c == 0 ? v.x : c == 1 ? v.y : c == 2 ? v.z : v.w;
}
