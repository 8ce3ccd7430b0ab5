"""Other libraries' kernel signatures as check_kernel kernels.

deltaproof.adapters.fla: flash-linear-attention's chunk_*, fused_chunk_* and fused_recurrent_*
functions for linear attention, DeltaNet and Gated DeltaNet.
"""
