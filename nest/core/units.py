"""Unit conversions, in one place.

Inside the package every quantity is SI: bytes, seconds, FLOP, FLOP/s, bytes/s. Human units appear
only in preset files, with the unit in the key (``hbm_gib``, ``bw_gbps``, ``latency_us``,
``peak_tflops``) and are converted here when a preset is read.

Conventions (the datasheets'): network and memory *bandwidths* are decimal (1 GB/s = 1e9 bytes/s;
NVIDIA and Google quote them so); HBM *capacity* is given in the unit the datasheet uses, ``hbm_gb``
(decimal) or ``hbm_gib`` (binary). The NEST artifact multiplied "GB/s" by 2**30
(docs/nest_paper.md §6); this module is what keeps that from happening here.
"""

KB = 10**3
MB = 10**6
GB = 10**9
TB = 10**12
KiB = 2**10
MiB = 2**20
GiB = 2**30
TiB = 2**40

US = 1e-6  # one microsecond in seconds
MS = 1e-3  # one millisecond in seconds
TFLOP = 10**12
GBIT = 10**9 / 8  # bytes in one gigabit


def gbps_to_bytes_per_s(gb_per_s: float) -> float:
    """Decimal gigabytes per second to bytes per second: ``1 GB/s -> 1e9 bytes/s``."""
    return float(gb_per_s) * GB


def gbit_per_s_to_bytes_per_s(gbit_per_s: float) -> float:
    """Gigabits per second (NIC line rate) to bytes per second: ``400 Gb/s -> 5e10 bytes/s``."""
    return float(gbit_per_s) * GBIT


def gib_to_bytes(gib: float) -> float:
    """Binary gibibytes to bytes: ``1 GiB -> 2**30 bytes``."""
    return float(gib) * GiB


def gb_to_bytes(gb: float) -> float:
    """Decimal gigabytes to bytes: ``1 GB -> 1e9 bytes``."""
    return float(gb) * GB


def us_to_s(us: float) -> float:
    """Microseconds to seconds."""
    return float(us) / 1e6


def ms_to_s(ms: float) -> float:
    """Milliseconds to seconds (the NEST artifact's profiles are in milliseconds)."""
    return float(ms) / 1e3


def tflops_to_flops_per_s(tflops: float) -> float:
    """TFLOP/s (as datasheets quote peak throughput) to FLOP/s."""
    return float(tflops) * TFLOP


def bytes_to_gib(n_bytes: float) -> float:
    """Bytes to GiB, for display only."""
    return float(n_bytes) / GiB
