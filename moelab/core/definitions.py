"""The bandwidth definitions' names and texts: torch-free, so the store and light commands can read them."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, kw_only=True, slots=True)
class Definition:
    name: str
    rows_field: str
    text: str
    source: str = "time"  # "time": rows x bytes over the op's median; "kernel": over its kernel-only time; "external": another tool's own figure; "model": moelab model's and published tables' only


DEFINITIONS: dict[str, Definition] = {
    d.name: d
    for d in (
        Definition(
            name="nvl_recv",
            rows_field="recv_rows",
            text="DeepEP 'NVL': rows this rank receives in dispatch (its own included) x bytes/token / time; combine: the same rows sent back",
        ),
        Definition(
            name="nvl_remote",
            rows_field="recv_rows_remote",
            text="as nvl_recv but rows from (combine: to) other ranks only: what crosses NVLink or the network",
        ),
        Definition(
            name="rdma_pairs",
            rows_field="rdma_pairs",
            text="DeepEP 'RDMA': unique (token, destination node) pairs of this rank, its own node included, x bytes/token / time",
        ),
        Definition(
            name="rdma_remote",
            rows_field="rdma_pairs_remote",
            text="as rdma_pairs but other nodes only: what crosses the NIC",
        ),
        Definition(
            name="nvl_recv_kernel",
            source="kernel",
            rows_field="recv_rows",
            text="as nvl_recv, over the kernel-only time from a profiler trace (the union of the op's GPU kernels) instead of the event-timed API time",
        ),
        Definition(
            name="nvl_remote_kernel",
            source="kernel",
            rows_field="recv_rows_remote",
            text="as nvl_remote, over the kernel-only time from a profiler trace",
        ),
        Definition(
            name="nccl_algbw",
            source="external",
            rows_field="send_rows",
            text="nccl-tests alltoall_perf algbw (out-of-place): size / time, size = the per-rank send buffer over all peers",
        ),
        Definition(
            name="nccl_busbw",
            source="external",
            rows_field="send_rows",
            text="nccl-tests alltoall_perf busbw (out-of-place): algbw x (n-1)/n",
        ),
        Definition(
            name="ll_selections",
            source="model",
            rows_field="selections",
            text="DeepEP low-latency 'RDMA bandwidth' (tests/test_low_latency.py, v1.2.1): (token, expert) selections of this rank, its own rank included, x bytes per message (dispatch: the payload + a 16-byte header, hidden + hidden/128*4 + 16 in FP8; combine: hidden*2) / time; the low-latency kernels send one message per selection. Used by moelab model and the published tables, not stored per case",
        ),
        Definition(
            name="algbw_send",
            rows_field="send_rows",
            text="algorithm bandwidth: rows this rank sends (its own included) x bytes/token / time, as nccl-tests' algbw for an all-to-all of that size",
        ),
    )
}


FORMAT_DEFINITIONS: dict[str, str] = {
    "mxfp8": (
        "MXFP8 payload (mxfp8-a2a), OCP MX v1.0: 32-element blocks along hidden, E4M3 elements, one E8M0 scale "
        "byte per block, s = 2^(byte-127); scale rounding rceil (default: smallest s with amax/s <= 448), "
        "floor (OCP: floor(log2 amax) - 8), ceil (ceil(log2 amax) - 8) or even (amax rounded to 3 mantissa "
        "bits, then floor); elements x/s clamped to +-448, rounded to nearest even. Follows the spec where "
        "torchao 0.18's to_mx does not: a block with scale byte 0 is scaled by 2^127 (torchao: by 2^126 in "
        "floor/ceil/even, elements half the spec's; by 1 in rceil, elements lost to 0), and a block holding "
        "+-inf or NaN gets scale 0xFF and NaN elements (torchao, for +-inf: the largest finite scale, the inf "
        "saturated to +-448 and the rest of the block 0), so an overflow reads back as NaN, not as numbers."
    ),
}
