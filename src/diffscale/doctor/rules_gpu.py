"""Failure signatures of the GPUs and the network between them: CUDA memory and faults, the
driver, NCCL's collectives and its transports (InfiniBand verbs, sockets).

Message texts come from PyTorch's ProcessGroupNCCL and CUDA caching allocator, NCCL 2.x
(``NET/IB``, ``NET/Socket``, ``ncclSystemError``), libibverbs' work-completion status codes,
UCX, and the NVIDIA kernel driver's Xid lines (NVRM).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from diffscale.doctor.rules import TextRule, next_lines

# ibv_wc_status codes NCCL reports as "Got completion ... with error N"
_IB_STATUS = {
    4: "a local memory protection error: the registered GPU memory was not usable (GPUDirect RDMA / "
       "nvidia-peermem on the node)",
    5: "work requests flushed: the connection was already broken by an earlier error (the first IB error "
       "of the job is the one to act on)",
    8: "a local access error: the registered GPU memory was not usable (GPUDirect RDMA on the node)",
    10: "a remote access error: the peer refused the memory access",
    12: "the transport retry counter was exceeded: the peer stopped answering (its link or switch port "
        "went down, the node died, or the fabric dropped packets)",
    13: "receiver-not-ready retries were exceeded: the peer was not ready to receive (stopped or overloaded)",
}

# NVIDIA Xid numbers of GPU, memory or link faults (not of a program's own bad access)
_XID_HARDWARE = {
    "48": "a double-bit ECC error", "61": "an internal micro-controller breakpoint",
    "62": "an internal micro-controller halt", "63": "an ECC page retirement or row remapping event",
    "64": "an ECC page retirement or row remapping failure", "74": "an NVLink error",
    "79": "the GPU has fallen off the bus", "92": "a high single-bit ECC error rate",
    "94": "a contained ECC error", "95": "an uncontained ECC error", "119": "a GSP firmware timeout",
    "120": "a GSP firmware error", "140": "an unrecovered ECC error",
}


def _collective_wait(values: Mapping[str, str], lines: Sequence[str], index: int) -> Mapping[str, str]:
    if values.get("ms"):
        return {"wait": f"waited {values['ms']} ms in a collective ({values.get('op')}, #{values.get('seq')})"}
    if values.get("stuck"):
        return {"wait": f"waited in a collective until NCCL's watchdog gave up after {values['stuck']} s"}
    return {"wait": "waited in a collective past its timeout"}


def _last_error(values: Mapping[str, str], lines: Sequence[str], index: int) -> Mapping[str, str]:
    """NCCL puts the failed call on a "Last error:" line after the message (or on the next line)."""
    context = [lines[index]] + next_lines(lines, index, 4)
    for k, line in enumerate(context):
        if "Last error:" in line:
            after = line.split("Last error:", 1)[1].strip() or next((x for x in context[k + 1:] if x), "")
            if after:
                return {"last": f"NCCL's last error: {after[:200]}"}
    return {"last": "NCCL_DEBUG=INFO shows which call"}


def _transport(values: Mapping[str, str], lines: Sequence[str], index: int) -> Mapping[str, str]:
    if values.get("ibcode"):
        code = int(values["ibcode"])
        return {"why": f"InfiniBand reported {_IB_STATUS.get(code, f'work completion error {code}')}"}
    if values.get("ibevent"):
        return {"why": f"an InfiniBand port of this node reported '{values['ibevent'].strip()}' (a link, cable "
                       "or switch fault)"}
    if values.get("retry"):
        return {"why": "the transport retry count was exceeded: the peer stopped answering"}
    if values.get("remote"):
        return {"why": "NCCL lost a peer: a remote rank exited or the network between them failed"}
    if values.get("closed"):
        return {"why": "a peer closed its NCCL socket: that rank ended first (look for its own error), or the "
                       "network dropped the connection"}
    return {"why": f"a rank could not reach another's NCCL socket ({values.get('sockerr')}): a firewall, the "
                   "wrong network interface, or a peer that had already exited"}


def _xid(values: Mapping[str, str], lines: Sequence[str], index: int) -> Mapping[str, str]:
    xid = values.get("xid") or ("79" if "fallen off the bus" in lines[index] else "")
    what = _XID_HARDWARE.get(xid, "an uncorrectable ECC error" if "ECC" in lines[index] else "a GPU fault")
    where = f" on {values['pci']}" if values.get("pci") else ""
    return {"what": f"{what}{f' (Xid {xid})' if xid else ''}{where}"}


def _driver(values: Mapping[str, str], lines: Sequence[str], index: int) -> Mapping[str, str]:
    found = values.get("found")
    if found and found.isdigit():
        n = int(found)
        return {"driver": f" (it supports CUDA up to {n // 1000}.{n % 1000 // 10})"}
    return {"driver": ""}


_HARDWARE_XIDS = "|".join(sorted(_XID_HARDWARE, key=len, reverse=True))

TEXT_RULES: tuple[TextRule, ...] = (
    TextRule(
        "cuda-oom", "GPU memory exhausted (CUDA out of memory)",
        (r"CUDA out of memory\.? Tried to allocate (?P<size>[\d.]+ [KMGT]iB)", r"CUDA out of memory",
         r"torch\.(?:cuda\.)?OutOfMemoryError"),
        "the GPU ran out of memory (tried to allocate {size})",
        "lower train.batch_per_gpu and raise train.grad_accum to keep the effective batch "
        "(e.g. --set train.batch_per_gpu=32 --set train.grad_accum=2), or use --precision bf16",
        user_fix="lower the batch size per GPU in your script and accumulate gradients over more steps to keep "
                 "the effective batch, or train in bf16 (torch.autocast(\"cuda\", dtype=torch.bfloat16))",
    ),
    TextRule(
        "network-transport", "network error between the ranks (InfiniBand / sockets)",
        (r"NET/IB ?: Got completion (?:from peer (?P<peer>\S+) )?with (?:error |status=)(?P<ibcode>\d+)",
         r"NET/IB ?: Got async event ?: (?P<ibevent>port error|local catastrophic error|[\w ]*fatal[\w ]*)",
         r"(?P<retry>[Tt]ransport retry count(?:er)? exceeded)",
         r"NET/Socket ?: (?P<closed>Connection closed by remote peer)",
         r"(?P<remote>ncclRemoteError|remote process exited or there was a network error)",
         r"(?:socketStartConnect|socketPollConnect|socketProgress|connectAddress|socketConnect)\b.*?"
         r"(?P<sockerr>No route to host|Connection refused|Connection timed out|Network is unreachable|"
         r"Software caused connection abort|Connection reset by peer)"),
        "{why}",
        "the network or a peer failed, not the training code: if a node is named, resubmit without it "
        "(#SBATCH --exclude=NODE) and report it to the admins; if it recurs on healthy nodes, set the site's "
        "NCCL_IB_HCA / NCCL_SOCKET_IFNAME in the profile's env: and measure the links with "
        "diffscale bench --comm; a rank that died first shows its own error above",
        derive=_transport, every=True,
    ),
    TextRule(
        "nccl-system-error", "NCCL: unhandled system error",
        (r"unhandled system error", r"\bncclSystemError\b"),
        "a system call or library NCCL relies on failed ({last}): most often the network between the ranks "
        "(a socket or InfiniBand connection), or too little shared memory (/dev/shm) in a container",
        "act on the network errors listed with this one, if any; otherwise rerun with NCCL_DEBUG=INFO (the "
        "profile's env:) for NCCL's reason; on nodes with several interfaces set NCCL_SOCKET_IFNAME to the "
        "one between the nodes (e.g. ib0); in a container give /dev/shm a few GB",
        derive=_last_error,
    ),
    TextRule(
        "nccl-timeout", "a collective timed out (NCCL watchdog)",
        (r"Watchdog caught collective operation timeout: WorkNCCL\(SeqNum=(?P<seq>\d+), OpType=(?P<op>\w+)"
         r".*?Timeout\(ms\)=(?P<ms>\d+)",
         r"Watchdog caught collective operation timeout", r"NCCL watchdog thread terminated",
         r"ProcessGroupNCCL.*[Tt]imeout at NCCL work", r"NCCL communicator was aborted",
         r"watchdog got stuck for (?P<stuck>\d+) seconds", r"Heartbeat monitor timed out",
         r"Some NCCL operations have failed or timed out"),
        "one rank {wait} that another rank never joined: a rank hung, crashed, or runs different code "
        "(e.g. work only on rank 0 while the others wait)",
        "look for the first error of the rank that stopped (diffscale logs RUN_DIR); if a slow step is "
        "expected (first compile, a long save), raise runtime.collective_timeout_s; check the network "
        "between nodes (NCCL_DEBUG=INFO)",
        derive=_collective_wait,
    ),
    TextRule(
        "gpu-hardware", "GPU hardware fault (Xid)",
        (rf"NVRM: Xid \((?P<pci>[^)]*)\): (?P<xid>{_HARDWARE_XIDS})\b", rf"\bXid[ :]+(?P<xid>{_HARDWARE_XIDS})\b",
         r"GPU has fallen off the bus", r"uncorrectable ECC error encountered"),
        "the GPU reported {what}: a fault of the GPU, its memory or its link, not of the program",
        "resubmit without that node (#SBATCH --exclude=NODE; Grid Engine: -l h=!NODE) and report the node "
        "and this line to the admins; a diffscale run resumes from its newest checkpoint",
        derive=_xid,
    ),
    TextRule(
        "illegal-memory-access", "a CUDA kernel faulted (illegal memory access)",
        (r"an illegal memory access was encountered", r"\bcudaErrorIllegalAddress\b",
         r"CUDA error: (?P<what>unspecified launch failure|misaligned address|an illegal instruction was "
         r"encountered)", r"NVRM: Xid \((?P<pci>[^)]*)\): (?P<xid>13|31|43)\b"),
        "a CUDA kernel touched memory it does not own; CUDA reports errors asynchronously, so the Python "
        "line in the traceback may not be the call at fault",
        "rerun with CUDA_LAUNCH_BLOCKING=1 to see the failing call; rule out compiled kernels with "
        "--set runtime.compile=off; if the same node also logs a hardware Xid (79, 48, 94, 95), treat it "
        "as a GPU fault and exclude the node",
        user_fix="rerun with CUDA_LAUNCH_BLOCKING=1 to see the failing call; rule out compiled kernels by running "
                 "without torch.compile; if the same node also logs a hardware Xid (79, 48, 94, 95), treat it as a "
                 "GPU fault and exclude the node",
    ),
    TextRule(
        "cuda-driver-too-old", "the NVIDIA driver is too old for this PyTorch",
        (r"The NVIDIA driver on your system is too old \(found version (?P<found>\d+)\)",
         r"CUDA driver version is insufficient for CUDA runtime version", r"\bcudaErrorInsufficientDriver\b"),
        "the node's NVIDIA driver{driver} is older than the CUDA runtime this PyTorch was built for, so "
        "PyTorch cannot use the GPUs",
        "install a PyTorch built for a CUDA the driver supports into the job's environment (for a CUDA 11 "
        "driver: pip install torch --index-url https://download.pytorch.org/whl/cu118), or run on nodes with a "
        "newer driver; "
        "`nvidia-smi` on a compute node shows the driver's CUDA version",
        derive=_driver,
    ),
)
