"""Two ``torchrun`` agents as two "nodes" on 127.0.0.1 (c10d rendezvous) run the demo across them.

The demo measures the float64 difference between the DDP gradient and one process's gradient on the same global
batch before training and exits non-zero unless it is at rounding level, so a zero exit of both agents is the
gradient-equivalence check across nodes; the test also reads the figure from the output.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from tests._helpers.doc_blocks import RUN_TO_EXIT

ROOT = Path(__file__).resolve().parents[2]
DEMO = ROOT / "examples" / "train_clip_ddp.py"
TIMEOUT_S = 180


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _agent(nproc: int, port: int, run_id: str, *demo_args: str) -> subprocess.Popen:
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nnodes=2",
        f"--nproc-per-node={nproc}",
        "--rdzv-backend=c10d",
        f"--rdzv-endpoint=127.0.0.1:{port}",
        f"--rdzv-id={run_id}",
        "--max-restarts=0",
        str(RUN_TO_EXIT),  # fails the demo if its group outlives destroy_process_group()
        str(DEMO),
        "--epochs=1",
        *demo_args,
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
    return subprocess.Popen(
        cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
    )


def _run_two_nodes(nprocs: tuple[int, int], *demo_args: str) -> list[str]:
    """Start both agents, wait for both (killing every process of both after the timeout), return outputs."""
    port = _free_port()
    agents = [_agent(n, port, f"tmd-{port}", *demo_args) for n in nprocs]
    outputs = []
    try:
        for agent in agents:
            out, _ = agent.communicate(timeout=TIMEOUT_S)
            outputs.append(out)
    except subprocess.TimeoutExpired:
        pytest.fail(f"torchrun agents did not finish within {TIMEOUT_S}s")
    finally:
        for agent in agents:
            if agent.poll() is None:
                os.killpg(agent.pid, signal.SIGKILL)
                agent.wait()
    for agent, out in zip(agents, outputs):
        assert agent.returncode == 0, f"agent exited with {agent.returncode}:\n{out[-4000:]}"
    return outputs


@pytest.mark.timeout(TIMEOUT_S + 30)
def test_two_node_torchrun_trains_with_exact_gradients() -> None:
    """Nodes of 1 and 2 processes (W=3), uneven rows, sharded CLIPLoss: gradient check and an epoch pass."""
    outputs = _run_two_nodes((1, 2), "--uneven", "--strategy=sharded")
    text = "\n".join(outputs)
    assert "3 ranks" in text, text[-4000:]
    match = re.search(r"max \|DDP grad - single-process grad\| = ([0-9.e+-]+)", text)
    assert match, text[-4000:]
    assert float(match.group(1)) < 1e-10
    assert re.search(r"epoch 1: train loss [0-9.]+\s+val retrieval@1 [0-9.]+", text), text[-4000:]
