"""Activation offload's copies over the host link, and what of them the stage's compute hides.

Under activation offload (:attr:`nest.core.plan.ParallelConfig.activation_offload`) a chunk's
blocks copy their stored tensors to host memory during the forward and back during the
backward, ``A`` bytes per microbatch each way (:func:`nest.cost.memory.host_bytes`), over the
device's host link (:attr:`nest.core.hardware.Device.host_link_bw_bytes_per_s`, bytes/s per
direction; the two directions are independent). Transformer Engine's CPU offload runs the copies
on their own streams beside the compute, block by block, so a copy is hidden while it fits
under the chunk's compute of the same pass: the copy out under the forward compute ``f``, the
copy in under the backward compute with its recomputation ``b``. What does not fit is charged:

``exposed = max(0, A / bw - f) + max(0, A / bw - b)``

Both parts are charged to the chunk's backward (the backward of a block cannot start before its
tensors are back; the forward's excess is charged there too, a simplification that keeps every
activation policy a change of the backward alone, as recompute modes are, which the NEST DP's
fastest-mode rule needs: :mod:`nest.dp.recurrence`). Communication time is not counted as
compute that hides a copy. Works on scalars and numpy rows.

Under a partial offload (:attr:`nest.core.plan.ParallelConfig.activation_offload_blocks` ``= N``)
``A`` is the first ``N`` blocks' stored bytes and ``f``, ``b`` stay the whole chunk's compute:
Transformer Engine spreads the ``N`` copies over all ``L`` blocks of the pass. TE v2.7 awaits
block ``i``'s copy ``L / N`` blocks after the previous one's (``layer_window_map``), TE v2.14 runs
the copies back to back on one stream from block 0's end and awaits block ``i``'s before block
``L - N + i`` (``DefaultOffloadSynchronizer``); for identical blocks both stall only when the
``N`` copies outlast the compute of about ``L`` blocks, which is this formula (TE v2.14's window
is ``L - 2`` blocks; the reload mirrors it in the backward). Sources:
github:NVIDIA/TransformerEngine@v2.7 and @366798ef, ``transformer_engine/pytorch/cpu_offload.py``.
"""

import numpy as np


def offload_exposed_s(host_bytes, fwd_compute_s, bwd_compute_s, host_bw_bytes_per_s):
    """Seconds of a chunk's activation copies that its compute does not hide, per microbatch
    (module docstring); 0 when nothing is offloaded."""
    copy_s = np.asarray(host_bytes, dtype=float) / host_bw_bytes_per_s
    exposed = np.maximum(0.0, copy_s - fwd_compute_s) + np.maximum(0.0, copy_s - bwd_compute_s)
    return float(exposed) if np.ndim(exposed) == 0 else exposed
