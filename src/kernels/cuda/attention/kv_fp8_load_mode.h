// Which tile loader the tensor-core attention kernels (paged_attention_mma.cu, cascade_attention.cu) use for
// an FP8 E4M3 KV cache: the cp.async pipeline of raw codes (kv_fp8_tile.cuh, the default) or the old plain
// loads that dequantize in registers (MXSERVE_FP8_KV_PLAIN_LOADS=1, kept for one before/after comparison;
// both give bit-identical results). Host side only: the launchers pick a kernel instantiation with it.
#pragma once

namespace mxserve::kernels::cuda {

// true: the old plain-load FP8 tile loader. The first call reads MXSERVE_FP8_KV_PLAIN_LOADS ("1": on) and,
// when on, says so once on stderr (a slower path).
bool fp8_kv_plain_loads();
// Overrides the environment for this process (tests compare both loaders in one run).
void set_fp8_kv_plain_loads(bool on);

}  // namespace mxserve::kernels::cuda
