"""Unit conversions are pinned: decimal GB/s for bandwidth, GiB only where the source says GiB."""

from nest.app.config import build_cluster, build_device
from nest.core import units


def test_bandwidth_is_decimal():
    # The NEST artifact multiplied "GB/s" by 2**30 (docs/nest_paper.md §6); 1 GB/s is 1e9 bytes/s.
    assert units.gbps_to_bytes_per_s(1) == 1e9
    assert units.gbit_per_s_to_bytes_per_s(400) == 50e9  # a 400 Gb/s NIC moves 50 GB/s


def test_capacity_units():
    assert units.gib_to_bytes(1) == 2**30
    assert units.gb_to_bytes(80) == 80e9
    assert units.bytes_to_gib(2**31) == 2.0


def test_time_and_flops():
    assert units.us_to_s(5) == 5e-6
    assert units.ms_to_s(2) == 2e-3
    assert units.tflops_to_flops_per_s(989.4) == 989.4e12


def test_presets_convert_at_the_edge():
    dev = build_device(
        {
            "name": "d",
            "peak_tflops": 312,
            "hbm_gb": 80,
            "hbm_bw_gbps": 2039,
            "memory_reserve_gib": 1,
        }
    )
    assert dev.peak_flops_per_s == 312e12
    assert dev.hbm_bytes == 80e9
    assert dev.hbm_bw_bytes_per_s == 2039e9
    assert dev.memory_reserve_bytes == 2**30
    dev64 = build_device({"name": "d", "peak_tflops": 1, "hbm_gib": 64, "hbm_bw_gbps": 100})
    assert dev64.hbm_bytes == 64 * 2**30
    cluster = build_cluster(
        {
            "name": "c",
            "devices": 16,
            "device": {"name": "d", "peak_tflops": 1, "hbm_gib": 1, "hbm_bw_gbps": 100},
            "levels": [
                {"name": "a", "fanout": 8, "bw_gbps": 1, "latency_us": 2},
                {"name": "b", "fanout": None, "bw_gbps": 12.5, "latency_us": 100},
            ],
        }
    )
    assert cluster.levels[0].bw_bytes_per_s == 1e9
    assert cluster.levels[1].bw_bytes_per_s == 12.5e9
    assert cluster.levels[1].latency_s == 100e-6
    assert cluster.levels[1].fanout == 2  # derived from devices
